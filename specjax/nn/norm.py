"""RMSNorm, computed in float32 like the Llama reference."""

import flax.linen as nn
import jax
import jax.numpy as jnp

from specjax.config import ModelConfig


class RMSNorm(nn.Module):
    """x / rms(x) * scale; the statistics are float32 whatever the compute dtype."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param("scale", norm_init(self.cfg), (x.shape[-1],), self.cfg.weight_dtype)
        return apply_rms_norm(x, scale, self.cfg)


def norm_init(cfg: ModelConfig) -> nn.initializers.Initializer:
    """Scales that start as the identity: 1, or 0 where the norm scales by 1 + w (Gemma)."""
    return nn.initializers.constant(1.0 - cfg.norm_offset)


def apply_rms_norm(x: jax.Array, scale: jax.Array, cfg: ModelConfig) -> jax.Array:
    """The RMSNorm math on its own, shared by the layers and the exit head. With a
    `norm_offset` (Gemma's 1 + w) the scaling is float32 too, as in Gemma's reference."""
    xf = x.astype(jnp.float32)
    normed = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + cfg.norm_eps)
    if cfg.norm_offset:
        return ((cfg.norm_offset + scale.astype(jnp.float32)) * normed).astype(cfg.compute_dtype)
    return scale.astype(cfg.compute_dtype) * normed.astype(cfg.compute_dtype)
