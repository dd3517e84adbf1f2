"""The exit report on a workload (exit_report.on_workload; specjax/tools/exit_workload.py,
copied_play.py, loop_calibration.py): rounds played over the exits' and the copying drafters'
acceptance against the real decode loop's (greedy exactly, sampled in expectation), the
loop's calibration and the calibrated prediction by hand, the command line end to end."""

import dataclasses
import itertools
import json
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax.tools.copied_play as copied_play_module
import specjax.tools.exit_workload as exit_workload_module
from specjax import model as M
from specjax.config import ModelConfig, SsmConfig
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.decoding.drafters.ngram import PromptLookup
from specjax.decoding.drafters.suffix import SuffixDecoding
from specjax.decoding.engine import Generator
from specjax.decoding.sampling import SamplingParams, probabilities
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.tools.copied_play import copied_acceptance, copied_rounds, play_copied
from specjax.tools.exit_report import DraftExitReport, on_workload
from specjax.tools.exit_workload import (
    ExitRuns,
    exit_runs,
    expected_rounds,
    expected_rounds_from,
    model_continuations,
    tree_rounds,
)
from specjax.tools.layer_costs import LayerCosts
from specjax.tools.loop_calibration import LoopCalibration, fit_round
from specjax.training.evaluate import ExitReport
from tests.support.models import TINY_MODEL, damped_params
from tests.support.scripts import run_script

CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})
PROMPTS = [[1, 2, 3, 4, 5], [7], list(range(40, 59))]
# Prompts whose text repeats, so that copied drafts are accepted.
COPYING_PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 9, 9, 9], [1, 2, 3, 4, 1, 2, 3]]
NEW = 24
COSTS = LayerCosts(layer={"attention": {n: 2.0 + 0.25 * (n - 1) for n in range(1, 10)}},
                   head={n: 0.5 + 0.1 * (n - 1) for n in range(1, 10)})
METRICS = ExitReport(loss=(3.0, 2.5, 2.2, 2.0), accuracy=(0.1, 0.2, 0.3, 0.4),
                     agreement=(0.3, 0.5, 0.7, 1.0), tokens=100)


@pytest.mark.parametrize("num_draft, rounds", [(1, 6), (2, 4), (8, 3)])
def test_greedy_rounds_by_hand(num_draft, rounds):
    """Positions 0..8 agreeing as 1 1 0 1 1 1 1 0 0: with K=2 the rounds accept 2 (0, 1) and
    make 2, accept 2 (3, 4) and make 5, accept 1 (6) and make 7, make 8: 4 rounds; K=8 takes
    3, K=1 takes 6. Catches the run not capped at K, the round's own token not counted (the
    next round starting on it), and a run that goes on past a disagreement."""
    agree = np.array([1, 1, 0, 1, 1, 1, 1, 0, 0], bool)
    assert expected_rounds(agree, num_draft) == rounds
    runs = ExitRuns((np.stack([agree, np.ones(9, bool)]),))
    assert runs.tau(1, num_draft) == pytest.approx(9 / rounds)
    assert runs.tau(2, 3) == pytest.approx(9 / 3)  # all agree: K+1 tokens a round
    assert runs.rate(1) == pytest.approx(6 / 9)


def _simulated_rounds(accepted: np.ndarray, num_draft: int) -> int:
    """Rounds of a chain over positions whose drafts are accepted or not (`accepted`, one
    outcome), walked round by round as the loop takes them."""
    rounds = position = 0
    while position < len(accepted):
        taken = 0
        while taken < num_draft and position + taken < len(accepted) and accepted[
                position + taken]:
            taken += 1
        position += taken + 1
        rounds += 1
    return rounds


@pytest.mark.parametrize("num_draft", [1, 2, 3])
def test_expected_rounds_is_the_mean_over_every_acceptance_outcome(num_draft):
    """Sampled acceptance probabilities at 7 positions (0 and 1 among them): the expected
    rounds are the mean, weighted by each outcome's probability, of the rounds a walk over
    every one of the 2^7 outcomes takes (an independent reference); and a row of them, per
    exit, is computed exit by exit. Catches the round's chance of stopping at a draft not
    weighed by the drafts before it, a round taking K + 1 drafts, the bonus position reached
    after K acceptances dropped, and the exits' rows mixed."""
    accept = np.array([0.9, 0.35, 1.0, 0.0, 0.7, 0.55, 0.8])
    expected = 0.0
    for outcome in itertools.product([False, True], repeat=len(accept)):
        chosen = np.array(outcome)
        weight = np.prod(np.where(chosen, accept, 1 - accept))
        expected += weight * _simulated_rounds(chosen, num_draft)
    assert expected_rounds(accept, num_draft) == pytest.approx(expected, rel=1e-12)
    rows = np.stack([accept, accept[::-1], np.ones(7)])
    np.testing.assert_allclose(expected_rounds(rows, num_draft), [
        expected, expected_rounds(accept[::-1], num_draft), np.ceil(7 / (num_draft + 1))])


def test_start_dependent_rounds_are_the_mean_over_every_outcome():
    """Drafts whose chances depend on where their round starts (a copying drafter's: [n=4
    starts, K=2 drafts]): the expected rounds are the probability-weighted mean, over every
    one of the 2^8 outcomes of the starts' coins, of the rounds a walk takes when a round
    from t reads t's own coins (an independent reference). Catches a round reading the
    chances of the start it reaches instead of its own (the positional walk), and a chance
    counted past the last position."""
    accept = np.array([[0.9, 0.4], [0.2, 0.7], [0.6, 1.0], [0.8, 0.5]])
    n, num_draft = accept.shape
    expected = 0.0
    for outcome in itertools.product([False, True], repeat=accept.size):
        coins = np.array(outcome).reshape(accept.shape)
        weight = np.prod(np.where(coins, accept, 1 - accept))
        rounds = position = 0
        while position < n:
            taken = 0
            while taken < num_draft and position + taken < n and coins[position, taken]:
                taken += 1
            position += taken + 1
            rounds += 1
        expected += weight * rounds
    masked = accept * (np.arange(n)[:, None] + np.arange(num_draft)[None, :] < n)
    assert expected_rounds_from(masked) == pytest.approx(expected, rel=1e-12)
    positional = np.array([0.9, 0.2, 0.6, 0.8])
    windows = np.array([[0.9, 0.2], [0.2, 0.6], [0.6, 0.8], [0.8, 0.0]])
    assert expected_rounds_from(windows) == pytest.approx(expected_rounds(positional, 2))


