"""A trained model that a run builds on without changing it (Kangaroo's adapter, and later
draft-length or confidence heads): loaded from its workdir, fingerprinted, and checked to be
the same model whenever the run resumes or its weights are used for decoding."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from specjax.checkpoint import CheckpointError, load_params
from specjax.config import ModelConfig
from specjax.model import Params


@dataclasses.dataclass(frozen=True)
class FrozenBase:
    """The base model: workdir (absolute), checkpoint step, params, config, its checkpoint's
    metadata, and a checksum of its weights."""

    workdir: str
    step: int
    params: Params
    cfg: ModelConfig
    meta: dict[str, Any]
    checksum: str

    def record(self) -> dict[str, Any]:
        """What a run on this base stores in its checkpoints."""
        return {"workdir": self.workdir, "step": self.step, "checksum": self.checksum}

    def check_unchanged(self, recorded: Mapping[str, Any], user: str) -> None:
        """Refuses a base whose weights differ from the ones `recorded` when `user` (a workdir)
        was trained on it."""
        if recorded.get("checksum") != self.checksum:
            raise CheckpointError(
                f"the base model in {self.workdir} (step {self.step}) is not the one {user} was "
                f"trained on (step {recorded.get('step')} of {recorded.get('workdir')}): its "
                "weights differ. Restore that base or train again in a new --workdir")


def params_checksum(params: Params) -> str:
    """SHA-256 over every weight's dtype, shape and bytes, in tree order."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        array = np.asarray(leaf)
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def load_base(workdir: str, step: int | None = None) -> FrozenBase:
    """The model in `workdir` (its latest checkpoint, or `step`) as a frozen base."""
    if not workdir:
        raise ValueError("config.base_workdir is required: the workdir of the trained model "
                         "to build on (e.g. --config.base_workdir=runs/tiny)")
    if not os.path.isdir(workdir):
        raise CheckpointError(f"base_workdir {workdir!r} does not exist: train the base model "
                              "first (python train/train.py --config configs/tiny_code.py "
                              f"--workdir {workdir})")
    params, cfg, meta = load_params(workdir, step)
    return FrozenBase(os.path.abspath(workdir), int(meta["step"]), params, cfg, meta,
                      params_checksum(params))


def config_on_base(config: Mapping[str, Any], base: FrozenBase) -> dict[str, Any]:
    """The run config with the base's model and tokenizer, and the base's data and decoding
    sections under the run's own overrides (a run cannot change the base's model)."""
    if "model" in config:
        raise ValueError("a run on config.base_workdir takes its model from the base; remove "
                         "the model section")
    saved = base.meta.get("config", {})
    out = copy.deepcopy(dict(config))
    out["model"] = base.cfg.to_dict()
    for section in ("data", "decoding"):
        out[section] = {**saved.get(section, {}), **dict(config.get(section) or {})}
    tokenizer = saved.get("data", {}).get("tokenizer", base.meta.get("tokenizer", "bytes"))
    if out["data"].get("tokenizer", tokenizer) != tokenizer:
        raise ValueError(f"data.tokenizer={out['data']['tokenizer']!r} differs from the base's "
                         f"{tokenizer!r}")
    out["data"]["tokenizer"] = tokenizer
    return out
