"""Logits processing shared by the target (p) and draft (q) distributions.

Speculative sampling is lossless only if p and q come from the same processing, so there is one
function for both. Temperature, top-k and top-p are arrays: changing them never recompiles.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class SamplingParams:
    """temperature > 0; top_k = 0 disables top-k; top_p = 1 disables nucleus filtering."""

    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array

    @classmethod
    def create(cls, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> SamplingParams:
        if not temperature > 0:
            raise ValueError(f"temperature={temperature} must be > 0 for sampling "
                             "(use greedy decoding for temperature 0)")
        if top_k < 0:
            raise ValueError(f"top_k={top_k} must be >= 0 (0 disables it)")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p={top_p} must lie in (0, 1]")
        return cls(temperature=jnp.float32(temperature), top_k=jnp.int32(top_k),
                   top_p=jnp.float32(top_p))


def sampling_or_greedy(temperature: float, top_k: int = 0, top_p: float = 1.0, *,
                       prefix: str = "") -> SamplingParams | None:
    """None (greedy decoding) at temperature 0, else `SamplingParams`. Filters at temperature
    0 are an error rather than ignored; `prefix` ("--" for a command line) names the settings
    in that message as the user typed them."""
    if temperature != 0:
        return SamplingParams.create(temperature, top_k, top_p)
    if top_k or top_p != 1.0:
        raise ValueError(f"{prefix}top_k and {prefix}top_p filter a sampling distribution: set "
                         f"{prefix}temperature > 0 (temperature 0 is greedy decoding)")
    return None


def probabilities(logits: jax.Array, params: SamplingParams) -> jax.Array:
    """Temperature, then top-k, then top-p; returns normalised float32 probabilities [..., V].

    Both filters come from one descending sort, and a runtime branch skips the sort when
    neither filter is active. Tokens tied with the last kept logit are kept too.
    """
    logits = logits.astype(jnp.float32) / params.temperature
    active = (params.top_k > 0) | (params.top_p < 1.0)
    logits = jax.lax.cond(active, _filter, lambda x, _: x, logits, params)
    return jax.nn.softmax(logits, axis=-1)


def _filter(logits: jax.Array, params: SamplingParams) -> jax.Array:
    vocab = logits.shape[-1]
    descending = -jnp.sort(-logits, axis=-1)
    rank = jnp.arange(vocab)
    top_k = jnp.where(params.top_k > 0, jnp.minimum(params.top_k, vocab), vocab)
    descending = jnp.where(rank < top_k, descending, -jnp.inf)
    sorted_probs = jax.nn.softmax(descending, axis=-1)
    # Nucleus: the smallest prefix of the sorted tokens whose mass reaches top_p.
    mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
    kept = jnp.sum((mass_before < params.top_p) & (rank < top_k), axis=-1, keepdims=True)
    threshold = jnp.take_along_axis(descending, kept - 1, axis=-1)
    return jnp.where(logits >= threshold, logits, -jnp.inf)


def sample(key: jax.Array, probs: jax.Array) -> jax.Array:
    """One token id per row of `probs` [..., V]."""
    return jax.random.categorical(key, jnp.log(probs), axis=-1).astype(jnp.int32)


def draw_children(key: jax.Array, logits: jax.Array, sampling: SamplingParams | None,
                  count: int, how: str) -> tuple[jax.Array, jax.Array | None]:
    """`count` child tokens [..., count] for each row of draft logits [..., V], and the draft
    distribution q [..., V] they came from (None when greedy).

    Greedy decoding and `how="top_k"` take the `count` most likely tokens, in order;
    "without_replacement" draws `count` distinct tokens from q in sequence (Gumbel top-k);
    "iid" draws them independently from q.
    """
    if sampling is None:
        return _top(logits, count), None
    probs = probabilities(logits, sampling)
    if how == "top_k":
        scores = probs
    elif how == "without_replacement":
        scores = jnp.log(probs) + jax.random.gumbel(key, probs.shape)
    elif how == "iid":
        draws = jax.random.categorical(key, jnp.log(probs), axis=-1,
                                       shape=(count, *probs.shape[:-1]))
        return jnp.moveaxis(draws, 0, -1).astype(jnp.int32), probs
    else:
        raise ValueError(f"unknown way to draw children {how!r}")
    return _top(scores, count), probs


def _top(scores: jax.Array, count: int) -> jax.Array:
    """Indices [..., count] of the largest scores, largest first (an argmax for one: XLA:CPU
    sorts for top_k, measured 10x slower than a reduction at V = 259)."""
    if count == 1:
        return jnp.argmax(scores, axis=-1)[..., None].astype(jnp.int32)
    return jax.lax.top_k(scores, count)[1].astype(jnp.int32)
