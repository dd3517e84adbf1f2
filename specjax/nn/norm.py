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
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.cfg.weight_dtype)
        return apply_rms_norm(x, scale, self.cfg)


def apply_rms_norm(x: jax.Array, scale: jax.Array, cfg: ModelConfig) -> jax.Array:
    """The RMSNorm math on its own, shared by the layers and the exit head."""
    xf = x.astype(jnp.float32)
    normed = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + cfg.norm_eps)
    return scale.astype(cfg.compute_dtype) * normed.astype(cfg.compute_dtype)
