"""Properties of the multi-exit model: layer ranges compose, the cache matches the full forward,
exit L is the model's output, and the cached path accepts any write position per row."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import model as M
from specjax.config import ModelConfig
from tests.support.models import TINY_MODEL

run_layers = jax.jit(M.run_layers, static_argnames=("cfg", "layers"))
run_layers_cached = jax.jit(M.run_layers_cached, static_argnames=("cfg", "layers"))
forward = jax.jit(M.forward, static_argnames="cfg")

VARIANTS = {
    "gqa_tied": dict(TINY_MODEL),
    "mha_untied": dict(TINY_MODEL, num_kv_heads=4, tie_embeddings=False),
    "mqa_headdim": dict(TINY_MODEL, num_kv_heads=1, head_dim=16, rope_theta=500000.0,
                        rope_scaling={"factor": 8.0, "original_max_position": 16}),
}


def _setup(name, batch=3, steps=11):
    cfg = ModelConfig.from_dict(VARIANTS[name])
    params = M.init_params(cfg, jax.random.PRNGKey(1))
    tokens = jax.random.randint(jax.random.PRNGKey(2), (batch, steps), 0, cfg.vocab_size)
    return cfg, params, tokens


@pytest.mark.parametrize("name, splits", [("gqa_tied", (1, 2, 3)), ("mha_untied", (2,)),
                                          ("mqa_headdim", (1,))])
def test_layer_ranges_compose(name, splits):
    cfg, params, tokens = _setup(name)
    hidden = M.embed(params, cfg, tokens)
    full = run_layers(params, cfg, hidden)
    for split in splits:
        first = run_layers(params, cfg, hidden, layers=(0, split))
        second = run_layers(params, cfg, first[-1], layers=(split, cfg.num_layers))
        np.testing.assert_allclose(np.concatenate([first, second]), full, atol=1e-5)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_exit_at_last_layer_is_the_model_output(name):
    cfg, params, tokens = _setup(name)
    per_layer = run_layers(params, cfg, M.embed(params, cfg, tokens))
    assert per_layer.shape[0] == cfg.num_layers
    np.testing.assert_allclose(M.exit_logits(params, cfg, per_layer[cfg.num_layers - 1]),
                               forward(params, cfg, tokens), atol=1e-6)
    # An earlier exit is a different function of the input.
    assert not np.allclose(M.exit_logits(params, cfg, per_layer[0]), forward(params, cfg, tokens))


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_incremental_decoding_matches_full_forward(name):
    """Ragged prefill (rows start at different lengths), then chunks of 1 and 3 tokens."""
    cfg, params, tokens = _setup(name)
    full = forward(params, cfg, tokens)
    decode_params = M.unstack_layers(params, cfg)
    hidden = M.embed(params, cfg, tokens)
    prefill = np.array([2, 5, 1])
    cache = M.allocate_cache(cfg, batch=3, max_len=16)
    _, cache = run_layers_cached(decode_params, cfg, hidden[:, :5], cache,
                                   jnp.zeros(3, jnp.int32))
    cache = cache.commit(jnp.asarray(prefill))
    position = prefill.copy()
    while position.min() < tokens.shape[1]:
        chunk = 3 if position.min() % 2 else 1
        take = np.clip(position[:, None] + np.arange(chunk), 0, tokens.shape[1] - 1)
        out, cache = run_layers_cached(decode_params, cfg,
                                         jnp.take_along_axis(hidden, take[..., None], 1),
                                         cache, jnp.asarray(position, jnp.int32))
        logits = M.exit_logits(params, cfg, out)
        for row in range(3):
            for t in range(chunk):
                if position[row] + t < tokens.shape[1]:
                    np.testing.assert_allclose(logits[row, t], full[row, position[row] + t],
                                               atol=2e-5)
        position = position + chunk
        cache = cache.commit(jnp.asarray(position, jnp.int32))


@pytest.mark.parametrize("split", [1, 2, 3])
def test_cached_layer_ranges_compose(split, tiny_cfg, tiny_params):
    cfg = tiny_cfg
    tokens = jax.random.randint(jax.random.PRNGKey(3), (2, 7), 0, cfg.vocab_size)
    hidden = M.embed(tiny_params, cfg, tokens)
    decode_params = M.unstack_layers(tiny_params, cfg)
    start = jnp.zeros(2, jnp.int32)
    whole, _ = run_layers_cached(decode_params, cfg, hidden, M.allocate_cache(cfg, 2, 8), start)
    cache = M.allocate_cache(cfg, 2, 8)
    low, cache = run_layers_cached(decode_params, cfg, hidden, cache, start, layers=(0, split))
    high, _ = run_layers_cached(decode_params, cfg, low, cache, start,
                                  layers=(split, cfg.num_layers))
    np.testing.assert_allclose(high, whole, atol=1e-6)
    np.testing.assert_allclose(high, run_layers(tiny_params, cfg, hidden)[-1], atol=1e-5)


def test_stale_slots_beyond_the_committed_length_are_invisible(tiny_cfg, tiny_params):
    """Commit by length: garbage written past `write_pos` never changes the result."""
    cfg = tiny_cfg
    decode_params = M.unstack_layers(tiny_params, cfg)
    tokens = jax.random.randint(jax.random.PRNGKey(4), (1, 6), 0, cfg.vocab_size)
    hidden = M.embed(tiny_params, cfg, tokens)
    clean = M.allocate_cache(cfg, 1, 12)
    junk = jax.random.normal(jax.random.PRNGKey(5), (1, 6, cfg.d_model))
    _, dirty = run_layers_cached(decode_params, cfg, junk, M.allocate_cache(cfg, 1, 12),
                                   jnp.array([6]))
    outs = [run_layers_cached(decode_params, cfg, hidden, cache, jnp.array([0]))[0]
            for cache in (clean, dirty)]
    np.testing.assert_array_equal(outs[0], outs[1])


def test_bfloat16_compute_stays_close_to_float32():
    cfg32 = ModelConfig(**TINY_MODEL)
    cfg16 = ModelConfig(**{**TINY_MODEL, "dtype": "bfloat16"})
    params = M.init_params(cfg32, jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(6), (2, 9), 0, cfg32.vocab_size)
    out16 = forward(params, cfg16, tokens)
    assert out16.dtype == jnp.float32
    assert jax.tree.leaves(params)[0].dtype == jnp.float32
    np.testing.assert_allclose(out16, forward(params, cfg32, tokens), atol=0.05)


def test_bad_layer_range_is_an_error(tiny_cfg, tiny_params):
    hidden = jnp.zeros((1, 2, tiny_cfg.d_model))
    with pytest.raises(ValueError, match=r"layer range \(2, 2\)"):
        run_layers(tiny_params, tiny_cfg, hidden, layers=(2, 2))
    with pytest.raises(ValueError, match=r"layer range \(0, 5\)"):
        run_layers(tiny_params, tiny_cfg, hidden, layers=(0, 5))


def test_attention_bias_is_a_parameter_that_changes_the_output():
    cfg = ModelConfig(**{**TINY_MODEL, "attention_bias": True})
    params = M.init_params(cfg, jax.random.PRNGKey(0))
    bias = params["layers"]["attn"]["qkv_bias"]
    assert bias.shape == (cfg.num_layers, cfg.num_kv_heads, cfg.group_size + 2,
                          cfg.head_dim)
    tokens = jnp.arange(6)[None]
    shifted = {**params, "layers": {**params["layers"], "attn": {
        **params["layers"]["attn"], "qkv_bias": bias + 0.5}}}
    assert not np.allclose(forward(params, cfg, tokens), forward(shifted, cfg, tokens))
