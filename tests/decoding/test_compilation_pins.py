"""What compiles, pinned where the fresh audit's plants got past tests/test_compilation.py: a
budget bucket that fills the cache limit exactly."""

import jax

from specjax.config import ModelConfig
from specjax.decoding import loop
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.decoding.engine import MIN_PROMPT_WIDTH, Generator, bucket, budget_bucket
from specjax.decoding.shapes.chain import Chain
from tests.support.decoding import per_step_argmax
from tests.support.models import damped_params

CFG = ModelConfig(vocab_size=64, d_model=32, num_layers=3, num_heads=4, num_kv_heads=2,
                  mlp_dim=64, init_std=0.3)


def test_a_bucket_that_exactly_fills_the_cache_limit_is_used():
    """A 5-token prompt (width 32), 4 drafted nodes and budgets 17 and 40 (bucket 64) under
    max_cache_len = 32 + 64 + 4 = 100: both budgets run one program and emit the per-step
    argmax's tokens. Catches the fit check taken as `>=` (a bucket that fits exactly refused,
    each budget compiled at its own size: a compile per call at the cache limit)."""
    params = damped_params(CFG, jax.random.PRNGKey(0), 0.3)
    strategy, prompts = SelfSpeculative(1, Chain(4)), [[1, 2, 3, 4, 5]]
    assert strategy.shape.num_nodes == 4 and budget_bucket(40) == 64
    tight = Generator(params, CFG, max_cache_len=bucket(5, MIN_PROMPT_WIDTH) + 64 + 4)
    reference = per_step_argmax(tight, prompts, 40)
    assert tight.generate(prompts, max_new_tokens=17, strategy=strategy).tokens == [
        reference[0][:17]]
    compiled = loop.generate_tokens._cache_size()
    assert tight.generate(prompts, max_new_tokens=40, strategy=strategy).tokens == reference
    assert loop.generate_tokens._cache_size() == compiled
