"""Decoding benchmark: strategies x prompts on the same weights, cache code and process.

Protocol: every strategy's program (one for every padded batch shape) is compiled ahead of
time and run once, so that no compile lands in a timed call; then, for each repeat, every
prompt batch is decoded by every strategy in turn (interleaved, so drift in machine speed hits
all strategies alike). A strategy's time on a batch is the median over repeats; tokens/s is
total tokens over the summed medians. XLA:CPU maps each compiled program in pieces, and a
process past the machine's limit on memory mappings crashes (`mappings`): strategies are
compiled in groups that fit, each group timed with the baseline and released before the next
compiles, so a strategy's speed-up is always over the baseline timed in turn with it
(`StrategyResult.speedup`).

The memory-bandwidth limit of batch-1 decoding is bandwidth / bytes read per token (weights plus
the live KV cache); `read_bandwidth` measures the machine's bandwidth in the same process.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.decoding.drafter import Drafter
from specjax.decoding.engine import Generation, Generator, RowStats
from specjax.decoding.sampling import SamplingParams
from specjax.mappings import MappingBudget
from specjax.model import Params, matmul_weights
from specjax.nn.layer_kinds import LAYER_KINDS
from specjax.nn.linear import matmul
from specjax.timing import time_interleaved, time_left, timed


@dataclasses.dataclass(frozen=True)
class StrategyResult:
    """Totals over all prompts. `prefill_seconds` is the time of the same calls generating one
    token (prefill plus the first token), so seconds - prefill_seconds is pure decoding. It is
    the fastest repeat, not the median: the short prefill call is the noisier one, and its
    minimum keeps the decode time an upper bound (the decode rate a lower bound) on a busy
    machine."""

    name: str
    tokens: int
    rows: int
    seconds: float
    prefill_seconds: float
    compile_seconds: float
    stats: RowStats
    generated: list[list[int]]
    distinct_4grams: float
    identical_to_baseline: bool | None  # None when sampling: outputs differ by design
    # The baseline's tokens/s in the repeats timed in turn with this strategy (None: no
    # baseline among the strategies).
    baseline_tokens_per_second: float | None = None

    @property
    def speedup(self) -> float | None:
        """Tokens/s over the baseline's, timed in the same interleaved repeats."""
        if self.baseline_tokens_per_second is None:
            return None
        return self.tokens_per_second / self.baseline_tokens_per_second

    @property
    def tokens_per_second(self) -> float:
        """End to end: every generated token over the whole call, prefill included."""
        return self.tokens / self.seconds

    @property
    def decode_tokens_per_second(self) -> float | None:
        """Tokens after the first over the time after prefill: the decode loop alone. None when
        the run is too short for the two timings to separate (decode time not positive)."""
        decode_seconds = self.seconds - self.prefill_seconds
        return (self.tokens - self.rows) / decode_seconds if decode_seconds > 0 else None


