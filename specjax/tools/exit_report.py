"""The exit report: which exit E (and how many drafts K) a self-speculative decoder should use.

The logit lens over held-out text: every exit e = 1..L is read by the shared head (final norm +
unembedding), so it works on any model, trained here or freshly imported. Per exit it gives the
held-out loss, top-1 accuracy and top-1 agreement with the last layer (`training/evaluate.py`'s
evaluator), then predicts what drafting K tokens from that exit would give:

- tau, the mean tokens per round, assuming each draft is accepted independently with
  probability a = the exit's agreement (greedy acceptance): tau = (1 - a^(K+1)) / (1 - a);
- the speed-up over plain decoding, tau * plain / round, from measured costs: c_kind(n), one
  cached layer of each kind on n new tokens, and h(n), the head on n tokens
  (`tools/layer_costs.py`).
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from specjax.config import ModelConfig
from specjax.data import heldout_data, validation_texts, windows
from specjax.decoding.drafter import Drafter
from specjax.decoding.engine import Generator
from specjax.decoding.sampling import SamplingParams
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.model import Params
from specjax.tokenizer import Tokenizer
from specjax.tools.exit_workload import SAMPLED_PLAYS, ExitRuns, exit_runs, model_continuations
from specjax.tools.layer_costs import LayerCosts, measure_costs
from specjax.tools.loop_calibration import LoopCalibration, calibrate_loop
from specjax.training.evaluate import ExitReport, evaluate, make_eval_step

NUM_DRAFTS = (2, 3, 4, 5, 6, 7, 8)
# Above this spread between a piece's timed repeats the report warns that the machine was noisy.
NOISY_SPREAD = 0.25


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
        return self.round_speedup(self.runs.tree_tau(exit_layer, tree),
                                  self.costs.tree_round(self.layer_kinds, exit_layer, tree))

    def round_speedup(self, tau: float, pieces: float) -> float:
        """The predicted speed-up, as `speedup`'s, of rounds of `tau` tokens whose pieces take
        `pieces` seconds (mapped by the calibrated line when there is one)."""
        return self._end_to_end(self._decode_speedup(tau, pieces))

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
        if self.costs.adapter:
            parts.append(f"kangaroo adapter {span(self.costs.adapter)}")
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
                      sampling: SamplingParams | None = None,
                      adapter: Params | None = None) -> DraftExitReport:
    """The report of a loaded model (its stacked params, its checkpoint metadata `meta`)
    over `texts`, or by default its run's validation documents (`heldout_data`); `seq_len`
    defaults to that data config's. Costs are measured (`measure_costs` with `context`,
    `repeats`, the drafts' head over `draft_vocab` ids, the head's sampled distribution with
    `sampling`, a Kangaroo `adapter`'s block) unless given."""
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
                              repeats=repeats, draft_vocab=draft_vocab, sampling=sampling,
                              adapter=adapter)
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
