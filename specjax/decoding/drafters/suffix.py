"""Suffix decoding (strategy `suffix`; Oliaro et al. 2024, SuffixDecoding, as vLLM's `suffix`
method runs Arctic Inference's): drafts come from what followed the longest earlier match of
the text's last tokens, in the row's own prompt and output and in the other rows of the batch
(the requests decoded beside it). Of the occurrences of the longest match (at most
`suffix_depth` tokens), each depth drafts the token that most of them continue with, and the
occurrences that continued otherwise drop out, as walking down a suffix tree's most frequent
branch (ties go to the lowest token id). A draft is kept while its empirical probability (its
share of the occurrences still matching) is at least `suffix_min_prob`, and a row drafts at
most `suffix_factor` tokens per matched token (longer matches speculate further).

The draft distribution is the occurrences' empirical next-token distribution over the tokens
whose share passes `suffix_min_prob`, at the sampling's temperature, so a sampled draft is
drawn from it and accepted by the usual rule: lossless. Top-k and top-p do not filter it
(`sampling.temperature_only`): at most 1 / suffix_min_prob ids have mass (with a minimum
above 0), and the filters pass over the whole vocabulary at every depth (at 49,152 ids, K=4,
temperature 0.8, top-p 0.95: 10.4 ms a proposal filtered, 7.7 ms not; top-k 50 besides:
13.7 ms). (Drawn from all the continuations and then dropped when its share falls short, a
draft would not be lossless: the dropped draw emits a token from p, but the draws kept are
accepted at min(1, p/q) with q's mass partly on tokens that are never kept, and the output
leaves p; with the default 0.1, a chi-square test rejects it.) The whole text of every row
is the drafter's state ([B, cache_len + 1] tokens, as for `ngram`), updated at commit inside
the jitted loop; chains only.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.decoding.drafter import DraftContext, DrafterBase, Prefilled, Round, Strategy
from specjax.decoding.drafters.text_history import commit_text, prefill_text
from specjax.decoding.options import option, within
from specjax.decoding.proposal import Proposal
from specjax.decoding.sampling import temperature_only
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.shape_options import ShapeOptions
from specjax.nn.cache import Cache

MAX_DEPTH = 16  # each matched position compiles one comparison of the text


@dataclasses.dataclass(frozen=True)
class SuffixOptions:
    """SuffixDecoding's parameters (vLLM's suffix_decoding_max_tree_depth, _min_token_prob and
    _max_spec_factor)."""

    suffix_depth: int = option(8, "Strategy suffix: the longest suffix of the text matched "
                                  f"(at most {MAX_DEPTH}).", within(1, MAX_DEPTH,
                                                                    high_included=True))
    suffix_min_prob: float = option(0.1, "Strategy suffix: a draft is kept while its share of "
                                         "the matching occurrences is at least this.",
                                    within(0, 1, high_included=True))
    suffix_factor: float = option(1.0, "Strategy suffix: drafts per matched token (a match of "
                                       "n tokens drafts at most ceil(n x this), and num_draft).",
                                  within(0, 64, high_included=True))


@dataclasses.dataclass(frozen=True)
class SuffixDecoding(DrafterBase):
    """depth: the longest suffix matched; min_prob, factor: as `SuffixOptions`; shape: a chain
    of up to K drafts."""

    depth: int = 8
    min_prob: float = 0.1
    factor: float = 1.0
    shape: Chain = Chain(num_draft=4)

    name: ClassVar[str] = "suffix"
    copies_text: ClassVar[bool] = True

    def validate(self, cfg: ModelConfig) -> None:
        if not self.shape.is_chain or self.shape.stop_below:
            raise ValueError("strategy 'suffix' drafts a chain without a confidence stop (its "
                             "own is --suffix_min_prob): drop --tree and --draft_threshold")
        if not 1 <= self.depth <= MAX_DEPTH:
            raise ValueError(f"suffix_depth={self.depth} must lie in [1, {MAX_DEPTH}]")
        self.shape.validate()

    def label(self) -> str:
        return (f"{self.name} P={self.depth} p>={self.min_prob:g} x{self.factor:g} "
                f"{self.shape.label()}")

    def prefill(self, ctx: DraftContext, prefilled: Prefilled) -> jax.Array:
        return prefill_text(prefilled)

    def commit(self, ctx: DraftContext, state: jax.Array, done: Round) -> jax.Array:
        return commit_text(state, done)

    def propose(self, ctx: DraftContext, state: jax.Array, cache: Cache, pending: jax.Array,
                key: jax.Array) -> tuple[Proposal, Cache, jax.Array]:
        rows = jnp.arange(state.shape[0])
        text = state.at[rows, cache.lengths].set(pending)
        ends = cache.lengths + 1
        best, matching = occurrences(text, ends, self.depth)
        vocab, num_draft = ctx.cfg.vocab_size, self.shape.num_draft

        def step(carry, tokens, layout):
            matching, d, counts = carry
            followed = shifted(text, d)                                        # text[r, s + d]
            # row b's occurrences in every row r, kept where row b's own drafted token follows
            matching = jnp.where(d > 0, matching & (followed[None] == tokens[:, :, None]),
                                 matching)
            seen = next_counts(text, ends, matching, d + 1, vocab)
            # Only tokens whose share passes min_prob may be drawn: a draft drawn and then
            # dropped for its share would bias the output (module docstring).
            share = seen / jnp.maximum(jnp.sum(seen, axis=-1, keepdims=True), 1.0)
            allowed_token = (seen > 0) & (share >= self.min_prob)
            logits = jnp.where(allowed_token, jnp.log(jnp.maximum(seen, 1.0)), -1e9)
            return (logits[:, None], jnp.zeros((*tokens.shape, 1), jnp.float32),
                    (matching, d + 1, counts.at[:, d].set(seen)))

        carry = (matching, jnp.zeros((), jnp.int32),
                 jnp.zeros((text.shape[0], num_draft, vocab), jnp.float32))
        proposal, _, _, (_, _, counts) = self.shape.draft(
            step, carry, cache.lengths, pending, key, temperature_only(ctx.sampling),
            cache.max_len, forced=ctx.forced)
        drafted = jnp.take_along_axis(counts, proposal.tokens[..., None], axis=2)[..., 0]
        share = drafted / jnp.maximum(jnp.sum(counts, axis=2), 1.0)
        allowed = jnp.minimum(jnp.ceil(self.factor * best), num_draft)
        keep = ((share >= self.min_prob) & (drafted > 0)
                & (jnp.arange(num_draft)[None, :] < allowed[:, None]))
        keep = jnp.cumprod(keep, axis=1).astype(bool)  # a chain: the kept drafts are a prefix
        return (proposal.replace(valid=proposal.valid & keep,
                                 stats={**proposal.stats, "matched": (best > 0).astype(jnp.int32)}),
                cache, text)


def occurrences(text: jax.Array, ends: jax.Array, depth: int) -> tuple[jax.Array, jax.Array]:
    """For each row b of `text` [B, W] (holding `ends` [B] tokens), the length of the longest
    suffix of its text (at most `depth`) that also ends at an earlier position s of any row r,
    followed there by at least one known token, and where it does: (best [B], matching
    [B, R=B, W] bool at the positions s where that suffix ends). No match: best 0, none."""
    width = text.shape[1]
    starts = jnp.arange(width)
    pattern = jnp.take_along_axis(text, jnp.clip(ends[:, None] - 1 - jnp.arange(depth), 0,
                                                 width - 1), axis=1)          # [B, depth]
    length = jnp.zeros((text.shape[0], text.shape[0], width), jnp.int32)
    running = jnp.ones(length.shape, bool)
    for k in range(depth):
        earlier = jnp.roll(text, k, axis=1)                                   # text[r, s - k]
        running &= ((earlier[None] == pattern[:, k, None, None]) & (starts >= k)[None, None]
                    & (k < ends)[:, None, None])
        length += running
    # A continuation is known (s + 1 < ends[r]) and, in the row itself, s is not its end.
    known = starts[None, None, :] + 1 < ends[None, :, None]
    length = jnp.where(known, length, 0)
    best = jnp.max(length, axis=(1, 2))
    return best, (length == best[:, None, None]) & (best[:, None, None] > 0)


def next_counts(text: jax.Array, ends: jax.Array, matching: jax.Array, offset: int | jax.Array,
                vocab: int) -> jax.Array:
    """[B, vocab]: how many of each row's `matching` positions s are followed, `offset`
    tokens on, by each token (positions whose text ends before that do not count). Added
    up by token (a scatter over the R x W positions), not through a one-hot [R, W, vocab]
    matrix: at 49,152 ids that made a K=6 proposal cost 19 ms on a 2-core CPU."""
    at = jnp.arange(text.shape[1]) + offset
    following = shifted(text, offset).reshape(-1)                             # [R * W]
    present = matching & (at[None, None, :] < ends[None, :, None])            # [B, R, W]
    return jax.vmap(lambda row: jnp.zeros(vocab, jnp.float32).at[following].add(
        row.reshape(-1).astype(jnp.float32)))(present)


def shifted(text: jax.Array, offset: int | jax.Array) -> jax.Array:
    """[R, W]: text[r, s + offset] at every position s (the last token past the end)."""
    width = text.shape[1]
    return jnp.take(text, jnp.clip(jnp.arange(width) + offset, 0, width - 1), axis=1)


STRATEGIES = {"suffix": Strategy(lambda options: SuffixDecoding(
    options.suffix_depth, options.suffix_min_prob, options.suffix_factor,
    Chain(options.num_draft)), (SuffixOptions, ShapeOptions))}
