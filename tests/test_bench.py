"""The bench's bandwidth references (what one decode step reads, the matrix-product ceiling),
its interleaved timing and its sampled runs over several seeds."""

import dataclasses
from collections import Counter

import jax
import pytest

from specjax.decoding.bench import (
    bytes_per_token,
    decode_matrices,
    matvec_bandwidth,
    run_benchmark,
)
from specjax.decoding.engine import AUTOREGRESSIVE, Generator
from specjax.decoding.sampling import SamplingParams
from specjax.decoding.timing import time_interleaved
from specjax.model import init_params, unstack_layers


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
