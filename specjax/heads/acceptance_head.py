"""SpecDec++'s acceptance-prediction head: the probability that the target accepts a draft token.

    logit = out(silu(mix(silu(inp([norm(h), features(q, y)])))))

h is the hidden state the draft came from (exit E's, before the shared head), q the draft
distribution it was drawn from and y the token drawn. SpecDec++ reads only the draft model's
hidden state; here the head also sees three numbers about q and y (log q(y), log max q and the
entropy of q), so one forward pass per draft decides at once whether the row drafts on (or,
for each child of a tree node, how likely its path is accepted).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
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
