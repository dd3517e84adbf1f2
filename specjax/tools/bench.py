"""Decoding benchmark: strategies x prompts on the same weights, cache code and process.

Protocol: every strategy is compiled and run once (its compile time is the first call minus a
warm call), for every padded batch shape, so that no compile lands in a timed call; then, for
each repeat, every prompt batch is decoded by every strategy in turn (interleaved, so drift in
machine speed hits all strategies alike). A strategy's time on a batch is the median over
repeats; tokens/s is total tokens over the summed medians. A sweep whose programs would take
the process past the machine's limit on memory mappings is refused as soon as the strategies
compiled so far project it there (`mappings.MappingBudget`), not left to crash at the limit.

The memory-bandwidth limit of batch-1 decoding is bandwidth / bytes read per token (weights plus
the live KV cache); `read_bandwidth` measures the machine's bandwidth in the same process.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence

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


def bytes_per_token(params: Params, cfg: ModelConfig, context: float) -> float:
    """Bytes one decode step moves: every weight (one gathered embedding row when the embedding
    is untied) plus each layer's cache at `context` tokens (`LayerKind.step_bytes`: the live
    K/V of attention layers, the state of Mamba-2 layers)."""
    weights = sum(leaf.nbytes for leaf in jax.tree.leaves(params))
    if not cfg.tie_embeddings:
        weights += params["embed"][0].nbytes - params["embed"].nbytes
    return weights + sum(LAYER_KINDS[name].step_bytes(cfg, context) for name in cfg.layer_kinds)


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
    def run(name, batch, new=max_new_tokens):
        rows, seed = batch
        return jax.block_until_ready(generator.run(rows, max_new_tokens=new, seed=seed,
                                                   strategy=strategies[name], sampling=sampling))

    shapes = {}  # a batch of each padded shape (rows, width): each compiles programs of its own
    for index, (rows, _) in enumerate(batches):
        shapes.setdefault(generator.pad(rows)[0].shape, index)
    compile_seconds, budget = {}, MappingBudget()
    started = time.perf_counter()
    for done, name in enumerate(strategies, 1):
        run(name, batches[0], 1)
        first = timed(run, name, batches[0])
        compile_seconds[name] = max(first - timed(run, name, batches[0]), 0.0)
        for index in set(shapes.values()) - {0}:
            run(name, batches[index], 1)
            run(name, batches[index])
        progress(f"compiled {name} ({compile_seconds[name]:.1f} s; {done}/{len(strategies)}, "
                 f"{time_left(started, done, len(strategies))})")
        budget.check(done, len(strategies), "strategies")
    calls = {}
    for name in strategies:  # each strategy's one-token (prefill) call just before its full one
        calls[name, "prefill"] = lambda index, name=name: run(name, batches[index], 1)
        calls[name] = lambda index, name=name: run(name, batches[index])
    started = time.perf_counter()
    times, outputs = time_interleaved(
        calls, len(batches), repeats,
        lambda done: progress(f"timed repeat {done}/{repeats} of {len(strategies)} strategies "
                              f"({time_left(started, done, repeats)})"))
    results = []
    unpacked = {name: [generator.unpack(o) for o in outputs[name]] for name in strategies}
    for name in strategies:
        merged = _merge(unpacked[name])
        reference = _merge(unpacked.get(baseline, unpacked[name]))
        results.append(StrategyResult(
            name=name, tokens=sum(len(t) for t in merged.tokens), rows=len(merged.tokens),
            seconds=sum(statistics.median(ts) for ts in times[name]),
            prefill_seconds=sum(min(ts) for ts in times[name, "prefill"]),
            compile_seconds=compile_seconds[name], stats=merged.total, generated=merged.tokens,
            distinct_4grams=distinct_ngram_fraction(merged.tokens),
            identical_to_baseline=None if sampling else merged.tokens == reference.tokens))
    return results


def _merge(generations: Sequence[Generation]) -> Generation:
    return Generation(tokens=[t for g in generations for t in g.tokens],
                      stats=[s for g in generations for s in g.stats],
                      trace=[t for g in generations for t in g.trace])
