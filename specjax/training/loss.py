"""The early-exit loss through the shared head."""

import jax
import jax.numpy as jnp
import optax

from specjax.config import ModelConfig
from specjax.model import Params, exit_logits


def exit_cross_entropies(params: Params, cfg: ModelConfig, per_layer: jax.Array,
                         exit_layers: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean token cross-entropy [M] of each requested exit.

    Args:
      per_layer: [L, B, T, D] hidden state after each layer (exit e is per_layer[e - 1]).
      exit_layers: [M] exit numbers in 1..L.
      targets: [B, T] next-token ids (packed sequences have no padding).
    The head runs one exit at a time (`lax.map`) so only one [B, T, V] logits tensor is live.
    """
    def one_exit(layer):
        logits = exit_logits(params, cfg, per_layer[layer - 1])
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets))

    return jax.lax.map(one_exit, exit_layers)
