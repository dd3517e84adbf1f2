"""Decoding defaults calibrated after training (`infer/learn_then_test.py`, `infer/draft_vocab.py`,
`infer/tune.py`), kept beside a workdir's checkpoints in `calibrated_decoding.json`.

Its "decoding" section holds option values for every strategy; its "tuned" section, per mode
(greedy, sampled), the strategy `infer/tune.py` measured fastest and its options, which
decoding uses when no strategy is named (`cli.decoding.default_choice`).

Loading the workdir (`loading.load_model`) lays them over the checkpoint's own decoding
section, and flags still override both. A calibration holds for the weights it was measured
on: it records the checkpoint step, and a workdir that has trained on since ignores it, with a
warning, until it is calibrated again. A value that is no option of the model is an error
naming the file; `infer/learn_then_test.py` checks that it can write there before its sweep.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

from absl import logging

from specjax.config import ModelConfig, dataclass_from_mapping
from specjax.decoding.registry import STRATEGIES, DecodingConfig
from specjax.outputs import read_json_object, staged

FILE = "calibrated_decoding.json"
MODES = ("greedy", "sampled")  # the "tuned" section's keys: temperature 0, and above 0


def read_calibrated(workdir: str) -> dict[str, Any]:
    """The workdir's calibration record ({} when it has none): {"step", "decoding",
    "calibration"} and, once tuned, "tuned" ({mode: {"strategy", "options"}})."""
    path = os.path.join(workdir, FILE)
    if not os.path.exists(path):
        return {}
    try:
        record = read_json_object(path)
    except ValueError as error:
        raise ValueError(f"{error}; calibrate again or delete it") from None
    if not isinstance(record.get("decoding"), dict):
        raise ValueError(f"{path} has no 'decoding' section; calibrate again or delete it")
    return record


def write_calibrated(workdir: str, step: int, decoding: dict[str, Any],
                     calibration: dict[str, Any],
                     tuned: dict[str, dict[str, Any]] | None = None) -> str:
    """Records calibrated decoding defaults (and `tuned` strategies, by mode) for checkpoint
    `step`, replacing the file in one atomic rename (an interrupted write leaves the previous
    one intact); returns its path. What was recorded before for the same step and not
    recalibrated now (a value, a mode's tuned strategy) is kept."""
    previous = read_calibrated(workdir)
    tuned = tuned or {}
    if previous.get("step") == step:
        decoding = {**previous["decoding"], **decoding}
        calibration = {**previous.get("calibration", {}), **calibration}
        tuned = {**previous.get("tuned", {}), **tuned}
    record = {"step": step, "decoding": decoding, "calibration": calibration}
    if tuned:
        record["tuned"] = tuned
    path = os.path.join(workdir, FILE)
    with staged(path) as partial, open(partial, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    return path


def with_calibrated(meta: dict[str, Any], workdir: str, cfg: ModelConfig) -> dict[str, Any]:
    """Checkpoint metadata with the workdir's calibrated decoding defaults laid over its
    decoding section and its tuned strategies as "tuned" (unchanged when there are none or
    they are for another step); a value that is not an option of the model `cfg`, or a tuned
    strategy that is not registered, is a one-line error naming the file."""
    record = read_calibrated(workdir)
    if not record:
        return meta
    path = os.path.join(workdir, FILE)
    if record.get("step") != meta.get("step"):
        logging.warning("%s was calibrated for step %s, not the loaded step %s: ignored; run "
                        "infer/learn_then_test.py again", path, record.get("step"),
                        meta.get("step"))
        return meta
    tuned = record.get("tuned", {})
    try:
        dataclass_from_mapping(DecodingConfig, record["decoding"], "decoding").check(cfg)
        for mode, choice in tuned.items():
            _check_tuned(mode, choice, record["decoding"], cfg)
    except ValueError as error:
        raise ValueError(f"{path}: {error}; calibrate again or delete it") from None
    meta = copy.deepcopy(meta)
    config = meta.setdefault("config", {})
    config["decoding"] = {**(config.get("decoding") or {}), **record["decoding"]}
    if tuned:
        meta["tuned"] = tuned
    return meta


def _check_tuned(mode: str, choice: Any, decoding: dict[str, Any], cfg: ModelConfig) -> None:
    """A one-line ValueError when a tuned entry is not {"strategy": a registered name,
    "options": decoding options valid for the model}."""
    if mode not in MODES or not isinstance(choice, dict) or not isinstance(
            choice.get("options"), dict) or choice.get("strategy") not in STRATEGIES:
        raise ValueError(f"tuned.{mode} is not a mode ({', '.join(MODES)}) with a registered "
                         "strategy and its options")
    dataclass_from_mapping(DecodingConfig, {**decoding, **choice["options"]},
                           f"tuned.{mode}.options").check(cfg)
