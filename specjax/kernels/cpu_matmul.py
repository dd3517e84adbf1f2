"""Builds, loads and calls the multi-threaded few-row float32 matmul for XLA:CPU (cpu_matmul.cc).

XLA:CPU multiplies a one-row (or few-row) input by a weight matrix on one thread, so batch-1
decoding reads its weights at one core's bandwidth. The kernel splits each product over all
cores (up to 8; `SPECJAX_CPU_THREADS` overrides). It is compiled from source with the machine's
C++ compiler (`CXX`, default `c++`) the first time a process needs it, against the FFI headers of
the installed jaxlib, into `SPECJAX_KERNEL_CACHE` (default `~/.cache/specjax/kernels`), keyed by
source, compiler, flags, jax version and CPU. No compiler, a failed build or
`SPECJAX_CPU_MATMUL=0` leaves XLA's own dot in place (with one warning for a failure).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import jax
import numpy as np
from absl import logging

MAX_ROWS = 8  # measured: with more rows XLA's dot (YNNPACK) is as fast as this kernel or faster
_SOURCE = pathlib.Path(__file__).with_name("cpu_matmul.cc")
_SYMBOL = "SpecjaxSmallMatmulF32"
_TARGET = "specjax_small_matmul_f32"
_FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-std=c++20", "-shared", "-fPIC", "-pthread")


def _cpu_signature() -> str:
    """The CPU model and feature flags: -march=native code is only valid on such a CPU."""
    try:
        info = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({line for line in info if line.startswith(("model name",
                                                                            "flags"))}))
    except OSError:
        return platform.processor() or platform.machine()


def _library_path(compiler: str) -> pathlib.Path:
    key = hashlib.sha256("\0".join([
        _SOURCE.read_text(), compiler, " ".join(_FLAGS), jax.__version__, _cpu_signature(),
    ]).encode()).hexdigest()[:16]
    cache = os.environ.get("SPECJAX_KERNEL_CACHE",
                           os.path.join(os.path.expanduser("~"), ".cache", "specjax", "kernels"))
    return pathlib.Path(cache) / f"cpu_matmul-{key}.so"


def _build(compiler: str, target: pathlib.Path) -> None:
    """Compiles to a temporary file, then renames it into place: concurrent builders (pytest
    workers) each write their own file and the last rename wins with an identical library."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = pathlib.Path(scratch) / target.name
        subprocess.run([compiler, *_FLAGS, "-isystem", jax.ffi.include_dir(), str(_SOURCE),
                        "-o", str(built)], check=True, capture_output=True, text=True)
        os.replace(built, target)


_switched_off = False


def available() -> bool:
    """Whether products traced now go to the kernel: it is built, loaded and registered with
    XLA:CPU in this process, and not switched off by `xla_dot_only`."""
    return not _switched_off and _loaded()


@contextlib.contextmanager
def xla_dot_only() -> Iterator[None]:
    """Programs traced inside use XLA's dot, for comparing the two in one process (clear jit
    caches on entry and exit, or compile ahead of time: the choice is made when tracing)."""
    global _switched_off
    before, _switched_off = _switched_off, True
    try:
        yield
    finally:
        _switched_off = before


@functools.cache
def _loaded() -> bool:
    if os.environ.get("SPECJAX_CPU_MATMUL", "1") == "0":
        return False
    compiler = shutil.which(os.environ.get("CXX", "c++"))
    if compiler is None:
        return False
    library = _library_path(compiler)
    try:
        if not library.exists():
            _build(compiler, library)
        handler = getattr(ctypes.CDLL(str(library)), _SYMBOL)
    except (OSError, AttributeError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", None) or error
        logging.warning("specjax: CPU matmul kernel unavailable, using XLA's dot: %s", detail)
        return False
    jax.ffi.register_ffi_target(_TARGET, jax.ffi.pycapsule(handler), platform="cpu")
    return True


def small_matmul(x: jax.Array, w: jax.Array, transposed: bool) -> jax.Array:
    """x [M, K] @ w [K, N] (or w [N, K] contracted on its last axis when `transposed`), float32,
    on the CPU kernel; requires `available()`. Each output row is bitwise independent of the
    other rows and of M."""
    rows, n = x.shape[0], w.shape[0] if transposed else w.shape[1]
    call = jax.ffi.ffi_call(_TARGET, jax.ShapeDtypeStruct((rows, n), np.float32),
                            vmap_method="sequential")
    return call(x, w, transposed=bool(transposed))
