"""Which layers a `skip` draft should pass over (Draft & Verify, SWIFT): the set with the best
expected speed-up, searched on held-out prompts.

Acceptance of a skip set S is measured teacher-forced on the model's own continuations of the
prompts (greedy or sampled, as decoding will be), as decoding would draft each position: the
full model first fills a cache with every position's K/V (as verification does for committed
tokens); then every position drafts at once, each seeing the cached K/V of the positions before
it and its own, with the layers in S passing their input through (a keep mask: one compiled
program serves every set). Each position scores top-1 agreement with the full model (greedy)
or the probability that a sampled draft is accepted, sum_v min(p, q). A chain of K drafts with
per-position acceptance a commits tau = (1 - a^(K+1)) / (1 - a) tokens a round. A round costs K
draft steps (the head plus one pass per drafted layer), verification (the layers before the
first skipped one on the last draft alone, the rest on K+1 tokens: the draft's work there is
reused) and the loop's overhead, all measured; the expected speed-up is tau times an `ar` step
over that. The search is greedy forward selection (add the layer whose skipping helps most,
until every layer but the first is skipped), and LayerSkip's exits (skipping E..L-1) are scored
alongside.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.decoding.engine import Generator
from specjax.decoding.sampling import SamplingParams, probabilities
from specjax.model import Params, allocate_cache, embed, exit_logits, run_layers_cached
from specjax.nn.cache import Cache
from specjax.timing import progress_bar
from specjax.tools.tree_search import (
    ar_round_seconds,
    interpolate,
    measured_sizes,
    pass_seconds,
)


@dataclasses.dataclass(frozen=True)
class SkipCandidate:
    """A skip set with its measured acceptance, and the chain length K that maximises its
    expected speed-up, with that tau and speed-up."""

    skip: tuple[int, ...]
    acceptance: float
    num_draft: int
    expected_tau: float
    expected_speedup: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class SkipCosts:
    """Measured seconds: one layer and the head on one token; a full verification pass on n
    tokens (`verify[n]`); the loop's overhead per round; an `ar` step."""

    num_layers: int
    layer: float
    head: float
    verify: np.ndarray
    overhead: float
    ar_step: float

    def round(self, skip: Sequence[int], num_draft: int) -> float:
        draft_step = self.head + (self.num_layers - len(skip)) * self.layer
        reused = skip[0]  # layers [0, first skipped) ran while drafting
        verify = (reused * self.layer
                  + self.verify[num_draft + 1] * (self.num_layers - reused) / self.num_layers)
        return num_draft * draft_step + verify + self.overhead


def chain_tau(acceptance: float, num_draft: int) -> float:
    """Expected tokens a round from K drafts each accepted with probability `acceptance`."""
    if acceptance >= 1.0:
        return num_draft + 1.0
    return (1.0 - acceptance ** (num_draft + 1)) / (1.0 - acceptance)


def measure_costs(generator: Generator, context: int, max_draft: int) -> SkipCosts:
    """`SkipCosts` at `context` cached tokens, for chains of up to `max_draft` drafts. The
    one-token passes that split a layer's cost from the head's are timed alternately, best of
    five, so a drift in machine speed does not land on one of them."""
    num_layers = generator.cfg.num_layers
    pairs = [(pass_seconds(generator, (0, 1), [1], context)[0],
              pass_seconds(generator, (0, num_layers), [1], context)[0]) for _ in range(5)]
    one, full_one = min(p[0] for p in pairs), min(p[1] for p in pairs)
    sizes = measured_sizes(max_draft + 1)  # 1 first: timed above
    full = [full_one, *pass_seconds(generator, (0, num_layers), sizes[1:], context)]
    layer = max(full[0] - one, 0.0) / (num_layers - 1)
    ar_step = ar_round_seconds(generator, context)
    return SkipCosts(num_layers, layer, max(one - layer, 0.0),
                     interpolate(sizes, full, max_draft + 1), max(ar_step - full[0], 0.0),
                     ar_step)


