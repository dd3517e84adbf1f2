"""The bench's bandwidth references (what one decode step reads, the matrix-product ceiling),
its interleaved timing, its sampled runs over several seeds and its refusal of sweeps past the
machine's limit on memory mappings."""

import dataclasses
import warnings
from collections import Counter
from types import SimpleNamespace

import jax
import pytest

from specjax import mappings
from specjax.config import ModelConfig
from specjax.decoding.drafters.calm import Calm
from specjax.decoding.drafters.calm_exit import EarlyExit
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.decoding.engine import AUTOREGRESSIVE, Generator, RowStats
from specjax.decoding.sampling import SamplingParams
from specjax.decoding.shapes.chain import Chain
from specjax.model import init_params, unstack_layers
from specjax.timing import time_interleaved
from specjax.tools import bench
from specjax.tools.bench import (
    StrategyResult,
    decode_matrices,
    decode_step_bytes,
    matvec_bandwidth,
    run_benchmark,
)
from tests.support.models import TINY_MODEL

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out


@pytest.mark.parametrize("tie", [True, False])
def test_decode_matrices_are_every_weight_matrix_a_step_reads(tiny_cfg, tie):
    cfg = dataclasses.replace(tiny_cfg, tie_embeddings=tie)
    params = unstack_layers(init_params(cfg, jax.random.PRNGKey(0)), cfg)
    products = decode_matrices(params, cfg)
    all_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(params))
    vector_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(params) if leaf.ndim == 1)
    gathered_only = 0 if tie else params["embed"].nbytes
    assert sum(m.nbytes for m, _ in products) == all_bytes - vector_bytes - gathered_only
    row = 0 if tie else cfg.d_model * params["embed"].dtype.itemsize
    assert decode_step_bytes(params, cfg, context=0) == all_bytes - gathered_only + row
    # The input length of each product is what the model feeds it: d_model into qkv, gate/up
    # and the head, the attention heads into out, the MLP hidden state into down.
    inputs = Counter(m.shape[0] if leading else m.shape[1] for m, leading in products)
    layers, heads = cfg.num_layers, cfg.num_heads * cfg.head_dim
    expected = Counter({cfg.d_model: 2 * layers + 1}) + Counter({heads: layers})
    assert inputs == expected + Counter({cfg.mlp_dim: layers})


@pytest.mark.parametrize("tie", [True, False])
def test_a_batched_step_reads_the_weights_once_and_each_rows_cache(tiny_cfg, tie):
    """Catches the bench's bandwidth line charging a batch-8 step the weights eight times
    (it printed 674% of the GPU's bandwidth at batch 8): a step of B rows reads every weight
    once, and B caches (and B gathered embedding rows when untied)."""
    cfg = dataclasses.replace(tiny_cfg, tie_embeddings=tie)
    params = unstack_layers(init_params(cfg, jax.random.PRNGKey(0)), cfg)
    context = 40
    kv_row = 2 * cfg.num_layers * context * cfg.num_kv_heads * cfg.head_dim * 4  # fp32 K and V
    row = 0 if tie else cfg.d_model * params["embed"].dtype.itemsize
    one, eight = (decode_step_bytes(params, cfg, context, batch) for batch in (1, 8))
    assert eight - one == 7 * (kv_row + row)


def test_matvec_bandwidth_is_a_positive_rate(tiny_cfg, tiny_params):
    assert matvec_bandwidth(unstack_layers(tiny_params, tiny_cfg), tiny_cfg, steps=2, repeats=1) > 0


def test_matvec_bandwidth_is_steps_times_the_matrix_bytes_over_the_best_scripted_time(
        tiny_cfg, tiny_params, monkeypatch):
    """The matrix-product ceiling under scripted seconds (0.5, 0.25, 0.4 s) is steps x every
    weight matrix's bytes (tied embedding, no Mamba-2: every leaf of 2+ dimensions) over the
    best, 0.25 s. Catches the rate dropping `steps *` (one pass's bytes over the whole loop's
    time: a ceiling `steps` times too low)."""
    seconds = iter([0.5, 0.25, 0.4])
    monkeypatch.setattr(bench, "timed", lambda fn: (fn(), next(seconds))[1])
    params = unstack_layers(tiny_params, tiny_cfg)
    matrix_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(params) if leaf.ndim >= 2)
    assert tiny_cfg.tie_embeddings
    rate = matvec_bandwidth(params, tiny_cfg, steps=7, repeats=3)
    assert rate == pytest.approx(7 * matrix_bytes / 0.25, rel=1e-12)


