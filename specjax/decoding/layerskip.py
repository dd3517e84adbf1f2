"""LayerSkip self-speculation: draft with layers [0, E) + the shared head, verify with [E, L).

Drafting runs the shallow layers on the nodes of the proposal's shape, writing their K/V at the
nodes' slots and keeping each node's layer-E hidden state. Verification reuses both
(`Proposal.reuse`): the shallow layers run only on the positions the drafting never ran (a
chain's last draft, a tree's leaves), and the deep layers once on all of them. Nothing is
recomputed or copied back; rejected slots are left behind the committed length.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax

from specjax.cache import Cache
from specjax.config import ModelConfig
from specjax.decoding.chain import Chain
from specjax.decoding.drafter import DraftContext, Stateless
from specjax.decoding.proposal import Proposal, Reuse, Shape
from specjax.decoding.tree import Layout
from specjax.model import embed, exit_logits, run_layers_cached


@dataclasses.dataclass(frozen=True)
class SelfSpeculative(Stateless):
    """exit_layer = E (draft layers [0, E)); shape: a `Chain` (K drafts, optional confidence
    stop), a `StaticTree` or a `DynamicTree`."""

    exit_layer: int
    shape: Shape = Chain(num_draft=4)

    name: ClassVar[str] = "selfspec"

    def validate(self, cfg: ModelConfig) -> None:
        if not 1 <= self.exit_layer < cfg.num_layers:
            raise ValueError(f"exit_layer={self.exit_layer} must lie in [1, num_layers - 1 = "
                             f"{cfg.num_layers - 1}]")
        self.shape.validate()

    def label(self) -> str:
        return f"{self.name} E={self.exit_layer} {self.shape.label()}"

    def hf_options(self) -> dict[str, Any] | None:
        """transformers `generate()` options for the same drafting policy (chains only: HF's
        assisted generation has no trees)."""
        if not self.shape.is_chain:
            return None
        return {"assistant_early_exit": self.exit_layer,
                "num_assistant_tokens": self.shape.num_draft,
                "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": self.shape.stop_below}

    def propose(self, ctx: DraftContext, state: Any, cache: Cache, pending: jax.Array,
                key: jax.Array) -> tuple[Proposal, Cache, Any]:
        def step(cache: Cache, tokens: jax.Array, layout: Layout):
            hidden, cache = run_layers_cached(
                ctx.params, ctx.cfg, embed(ctx.params, ctx.cfg, tokens), cache, layout.slots,
                layers=(0, self.exit_layer), positions=layout.positions, mask=layout.mask)
            return exit_logits(ctx.params, ctx.cfg, hidden), hidden, cache

        proposal, kept, missing, cache = self.shape.draft(step, cache, cache.lengths, pending,
                                                          key, ctx.sampling, cache.max_len)
        return proposal.replace(reuse=Reuse(kept, missing, self.exit_layer)), cache, state
