"""Builds and loads specjax's C++ kernels for XLA:CPU (`cpu_matmul.cc`, `cpu_attention.cc`).

Each kernel is compiled from source with the machine's C++ compiler (`CXX`, default `c++`) the
first time a process needs it, against the FFI headers of the installed jaxlib, into
`SPECJAX_KERNEL_CACHE` (default `~/.cache/specjax/kernels`), keyed by its source, the shared
`simd.h`, compiler, flags, jax version and CPU, and registered as an XLA:CPU FFI target. No
compiler, a failed build or the kernel's switch (`SPECJAX_CPU_MATMUL=0`,
`SPECJAX_CPU_ATTENTION=0`) leaves XLA's own ops in place (with one warning for a failure);
otherwise `decision` picks, shape by shape, the kernel or XLA. `xla_only(...)` traces programs
without them, for comparisons in one process (`bench/busy_bench.py --kernel`).
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
from absl import logging

from specjax.kernels import decision

_DIRECTORY = pathlib.Path(__file__).parent
_HEADER = _DIRECTORY / "simd.h"
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-std=c++20", "-shared", "-fPIC", "-pthread")


def cpu_signature() -> str:
    """The CPU model and feature flags: -march=native code is only valid on such a CPU."""
    try:
        info = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({line for line in info if line.startswith(("model name",
                                                                            "flags"))}))
    except OSError:
        return platform.processor() or platform.machine()


def _library_path(source: pathlib.Path, compiler: str, flags: tuple[str, ...]) -> pathlib.Path:
    key = hashlib.sha256("\0".join([
        source.read_text(), _HEADER.read_text(), compiler, " ".join(flags), jax.__version__,
        cpu_signature(),
    ]).encode()).hexdigest()[:16]
    cache = os.environ.get("SPECJAX_KERNEL_CACHE",
                           os.path.join(os.path.expanduser("~"), ".cache", "specjax", "kernels"))
    return pathlib.Path(cache) / f"{source.stem}-{key}.so"


def _build(compiler: str, source: pathlib.Path, target: pathlib.Path,
           flags: tuple[str, ...]) -> None:
    """Compiles to a temporary file, then renames it into place: concurrent builders (pytest
    workers) each write their own file and the last rename wins with an identical library."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = pathlib.Path(scratch) / target.name
        subprocess.run([compiler, *flags, "-isystem", jax.ffi.include_dir(), "-I",
                        str(_DIRECTORY), str(source), "-o", str(built)],
                       check=True, capture_output=True, text=True)
        os.replace(built, target)


_SOURCES = tuple(sorted(path.name for path in _DIRECTORY.glob("*.cc")))  # every kernel
_switched_off: frozenset[str] = frozenset()
_libraries: dict[str, pathlib.Path] = {}  # each source loaded with the default flags: its library


@contextlib.contextmanager
def xla_only(*sources: str) -> Iterator[None]:
    """Programs traced inside use XLA's own ops instead of the kernels built from `sources`
    (default: every kernel), for comparing the two in one process (clear jit caches on entry
    and exit, or compile ahead of time: the choice is made when tracing)."""
    global _switched_off
    unknown = set(sources) - set(_SOURCES)
    if unknown:
        raise ValueError(f"unknown kernel {sorted(unknown)[0]!r}; kernels: {', '.join(_SOURCES)}")
    before, _switched_off = _switched_off, _switched_off | frozenset(sources or _SOURCES)
    try:
        yield
    finally:
        _switched_off = before


def available(source: str, symbol: str, target: str, switch: str) -> bool:
    """Whether ops traced now go to the kernel built from `source` (a file in this folder)
    whose FFI handler `symbol` is registered as `target`: it is built, loaded and registered in
    this process (`load`), the environment variable `switch` is not "0", and not inside
    `xla_only`."""
    if source in _switched_off or decision.mode(switch) == "0":
        return False
    if not load(source, symbol, target):
        decision.unavailable(switch)
        return False
    return True


def decisions_file(source: str) -> pathlib.Path | None:
    """Where the kernel built from `source` keeps its measured decisions (`decision`): beside
    its library, so a new source, compiler, jax or CPU measures again."""
    library = _libraries.get(source)
    return None if library is None else library.with_suffix(".decisions.json")


@functools.cache
def load(source: str, symbol: str, target: str, flags: tuple[str, ...] = FLAGS) -> bool:
    """Builds `source` with `flags` (unless its library is cached), loads it and registers its
    handler `symbol` as the XLA:CPU FFI target `target`; False without a compiler or after a
    failed build (logged). Other flags give a variant under another target (tests build the
    kernels without AVX-512 this way)."""
    compiler = shutil.which(os.environ.get("CXX", "c++"))
    if compiler is None:
        return False
    path = _DIRECTORY / source
    library = _library_path(path, compiler, flags)
    try:
        if not library.exists():
            _build(compiler, path, library, flags)
        handler = getattr(ctypes.CDLL(str(library)), symbol)
    except (OSError, AttributeError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", None) or error
        logging.warning("specjax: CPU kernel %s unavailable, using XLA's ops: %s", source,
                        detail)
        return False
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(handler), platform="cpu")
    if flags == FLAGS:
        _libraries[source] = library
    return True
