"""The exit report on a workload: each exit's drafts along the model's own continuations of
given prompts (what the benchmark decodes), and what a round of the real decode loop costs.

Greedy self-speculation from exit E keeps a draft while it equals the target's token. Along the
target's greedy continuation, a draft made after accepted drafts is exactly exit E's prediction
at that position with teacher forcing (the shallow layers see the same tokens). So the runs of
positions where exit E's argmax (over the drafter's vocabulary) equals the next token give
every round's accepted count, hence tau, without assuming independent acceptance
(`ExitRuns.tau`): on held-out text, independence and another text's agreement put tau off by
up to 30%.

Sampled, the loop draws draft x from the exit's q and accepts it with probability
min(1, p(x) / q(x)), so it emits y after an accepted draft with probability min(p(y), q(y)),
and emits y at all with probability p(y). Its output is thus distributed as plain sampling's
(`model_continuations` with `sampling`), and given that output y, the draft at a position is
accepted with probability a = min(1, q(y) / p(y)), independently of the other positions (each
position's draw is its own; a draft after accepted ones sees the text's tokens, as greedy). A
round is then a walk over those positions' coin flips, and `expected_rounds` takes its
expectation exactly: the rounds played over sampled continuations, with q and p from one
teacher-forced pass, are the sampled loop's in expectation, without assuming i.i.d.
acceptance. Greedy is the case a in {0, 1}.

A static tree is played the same way. A round goes down from the pending token through the
child accepted at each depth, so given the text what matters at each position is the chance
that the node's child of sibling index j is the one accepted (`tree_rounds` walks them, in
expectation; a chain is the case of one child per node). Greedy, the children are the
drafter's top tokens in order, so that child is the one whose index is the rank of the text's
next token among the exit's drafts (`ExitRuns.ranks`): a chance of 1 or 0. Sampled, with
children drawn without replacement (`StaticTree`'s default), the loop tries the first child
as a chain tries its draft and, on a rejection, the second against the residual
p' = norm(max(0, p - q)), with q' the draft's q without the first child's token,
renormalised. Given the emitted y, the first child is the accepted one with probability
min(1, q(y) / p(y)), and the second with probability
sum over x != y of max(0, q(x) - p(x)) min(p'(y), q(y) / (1 - q(x))), over p(y)
(the first child drew x and was rejected, then the second drew y and was accepted), computed
at every position from the same teacher-forced pass (`ExitRuns.second_child`). A third child
would need a sum over pairs of earlier tokens, so trees with more than two children per node
are not played sampled.

Pieces timed in isolation miss what the compiled loop adds (acceptance, the cache commit, the
draft loop, the while loop) and what it shares (a small model's layers fused into one
program): one benchmark of `ar` and of selfspec at one exit with the smallest and the largest
K on a few of the prompts measures the real loop (`LoopCalibration`). The real seconds per
token of `ar` replace the pieces' plain decoding; the real seconds per round of the two chains,
against the pieces' prediction of those rounds, fix a line (a scale and an overhead per round)
that maps every other (exit, K)'s pieces to the loop's seconds.

The drafters that copy from the text (`copies_text`: ngram, suffix) are played the same way:
their proposal at each position, from the text so far, is what the loop drafts there
(`play_copied`); their round is the verification of K + 1 tokens, mapped by the same line,
plus their proposal's own measured seconds. Their drafts depend on where a round starts,
unlike an exit's, so `copied_rounds` proposes from each start, every depth drafted after the
text's own tokens (teacher forcing, as the loop drafts after accepted drafts), and the same
recursion walks chances that depend on the start (`expected_rounds_from`). Sampled, a draft
is accepted with a = min(1, q(y) / p(y)) as an exit's is, q the drafter's own distribution
at that depth: a copy's is a point mass (ngram: a is 1 where the draft is the emitted token,
0 elsewhere), suffix decoding's the counts of the continuations among its matches at the
sampling's temperature (each count to the power 1 / T, normalised).
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
from specjax.decoding.acceptance import residual
from specjax.decoding.drafter import DraftContext, Drafter
from specjax.decoding.engine import AUTOREGRESSIVE, Generator, bucket
from specjax.decoding.sampling import SamplingParams, probabilities
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.heads.vocab_subset import DraftVocab, exit_head_logits
from specjax.model import Params, embed, run_layers
from specjax.nn.cache import Cache
from specjax.timing import timed
from specjax.tools.bench import StrategyResult, run_benchmark

# Windows of the teacher-forced pass over prompts + continuations: one compile per bucket.
ROWS_PER_PASS = 4
# Positions whose copied drafts one step of `play_copied` proposes together (suffix decoding
# counts next tokens over the vocabulary at each: 49,152-way on SmolLM2).
PLAYED_PER_CALL = 8
# Sampled continuations of each prompt a sampled workload is played over: one sample's tau
# spread from 1.36 to 1.90 across seeds on the default model (4 prompts x 64 tokens).
SAMPLED_PLAYS = 4
TIMED_PROPOSALS = 8  # proposals in one timed call of a copying drafter (dispatch amortised)


@dataclasses.dataclass(frozen=True)
class ExitRuns:
    """Per prompt, [L, n]: the probability that exit e's draft (row e-1) is accepted at each
    of the n positions decoding rounds produce (every token but the first, which the
    prefill's full pass makes), given the continuation: greedy 1 where the exit's argmax is
    the next token and 0 elsewhere, sampled min(1, q(y) / p(y)) (the module docstring); per
    prompt, the prompt and its continuation (`texts`, what drafters that copy from the text
    are played over) and the prompt's length; the sampling the continuations were drawn
    and the acceptance computed with (None: greedy); sampled, per prompt [n], the
    target's probability p(y) of each of those positions' tokens (what a copying drafter's
    sampled acceptance min(1, q(y) / p(y)) divides by); greedy, per prompt [L, n], the rank
    of the next token among exit e's drafts at each position (0: its argmax; the order a
    static tree's children take, `tree_rounds`); sampled, per prompt [L, n], the chance that
    a node's second child, drawn without replacement, is the one accepted at each position
    (the module docstring; the first child's is `accept`)."""

    accept: tuple[np.ndarray, ...]
    texts: tuple[tuple[int, ...], ...] = ()
    prompt_lengths: tuple[int, ...] = ()
    sampling: SamplingParams | None = None
    target: tuple[np.ndarray, ...] = ()
    ranks: tuple[np.ndarray, ...] = ()
    second_child: tuple[np.ndarray, ...] = ()
    _rounds: dict[int, np.ndarray] = dataclasses.field(  # per K, every exit's: `tau` reads
        default_factory=dict, init=False, repr=False, compare=False)  # them 7 x 30 times

    @property
    def positions(self) -> int:
        return sum(row.shape[1] for row in self.accept)

    def rate(self, exit_layer: int) -> float:
        """The exit's mean acceptance over those positions (greedy: the fraction where it
        agrees)."""
        hits = sum(float(row[exit_layer - 1].sum()) for row in self.accept)
        return hits / self.positions if self.positions else 0.0

    def tau(self, exit_layer: int, num_draft: int) -> float:
        """Tokens per round of chains of `num_draft` drafts from the exit, played over the
        continuations: the positions over the rounds they are expected to take
        (`expected_rounds`; greedy, the rounds they take)."""
        if not self.positions:
            return 1.0
        if num_draft not in self._rounds:
            self._rounds[num_draft] = sum(expected_rounds(row, num_draft) for row in self.accept)
        rounds = float(self._rounds[num_draft][exit_layer - 1])
        return self.positions / rounds if rounds else 1.0

    def plays_tree(self, tree: StaticTree) -> bool:
        """Whether rounds drafting `tree` can be played over these runs: greedy ones hold
        their ranks; sampled ones play a tree whose children are drawn without replacement,
        at most two per node (the module docstring)."""
        if self.sampling is None:
            return bool(self.ranks)
        return (bool(self.second_child) and tree.children == "without_replacement"
                and tree.max_children <= 2)

    def tree_tau(self, exit_layer: int, tree: StaticTree) -> float:
        """Tokens per round of rounds drafting the static tree `tree` from the exit, played
        over the continuations (`tree_rounds`; sampled, in expectation)."""
        if not self.plays_tree(tree):
            raise ValueError(f"the {tree.label()} cannot be played over these runs: greedy "
                             "runs need their ranks, and sampled ones play at most two "
                             "children per node, drawn without replacement")
        rounds = sum(tree_rounds(self._siblings(index, exit_layer, tree.max_children), tree)
                     for index in range(len(self.accept)))
        return self.positions / rounds if rounds else 1.0

    def _siblings(self, index: int, exit_layer: int, width: int) -> np.ndarray:
        """[n, C]: prompt `index`'s chance, at each position, that the child of each sibling
        index is the one accepted there (greedy: 1 at the text's token's rank, over `width`
        children; sampled: the first and the second child's)."""
        if self.sampling is None:
            ranks = self.ranks[index][exit_layer - 1]
            return (ranks[:, None] == np.arange(width)[None, :]).astype(np.float64)
        return np.stack([self.accept[index][exit_layer - 1],
                         self.second_child[index][exit_layer - 1]], axis=-1)


def tree_rounds(siblings: np.ndarray, tree: StaticTree) -> float:
    """The expected rounds decoding with the static tree `tree` takes over n positions where
    `siblings` [n, C] holds the chance, independently given the text, that the child of
    sibling index c is the one accepted at each position (greedy: 1 at the rank of the
    text's token among the drafter's tokens, 0 elsewhere; the rounds the loop takes). A
    round starting at t goes down from the pending token through the accepted child
    (position t at depth 1, t + 1 at depth 2, ...) and stops at a node none of whose
    children is accepted (a leaf always), adding one token of its own; a draft after
    accepted ones is the drafter's prediction with the text's tokens before it (teacher
    forcing, as for chains). A chain's parents give `expected_rounds` over the first
    child's chances."""
    siblings = np.asarray(siblings, np.float64)
    n, width = siblings.shape
    depth, kids = tree.depth, tree.child_lists
    padded = np.zeros((n + depth, max(width, tree.max_children)))  # none past the end
    padded[:n, :width] = siblings
    # Per tree position (0: the pending token): its depth, and over the round's start, the
    # chance that the round reaches it, then that it stops there.
    depths, reach = [0] * len(kids), [np.ones(n)] * len(kids)
    for position, children in enumerate(kids):
        at = padded[depths[position]:depths[position] + n]
        for index, child in enumerate(children):
            depths[child] = depths[position] + 1
            reach[child] = reach[position] * at[:, index]
    stops = [chance * (1 - padded[d:d + n, :len(children)].sum(axis=1))
             for chance, d, children in zip(reach, depths, kids, strict=True)]
    rounds = np.zeros(n + depth + 1)  # from each position, the expected rounds to the end
    for start in range(n - 1, -1, -1):
        rounds[start] = 1 + sum(stop[start] * rounds[start + d + 1]
                                for stop, d in zip(stops, depths, strict=True))
    return float(rounds[0])


def expected_rounds(accept: np.ndarray, num_draft: int) -> np.ndarray:
    """The expected rounds [...] a chain of `num_draft` drafts takes over n positions whose
    drafts are accepted with probabilities `accept` [..., n], independently given the text: a
    round starting at t accepts the drafts at t, t+1, ... while they are accepted (at most K),
    then adds one token of its own. Exact for 0/1 (greedy: the rounds the loop takes)."""
    accept = np.asarray(accept, np.float64)
    padded = np.concatenate([accept, np.zeros((*accept.shape[:-1], num_draft))], axis=-1)
    windows = np.lib.stride_tricks.sliding_window_view(padded, num_draft, axis=-1)
    return expected_rounds_from(windows[..., :accept.shape[-1], :])


def expected_rounds_from(accept: np.ndarray) -> np.ndarray:
    """As `expected_rounds` when a draft's chance depends on where its round starts:
    `accept` [..., n, K] holds, for a round starting at position t, the probability that its
    draft m (at position t + m) is accepted (0 past the n positions), independently given
    the text; a copying drafter's drafts are made from the round's start."""
    accept = np.asarray(accept, np.float64)
    n, num_draft = accept.shape[-2:]
    # From each position, the expected rounds to the end (none from past it).
    rounds = np.zeros((n + num_draft + 1, *accept.shape[:-2]))
    for start in range(n - 1, -1, -1):
        reach = np.ones(accept.shape[:-2])  # the probability the first m drafts are accepted
        total = 1.0
        for m in range(num_draft):
            chance = accept[..., start, m]
            total = total + reach * (1 - chance) * rounds[start + m + 1]
            reach = reach * chance
        rounds[start] = total + reach * rounds[start + num_draft + 1]
    return rounds[0]


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


def exit_runs(params: Params, cfg: ModelConfig, prompts: Sequence[Sequence[int]],
              continuations: Sequence[Sequence[int]],
              draft_ids: jax.Array | np.ndarray | None = None,
              sampling: SamplingParams | None = None) -> ExitRuns:
    """`ExitRuns` of the prompts' continuations: one teacher-forced pass through every exit,
    each exit's drafts over `draft_ids` (ascending; None: the whole vocabulary), greedy or
    drawn with `sampling` (the continuations then drawn with it too)."""
    texts = text_runs(prompts, continuations)
    vocab = None if draft_ids is None else DraftVocab.gather(
        params, cfg, jnp.asarray(draft_ids, jnp.int32))
    rows = texts.texts
    width = bucket(max(len(row) for row in rows))
    # Position t predicts token t + 1: rounds make each continuation's tokens 1..n-1.
    made = bucket(max(max(len(c) - 1 for c in continuations), 1))
    acceptance = _exit_acceptance(cfg)
    accept, target, ranks, second = [], [], [], []
    for start in range(0, len(rows), ROWS_PER_PASS):
        chunk = range(start, min(start + ROWS_PER_PASS, len(rows)))
        tokens = np.zeros((ROWS_PER_PASS, width), np.int32)
        at = np.zeros((ROWS_PER_PASS, made), np.int32)
        for i, index in enumerate(chunk):
            tokens[i, :len(rows[index])] = rows[index]
            at[i] = np.minimum(len(prompts[index]) + np.arange(made), width - 2)
        nexts = np.take_along_axis(tokens, at + 1, axis=1)
        chances, p, rank, seconds = acceptance(params, jnp.asarray(tokens), jnp.asarray(at),
                                               jnp.asarray(nexts), vocab, sampling)
        for i, index in enumerate(chunk):
            made_here = max(len(continuations[index]) - 1, 0)
            accept.append(np.asarray(chances)[:, i, :made_here])
            if p is not None:
                target.append(np.asarray(p)[i, :made_here])
            if rank is not None:
                ranks.append(np.asarray(rank)[:, i, :made_here])
            if seconds is not None:
                second.append(np.asarray(seconds)[:, i, :made_here])
    return dataclasses.replace(texts, accept=tuple(accept), sampling=sampling,
                               target=tuple(target), ranks=tuple(ranks),
                               second_child=tuple(second))


def _exit_acceptance(cfg: ModelConfig) -> Callable:
    """A jitted (params, tokens [B, T], at [B, M], nexts [B, M], vocab, sampling) ->
    ([L, B, M], p, ranks, second): the probability that each exit's draft at position `at`
    (over `vocab`'s ids) is accepted when the text's next token is `nexts`: greedy whether
    its argmax is that token, sampled min(1, q / p) there, q the exit's distribution and p
    the last layer's (the module docstring); sampled, p [B, M] (None when greedy); greedy,
    the rank [L, B, M] of `nexts` among each exit's drafts (None when sampled); sampled,
    the chance [L, B, M] that a second child drawn without replacement is the one accepted
    (`second_child_chance`; None when greedy)."""

    @jax.jit
    def acceptance(params: Params, tokens: jax.Array, at: jax.Array, nexts: jax.Array,
                   vocab: DraftVocab | None, sampling: SamplingParams | None) -> jax.Array:
        per_layer = run_layers(params, cfg, embed(params, cfg, tokens))  # [L, B, T, D]
        hidden = jnp.take_along_axis(per_layer, at[None, :, :, None], axis=2)
        if sampling is None:
            ranks = jax.lax.map(lambda h: _rank_of(exit_head_logits(params, cfg, h, vocab),
                                                   nexts), hidden)
            return (ranks == 0).astype(jnp.float32), None, ranks, None
        p = probabilities(exit_head_logits(params, cfg, hidden[-1], None), sampling)
        target = jnp.take_along_axis(p, nexts[..., None], axis=-1)[..., 0]
        chances = jax.lax.map(lambda h: _child_chances(
            p, probabilities(exit_head_logits(params, cfg, h, vocab), sampling), nexts), hidden)
        return chances[0], target, None, chances[1]

    return acceptance


def _child_chances(p: jax.Array, q: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Given the emitted tokens y [...] and the target's and the draft's distributions p, q
    [..., V] there: the chance that a node's first child (drawn from q) is the one accepted,
    min(1, q(y) / p(y)), and that its second, drawn without replacement, is (the module
    docstring). The text was drawn from p, so p(y) > 0 but for rounding at a filter's edge,
    where the verification, which reads p as this pass does, rejects every child."""
    p_y = jnp.take_along_axis(p, y[..., None], axis=-1)
    q_y = jnp.take_along_axis(q, y[..., None], axis=-1)
    left_y = jnp.take_along_axis(residual(p, q), y[..., None], axis=-1)
    # Over the first child's token x (x = y adds nothing: q(y) > p(y) leaves p'(y) = 0); a
    # first child that took all of q leaves no second child.
    rest = 1.0 - q
    second = jnp.sum(jnp.where(rest > 0, jnp.maximum(q - p, 0.0) * jnp.minimum(
        left_y, q_y / rest), 0.0), axis=-1)
    safe = jnp.where(p_y > 0, p_y, 1.0)[..., 0]
    first = jnp.where(p_y[..., 0] > 0, jnp.minimum(1.0, q_y[..., 0] / safe), 0.0)
    return first, jnp.where(p_y[..., 0] > 0, second / safe, 0.0)


def _rank_of(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """The place [...] of each token [...] in its logits' [..., V] order as greedy drafting
    takes it (`lax.top_k`, an argmax: larger first, a tie to the smaller id): 0 for the
    argmax."""
    own = jnp.take_along_axis(logits, tokens[..., None], -1)
    ids = jnp.arange(logits.shape[-1])
    before = (logits > own) | ((logits == own) & (ids < tokens[..., None]))
    return jnp.sum(before, axis=-1, dtype=jnp.int32)


@dataclasses.dataclass(frozen=True)
class LoopCalibration:
    """The real decode loop, timed on the first `prompts` prompts: `ar`'s seconds per decoded
    token and per prompt's prefill (with its first token), and the line from the pieces'
    seconds per round to the loop's: `scale` x pieces + `overhead`. `points` holds the
    measurements the line comes from: (K, measured seconds per round, the pieces' round,
    measured tau), at exit `exit_layer`."""

    token_seconds: float
    prefill_seconds: float
    scale: float
    overhead: float
    exit_layer: int
    points: tuple[tuple[int, float, float, float], ...]
    prompts: int = 1

    def round_seconds(self, pieces: float) -> float:
        """A round's seconds in the real loop from the pieces' `pieces`."""
        return self.scale * pieces + self.overhead

    def end_to_end(self, decode_speedup: float, prompts: int, decoded: int) -> float:
        """The whole call's speed-up (prefill included, as the benchmark reports it) on
        `prompts` prompts with `decoded` tokens after their first, when decoding alone is
        `decode_speedup` times faster than `ar`'s."""
        prefill, decode = prompts * self.prefill_seconds, decoded * self.token_seconds
        return (prefill + decode) / (prefill + decode / decode_speedup)


def fit_round(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(scale, overhead) of the line through (pieces' round, measured round) points, the
    smallest and the largest round. A line that does not rise (the machine's noise, or one
    point) becomes the ratio through the origin of the points' sums, so that a costlier round
    in the pieces is never cheaper in the loop."""
    (low, measured_low), (high, measured_high) = min(points), max(points)
    scale = (measured_high - measured_low) / (high - low) if high > low else 0.0
    if scale <= 0:
        return sum(m for _, m in points) / sum(p for p, _ in points), 0.0
    return scale, measured_low - scale * low


def calibrate_loop(generator: Generator, selfspec: Callable[[int, int], Drafter],
                   prompts: Sequence[Sequence[int]], pieces: Callable[[int, int], float], *,
                   max_new_tokens: int, exit_layer: int, num_draft: Sequence[int],
                   repeats: int = 3, sampling: SamplingParams | None = None) -> LoopCalibration:
    """Benchmarks `ar` and `selfspec(exit_layer, K)` for the smallest and largest K of
    `num_draft` on `prompts` (`tools.bench.run_benchmark`, batch 1; greedy, or sampled with
    `sampling`: a sampled round also pays for its probabilities and draws) and fits the line
    from `pieces(exit_layer, K)`, the pieces' seconds per round, to the loop's."""
    chains = sorted({min(num_draft), max(num_draft)})
    results = {r.name: r for r in run_benchmark(
        generator, {"ar": AUTOREGRESSIVE, **{f"K={k}": selfspec(exit_layer, k) for k in chains}},
        prompts, max_new_tokens=max_new_tokens, repeats=repeats, sampling=sampling)}
    ar = results["ar"]
    measured = [(k, _per_round(results[f"K={k}"]), pieces(exit_layer, k),
                 results[f"K={k}"].stats.tau) for k in chains]
    scale, overhead = fit_round([(pieces, real) for _, real, pieces, _ in measured])
    return LoopCalibration(_per_round(ar), ar.prefill_seconds / len(prompts), scale,
                           overhead, exit_layer, tuple(measured), len(prompts))


def _per_round(result: StrategyResult) -> float:
    """Decoding seconds (the call's, less its one-token prefill call's) per round."""
    if not result.stats.rounds or result.seconds <= result.prefill_seconds:
        raise ValueError(f"{result.name}: the run is too short to time its rounds apart from "
                         "the prefill (raise max_new_tokens)")
    return (result.seconds - result.prefill_seconds) / result.stats.rounds


def model_continuations(generator: Generator, prompts: Sequence[Sequence[int]], *,
                        max_new_tokens: int, sampling: SamplingParams | None = None,
                        seed: int = 0) -> list[list[int]]:
    """The model's own continuation of each prompt, greedy (what every lossless strategy
    outputs) or sampled with `sampling` and `seed` (distributed as every lossless strategy's
    output)."""
    return generator.generate(prompts, max_new_tokens=max_new_tokens, strategy=AUTOREGRESSIVE,
                              sampling=sampling, seed=seed).tokens


def text_runs(prompts: Sequence[Sequence[int]],
              continuations: Sequence[Sequence[int]]) -> ExitRuns:
    """`ExitRuns` holding only the texts (each prompt and its continuation) and the prompts'
    lengths, no exit's acceptance: what a drafter that copies from the text is played over."""
    if len(prompts) != len(continuations):
        raise ValueError(f"{len(prompts)} prompts but {len(continuations)} continuations")
    return ExitRuns((), tuple(tuple(p) + tuple(c) for p, c in zip(prompts, continuations,
                                                                   strict=True)),
                    tuple(len(p) for p in prompts))
