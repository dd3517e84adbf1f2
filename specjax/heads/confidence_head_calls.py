"""CALM's confidence classifier (`nn.confidence_head`) as pure functions over its params: the
probability that an exit's prediction is already the final layer's, read by CALM's
`classifier` measure (`decoding.early_exit`) and trained by `configs/calm.py`."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.heads.confidence_head import NUM_FEATURES, ConfidenceHead, exit_features
from specjax.model import Params


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
