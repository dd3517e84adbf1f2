"""Kangaroo (Liu et al. 2024): draft with the first E layers, a trained adapter and the shared
unembedding; stop drafting at an unconfident draft (a chain's `stop_below`, η: the double early
exit).

The adapter (`specjax.heads.kangaroo`) is one attention block, so it keeps its own K/V across rounds
(the drafter state: one `LayerKV`, laid out like a target layer's): the prefill hook fills it
from the prompt's exit-E hidden states, drafting writes it at each node's slot, and commit fills
in the positions the draft never ran (a chain's last draft, a tree's leaves) from the hidden
states verification computed there, then moves a tree's accepted path into place as the target
cache does. The first E layers are the target's own, so verification reuses them as `selfspec`
does. Sampled drafts are lossless like every proposal: acceptance reads the adapter's q.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from specjax.decoding.draft_vocab import VocabOptions
from specjax.decoding.drafter import DraftContext, Prefilled, Round, Strategy
from specjax.decoding.drafters.exit_drafting import ExitOptions, HeadDrafter, draft_with_layers
from specjax.decoding.proposal import Proposal
from specjax.decoding.shapes.shape_options import ShapeOptions, shape_for
from specjax.decoding.shapes.tree import Layout, chain_layout
from specjax.decoding.verify import proposal_layout
from specjax.heads.kangaroo import adapter_output, run_adapter_cached
from specjax.heads.vocab_subset import head_logits
from specjax.nn.cache import Cache, LayerKV
from specjax.sharding import constrain_cache


@dataclasses.dataclass(frozen=True)
class Kangaroo(HeadDrafter):
    """exit_layer = E, the exit the adapter was trained on; shape as for `ExitDrafter`
    (Kangaroo's own: a chain with `stop_below` = η). Its params are the adapter's."""

    name: ClassVar[str] = "kangaroo"
    mixable: ClassVar[bool] = False  # its commit reads the layers verification reused
    head_kind: ClassVar[str] = "an adapter"
    plays_forced: ClassVar[bool] = True  # the adapter's K/V is the text's after each commit

    @property
    def prefill_exits(self) -> tuple[int, ...]:
        return (self.exit_layer,)

    def prefill(self, ctx: DraftContext, prefilled: Prefilled) -> LayerKV:
        batch, width = prefilled.prompts.shape
        kv = constrain_cache(LayerKV.allocate(ctx.cfg, batch, prefilled.cache_len), batch)
        layout = chain_layout(jnp.zeros((batch,), jnp.int32), width, prefilled.cache_len)
        _, kv = run_adapter_cached(ctx.draft_params, ctx.cfg,
                                   prefilled.exit_hidden[self.exit_layer], kv, *layout)
        return kv

    def propose(self, ctx: DraftContext, state: LayerKV, cache: Cache, pending: jax.Array,
                key: jax.Array) -> tuple[Proposal, Cache, LayerKV]:
        def head(ctx: DraftContext, hidden: jax.Array, layout: Layout,
                 kv: LayerKV) -> tuple[jax.Array, LayerKV]:
            out, kv = run_adapter_cached(ctx.draft_params, ctx.cfg, hidden, kv, *layout)
            return head_logits(ctx.params, ctx.cfg, out, ctx.vocab), kv

        return draft_with_layers(ctx, self.shape, cache, pending, key, ((0, self.exit_layer),),
                                 head, state)

    def forced_logits(self, ctx: DraftContext, tokens: jax.Array, hidden: jax.Array,
                      at: jax.Array) -> jax.Array:
        """The adapter on the exit's hidden states of the whole text, read at `at`."""
        out = adapter_output(ctx.draft_params, ctx.cfg, hidden[self.exit_layer - 1])
        return head_logits(ctx.params, ctx.cfg, jnp.take_along_axis(out, at[..., None], axis=1),
                           ctx.vocab)

    def commit(self, ctx: DraftContext, state: LayerKV, done: Round) -> LayerKV:
        missing = done.proposal.reuse.missing
        layout = proposal_layout(done.lengths_before, done.proposal, state.k.shape[1])
        hidden = jnp.take_along_axis(done.reused_hidden, missing[..., None], axis=1)
        _, kv = run_adapter_cached(ctx.draft_params, ctx.cfg, hidden, state,
                                   *layout.take(missing))
        if done.acceptance.path is not None:
            kv = kv.commit(done.lengths_before, done.lengths_after, done.acceptance.path)
        return kv


STRATEGIES = {"kangaroo": Strategy(lambda options: Kangaroo(options.exit_layer, shape_for(options)),
                                   (ExitOptions, ShapeOptions, VocabOptions))}
