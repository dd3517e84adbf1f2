"""The drafters that copy from the text (`Drafter.copies_text`: ngram, suffix), played over an
exit report's runs (`exit_workload.ExitRuns`, the model's own continuations of the prompts,
greedy or sampled) as an exit's drafts are, instead of probed.

Their proposal at each position, from the text so far, is what the loop drafts there
(`play_copied`); their round is the verification of K + 1 tokens, mapped by the calibrated
line (`loop_calibration`), plus their proposal's own measured seconds. Their drafts depend on
where a round starts, unlike an exit's, so `copied_rounds` proposes from each start, every
depth drafted after the text's own tokens (teacher forcing, as the loop drafts after accepted
drafts), and the same recursion walks chances that depend on the start
(`exit_workload.expected_rounds_from`). Sampled, a draft is accepted with
a = min(1, q(y) / p(y)) as an exit's is, q the drafter's own distribution at that depth: a
copy's is a point mass (ngram: a is 1 where the draft is the emitted token, 0 elsewhere),
suffix decoding's the counts of the continuations among its matches at the sampling's
temperature (each count to the power 1 / T, normalised).
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.decoding.drafter import DraftContext, Drafter
from specjax.decoding.engine import bucket
from specjax.decoding.sampling import SamplingParams
from specjax.nn.cache import Cache
from specjax.timing import timed
from specjax.tools.exit_workload import ExitRuns, expected_rounds_from

# Positions whose copied drafts one step of `play_copied` proposes together (suffix decoding
# counts next tokens over the vocabulary at each: 49,152-way on SmolLM2).
PLAYED_PER_CALL = 8
TIMED_PROPOSALS = 8  # proposals in one timed call of a copying drafter (dispatch amortised)


@dataclasses.dataclass(frozen=True)
class CopiedPlay:
    """A copying drafter played over a workload: tokens per round, and the seconds one
    proposal of it takes (batch 1, as the loop drafts; timed in a loop of proposals)."""

    tau: float
    draft_seconds: float


def play_copied(drafter: Drafter, cfg: ModelConfig, runs: ExitRuns,
                repeats: int = 5) -> CopiedPlay:
    """A drafter that copies from the text (`copies_text`: ngram, suffix), played over `runs`'
    continuations in their mode (`copied_rounds`), and its proposal's cost: the median of
    `repeats` timed loops of `TIMED_PROPOSALS` proposals on the first text (suffix decoding's
    counts over a 49,152-id vocabulary are not free), drawn with the runs' sampling as a
    sampled loop draws them (a sampled draw costs a softmax over the vocabulary at every
    depth; timed greedy, a sampled proposal's cost once put ngram's K=4 18% high)."""
    if not drafter.copies_text:
        raise ValueError(f"strategy {drafter.name!r} does not copy its drafts from the text")
    if not runs.texts:
        raise ValueError("the runs hold no texts to play a drafter over")
    rounds = float(copied_rounds(drafter, cfg, runs).sum())
    positions = sum(max(len(text) - length - 1, 0)
                    for text, length in zip(runs.texts, runs.prompt_lengths, strict=True))
    text, end = runs.texts[0], runs.prompt_lengths[0] + 1
    timed_loop = _proposal_loop(drafter, cfg)
    args = _padded(text), jnp.int32(min(end, len(text))), runs.sampling
    timed_loop(*args).block_until_ready()
    seconds = statistics.median(timed(lambda: timed_loop(*args).block_until_ready())
                                for _ in range(repeats)) / TIMED_PROPOSALS
    return CopiedPlay(positions / rounds if rounds else 1.0, seconds)


def copied_rounds(drafter: Drafter, cfg: ModelConfig, runs: ExitRuns) -> np.ndarray:
    """[texts]: the rounds a copying drafter's loop is expected to take over each of `runs`'
    continuations. At each position a round can start on, its proposal from the text so far
    (its own `propose`), each depth drafted after the text's own tokens (`DraftContext.forced`,
    what the loop drafts after accepted drafts), gives the chance of each draft
    (`copied_acceptance`); `expected_rounds_from` walks them. Greedy, the rounds the loop
    takes; sampled (the runs' sampling, which needs their `target`), the sampled loop's in
    expectation."""
    sampling = runs.sampling
    if sampling is not None and len(runs.target) != len(runs.texts):
        raise ValueError("sampled runs hold no target probabilities of their tokens (make them "
                         "with exit_runs)")
    rounds = []
    for index, (text, prompt_length) in enumerate(zip(runs.texts, runs.prompt_lengths,
                                                      strict=True)):
        ends = np.arange(prompt_length + 1, len(text), dtype=np.int32)
        if not len(ends):
            rounds.append(0.0)
            continue
        # Padded to a bucket by repeating the last (one program for similar lengths).
        calls = np.full(bucket(len(ends)), ends[-1], np.int32)
        calls[:len(ends)] = ends
        tokens, valid, chance = (np.asarray(out)[:len(ends)] for out in _proposals(
            drafter, cfg)(_padded(text), jnp.asarray(calls), sampling))
        target = None if sampling is None else runs.target[index]
        rounds.append(float(expected_rounds_from(copied_acceptance(
            tokens, valid, chance, text, ends, target))))
    return np.asarray(rounds)


def _padded(text: Sequence[int]) -> jax.Array:
    """The text in a row of its `bucket` + 1 slots (a drafter's state, `text_history`)."""
    padded = np.zeros(bucket(len(text)) + 1, np.int32)
    padded[:len(text)] = text
    return jnp.asarray(padded)


def copied_acceptance(tokens: np.ndarray, valid: np.ndarray, chance: np.ndarray,
                      text: Sequence[int], ends: np.ndarray,
                      target: np.ndarray | None = None) -> np.ndarray:
    """[E, K]: the chance that each draft of each chain proposal (`tokens`, `valid`, and
    `chance`, q of the text's own token at each depth, [E, K], made knowing the first
    `ends[i]` tokens of `text`, `ends` ascending from the first position rounds produce) is
    accepted, given the text (0 past its end and where invalid). Greedy (`target` None):
    1 where the draft is the text's token. Sampled: min(1, q(y) / p(y)) with p(y) the
    target's probability of the text's token y there (`target` [E], from `ends[0]` on; a
    draft where p(y) is 0 is rejected, as verification rejects it)."""
    at = ends[:, None] + np.arange(tokens.shape[1])[None, :]
    inside = valid & (at < len(text))
    clipped = np.minimum(at, len(text) - 1)
    if target is None:
        return (inside & (tokens == np.asarray(text)[clipped])).astype(np.float64)
    p = np.asarray(target, np.float64)[np.minimum(clipped - ends[0], len(target) - 1)]
    ratio = np.minimum(1.0, np.asarray(chance, np.float64) / np.where(p > 0, p, 1.0))
    return np.where(inside & (p > 0), ratio, 0.0)


@functools.lru_cache(maxsize=16)
def _proposals(drafter: Drafter, cfg: ModelConfig) -> Callable:
    """A jitted (text [W], ends [E], sampling) -> (tokens, valid, chance) [E, K]: the
    drafter's proposal along the text (`_propose_at`) when its first `ends[i]` tokens are
    known (the last one pending), a few positions at a time."""
    return jax.jit(lambda text, ends, sampling: jax.lax.map(
        lambda end: _propose_at(drafter, cfg, text, end, sampling), ends,
        batch_size=PLAYED_PER_CALL))


@functools.lru_cache(maxsize=16)
def _proposal_loop(drafter: Drafter, cfg: ModelConfig) -> Callable:
    """A jitted (text [W], end, sampling) -> checksum: `TIMED_PROPOSALS` proposals (drawn
    with `sampling`, greedy when None) one after another, alternately at `end` and one token
    earlier (so that none is hoisted out of the loop)."""
    def body(i: jax.Array, total: jax.Array, text: jax.Array, end: jax.Array,
             sampling: SamplingParams | None) -> jax.Array:
        tokens, valid, _ = _propose_at(drafter, cfg, text, jnp.maximum(end - i % 2, 1),
                                       sampling, jax.random.PRNGKey(i))
        return total + jnp.sum(jnp.where(valid, tokens, 0))
    return jax.jit(lambda text, end, sampling: jax.lax.fori_loop(
        0, TIMED_PROPOSALS, lambda i, total: body(i, total, text, end, sampling),
        jnp.int32(0)))


def _propose_at(drafter: Drafter, cfg: ModelConfig, text: jax.Array, end: jax.Array,
                sampling: SamplingParams | None = None,
                key: jax.Array | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The drafter's proposal (tokens, valid [K]) knowing the text's first `end` tokens, the
    last pending, as the loop calls it (batch 1), each depth drafted after the text's own
    next tokens (`DraftContext.forced`): greedy, or drawn with `sampling` and `key`; and
    `chance` [K], q of the text's own token at each depth (1 when greedy)."""
    forced = text[jnp.minimum(end + jnp.arange(drafter.shape.num_draft), text.shape[0] - 1)]
    ctx = DraftContext(params={}, draft_params={}, sampling=sampling, cfg=cfg,
                       forced=forced[None])
    known = jnp.where(jnp.arange(text.shape[0]) < end - 1, text, 0)[None]
    cache = Cache(layers=(), lengths=(end - 1)[None], max_len=text.shape[0] - 1)
    proposal, _, _ = drafter.propose(ctx, known, cache, text[end - 1][None],
                                     jax.random.PRNGKey(0) if key is None else key)
    chance = (jnp.ones(forced.shape, jnp.float32) if proposal.q is None else
              jnp.take_along_axis(proposal.q[0], forced[:, None], axis=-1)[:, 0])
    return proposal.tokens[0], proposal.valid[0], chance
