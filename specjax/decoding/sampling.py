"""Logits processing shared by the target (p) and draft (q) distributions.

Speculative sampling is lossless for any q the drafts are drawn from; a drafter that drafts
from a model processes its logits as p's are processed (one function for both), so that q
lies close to p. Temperature, top-k and top-p are arrays: changing them never recompiles.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from specjax.config import require_kind


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
    for name, value, kind in (("temperature", temperature, float), ("top_k", top_k, int),
                              ("top_p", top_p, float)):
        require_kind(prefix + name, value, kind)
    if temperature != 0:
        return SamplingParams.create(temperature, top_k, top_p)
    filters = [name for name, on in (("top_k", top_k), ("top_p", top_p != 1.0)) if on]
    if filters:
        raise ValueError(f"{' and '.join(prefix + name for name in filters)} "
                         f"filter{'s' if len(filters) == 1 else ''} a sampling distribution: "
                         f"set {prefix}temperature > 0 (temperature 0 is greedy decoding)")
    return None


def temperature_only(sampling: SamplingParams | None) -> SamplingParams | None:
    """`sampling` without its top-k and top-p filters (constants: XLA drops the filters'
    passes): for a draft distribution over a few ids, where filtering the whole vocabulary
    would cost more than it changes."""
    if sampling is None:
        return None
    return sampling.replace(top_k=jnp.int32(0), top_p=jnp.float32(1.0))


def probabilities(logits: jax.Array, params: SamplingParams) -> jax.Array:
    """Temperature, then top-k, then top-p; returns normalised float32 probabilities [..., V]."""
    return jax.nn.softmax(_processed(logits, params), axis=-1)


def token_logprobs(logits: jax.Array, tokens: jax.Array,
                   params: SamplingParams | None) -> jax.Array:
    """The log-probability [...] of each token [...] under the distribution it was drawn from,
    given logits [..., V]: the model's log-softmax when greedy, else the log of `probabilities`
    (temperature, top-k, top-p; -inf outside the filters), as transformers'
    `compute_transition_scores(..., normalize_logits=True)` reads its `output_scores`."""
    logits = logits.astype(jnp.float32) if params is None else _processed(logits, params)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]


def _processed(logits: jax.Array, params: SamplingParams) -> jax.Array:
    """float32 logits / temperature, -inf outside top-k and top-p. A runtime branch skips each
    filter that is off. Tokens tied with the last kept logit are kept too."""
    logits = logits.astype(jnp.float32) / params.temperature
    logits = jax.lax.cond(params.top_k > 0, _top_k, lambda x, _: x, logits, params)
    return jax.lax.cond(params.top_p < 1.0, _top_p, lambda x, _: x, logits, params)


def _top_k(logits: jax.Array, params: SamplingParams) -> jax.Array:
    """-inf below the k-th largest logit. Tokens tied with it are kept, as Hugging Face's
    top-k keeps them, and top-p then weighs all of them."""
    k = jnp.minimum(params.top_k, logits.shape[-1])
    return _keep_from(logits, jnp.ones_like(logits), k)


def _top_p(logits: jax.Array, params: SamplingParams) -> jax.Array:
    """-inf outside the nucleus: the fewest most likely tokens whose mass reaches top_p."""
    return _keep_from(logits, jax.nn.softmax(logits, axis=-1), params.top_p)


def _keep_from(logits: jax.Array, weights: jax.Array, target: jax.Array) -> jax.Array:
    """-inf below the cut: the largest logit c such that the logits >= c weigh at least
    `target`. As c grows their weight only falls, so c is found by bisection on the bits of
    an order-preserving integer key, most significant first: 32 masked sums over [..., V].
    XLA:CPU sorts instead in 13 us for 259 logits, 75 us for 5 rows and 4.7 ms for 32,000
    (bisection: 5 us, 12 us and 0.11 ms), and a sampled round filters once per draft and
    once per verified position. Each step adds its bit to the cut rather than choosing between
    `cut | bit` and `cut`: XLA fuses the whole chain of cuts into every step, and with two
    uses of each cut XLA:CPU's code for it grew past ten minutes of compiling at 8 rows."""
    keys = _order_keys(logits)
    cut = jnp.zeros((*keys.shape[:-1], 1), jnp.uint32)
    for bit in range(31, -1, -1):
        step = jnp.uint32(1 << bit)
        weight = jnp.sum(jnp.where(keys >= cut + step, weights, 0.0), axis=-1, keepdims=True)
        cut = cut + (weight >= target).astype(jnp.uint32) * step
    return jnp.where(keys >= cut, logits, -jnp.inf)


def _order_keys(values: jax.Array) -> jax.Array:
    """uint32 keys [..., V] in the order of float32 `values` (negative floats' bits inverted,
    positive floats' sign bit set; -0 taken as +0, which it equals)."""
    bits = jax.lax.bitcast_convert_type(jnp.where(values == 0, 0.0, values), jnp.uint32)
    return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(1 << 31))


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
