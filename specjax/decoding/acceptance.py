"""Accepting a drafted chain against the target model's distributions.

Both rules return (num_accepted [B], emitted [B, K+1]): the round commits emitted[:, :n+1], that
is the accepted drafts followed by one token from the target (a correction or the bonus token).
"""

import jax
import jax.numpy as jnp

from specjax.decoding.sampling import sample


def greedy_accept(draft: jax.Array, target_logits: jax.Array,
                  num_valid: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Longest prefix of the first `num_valid` [B] drafts that equals the target's argmax, plus
    the target's next token.

    draft [B, K], target_logits [B, K+1, V]. Where drafts match, the target argmax *is* the
    draft, so the emitted tokens are simply the target argmaxes.
    """
    target = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)
    matches = (draft == target[:, :draft.shape[1]]) & _valid(draft, num_valid)
    return _prefix_length(matches), target


def speculative_accept(key: jax.Array, draft: jax.Array, draft_probs: jax.Array,
                       target_probs: jax.Array,
                       num_valid: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Leviathan et al. / Chen et al. speculative sampling, lossless for any draft q.

    Draft token x_i (drawn from q_i) is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at
    the first rejection the replacement is drawn from norm(max(0, p_i - q_i)); if all K are
    accepted a bonus token is drawn from p_K. Only a row's first `num_valid` [B] drafts count;
    after them q is taken as zero, so the next token is drawn from p.

    draft [B, K]; draft_probs q [B, K, V]; target_probs p [B, K+1, V].
    """
    batch, num_draft = draft.shape
    accept_key, resample_key = jax.random.split(key)
    valid = _valid(draft, num_valid)
    draft_probs = jnp.where(valid[..., None], draft_probs, 0.0)
    p_draft = jnp.take_along_axis(target_probs[:, :num_draft], draft[..., None], -1)[..., 0]
    q_draft = jnp.take_along_axis(draft_probs, draft[..., None], -1)[..., 0]
    uniform = jax.random.uniform(accept_key, (batch, num_draft))
    num_accepted = _prefix_length((uniform * q_draft < p_draft) & valid)
    # Residual at the stopping position; where q is zero (after the valid drafts) it is p.
    q_padded = jnp.pad(draft_probs, ((0, 0), (0, 1), (0, 0)))
    index = num_accepted[:, None, None]
    p_stop = jnp.take_along_axis(target_probs, index, axis=1)[:, 0]
    residual = jnp.maximum(p_stop - jnp.take_along_axis(q_padded, index, axis=1)[:, 0], 0.0)
    mass = jnp.sum(residual, axis=-1, keepdims=True)
    residual = jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0), p_stop)
    final = sample(resample_key, residual)
    positions = jnp.arange(num_draft + 1)[None, :]
    padded_draft = jnp.pad(draft, ((0, 0), (0, 1)))
    emitted = jnp.where(positions == num_accepted[:, None], final[:, None], padded_draft)
    return num_accepted, emitted


def _prefix_length(flags: jax.Array) -> jax.Array:
    """Number of leading True values per row of flags [B, K]."""
    return jnp.sum(jnp.cumprod(flags.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)


def _valid(draft: jax.Array, num_valid: jax.Array) -> jax.Array:
    """[B, K]: which drafts count."""
    return jnp.arange(draft.shape[1])[None, :] < num_valid[:, None]
