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

A drafter whose draft at a position depends on the text before it alone (`plays_forced`:
Kangaroo's adapter, a draft model) is played as an exit is, over runs of its own drafts from
one teacher-forced pass (`exit_runs` with the drafter, `ForcedPlays`). The real loop's costs
come from `loop_calibration`, and the drafters that copy from the text are played over the
same runs by `copied_play`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

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
from specjax.tools.layer_costs import LayerCosts, measure_costs

# Windows of the teacher-forced pass over prompts + continuations: one compile per bucket.
ROWS_PER_PASS = 4
# Sampled continuations of each prompt a sampled workload is played over: one sample's tau
# spread from 1.36 to 1.90 across seeds on the default model (4 prompts x 64 tokens).
SAMPLED_PLAYS = 4


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


def exit_runs(params: Params, cfg: ModelConfig, prompts: Sequence[Sequence[int]],
              continuations: Sequence[Sequence[int]],
              draft_ids: jax.Array | np.ndarray | None = None,
              sampling: SamplingParams | None = None,
              drafter: tuple[Drafter, Any] | None = None) -> ExitRuns:
    """`ExitRuns` of the prompts' continuations: one teacher-forced pass through every exit,
    each exit's drafts over `draft_ids` (ascending; None: the whole vocabulary), greedy or
    drawn with `sampling` (the continuations then drawn with it too). With `drafter` (a
    drafter that `plays_forced`, bound to its weights, and their params), its drafts in place
    of the exits': the runs' one row (exit 1 in `ExitRuns`' methods) is the drafter's."""
    texts = text_runs(prompts, continuations)
    if drafter is not None and not drafter[0].plays_forced:
        raise ValueError(f"strategy {drafter[0].name!r} drafts from where its round starts: "
                         "its rounds cannot be played from one teacher-forced pass")
    vocab = None if draft_ids is None else DraftVocab.gather(
        params, cfg, jnp.asarray(draft_ids, jnp.int32))
    rows = texts.texts
    width = bucket(max(len(row) for row in rows))
    # Position t predicts token t + 1: rounds make each continuation's tokens 1..n-1.
    made = bucket(max(max(len(c) - 1 for c in continuations), 1))
    acceptance = _exit_acceptance(cfg, None if drafter is None else drafter[0])
    own = None if drafter is None else drafter[1]
    accept, target, ranks, second = [], [], [], []
    for start in range(0, len(rows), ROWS_PER_PASS):
        chunk = range(start, min(start + ROWS_PER_PASS, len(rows)))
        tokens = np.zeros((ROWS_PER_PASS, width), np.int32)
        at = np.zeros((ROWS_PER_PASS, made), np.int32)
        for i, index in enumerate(chunk):
            tokens[i, :len(rows[index])] = rows[index]
            at[i] = np.minimum(len(prompts[index]) + np.arange(made), width - 2)
        nexts = np.take_along_axis(tokens, at + 1, axis=1)
        chances, p, rank, seconds = acceptance(params, own, jnp.asarray(tokens),
                                               jnp.asarray(at), jnp.asarray(nexts), vocab,
                                               sampling)
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


class ForcedPlays:
    """Drafters that `plays_forced` played over a workload's continuations (`exit_runs` with
    the drafter): the runs of each, in the workload's mode and over the drafter's draft
    vocabulary, from one teacher-forced pass per drafter (its shape, which does not change
    its drafts, aside: a tuner's chains and trees share it); and a draft model's own pieces
    (`draft_costs`), which price its rounds."""

    def __init__(self, generator: Generator, params: Params):
        self.generator, self.params = generator, params  # params stacked (`run_layers`)
        self._played: dict[tuple[Drafter, int], tuple[ExitRuns, ExitRuns]] = {}
        self._costs: dict[ModelConfig, tuple[LayerCosts, SamplingParams | None,
                                             LayerCosts]] = {}

    def draft_costs(self, drafter: Drafter, like: LayerCosts,
                    sampling: SamplingParams | None) -> tuple[LayerCosts, tuple[str, ...]]:
        """A draft model's own pieces (`layer_costs.measure_costs` on its weights) at the
        sizes and context of `like` (the target's), its head's distribution with `sampling`
        as a sampled round draws it, timed once per draft model and mode; and its layers'
        kinds."""
        bound, params = self.generator.with_weights(drafter, None)
        found = self._costs.get(bound.cfg)
        if found is None or found[0] is not like or found[1] is not sampling:
            found = self._costs[bound.cfg] = like, sampling, measure_costs(
                params, bound.cfg, like.head, context=like.context, sampling=sampling)
        return found[2], bound.cfg.layer_kinds

    def __call__(self, drafter: Drafter, runs: ExitRuns) -> ExitRuns:
        key = dataclasses.replace(drafter, shape=None), id(runs)
        if key not in self._played or self._played[key][0] is not runs:
            lengths = runs.prompt_lengths
            self._played[key] = runs, exit_runs(
                self.params, self.generator.cfg,
                [text[:n] for text, n in zip(runs.texts, lengths, strict=True)],
                [text[n:] for text, n in zip(runs.texts, lengths, strict=True)],
                self.generator.draft_ids(drafter), runs.sampling,
                self.generator.with_weights(drafter, None))
        return self._played[key][1]


def _exit_acceptance(cfg: ModelConfig, drafter: Drafter | None) -> Callable:
    """A jitted (params, draft params, tokens [B, T], at [B, M], nexts [B, M], vocab,
    sampling) -> ([R, B, M], p, ranks, second): the probability that each exit's draft
    (R = L rows; with `drafter`, its own draft: one row) at position `at` (over `vocab`'s
    ids) is accepted when the text's next token is `nexts`: greedy whether its argmax is that
    token, sampled min(1, q / p) there, q the draft's distribution and p the last layer's
    (the module docstring); sampled, p [B, M] (None when greedy); greedy, the rank [R, B, M]
    of `nexts` among each row's drafts (None when sampled); sampled, the chance [R, B, M]
    that a second child drawn without replacement is the one accepted (`_child_chances`;
    None when greedy)."""

    @jax.jit
    def acceptance(params: Params, draft_params: Any, tokens: jax.Array, at: jax.Array,
                   nexts: jax.Array, vocab: DraftVocab | None,
                   sampling: SamplingParams | None) -> tuple:
        per_layer = run_layers(params, cfg, embed(params, cfg, tokens))  # [L, B, T, D]
        hidden = jnp.take_along_axis(per_layer, at[None, :, :, None], axis=2)
        p = None if sampling is None else probabilities(
            exit_head_logits(params, cfg, hidden[-1], None), sampling)

        def chances(logits: jax.Array) -> tuple:
            if sampling is None:
                ranks = _rank_of(logits, nexts)
                return (ranks == 0).astype(jnp.float32), ranks, None
            first, second = _child_chances(p, probabilities(logits, sampling), nexts)
            return first, None, second

        if drafter is None:
            first, ranks, second = jax.lax.map(
                lambda h: chances(exit_head_logits(params, cfg, h, vocab)), hidden)
        else:
            ctx = DraftContext(params, draft_params, sampling, cfg, vocab)
            first, ranks, second = jax.tree.map(lambda x: x[None], chances(
                drafter.forced_logits(ctx, tokens, per_layer, at)))
        target = None if p is None else jnp.take_along_axis(p, nexts[..., None], -1)[..., 0]
        return first, target, ranks, second

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
    # Over the first child's token x (x = y adds nothing: q(y) > p(y) leaves p'(y) = 0). What
    # x leaves of q is summed, as the loop renormalises, for the one token that may hold more
    # than half of it: 1 - q(x) rounds to 0 in float32 where q(x) is within 6e-8 of 1, and
    # the loop still draws and tries a second child there. A first child that took all of q
    # leaves none.
    top = q > 0.5
    rest = jnp.where(top, jnp.sum(jnp.where(top, 0.0, q), axis=-1, keepdims=True), 1.0 - q)
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