@pytest.fixture(scope="module")
def model():
    """The params, a generator whose ranking puts the continuations' ids first (by count),
    the continuations, and a draft vocabulary size that leaves 3 of their ids out."""
    params = damped_params(CFG, jax.random.PRNGKey(0), 0.5)
    continuations = model_continuations(Generator(params, CFG), PROMPTS, max_new_tokens=NEW)
    counts = np.bincount(np.concatenate(continuations), minlength=CFG.vocab_size)
    ranking = np.argsort(-counts, kind="stable")
    generator = Generator(params, CFG, draft_vocab=ranking)
    return params, generator, continuations, ranking, int((counts > 0).sum()) - 3


@pytest.mark.parametrize("subset", [False, True])
def test_played_rounds_are_the_real_loops_rounds(model, subset):
    """For exits 1 and 2 and K = 1 and 3, over the whole vocabulary and over N ids: the rounds
    played over the exits' agreement (one teacher-forced pass) equal the rounds the real
    greedy selfspec loop takes on the same prompts, row by row, an independent reference.
    Catches an exit read from its neighbour's row, the agreement read one position off (or
    including the prefill's token), and a played draft over the whole vocabulary where the
    drafter drafts over the subset."""
    params, generator, continuations, ranking, size = model
    draft_vocab = size if subset else 0
    ids = np.sort(ranking[:draft_vocab]) if subset else None
    runs = exit_runs(params, CFG, PROMPTS, continuations, ids)
    assert [row.shape for row in runs.accept] == [(4, len(c) - 1) for c in continuations]
    played_all, real_all = [], []
    for exit_layer in (1, 2):
        for num_draft in (1, 3):
            drafter = SelfSpeculative(exit_layer, Chain(num_draft), draft_vocab=draft_vocab)
            out = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=drafter)
            assert out.tokens == continuations  # lossless, so the continuations are shared
            real = [stats.rounds for stats in out.stats]
            played = [expected_rounds(row[exit_layer - 1], num_draft) for row in runs.accept]
            assert played == real, (exit_layer, num_draft)
            played_all.append(played)
            real_all.append(real)
    assert len({tuple(p) for p in played_all}) > 2  # exits and K change the rounds: teeth
    assert 0 < runs.rate(1) < runs.rate(3) <= 1


def test_a_tree_round_follows_the_texts_ranks_down_the_tree():
    """Rounds of hand-walked trees over given ranks (an independent reference): 2,1 over
    ranks [1, 0, 3, 0, 1, 0] takes 3 rounds (accepting nodes 1 and 3; node 0; node 0),
    an irregular tree only where its node has that many children, and a chain's parents
    give `expected_rounds` over rank 0. Catches a child picked by rank at the wrong depth,
    a rank read from the round's start at every depth, and children counted over the
    whole level instead of the node's own."""
    two_one = StaticTree.from_branching((2, 1))  # parents -1, -1, 0, 1
    assert _rounds_by_rank([1, 0, 3, 0, 1, 0], two_one) == 3
    assert _rounds_by_rank([0, 0, 0], two_one) == 1
    assert _rounds_by_rank([2, 0, 0], two_one) == 2  # no third child: rounds at 0, 1
    # Node 0 (rank 0) has two children, node 1 (rank 1) none: rank 1 below node 0 only.
    irregular = StaticTree.from_parents((-1, -1, 0, 0))
    assert _rounds_by_rank([0, 1, 5], irregular) == 1  # nodes 0 and 3
    assert _rounds_by_rank([1, 1, 5], irregular) == 2  # node 1 is a leaf
    ranks = np.random.default_rng(0).integers(0, 3, 200)
    for num_draft in (1, 3, 5):
        chain = StaticTree.from_parents([-1, *range(num_draft - 1)])
        assert _rounds_by_rank(ranks, chain) == expected_rounds(ranks == 0, num_draft)


def _rounds_by_rank(ranks: Sequence[int], tree: StaticTree) -> float:
    """`tree_rounds` over texts whose tokens have `ranks` among the drafter's (greedy: the
    child of that sibling index is accepted, none past the node's children)."""
    ranks = np.asarray(ranks)
    return tree_rounds((ranks[:, None] == np.arange(tree.max_children)).astype(float), tree)


def _walked_rounds(accepted: Sequence[int], tree: StaticTree) -> int:
    """The rounds the loop takes when the child of sibling index `accepted[t]` is the one
    accepted at position t (none past a node's children), walked round by round down the
    tree's children lists: an independent reference for `tree_rounds`."""
    rounds, start = 0, 0
    while start < len(accepted):
        position, taken = 0, 0  # 0: the pending token
        while start + taken < len(accepted):
            children = tree.child_lists[position]
            if accepted[start + taken] >= len(children):
                break
            position, taken = children[accepted[start + taken]], taken + 1
        rounds, start = rounds + 1, start + taken + 1
    return rounds


def test_a_rank_breaks_ties_as_the_drafters_top_tokens_do():
    """Tied logits: each id's rank is its place in `lax.top_k`'s order (a tie to the smaller
    id), the order a static tree's children take. Catches ties sent to the larger id, or not
    broken at all (two ids of rank 0)."""
    logits = jnp.array([[1.0, 3.0, 3.0, 0.0, 3.0]] * 5)
    ranks = np.asarray(exit_workload_module._rank_of(logits, jnp.arange(5))).tolist()
    order = np.asarray(jax.lax.top_k(logits[0], 5)[1]).tolist()
    assert ranks == [order.index(token) for token in range(5)] == [3, 0, 1, 4, 2]


def test_a_trees_tau_and_speed_up_by_hand():
    """Ranks [1, 0, 3, 0, 1, 0] at exit 2 and all 0 at exit 1, the tree 2,1: tau 6 / 3 and
    6 / 2; the speed-up is tau x the plain pass over the tree's round by hand (drafts on 1
    and 2 nodes, 2 leaves, 2 deep layers and the head on 5 tokens), and a chain's parents
    give the chain's. Catches the neighbouring exit's ranks, rounds counted one too many,
    and a tree priced as a chain of its N nodes."""
    ranks = np.array([[0] * 6, [1, 0, 3, 0, 1, 0], [0] * 6, [0] * 6])
    runs = ExitRuns((ranks == 0,), ranks=(ranks,))
    two_one = StaticTree.from_parents((-1, -1, 0, 1))
    assert runs.tree_tau(2, two_one) == pytest.approx(6 / 3)
    assert runs.tree_tau(1, two_one) == pytest.approx(6 / 2)
    report = DraftExitReport(METRICS, COSTS, CFG.layer_kinds, num_draft=(3,), runs=runs)
    attention, head = COSTS.layer["attention"], COSTS.head
    tree_round = (2 * attention[1] + head[1] + 2 * attention[2] + head[2] + 2 * attention[2]
                  + 2 * attention[5] + head[5])
    assert report.tree_speedup(2, two_one) == pytest.approx(
        2.0 * (4 * attention[1] + head[1]) / tree_round)
    chain = StaticTree.from_parents((-1, 0, 1))
    assert report.tree_speedup(2, chain) == pytest.approx(report.speedup(2, 3))


