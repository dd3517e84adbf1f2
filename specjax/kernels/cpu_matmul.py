"""The multi-threaded few-row float32 matmul for XLA:CPU (cpu_matmul.cc).

XLA:CPU multiplies a one-row (or few-row) input by a weight matrix on one thread, so batch-1
decoding reads its weights at one core's bandwidth. The kernel splits each product over all
cores (up to 8; `SPECJAX_CPU_THREADS` overrides). Built on first use (`library`); `decision`
picks it per shape class (`SPECJAX_CPU_MATMUL`: auto, 1 or 0).

Up to `MAX_ROWS` rows (a row per sequence, a chain of up to 7 drafts): one or two rows keep
their sums in registers over a band of W read top to bottom, three to eight stream W once
through L1-resident sums; more rows (trees, long chains, batches) are XLA's dot. Every path
fuses each multiply-add and sums the contraction in order, and the chunking depends on the
shape alone, so a row's bits do not depend on the row count, the thread count or timing:
verifying drafts gives each the logits of decoding it alone (tested). On a busy machine the
caller computes alone for a while (cpu_matmul.cc's pool). Its vector loads are single
unaligned instructions (`simd.h`): written as memcpy, GCC's Zen 2 tuning made every product
10x slower and `ar` ran at 0.55x of XLA's dot (1.16x after the fix). On a mesh of several
devices XLA's dot runs: the kernel has no partitioning rule, so XLA would gather its operands
onto every device.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np

from specjax.kernels import decision, library

MAX_ROWS = 8  # measured: with more rows XLA's dot (YNNPACK) is as fast as this kernel or faster
ROW_CLASSES = (1, 2, 4, 8)  # products are measured against XLA's dot at these row counts
SOURCE = "cpu_matmul.cc"  # in this folder; its FFI handler SYMBOL registers as TARGET
SYMBOL = "SpecjaxSmallMatmulF32"
TARGET = "specjax_small_matmul_f32"
SWITCH = "SPECJAX_CPU_MATMUL"  # set to 0: XLA's own ops


def available() -> bool:
    """Whether products traced now go to the kernel (`library.available`)."""
    return library.available(SOURCE, SYMBOL, TARGET, SWITCH)


Product = Callable[[jax.Array, jax.Array, bool], jax.Array]  # (x, w, transposed) -> x @ w


def chosen(rows: int, k: int, n: int, transposed: bool, xla: Product) -> bool:
    """Whether a float32 [rows, k] x [k, n] product (w [n, k] when `transposed`) runs on the
    kernel: few rows, the kernel available, and `decision` picks it (against `xla`, XLA's
    product, measured at the row class's largest size)."""
    if rows > MAX_ROWS or not available():
        return False
    rows = decision.class_of(rows, ROW_CLASSES)
    return decision.use_kernel(
        "matmul", SWITCH, library.decisions_file(SOURCE),
        f"{rows}x{k}x{n}{' (w transposed)' if transposed else ''}",
        lambda: _measure(rows, k, n, transposed, xla))


SCHEDULES = {"adaptive": 0, "alone": 1, "shared": 2}  # cpu_matmul.cc's Schedule


def small_matmul(x: jax.Array, w: jax.Array, transposed: bool, target: str = TARGET,
                 schedule: str = "adaptive") -> jax.Array:
    """x [M, K] @ w [K, N] (or w [N, K] contracted on its last axis when `transposed`), float32,
    on the CPU kernel; requires `available()`. Each output row is bitwise independent of the
    other rows and of M. `target`: a variant build's FFI target (`library.load`). `schedule`:
    adaptive (the pool's threads help unless other processes hold the cores), or for measuring
    the two ends of that, alone (the calling thread only) or shared (always with the pool)."""
    rows, n = x.shape[0], w.shape[0] if transposed else w.shape[1]
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((rows, n), np.float32),
                            vmap_method="sequential")
    return call(x, w, transposed=bool(transposed), schedule=np.int32(SCHEDULES[schedule]))


def _measure(rows: int, k: int, n: int, transposed: bool, xla: Product) -> decision.Ratios:
    """XLA's time over the kernel's with the pool's threads helping (typical: an idle machine)
    and, at worst, also with the calling thread alone (a busy machine: the pool gets no core)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, k), dtype=np.float32)
    w = rng.standard_normal((n, k) if transposed else (k, n), dtype=np.float32) / np.sqrt(k)
    (ratios,) = decision.ratios_per_call({
        "xla": lambda x, w: xla(x, w, transposed),
        **{schedule: lambda x, w, schedule=schedule: small_matmul(x, w, transposed,
                                                                  schedule=schedule)
           for schedule in ("shared", "alone")}}, [(x, w)])
    return {"typical": ratios["shared"], "worst": min(ratios.values())}
