"""The bench's bandwidth references (what one decode step reads, the matrix-product ceiling),
its interleaved timing, its sampled runs over several seeds and its refusal of sweeps past the
machine's limit on memory mappings."""

import dataclasses
from collections import Counter

import jax
import pytest

from specjax import mappings
from specjax.decoding import loop
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.decoding.engine import AUTOREGRESSIVE, Generator
from specjax.decoding.sampling import SamplingParams
from specjax.decoding.shapes.chain import Chain
from specjax.model import init_params, unstack_layers
from specjax.timing import time_interleaved
from specjax.tools import bench
from specjax.tools.bench import (
    bytes_per_token,
    decode_matrices,
    matvec_bandwidth,
    run_benchmark,
)

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
    assert bytes_per_token(params, cfg, context=0) == all_bytes - gathered_only + row
    # The input length of each product is what the model feeds it: d_model into qkv, gate/up
    # and the head, the attention heads into out, the MLP hidden state into down.
    inputs = Counter(m.shape[0] if leading else m.shape[1] for m, leading in products)
    layers, heads = cfg.num_layers, cfg.num_heads * cfg.head_dim
    expected = Counter({cfg.d_model: 2 * layers + 1}) + Counter({heads: layers})
    assert inputs == expected + Counter({cfg.mlp_dim: layers})


def test_matvec_bandwidth_is_a_positive_rate(tiny_cfg, tiny_params):
    assert matvec_bandwidth(unstack_layers(tiny_params, tiny_cfg), tiny_cfg, steps=2, repeats=1) > 0


def test_time_interleaved_runs_calls_in_turn_per_item_and_repeat():
    order = []
    calls = {name: lambda item, name=name: order.append((name, item)) or f"{name}{item}"
             for name in ("a", "b")}
    seconds, outputs = time_interleaved(calls, items=2, repeats=3)
    assert order == [("a", 0), ("b", 0), ("a", 1), ("b", 1)] * 3
    assert outputs == {"a": ["a0", "a1"], "b": ["b0", "b1"]}
    assert all(len(per_item) == 3 and min(per_item) >= 0
               for per_call in seconds.values() for per_item in per_call)


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


def test_a_sweep_past_the_machines_mapping_limit_is_refused_before_it_crashes(
        tiny_cfg, tiny_params, monkeypatch):
    """XLA:CPU maps each compiled program in pieces, and a process past `vm.max_map_count`
    crashes mid-compile (a sweep of 19 strategies did after ten minutes). With the limit just
    above what the process maps now, a sweep of three strategies is refused after the first
    compiles, naming the limit and the way to raise it; with the real limit it runs. Catches a
    sweep left to crash."""
    if mappings.mappings() is None or mappings.mapping_limit() is None:
        pytest.skip("no /proc here: the check is off")
    generator = Generator(tiny_params, tiny_cfg)
    strategies = {"ar": AUTOREGRESSIVE, "chain": SelfSpeculative(1, Chain(2)),
                  "chain3": SelfSpeculative(1, Chain(3))}
    prompts, new = [[1, 2, 3]], 5  # programs no other test compiles: the first maps anew
    limit = int((mappings.mappings() + 20) / mappings.MARGIN)
    monkeypatch.setattr(mappings, "mapping_limit", lambda: limit)
    progress = []
    with pytest.raises(ValueError, match=rf"compiling all 3 strategies would leave this process "
                                         rf"about .* of the {limit:,} the machine allows "
                                         r"\(vm.max_map_count"):
        run_benchmark(generator, strategies, prompts, max_new_tokens=new, repeats=1,
                      progress=progress.append)
    assert progress == [progress[0]] and progress[0].startswith("compiled ar")
    monkeypatch.undo()
    assert len(run_benchmark(generator, strategies, prompts, max_new_tokens=new,
                             repeats=1)) == 3


@pytest.mark.parametrize("allowed, refused", [(2000, False), (1900, True)])
def test_the_mapping_budget_projects_the_work_left_at_its_largest_step(monkeypatch, allowed,
                                                                        refused):
    """1,000 mappings at the start, 1,050 after the first of 10 strategies, 1,150 after the
    second: the 8 left at the largest step, 100, make 1,950. Catches an average step (1,750), a
    projection that leaves out what is mapped already (800) and one over all the work (1,230);
    the last strategy done, or no /proc, never raises."""
    counts = iter([1000, 1050, 1150, 1150])
    monkeypatch.setattr(mappings, "mappings", lambda: next(counts))
    monkeypatch.setattr(mappings, "mapping_limit", lambda: allowed / mappings.MARGIN)
    budget = mappings.MappingBudget()
    budget.check(1, 10, "strategies")  # 1,500
    if refused:
        with pytest.raises(ValueError, match="all 10 strategies would leave this process about "
                                             "1,950 memory mappings"):
            budget.check(2, 10, "strategies")
    else:
        budget.check(2, 10, "strategies")
    budget.check(10, 10, "strategies")  # nothing left to compile
    monkeypatch.setattr(mappings, "mappings", lambda: None)
    mappings.MappingBudget().check(1, 10, "strategies")


def test_the_bench_compiles_every_batch_shape_before_it_times(tiny_cfg, tiny_params,
                                                              monkeypatch):
    """Prompts of two padded widths, in batches of 2 and 1 rows, make shapes with programs of
    their own: all are compiled before the timed repeats. Catches a compile inside a timed call
    (only the first batch warmed: with --repeats 1 the compile was the measurement)."""
    generator = Generator(tiny_params, tiny_cfg)
    programs = []

    def recording(*args, **kwargs):
        programs.append(loop.generate_tokens._cache_size())
        timed = time_interleaved(*args, **kwargs)
        programs.append(loop.generate_tokens._cache_size())
        return timed

    monkeypatch.setattr(bench, "time_interleaved", recording)
    [result] = run_benchmark(generator, {"ar": AUTOREGRESSIVE}, [[1, 2, 3], [4, 5], [6] * 20],
                             max_new_tokens=6, batch_size=2, repeats=1)
    assert result.rows == 3 and programs[0] == programs[1]
