"""SpecDec++'s acceptance head (`nn.acceptance_head`) as pure functions over its params.

The head predicts, for each draft token, the probability that the target accepts it (given the
drafts before it were accepted). A chain drafting with it stops once the predicted probability
that some draft so far is rejected, 1 - prod(accept), exceeds h (`chain.Chain.stop_risk`); a
dynamic tree keeps the paths with the highest prod(accept) (`dynamic_tree.DynamicTree`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.heads.acceptance_head import NUM_FEATURES, AcceptanceHead, draft_features
from specjax.model import Params


def init_acceptance_head(cfg: ModelConfig, width: int, key: jax.Array) -> Params:
    """A head of hidden `width` for the model `cfg`, randomly initialised."""
    hidden = jnp.zeros((1, cfg.d_model), cfg.compute_dtype)
    return AcceptanceHead(cfg, width).init(key, hidden, jnp.zeros((1, NUM_FEATURES)))["params"]


def abstract_acceptance_head(cfg: ModelConfig, width: int) -> Params:
    """Shapes and dtypes of a head (restore targets)."""
    return jax.eval_shape(lambda: init_acceptance_head(cfg, width, jax.random.PRNGKey(0)))


def acceptance_logits(head: Params, cfg: ModelConfig, hidden: jax.Array, probs: jax.Array,
                      token: jax.Array) -> jax.Array:
    """Acceptance logits [...] (float32) of tokens `token` [...] drawn from draft
    probabilities `probs` [..., V] that came from hidden states `hidden` [..., D]."""
    width = head["inp"]["kernel"].shape[-1]
    return AcceptanceHead(cfg, width).apply({"params": head}, hidden,
                                            draft_features(probs, token))


def acceptance_probability(head: Params, cfg: ModelConfig, hidden: jax.Array,
                           probs: jax.Array, token: jax.Array) -> jax.Array:
    """P(the target accepts the draft) [...]: the sigmoid of `acceptance_logits`."""
    return jax.nn.sigmoid(acceptance_logits(head, cfg, hidden, probs, token))
