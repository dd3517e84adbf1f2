"""Classic speculative decoding: a separate, smaller draft model with the same vocabulary.

The draft model keeps its own KV cache (the drafter state), laid out like the target's and
committed to the same lengths: its prefill runs the prompt, each round it drafts the proposal's
shape one step per level, and commit keeps the accepted path. The last accepted token may be
one the draft model never ran (a chain's last draft, a tree's leaf), so commit keeps every
accepted token but that one, runs it once at the committed length and keeps it too
(gpt-fast's catch-up; for a token it did run, the same values again). Its layers may be of any
kind: an attention layer rewrites that slot's K/V, a state-space layer folds the token into
its state. Nothing of the target is reused: verification runs every layer.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.decoding.drafter import (
    DraftContext,
    DrafterBase,
    DraftWeights,
    Prefilled,
    Round,
    Strategy,
)
from specjax.decoding.proposal import Proposal, Shape
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.shape_options import ShapeOptions, shape_for
from specjax.decoding.shapes.tree import Layout
from specjax.model import allocate_cache, embed, exit_logits, prefill_cached, run_layers_cached
from specjax.nn.cache import Cache

ASSISTANT = "the draft model"  # hf_options' stand-in for the assistant model object


@dataclasses.dataclass(frozen=True)
class DraftModel(DrafterBase):
    """shape: the proposals' shape; cfg: the draft model's config (bound from its weights,
    `bind`). Its params are the draft model's (layers unstacked, as for decoding)."""

    shape: Shape = Chain(num_draft=4)
    cfg: ModelConfig | None = None

    name: ClassVar[str] = "draft"
    mixable: ClassVar[bool] = False  # its cache holds the K/V of its own drafts
    needs_weights: ClassVar[bool] = True
    plays_forced: ClassVar[bool] = True  # its cache holds the text's after each commit
    weights_hint: ClassVar[str] = (
        "pass --draft_workdir, a specjax workdir (trained or imported) with the same tokenizer")
    def bind(self, weights: DraftWeights) -> DraftModel:
        return dataclasses.replace(self, cfg=weights.cfg)

    def validate(self, cfg: ModelConfig) -> None:
        if self.cfg is None:
            raise ValueError(f"strategy 'draft' needs a draft model: {self.weights_hint}")
        if self.cfg.vocab_size != cfg.vocab_size:
            raise ValueError(f"the draft model's vocabulary ({self.cfg.vocab_size} ids) differs "
                             f"from the target's ({cfg.vocab_size})")
        self.shape.validate()

    def label(self) -> str:
        return f"{self.name} {self.shape.label()}"

    def hf_options(self) -> dict[str, Any] | None:
        """transformers' assisted generation with the same draft model (`ASSISTANT`: the peer
        benchmark loads it) drafting the same constant number of tokens (chains only)."""
        if not self.shape.is_chain:
            return None
        return {"assistant_model": ASSISTANT, "num_assistant_tokens": self.shape.num_draft,
                "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": self.shape.stop_below}

    def prefill(self, ctx: DraftContext, prefilled: Prefilled) -> Cache:
        batch = prefilled.prompts.shape[0]
        cache = allocate_cache(self.cfg, batch, prefilled.cache_len,
                               window=1 + self.shape.num_nodes)
        _, cache = prefill_cached(ctx.draft_params, self.cfg,
                                  embed(ctx.draft_params, self.cfg, prefilled.prompts), cache,
                                  prefilled.lengths)
        return cache.prefilled(prefilled.lengths)

    def forced_logits(self, ctx: DraftContext, tokens: jax.Array, hidden: jax.Array,
                      at: jax.Array) -> jax.Array:
        """The draft model's own pass over the whole text, read at `at`."""
        batch, steps = tokens.shape
        out, _ = prefill_cached(ctx.draft_params, self.cfg,
                                embed(ctx.draft_params, self.cfg, tokens),
                                allocate_cache(self.cfg, batch, steps),
                                jnp.full((batch,), steps, jnp.int32))
        return exit_logits(ctx.draft_params, self.cfg,
                           jnp.take_along_axis(out, at[..., None], axis=1))

    def propose(self, ctx: DraftContext, state: Cache, cache: Cache, pending: jax.Array,
                key: jax.Array) -> tuple[Proposal, Cache, Cache]:
        def step(draft_cache: Cache, tokens: jax.Array, layout: Layout):
            hidden, draft_cache = run_layers_cached(
                ctx.draft_params, self.cfg, embed(ctx.draft_params, self.cfg, tokens),
                draft_cache, layout.slots, positions=layout.positions, mask=layout.mask)
            return (exit_logits(ctx.draft_params, self.cfg, hidden),
                    jnp.zeros(tokens.shape + (1,), jnp.float32), draft_cache)

        proposal, _, _, state = self.shape.draft(step, state, cache.lengths, pending, key,
                                                 ctx.sampling, cache.max_len)
        return proposal, cache, state

    def commit(self, ctx: DraftContext, state: Cache, done: Round) -> Cache:
        active = done.lengths_after > done.lengths_before
        before_last = jnp.where(active, done.lengths_after - 1, done.lengths_before)
        state = state.commit(before_last, done.acceptance.path)
        accepted = done.acceptance.num_accepted
        last_draft = jnp.take_along_axis(done.acceptance.emitted,
                                         jnp.maximum(accepted - 1, 0)[:, None], axis=1)[:, 0]
        last = jnp.where(accepted > 0, last_draft, done.pending)
        _, state = run_layers_cached(ctx.draft_params, self.cfg,
                                     embed(ctx.draft_params, self.cfg, last[:, None]), state,
                                     before_last)
        return state.commit(done.lengths_after)


STRATEGIES = {"draft": Strategy(lambda options: DraftModel(shape_for(options)), (ShapeOptions,))}
