"""The readable round (`decoding.loop.decode_round`) pinned where the fresh audit's plants got
past the output-level tests: what a round leaves of a row that is already done."""

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.decoding.drafter import DraftContext
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.decoding.loop import decode_round, prefill
from specjax.decoding.shapes.chain import Chain
from specjax.model import unstack_layers
from tests.support.models import damped_params

CFG = ModelConfig(vocab_size=64, d_model=32, num_layers=3, num_heads=4, num_kv_heads=2,
                  mlp_dim=64, init_std=0.3)


def test_a_round_leaves_a_done_rows_cache_and_output_as_they_were():
    """Two rows, the second a padding row (done from the start, `num_rows` 1): three rounds
    advance the first row's cache length by what each commits (its tokens less the prefill's,
    by hand from the output) and leave the second's at its prompt length, its one token and
    its statistics untouched. Catches a done row's cache length still advanced by every round
    (its later rounds write at clamped slots past its cache, and its attention spans a cache
    that holds nothing new): invisible in any row's tokens."""
    params = unstack_layers(damped_params(CFG, jax.random.PRNGKey(0), 0.3), CFG)
    ctx = DraftContext(params=params, draft_params={}, sampling=None, cfg=CFG)
    drafter = SelfSpeculative(1, Chain(3))
    prompts = jnp.asarray([[1, 2, 3, 4, 5, 0], [7, 8, 0, 0, 0, 0]], jnp.int32)
    lengths = jnp.asarray([5, 2], jnp.int32)
    key = jax.random.PRNGKey(0)
    state = prefill(ctx, drafter, prompts, lengths, key, jnp.asarray([-1]), max_new_tokens=16,
                    cache_len=64, num_rows=jnp.int32(1))
    step = jax.jit(lambda s: decode_round(ctx, drafter, key, jnp.asarray([-1]), s))
    for _ in range(3):
        state = step(state)
    committed = int(state.num_tokens[0]) - 1  # the prefill's token is not in the cache yet
    assert committed >= 3
    np.testing.assert_array_equal(np.asarray(state.cache.lengths), [5 + committed, 2])
    assert int(state.num_tokens[1]) == 1 and int(state.stats.rounds[1]) == 0
