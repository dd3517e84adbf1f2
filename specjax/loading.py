"""Loading a workdir for decoding: a model, or a head trained on a frozen base model.

A model's workdir (trained or imported) gives its params. A Kangaroo adapter's workdir names its
base: the base's params are loaded from there (refused if its weights changed since) and the
adapter's weights become the `kangaroo` strategy's draft params.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from specjax.adapter import abstract_adapter
from specjax.checkpoint import Checkpointer, CheckpointError, load_params
from specjax.config import ModelConfig
from specjax.decoding.engine import DraftWeights, Generator
from specjax.model import Params
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


def load_model(workdir: str, step: int | None = None) -> LoadedModel:
    """The workdir's latest checkpoint (or `step`) ready for decoding."""
    meta = Checkpointer(workdir, create=False).read_meta(step)
    if meta.get("objective", "layerskip") != "kangaroo":
        params, cfg, meta = load_params(workdir, step)
        return LoadedModel(workdir, params, cfg, meta, {})
    recorded = meta["base"]
    try:
        base = load_base(recorded["workdir"], recorded["step"])
    except CheckpointError:  # that step was rotated out: the latest must be the same weights
        base = load_base(recorded["workdir"])
    base.check_unchanged(recorded, workdir)
    adapter, cfg, meta = load_params(workdir, step, abstract=abstract_adapter)
    return LoadedModel(workdir, base.params, cfg, meta,
                       {"kangaroo": DraftWeights(adapter, meta["adapter"]["exit_layer"])})
