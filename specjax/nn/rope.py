"""Rotary position embeddings (rotate-half convention of HF Llama), scaled as Llama-3's or
linearly, on all of each head's channels or the first `ModelConfig.rotary_dim` (partial
rotation, as in Bamba)."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig, RopeScaling


class Rope(NamedTuple):
    """cos and sin tables for one call, [B, T, rotary_dim // 2], float32."""

    cos: jax.Array
    sin: jax.Array


def inverse_frequencies(cfg: ModelConfig, theta: float | None = None) -> np.ndarray:
    """The per-pair rotation frequencies, float32, scaled as configured (`RopeScaling`);
    `theta`: another base, unscaled (Gemma-3's sliding layers)."""
    dim = cfg.rotary_dim
    base = theta or cfg.rope_theta
    inv_freq = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    inv_freq = inv_freq.astype(np.float32)
    if cfg.rope_scaling is not None and theta is None:
        inv_freq = (_llama3_scale(inv_freq, cfg.rope_scaling)
                    if cfg.rope_scaling.rope_type == "llama3" else
                    inv_freq / np.float32(cfg.rope_scaling.factor))
    return inv_freq


def _llama3_scale(inv_freq: np.ndarray, s: RopeScaling) -> np.ndarray:
    """Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated."""
    low_freq_wavelen = s.original_max_position / s.low_freq_factor
    high_freq_wavelen = s.original_max_position / s.high_freq_factor
    wavelen = 2 * np.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


def rope_tables(cfg: ModelConfig, positions: jax.Array, theta: float | None = None) -> Rope:
    """cos/sin for integer positions [B, T] (`theta`: as in `inverse_frequencies`)."""
    angles = (positions.astype(jnp.float32)[..., None]
              * jnp.asarray(inverse_frequencies(cfg, theta)))
    return Rope(jnp.cos(angles), jnp.sin(angles))


def apply_rope(x: jax.Array, rope: Rope | None) -> jax.Array:
    """Rotates the first 2 * (the tables' width) channels of x [B, T, *heads, head_dim] by the
    tables of `rope`; the other channels pass unchanged (all of them where `rope` is None: a
    NoPE layer's)."""
    if rope is None:
        return x
    extra = (1,) * (x.ndim - 3)
    cos = rope.cos.reshape(rope.cos.shape[:2] + extra + rope.cos.shape[2:]).astype(x.dtype)
    sin = rope.sin.reshape(rope.sin.shape[:2] + extra + rope.sin.shape[2:]).astype(x.dtype)
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)
