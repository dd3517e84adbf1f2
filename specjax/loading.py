"""Loading a workdir for decoding: a model, or a head trained on a frozen base model, and
optionally a separate draft model.

A model's workdir (trained or imported) gives its params. A Kangaroo adapter's workdir names its
base: the base's params are loaded from there (refused if its weights changed since) and the
adapter's weights become the `kangaroo` strategy's draft params. A draft workdir's model (same
tokenizer) becomes the `draft` strategy's.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from specjax.adapter import abstract_adapter
from specjax.checkpoint import (
    Checkpointer,
    CheckpointError,
    UnreadableCheckpointError,
    load_params,
)
from specjax.config import ModelConfig
from specjax.decoding.engine import DraftWeights, Generator
from specjax.model import Params, unstack_layers
from specjax.training.frozen_base import load_base


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """The target model (params, config), the workdir's checkpoint metadata (decoding defaults,
    tokenizer) and the trained drafters' weights by strategy name."""

    workdir: str
    params: Params
    cfg: ModelConfig
    meta: dict[str, Any]
    draft_weights: dict[str, DraftWeights]

    def generator(self, **options: Any) -> Generator:
        """A `Generator` over this model that drafts with its trained drafters' weights."""
        return Generator(self.params, self.cfg, draft_weights=self.draft_weights, **options)


def load_model(workdir: str, step: int | None = None,
               draft_workdir: str | None = None) -> LoadedModel:
    """The workdir's latest checkpoint (or `step`) ready for decoding, with the model in
    `draft_workdir` (its latest checkpoint) as the `draft` strategy's draft model."""
    loaded = _load_target(workdir, step)
    if not draft_workdir:
        return loaded
    params, cfg, meta = load_params(draft_workdir)
    tokenizers = (loaded.meta.get("tokenizer", "bytes"), meta.get("tokenizer", "bytes"))
    if tokenizers[0] != tokenizers[1] or cfg.vocab_size != loaded.cfg.vocab_size:
        raise ValueError(f"the draft model in {draft_workdir} has tokenizer {tokenizers[1]!r} "
                         f"with {cfg.vocab_size} ids, the target {tokenizers[0]!r} with "
                         f"{loaded.cfg.vocab_size}: a draft model must share the target's")
    return dataclasses.replace(loaded, draft_weights={
        **loaded.draft_weights, "draft": DraftWeights(unstack_layers(params), cfg=cfg)})


def _load_target(workdir: str, step: int | None) -> LoadedModel:
    try:
        meta = Checkpointer(workdir, create=False).read_meta(step)
    except UnreadableCheckpointError:  # load_params falls back to a readable step, if any
        meta = {}
    if "base" not in meta:  # a model's workdir, not a head's
        params, cfg, meta = load_params(workdir, step)
        return LoadedModel(workdir, params, cfg, meta, {})
    recorded = meta["base"]
    if not os.path.isdir(recorded["workdir"]):
        raise CheckpointError(f"the adapter in {workdir} was trained on the model in "
                              f"{recorded['workdir']}, which no longer exists: move that workdir "
                              "back, or train the adapter again on the model where it is now")
    try:
        base = load_base(recorded["workdir"], recorded["step"])
    except CheckpointError:  # that step was rotated out: the latest must be the same weights
        base = load_base(recorded["workdir"])
    base.check_unchanged(recorded, workdir)
    adapter, cfg, meta = load_params(workdir, step, abstract=abstract_adapter)
    return LoadedModel(workdir, base.params, cfg, meta,
                       {"kangaroo": DraftWeights(adapter, meta["adapter"]["exit_layer"])})
