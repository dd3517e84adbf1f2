"""Prompt lookup decoding (strategy `ngram`; Saxena 2023, transformers'
`prompt_lookup_num_tokens`, vLLM's `ngram`): drafts are copied from the text so far. The last
n tokens (the longest n in [`ngram_min`, `ngram_max`] that occurred before) are matched against
every earlier position of the prompt and the output; the K tokens that followed a match (the
one followed by the most, then the latest; transformers takes the earliest) are the proposal,
all depths at once (`proposal.depth_step`). No weights, no draft compute: it pays off where the
output repeats its context (code edits, summaries, retrieval), and proposes nothing (a round of
plain decoding) where nothing matches.

Lossless like every drafter here: a draft is a point mass, accepted with probability p(x).
The state is the text so far, [B, cache_len + 1] tokens: the prompt at prefill, then each
round's accepted drafts and next pending token written at commit. Positions past the text, or
rows without a match, are invalid nodes. Measured: docs/results/2026-11-26-ngram-and-layout.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.decoding.drafter import DraftContext, DrafterBase, Prefilled, Round, Strategy
from specjax.decoding.drafters.text_history import commit_text, prefill_text
from specjax.decoding.options import at_least, option, within
from specjax.decoding.proposal import Proposal, depth_step
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.shape_options import ShapeOptions
from specjax.nn.cache import Cache

MAX_NGRAM = 16  # each n compiles n shifted comparisons of the text


@dataclasses.dataclass(frozen=True)
class NgramOptions:
    """The n-gram sizes prompt lookup matches (vLLM's prompt_lookup_min / _max)."""

    ngram_max: int = option(3, "Strategy ngram: the longest n-gram matched against the prompt "
                               "and output so far (the longest that occurred wins; at most "
                               f"{MAX_NGRAM}).", within(1, MAX_NGRAM, high_included=True))
    ngram_min: int = option(1, "Strategy ngram: the shortest n-gram matched (no draft when "
                               "no n-gram this long occurred before).", at_least(1))


@dataclasses.dataclass(frozen=True)
class PromptLookup(DrafterBase):
    """ngram_max, ngram_min: the suffix lengths matched; shape: a chain of K copied tokens."""

    ngram_max: int = 3
    ngram_min: int = 1
    shape: Chain = Chain(num_draft=4)

    name: ClassVar[str] = "ngram"
    copies_text: ClassVar[bool] = True

    def validate(self, cfg: ModelConfig) -> None:
        if not self.shape.is_chain:
            raise ValueError("strategy 'ngram' drafts a chain (one continuation per match): "
                             "drop --tree")
        if not 1 <= self.ngram_min <= self.ngram_max <= MAX_NGRAM:
            raise ValueError(f"ngram_min={self.ngram_min} must be <= ngram_max="
                             f"{self.ngram_max}, both in [1, {MAX_NGRAM}]")
        if self.shape.stop_below:
            raise ValueError("strategy 'ngram' drafts without a confidence stop (a copied draft "
                             "has probability 1)")
        self.shape.validate()

    def label(self) -> str:
        return f"{self.name} n={self.ngram_min}..{self.ngram_max} {self.shape.label()}"

    def hf_options(self) -> dict[str, Any] | None:
        """transformers' prompt lookup (it matches n-grams down to 1: none for a minimum)."""
        if self.ngram_min != 1:
            return None
        return {"prompt_lookup_num_tokens": self.shape.num_draft,
                "max_matching_ngram_size": self.ngram_max}

    def prefill(self, ctx: DraftContext, prefilled: Prefilled) -> jax.Array:
        return prefill_text(prefilled)

    def propose(self, ctx: DraftContext, state: jax.Array, cache: Cache, pending: jax.Array,
                key: jax.Array) -> tuple[Proposal, Cache, jax.Array]:
        rows = jnp.arange(state.shape[0])
        text = state.at[rows, cache.lengths].set(pending)
        tokens, found = continuation(text, cache.lengths + 1, self.ngram_min, self.ngram_max,
                                     self.shape.num_draft)
        logits = jnp.where(jax.nn.one_hot(tokens, ctx.cfg.vocab_size, dtype=bool), 0.0, -1e9)
        step = depth_step(logits, cache.lengths)
        # Drafted as greedy: a copy is a point mass whatever the sampling's filters, so
        # its q is its one-hot (filtering 49,152 ids at each depth cost 2.4 ms a depth).
        proposal, _, _, _ = self.shape.draft(step, (), cache.lengths, pending, key, None,
                                             cache.max_len, forced=ctx.forced)
        if ctx.sampling is not None:
            proposal = proposal.replace(q=jax.nn.one_hot(proposal.tokens, ctx.cfg.vocab_size,
                                                         dtype=jnp.float32))
        matched = jnp.any(found, axis=1).astype(jnp.int32)
        return (proposal.replace(valid=proposal.valid & found,
                                 stats={**proposal.stats, "matched": matched}), cache, text)

    def commit(self, ctx: DraftContext, state: jax.Array, done: Round) -> jax.Array:
        return commit_text(state, done)


def continuation(text: jax.Array, ends: jax.Array, ngram_min: int, ngram_max: int,
                 count: int) -> tuple[jax.Array, jax.Array]:
    """The `count` tokens after an earlier occurrence of the text's last n tokens, for the
    longest n in [ngram_min, ngram_max] that has one: of its occurrences, the one followed by
    the most known tokens (up to `count`; in a run "a a a a" the latest is followed by one),
    the latest of those. text [B, W] holds `ends` [B] tokens. Returns the tokens [B, count]
    and which of them exist [B, count] (none without a match; none past the text's end)."""
    width = text.shape[1]
    starts = jnp.arange(width)[None, :]
    best_start = jnp.full(ends.shape, -1, jnp.int32)
    best_n = jnp.zeros(ends.shape, jnp.int32)
    for n in range(ngram_max, ngram_min - 1, -1):
        suffix = jnp.take_along_axis(text, jnp.clip(ends[:, None] - n + jnp.arange(n), 0,
                                                    width - 1), axis=1)       # [B, n]
        match = (starts + n < ends[:, None]) & (ends[:, None] >= n + 1)  # before the suffix
        for i in range(n):
            match &= jnp.roll(text, -i, axis=1) == suffix[:, i:i + 1]        # text[s + i]
        followed = jnp.minimum(ends[:, None] - starts - n, count)
        chosen = jnp.argmax(jnp.where(match, followed * width + starts, -1), axis=1)
        take = (best_start < 0) & jnp.any(match, axis=1)
        best_start = jnp.where(take, chosen, best_start)
        best_n = jnp.where(take, n, best_n)
    at = (best_start + best_n)[:, None] + jnp.arange(count)[None, :]
    found = (best_start[:, None] >= 0) & (at < ends[:, None])
    return jnp.take_along_axis(text, jnp.clip(at, 0, width - 1), axis=1), found


# A chain of K copies: a tree or a confidence stop stored as the checkpoint's default (for
# selfspec) is not read, so it neither applies nor blocks; given as a flag, it is refused as
# unused.
STRATEGIES = {"ngram": Strategy(lambda options: PromptLookup(
    options.ngram_max, options.ngram_min, Chain(options.num_draft)), (NgramOptions, ShapeOptions))}
