"""Plain autoregressive decoding: the degenerate drafter that proposes nothing."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.decoding.drafter import DraftContext, DrafterBase, Strategy
from specjax.decoding.proposal import Proposal
from specjax.decoding.shapes.chain import Chain
from specjax.nn.cache import Cache


@dataclasses.dataclass(frozen=True)
class Autoregressive(DrafterBase):
    name: ClassVar[str] = "ar"
    mixable: ClassVar[bool] = False  # it proposes no node
    shape: ClassVar[Chain] = Chain(num_draft=0)

    def validate(self, cfg: ModelConfig) -> None:
        pass

    def label(self) -> str:
        return self.name

    def propose(self, ctx: DraftContext, state: Any, cache: Cache, pending: jax.Array,
                key: jax.Array) -> tuple[Proposal, Cache, Any]:
        batch = pending.shape[0]
        empty = jnp.zeros((batch, 0), jnp.int32)
        q = (None if ctx.sampling is None
             else jnp.zeros((batch, 0, ctx.cfg.vocab_size), jnp.float32))
        return Proposal(tokens=empty, parents=empty, valid=empty.astype(bool), q=q, reuse=None,
                        stats={}, shape=self.shape), cache, state


STRATEGIES = {"ar": Strategy(lambda options: Autoregressive())}
