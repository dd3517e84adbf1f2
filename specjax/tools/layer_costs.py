"""The pieces of a decode round, timed: one cached layer of each kind and the shared head on n
new tokens (`measure_costs`), and what a round costs from them (`LayerCosts`), for the exit
report's predictions (`exit_report`).

A round drafting a chain of K tokens from exit E runs layers [0, E) and the head K times on one
token, then verification runs the last draft (which drafting never ran) through [0, E) and
all K + 1 positions through [E, L) and the head (`layerskip`'s reuse); a static tree's round
is priced the same way at its widths (`StaticTree.round_from_passes`).
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.decoding.sampling import SamplingParams, probabilities
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.decoding.shapes.tree import chain_layout
from specjax.heads.kangaroo import run_adapter_cached
from specjax.heads.vocab_subset import DraftVocab, exit_head_logits
from specjax.model import (
    Params,
    allocate_cache,
    exit_logits,
    layer_params,
    run_layers_cached,
    unstack_layers,
)
from specjax.nn.cache import Cache, LayerKV
from specjax.timing import time_interleaved


@dataclasses.dataclass(frozen=True)
class LayerCosts:
    """Seconds, batch 1, on n new tokens: one cached layer of each kind (`layer[kind][n]`,
    after `context` cached tokens) and the shared head (`head[n]`); `draft_head`, the head on
    one token over the draft vocabulary of `draft_vocab` ids that drafts use (None: the full
    head); `adapter`, a Kangaroo adapter's block on n tokens (empty: none measured). Tests
    build it by hand; `measure_costs` measures it."""

    layer: Mapping[str, Mapping[int, float]]
    head: Mapping[int, float]
    context: int = 0
    spread: float = 0.0  # the largest interquartile range / median of a piece's repeats
    draft_head: float | None = None
    draft_vocab: int = 0
    adapter: Mapping[int, float] = dataclasses.field(default_factory=dict)

    def plain(self, layer_kinds: Sequence[str]) -> float:
        """Seconds per token of plain (autoregressive) decoding: every layer and the head on
        one token."""
        return self.whole_pass(layer_kinds, 1)

    def whole_pass(self, layer_kinds: Sequence[str], num_tokens: int) -> float:
        """Seconds of one pass of the layers `layer_kinds` and the head on `num_tokens` new
        tokens (every layer: what verifying `num_tokens - 1` drafts costs); sizes between
        the measured ones are interpolated."""
        return self._layers(layer_kinds, num_tokens) + self._at(self.head, num_tokens)

    def round(self, layer_kinds: Sequence[str], exit_layer: int, num_draft: int) -> float:
        """Seconds of one self-speculative round drafting a chain of `num_draft` tokens from
        exit `exit_layer` (see the module docstring)."""
        return self.tree_round(layer_kinds, exit_layer, StaticTree.from_branching((1,) * num_draft))

    def tree_round(self, layer_kinds: Sequence[str], exit_layer: int, tree: StaticTree, *,
                   adapter: bool = False) -> float:
        """Seconds of one self-speculative round drafting the static tree `tree` from exit
        `exit_layer` (`StaticTree.round_from_passes`): a draft pass is the exit's layers and the
        draft head, the leaves pass the exit's layers, and the rest of the verification every
        other layer and the head. With `adapter` (Kangaroo's round), the adapter's block runs
        in each draft pass and, at the commit, on the leaves (which drafting never ran).
        Sizes between the measured ones are interpolated."""
        if adapter and not self.adapter:
            raise ValueError("no adapter was timed (measure_costs with adapter=)")

        def shallow(num_tokens: int) -> float:
            return (self._layers(layer_kinds[:exit_layer], num_tokens)
                    + (self._at(self.adapter, num_tokens) if adapter else 0.0))

        return tree.round_from_passes(lambda n: shallow(n) + self._draft_head(n), shallow,
                                      lambda n: self.whole_pass(layer_kinds[exit_layer:], n))

    def drafted_round(self, layer_kinds: Sequence[str], tree: StaticTree, draft: LayerCosts,
                      draft_kinds: Sequence[str]) -> float:
        """Seconds of one round of a separate draft model (its costs `draft`, its layers'
        kinds `draft_kinds`) drafting the static tree `tree` (`drafters.draft_model`): each
        draft pass runs all its layers and its head, the commit its layers on the one token
        it may not have run, and the verification this whole model on N + 1 tokens."""
        return tree.round_from_passes(lambda n: draft.whole_pass(draft_kinds, n),
                                      lambda n: draft._layers(draft_kinds, 1),
                                      lambda n: self.whole_pass(layer_kinds, n))

    def _layers(self, layer_kinds: Sequence[str], num_tokens: int) -> float:
        return sum(self._at(self.layer[kind], num_tokens) for kind in layer_kinds)

    def _draft_head(self, num_tokens: int) -> float:
        if self.draft_head is None:
            return self._at(self.head, num_tokens)
        if num_tokens == 1:
            return self.draft_head
        return self._at(self.head, num_tokens) * self.draft_head / self.head[1]

    @staticmethod
    def _at(by_size: Mapping[int, float], num_tokens: int) -> float:
        """A piece's seconds on `num_tokens` tokens: measured, else on the line through the
        nearest measured sizes around it (past the largest, the last two's)."""
        if num_tokens in by_size:
            return by_size[num_tokens]
        sizes = sorted(by_size)
        above = next((n for n in sizes if n > num_tokens), None)
        low = [n for n in sizes if n < num_tokens][-2 if above is None else -1:]
        if above is None and len(low) < 2:
            return by_size[low[-1]] * num_tokens / low[-1]
        a, b = (low[-1], above) if above is not None else (low[0], low[1])
        return by_size[a] + (by_size[b] - by_size[a]) * (num_tokens - a) / (b - a)


def measure_costs(params: Params, cfg: ModelConfig, sizes: Iterable[int], *,
                  context: int = 256, repeats: int = 7, inner: int = 8,
                  draft_vocab: int = 0, sampling: SamplingParams | None = None,
                  adapter: Params | None = None) -> LayerCosts:
    """Per-piece costs on n new tokens after `context` cached ones, for each n in `sizes`;
    batch 1, jitted, after a warm-up call, each call running the piece `inner` times in one
    compiled loop (so per-call dispatch, which the decode loop does not pay per layer, is
    amortised); caches donated and written in place, as decoding does.

    One layer of each kind and the head, timed alone, give their relative costs; a pass of the
    whole model (every layer, then the head) gives the absolute scale, to which they are
    scaled. A piece repeated alone keeps its weights in the CPU's caches, where a model larger
    than them streams every weight from memory once per pass: timed alone, one-token costs
    came out 3x too low on a 54 MB model, and the predicted speed-ups far too pessimistic.

    Every piece at every size is timed once per repeat, in turn (`time_interleaved`), and
    its median kept, so a change in the machine's speed hits all of them alike; a cost that
    falls with more tokens is noise and takes the smaller count's value (`monotone`). The
    largest spread between a piece's repeats is kept (`LayerCosts.spread`): the report warns
    when the machine was too noisy to trust. With `draft_vocab` N > 0 the head over N ids
    (`heads.vocab_subset`, the drafters' smaller head) is timed on one token too. With
    `sampling`, the head (and the whole pass's) includes turning its logits into the sampled
    distribution (temperature, top-k, top-p: a sort of the vocabulary at every position),
    which a sampled round pays at every position it drafts or verifies: on SmolLM2 the
    pieces without it priced ngram's sampled K=4 round 27% too cheap. With `adapter`, a
    Kangaroo adapter's block (`heads.kangaroo`) is timed at every size too, as a layer is."""
    sizes = sorted(set(sizes) | {1})
    layers = {kind: layer_params(params, cfg, cfg.layer_kinds.index(kind))
              for kind in dict.fromkeys(cfg.layer_kinds)}
    head, model = ({k: params[k] for k in ("embed", "final_norm", "unembed") if k in params},
                   unstack_layers(params, cfg))

    def hidden(n: int) -> jax.Array:
        return jax.random.normal(jax.random.PRNGKey(n), (1, n, cfg.d_model), cfg.compute_dtype)

    def cache(one: ModelConfig, n: int) -> Cache:
        return allocate_cache(one, 1, context + n, window=n).prefilled(
            jnp.asarray([context], jnp.int32))

    def call(run: Callable[..., Any], *args: Any) -> Callable[[int], None]:
        state = list(args)

        def once(_: int) -> None:  # the last output (the cache) feeds the next call
            state[-1] = jax.block_until_ready(run(*state))[-1]

        once(0)  # compile and warm up
        return once

    calls = {}
    for kind, weights in layers.items():
        one = _one_layer(cfg, kind)
        run = _layer_loop(one, inner)
        calls.update({(kind, n): call(run, {"layers": (weights,)}, hidden(n), cache(one, n))
                      for n in sizes})
    run = _head_loop(cfg, inner)
    calls.update({("head", n): call(run, sampling, head, None, hidden(n)) for n in sizes})
    if draft_vocab:
        vocab = DraftVocab.gather(params, cfg, jnp.arange(draft_vocab, dtype=jnp.int32))
        calls["draft head", 1] = call(run, sampling, head, vocab, hidden(1))
    if adapter is not None:
        run = _adapter_loop(cfg, context, inner)
        calls.update({("adapter", n): call(run, adapter, hidden(n),
                                           LayerKV.allocate(cfg, 1, context + n))
                      for n in sizes})
    run = _model_loop(cfg, inner)
    calls.update({("model", n): call(run, sampling, model, hidden(n), cache(cfg, n))
                  for n in sizes})
    samples = {key: [t / inner for t in by_item[0]]
               for key, by_item in time_interleaved(calls, 1, repeats)[0].items()}
    median = {key: statistics.median(times) for key, times in samples.items()}
    scale = {n: median["model", n] / (sum(median[k, n] for k in cfg.layer_kinds)
                                      + median["head", n]) for n in sizes}
    return LayerCosts(
        layer={kind: monotone({n: median[kind, n] * scale[n] for n in sizes})
               for kind in layers},
        head=monotone({n: median["head", n] * scale[n] for n in sizes}), context=context,
        draft_head=(median["draft head", 1] * scale[1]) if draft_vocab else None,
        draft_vocab=draft_vocab,
        adapter={} if adapter is None else monotone({n: median["adapter", n] * scale[n]
                                                     for n in sizes}),
        spread=max(_spread(times) for times in samples.values()))


def _one_layer(cfg: ModelConfig, kind: str) -> ModelConfig:
    return dataclasses.replace(cfg, num_layers=1, layer_pattern=(kind,), exit_layers=None)


def _spread(times: Sequence[float]) -> float:
    """The spread of a piece's repeats: the interquartile range over the median, so that one
    slow repeat (a page fault, the collector), which the median already ignores, does not
    call the whole machine noisy."""
    if len(times) < 2:
        return 0.0
    first, _, third = statistics.quantiles(times, n=4, method="inclusive")
    return (third - first) / statistics.median(times)


def monotone(by_size: Mapping[int, float]) -> dict[int, float]:
    """Costs by token count with each at least the cost of every smaller count: more tokens
    never take less time, so a lower reading at a larger count is the machine's noise."""
    out, floor = {}, 0.0
    for n in sorted(by_size):
        floor = out[n] = max(floor, by_size[n])
    return out


def _layer_loop(cfg: ModelConfig, inner: int) -> Callable:
    """(params, hidden [1, n, D], cache) -> (hidden, cache): a one-layer model's cached pass
    `inner` times, each on the previous output, at the same slots after the cache's length."""

    @functools.partial(jax.jit, donate_argnums=2)
    def run(params, hidden, cache):
        layout = chain_layout(cache.lengths, hidden.shape[1], cache.max_len)

        def body(_, carry):
            return run_layers_cached(params, cfg, *carry, layout.slots,
                                     positions=layout.positions, mask=layout.mask)

        return jax.lax.fori_loop(0, inner, body, (hidden, cache))

    return run


def _adapter_loop(cfg: ModelConfig, context: int, inner: int) -> Callable:
    """(adapter, hidden [1, n, D], kv) -> (hidden, kv): a Kangaroo adapter's cached pass on n
    tokens after `context` ones `inner` times, each on the previous output."""

    @functools.partial(jax.jit, donate_argnums=2)
    def run(adapter, hidden, kv):
        layout = chain_layout(jnp.asarray([context], jnp.int32), hidden.shape[1], kv.k.shape[1])

        def body(_, carry):
            return run_adapter_cached(adapter, cfg, *carry, *layout)

        return jax.lax.fori_loop(0, inner, body, (hidden, kv))

    return run


def _model_loop(cfg: ModelConfig, inner: int) -> Callable:
    """(sampling, params, hidden [1, n, D], cache) -> (hidden, cache): the whole model's cached
    pass and the head (its sampled distribution with `sampling`) `inner` times, each input
    scaled by the previous output's maximum."""

    @functools.partial(jax.jit, donate_argnums=3)
    def run(sampling, params, hidden, cache):
        layout = chain_layout(cache.lengths, hidden.shape[1], cache.max_len)

        def body(_, carry):
            hidden, cache = carry
            out, cache = run_layers_cached(params, cfg, hidden, cache, layout.slots,
                                           positions=layout.positions, mask=layout.mask)
            logits = _distribution(exit_logits(params, cfg, out), sampling)
            return hidden * (1 + 1e-6 * jnp.max(logits)).astype(hidden.dtype), cache

        return jax.lax.fori_loop(0, inner, body, (hidden, cache))

    return run


def _head_loop(cfg: ModelConfig, inner: int) -> Callable:
    """(sampling, head params, vocab, hidden [1, n, D]) -> (hidden,): the head (over `vocab`'s
    ids, all when None; its sampled distribution with `sampling`) `inner` times, each input
    scaled by the previous output's maximum (so no call can be skipped)."""

    @jax.jit
    def run(sampling, params, vocab, hidden):
        def body(_, hidden):
            logits = _distribution(exit_head_logits(params, cfg, hidden, vocab), sampling)
            return hidden * (1 + 1e-6 * jnp.max(logits)).astype(hidden.dtype)

        return (jax.lax.fori_loop(0, inner, body, hidden),)

    return run


def _distribution(logits: jax.Array, sampling: SamplingParams | None) -> jax.Array:
    """The logits, or with `sampling` the distribution a sampled round draws from."""
    return logits if sampling is None else probabilities(logits, sampling)
