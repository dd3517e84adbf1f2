"""The text so far as a drafter's state, for the drafters that copy from it (`ngram`, `suffix`):
[B, cache_len + 1] tokens, the prompts at prefill (`prefill_text`), then each round's accepted
drafts and next pending token written at commit (`commit_text`), inside the jitted loop.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.decoding.drafter import Prefilled, Round


def prefill_text(prefilled: Prefilled) -> jax.Array:
    """The text so far [B, cache_len + 1], a drafter's state that copies from it: the prompts
    (the pending token and what follows are written as rounds commit)."""
    width = prefilled.cache_len + 1
    return jnp.zeros((prefilled.prompts.shape[0], width), jnp.int32).at[
        :, :prefilled.prompts.shape[1]].set(prefilled.prompts[:, :width])


def commit_text(state: jax.Array, done: Round) -> jax.Array:
    """The text with the round's accepted drafts and next pending token written after the
    pending token it started from (rows that are done keep theirs)."""
    emitted = done.acceptance.emitted
    at = done.lengths_before[:, None] + 1 + jnp.arange(emitted.shape[1])[None, :]
    active = (done.lengths_after > done.lengths_before)[:, None]
    at = jnp.where(active, at, state.shape[1])  # out of range: dropped
    return state.at[jnp.arange(state.shape[0])[:, None], at].set(emitted, mode="drop")