@pytest.mark.parametrize("rows, n, fraction", [
    ([[1, 2, 3, 4, 5]], 4, 1.0),             # 2 grams, both distinct
    ([[1, 2, 3, 4]], 4, 1.0),                # exactly one gram
    ([[1, 2, 3]], 4, 0.0),                   # too short for any gram: no row counted
    ([[1, 2, 1, 2, 1, 2]], 2, 2 / 5),        # (1,2) (2,1) (1,2) (2,1) (1,2)
    ([[7, 7, 7, 7, 7], [1, 2, 3]], 2, (1 / 4 + 2 / 2) / 2),  # a loop and a varied row
])
def test_distinct_ngram_fraction_counts_every_gram_by_hand(rows, n, fraction):
    """Unique n-grams over all n-grams of each row, averaged over rows, as counted by hand.
    Catches the last n-gram of each row dropped (`len(row) - n` starts: a row of exactly n
    tokens reads as no text, and a loop's fraction comes out too high)."""
    assert bench.distinct_ngram_fraction(rows, n=n) == pytest.approx(fraction, rel=1e-12)


def test_time_left_extrapolates_the_remaining_steps_on_a_scripted_clock(monkeypatch):
    """On a clock reading 110 s, one of four steps begun at 100 s leaves 3 x 10 s = 30 s; one
    of four begun at 10 s leaves 300 s, printed in minutes; all done is "done". Catches the
    time left extrapolated over all `total` steps instead of the `total - done` remaining."""
    from specjax import timing

    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: 110.0))
    assert timing.time_left(100.0, 1, 4) == "about 30 s left"
    assert timing.time_left(10.0, 1, 4) == "about 5 min left"
    assert timing.time_left(100.0, 4, 4) == "done"


def test_time_interleaved_runs_calls_in_turn_per_item_and_repeat():
    order = []
    calls = {name: lambda item, name=name: order.append((name, item)) or f"{name}{item}"
             for name in ("a", "b")}
    seconds, outputs = time_interleaved(calls, items=2, repeats=3)
    assert order == [("a", 0), ("b", 0), ("a", 1), ("b", 1)] * 3
    assert outputs == {"a": ["a0", "a1"], "b": ["b0", "b1"]}
    assert all(len(per_item) == 3 and min(per_item) >= 0
               for per_call in seconds.values() for per_item in per_call)



def test_time_interleaved_reports_the_repeats_done_after_each():
    """progress(repeats_done) is called once per repeat, after it, with 1, 2, 3 (a count, as
    the progress bar's total is `repeats`), each call after that repeat's items ran. Catches
    the 0-based repeat index passed (0, 1, 2: the bar never reaches its total)."""
    ran, seen = [], []
    calls = {"a": lambda item: ran.append(item)}
    time_interleaved(calls, items=2, repeats=3,
                     progress=lambda done: seen.append((done, len(ran))))
    assert seen == [(1, 2), (2, 4), (3, 6)]

def test_sampled_bench_decodes_every_prompt_once_per_seed(tiny_cfg, tiny_params):
    """Catches seeds that are not passed to the decoder (every seed the same sample: the
    averaging would be a no-op) or that are dropped from the totals; greedy runs refuse them."""
    generator = Generator(tiny_params, tiny_cfg)
    sampling, prompts = SamplingParams.create(temperature=1.0), [[1, 2, 3], [4, 5]]
    [result] = run_benchmark(generator, {"ar": AUTOREGRESSIVE}, prompts, max_new_tokens=8,
                             repeats=1, sampling=sampling, seeds=2)
    assert result.rows == 4 and result.tokens == 4 * 8
    expected = [generator.generate([prompt], max_new_tokens=8, sampling=sampling,
                                   seed=seed).tokens[0] for seed in (0, 1) for prompt in prompts]
    assert result.generated == expected and expected[0] != expected[2]
    with pytest.raises(ValueError, match="and 1 for greedy decoding"):
        run_benchmark(generator, {"ar": AUTOREGRESSIVE}, prompts, max_new_tokens=8, seeds=2)


