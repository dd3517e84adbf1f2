"""The exit report: which exit E (and how many drafts K) a self-speculative decoder should use.

The logit lens over held-out text: every exit e = 1..L is read by the shared head (final norm +
unembedding), so it works on any model, trained here or freshly imported. Per exit it gives the
held-out loss, top-1 accuracy and top-1 agreement with the last layer (`training/evaluate.py`'s
evaluator), then predicts what drafting K tokens from that exit would give:

- tau, the mean tokens per round, assuming each draft is accepted independently with
  probability a = the exit's agreement (greedy acceptance): tau = (1 - a^(K+1)) / (1 - a);
- the speed-up over plain decoding, tau * plain / round, from measured costs: c_kind(n), one
  cached layer of each kind on n new tokens, and h(n), the head on n tokens (`measure_costs`).
  Plain decoding costs sum_l c_l(1) + h(1) per token. A round drafts K tokens through layers
  [0, E) and the head, then verification runs the last draft (which drafting never ran)
  through [0, E) and all K + 1 positions through [E, L) and the head (`layerskip`'s reuse):
  K * (sum_{l<E} c_l(1) + h(1)) + sum_{l<E} c_l(1) + sum_{l>=E} c_l(K+1) + h(K+1).

On held-out text both predictions are estimates: acceptance is not i.i.d. (drafts fail in
runs), another text's agreement is not the workload's, and isolated layers timed on their own
miss what the compiled decode loop adds (accept, commit, sampling). On a workload
(`on_workload`: prompts the model continues, greedy or sampled) tau comes from the exits'
acceptance along those continuations, played round by round (`tools/exit_workload.py`), and
each round's cost from pieces calibrated on the real loop (`tools/loop_calibration.py`); the
speed-up is then the benchmark's, prefill included.
`bench/bench.py --exit_layer=E --num_draft=K` measures the real speed-up.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.data import heldout_data, validation_texts, windows
from specjax.decoding.drafter import Drafter
from specjax.decoding.engine import Generator
from specjax.decoding.sampling import SamplingParams, probabilities
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.decoding.shapes.tree import chain_layout
from specjax.heads.vocab_subset import DraftVocab, exit_head_logits
from specjax.model import (
    Params,
    allocate_cache,
    exit_logits,
    layer_params,
    run_layers_cached,
    unstack_layers,
)
from specjax.nn.cache import Cache
from specjax.timing import time_interleaved
from specjax.tokenizer import Tokenizer
from specjax.tools.exit_workload import SAMPLED_PLAYS, ExitRuns, exit_runs, model_continuations
from specjax.tools.loop_calibration import LoopCalibration, calibrate_loop
from specjax.training.evaluate import ExitReport, evaluate, make_eval_step

NUM_DRAFTS = (2, 3, 4, 5, 6, 7, 8)
# Above this spread between a piece's timed repeats the report warns that the machine was noisy.
NOISY_SPREAD = 0.25


@dataclasses.dataclass(frozen=True)
class LayerCosts:
    """Seconds, batch 1, on n new tokens: one cached layer of each kind (`layer[kind][n]`,
    after `context` cached tokens) and the shared head (`head[n]`); `draft_head`, the head on
    one token over the draft vocabulary of `draft_vocab` ids that drafts use (None: the full
    head). Tests build it by hand; `measure_costs` measures it."""

    layer: Mapping[str, Mapping[int, float]]
    head: Mapping[int, float]
    context: int = 0
    spread: float = 0.0  # the largest interquartile range / median of a piece's repeats
    draft_head: float | None = None
    draft_vocab: int = 0

    def plain(self, layer_kinds: Sequence[str]) -> float:
        """Seconds per token of plain (autoregressive) decoding: every layer and the head on
        one token."""
        return self.whole_pass(layer_kinds, 1)

    def whole_pass(self, layer_kinds: Sequence[str], num_tokens: int) -> float:
        """Seconds of one pass of every layer and the head on `num_tokens` new tokens: what
        verifying `num_tokens - 1` drafts costs."""
        return sum(self.layer[kind][num_tokens] for kind in layer_kinds) + self.head[num_tokens]

    def round(self, layer_kinds: Sequence[str], exit_layer: int, num_draft: int) -> float:
        """Seconds of one self-speculative round drafting a chain of `num_draft` tokens from
        exit `exit_layer` (see the module docstring)."""
        return self.tree_round(layer_kinds, exit_layer,
                               StaticTree((-1, *range(num_draft - 1))[:num_draft]))

    def tree_round(self, layer_kinds: Sequence[str], exit_layer: int, tree: StaticTree) -> float:
        """Seconds of one self-speculative round drafting the static tree `tree` from exit
        `exit_layer` (`StaticTree.round_seconds`): a draft pass is the exit's layers and the
        draft head, the leaves pass the exit's layers, and the rest of the verification every
        other layer and the head. Sizes between the measured ones are interpolated."""
        def layers(kinds: Sequence[str], num_tokens: int) -> float:
            return sum(self._at(self.layer[kind], num_tokens) for kind in kinds)

        shallow, deep = layer_kinds[:exit_layer], layer_kinds[exit_layer:]
        return tree.round_seconds(lambda n: layers(shallow, n) + self._draft_head(n),
                                  lambda n: layers(shallow, n),
                                  lambda n: layers(deep, n) + self._at(self.head, n))

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


def predicted_tau(agreement: float, num_draft: int) -> float:
    """Mean tokens per round of a chain of `num_draft` drafts, each accepted independently with
    probability `agreement`: 1 + a + ... + a^K (the bonus token always counts)."""
    if agreement >= 1.0:
        return float(num_draft + 1)
    return (1.0 - agreement ** (num_draft + 1)) / (1.0 - agreement)


@dataclasses.dataclass(frozen=True)
class DraftExitReport:
    """Per-exit metrics on held-out text (`metrics`, index e-1 is exit e), the measured costs,
    and the predicted tau and speed-up of each (exit, K) derived from them; on a workload
    (`on_workload`), the exits' acceptance along the model's continuations (`runs`)
    and the real loop's calibration (`loop`) that the predictions then rest on."""

    metrics: ExitReport
    costs: LayerCosts
    layer_kinds: tuple[str, ...]
    num_draft: tuple[int, ...] = NUM_DRAFTS
    seq_len: int = 0
    source: str = ""
    runs: ExitRuns | None = None
    loop: LoopCalibration | None = None
    workload: str = ""

    @property
    def num_layers(self) -> int:
        return len(self.layer_kinds)

    def tau(self, exit_layer: int, num_draft: int) -> float:
        if self.runs is not None:
            return self.runs.tau(exit_layer, num_draft)
        return predicted_tau(self.metrics.agreement[exit_layer - 1], num_draft)

    def decode_speedup(self, exit_layer: int, num_draft: int) -> float:
        """Decoding alone: tau (played when there are runs) x seconds per plain token /
        seconds per round, both from the real loop when calibrated, else from the pieces."""
        return self._decode_speedup(self.tau(exit_layer, num_draft),
                                    self.costs.round(self.layer_kinds, exit_layer, num_draft))

    def speedup(self, exit_layer: int, num_draft: int) -> float:
        """The predicted speed-up: on a workload the benchmark's (the whole call, prefill
        included), else decoding alone."""
        return self._end_to_end(self.decode_speedup(exit_layer, num_draft))

    def tree_speedup(self, exit_layer: int, tree: StaticTree) -> float:
        """The predicted speed-up, as `speedup`'s, of self-speculation from the exit with
        the static tree `tree`: tau played over the runs (`ExitRuns.tree_tau`, greedy or
        sampled), its round priced by `LayerCosts.tree_round` and mapped by the calibrated
        line."""
        if self.runs is None:
            raise ValueError("a tree's speed-up is played over a workload's runs")
        tau = self.runs.tree_tau(exit_layer, tree)
        return self._end_to_end(self._decode_speedup(
            tau, self.costs.tree_round(self.layer_kinds, exit_layer, tree)))

    def copied_speedup(self, tau: float, num_draft: int, draft_seconds: float = 0.0) -> float:
        """The predicted speed-up, as `speedup`'s, of a drafter that copies its `num_draft`
        drafts from the text at `tau` tokens per round (`copied_play.play_copied`): its
        round is the verification of K + 1 tokens (mapped as a round's pieces are) plus
        `draft_seconds`, its proposal's own measured cost."""
        pieces = self.costs.whole_pass(self.layer_kinds, num_draft + 1)
        return self._end_to_end(self._decode_speedup(tau, pieces, draft_seconds))

    def _decode_speedup(self, tau: float, pieces: float, extra_seconds: float = 0.0) -> float:
        if self.loop is None:
            return tau * self.costs.plain(self.layer_kinds) / (pieces + extra_seconds)
        return tau * self.loop.token_seconds / (self.loop.round_seconds(pieces) + extra_seconds)

    def _end_to_end(self, decode: float) -> float:
        if self.loop is None or self.runs is None:
            return decode
        return self.loop.end_to_end(decode, len(self.runs.accept), self.runs.positions)

    def best(self) -> tuple[int, int] | None:
        """The (exit, K) with the highest predicted speed-up among the exits a drafter can use
        (1..L-1); None for a one-layer model."""
        pairs = [(e, k) for e in range(1, self.num_layers) for k in self.num_draft]
        return max(pairs, key=lambda pair: self.speedup(*pair)) if pairs else None

    def to_records(self) -> list[dict[str, Any]]:
        """One JSON-ready record per exit 1..L; tau and speed-up keyed by K as a string (and
        the mean acceptance along the workload's continuations when there is one)."""
        return [{"exit": e, "loss": self.metrics.loss[e - 1],
                 "accuracy": self.metrics.accuracy[e - 1],
                 "agreement": self.metrics.agreement[e - 1],
                 **({"workload_agreement": self.runs.rate(e)} if self.runs else {}),
                 "tau": {str(k): self.tau(e, k) for k in self.num_draft},
                 "speedup": {str(k): self.speedup(e, k) for k in self.num_draft}}
                for e in range(1, self.num_layers + 1)]

    def table(self) -> str:
        drafts = "".join(f"{f'K={k}':>7}" for k in self.num_draft)
        on = (f"on {self.workload}, the benchmark's (prefill included)" if self.loop else
              "decoding alone")
        lines = [f"{self.metrics.tokens} held-out tokens in windows of {self.seq_len}"
                 + (f" ({self.source})" if self.source else ""),
                 f"{'':>32}predicted speed-up with K drafts from the exit, {on}",
                 f"{'exit':>4}{'loss':>8}{'top1 acc':>10}{'agree':>8}"
                 + (f"{'on it':>7}" if self.runs else "") + f"  {drafts}"]
        for record in self.to_records():
            speedups = "".join(f"{s:6.2f}x" for s in record["speedup"].values())
            workload = f"{record['workload_agreement']:7.3f}" if self.runs else ""
            last = "  (last layer)" if record["exit"] == self.num_layers else ""
            lines.append(f"{record['exit']:>4}{record['loss']:8.4f}{record['accuracy']:10.3f}"
                         f"{record['agreement']:8.3f}{workload}  {speedups}{last}")
        lines.append(self._costs_line())
        lines.append(self._verification_line())
        if self.loop:
            lines.append(self._loop_line())
        if self.costs.spread > NOISY_SPREAD:
            lines.append(f"warning: the middle half of a timed piece's repeats spread over "
                         f"{self.costs.spread:.0%} of its median (a busy machine?): the "
                         "predicted speed-ups are rough; measure again on an idle machine")
        best = self.best()
        if best is not None:
            e, k = best
            verdict = ("best predicted" if self.speedup(e, k) > 1 else
                       "no exit is predicted faster than plain decoding; the closest")
            sampling = self.runs.sampling if self.runs else None
            mode = "" if sampling is None else (
                f" --temperature={float(sampling.temperature):g} --top_k={int(sampling.top_k)}"
                f" --top_p={float(sampling.top_p):g} --seeds={SAMPLED_PLAYS}")
            lines.append(f"{verdict}: exit {e} with {k} drafts, {self.speedup(e, k):.2f}x "
                         f"(tau {self.tau(e, k):.2f}); measure it with bench/bench.py "
                         f"--exit_layer={e} --num_draft={k}{mode}")
        lines.append(
            "estimates: tau played over the exits' acceptance along the continuations, round "
            "costs from the pieces mapped onto the loop's timed rounds" if self.loop else
            "estimates: i.i.d. acceptance at each exit's agreement, each piece's cost scaled to "
            "a whole pass; bench/bench.py measures the real speed-up")
        return "\n".join(lines)

    def _loop_line(self) -> str:
        loop = self.loop
        # The prompts the loop was timed on (the first few), each seed's continuations of them.
        prompts = len(self.runs.accept) // (1 if self.runs.sampling is None else SAMPLED_PLAYS)
        timed = ExitRuns(tuple(row for start in range(0, len(self.runs.accept), prompts)
                               for row in self.runs.accept[start:start + loop.prompts]))
        points = "; ".join(f"K={k}: {1e3 * real:.2f} ms a round (pieces {1e3 * pieces:.2f} ms), "
                           f"tau {tau:.2f} (played {timed.tau(loop.exit_layer, k):.2f})"
                           for k, real, pieces, tau in loop.points)
        return (f"real loop: ar {1e3 * loop.token_seconds:.3f} ms/token (pieces "
                f"{1e3 * self.costs.plain(self.layer_kinds):.3f}); selfspec at exit "
                f"{loop.exit_layer} on the first {loop.prompts} prompts: {points}; so a round "
                f"takes {loop.scale:.2f} x the pieces' + {1e3 * loop.overhead:.3f} ms")

    def _costs_line(self) -> str:
        first, last = 1, max(self.num_draft) + 1

        def span(by_size: Mapping[int, float]) -> str:
            return f"{1e3 * by_size[first]:.3f} ms (1 token) / {1e3 * by_size[last]:.3f} ms " \
                   f"({last} tokens)"

        parts = [f"{kind} layer {span(self.costs.layer[kind])}"
                 for kind in dict.fromkeys(self.layer_kinds)]
        parts.append(f"head {span(self.costs.head)}")
        if self.costs.draft_head is not None:
            parts.append(f"draft head over {self.costs.draft_vocab} ids "
                         f"{1e3 * self.costs.draft_head:.3f} ms (1 token)")
        return (f"costs (batch 1, {self.costs.context} cached tokens): " + "; ".join(parts)
                + f"; plain decoding {1e3 * self.costs.plain(self.layer_kinds):.3f} ms/token")

    def _verification_line(self) -> str:
        sizes = sorted(self.costs.head)
        one = self.costs.whole_pass(self.layer_kinds, 1)
        ratios = ", ".join(f"{n}: {self.costs.whole_pass(self.layer_kinds, n) / one:.2f}"
                           for n in sizes)
        return f"a whole pass on n tokens, in one-token passes: {ratios}"


