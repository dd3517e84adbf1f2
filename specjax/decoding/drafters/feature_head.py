"""The feature-head drafter that EAGLE-3 (`drafters.eagle`) and DeepSeek's multi-token prediction
(`drafters.mtp`) share: one trained block drafting each depth from its parent's feature and the
token (see `specjax.heads.feature_head`).

The state is the block's K/V cache (one `LayerKV`) and the target's fused feature at the last
committed position, the parent of the next pending token. A draft step reads each input
token's parent feature from a small window [B, 1 + 1 + T, D] over the round's positions (the
committed parent, the pending token, every node), found from the layout's visibility: a
token's parent is the latest slot it sees before its own. Commit rewrites the block's K/V along
the accepted path from the target's features there (verification keeps them:
`feature_exits`), as EAGLE does, so the cache at committed slots never holds drafted features.
Chains, static and dynamic trees draft the same way; sampled drafts are lossless like every
proposal (acceptance reads the block's q).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.struct
import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.decoding.draft_vocab import VocabHead, VocabOptions
from specjax.decoding.drafter import (
    DraftContext,
    DrafterBase,
    DraftWeights,
    Prefilled,
    Round,
    trained_head_hint,
)
from specjax.decoding.proposal import Proposal, Shape
from specjax.decoding.shapes.shape_options import ShapeOptions
from specjax.decoding.shapes.tree import Layout, chain_layout
from specjax.heads.feature_head import FeatureHeadKind, run_cell
from specjax.model import Params
from specjax.nn.cache import Cache, LayerKV, along_path
from specjax.sharding import constrain_cache

# The option groups every feature-head method's strategy reads.
OPTIONS = (ShapeOptions, VocabOptions)


@flax.struct.dataclass
class FeatureState:
    """The block's K/V and the target's feature at the last committed position [B, D]."""

    kv: LayerKV
    feature: jax.Array


@dataclasses.dataclass(frozen=True)
class FeatureHead(VocabHead, DrafterBase):
    """shape: the proposal's; exits: the target's layer counts the head fuses (bound from its
    checkpoint; () until then)."""

    shape: Shape
    exits: tuple[int, ...] = ()

    name: ClassVar[str]
    kind: ClassVar[FeatureHeadKind]
    needs_weights: ClassVar[bool] = True

    @property
    def weights_hint(self) -> str:
        return trained_head_hint(f"a {self.name} head", self.name)

    @property
    def prefill_exits(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.exits)))

    @property
    def feature_exits(self) -> tuple[int, ...]:
        return self.prefill_exits

    def restrict_vocab(self, draft_params: Params, ids: jax.Array) -> Params:
        return self.kind.restrict_vocab(draft_params, ids)

    def bind(self, weights: DraftWeights) -> FeatureHead:
        return dataclasses.replace(self, exits=tuple(weights.settings["exits"]))

    def validate(self, cfg: ModelConfig) -> None:
        if not self.exits:
            raise ValueError(f"the {self.name} drafter has no head: bind it to its weights")
        self.shape.validate()

    def label(self) -> str:
        return f"{self.name} {self.shape.label()}{self.vocab_label()}"

    def _fuse(self, ctx: DraftContext, hidden: dict[int, jax.Array]) -> jax.Array:
        return self.kind.fuse(ctx.params, ctx.draft_params, ctx.cfg,
                              [hidden[e] for e in self.exits])

    def prefill(self, ctx: DraftContext, prefilled: Prefilled) -> FeatureState:
        """The block's K/V over the prompt (slot s from the target's feature at s - 1 and the
        token at s) and the feature at each prompt's last token."""
        batch, width = prefilled.prompts.shape
        features = self._fuse(ctx, prefilled.exit_hidden)                       # [B, P, D]
        kv = constrain_cache(LayerKV.allocate(ctx.cfg, batch, prefilled.cache_len), batch)
        if width > 1:
            layout = chain_layout(jnp.ones((batch,), jnp.int32), width - 1, prefilled.cache_len)
            _, kv = run_cell(self.kind, ctx.params, ctx.draft_params, ctx.cfg, 0,
                             features[:, :-1], prefilled.prompts[:, 1:], layout.positions,
                             layout.mask, kv, layout.slots)
        return FeatureState(kv, prefilled.at_last_token(features))

    def propose(self, ctx: DraftContext, state: FeatureState, cache: Cache, pending: jax.Array,
                key: jax.Array) -> tuple[Proposal, Cache, FeatureState]:
        lengths = cache.lengths
        rows = jnp.arange(lengths.shape[0])[:, None]
        window = jnp.zeros((lengths.shape[0], self.shape.num_nodes + 2, state.feature.shape[-1]),
                           state.feature.dtype).at[:, 0].set(state.feature)

        def step(carry: tuple[LayerKV, jax.Array], tokens: jax.Array, layout: Layout):
            kv, window = carry
            slots = jnp.arange(layout.mask.shape[-1])
            parent = jnp.max(jnp.where(layout.mask & (slots < layout.slots[..., None]), slots,
                                       -1), axis=-1)
            parents = jnp.take_along_axis(window, (parent - lengths[:, None] + 1)[..., None],
                                          axis=1)
            depth = layout.positions[0, 0] - lengths[0]
            out, kv = run_cell(self.kind, ctx.params, ctx.draft_params, ctx.cfg, depth, parents,
                               tokens, layout.positions, layout.mask, kv, layout.slots)
            window = window.at[rows, layout.slots - lengths[:, None] + 1].set(
                out.astype(window.dtype))
            logits = self.kind.logits(ctx.params, ctx.draft_params, ctx.cfg, out, ctx.vocab)
            return logits, jnp.zeros((*tokens.shape, 1), jnp.float32), (kv, window)

        proposal, _, _, (kv, _) = self.shape.draft(step, (state.kv, window), lengths, pending,
                                                   key, ctx.sampling, cache.max_len)
        return proposal, cache, state.replace(kv=kv)

    def commit(self, ctx: DraftContext, state: FeatureState, done: Round) -> FeatureState:
        """The block's K/V at the slots after the pending token along the accepted path (and
        the new pending token's), from the target's features there; the feature at the last
        kept position. Rows that are done keep theirs."""
        path = done.acceptance.path
        features = self._fuse(ctx, {e: along_path(done.features[e], path)
                                    for e in self.exits})                       # [B, 1+D, D]
        emitted = done.acceptance.emitted                                       # [B, 1+D]
        layout = chain_layout(done.lengths_before + 1, emitted.shape[1], state.kv.k.shape[1])
        _, kv = run_cell(self.kind, ctx.params, ctx.draft_params, ctx.cfg, 0, features, emitted,
                         layout.positions, layout.mask, state.kv, layout.slots)
        return FeatureState(kv, done.last_kept(features, state.feature))