class _FakeMappings:
    """Memory mappings as XLA:CPU makes them, scripted: each compiled program maps `per` more,
    and `jax.clear_caches` unmaps them all (the real ones: see the test below)."""

    def __init__(self, monkeypatch, per: int, limit: int):
        self.count, self.per, self.compiles, self.clears = 1000, per, [], 0
        compile_program = Generator.compile

        def compile_counted(generator, *args, **kwargs):
            self.count += self.per
            self.compiles.append(kwargs["strategy"])
            return compile_program(generator, *args, **kwargs)

        def clear():
            self.count, self.clears = 1000, self.clears + 1

        monkeypatch.setattr(Generator, "compile", compile_counted)
        monkeypatch.setattr(bench.jax, "clear_caches", clear)
        monkeypatch.setattr(mappings, "mappings", lambda: self.count)
        monkeypatch.setattr(mappings, "mapping_limit", lambda: int(limit / mappings.MARGIN))


def test_a_sweep_past_the_mapping_limit_runs_in_groups_each_timed_with_the_baseline(
        tiny_cfg, tiny_params, monkeypatch):
    """XLA:CPU maps each compiled program in pieces, and a process past `vm.max_map_count`
    crashes mid-compile (SmolLM2's sweep of 10 strategies over 8 prompt widths needed 70,255 of
    65,530). With room for the baseline and one strategy (a program each), a sweep of three
    runs as two groups: the first timed and released before the second compiles, the baseline
    compiled again and timed with each. Catches a sweep left to crash, programs kept after
    their group (the second group maps on top), a group timed without the baseline, and a
    speed-up over a baseline timed in another group."""
    generator = Generator(tiny_params, tiny_cfg)
    strategies = {"ar": AUTOREGRESSIVE, "chain": SelfSpeculative(1, Chain(2)),
                  "chain3": SelfSpeculative(1, Chain(3))}
    prompts = [[1, 2, 3]]
    whole = run_benchmark(generator, strategies, prompts, max_new_tokens=5, repeats=1)
    fake = _FakeMappings(monkeypatch, per=100, limit=1000 + 2 * 100 + 50)
    timed_groups = []
    recording = time_interleaved

    def time_recorded(calls, *args, **kwargs):
        timed_groups.append(sorted({k if isinstance(k, str) else k[0] for k in calls}))
        return recording(calls, *args, **kwargs)

    monkeypatch.setattr(bench, "time_interleaved", time_recorded)
    grouped = run_benchmark(generator, strategies, prompts, max_new_tokens=5, repeats=1)
    assert timed_groups == [["ar", "chain"], ["ar", "chain3"]] and fake.clears == 1
    assert [s.label() for s in fake.compiles] == ["ar", "selfspec E=1 K=2", "ar",
                                                  "selfspec E=1 K=3"]
    assert [r.generated for r in grouped] == [r.generated for r in whole]
    assert all(r.speedup > 0 and r.baseline_tokens_per_second > 0 for r in grouped)
    ar = grouped[0]
    assert ar.speedup == pytest.approx(1.0, rel=0.5)  # its own rate over both groups' ar


def test_speedups_medians_and_prefill_minimums_from_scripted_times(tiny_cfg, tiny_params,
                                                                    monkeypatch):
    """Scripted times for the two groups of a sweep (the arithmetic is the reference): a
    strategy's speed-up is over the baseline of its own group (2.0 for `chain` in the first,
    where ar's median is 2; over ar pooled from both groups it would be 3.0), a time is the
    median of the repeats (a mean would count the outliers) and the prefill the fastest. Catches
    a speed-up over the pooled baseline or inverted, a mean for a median, a median for a
    minimum."""
    generator = Generator(tiny_params, tiny_cfg)
    strategies = {"ar": AUTOREGRESSIVE, "chain": SelfSpeculative(1, Chain(2)),
                  "chain3": SelfSpeculative(1, Chain(3))}
    _FakeMappings(monkeypatch, per=100, limit=1000 + 2 * 100 + 50)
    scripted = iter([
        {"ar": [2, 2, 10], ("ar", "prefill"): [0.5, 0.3, 0.9],
         "chain": [1, 1, 5], ("chain", "prefill"): [0.2, 0.6, 0.6]},
        {"ar": [3, 3, 3], ("ar", "prefill"): [0.4, 0.4, 0.4],
         "chain3": [1, 8, 2], ("chain3", "prefill"): [0.3, 0.2, 0.1]}])

    def scripted_times(calls, items, repeats, progress=None):
        _, outputs = time_interleaved(calls, items, 1)
        times = next(scripted)
        return {key: [list(map(float, times[key]))] for key in calls}, outputs

    monkeypatch.setattr(bench, "time_interleaved", scripted_times)
    ar, chain, chain3 = run_benchmark(generator, strategies, [[1, 2, 3]], max_new_tokens=5,
                                      repeats=3)
    assert (ar.seconds, chain.seconds, chain3.seconds) == (3.0, 1.0, 2.0)
    assert (ar.prefill_seconds, chain.prefill_seconds, chain3.prefill_seconds) == (0.3, 0.2, 0.1)
    assert chain.speedup == pytest.approx(2.0) and chain3.speedup == pytest.approx(1.5)
    assert ar.speedup == pytest.approx(1.0)


