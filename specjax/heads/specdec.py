"""SpecDec++'s acceptance-prediction head: the probability that the target accepts a draft token.

    logit = out(silu(mix(silu(inp([norm(h), features(q, y)])))))

h is the hidden state the draft came from (exit E's, before the shared head), q the draft
distribution it was drawn from and y the token drawn. SpecDec++ reads only the draft model's
hidden state; here the head also sees three numbers about q and y (log q(y), log max q and the
entropy of q), so one forward pass per draft decides at once whether the row drafts on (or,
for each child of a tree node, how likely its path is accepted).

The module, then its calls as pure functions over its params. A chain drafting with it stops
once the predicted probability that some draft so far is rejected, 1 - prod(accept), exceeds h
(`Chain.stop_risk`); a dynamic tree keeps the paths with the highest prod(accept)
(`DynamicTree`).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.model import Params
from specjax.nn.norm import RMSNorm

NUM_FEATURES = 3
LOG_FLOOR = -30.0  # log q of a filtered-out token (never drawn; keeps the features finite)


def draft_features(probs: jax.Array, token: jax.Array) -> jax.Array:
    """[..., 3] float32 from draft probabilities [..., V] and the drawn tokens [...]: log q(y),
    log max q, entropy of q."""
    probs = probs.astype(jnp.float32)
    drawn = jnp.take_along_axis(probs, token[..., None], axis=-1)[..., 0]
    log = lambda x: jnp.maximum(jnp.log(x), LOG_FLOOR)  # noqa: E731
    entropy = -jnp.sum(jax.scipy.special.xlogy(probs, probs), axis=-1)
    return jnp.stack([log(drawn), log(jnp.max(probs, axis=-1)), entropy], axis=-1)


class AcceptanceHead(nn.Module):
    """Acceptance logits [...] from hidden states [..., D] and `draft_features` [..., 3]."""

    cfg: ModelConfig
    width: int

    @nn.compact
    def __call__(self, hidden: jax.Array, features: jax.Array) -> jax.Array:
        x = jnp.concatenate([RMSNorm(self.cfg, name="norm")(hidden).astype(jnp.float32),
                             features], axis=-1)
        x = jax.nn.silu(nn.Dense(self.width, name="inp")(x))
        x = jax.nn.silu(nn.Dense(self.width, name="mix")(x))
        return nn.Dense(1, name="out")(x)[..., 0]


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
