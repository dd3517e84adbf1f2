"""Gated feed-forward block (SwiGLU, or Gemma's GeGLU) with a fused gate/up projection."""

import flax.linen as nn
import jax

from specjax.config import ACTIVATIONS, ModelConfig
from specjax.nn.linear import matmul


class MLP(nn.Module):
    """down(act(gate(x)) * up(x)), act `ACTIVATIONS[cfg.mlp_activation]`; gate and up share
    one [d_model, 2, mlp_dim] kernel so that a decode step reads them with one matrix-vector
    product."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.cfg
        gate_up = self.param("gate_up", nn.initializers.normal(cfg.init_std),
                             (cfg.d_model, 2, cfg.mlp_dim), cfg.weight_dtype)
        down = self.param("down", nn.initializers.normal(residual_init_std(cfg)),
                          (cfg.mlp_dim, cfg.d_model), cfg.weight_dtype)
        y = matmul(x, gate_up.reshape(cfg.d_model, -1).astype(cfg.compute_dtype))
        gate, up = y[..., :cfg.mlp_dim], y[..., cfg.mlp_dim:]
        hidden = ACTIVATIONS[cfg.mlp_activation](gate) * up
        return matmul(hidden, down.astype(cfg.compute_dtype))


def residual_init_std(cfg: ModelConfig) -> float:
    """Projections into the residual stream start smaller (GPT-2 style 1/sqrt(2L) scaling)."""
    return cfg.init_std / (2 * cfg.num_layers) ** 0.5