def test_a_strategy_that_cannot_fit_beside_the_baseline_is_refused(tiny_cfg, tiny_params,
                                                                   monkeypatch):
    """With room for the baseline only, the sweep is refused after the baseline compiles,
    naming the limit and the way to raise it, rather than crashing in the next compile."""
    generator = Generator(tiny_params, tiny_cfg)
    _FakeMappings(monkeypatch, per=100, limit=1000 + 1 * 100 + 50)
    progress = []
    with pytest.raises(ValueError, match=r"compiling a strategy beside the baseline would leave "
                                         r"this process about 1,200 memory mappings, more than "
                                         r"90% of the 1,277 the machine allows"):
        run_benchmark(generator, {"ar": AUTOREGRESSIVE, "chain": SelfSpeculative(1, Chain(2))},
                      [[1, 2, 3]], max_new_tokens=5, repeats=1, progress=progress.append)
    assert len(progress) == 1 and progress[0].startswith("compiled ar")


def test_clearing_jax_caches_unmaps_a_released_program(tiny_cfg, tiny_params):
    """What the grouped sweep relies on: a compiled program's mappings stay while JAX's caches
    hold it (deleting the program object frees none), and `jax.clear_caches` unmaps them.
    Catches a JAX release where this changes, which would make the groups crash again."""
    if mappings.mappings() is None:
        pytest.skip("no /proc here: the check is off")
    generator = Generator(tiny_params, tiny_cfg)
    jax.clear_caches()
    before = mappings.mappings()
    program = generator.compile([[1, 2, 3, 4, 5, 6, 7]], max_new_tokens=7,
                                strategy=SelfSpeculative(1, Chain(5)))
    jax.block_until_ready(program([[1, 2, 3, 4, 5, 6, 7]]))
    mapped = mappings.mappings()
    del program
    jax.clear_caches()
    assert mapped > before and mappings.mappings() < mapped - (mapped - before) // 2


@pytest.mark.parametrize("allowed, room", [(1200, True), (1199, False)])
def test_the_mapping_budget_projects_one_more_unit_at_its_largest(monkeypatch, allowed, room):
    """1,000 mappings at the start, 1,050 after the first unit, 1,150 after the second, 1,100
    now (some released): one more at the largest step (100) makes 1,200. Catches an average
    step, a projection that leaves out what is mapped now; no /proc means room."""
    counts = iter([1000, 1050, 1150, 1100])
    monkeypatch.setattr(mappings, "mappings", lambda: next(counts))
    monkeypatch.setattr(mappings, "mapping_limit", lambda: allowed / mappings.MARGIN)
    budget = mappings.MappingBudget()
    budget.compiled()  # +50
    budget.compiled()  # +100
    assert budget.room_for_another() == room
    monkeypatch.setattr(mappings, "mappings", lambda: None)
    assert mappings.MappingBudget().room_for_another()


def test_the_bench_compiles_every_batch_shape_before_it_times(tiny_cfg, tiny_params,
                                                              monkeypatch):
    """Prompts of two padded widths, in batches of 2 and 1 rows, make shapes with programs of
    their own: all are compiled before the timed repeats. Catches a compile inside a timed call
    (only the first batch warmed: with --repeats 1 the compile was the measurement)."""
    generator = Generator(tiny_params, tiny_cfg)
    compiles = []
    compile_program = Generator.compile
    monkeypatch.setattr(Generator, "compile", lambda *a, **k: compiles.append(1) or
                        compile_program(*a, **k))
    counts = []

    def recording(*args, **kwargs):
        counts.append(len(compiles))
        timed = time_interleaved(*args, **kwargs)
        counts.append(len(compiles))
        return timed

    monkeypatch.setattr(bench, "time_interleaved", recording)
    [result] = run_benchmark(generator, {"ar": AUTOREGRESSIVE}, [[1, 2, 3], [4, 5], [6] * 20],
                             max_new_tokens=6, batch_size=2, repeats=1)
    assert result.rows == 3 and counts[0] == counts[1] == 2  # 2 shapes, each one program


