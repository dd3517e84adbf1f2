"""A drafter written for the tests, outside `decoding/`."""

import dataclasses
from typing import ClassVar

import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.decoding.drafter import DrafterBase
from specjax.decoding.proposal import Shape, depth_step
from specjax.model import embed, exit_logits


@dataclasses.dataclass(frozen=True)
class PerDepthDrafter(DrafterBase):
    """A test drafter that proposes every depth at once, as Medusa's heads and multi-token
    prediction do (`proposal.depth_step`): depth d's distribution is the shared head read from
    the pending token's embedding scaled by d + 1, whatever the node's parent. It agrees with
    the target now and then, so rounds see both acceptances and rejections."""

    shape: Shape
    name: ClassVar[str] = "per-depth"

    def validate(self, cfg: ModelConfig) -> None:
        self.shape.validate()

    def label(self) -> str:
        return f"per-depth {self.shape.label()}"

    def propose(self, ctx, state, cache, pending, key):
        hidden = embed(ctx.params, ctx.cfg, pending[:, None])
        logits = jnp.concatenate([exit_logits(ctx.params, ctx.cfg, hidden * (d + 1))
                                  for d in range(self.shape.depth)], axis=1)
        proposal, _, _, _ = self.shape.draft(depth_step(logits, cache.lengths), (),
                                             cache.lengths, pending, key, ctx.sampling,
                                             cache.max_len)
        return proposal, cache, state