class AcceptanceProbe:
    """Teacher-forced acceptance of any skip set (see the module docstring)."""

    def __init__(self, generator: Generator, prompts: Sequence[Sequence[int]],
                 sampling: SamplingParams | None, *, new_tokens: int = 128, seed: int = 0):
        cfg = generator.cfg
        if cfg.num_layers < 2:
            raise ValueError("a skip draft needs a model of at least 2 layers (it keeps layer 0 "
                             "and skips some of the others)")
        if cfg.layer_pattern is not None:
            raise ValueError("the skip-set search drafts every position at once against the "
                             "full model's K/V, which state-space layers do not have: give "
                             "--skip_layers to decode with a set on this model")
        out = generator.generate(prompts, max_new_tokens=new_tokens, sampling=sampling,
                                 seed=seed)
        padded, lengths = generator.pad([list(p) + t for p, t in
                                         zip(prompts, out.tokens, strict=True)])
        positions = jnp.arange(padded.shape[1])[None, :]
        starts = jnp.asarray([len(p) - 1 for p in prompts])[:, None]
        # Position t predicts token t + 1: score the predictions of generated tokens.
        self._weights = ((positions >= starts) & (positions < lengths[:, None] - 1)).astype(
            jnp.float32)
        self._tokens, self._sampling, self._cfg = padded, sampling, cfg
        self._params = generator.params
        self._target, self._cache = _target(self._params, cfg, padded, sampling)

    def __call__(self, skip: Sequence[int]) -> float:
        keep = np.ones(self._cfg.num_layers, bool)
        keep[list(skip)] = False
        return float(_acceptance(self._params, self._cfg, self._tokens, self._cache,
                                 jnp.asarray(keep), self._target, self._weights,
                                 self._sampling))


@functools.partial(jax.jit, static_argnames="cfg")
def _target(params: Params, cfg: ModelConfig, tokens: jax.Array,
            sampling: SamplingParams | None) -> tuple[jax.Array, Cache]:
    """The full model's argmax [B, T] (greedy) or processed distribution [B, T, V], and a
    cache of 2T slots holding every position's K/V in the first T."""
    batch, steps = tokens.shape
    cache = allocate_cache(cfg, batch, 2 * steps)
    hidden, cache = run_layers_cached(params, cfg, embed(params, cfg, tokens), cache,
                                      jnp.zeros((batch,), jnp.int32))
    logits = exit_logits(params, cfg, hidden)
    if sampling is None:
        return jnp.argmax(logits, axis=-1), cache
    return probabilities(logits, sampling), cache


@functools.partial(jax.jit, static_argnames="cfg")
def _acceptance(params: Params, cfg: ModelConfig, tokens: jax.Array, cache: Cache,
                keep: jax.Array, target: jax.Array, weights: jax.Array,
                sampling: SamplingParams | None) -> jax.Array:
    """Every position t drafts at once, writing its K/V at scratch slot T + t and seeing the
    full model's K/V of positions < t and its own; a layer with keep False passes through."""
    batch, steps = tokens.shape
    t = jnp.arange(steps)
    slots = jnp.broadcast_to(steps + t, (batch, steps))
    visible = jnp.arange(2 * steps)[None, None, :]
    mask = jnp.broadcast_to((visible < t[None, :, None]) | (visible == (steps + t)[None, :, None]),
                            (batch, steps, 2 * steps))
    hidden = embed(params, cfg, tokens)
    for layer in range(cfg.num_layers):
        out, cache = run_layers_cached(params, cfg, hidden, cache, slots, layers=(layer, layer + 1),
                                       positions=jnp.broadcast_to(t, (batch, steps)), mask=mask)
        hidden = jnp.where(keep[layer], out, hidden)
    logits = exit_logits(params, cfg, hidden)
    if sampling is None:
        score = (jnp.argmax(logits, axis=-1) == target).astype(jnp.float32)
    else:
        score = jnp.sum(jnp.minimum(probabilities(logits, sampling), target), axis=-1)
    return jnp.sum(score * weights) / jnp.sum(weights)


def best_chain(skip: tuple[int, ...], acceptance: float, costs: SkipCosts,
               max_draft: int) -> SkipCandidate:
    """The skip set's candidate at the K in 1..max_draft with the best expected speed-up."""
    def speedup(k):
        return chain_tau(acceptance, k) * costs.ar_step / costs.round(skip, k)

    k = max(range(1, max_draft + 1), key=speedup)
    return SkipCandidate(skip, acceptance, k, chain_tau(acceptance, k), float(speedup(k)))


def search(acceptance: Callable[[Sequence[int]], float], costs: SkipCosts,
           max_draft: int) -> list[SkipCandidate]:
    """Every skip set greedy forward selection visits, plus LayerSkip's exits, best first."""
    num_layers = costs.num_layers
    seen: dict[tuple[int, ...], SkipCandidate] = {}
    visits = num_layers * (num_layers - 1) // 2 + num_layers - 1  # at most, some sets twice
    bar = progress_bar(desc="skip sets", total=visits)

    def score(skip: tuple[int, ...]) -> float:
        if skip not in seen:
            seen[skip] = best_chain(skip, acceptance(skip), costs, max_draft)
            bar.update()
        return seen[skip].expected_speedup

    current: tuple[int, ...] = ()
    while len(current) < num_layers - 1:
        options = [tuple(sorted((*current, layer))) for layer in range(1, num_layers)
                   if layer not in current]
        current = max(options, key=score)
    for exit_layer in range(1, num_layers):
        score(tuple(range(exit_layer, num_layers)))
    bar.close()
    return sorted(seen.values(), key=lambda c: -c.expected_speedup)
