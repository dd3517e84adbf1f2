"""Medusa (Cai et al. 2024): K trained heads on the target's last hidden state draft every depth
at once (`proposal.depth_step`): head k proposes the token k + 1 places after the pending one,
so a round runs no target layer to draft, one small matmul per head.

The state is the target's last-layer hidden state [B, D] at the position before the pending
token (the one whose logits chose it): the prompt's last position after prefill, then, at each
commit, the position of the last accepted node (verification keeps every position's last-layer
hidden state: `feature_exits`). Chains, static trees (Medusa's own) and dynamic trees draft from
the same per-depth logits; sampled drafts are lossless like every proposal (acceptance reads the
heads' q).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax

from specjax.config import ModelConfig
from specjax.decoding.draft_vocab import VocabHead, VocabOptions
from specjax.decoding.drafter import (
    DraftContext,
    DrafterBase,
    DraftWeights,
    Prefilled,
    Round,
    Strategy,
    trained_head_hint,
)
from specjax.decoding.proposal import Proposal, Shape, depth_step
from specjax.decoding.shapes.shape_options import ShapeOptions, shape_for
from specjax.heads.medusa import medusa_logits, restrict_medusa
from specjax.model import Params
from specjax.nn.cache import Cache, along_path


@dataclasses.dataclass(frozen=True)
class Medusa(VocabHead, DrafterBase):
    """shape: the proposal's (at most as deep as there are heads); exit_layer: the layer count
    the heads read, the target's depth (bound from the heads' checkpoint; 0 until then)."""

    shape: Shape
    exit_layer: int = 0

    name: ClassVar[str] = "medusa"
    needs_weights: ClassVar[bool] = True
    weights_hint: ClassVar[str] = trained_head_hint("Medusa heads", "medusa")

    @property
    def prefill_exits(self) -> tuple[int, ...]:
        return (self.exit_layer,)

    @property
    def feature_exits(self) -> tuple[int, ...]:
        return (self.exit_layer,)

    def restrict_vocab(self, draft_params: Params, ids: jax.Array) -> Params:
        return restrict_medusa(draft_params, ids)

    def bind(self, weights: DraftWeights) -> Medusa:
        heads = weights.settings["num_heads"]
        if self.shape.depth > heads:
            raise ValueError(f"the proposal is {self.shape.depth} deep but the model has "
                             f"{heads} Medusa heads: give --num_draft (or a tree) at most "
                             f"{heads} deep")
        return dataclasses.replace(self, exit_layer=weights.exit_layer)

    def validate(self, cfg: ModelConfig) -> None:
        self.shape.validate()

    def label(self) -> str:
        return f"{self.name} {self.shape.label()}{self.vocab_label()}"

    def prefill(self, ctx: DraftContext, prefilled: Prefilled) -> jax.Array:
        """The last-layer hidden state at each prompt's last token [B, D]."""
        if self.exit_layer != ctx.cfg.num_layers:
            raise ValueError(f"Medusa heads read layer {self.exit_layer}, not the model's last "
                             f"({ctx.cfg.num_layers}): bind the drafter to its heads")
        return prefilled.at_last_token(prefilled.exit_hidden[self.exit_layer])

    def propose(self, ctx: DraftContext, state: jax.Array, cache: Cache, pending: jax.Array,
                key: jax.Array) -> tuple[Proposal, Cache, jax.Array]:
        depth_logits = medusa_logits(ctx.params, ctx.draft_params, ctx.cfg, state, ctx.vocab)
        proposal, _, _, _ = self.shape.draft(depth_step(depth_logits, cache.lengths), (),
                                             cache.lengths, pending, key, ctx.sampling,
                                             cache.max_len)
        return proposal, cache, state

    def commit(self, ctx: DraftContext, state: jax.Array, done: Round) -> jax.Array:
        """The hidden state at the last kept position (the pending token's when no draft was
        accepted); rows that are done keep theirs."""
        return done.last_kept(along_path(done.features[self.exit_layer], done.acceptance.path),
                              state)


STRATEGIES = {"medusa": Strategy(lambda options: Medusa(shape_for(options)),
                                 (ShapeOptions, VocabOptions))}
