"""What compiles: prompt widths and token budgets bucketed (`engine.bucket`), the budget traced
so that budgets in a bucket share one program and still stop each row exactly, batch sizes
bucketed (`engine.batch_bucket`) with padding rows that change nothing, and JAX's persistent
compilation cache on by default (`specjax.compilation_cache`)."""

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from specjax import compilation_cache
from specjax.config import ModelConfig
from specjax.decoding import engine, loop
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.decoding.engine import Generator, batch_bucket, bucket, budget_bucket
from specjax.decoding.sampling import SamplingParams
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.decoding.stop_strings import StopStrings
from tests.support import ROOT
from tests.support.decoding import per_step_argmax
from tests.support.models import damped_params
from tests.support.scripts import script_env

CFG = ModelConfig(vocab_size=64, d_model=32, num_layers=3, num_heads=4, num_kv_heads=2,
                  mlp_dim=64, init_std=0.3)


@pytest.fixture(scope="module")
def generator():
    return Generator(damped_params(CFG, jax.random.PRNGKey(0), 0.3), CFG)


def test_the_bucket_ladder_by_hand():
    """Powers of two and 1.5x between, from the smallest. Catches a bucket smaller than the
    size it must hold (an off-by-one at a boundary) and a ladder that skips its 1.5x steps."""
    assert [bucket(n) for n in (1, 16, 17, 24, 25, 33, 48, 49, 97, 1000)] == \
        [16, 16, 24, 24, 32, 48, 48, 64, 128, 1024]
    assert [bucket(n, 32) for n in (1, 32, 33, 48, 49, 100)] == [32, 32, 48, 48, 64, 128]


def test_the_budget_ladder_by_hand():
    """64, then powers of two: budgets 1 to 256 share 3 programs. Catches a buffer smaller than
    its budget (an off-by-one at a power of two) and the prompts' 1.5x ladder used for budgets
    (5 programs for a session's 1 to 256)."""
    assert [budget_bucket(n) for n in (1, 64, 65, 96, 128, 129, 256, 257)] == \
        [64, 64, 128, 128, 128, 256, 256, 512]


def test_the_batch_ladder_by_hand():
    """1, 2, 4, 8, then multiples of 8, rounded up to a mesh's row split. Catches a bucket
    smaller than the batch (rows dropped), a ladder without its multiples of 8 (a batch of 33
    run at 64) and a bucket a mesh's data x fsdp does not divide (rows left unsplit)."""
    assert [batch_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 33)] == \
        [1, 2, 4, 4, 8, 8, 16, 16, 24, 40]
    assert [batch_bucket(n, 4) for n in (1, 3, 5, 9)] == [4, 4, 8, 16]
    assert batch_bucket(9, 3) == 18


STRATEGIES = [SelfSpeculative(1, Chain(4)),
              SelfSpeculative(1, StaticTree.from_branching((2, 2, 1)))]


@pytest.mark.parametrize("strategy", STRATEGIES, ids=["chain", "tree"])
def test_padding_rows_change_nothing_in_the_real_rows(generator, strategy, monkeypatch):
    """3 prompts run as 4 (one padding row), greedy with a stop string and sampled, both with
    log-probabilities: tokens, stats and traces equal the unpadded run's (batch buckets off;
    log-probabilities within fp32 rounding, as XLA compiles batches of 3 and 4 to different
    kernels), the stop cuts row 1 short and every greedy row starts as the per-step argmax.
    Catches real rows sliced wrongly (or a padding row returned as a fourth), a stop table
    whose rows no longer match the prompts, and draws that shift with the batch size."""
    prompts = [[1, 2, 3, 4, 5], [9, 8, 7], [4, 4, 6, 1]]
    reference = per_step_argmax(generator, prompts, 12)
    table = [bytes([97 + i % 26]) for i in range(CFG.vocab_size)]
    stop = StopStrings((table[reference[1][4]] + table[reference[1][5]]).decode(), table)
    calls = [dict(stop=stop), dict(seed=3, sampling=SamplingParams.create(0.8, top_k=20))]

    def decode() -> list:
        return [generator.generate(prompts, max_new_tokens=12, strategy=strategy,
                                   logprobs=True, **call) for call in calls]

    padded = decode()
    greedy = padded[0].tokens
    assert [row[:len(got)] for row, got in zip(reference, greedy, strict=True)] == greedy
    assert len(greedy[1]) <= 6
    monkeypatch.setattr(engine, "batch_bucket", lambda size, multiple=1: size)
    for got, want in zip(padded, decode(), strict=True):
        assert (got.tokens, got.stats) == (want.tokens, want.stats)
        for row, expected in zip(got.trace, want.trace, strict=True):
            assert row.keys() == expected.keys()
            for name, values in row.items():
                np.testing.assert_allclose(values, expected[name], atol=1e-5)
                assert name == "logprob" or values == expected[name]