def token_windows(texts: Iterable[str], tokenizer: Tokenizer, seq_len: int,
                  max_tokens: int) -> np.ndarray:
    """[N, seq_len + 1] int32: the texts encoded as training documents are (the tokenizer's
    special tokens around each, then EOS), concatenated and cut into
    consecutive windows (inputs window[:-1], targets window[1:]), at most max_tokens // seq_len
    of them (so at most `max_tokens` predicted tokens); texts past those are not encoded."""
    if seq_len < 1 or max_tokens < seq_len:
        raise ValueError(f"seq_len={seq_len} must be >= 1 and max_tokens={max_tokens} at least "
                         "one window of seq_len")
    wanted = max_tokens // seq_len
    parts, total = [], 0
    for text in texts:
        parts.append(tokenizer.encode(text, add_special_tokens=True, add_eos=True))
        total += len(parts[-1])
        if total >= wanted * (seq_len + 1):
            break
    count = min(wanted, total // (seq_len + 1))
    if count == 0:
        raise ValueError(f"the held-out text holds {total} tokens, too few for one window of "
                         f"seq_len + 1 = {seq_len + 1} (give more text or a smaller seq_len)")
    return windows(np.concatenate(parts), seq_len)[:count]


def _one_layer(cfg: ModelConfig, kind: str) -> ModelConfig:
    return dataclasses.replace(cfg, num_layers=1, layer_pattern=(kind,), exit_layers=None)


def measure_costs(params: Params, cfg: ModelConfig, sizes: Iterable[int], *,
                  context: int = 256, repeats: int = 7, inner: int = 8,
                  draft_vocab: int = 0, sampling: SamplingParams | None = None) -> LayerCosts:
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
    pieces without it priced ngram's sampled K=4 round 27% too cheap."""
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
        spread=max(_spread(times) for times in samples.values()))


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


