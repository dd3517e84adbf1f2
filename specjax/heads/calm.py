"""CALM's confidence measures (`MEASURES`, read at each candidate exit by the exit engine
`decoding.drafters.calm_exit`): the softmax response, saturation, and the learned one, a
logistic classifier on an exit's hidden state and on three numbers about the distribution the
shared head reads there.

    logit = out([norm(h), margin(p), log max p, entropy(p)])

One head serves every exit (CALM's `meta` measure is one dense layer, trained afterwards with
the backbone frozen). Its own RMSNorm puts the hidden states of every depth on one scale. The
features of p, and an initialisation that makes the untrained head a function of the top-two
margin, let it start from what the softmax response knows: on the default model a head on the
hidden state alone ranked agreeing exits worse than the margin (AUC .80 against .88 to .93).

The module, then its calls as pure functions over its params (the probability that an exit's
prediction is already the final layer's, trained by `specjax/configs/calm.py`), then the
measures.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.model import Params
from specjax.nn.norm import RMSNorm

NUM_FEATURES = 3
MARGIN_SCALE = 8.0


def top_two_margin(probs: jax.Array) -> jax.Array:
    """Top-1 minus top-2 probability [...] of distributions [..., V]. Two maxima rather than
    `lax.top_k`, which costs 6x as much on XLA:CPU (13 vs 2 us a call)."""
    top = jnp.argmax(probs, axis=-1, keepdims=True)
    first = jnp.take_along_axis(probs, top, axis=-1)[..., 0]
    others = jnp.where(jnp.arange(probs.shape[-1]) == top, -1.0, probs)
    return first - jnp.max(others, axis=-1)


def exit_features(logits: jax.Array) -> jax.Array:
    """[..., 3] float32 from an exit's logits [..., V]: the top-two margin, log max p and the
    entropy of p."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    entropy = -jnp.sum(jax.scipy.special.xlogy(probs, probs), axis=-1)
    return jnp.stack([top_two_margin(probs), jnp.log(jnp.max(probs, axis=-1)), entropy],
                     axis=-1)


class ConfidenceHead(nn.Module):
    """Logits [...] of P(this exit's argmax equals the final layer's) from hidden states
    [..., D] and `exit_features` [..., 3]."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, hidden: jax.Array, features: jax.Array) -> jax.Array:
        x = jnp.concatenate([RMSNorm(self.cfg, name="norm")(hidden).astype(jnp.float32),
                             features], axis=-1)
        return nn.Dense(1, name="out", kernel_init=_from_the_margin,
                        bias_init=nn.initializers.constant(-MARGIN_SCALE / 2))(x)[..., 0]


def _from_the_margin(key: jax.Array, shape: tuple[int, ...], dtype=jnp.float32) -> jax.Array:
    """The output layer's start: the logit MARGIN_SCALE * (margin - 1/2), a monotone function
    of CALM's softmax response, so training starts from that measure's ranking."""
    return jnp.zeros(shape, dtype).at[shape[0] - NUM_FEATURES, 0].set(MARGIN_SCALE)


def init_confidence_head(cfg: ModelConfig, key: jax.Array) -> Params:
    """A head for the model `cfg`, randomly initialised."""
    hidden = jnp.zeros((1, cfg.d_model), cfg.compute_dtype)
    return ConfidenceHead(cfg).init(key, hidden, jnp.zeros((1, NUM_FEATURES)))["params"]


def abstract_confidence_head(cfg: ModelConfig) -> Params:
    """Shapes and dtypes of a head (restore targets)."""
    return jax.eval_shape(lambda: init_confidence_head(cfg, jax.random.PRNGKey(0)))


def confidence_logits(head: Params, cfg: ModelConfig, hidden: jax.Array,
                      logits: jax.Array) -> jax.Array:
    """Logits [...] (float32) for hidden states [..., D] of any exit and the shared head's
    logits there [..., V]."""
    return ConfidenceHead(cfg).apply({"params": head}, hidden, exit_features(logits))


def confidence(head: Params, cfg: ModelConfig, hidden: jax.Array,
               logits: jax.Array) -> jax.Array:
    """P(the exit's argmax equals the final layer's) [...]: the sigmoid of the logits."""
    return jax.nn.sigmoid(confidence_logits(head, cfg, hidden, logits))


# measure(classifier params, cfg, hidden at the exit [B, n, D], hidden one layer below
# [B, n, D], exit logits [B, n, V]) -> confidence [B, n] in [0, 1]
Measure = Callable[[Params, ModelConfig, jax.Array, jax.Array, jax.Array], jax.Array]


def softmax_response(head: Params, cfg: ModelConfig, hidden: jax.Array, below: jax.Array,
                     logits: jax.Array) -> jax.Array:
    """Top-1 minus top-2 probability of the exit's distribution (CALM's `softmax_diff`)."""
    return top_two_margin(jax.nn.softmax(logits.astype(jnp.float32), axis=-1))


def saturation(head: Params, cfg: ModelConfig, hidden: jax.Array, below: jax.Array,
               logits: jax.Array) -> jax.Array:
    """Cosine of the hidden states after the exit layer and after the layer below it (CALM's
    `state`), negative values clipped to 0."""
    a, b = hidden.astype(jnp.float32), below.astype(jnp.float32)
    norms = jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1)
    return jnp.maximum(jnp.sum(a * b, axis=-1) / jnp.maximum(norms, 1e-12), 0.0)


def learned(head: Params, cfg: ModelConfig, hidden: jax.Array, below: jax.Array,
            logits: jax.Array) -> jax.Array:
    """The trained classifier's P(this exit's argmax equals the final layer's) from the exit's
    hidden state and distribution (CALM's `meta`; `specjax/configs/calm.py` trains it)."""
    return confidence(head, cfg, hidden, logits)


MEASURES: dict[str, Measure] = {"softmax": softmax_response, "state": saturation,
                                "classifier": learned}