def test_sampled_runs_play_trees_of_two_children_drawn_without_replacement():
    """Sampled chances of the first child (0.5, 1, 0.2) and the second (0.3, 0, 0.4) at three
    positions, a root with two leaf children: a round from t takes 2 tokens with chance
    0.8, 1 and 0.6, so 2 rounds are expected (from 0: 1 + 0.8 x 1 + 0.2 x 1) and tau is
    3 / 2; a third child, children drawn i.i.d. or greedy runs without ranks are not
    played, in one line, nor are sampled runs without second-child chances. Catches the
    second child's chance left out, and a tree played sampled with a rule its chances do
    not describe or without the chances."""
    sampling = SamplingParams(temperature=1.0, top_k=0, top_p=1.0)
    runs = ExitRuns((np.array([[0.5, 1.0, 0.2]]),), sampling=sampling,
                    second_child=(np.array([[0.3, 0.0, 0.4]]),))
    two = StaticTree.from_branching((2,))
    assert runs.plays_tree(two) and runs.tree_tau(1, two) == pytest.approx(3 / 2)
    for tree, unplayable in ((StaticTree.from_branching((3,)), runs),
                             (StaticTree.from_branching((2,), children="iid"), runs),
                             (two, ExitRuns((np.ones((1, 3)),))),
                             (two, ExitRuns((np.ones((1, 3)),), sampling=sampling))):
        assert not unplayable.plays_tree(tree)
        with pytest.raises(ValueError, match="cannot be played over these runs"):
            unplayable.tree_tau(1, tree)


def test_a_trees_chances_are_read_at_its_exit_and_every_child_counts():
    """Sampled, two exits' chances (exit 1: the first test's; exit 2: first child 0.2, 0.5,
    0.5, second 0.6, 0.1, 0): a root with two leaf children plays 3 / 2.08 tokens a round at
    exit 2 (from 0: 1 + 0.8 x 1 + 0.2 x 1.4) and 3 / 2 at exit 1; the report prices it as
    the greedy trees, and a chain's parents as the chain. Greedy, a node's third child
    counts: ranks 2, 0, 1, 0 under a root of three take 2 rounds. Catches the second child
    read from the neighbouring exit, the children's width capped at two, and a sampled
    run's tree refused by the report."""
    sampling = SamplingParams(temperature=1.0, top_k=0, top_p=1.0)
    accept = np.array([[0.5, 1.0, 0.2], [0.2, 0.5, 0.5], [0.9] * 3, [0.9] * 3])
    second = np.array([[0.3, 0.0, 0.4], [0.6, 0.1, 0.0], [0.05] * 3, [0.05] * 3])
    runs = ExitRuns((accept,), sampling=sampling, second_child=(second,))
    two = StaticTree.from_branching((2,))
    assert runs.tree_tau(2, two) == pytest.approx(3 / 2.08)
    assert runs.tree_tau(1, two) == pytest.approx(3 / 2)
    report = DraftExitReport(METRICS, COSTS, CFG.layer_kinds, num_draft=(3,), runs=runs)
    attention, head = COSTS.layer["attention"], COSTS.head
    round_seconds = 2 * attention[1] + head[1] + 2 * attention[2] + 2 * attention[3] + head[3]
    assert report.tree_speedup(2, two) == pytest.approx(
        (3 / 2.08) * (4 * attention[1] + head[1]) / round_seconds)
    assert report.tree_speedup(2, StaticTree.from_parents((-1, 0, 1))) == pytest.approx(
        report.speedup(2, 3))
    ranks = np.array([[2, 0, 1, 0]])
    greedy = ExitRuns((ranks == 0,), ranks=(ranks,))
    assert greedy.tree_tau(1, StaticTree.from_branching((3,))) == pytest.approx(4 / 2)