def read_bandwidth(num_bytes: int = 512 * 2**20, repeats: int = 5) -> tuple[float, float]:
    """Bytes/s reading an array far larger than the CPU caches, best of N: (a jitted reduction,
    which XLA spreads over all cores; a single-threaded numpy reduction)."""
    data = jnp.ones((num_bytes // 4,), jnp.float32)
    total = jax.jit(jnp.sum)
    total(data).block_until_ready()
    parallel = min(timed(lambda: total(data).block_until_ready()) for _ in range(repeats))
    host = np.ones(num_bytes // 4, np.float32)
    single = min(timed(host.sum) for _ in range(repeats))
    return num_bytes / parallel, num_bytes / single


def decode_matrices(params: Params, cfg: ModelConfig) -> list[tuple[jax.Array, bool]]:
    """Every weight matrix a decode step multiplies, as (2-D view, contracted over its leading
    axis?), contracted as the model contracts it: over a leading d_model axis (attention qkv,
    MLP gate/up, untied head), else onto a trailing d_model axis (attention out, MLP down); the
    tied embedding over its trailing d_model axis (as the head). Untied, the embedding is only
    gathered from, so it is left out; so are depthwise filters (Mamba-2's conv)."""
    products = []
    for top, leaf in matmul_weights(params, cfg):
        if top == "embed":
            products.append((leaf, False))
        elif leaf.shape[0] == cfg.d_model:
            products.append((leaf.reshape(cfg.d_model, -1), True))
        else:
            products.append((leaf.reshape(-1, cfg.d_model), True))
    return products


def matvec_bandwidth(params: Params, cfg: ModelConfig, steps: int = 10,
                     repeats: int = 5) -> float:
    """Bytes/s of a bare chain of one-row products with every `decode_matrices` matrix, jitted
    as one loop, best of N: batch-1 decoding's ceiling under this runtime with nothing else
    (attention, norms, sampling) in the step. Each product's input depends on the previous
    output, so they run one after another, as in a decode step."""
    products = decode_matrices(params, cfg)
    matrices, leading = [m for m, _ in products], [lead for _, lead in products]
    inputs = [jax.random.normal(jax.random.PRNGKey(i), (1, m.shape[0] if lead else m.shape[1]),
                                cfg.compute_dtype) for i, (m, lead) in enumerate(products)]

    @jax.jit
    def chain(matrices, inputs):
        def one_pass(_, scale):
            for matrix, lead, x in zip(matrices, leading, inputs, strict=True):
                matrix = matrix.astype(cfg.compute_dtype)
                out = matmul(x * scale, matrix, transpose_w=not lead)
                scale = 1.0 + 1e-6 * jnp.sum(out)
            return scale
        return jax.lax.fori_loop(0, steps, one_pass, jnp.ones((), cfg.compute_dtype))

    chain(matrices, inputs).block_until_ready()
    seconds = min(timed(lambda: chain(matrices, inputs).block_until_ready())
                  for _ in range(repeats))
    return steps * sum(m.size * m.dtype.itemsize for m in matrices) / seconds


def distinct_ngram_fraction(rows: Sequence[Sequence[int]], n: int = 4) -> float:
    """Unique n-grams over all n-grams of each generated row, averaged: near 1 for varied text,
    near 0 when greedy decoding has fallen into a loop (which inflates draft acceptance)."""
    fractions = []
    for row in rows:
        grams = [tuple(row[i:i + n]) for i in range(len(row) - n + 1)]
        if grams:
            fractions.append(len(set(grams)) / len(grams))
    return float(np.mean(fractions)) if fractions else 0.0


def decode_step_bytes(params: Params, cfg: ModelConfig, context: float,
                      batch: int = 1) -> float:
    """Bytes one decode step of `batch` rows moves: every weight once (one gathered embedding
    row per row when the embedding is untied) plus each row's cache at `context` tokens
    (`LayerKind.step_bytes`: the live K/V of attention layers, the state of Mamba-2 layers)."""
    weights = sum(leaf.nbytes for leaf in jax.tree.leaves(params))
    if not cfg.tie_embeddings:
        weights += batch * params["embed"][0].nbytes - params["embed"].nbytes
    return weights + batch * sum(LAYER_KINDS[name].step_bytes(cfg, context)
                                 for name in cfg.layer_kinds)


def run_benchmark(generator: Generator, strategies: dict[str, Drafter],
                  prompts: Sequence[Sequence[int]], *, max_new_tokens: int, batch_size: int = 1,
                  repeats: int = 3, baseline: str = "ar",
                  sampling: SamplingParams | None = None, seeds: int = 1,
                  progress: Callable[[str], None] | None = None) -> list[StrategyResult]:
    """Decoding of `prompts` by each strategy (greedy unless `sampling`); see the module
    docstring. Sampled runs decode every batch once per seed 0..`seeds`-1, the same seeds for
    every strategy: one seed's τ, and so its speed, differed by 12% between two seeds at 16
    prompts of 256 tokens. `progress` receives a line after each compile and each timed
    repeat."""
    if seeds < 1 or (seeds > 1 and sampling is None):
        raise ValueError(f"seeds={seeds}: must be >= 1, and 1 for greedy decoding (which no "
                         "seed changes; sample with a temperature > 0 to average over seeds)")
    progress = progress or (lambda line: None)
    batches = [(prompts[i:i + batch_size], seed) for seed in range(seeds)
               for i in range(0, len(prompts), batch_size)]
    shapes = [generator.pad(generator.bucket_rows(rows))[0].shape for rows, _ in batches]
    programs: dict[str, dict] = {}
    compile_seconds: dict[str, float] = {}

    def compile_programs(name: str) -> None:
        """The strategy's program for every padded batch shape, compiled ahead of time and run
        once (the prefill call runs the same program)."""
        programs[name] = {}
        for index in sorted({shape: i for i, shape in reversed(list(enumerate(shapes)))}.values()):
            rows, seed = batches[index]
            started = time.perf_counter()
            program = generator.compile(rows, max_new_tokens=max_new_tokens,
                                        strategy=strategies[name], sampling=sampling)
            if index == 0:
                compile_seconds.setdefault(name, time.perf_counter() - started)
            jax.block_until_ready(program(rows, seed=seed))
            programs[name][shapes[index]] = program

    def calls(group: list[str]) -> dict:
        """Each strategy's one-token (prefill) call just before its full one, by the same
        program (its budget is traced): the prefill the full call pays, on its cache."""
        def call(name: str, new: int) -> Callable[[int], Any]:
            return lambda index: jax.block_until_ready(programs[name][shapes[index]](
                batches[index][0], seed=batches[index][1], max_new_tokens=new))
        return {key: function for name in group for key, function in
                (((name, "prefill"), call(name, 1)), (name, call(name, max_new_tokens)))}

    timed: dict[str, list[tuple[dict, dict]]] = {name: [] for name in strategies}

    def time_group(group: list[str]) -> None:
        started = time.perf_counter()
        seconds, outputs = time_interleaved(
            calls(group), len(batches), repeats,
            lambda done: progress(f"timed repeat {done}/{repeats} of {len(group)} strategies "
                                  f"({time_left(started, done, repeats)})"))
        for name in group:
            timed[name].append((seconds, outputs))

    # Strategies are compiled (the baseline first) until one more would take the process near
    # its limit on memory mappings; that group is timed, every compiled program released
    # (XLA:CPU unmaps a program only when JAX's caches let go of it), and the next group
    # compiles the baseline again, so that each strategy is timed in turn with it.
    names = sorted(strategies, key=lambda name: name != baseline)
    kept = names[:1] if names[0] == baseline else []
    budget, started, group = MappingBudget(), time.perf_counter(), []
    for done, name in enumerate(names, 1):
        if len(group) > len(kept) and not budget.room_for_another():
            time_group(group)
            programs.clear()
            jax.clear_caches()
            gc.collect()
            group = []
            for again in kept:
                compile_programs(again)
                group.append(again)
                budget.compiled()
        if group and not budget.room_for_another():
            raise ValueError(budget.refusal("a strategy beside the baseline"))
        compile_programs(name)
        group.append(name)
        budget.compiled()
        progress(f"compiled {name} ({compile_seconds[name]:.1f} s; {done}/{len(names)}, "
                 f"{time_left(started, done, len(names))})")
    time_group(group)
    results = []
    unpacked = {name: [generator.unpack(o) for o in runs[-1][1][name]]
                for name, runs in timed.items()}
    base_tokens = (sum(len(t) for g in unpacked[baseline] for t in g.tokens)
                   if baseline in strategies else None)
    for name in strategies:
        merged = _merge(unpacked[name])
        reference = _merge(unpacked.get(baseline, unpacked[name]))
        results.append(StrategyResult(
            name=name, tokens=sum(len(t) for t in merged.tokens), rows=len(merged.tokens),
            seconds=_per_batch(timed[name], name, statistics.median),
            prefill_seconds=_per_batch(timed[name], (name, "prefill"), min),
            compile_seconds=compile_seconds[name], stats=merged.total, generated=merged.tokens,
            distinct_4grams=distinct_ngram_fraction(merged.tokens),
            identical_to_baseline=None if sampling else merged.tokens == reference.tokens,
            baseline_tokens_per_second=None if base_tokens is None else base_tokens / _per_batch(
                [run for run in timed[baseline] if name in run[0]], baseline,
                statistics.median)))
    return results


def _per_batch(runs: list[tuple[dict, dict]], key: Any,
               reduce: Callable[[list[float]], float]) -> float:
    """Over the timed groups `runs`, each batch's times under `key` reduced (the median, the
    fastest), summed over batches."""
    per_batch = zip(*[seconds[key] for seconds, _ in runs], strict=True)
    return sum(reduce([t for times in batch for t in times]) for batch in per_batch)


def _merge(generations: Sequence[Generation]) -> Generation:
    return Generation(tokens=[t for g in generations for t in g.tokens],
                      stats=[s for g in generations for s in g.stats],
                      trace=[t for g in generations for t in g.trace])