def exit_report(params: Params, cfg: ModelConfig, windows: np.ndarray, costs: LayerCosts, *,
                num_draft: Sequence[int] = NUM_DRAFTS, batch_size: int = 4,
                source: str = "") -> DraftExitReport:
    """The report over `windows` [N, T+1] (`token_windows`), in batches of `batch_size`
    windows (the windows past the last whole batch are left out, so one program compiles),
    with `costs` (`measure_costs`, or fixed ones)."""
    _check_drafts(num_draft)
    if len(windows) == 0:
        raise ValueError("no held-out windows to evaluate")
    batch = min(batch_size, len(windows))
    batches = [windows[i:i + batch] for i in range(0, len(windows) // batch * batch, batch)]
    metrics = evaluate(jax.jit(make_eval_step(cfg)), params, batches)
    return DraftExitReport(metrics, costs, cfg.layer_kinds, tuple(sorted(set(num_draft))),
                           windows.shape[1] - 1, source)


def _check_drafts(num_draft: Sequence[int]) -> None:
    if not num_draft or min(num_draft) < 1:
        raise ValueError(f"num_draft={list(num_draft)} must list draft counts >= 1")


def model_exit_report(params: Params, cfg: ModelConfig, tokenizer: Tokenizer,
                      meta: Mapping[str, Any], texts: Sequence[str] | None = None, *,
                      seq_len: int | None = None, max_tokens: int = 32768,
                      num_draft: Sequence[int] = NUM_DRAFTS, batch_size: int = 4,
                      context: int = 256, repeats: int = 7, draft_vocab: int = 0,
                      costs: LayerCosts | None = None,
                      sampling: SamplingParams | None = None) -> DraftExitReport:
    """The report of a loaded model (its stacked params, its checkpoint metadata `meta`)
    over `texts`, or by default its run's validation documents (`heldout_data`); `seq_len`
    defaults to that data config's. Costs are measured (`measure_costs` with `context`,
    `repeats`, the drafts' head over `draft_vocab` ids, the head's sampled distribution with
    `sampling`) unless given."""
    _check_drafts(num_draft)
    data = heldout_data(meta) if texts is None or seq_len is None else None  # read if needed
    seq_len = data.seq_len if seq_len is None else seq_len
    if texts is None:
        texts = validation_texts(data)
        source = f"validation documents of the {data.source!r} data"
    else:
        texts = list(texts)
        source = f"{len(texts)} given texts"
    windows = token_windows(texts, tokenizer, seq_len, max_tokens)
    if costs is None:
        costs = measure_costs(params, cfg, [1] + [k + 1 for k in num_draft], context=context,
                              repeats=repeats, draft_vocab=draft_vocab, sampling=sampling)
    return exit_report(params, cfg, windows, costs, num_draft=num_draft,
                       batch_size=batch_size, source=source)


def on_workload(report: DraftExitReport, params: Params, cfg: ModelConfig,
                generator: Generator, selfspec: Callable[[int, int], Drafter],
                prompts: Sequence[Sequence[int]], *, max_new_tokens: int, repeats: int = 3,
                calibration_prompts: int = 2, draft_ids: jax.Array | np.ndarray | None = None,
                workload: str = "", sampling: SamplingParams | None = None,
                progress: Callable[[str], None] = lambda line: None) -> DraftExitReport:
    """The report's predictions on `prompts` (`tools/exit_workload.py`): the model's
    continuations, greedy or with `sampling` `SAMPLED_PLAYS` of each (seeds 0, 1, ...), each
    exit's acceptance along them (over `draft_ids`, the drafts' vocabulary), and the real loop
    calibrated on the first `calibration_prompts` with `selfspec(exit, K)` at the exit the
    uncalibrated report then ranks first, in the same mode (a sampled round also pays for its
    probabilities and draws). `workload` names the prompts in the table. A one-layer model,
    whose only exit is the last, is returned as it is: no exit can draft."""
    if report.num_layers < 2:
        return report
    seeds = range(1 if sampling is None else SAMPLED_PLAYS)
    progress(f"exit report: continuing {len(prompts)} prompts " + (
        "greedily ..." if sampling is None else f"sampled ({len(seeds)} seeds) ..."))
    continuations = [continuation for seed in seeds for continuation in model_continuations(
        generator, prompts, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed)]
    runs = exit_runs(params, cfg, list(prompts) * len(seeds), continuations, draft_ids,
                     sampling)
    if runs.positions == 0:
        raise ValueError("the prompts' continuations end at their first token: nothing to "
                         "draft (raise max_new_tokens, or give prompts that do not end at EOS)")
    played = dataclasses.replace(report, runs=runs)
    exit_layer = played.best()[0]  # two layers or more: an exit below the last
    mode = "" if sampling is None else ", sampled"
    progress(f"exit report: timing the real loop (ar, selfspec at exit {exit_layer}{mode}) ...")
    loop = calibrate_loop(
        generator, selfspec, prompts[:calibration_prompts],
        lambda e, k: report.costs.round(report.layer_kinds, e, k),
        max_new_tokens=max_new_tokens, exit_layer=exit_layer, num_draft=report.num_draft,
        repeats=repeats, sampling=sampling)
    sampled = "" if sampling is None else f", sampled ({len(seeds)} seeds of each)"
    return dataclasses.replace(played, loop=loop, workload=(
        workload or f"{len(prompts)} prompts x {max_new_tokens} new tokens") + sampled)