def test_a_lossy_strategys_output_is_reported_as_differing_from_the_baseline():
    """identical_to_baseline is the direct comparison of a strategy's tokens with ar's: CALM
    leaving every token at layer 1 (threshold 0, lossy) on a model whose layer-1 exit
    disagrees with the last layer is False, ar itself True. Catches a strategy's output
    compared with itself (every strategy reported identical to ar)."""
    cfg = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})
    generator = Generator(init_params(cfg, jax.random.PRNGKey(0)), cfg)
    ar, calm = run_benchmark(generator, {"ar": AUTOREGRESSIVE,
                                         "calm": Calm(EarlyExit((1,)), 0.0)},
                             [[1, 2, 3], [4, 5]], max_new_tokens=6, repeats=1)
    assert (ar.name, calm.name) == ("ar", "calm")
    assert calm.generated != ar.generated  # the reference: the tokens compared directly
    assert ar.identical_to_baseline is True and calm.identical_to_baseline is False


def test_decode_tokens_per_second_leaves_out_each_rows_prefill_token():
    """The decode rate by hand: 50 tokens over 2 rows in 3 s, 0.5 s of it the prefill call
    (which makes each row's first token): (50 - 2) / (3 - 0.5) = 19.2 tokens/s; no rate when
    the prefill takes all the time. Catches the rows' first tokens counted as decoded
    (50 / 2.5 = 20)."""
    result = StrategyResult(name="x", tokens=50, rows=2, seconds=3.0, prefill_seconds=0.5,
                            compile_seconds=0.0, stats=RowStats(0, 0, 0), generated=[],
                            distinct_4grams=0.0, identical_to_baseline=None)
    assert result.decode_tokens_per_second == pytest.approx(48 / 2.5) == 19.2
    assert result.tokens_per_second == pytest.approx(50 / 3)
    assert dataclasses.replace(result, prefill_seconds=3.0).decode_tokens_per_second is None


def test_measuring_programs_take_the_weights_as_arguments(tiny_params, tiny_cfg):
    """The bench's timing programs (the verifying pass `pass_seconds`, the exit report's
    `measure_costs`, the matrix-product ceiling) take the weights as arguments. Catches a
    jitted closure over the params: XLA then bakes every weight into each program as a constant
    (on SmolLM2, minutes of constant folding and cache compression after the timed runs)."""
    from specjax.tools.layer_costs import measure_costs
    from specjax.tools.tree_search import pass_seconds

    weights = sum(leaf.nbytes for leaf in jax.tree.leaves(tiny_params))
    generator = Generator(tiny_params, tiny_cfg)
    threshold = jax.config.jax_captured_constants_warn_bytes
    jax.config.update("jax_captured_constants_warn_bytes", weights // 8)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            pass_seconds(generator, (1, tiny_cfg.num_layers), [1, 2], context=8, repeats=1)
            measure_costs(tiny_params, tiny_cfg, [2], context=8, repeats=1, inner=1)
            matvec_bandwidth(tiny_params, tiny_cfg, steps=1, repeats=1)
    finally:
        jax.config.update("jax_captured_constants_warn_bytes", threshold)


def test_a_compiled_program_generates_any_budget_up_to_its_own(tiny_cfg, tiny_params):
    """The bench times its one-token prefill call on the full call's program (its budget is
    traced). Catches a budget the program ignores (the prefill call decoding every token, so
    that decoding alone would time as nothing) and a budget past the program's cache."""
    generator = Generator(tiny_params, tiny_cfg)
    strategy, prompts = SelfSpeculative(1, Chain(2)), [[1, 2, 3], [4, 5]]
    program = generator.compile(prompts, max_new_tokens=6, strategy=strategy)
    for new in (6, 1, 3):
        got = generator.unpack(program(prompts, max_new_tokens=new)).tokens
        assert got == generator.generate(prompts, max_new_tokens=new, strategy=strategy).tokens
        assert [len(row) for row in got] == [new, new]
    with pytest.raises(ValueError, match="this program generates 1 to 6 tokens"):
        program(prompts, max_new_tokens=7)
