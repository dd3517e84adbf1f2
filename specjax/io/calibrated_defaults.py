"""Decoding defaults calibrated after training (`infer/calibrate.py`), kept beside a workdir's
checkpoints in `calibrated_decoding.json`.

Loading the workdir (`loading.load_model`) lays them over the checkpoint's own decoding
section, and flags still override both. A calibration holds for the weights it was measured
on: it records the checkpoint step, and a workdir that has trained on since ignores it, with a
warning, until it is calibrated again. A value that is no option of the model is an error
naming the file; `infer/calibrate.py` checks that it can write there before its sweep.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

from absl import logging

from specjax.config import ModelConfig, dataclass_from_mapping
from specjax.decoding.registry import DecodingConfig
from specjax.outputs import read_json_object, staged

FILE = "calibrated_decoding.json"


def read_calibrated(workdir: str) -> dict[str, Any]:
    """The workdir's calibration record ({} when it has none): {"step", "decoding",
    "calibration"}."""
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
                     calibration: dict[str, Any]) -> str:
    """Records calibrated decoding defaults for checkpoint `step`, replacing the file in one
    atomic rename (an interrupted write leaves the previous one intact); returns its path.
    Defaults calibrated before for the same step and not recalibrated now are kept."""
    previous = read_calibrated(workdir)
    if previous.get("step") == step:
        decoding = {**previous["decoding"], **decoding}
        calibration = {**previous.get("calibration", {}), **calibration}
    record = {"step": step, "decoding": decoding, "calibration": calibration}
    path = os.path.join(workdir, FILE)
    with staged(path) as partial, open(partial, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    return path


def with_calibrated(meta: dict[str, Any], workdir: str, cfg: ModelConfig) -> dict[str, Any]:
    """Checkpoint metadata with the workdir's calibrated decoding defaults laid over its
    decoding section (unchanged when there are none or they are for another step); a value
    that is not an option of the model `cfg` is a one-line error naming the file."""
    record = read_calibrated(workdir)
    if not record:
        return meta
    path = os.path.join(workdir, FILE)
    if record.get("step") != meta.get("step"):
        logging.warning("%s was calibrated for step %s, not the loaded step %s: ignored; run "
                        "infer/calibrate.py again", path, record.get("step"), meta.get("step"))
        return meta
    try:
        dataclass_from_mapping(DecodingConfig, record["decoding"], "decoding").check(cfg)
    except ValueError as error:
        raise ValueError(f"{path}: {error}; calibrate again or delete it") from None
    meta = copy.deepcopy(meta)
    config = meta.setdefault("config", {})
    config["decoding"] = {**(config.get("decoding") or {}), **record["decoding"]}
    return meta
