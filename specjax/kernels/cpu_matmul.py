"""The multi-threaded few-row float32 matmul for XLA:CPU (cpu_matmul.cc).

XLA:CPU multiplies a one-row (or few-row) input by a weight matrix on one thread, so batch-1
decoding reads its weights at one core's bandwidth. The kernel splits each product over all
cores (up to 8; `SPECJAX_CPU_THREADS` overrides). Built on first use (`library`);
`SPECJAX_CPU_MATMUL=0` leaves XLA's own dot in place.
"""

from __future__ import annotations

import jax
import numpy as np

from specjax.kernels import library

MAX_ROWS = 8  # measured: with more rows XLA's dot (YNNPACK) is as fast as this kernel or faster
SOURCE = "cpu_matmul.cc"  # in this folder; its FFI handler SYMBOL registers as TARGET
SYMBOL = "SpecjaxSmallMatmulF32"
TARGET = "specjax_small_matmul_f32"
SWITCH = "SPECJAX_CPU_MATMUL"  # set to 0: XLA's own ops


def available() -> bool:
    """Whether products traced now go to the kernel (`library.available`)."""
    return library.available(SOURCE, SYMBOL, TARGET, SWITCH)


def small_matmul(x: jax.Array, w: jax.Array, transposed: bool,
                 target: str = TARGET) -> jax.Array:
    """x [M, K] @ w [K, N] (or w [N, K] contracted on its last axis when `transposed`), float32,
    on the CPU kernel; requires `available()`. Each output row is bitwise independent of the
    other rows and of M. `target`: a variant build's FFI target (`library.load`)."""
    rows, n = x.shape[0], w.shape[0] if transposed else w.shape[1]
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((rows, n), np.float32),
                            vmap_method="sequential")
    return call(x, w, transposed=bool(transposed))
