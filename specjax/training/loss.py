"""The early-exit loss through the shared head."""

import jax
import jax.numpy as jnp
import optax

from specjax.config import ModelConfig
from specjax.heads.feature_head import unrolled_logits
from specjax.heads.mtp import MTP
from specjax.model import Params, exit_logits


def mtp_cross_entropies(params: Params, cfg: ModelConfig, last_hidden: jax.Array,
                        tokens: jax.Array) -> jax.Array:
    """Mean corpus cross-entropy [D] of each of the model's MTP depths (DeepSeek-V3's
    multi-token prediction, `cfg.mtp_depth` modules in `params["mtp"]`), unrolled as they
    draft (`heads.feature_head.unrolled_logits`): depth j + 1 at position s is labelled
    tokens[s + j + 1], over positions 1..T - 1 - j of a batch `tokens` [B, T + 1] whose last
    layer's hidden states are `last_hidden` [B, T, D]."""
    width = last_hidden.shape[1]
    logits = unrolled_logits(MTP, params, params["mtp"], cfg, tokens, [last_hidden],
                             cfg.mtp_depth)                                      # [D, B, T, V]
    positions = jnp.arange(width)
    depths = []
    for j in range(cfg.mtp_depth):
        labels = jnp.take(tokens, jnp.minimum(positions + j + 1, width), axis=1)
        valid = (positions >= 1) & (positions + j + 1 <= width)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits[j], labels)
        depths.append(jnp.sum(jnp.where(valid, ce, 0.0)) / (ce.shape[0] * jnp.sum(valid)))
    return jnp.stack(depths)


def exit_cross_entropies(params: Params, cfg: ModelConfig, per_layer: jax.Array,
                         exit_layers: jax.Array, targets: jax.Array,
                         distill: float = 0.0) -> jax.Array:
    """Mean cross-entropy [M] of each requested exit against its target.

    The target is the next token; with `distill` = a > 0, an early exit's target is the mixture
    (1 - a) * next token + a * the last layer's distribution, held constant (self-distillation:
    a draft from exit e is accepted when it agrees with the last layer, not with the corpus).
    The last exit always learns the next token alone. Under layer dropout the last layer's
    distribution is that of each sample's sub-network, as the early exits' own are.

    Args:
      per_layer: [L, B, T, D] hidden state after each layer (exit e is per_layer[e - 1]).
      exit_layers: [M] exit numbers in 1..L.
      targets: [B, T] next-token ids (packed sequences have no padding).
    The head runs one exit at a time (`lax.map`) so only one [B, T, V] logits tensor is live
    (with `distill`, the last layer's distribution too; both terms share one log-softmax).
    """
    if not distill:
        def one_exit(layer):
            logits = exit_logits(params, cfg, per_layer[layer - 1])
            return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets))

        return jax.lax.map(one_exit, exit_layers)

    teacher = jax.lax.stop_gradient(jax.nn.softmax(
        exit_logits(params, cfg, per_layer[-1]).astype(jnp.float32)))

    def one_distilled_exit(layer):
        log_probs = jax.nn.log_softmax(
            exit_logits(params, cfg, per_layer[layer - 1]).astype(jnp.float32))
        hard = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
        soft = -jnp.sum(teacher * log_probs, axis=-1)
        weight = jnp.where(layer == cfg.num_layers, 0.0, distill)
        return jnp.mean((1 - weight) * hard + weight * soft)

    return jax.lax.map(one_distilled_exit, exit_layers)
