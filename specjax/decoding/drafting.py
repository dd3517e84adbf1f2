"""Drafting a chain token by token, with a static maximum length and a confidence stop.

Any drafter that proposes one token per step (LayerSkip's shallow layers, Kangaroo's adapter, a
small draft model) supplies `step`; this module runs it in a `lax.while_loop` of at most K steps
that ends early once every row's latest draft is unconfident: its probability under the draft
distribution is below `threshold` (HF's `assistant_confidence_threshold`, Kangaroo's η). A row
that stops keeps being computed with the batch but its later drafts do not count (`num_valid`),
so shapes stay static and the verifier sees [B, K] tokens whatever happened.

Stopping on the draft's own confidence keeps sampling lossless: the decision depends only on the
drafted prefix, and the verifier draws the token after the last valid draft from the target.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from specjax.cache import Cache
from specjax.decoding.sampling import SamplingParams, probabilities, sample

# step(cache, token [B], k) -> (draft logits [B, V] for the token after `token`, a per-row
# array [B, ...] the verifier needs later (kept at index k), the updated cache).
DraftStep = Callable[[Cache, jax.Array, jax.Array], tuple[jax.Array, jax.Array, Cache]]


@flax.struct.dataclass
class DraftChain:
    """tokens [B, K]; probs [B, K, V] (None when greedy); kept [B, K, ...] (step k's array);
    num_valid [B] (drafts that count, >= 1); the cache after drafting."""

    tokens: jax.Array
    probs: jax.Array | None
    kept: jax.Array
    num_valid: jax.Array
    cache: Cache


@flax.struct.dataclass
class _State:
    k: jax.Array
    cache: Cache
    token: jax.Array
    chain: Any
    num_valid: jax.Array
    drafting: jax.Array


def draft_chain(step: DraftStep, cache: Cache, pending: jax.Array, key: jax.Array,
                sampling: SamplingParams | None, *, num_draft: int,
                threshold: float) -> DraftChain:
    """Drafts up to `num_draft` tokens after `pending` [B].

    Args:
      threshold: 0 drafts exactly `num_draft` tokens; in (0, 1) a row stops after the first
        draft whose draft probability is below it, and the loop after every row has stopped.
    """
    batch = pending.shape[0]
    logits_like, kept_like, _ = jax.eval_shape(step, cache, pending, jnp.zeros((), jnp.int32))
    chain = {"tokens": jnp.zeros((num_draft, batch), jnp.int32),
             "kept": jnp.zeros((num_draft, *kept_like.shape), kept_like.dtype)}
    if sampling is not None:
        chain["probs"] = jnp.zeros((num_draft, *logits_like.shape), jnp.float32)

    def body(s: _State) -> _State:
        logits, kept, cache = step(s.cache, s.token, s.k)
        if sampling is None:
            token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
            probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1) if threshold else None
        else:
            probs = probabilities(logits, sampling)
            token = sample(jax.random.fold_in(key, s.k), probs)
        update = {"tokens": token, "kept": kept, "probs": probs}
        confident = (jnp.take_along_axis(probs, token[:, None], axis=-1)[:, 0] >= threshold
                     if threshold else jnp.ones((batch,), bool))
        return _State(k=s.k + 1, cache=cache, token=token,
                      chain={name: s.chain[name].at[s.k].set(update[name]) for name in s.chain},
                      num_valid=s.num_valid + s.drafting, drafting=s.drafting & confident)

    start = _State(k=jnp.zeros((), jnp.int32), cache=cache, token=pending, chain=chain,
                   num_valid=jnp.zeros((batch,), jnp.int32), drafting=jnp.ones((batch,), bool))
    end = jax.lax.while_loop(lambda s: (s.k < num_draft) & jnp.any(s.drafting), body, start)
    probs = end.chain.get("probs")
    return DraftChain(tokens=end.chain["tokens"].T,
                      probs=None if probs is None else probs.transpose(1, 0, 2),
                      kept=jnp.moveaxis(end.chain["kept"], 0, 1), num_valid=end.num_valid,
                      cache=end.cache)
