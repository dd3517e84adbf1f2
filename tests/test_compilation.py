"""What compiles: prompt widths and token budgets bucketed (`engine.bucket`), the budget traced
so that budgets in a bucket share one program and still stop each row exactly, and JAX's
persistent compilation cache on by default (`specjax.compilation_cache`)."""

import os
import subprocess
import sys
import textwrap

import jax
import pytest

from specjax import compilation_cache
from specjax.config import ModelConfig
from specjax.decoding import loop
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.decoding.engine import Generator, bucket
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.static_tree import StaticTree
from tests.conftest import ROOT, damped_params, per_step_argmax, script_env

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
    assert [bucket(n, 64) for n in (1, 32, 33, 64, 65, 100)] == [64, 64, 64, 64, 96, 128]


@pytest.mark.parametrize("strategy", [SelfSpeculative(1, Chain(4)),
                                      SelfSpeculative(1, StaticTree.from_branching((2, 2, 1)))],
                         ids=["chain", "tree"])
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
    """A 5-token prompt (width 16) with max_new_tokens 17 and 4 drafted nodes needs 37 slots,
    its bucket (24) 44: under max_cache_len 40 the loop compiles at the budget itself and
    emits the per-step argmax's 17 tokens; 21 (41 slots) is refused. Catches the fall-back
    to the budget dropped (a request that fits refused because its bucket does not)."""
    tight = Generator(generator.params, CFG, max_cache_len=40)
    prompts, strategy = [[1, 2, 3, 4, 5]], SelfSpeculative(1, Chain(4))
    out = tight.generate(prompts, max_new_tokens=17, strategy=strategy)
    assert out.tokens == per_step_argmax(generator, prompts, 17)
    with pytest.raises(ValueError, match="= 41 exceeds the cache limit max_cache_len=40"):
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