def test_batch_sizes_in_a_bucket_share_a_program(generator, monkeypatch):
    """Batch sizes 3 then 4 (bucket 4), greedy: one program, every row holds the per-step
    argmax's tokens, and the padding row of the 3 ran no round. Catches the batch size still
    compiled as it is (a program per size, as every notebook cell with another number of
    prompts paid) and a padding row decoded like a real one (its rounds cost the real rows'
    time while they wait for it)."""
    prompts = [[1, 2, 3, 4, 5], [9, 8, 7], [4, 4, 6, 1], [2, 7]]
    reference = per_step_argmax(generator, prompts, 8)
    strategy = STRATEGIES[0]
    assert generator.generate(prompts[:3], max_new_tokens=8, strategy=strategy).tokens == \
        reference[:3]
    compiled = loop.generate_tokens._cache_size()
    with monkeypatch.context() as patch:
        patch.setattr(engine, "real_rows", lambda output, count: output)
        padding = generator.run(prompts[:3], max_new_tokens=8, strategy=strategy)
    assert (int(padding.num_tokens[3]), int(padding.stats.rounds[3])) == (1, 0)
    assert generator.generate(prompts, max_new_tokens=8, strategy=strategy).tokens == reference
    assert loop.generate_tokens._cache_size() == compiled


@pytest.mark.parametrize("strategy", STRATEGIES, ids=["chain", "tree"])
def test_budgets_in_a_bucket_share_a_program_and_stop_exactly(generator, strategy):
    """max_new_tokens 32, then 33, 47 and 5 (one bucket), on prompts of 5 and 9 tokens (one
    width): one program, and each row holds exactly its budget's tokens, the per-step argmax's
    first ones. Catches a static budget (a compile per value, as 32 -> 33 took 5.5 s) and a
    traced one that a round overshoots (a round of K + 1 tokens past the budget)."""
    prompts = [[1, 2, 3, 4, 5], [9, 8, 7, 6, 5, 4, 3, 2, 1]]
    reference = per_step_argmax(generator, prompts, 47)
    generator.generate(prompts, max_new_tokens=32, strategy=strategy)
    compiled = loop.generate_tokens._cache_size()
    for budget in (33, 47, 5, 32):
        out = generator.generate(prompts, max_new_tokens=budget, strategy=strategy)
        assert out.tokens == [row[:budget] for row in reference]
    assert loop.generate_tokens._cache_size() == compiled


def test_the_compilation_cache_is_on_by_default_and_can_be_turned_off(tmp_path):
    """A process that decodes writes its programs to $SPECJAX_CACHE_DIR; =off writes none.
    Catches the cache left off (every notebook session compiling from scratch) and a switch
    that does not turn it off."""
    script = textwrap.dedent("""
        import jax
        from specjax.config import ModelConfig
        from specjax.decoding.engine import Generator
        from specjax.model import init_params
        cfg = ModelConfig(vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                          mlp_dim=64)
        Generator(init_params(cfg, jax.random.PRNGKey(0)), cfg).generate([[1, 2]],
                                                                         max_new_tokens=4)
        print(jax.config.jax_compilation_cache_dir)
    """)
    folder = tmp_path / "cache"
    for value, expected in ((str(folder), str(folder)), ("off", "")):
        env = script_env(SPECJAX_CACHE_DIR=value, JAX_COMPILATION_CACHE_DIR="")
        done = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == expected
    assert os.listdir(folder)  # the first run's programs


def test_a_budget_that_fits_the_cache_when_its_bucket_does_not_still_decodes(generator):
    """A 5-token prompt (width 32) with max_new_tokens 17 and 4 drafted nodes needs 53 slots,
    its bucket (64) 100: under max_cache_len 56 the loop compiles at the budget itself and
    emits the per-step argmax's 17 tokens; 21 (57 slots) is refused. Catches the fall-back
    to the budget dropped (a request that fits refused because its bucket does not)."""
    tight = Generator(generator.params, CFG, max_cache_len=56)
    prompts, strategy = [[1, 2, 3, 4, 5]], SelfSpeculative(1, Chain(4))
    out = tight.generate(prompts, max_new_tokens=17, strategy=strategy)
    assert out.tokens == per_step_argmax(generator, prompts, 17)
    with pytest.raises(ValueError, match="= 57 exceeds the cache limit max_cache_len=56"):
        tight.generate(prompts, max_new_tokens=21, strategy=strategy)


def test_a_budget_of_one_token_runs_no_round(generator):
    """max_new_tokens 1: each row holds the prefill's token (the argmax's first) and no round
    runs, none drafted. Catches the prefill's `limit <= 1` check left out: a round drafts
    and verifies, then keeps nothing (its stats count work that emitted no token)."""
    prompts = [[1, 2, 3, 4, 5], [9, 8, 7]]
    out = generator.generate(prompts, max_new_tokens=1, strategy=SelfSpeculative(1, Chain(4)))
    assert out.tokens == per_step_argmax(generator, prompts, 1)
    assert [(s.rounds, s.drafted) for s in out.stats] == [(0, 0), (0, 0)]


def test_a_cache_folder_configured_in_jax_is_kept(monkeypatch):
    """With `jax_compilation_cache_dir` set (this test process sets it) `enable` keeps that
    folder whatever $SPECJAX_CACHE_DIR says. Catches the user's own JAX setting overwritten
    by specjax's folder."""
    configured = jax.config.jax_compilation_cache_dir
    assert configured
    monkeypatch.setenv("SPECJAX_CACHE_DIR", "/nonexistent/specjax-cache")
    try:
        assert compilation_cache.enable() == configured
    finally:
        changed = jax.config.jax_compilation_cache_dir
        jax.config.update("jax_compilation_cache_dir", configured)
    assert changed == configured
