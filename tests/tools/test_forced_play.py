"""Kangaroo and a draft model played from one teacher-forced pass (`Drafter.plays_forced`,
`exit_workload.exit_runs` with a drafter, `ForcedPlays`) against their real decode loops
(greedy row by row, sampled in expectation), and their rounds priced: Kangaroo's with the
adapter's block (`LayerCosts.tree_round`), the draft model's with its own pieces
(`LayerCosts.drafted_round`, `ForcedPlays.draft_costs`), by `tune.played_speedup`."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
import specjax.tools.exit_report as exit_report_module
import specjax.tools.exit_workload as exit_workload_module
import specjax.tools.layer_costs as layer_costs_module
from specjax import model as M
from specjax.config import ModelConfig, SsmConfig
from specjax.decoding.drafter import DraftContext, DraftWeights
from specjax.decoding.drafters.draft_model import DraftModel
from specjax.decoding.drafters.kangaroo import Kangaroo
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.decoding.engine import Generator
from specjax.decoding.sampling import SamplingParams
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.dynamic_tree import DynamicTree
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.heads.kangaroo import init_adapter
from specjax.model import init_params, unstack_layers
from specjax.tools import tune as tuner
from specjax.tools.exit_report import DraftExitReport
from specjax.tools.exit_workload import (
    ExitRuns,
    ForcedPlays,
    exit_runs,
    model_continuations,
    tree_rounds,
)
from specjax.tools.layer_costs import LayerCosts, measure_costs
from specjax.tools.loop_calibration import LoopCalibration
from specjax.training.evaluate import ExitReport
from tests.support.models import TINY_MODEL, damped_params, first_layers, noisy

CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})
PROMPTS = [[1, 2, 3, 4, 5], [7], list(range(40, 59))]
NEW = 24
EXIT = 2


@pytest.fixture(scope="module")
def model():
    """The params, a generator holding a noisy adapter at exit 2 (its drafts are neither the
    exit's nor the target's) and a noisy 2-layer draft model, whose ranking puts the
    continuations' ids first, the continuations, and a draft vocabulary size that leaves 3
    of their ids out."""
    params = damped_params(CFG, jax.random.PRNGKey(0), 0.5)
    draft, draft_cfg = first_layers(params, CFG, 2)
    weights = {"kangaroo": DraftWeights(noisy(init_adapter(params, CFG, EXIT), 0.1),
                                        exit_layer=EXIT),
               "draft": DraftWeights(noisy(draft, 0.05, seed=7), cfg=draft_cfg)}
    continuations = model_continuations(Generator(params, CFG), PROMPTS, max_new_tokens=NEW)
    counts = np.bincount(np.concatenate(continuations), minlength=CFG.vocab_size)
    ranking = np.argsort(-counts, kind="stable")
    generator = Generator(params, CFG, draft_weights=weights, draft_vocab=ranking)
    return params, generator, continuations, int((counts > 0).sum()) - 3


def _played(runs: ExitRuns, index: int, shape, row: int = tuner.FORCED_ROW) -> float:
    """The rounds played over text `index` of runs' row `row` (a drafter's own: their one)."""
    tree = shape if isinstance(shape, StaticTree) else StaticTree.from_branching(
        (1,) * shape.num_draft)
    return tree_rounds(runs._siblings(index, row, tree.max_children), tree)


@pytest.mark.parametrize("subset", [False, True])
def test_kangaroos_played_rounds_are_its_real_loops_rounds(model, subset):
    """Greedy Kangaroo at exit 2, chains of 1 and 3 and the tree 2,2,1, over the whole
    vocabulary and over N ids: the rounds played over its own runs (one teacher-forced
    pass of the adapter, `ForcedPlays`) equal the rounds its real loop takes, row by row, an
    independent reference. Catches the adapter read at the neighbouring exit, its drafts
    read one position off, the exit's shared head in place of the adapter, and drafts over
    the whole vocabulary where the drafter drafts over N ids."""
    params, generator, continuations, size = model
    draft_vocab = size if subset else 0
    forced = ForcedPlays(generator, params)
    runs = exit_runs(params, CFG, PROMPTS, continuations)
    played_all = []
    for shape in (Chain(1), Chain(3), StaticTree.from_branching((2, 2, 1))):
        drafter = Kangaroo(EXIT, shape, draft_vocab=draft_vocab)
        out = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=drafter)
        assert out.tokens == continuations
        own = forced(drafter, runs)
        played = [_played(own, i, shape) for i in range(len(PROMPTS))]
        assert played == [stats.rounds for stats in out.stats], shape
        played_all.append(played)
        exits = [_played(runs, i, shape, EXIT) for i in range(len(PROMPTS))]
        assert played != exits  # the adapter's drafts are not the exit's: teeth
    assert len({tuple(p) for p in played_all}) == 3


def test_a_draft_models_played_rounds_are_its_real_loops_rounds(model):
    """Greedy, a noisy 2-layer draft model drafting chains of 1 and 3 and the tree 2,2,1:
    the rounds played over its own runs (its teacher-forced pass over the text) equal the
    rounds its real loop takes, row by row. Catches its drafts read one position off, the
    target's head (or an exit's) in place of its own, and its pass run without the text
    before each position."""
    params, generator, continuations, _ = model
    forced = ForcedPlays(generator, params)
    runs = exit_runs(params, CFG, PROMPTS, continuations)
    played_all = []
    for shape in (Chain(1), Chain(3), StaticTree.from_branching((2, 2, 1))):
        drafter = DraftModel(shape)
        out = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=drafter)
        assert out.tokens == continuations
        played = [_played(forced(drafter, runs), i, shape) for i in range(len(PROMPTS))]
        assert played == [stats.rounds for stats in out.stats], shape
        assert played != [_played(runs, i, shape, 2) for i in range(len(PROMPTS))]  # teeth
        played_all.append(played)
    assert len({tuple(p) for p in played_all}) == 3


@pytest.mark.parametrize("drafter", [
    Kangaroo(EXIT, StaticTree.from_branching((2, 2, 1)), draft_vocab=200),
    DraftModel(StaticTree.from_branching((2, 2, 1)))], ids=lambda d: d.name)
def test_sampled_played_rounds_are_the_loops_in_expectation(model, drafter):
    """Sampled (top-p 0.9) Kangaroo over 200 of the 259 ids and the draft model, drafting
    the tree 2,2,1 with children without replacement, over 180 texts each loop made (6
    seeds of 30 prompts): its rounds on each text, less those played over its own sampled
    runs there, average zero (|z| < 3.5). Catches q read over the whole vocabulary or
    without the sampling's filters, the target's p in place of the drafter's q, and the
    second child left out."""
    params, generator, _, _ = model
    sampling = SamplingParams(temperature=1.0, top_k=0, top_p=0.9)
    tree = drafter.shape
    prompts, rounds, texts = PROMPTS * 10, [], []
    for seed in range(6):
        out = generator.generate(prompts, max_new_tokens=NEW, strategy=drafter,
                                 sampling=sampling, seed=seed)
        rounds += [stats.rounds for stats in out.stats]
        texts += out.tokens
    runs = exit_runs(params, CFG, prompts * 6, texts, sampling=sampling)
    own = ForcedPlays(generator, params)(drafter, runs)
    assert own.sampling is sampling and own.plays_tree(tree)
    expected = np.array([_played(own, i, tree) for i in range(len(rounds))])
    gap = np.asarray(rounds) - expected
    assert abs(gap.mean()) < 3.5 * gap.std() / np.sqrt(len(gap)), (gap.mean(), gap.std())
    assert 0.2 < own.rate(1) < 0.8  # drafts are accepted and rejected: teeth


def test_one_pass_per_drafter_whatever_its_shape(model, monkeypatch):
    """`ForcedPlays` runs one teacher-forced pass per drafter and set of runs: a tuner's
    chains and trees share it, other runs get their own. Catches a pass (and a compile) per
    candidate, and runs of other continuations served from the cache."""
    params, generator, continuations, _ = model
    passes = []
    real = exit_workload_module.exit_runs
    monkeypatch.setattr(exit_workload_module, "exit_runs",
                        lambda *a, **k: passes.append(a[6][0]) or real(*a, **k))
    forced = ForcedPlays(generator, params)
    runs = exit_runs(params, CFG, PROMPTS, continuations)
    first = forced(Kangaroo(EXIT, Chain(2)), runs)
    assert forced(Kangaroo(EXIT, StaticTree.from_branching((2, 1))), runs) is first
    other = exit_runs(params, CFG, PROMPTS[:2], continuations[:2])
    assert len(forced(Kangaroo(EXIT, Chain(2)), other).accept) == 2
    assert len(passes) == 2


def test_a_drafter_whose_drafts_depend_on_the_rounds_start_is_not_played_forced(model):
    """`exit_runs` refuses a drafter that does not play forced (selfspec's exits are its
    own rows; a Medusa head drafts from the round's start). Catches its rounds played over
    drafts the loop never makes."""
    params, _, continuations, _ = model
    with pytest.raises(ValueError, match="selfspec.*teacher-forced"):
        exit_runs(params, CFG, PROMPTS, continuations,
                  drafter=(SelfSpeculative(1, Chain(2)), None))


ADAPTER_COSTS = LayerCosts(layer={"attention": {n: 2.0 + 0.25 * (n - 1) for n in range(1, 10)}},
                           head={n: 0.5 + 0.1 * (n - 1) for n in range(1, 10)},
                           adapter={n: 1.0 + 0.5 * (n - 1) for n in range(1, 10)})


def test_kangaroos_round_by_hand():
    """Kangaroo's round drafting K=2 from exit 1 of 4 attention layers: two draft passes of
    layer 1, the adapter and the head on one token; the last draft's layer 1 and adapter
    (the commit's) on one; three layers and the head on 3 tokens. A tree 2,1 pays the
    adapter on its widths and on its 2 leaves. Catches the adapter left out of the draft
    passes or of the commit, or priced on the wrong widths."""
    kinds = ("attention",) * 4
    chain = StaticTree.from_branching((1, 1))
    assert ADAPTER_COSTS.tree_round(kinds, 1, chain, adapter=True) == pytest.approx(
        2 * (2.0 + 1.0 + 0.5) + (2.0 + 1.0) + 3 * 2.5 + 0.7)
    assert ADAPTER_COSTS.tree_round(kinds, 1, chain) == pytest.approx(
        2 * (2.0 + 0.5) + 2.0 + 3 * 2.5 + 0.7)
    tree = StaticTree.from_branching((2, 1))  # drafts from 1 token, then 2; 2 leaves; 5 verified
    assert ADAPTER_COSTS.tree_round(kinds, 1, tree, adapter=True) == pytest.approx(
        (2.0 + 1.0 + 0.5) + (2.25 + 1.5 + 0.6) + (2.25 + 1.5) + 3 * 3.0 + 0.9)
    with pytest.raises(ValueError, match="no adapter was timed"):
        dataclasses.replace(ADAPTER_COSTS, adapter={}).tree_round(kinds, 1, chain, adapter=True)


def test_kangaroo_is_played_and_priced_with_its_adapter():
    """`played_speedup` plays Kangaroo's chains and static trees over its own runs
    (`forced`) and prices them with the adapter (`round_speedup` of the played tau and
    `tree_round(..., adapter=True)` at its exit); a chain that stops early, a dynamic tree,
    another draft vocabulary, a report that timed no adapter or no `forced` are left to the
    probe (so is a draft model's stopping chain). Catches Kangaroo priced as selfspec (no
    adapter), played at the exit's runs, or a chain that stops early (on confidence or on
    risk) played as a full one."""
    kinds = ("attention",) * 4
    runs = types.SimpleNamespace(tag="exits")
    own = types.SimpleNamespace(tree_tau=lambda row, tree: 2.0 + tree.num_nodes / 10 + row,
                                plays_tree=lambda tree: tree.max_children <= 2)
    seen = []
    report = types.SimpleNamespace(
        runs=runs, loop=object(), costs=ADAPTER_COSTS, layer_kinds=kinds,
        round_speedup=lambda tau, pieces: (tau, pieces))

    def forced(drafter, played):
        seen.append(played)
        return own

    tree = StaticTree.from_branching((2, 1))
    assert tuner.played_speedup(report, CFG, Kangaroo(1, Chain(2)), forced) == (
        3.2, ADAPTER_COSTS.tree_round(kinds, 1, StaticTree.from_branching((1, 1)), adapter=True))
    assert tuner.played_speedup(report, CFG, Kangaroo(1, tree), forced) == (
        3.4, ADAPTER_COSTS.tree_round(kinds, 1, tree, adapter=True))
    assert seen == [runs, runs]
    for drafter in (Kangaroo(1, Chain(2, stop_below=0.5)), Kangaroo(1, Chain(2, stop_risk=0.3)),
                    DraftModel(Chain(2, stop_below=0.5)), Kangaroo(1, DynamicTree(4, 2, 2)),
                    Kangaroo(1, StaticTree.from_branching((3, 1))),
                    Kangaroo(1, Chain(2), draft_vocab=100)):
        assert tuner.played_speedup(report, CFG, drafter, forced) is None, drafter
    assert tuner.played_speedup(report, CFG, Kangaroo(1, Chain(2))) is None
    report.costs = dataclasses.replace(ADAPTER_COSTS, adapter={})
    assert tuner.played_speedup(report, CFG, Kangaroo(1, Chain(2)), forced) is None


def test_the_adapters_block_is_timed_beside_the_pieces_and_scaled(monkeypatch):
    """`measure_costs` with an adapter runs its cached block at every size (compiled, as the
    loop runs it) beside the other pieces, its time scaled as theirs by the whole pass (here
    24 / (4 x 2 + 4) = 2 on one token, 54 / (4 x 3 + 6) = 3 on three). Catches the adapter
    left untimed, timed apart from the pieces, or kept at its raw (cache-resident) time."""
    alone = {"attention": {1: 2.0, 3: 3.0}, "head": {1: 4.0, 3: 6.0},
             "model": {1: 24.0, 3: 54.0}, "adapter": {1: 1.5, 3: 2.0}}
    asked = []

    def interleaved(calls, items, count):
        asked.append(set(calls))
        for call in calls.values():
            call(0)  # each piece runs: the adapter's cached block compiles and runs
        return {key: [[alone[key[0]][key[1]] * 2] * count] for key in calls}, {}

    monkeypatch.setattr(layer_costs_module, "time_interleaved", interleaved)
    params = damped_params(CFG, jax.random.PRNGKey(0), 0.5)
    costs = measure_costs(params, CFG, [3], context=4, repeats=3, inner=2,
                          adapter=init_adapter(params, CFG, 1))
    assert asked == [{(piece, n) for piece in alone for n in (1, 3)}]
    assert costs.adapter == {1: pytest.approx(3.0), 3: pytest.approx(6.0)}
    assert measure_costs(params, CFG, [3], context=4, repeats=3, inner=2).adapter == {}


def test_a_draft_models_round_by_hand():
    """A draft model of 2 attention layers (its layers 1 s on n tokens + 0.5 s a token, its
    head 0.25 s + 0.25 s a token) drafting K=2 for a 4-layer target: two draft passes of
    all its layers and its head on one token, its layers again on the one token the commit
    runs, the target's 4 layers and head on 3 tokens; the tree 2,1 drafts on 1 then 2
    tokens and still commits one token. Catches the draft's head left out, the commit
    priced per leaf, and verification priced from an exit (selfspec's reuse)."""
    kinds = ("attention",) * 4
    draft = LayerCosts(layer={"attention": {n: 1.0 + 0.5 * (n - 1) for n in range(1, 10)}},
                       head={n: 0.25 * n for n in range(1, 10)})
    chain, tree = StaticTree.from_branching((1, 1)), StaticTree.from_branching((2, 1))
    draft_kinds = ("attention",) * 2
    assert ADAPTER_COSTS.drafted_round(kinds, chain, draft, draft_kinds) == pytest.approx(
        2 * (2 * 1.0 + 0.25) + 2 * 1.0 + 4 * 2.5 + 0.7)
    assert ADAPTER_COSTS.drafted_round(kinds, tree, draft, draft_kinds) == pytest.approx(
        (2 * 1.0 + 0.25) + (2 * 1.5 + 0.5) + 2 * 1.0 + 4 * 3.0 + 0.9)


def test_a_draft_model_is_played_and_priced_with_its_own_pieces():
    """`played_speedup` plays the draft model's chains and trees over its own runs and
    prices them with its own pieces (`ForcedPlays.draft_costs`, asked with the target's
    costs and the runs' sampling) and the target's whole verification (`drafted_round`).
    Catches the draft model priced with the target's pieces or as selfspec's round, and its
    pieces timed greedy in a sampled tuning."""
    kinds = ("attention",) * 4
    sampling = SamplingParams(temperature=0.8, top_k=0, top_p=0.95)
    runs = types.SimpleNamespace(sampling=sampling)
    draft = LayerCosts(layer={"attention": {n: 1.0 + 0.5 * (n - 1) for n in range(1, 10)}},
                       head={n: 0.25 * n for n in range(1, 10)})
    asked = []

    class Forced:
        def __call__(self, drafter, played):
            return types.SimpleNamespace(tree_tau=lambda row, tree: 3.0,
                                         plays_tree=lambda tree: True)

        def draft_costs(self, drafter, like, mode):
            asked.append((like, mode))
            return draft, ("attention",) * 2

    report = types.SimpleNamespace(runs=runs, loop=object(), costs=ADAPTER_COSTS,
                                   layer_kinds=kinds, round_speedup=lambda tau, s: (tau, s))
    drafter = DraftModel(StaticTree.from_branching((2, 1)))  # unbound, as the tuner builds it
    assert tuner.played_speedup(report, CFG, drafter, Forced()) == (3.0, pytest.approx(
        ADAPTER_COSTS.drafted_round(kinds, drafter.shape, draft, ("attention",) * 2)))
    assert asked == [(ADAPTER_COSTS, sampling)]


def test_a_draft_models_pieces_are_timed_once_per_model_and_mode(model, monkeypatch):
    """`ForcedPlays.draft_costs` times the draft model's own pieces (its weights, its config)
    at the target's sizes and context, in the given mode, once per draft model and mode.
    Catches the target's weights timed in its place, its pieces timed again for every
    candidate, and a sampled tuning served the greedy pieces."""
    params, generator, _, _ = model
    timed = []
    monkeypatch.setattr(exit_workload_module, "measure_costs",
                        lambda p, cfg, sizes, **k: timed.append((p, cfg, sorted(sizes), k))
                        or object())
    forced = ForcedPlays(generator, params)
    like = dataclasses.replace(ADAPTER_COSTS, context=64)
    sampling = SamplingParams(temperature=0.8, top_k=0, top_p=0.95)
    first = forced.draft_costs(DraftModel(Chain(2)), like, None)
    weights = generator.draft_weights["draft"]
    assert first[1] == weights.cfg.layer_kinds == ("attention",) * 2
    again = forced.draft_costs(DraftModel(StaticTree.from_branching((2, 1))), like, None)
    assert again[0] is first[0]
    assert forced.draft_costs(DraftModel(Chain(2)), like, sampling)[0] is not first[0]
    assert [(p is weights.params, cfg, sizes, k) for p, cfg, sizes, k in timed] == [
        (True, weights.cfg, list(range(1, 10)), {"context": 64, "sampling": mode})
        for mode in (None, sampling)]


def test_played_speedup_reads_kangaroos_own_row_at_any_exit(model):
    """`played_speedup` on a real `ForcedPlays` for Kangaroo at exit 2 reads its own runs'
    one row (`FORCED_ROW`), whatever its exit: the played tau is its runs' own and the
    round Kangaroo's at exit 2. Catches the row read at the drafter's exit (an IndexError
    from exit 2 on: the own runs hold one row) and a round priced at exit 1."""
    params, generator, continuations, _ = model
    runs = exit_runs(params, CFG, PROMPTS, continuations)
    forced = ForcedPlays(generator, params)
    report = types.SimpleNamespace(runs=runs, loop=object(), costs=ADAPTER_COSTS,
                                   layer_kinds=CFG.layer_kinds,
                                   round_speedup=lambda tau, pieces: (tau, pieces))
    drafter = Kangaroo(EXIT, Chain(3))
    chain = StaticTree.from_branching((1, 1, 1))
    tau, pieces = tuner.played_speedup(report, CFG, drafter, forced)
    assert tau == pytest.approx(forced(drafter, runs).tree_tau(tuner.FORCED_ROW, chain))
    assert tau != pytest.approx(runs.tree_tau(EXIT, chain))  # the exit's own: teeth
    assert pieces == pytest.approx(
        ADAPTER_COSTS.tree_round(CFG.layer_kinds, EXIT, chain, adapter=True))


def test_a_round_speed_up_is_taken_end_to_end_through_the_calibrated_loop():
    """On a report with runs and a calibrated loop, `round_speedup` (a played tree's or a
    played drafter's) maps the pieces by the loop's line and takes the whole call's
    speed-up, prefill included, as the chains' `speedup` does: a chain's tree gives the
    chain's figure. Catches played rounds left as decoding alone while chains are end to
    end (the tuner would rank them on different scales)."""
    runs = ExitRuns((np.array([[0, 1, 1, 0, 1, 1]] * 4, bool),),
                    ranks=(np.array([[1, 0, 0, 2, 0, 0]] * 4),))
    loop = LoopCalibration(token_seconds=3.0, prefill_seconds=2.0, scale=0.5, overhead=1.0,
                           exit_layer=2, points=((2, 9.0, 8.0, 2.0),))
    report = DraftExitReport(ExitReport(loss=(1.0,) * 4, accuracy=(0.5,) * 4,
                                        agreement=(0.5,) * 4, tokens=10),
                             ADAPTER_COSTS, CFG.layer_kinds, num_draft=(3,), runs=runs,
                             loop=loop)
    chain = StaticTree.from_branching((1, 1, 1))
    assert report.tree_speedup(2, chain) == pytest.approx(report.speedup(2, 3))
    pieces = ADAPTER_COSTS.tree_round(CFG.layer_kinds, 2, chain, adapter=True)
    decode = 2.0 * 3.0 / (0.5 * pieces + 1.0)
    assert report.round_speedup(2.0, pieces) == pytest.approx(
        loop.end_to_end(decode, 1, runs.positions))
    assert report.round_speedup(2.0, pieces) != pytest.approx(decode)


def test_the_adapter_is_timed_on_n_tokens_after_the_context(monkeypatch):
    """The adapter's timed call (`_adapter_loop`) runs its block on n new tokens at
    positions context .. context + n - 1 of a K/V cache of context + n slots, as a layer
    piece runs. Catches it timed on one token at every size, over an empty cache, or with
    no room for the new tokens (the write then clamped)."""
    seen = []

    def spy(adapter, cfg, hidden, kv, slots, positions, mask):
        jax.debug.callback(lambda p: seen.append((hidden.shape[1], kv.k.shape[1],
                                                  np.asarray(p)[0].tolist())), positions)
        return hidden, kv

    monkeypatch.setattr(layer_costs_module, "run_adapter_cached", spy)
    monkeypatch.setattr(layer_costs_module, "time_interleaved",
                        lambda calls, items, count: ({key: [[1.0] * count] for key in calls},
                                                     {}))
    params = damped_params(CFG, jax.random.PRNGKey(0), 0.5)
    measure_costs(params, CFG, [3], context=4, repeats=1, inner=1,
                  adapter=init_adapter(params, CFG, 1))
    assert sorted(set(map(lambda s: (s[0], s[1], tuple(s[2])), seen))) == [
        (1, 5, (4,)), (3, 7, (4, 5, 6))]


def test_the_tuners_report_times_the_loaded_adapter(model, monkeypatch, base_workdir):
    """`model.tune` with Kangaroo's weights loaded and among the strategies hands the adapter
    through its report (`_tune_report`, `_workload_report`, `model_exit_report`) to
    `measure_costs`. Catches the adapter dropped on the way (Kangaroo then silently
    probed: its rounds cannot be priced)."""
    class Stop(Exception):
        pass

    def measured(params, cfg, sizes, **options):
        raise Stop(options.get("adapter"))

    monkeypatch.setattr(exit_report_module, "measure_costs", measured)
    loaded = specjax.load(base_workdir)
    adapter = init_adapter(loaded._loaded.params, loaded.config, 1)
    loaded._loaded = dataclasses.replace(loaded._loaded, draft_weights={
        "kangaroo": DraftWeights(adapter, exit_layer=1)})
    with pytest.raises(Stop) as stopped:
        loaded.tune(["def f("], strategies=["selfspec", "kangaroo"], num_draft=[2], trees=[],
                    exits=1, write=False)
    assert stopped.value.args[0] is adapter


def test_the_costs_line_shows_the_adapters_own_times():
    """The report's costs line names the adapter's own seconds (1.0 ms on one token, 5.0 ms
    on 9), not another piece's. Catches the head's times printed as the adapter's."""
    report = DraftExitReport(ExitReport(loss=(1.0,) * 4, accuracy=(0.5,) * 4,
                                        agreement=(0.5,) * 4, tokens=10),
                             dataclasses.replace(ADAPTER_COSTS, adapter={
                                 n: 1e-3 * (1.0 + 0.5 * (n - 1)) for n in range(1, 10)}),
                             CFG.layer_kinds, num_draft=(8,))
    assert "kangaroo adapter 1.000 ms (1 token) / 5.000 ms (9 tokens)" in report.table()


def test_a_hybrid_draft_models_forced_drafts_are_its_own_forward_pass():
    """A Mamba-2 / attention draft model's teacher-forced drafts (`DraftModel.forced_logits`,
    run as a prefill of its cache) equal its plain uncached `model.forward` over the text at
    every position read. Catches the prefill told its rows hold no tokens (prompt lengths
    0): attention layers still write every slot, but a state-space layer then never updates
    its state (argmax agreement fell to 81%)."""
    cfg = ModelConfig(**{**TINY_MODEL, "init_std": 0.3, "num_layers": 2,
                         "layer_pattern": ("mamba2", "attention"),
                         "ssm": SsmConfig(num_heads=4, head_dim=8, state_size=8, groups=2,
                                          chunk_size=4)})
    params = init_params(cfg, jax.random.PRNGKey(5))
    tokens = jax.random.randint(jax.random.PRNGKey(6), (2, 16), 0, cfg.vocab_size)
    at = jnp.asarray([[3, 7, 14], [0, 9, 13]], jnp.int32)
    ctx = DraftContext(params={}, draft_params=unstack_layers(params, cfg), sampling=None,
                       cfg=CFG)
    forced = DraftModel(Chain(2), cfg=cfg).forced_logits(ctx, tokens, None, at)
    plain = jnp.take_along_axis(M.forward(params, cfg, tokens), at[..., None], axis=1)
    np.testing.assert_allclose(forced, plain, atol=2e-4, rtol=1e-4)
