"""The real decode loop's costs, for the exit report's predictions on a workload
(`exit_report.on_workload`).

Pieces timed in isolation miss what the compiled loop adds (acceptance, the cache commit, the
draft loop, the while loop) and what it shares (a small model's layers fused into one
program): one benchmark of `ar` and of selfspec at one exit with the smallest and the largest
K on a few of the prompts measures the real loop (`LoopCalibration`). The real seconds per
token of `ar` replace the pieces' plain decoding; the real seconds per round of the two chains,
against the pieces' prediction of those rounds, fix a line (a scale and an overhead per round)
that maps every other (exit, K)'s pieces to the loop's seconds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from specjax.decoding.drafter import Drafter
from specjax.decoding.engine import AUTOREGRESSIVE, Generator
from specjax.decoding.sampling import SamplingParams
from specjax.tools.bench import StrategyResult, run_benchmark


@dataclasses.dataclass(frozen=True)
class LoopCalibration:
    """The real decode loop, timed on the first `prompts` prompts: `ar`'s seconds per decoded
    token and per prompt's prefill (with its first token), and the line from the pieces'
    seconds per round to the loop's: `scale` x pieces + `overhead`. `points` holds the
    measurements the line comes from: (K, measured seconds per round, the pieces' round,
    measured tau), at exit `exit_layer`."""

    token_seconds: float
    prefill_seconds: float
    scale: float
    overhead: float
    exit_layer: int
    points: tuple[tuple[int, float, float, float], ...]
    prompts: int = 1

    def round_seconds(self, pieces: float) -> float:
        """A round's seconds in the real loop from the pieces' `pieces`."""
        return self.scale * pieces + self.overhead

    def end_to_end(self, decode_speedup: float, prompts: int, decoded: int) -> float:
        """The whole call's speed-up (prefill included, as the benchmark reports it) on
        `prompts` prompts with `decoded` tokens after their first, when decoding alone is
        `decode_speedup` times faster than `ar`'s."""
        prefill, decode = prompts * self.prefill_seconds, decoded * self.token_seconds
        return (prefill + decode) / (prefill + decode / decode_speedup)


def fit_round(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(scale, overhead) of the line through (pieces' round, measured round) points, the
    smallest and the largest round. A line that does not rise (the machine's noise, or one
    point) becomes the ratio through the origin of the points' sums, so that a costlier round
    in the pieces is never cheaper in the loop."""
    (low, measured_low), (high, measured_high) = min(points), max(points)
    scale = (measured_high - measured_low) / (high - low) if high > low else 0.0
    if scale <= 0:
        return sum(m for _, m in points) / sum(p for p, _ in points), 0.0
    return scale, measured_low - scale * low


def calibrate_loop(generator: Generator, selfspec: Callable[[int, int], Drafter],
                   prompts: Sequence[Sequence[int]], pieces: Callable[[int, int], float], *,
                   max_new_tokens: int, exit_layer: int, num_draft: Sequence[int],
                   repeats: int = 3, sampling: SamplingParams | None = None) -> LoopCalibration:
    """Benchmarks `ar` and `selfspec(exit_layer, K)` for the smallest and largest K of
    `num_draft` on `prompts` (`tools.bench.run_benchmark`, batch 1; greedy, or sampled with
    `sampling`: a sampled round also pays for its probabilities and draws) and fits the line
    from `pieces(exit_layer, K)`, the pieces' seconds per round, to the loop's."""
    chains = sorted({min(num_draft), max(num_draft)})
    results = {r.name: r for r in run_benchmark(
        generator, {"ar": AUTOREGRESSIVE, **{f"K={k}": selfspec(exit_layer, k) for k in chains}},
        prompts, max_new_tokens=max_new_tokens, repeats=repeats, sampling=sampling)}
    ar = results["ar"]
    measured = [(k, _per_round(results[f"K={k}"]), pieces(exit_layer, k),
                 results[f"K={k}"].stats.tau) for k in chains]
    scale, overhead = fit_round([(pieces, real) for _, real, pieces, _ in measured])
    return LoopCalibration(_per_round(ar), ar.prefill_seconds / len(prompts), scale,
                           overhead, exit_layer, tuple(measured), len(prompts))


def _per_round(result: StrategyResult) -> float:
    """Decoding seconds (the call's, less its one-token prefill call's) per round."""
    if not result.stats.rounds or result.seconds <= result.prefill_seconds:
        raise ValueError(f"{result.name}: the run is too short to time its rounds apart from "
                         "the prefill (raise max_new_tokens)")
    return (result.seconds - result.prefill_seconds) / result.stats.rounds