def test_a_draft_that_is_one_token_leaves_no_second_child():
    """A draft distribution on one token (top-k 1, or top-p at a confident exit) draws no
    second child (`StaticTree.draft` drops a draw outside q): its second child's chance is 0
    for every y, and its first child's 1 at its token. Catches the renormalisation
    1 - q(x) dividing by zero there (NaN chances, a NaN tau)."""
    p = jnp.array([0.1, 0.3, 0.2, 0.2, 0.1, 0.1])
    q = jnp.array([0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    first, second = (np.asarray(c) for c in exit_workload_module._child_chances(
        jnp.broadcast_to(p, (6, 6)), jnp.broadcast_to(q, (6, 6)), jnp.arange(6)))
    np.testing.assert_array_equal(first, [0, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(second, np.zeros(6))


def test_played_tree_rounds_are_the_real_loops_rounds(model):
    """Greedy selfspec with static trees, 2,2,1,1 at exit 1 over the whole vocabulary and an
    irregular one at exit 2 over N ids: the rounds played over the exits' ranks equal the
    rounds the real loop takes, row by row (an independent reference). Catches ranks read
    over the whole vocabulary where the drafter drafts over the subset, the ranks of the
    neighbouring exit, and siblings taken in another order than the drafter's top tokens."""
    params, generator, continuations, ranking, size = model
    played_all = []
    for exit_layer, tree, draft_vocab in (
            (1, StaticTree.from_branching((2, 2, 1, 1)), 0),
            (2, StaticTree.from_parents([-1, -1, -1, 0, 0, 1, 3]), size)):
        ids = np.sort(ranking[:draft_vocab]) if draft_vocab else None
        runs = exit_runs(params, CFG, PROMPTS, continuations, ids)
        drafter = SelfSpeculative(exit_layer, tree, draft_vocab=draft_vocab)
        out = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=drafter)
        assert out.tokens == continuations
        played = [_rounds_by_rank(row[exit_layer - 1], tree) for row in runs.ranks]
        assert played == [stats.rounds for stats in out.stats], (exit_layer, tree)
        chain = [expected_rounds(row[exit_layer - 1] == 0, 1) for row in runs.ranks]
        assert played != chain  # the tree accepts beyond the argmax: teeth
        played_all.append(played)
    assert played_all[0] != played_all[1]


def test_expected_tree_rounds_are_the_mean_over_every_outcome():
    """Chances that the first or the second child is accepted at 6 positions (0 and 1 among
    them), an irregular tree (the first child has two children, one of which has a child;
    the second is a leaf): the expected rounds are the mean, weighted by each outcome's
    probability, of the rounds a walk down the tree over every one of the 3^6 outcomes
    (first, second or no child accepted at each position) takes (`_walked_rounds`), an
    independent reference; a chain's parents give `expected_rounds` over the first child's
    chances. Catches a node's stop chance counting children it does not have, the chances
    read at the round's start at every depth, and a round's reach not multiplied down the
    path."""
    siblings = np.array([[0.5, 0.3], [0.2, 0.7], [1.0, 0.0], [0.0, 0.0], [0.6, 0.25],
                         [0.1, 0.85]])
    tree = StaticTree.from_parents((-1, -1, 0, 0, 2))  # nodes 2, 3 below 0; 4 below 2
    expected = 0.0
    for outcome in itertools.product(range(3), repeat=len(siblings)):
        chance = np.append(siblings, 1 - siblings.sum(axis=1, keepdims=True), axis=1)
        weight = np.prod(chance[np.arange(len(siblings)), outcome])
        expected += weight * _walked_rounds(outcome, tree)  # 2: no child accepted
    assert tree_rounds(siblings, tree) == pytest.approx(expected, rel=1e-12)
    for num_draft in (1, 3):
        chain = StaticTree.from_parents([-1, *range(num_draft - 1)])
        assert tree_rounds(siblings[:, :1], chain) == pytest.approx(
            expected_rounds(siblings[:, 0], num_draft), rel=1e-12)


@pytest.mark.parametrize("draft_logits", [[*np.log([0.5, 0.2, 0.15, 0.1, 0.05]), -np.inf],
                                          [40.0, 0.0, 0.0, 0.0, 0.0, 0.0]],
                         ids=["spread", "near_one"])
def test_a_second_childs_chance_is_the_real_acceptances(draft_logits):
    """Given the emitted token y, the chance that a node's first or second child (drawn
    without replacement from q by the loop's own `draw_children`) is the one the loop's
    `acceptance.accept` takes, measured over 400,000 rows, equals `_child_chances`' (within
    4.5 standard errors), an independent reference; q spread (one id at 0), and q on one
    id but for 4e-18 on each other (1 - q rounds to 0 in float32, yet the loop draws a
    second child and accepts it 60% of the time given y = 1). Catches the second child's
    q not renormalised after the first's token is removed, its p not the first rejection's
    residual, the chances not divided by p(y), and the renormalisation read as 1 - q(x)."""
    from specjax.decoding.acceptance import accept
    from specjax.decoding.proposal import Proposal
    from specjax.decoding.sampling import draw_children

    p = jnp.array([0.1, 0.3, 0.2, 0.2, 0.1, 0.1])
    q = jax.nn.softmax(jnp.asarray(draft_logits, jnp.float32))
    rows, sampling = 400_000, SamplingParams(temperature=1.0, top_k=0, top_p=1.0)
    tree = StaticTree.from_branching((2,))
    key_draw, key_accept = jax.random.split(jax.random.PRNGKey(0))
    tokens, probs = draw_children(key_draw, jnp.broadcast_to(jnp.log(q), (rows, 6)), sampling,
                                  2, "without_replacement")
    node_q = jnp.broadcast_to(probs[:, None], (rows, 2, 6))
    proposal = Proposal(tokens=tokens, parents=jnp.full((rows, 2), -1, jnp.int32),
                        valid=jnp.take_along_axis(probs, tokens, axis=1) > 0, q=node_q,
                        reuse=None, stats={}, shape=tree)
    taken = accept(key_accept, proposal, jnp.broadcast_to(jnp.log(p), (rows, 3, 6)), sampling)
    count, emitted, path = (np.asarray(x) for x in (taken.num_accepted, taken.emitted,
                                                    taken.path))
    first, second = (np.asarray(c) for c in exit_workload_module._child_chances(
        jnp.broadcast_to(p, (6, 6)), jnp.broadcast_to(q, (6, 6)), jnp.arange(6)))
    for y in range(6):
        emitted_y = emitted[:, 0] == y
        for child, chance in ((0, first[y]), (1, second[y])):
            measured = np.mean(emitted_y & (count == 1) & (path[:, 0] == child)) / p[y]
            error = np.sqrt(chance * p[y] * (1 - chance * p[y]) / rows) / p[y]
            assert abs(measured - chance) < 4.5 * error + 1e-9, (y, child, measured, chance)
    assert second[1] > 0.1  # the second child matters


def _sampled_rounds(params, generator: Generator, drafter, sampling: SamplingParams,
                    prompts: list[list[int]], seeds: int,
                    draft_ids: np.ndarray | None = None) -> tuple[np.ndarray, ExitRuns]:
    """The rounds [texts] the sampled loop takes on each text it makes from `prompts` at
    seeds 0, 1, ..., and the sampled `exit_runs` of those texts (over `draft_ids`)."""
    rounds, texts = [], []
    for seed in range(seeds):
        out = generator.generate(prompts, max_new_tokens=NEW, strategy=drafter,
                                 sampling=sampling, seed=seed)
        rounds += [stats.rounds for stats in out.stats]
        texts += out.tokens
    return np.asarray(rounds), exit_runs(params, CFG, prompts * seeds, texts, draft_ids,
                                         sampling)


def test_played_tree_rounds_are_the_loops_on_a_hybrid():
    """A Mamba-2 / attention hybrid, greedy, the tree 2,2,1,1 drafted through its first (SSM)
    layer: the rounds played over the exit's ranks equal the real loop's, row by row.
    Catches the teacher-forced pass reading the exits in each layer kind's stack order
    rather than the layers' (the same on a model of one kind: there exit 1 played exit 3's
    ranks, 11 rounds against the loop's 14)."""
    cfg = ModelConfig(**{**TINY_MODEL, "init_std": 0.3,
                         "layer_pattern": ("mamba2", "attention", "mamba2", "attention"),
                         "ssm": SsmConfig(num_heads=4, head_dim=8, state_size=8, groups=2,
                                          chunk_size=4)})
    params = damped_params(cfg, jax.random.PRNGKey(0), 0.5)
    generator, tree = Generator(params, cfg), StaticTree.from_branching((2, 2, 1, 1))
    continuations = model_continuations(generator, PROMPTS, max_new_tokens=NEW)
    runs = exit_runs(params, cfg, PROMPTS, continuations)
    out = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=SelfSpeculative(1, tree))
    assert out.tokens == continuations
    played = [_rounds_by_rank(row[0], tree) for row in runs.ranks]
    assert played == [stats.rounds for stats in out.stats]
    assert played != [expected_rounds(row[0] == 0, 4) for row in runs.ranks]  # teeth


def test_sampled_played_rounds_are_the_sampled_loops_in_expectation(model):
    """Sampled (top-p 0.9, exit 2 drafting over 200 of the 259 ids, K=3), over 900 texts the
    sampled selfspec loop made (30 seeds of 30 prompts): its rounds on each text, less the
    rounds `exit_runs` and `expected_rounds` expect on that text, average zero (|z| < 3.5),
    an independent reference. Catches an acceptance 5% too permissive or too strict (z 6.0
    and -11 here), q over the whole vocabulary where the drafter drafts over the subset (z
    22), p or q without the sampling's filters, and the ratio inverted (p / q)."""
    params, generator, _, ranking, _ = model
    sampling = SamplingParams(temperature=1.0, top_k=0, top_p=0.9)
    drafter = SelfSpeculative(2, Chain(3), draft_vocab=200)
    rounds, runs = _sampled_rounds(params, generator, drafter, sampling, PROMPTS * 10, 30,
                                   np.sort(ranking[:200]))
    assert runs.sampling is sampling
    expected = [expected_rounds(row[1], 3) for row in runs.accept]
    gap = np.asarray(rounds) - np.asarray(expected)
    assert abs(gap.mean()) < 3.5 * gap.std() / np.sqrt(len(gap)), (gap.mean(), gap.std())
    assert 0.3 < runs.rate(2) < 0.7  # drafts are accepted and rejected: teeth


def test_child_chances_are_read_at_each_exit_and_position(model):
    """Sampled runs over 200 of the 259 ids, top-p 0.9: at every position of every text, the
    first- and second-child chances of exits 1 and 2 are `_child_chances` of p and q from an
    independent reference, `model.forward` of the whole model and of the model cut to the
    exit's layers (the shared head over the 200 ids). Catches the second child's chances
    read from the neighbouring exit or a position off, over the whole vocabulary where the
    drafter drafts over the subset, or without the sampling's filters, which the loop's
    rounds on a few hundred texts are too noisy to see."""
    params, _, _, ranking, _ = model
    sampling = SamplingParams(temperature=1.0, top_k=0, top_p=0.9)
    texts = model_continuations(Generator(params, CFG), PROMPTS, max_new_tokens=NEW,
                                sampling=sampling, seed=3)
    ids = np.sort(ranking[:200])
    runs = exit_runs(params, CFG, PROMPTS, texts, ids, sampling)
    rows = [prompt + continuation for prompt, continuation in zip(PROMPTS, texts, strict=True)]
    tokens = np.zeros((len(rows), max(map(len, rows))), np.int32)  # causal: the pad is after
    for row, text in zip(tokens, rows, strict=True):
        row[:len(text)] = text
    forward = jax.jit(M.forward, static_argnames="cfg")
    outside = ~np.isin(np.arange(CFG.vocab_size), ids)
    p = probabilities(forward(params, CFG, tokens), sampling)
    for exit_layer in (1, 2):
        cut = {**params, "layers": jax.tree.map(lambda w, e=exit_layer: w[:e], params["layers"])}
        logits = forward(cut, dataclasses.replace(CFG, num_layers=exit_layer), tokens)
        q = probabilities(jnp.where(outside, -jnp.inf, logits), sampling)
        for index, (prompt, continuation) in enumerate(zip(PROMPTS, texts, strict=True)):
            at = len(prompt) + np.arange(len(continuation) - 1)  # position t predicts t + 1
            first, second = exit_workload_module._child_chances(
                p[index, at], q[index, at], jnp.asarray(tokens[index, at + 1]))
            np.testing.assert_allclose(runs.accept[index][exit_layer - 1], first, atol=1e-5)
            np.testing.assert_allclose(runs.second_child[index][exit_layer - 1], second,
                                       atol=1e-5)
    assert 0.05 < np.mean(np.concatenate([row[1] for row in runs.second_child])) < 0.5


def test_sampled_played_tree_rounds_are_the_sampled_loops_in_expectation(model):
    """Sampled selfspec drafting the static tree 2,2,1 (children without replacement) from
    exit 2 over 200 of the 259 ids, top-p 0.9, over 180 texts the loop made (6 seeds of 30
    prompts): its rounds on each text, less the rounds `tree_rounds` expects there from the
    exit's first- and second-child chances (`exit_runs`), average zero (|z| < 3.5), an
    independent reference of the whole play. Catches the second child left out (the
    chain's rounds: z about 16 here) and the walk's depths read as a chain's."""
    params, generator, _, ranking, _ = model
    sampling = SamplingParams(temperature=1.0, top_k=0, top_p=0.9)
    tree = StaticTree.from_branching((2, 2, 1))
    drafter = SelfSpeculative(2, tree, draft_vocab=200)
    rounds, runs = _sampled_rounds(params, generator, drafter, sampling, PROMPTS * 10, 6,
                                   np.sort(ranking[:200]))
    assert runs.plays_tree(tree)
    expected = np.array([tree_rounds(runs._siblings(i, 2, 2), tree)
                         for i in range(len(rounds))])
    gap = np.asarray(rounds) - expected
    assert abs(gap.mean()) < 3.5 * gap.std() / np.sqrt(len(gap)), (gap.mean(), gap.std())
    chain = np.array([expected_rounds(row[1], 3) for row in runs.accept])
    assert chain.sum() > 1.05 * expected.sum()  # the second children add accepted drafts
    assert runs.tree_tau(2, tree) == pytest.approx(runs.positions / expected.sum())


@pytest.mark.parametrize("drafter", [
    PromptLookup(shape=Chain(2)), PromptLookup(ngram_max=2, shape=Chain(4)),
    SuffixDecoding(depth=4, shape=Chain(3)), SuffixDecoding(min_prob=0.6, shape=Chain(5))],
    ids=lambda d: d.label())
def test_copied_rounds_are_the_real_loops_rounds(model, drafter):
    """A drafter that copies from the text, played over the continuations one prompt at a time
    (`play_copied`), takes the rounds the real greedy loop takes on that prompt, an independent
    reference. Catches the proposal made from one token too many (the round's own target
    token, which it cannot know) or too few, a draft accepted past the continuation's end or
    past its first miss, and the round's own token not counted."""
    params, generator, continuations, _, _ = model
    out = generator.generate(COPYING_PROMPTS, max_new_tokens=NEW, strategy=drafter)
    texts = [p + c for p, c in zip(COPYING_PROMPTS, out.tokens, strict=True)]
    played = [play_copied(drafter, CFG, ExitRuns((), (tuple(t),), (len(p),)), repeats=1).tau
              for t, p in zip(texts, COPYING_PROMPTS, strict=True)]
    real = [(len(c) - 1) / s.rounds for c, s in zip(out.tokens, out.stats, strict=True)]
    assert played == pytest.approx(real, rel=1e-12)
    assert max(real) > 1.5  # the drafts were accepted: teeth
    everything = ExitRuns((), tuple(tuple(t) for t in texts),
                          tuple(len(p) for p in COPYING_PROMPTS))
    assert play_copied(drafter, CFG, everything, repeats=1).tau == pytest.approx(
        sum(len(c) - 1 for c in out.tokens) / sum(s.rounds for s in out.stats))


@pytest.mark.parametrize("drafter", [PromptLookup(shape=Chain(2)),
                                     PromptLookup(ngram_max=2, shape=Chain(4))],
                         ids=lambda d: d.label())
def test_sampled_prompt_lookup_is_played_exactly(model, drafter):
    """Sampled, prompt lookup's draft is a point mass q, so its chance min(1, q(y) / p(y)) is
    1 where the draft is the token the loop emits there and 0 elsewhere: played over the
    sampled loop's own output (`exit_runs` with its sampling, which gives p), the rounds are
    the ones the loop took, prompt by prompt. Catches q read at the drafter's own draw
    instead of the text's token, the ratio inverted (p / q: a copy then accepted wherever
    p < 1 whatever it copied), and a play over the greedy text where the loop sampled
    another."""
    params, _, _, _, _ = model
    # Logits 4x sharper, so that the sampled text repeats itself and copies are accepted.
    sharp = {**params, "final_norm": jax.tree.map(lambda x: 4 * x, params["final_norm"])}
    generator = Generator(sharp, CFG)
    sampling = SamplingParams(temperature=1.0, top_k=0, top_p=1.0)
    out = generator.generate(COPYING_PROMPTS, max_new_tokens=NEW, strategy=drafter,
                             sampling=sampling, seed=0)
    runs = exit_runs(sharp, CFG, COPYING_PROMPTS, out.tokens, sampling=sampling)
    assert copied_rounds(drafter, CFG, runs).tolist() == [s.rounds for s in out.stats]
    assert max((len(c) - 1) / s.rounds for c, s in zip(out.tokens, out.stats,
                                                       strict=True)) > 1.5  # teeth
    greedy = generator.generate(COPYING_PROMPTS, max_new_tokens=NEW, strategy=drafter).tokens
    assert greedy != out.tokens  # the sampled text is not the greedy one
    assert play_copied(drafter, CFG, runs, repeats=1).tau == pytest.approx(
        sum(len(c) - 1 for c in out.tokens) / sum(s.rounds for s in out.stats))


ALPHABETS = 8  # rows of one batch, each drawing from its own 4 ids (`alphabet_params`)
SUFFIX_SEEDS = 16  # batches of the sampled suffix test: 128 texts


def alphabet_params(cfg: ModelConfig, probs: Sequence[float]):
    """A model whose layers write nothing and whose tied embedding puts alphabet r (ids
    10 r + 5 ... 10 r + 8) along its own block of coordinates: after a token of alphabet r the
    next is drawn from alphabet r with `probs`, whatever came before. Rows prompted in
    distinct alphabets never share a token, so suffix decoding, which matches across a
    batch's rows, drafts from each row's own text, as at batch 1."""
    params = damped_params(cfg, jax.random.PRNGKey(0), 0.0)
    params = jax.tree_util.tree_map_with_path(  # the first layer too
        lambda path, w: 0 * w if path[-1].key in ("out", "down") else w, params)
    width = cfg.d_model // ALPHABETS
    logits = np.log(np.asarray(probs)) - np.log(min(probs))
    embed = np.full((cfg.vocab_size, cfg.d_model), -0.3)  # other ids: against every block
    for r in range(ALPHABETS):
        block = np.zeros(cfg.d_model)
        block[r * width:(r + 1) * width] = 1.0
        # After the final norm a token of alphabet r is sqrt(d / width) x its block.
        for i, logit in enumerate(logits):
            embed[10 * r + 5 + i] = block * (1 + logit / (width * np.sqrt(cfg.d_model / width)))
    return {**params, "embed": jnp.asarray(embed, jnp.float32),
            "final_norm": jax.tree.map(jnp.ones_like, params["final_norm"])}


def test_sampled_suffix_rounds_are_the_sampled_loops_in_expectation():
    """Sampled suffix decoding (K=3, min_prob 0.2, top-p 0.8, over an 8-row batch whose rows
    draw from disjoint alphabets: `alphabet_params`) on 128 texts: the loop's rounds on
    each text, less the rounds `copied_rounds` expects there from its teacher-forced q and
    the target's p (`exit_runs`), average zero (|z| < 3.5), an independent reference of the
    whole play. Catches an acceptance 5% too strict (z -8 here) and the ratio inverted;
    `test_copied_acceptance_by_hand` and the next test pin what this one is too weak to
    see (p read a position off, acceptance 5% too permissive, depth 2 drafted after the
    play's own draw)."""
    params = alphabet_params(CFG, [0.45, 0.3, 0.15, 0.1])
    sampling = SamplingParams(temperature=1.0, top_k=0, top_p=0.8)
    drafter = SuffixDecoding(depth=4, min_prob=0.2, shape=Chain(3))
    starts = [[0, 1, 2, 3, 0, 1], [1, 1, 0], [3, 2, 0, 0, 1, 2], [2, 2], [0, 3, 1],
              [1, 0, 1, 0], [3], [2, 1, 0, 3]]
    batch = [[10 * r + 5 + t for t in start] for r, start in enumerate(starts)]
    rounds, runs = _sampled_rounds(params, Generator(params, CFG), drafter, sampling, batch,
                                   SUFFIX_SEEDS)
    texts = [text[len(prompt):] for text, prompt in zip(runs.texts, batch * SUFFIX_SEEDS,
                                                        strict=True)]
    gap = np.asarray(rounds) - copied_rounds(drafter, CFG, runs)
    assert abs(gap.mean()) < 3.5 * gap.std() / np.sqrt(len(gap)), (gap.mean(), gap.std())
    assert 1.3 < sum(len(t) - 1 for t in texts) / sum(rounds) < 2.5  # drafts accepted: teeth
    assert all(set(t) <= set(range(10 * r + 5, 10 * r + 9))  # each row in its own alphabet
               for t, r in zip(texts, itertools.cycle(range(ALPHABETS))))


def test_a_copying_drafters_sampled_draft_is_read_along_the_text():
    """Text 1 2 7 1 2 7 1 2 7 1 3 8 1, then 3 8: suffix decoding matches the last 1, whose
    occurrences are followed by 2 three times and by 3 once. Along the text (its drafts
    forced to 3 then 8), q at depth 1 gives the text's 3 a chance of 0.25 and at depth 2,
    after 1 3, gives 8 all of it; greedy, the drafts are 2 (the argmax) and, after the forced
    3, 8. Catches the play drafting depth 2 after its own draw (2, then 7: the text's 8 would
    get no chance) rather than after the text's token."""
    drafter = SuffixDecoding(depth=4, min_prob=0.2, factor=2.0, shape=Chain(2))
    text = copied_play_module._padded([1, 2, 7, 1, 2, 7, 1, 2, 7, 1, 3, 8, 1, 3, 8])
    end = jnp.int32(13)  # 1 2 7 ... 1 known, the last 1 pending
    sampling = SamplingParams(temperature=1.0, top_k=0, top_p=1.0)
    _, valid, chance = copied_play_module._propose_at(drafter, CFG, text, end, sampling)
    np.testing.assert_allclose(chance, [0.25, 1.0], rtol=1e-6)
    assert valid.tolist() == [True, True]
    tokens, _, _ = copied_play_module._propose_at(drafter, CFG, text, end)
    assert tokens.tolist() == [2, 8]


def test_copied_acceptance_by_hand():
    """Text 5 6 7 8 0: greedy, a proposal knowing 2 tokens (5 6) of 7 9 8 has its first
    draft right; knowing 3, 8 0 6 its first two (nothing lies past the text's end, whatever
    pads it); an invalid draft counts for nothing. Sampled, a draft's chance is
    min(1, q / p) of the text's token, 0 where p is 0 or the draft invalid or past the end.
    Catches acceptance past the text's end, a sampled invalid draft accepted, the ratio
    inverted or uncapped (or 5% too permissive), and p read a position off."""
    tokens = np.array([[7, 9, 8], [8, 0, 6], [6, 7, 8]])
    valid = np.array([[1, 1, 1], [1, 1, 1], [1, 0, 1]], bool)
    ends, text = np.array([2, 3, 4]), [5, 6, 7, 8, 0]
    chance = np.array([[0.2, 0.9, 0.5], [0.1, 0.3, 0.7], [0.4, 0.4, 0.4]])
    np.testing.assert_array_equal(copied_acceptance(tokens, valid, chance, text, ends),
                                  [[1, 0, 0], [1, 1, 0], [0, 0, 0]])
    target = np.array([0.4, 0.0, 0.6])  # p of the text's tokens 7, 8, 0
    np.testing.assert_allclose(copied_acceptance(tokens, valid, chance, text, ends, target),
                               [[0.5, 0.0, 0.5 / 0.6], [0.0, 0.3 / 0.6, 0.0],
                                [2 / 3, 0.0, 0.0]])


def test_a_copying_drafters_proposal_is_timed(monkeypatch):
    """A proposal's seconds are the median timed loop over its `TIMED_PROPOSALS` proposals:
    on a scripted clock (each loop run, then timed at 0.8, 0.2, 0.4, 0.8, 0.8 s) 0.8 / 8, and
    on the real one positive and far below a second. Catches the proposal's time left at
    zero, taken for the whole timed loop instead of one proposal, or a mean for the median.
    (Suffix decoding against prompt lookup on the real clock flaked: at 8 ids their
    proposals cost the same, 75-85 us.)"""
    text = tuple(COPYING_PROMPTS[0] * 4)
    runs = ExitRuns((), (text,), (10,))
    for drafter in (PromptLookup(shape=Chain(4)), SuffixDecoding(shape=Chain(4))):
        assert 0 < play_copied(drafter, CFG, runs).draft_seconds < 0.1
    scripted, ran = iter([0.8, 0.2, 0.4, 0.8, 0.8]), []
    monkeypatch.setattr(copied_play_module, "timed",
                        lambda run: ran.append(run()) or next(scripted))
    seconds = play_copied(SuffixDecoding(shape=Chain(4)), CFG, runs).draft_seconds
    assert copied_play_module.TIMED_PROPOSALS == 8 and len(ran) == 5
    assert seconds == pytest.approx(0.8 / 8)


def test_only_a_drafter_that_copies_from_the_text_is_played():
    """Catches selfspec played as if its drafts were copied (a figure with no meaning)."""
    with pytest.raises(ValueError, match="does not copy"):
        play_copied(SelfSpeculative(1, Chain(2)), CFG, ExitRuns((), ((1, 2, 3),), (1,)))


def test_fit_round_is_the_line_through_the_extremes_or_a_ratio():
    """By hand: (2, 1.0) and (4, 1.6) give scale 0.3 and overhead 0.4 (the middle point
    ignored); a line that falls with the pieces (noise) and a single point give the ratio of
    the sums through the origin. Catches the overhead read at the wrong end, and a falling
    line kept (a costlier round predicted cheaper, or negative)."""
    assert fit_round([(4.0, 1.6), (3.0, 9.0), (2.0, 1.0)]) == (pytest.approx(0.3),
                                                               pytest.approx(0.4))
    assert fit_round([(2.0, 1.0), (4.0, 0.9)]) == (pytest.approx(1.9 / 6), 0.0)
    assert fit_round([(2.0, 1.0)]) == (pytest.approx(0.5), 0.0)


def test_end_to_end_speedup_by_hand():
    """2 prompts of 0.1 s prefill and 100 decoded tokens of 0.01 s: 1.2 s; decoding twice as
    fast, 0.2 + 0.5 s: 12/7. Catches the prefill counted once instead of per prompt, and the
    speed-up applied to the prefill too."""
    loop = LoopCalibration(0.01, 0.1, 1.0, 0.0, 1, ())
    assert loop.end_to_end(2.0, 2, 100) == pytest.approx(1.2 / 0.7)
    assert loop.end_to_end(1.0, 2, 100) == pytest.approx(1.0)


def test_a_calibrated_prediction_by_hand():
    """A report with played runs and a calibrated loop: the speed-up at (exit 2, K=3) is
    tau_played x ar's real seconds / (scale x the pieces' round + overhead), then taken end
    to end, by hand; the records carry the workload's agreement and the table the loop's
    line. Catches the plain cost taken from the pieces when the real loop is known, tau from
    the i.i.d. formula when runs are given, and the calibration's line left unapplied."""
    agree = np.array([[0, 0, 0, 0, 1, 0], [1, 1, 1, 0, 1, 1], [1, 1, 1, 1, 1, 1],
                      [1, 1, 1, 1, 1, 1]], bool)
    runs = ExitRuns((agree,))
    loop = LoopCalibration(token_seconds=3.0, prefill_seconds=2.0, scale=0.5, overhead=1.0,
                           exit_layer=2, points=((2, 9.0, 8.0, 2.0),))
    kinds = CFG.layer_kinds
    report = DraftExitReport(METRICS, COSTS, kinds, num_draft=(3,), runs=runs, loop=loop)
    # exit 2, K=3 over 1 1 1 0 1 1: accept 3, make 3; accept 2 (4, 5): 2 rounds, tau 3
    pieces = 3 * (2.0 * 2 + 0.5) + 2.0 * 2 + (2.0 + 0.75) * 2 + (0.5 + 0.3)
    decode = 3.0 * 3.0 / (0.5 * pieces + 1.0)
    assert report.tau(2, 3) == pytest.approx(3.0)
    assert report.decode_speedup(2, 3) == pytest.approx(decode)
    assert report.speedup(2, 3) == pytest.approx((2.0 + 18.0) / (2.0 + 18.0 / decode))
    assert report.to_records()[1]["workload_agreement"] == pytest.approx(5 / 6)
    assert "real loop: ar 3000.000 ms/token" in report.table()


def test_a_copying_drafters_prediction_by_hand():
    """A drafter that copies K=3 drafts at tau 2.5, on the report above: its round is the
    verification of 4 tokens (4 layers of 2.75 and the head's 0.8: 11.8 s of pieces), mapped
    by the loop's line, plus its own proposal's 0.5 s, then taken end to end as selfspec's
    figures are. Catches a selfspec draft cost charged to a copying drafter, its own proposal
    left out, the verification sized K instead of K + 1, and the loop's line or the prefill
    left out."""
    loop = LoopCalibration(token_seconds=3.0, prefill_seconds=2.0, scale=0.5, overhead=1.0,
                           exit_layer=2, points=((2, 9.0, 8.0, 2.0),))
    report = DraftExitReport(METRICS, COSTS, CFG.layer_kinds, num_draft=(3,),
                             runs=ExitRuns((np.ones((4, 6), bool),)), loop=loop)
    decode = 2.5 * 3.0 / (0.5 * (4 * 2.75 + 0.8) + 1.0 + 0.5)
    assert report.copied_speedup(2.5, 3, 0.5) == pytest.approx(
        (2.0 + 18.0) / (2.0 + 18.0 / decode))


def test_the_draft_vocabularys_head_costs_the_drafts_only():
    """With a cheaper draft head, a round's K drafts use it and verification keeps the full
    head, by hand. Catches the subset head charged to verification too, or ignored."""
    costs = LayerCosts(layer=COSTS.layer, head=COSTS.head, draft_head=0.05, draft_vocab=16)
    shallow, deep = 2.0, 3 * (2.0 + 0.25 * 2)
    assert costs.round(CFG.layer_kinds, 1, 2) == pytest.approx(
        2 * (shallow + 0.05) + shallow + deep + 0.5 + 0.1 * 2)
    assert costs.plain(CFG.layer_kinds) == COSTS.plain(CFG.layer_kinds)


def test_the_command_predicts_on_a_workload_and_refuses_a_workload_without_it(base_workdir,
                                                                             tmp_path):
    """infer/exit_report.py on a workdir's held-out prompts: the table names the workload and
    the real loop, each JSON record its agreement along the continuations; the calibration's
    measured tau is the played one at the exit it timed. A prompt set with --noworkload is
    a one-line error, and so is --temperature with it (a sampled report needs the sampled
    continuations). Catches the workload dropped from the command (the held-out estimate
    printed instead) and flags that would be silently ignored."""
    out = tmp_path / "exits.json"
    result = run_script("infer/exit_report.py", f"--workdir={base_workdir}", "--num_prompts=2",
                        "--prompt_len=16", "--max_new_tokens=16", "--num_draft=2,3",
                        "--repeats=1", "--max_tokens=256", "--context=16",
                        f"--output_json={out}")
    assert result.returncode == 0, result.stderr
    assert "on 2 prompts x 16 new tokens, the benchmark's" in result.stdout
    assert "real loop: ar" in result.stdout
    for line in result.stdout.splitlines():
        if line.startswith("real loop:"):
            for part in line.split("; K=")[1:]:
                measured, played = part.split("tau ")[1].split(" (played ")
                assert float(measured) == pytest.approx(float(played.split(")")[0]), abs=0.01)
    records = json.loads(out.read_text())
    assert all(0 <= record["workload_agreement"] <= 1 for record in records)
    refused = run_script("infer/exit_report.py", f"--workdir={base_workdir}",
                         "--prompt_set=humaneval", "--noworkload")
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines()[-1].endswith(
        "--prompts_file and --prompt_set are the workload's: drop --noworkload")
    sampled = run_script("infer/exit_report.py", f"--workdir={base_workdir}",
                         "--temperature=0.8", "--noworkload")
    assert sampled.returncode != 0
    assert sampled.stderr.strip().splitlines()[-1].endswith(
        "a sampled report plays the model's sampled continuations of the workload: drop "
        "--noworkload")


def test_a_one_layer_model_keeps_its_held_out_report():
    """A one-layer model has no exit to draft from: the workload leaves its report as it is,
    without decoding (no generator is needed). Catches selfspec built at exit 1 of one layer,
    whose refusal would fail `infer/exit_report.py` on any one-layer model."""
    one = ExitReport(loss=(2.0,), accuracy=(0.4,), agreement=(1.0,), tokens=10)
    report = DraftExitReport(one, COSTS, ("attention",), num_draft=(2,))
    assert on_workload(report, None, None, None, None, [[1, 2]], max_new_tokens=4) is report


def test_played_runs_rank_the_exits_before_the_loop_is_timed():
    """With runs but no calibration yet (how `on_workload` picks the exit to time), the
    speed-up is the played tau over the pieces, by hand, not the held-out agreement's. Catches
    the calibration's exit chosen from another text's agreement (on SmolLM2 exit 1's .03
    held-out against .04 on the prompts; on a model whose continuations repeat, .83 against
    .98)."""
    agree = np.array([[0, 0, 0, 0, 1, 0], [1, 1, 1, 0, 1, 1], [1, 1, 1, 1, 1, 1],
                      [1, 1, 1, 1, 1, 1]], bool)
    kinds = CFG.layer_kinds
    report = DraftExitReport(METRICS, COSTS, kinds, num_draft=(3,), runs=ExitRuns((agree,)))
    pieces = COSTS.round(kinds, 2, 3)
    assert report.speedup(2, 3) == pytest.approx(3.0 * COSTS.plain(kinds) / pieces)
    assert report.speedup(1, 3) == pytest.approx(6 / 5 * COSTS.plain(kinds)
                                                 / COSTS.round(kinds, 1, 3))
