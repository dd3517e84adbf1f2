"""Whether a CPU kernel runs a shape, or XLA's own ops do: measured on this CPU, then cached.

Each kernel's switch (`SPECJAX_CPU_MATMUL`, `SPECJAX_CPU_ATTENTION`) is one of
  auto  (default) the kernel for a shape class only where it measured clearly faster than XLA
        (`FASTER`) and not slower in its worst condition (`NO_WORSE`: a busy machine, a full
        cache); XLA's ops everywhere else;
  1     the kernel wherever it applies, unmeasured: pins the arithmetic, so runs on different
        machines with the kernel give the same bits;
  0     XLA's ops everywhere.
The two paths may round differently, so `summary()` goes into bench reports and generated rows.
A measurement runs when a shape class is first traced on a CPU (about a second each after
compiling, a few where calls are long: `ratios_per_call`), goes to the log (one INFO line per
process, each result at DEBUG: notebooks and terminals stay quiet), and is cached in a JSON
file beside the kernel's library, whose name changes with its source, compiler, jax version
and CPU signature, so a new CPU is measured afresh. The decision is made when a program is
traced, so it costs nothing when it runs.

Why measured: each kernel was tuned on one VM and lost to XLA on another (a Zen 2 VM: 0.84x
under load). A shape class is a product's (rows rounded up to `cpu_matmul.ROW_CLASSES`, K, N)
or an attention call's (batch, heads, head_dim, slots, tokens rounded up to
`cpu_attention.TOKEN_CLASSES`), measured at the class's largest size (`class_of`). An
unreadable cache is measured again; the tests pin both kernels (`1`).
"""

from __future__ import annotations

import os
import pathlib
import statistics
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from specjax import outputs
from specjax.timing import timed

MODES = ("auto", "1", "0")
FASTER = 1.1  # auto: XLA's time over the kernel's, typical conditions, at least this
NO_WORSE = 0.95  # auto: the same ratio in the kernel's worst measured condition, at least this
LOOP_SECONDS, REPEATS = 5e-3, 9  # each timed loop's length; turns of every program (median)
MIN_REPEATS = 3  # turns where calls are too long for `REPEATS` within `MEASURE_SECONDS`
MEASURE_SECONDS = 1.0  # a shape class's timed loops, about (more where one copy's calls are long)
MAX_COPIES = 32  # of a call's weights or cache, cycled through (`ratios_per_call`)

Ratios = dict[str, float]  # {"typical": ..., "worst": ...}: XLA's seconds over the kernel's
_decided: dict[tuple[str, str], bool] = {}  # this process's decisions by (switch, shape class)
_modes: dict[str, str] = {}  # each switch's value when it was last read
_announced = False  # whether this process logged its INFO line on measuring


def mode(switch: str) -> str:
    """The switch's value: auto (unset), 1 or 0; anything else is a one-line error."""
    value = os.environ.get(switch, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"{switch}={os.environ[switch]!r}: use auto (measure the kernel against "
                         "XLA on this CPU, the default), 1 (always the kernel) or 0 (never)")
    _modes[switch] = value
    return value


def unavailable(switch: str) -> None:
    """Notes that the kernel behind `switch` could not be built (`summary`)."""
    _modes[switch] = "unavailable"


def use_kernel(kernel: str, switch: str, cache: pathlib.Path | None, shape: str,
               measure: Callable[[], Ratios]) -> bool:
    """Whether the `kernel` (already available, its switch not 0) runs shape class `shape`:
    always with the switch at 1, else by `measure()` (run once per CPU, at once rather than
    staged into the trace being built, and cached in `cache`)."""
    if mode(switch) == "1":
        return True
    if (switch, shape) not in _decided:
        ratios = _cached(cache).get(f"{kernel} {shape}")
        if not (isinstance(ratios, dict) and {"typical", "worst"} <= set(ratios)):
            with jax.ensure_compile_time_eval():  # runs now, not staged into the trace
                ratios = measure()
            _store(cache, f"{kernel} {shape}", ratios)
            _log_measurement(kernel, shape, ratios)
        _decided[(switch, shape)] = kernel_wins(ratios)
    return _decided[(switch, shape)]


def _log_measurement(kernel: str, shape: str, ratios: Ratios) -> None:
    """A measurement's result at DEBUG, and the first of this process as one INFO line: a
    session measures dozens of shape classes, a line each would bury a notebook's output."""
    global _announced
    if not _announced:
        logging.info("specjax: measuring the CPU kernels against XLA's ops for each new shape "
                     "class (about a second each, once per CPU, cached; SPECJAX_CPU_MATMUL or "
                     "SPECJAX_CPU_ATTENTION=1 or 0 pins them)")
        _announced = True
    logging.debug("specjax: CPU %s kernel measured for %s: %.2fx XLA's speed, %.2fx at worst "
                  "-> %s", kernel, shape, ratios["typical"], ratios["worst"],
                  "kernel" if kernel_wins(ratios) else "XLA")


def kernel_wins(ratios: Ratios) -> bool:
    """The auto rule: clearly faster when it matters, never clearly slower."""
    return ratios["typical"] >= FASTER and ratios["worst"] >= NO_WORSE


def summary() -> dict[str, str]:
    """Each switch read in this process: its mode, and in auto mode on how many of the shape
    classes traced so far the kernel runs (recorded with bench reports and generated rows)."""
    report = {}
    for switch, value in sorted(_modes.items()):
        chosen = [use for (name, _), use in _decided.items() if name == switch]
        report[switch] = (f"auto: kernel for {sum(chosen)} of {len(chosen)} shapes"
                          if value == "auto" else {"1": "pinned: kernel", "0": "off: XLA",
                                                   "unavailable": "not built: XLA"}[value])
    return report


def class_of(size: int, classes: Sequence[int]) -> int:
    """The smallest class at least `size` (a shape is measured at its class's largest size,
    where a kernel's advantage is smallest)."""
    return next(c for c in classes if c >= size)


def ratios_per_call(programs: dict[str, Callable], conditions: Sequence[tuple[np.ndarray, ...]]
                    ) -> list[dict[str, float]]:
    """For each tuple of operands in `conditions`, XLA's seconds per call over each other
    program's: programs["xla"] and the kernel's, each called in one jitted loop of about
    `LOOP_SECONDS`, compiled ahead of time on the CPU and timed in turns (the median over
    the turns of each turn's ratio).
    The first operand carries the loop (so no call is skipped); the others (weights, a cache)
    are cycled through enough copies (up to `MAX_COPIES`) to fill the CPU's last-level cache,
    as a model's many layers do: a product whose weights stay in a core's own caches is
    compute-bound, not the bandwidth-bound call decoding makes (measured: 1.03x XLA's speed
    with one copy of a 256 x 1408 matrix, 1.22x with 3, 2.2x with 16).
    After compiling and a first pass over every copy, the timed loops take about
    `MEASURE_SECONDS` (`copies_within`, `loop_plan`), or where one copy's calls are too long
    for that, a probe and `MIN_REPEATS` turns of one pass under each condition: unbounded,
    attention over 2,000 rows measured for 285 s, a stall on the first trace of a batch."""
    cpu = jax.devices("cpu")[0]
    size = sum(np.asarray(x).nbytes for x in conditions[0][1:])
    copies = int(np.clip(np.ceil(_last_level_cache_bytes() / max(size, 1)), 1, MAX_COPIES))
    placed = [(jax.device_put(carried, cpu),
               [tuple(jax.device_put(np.array(x), cpu) for x in rest) for _ in range(copies)])
              for carried, *rest in conditions]
    loops = _compiled_loops(programs, placed[0])
    # a first pass each (also the warm-up: its one-time costs can only lower the copies)
    passes = {name: timed(_run, run, np.int32(1), placed[0]) for name, run in loops.items()}
    fewer = copies_within(passes, copies, len(conditions))
    if fewer < copies:  # calls too long to cycle through every copy within the time
        placed = [(carried, rest[:fewer]) for carried, rest in placed]
        loops = _compiled_loops(programs, placed[0])
    results = []
    for operands in placed:
        passes = {name: timed(_run, run, np.int32(1), operands) for name, run in loops.items()}
        calls, turns = loop_plan(passes, len(conditions))
        ratios = {name: [] for name in loops if name != "xla"}
        for _ in range(turns):  # a ratio per turn: drift in machine speed hits both alike
            seconds = {name: timed(_run, run, calls, operands) for name, run in loops.items()}
            for name in ratios:
                ratios[name].append(seconds["xla"] / seconds[name])
        results.append({name: statistics.median(values) for name, values in ratios.items()})
    return results


def copies_within(passes: dict[str, float], copies: int, conditions: int) -> int:
    """How many of `copies` copies of the operands to cycle through, for programs that take
    `passes` seconds each to call once on every copy, measured under `conditions` conditions:
    all of them where a probe pass and `MIN_REPEATS` turns of one pass fit `MEASURE_SECONDS`,
    else as many as fit (at least one: a call that long is bound by its own work, and the
    copies only keep its operands out of the cache)."""
    least = conditions * (1 + MIN_REPEATS) * sum(passes.values())
    if least <= MEASURE_SECONDS:
        return copies
    return max(1, min(copies, int(copies * MEASURE_SECONDS / least)))


def loop_plan(passes: dict[str, float], conditions: int) -> tuple[np.int32, int]:
    """(calls, turns) for programs that take `passes` seconds each for one pass over their
    copies, after a probe pass, within `MEASURE_SECONDS` over `conditions` conditions: each
    timed loop makes `calls` passes, about `LOOP_SECONDS` (at least one), and a condition
    gets `REPEATS` turns where the budget allows, else fewer (at least `MIN_REPEATS`)."""
    per_pass = sum(passes.values())
    calls = max(1, round(LOOP_SECONDS / max(max(passes.values()), 1e-9)))
    budget = MEASURE_SECONDS / conditions - per_pass
    turns = int(np.clip(budget // max(calls * per_pass, 1e-9), MIN_REPEATS, REPEATS))
    return np.int32(calls), turns


def _compiled_loops(programs: dict[str, Callable], operands: tuple) -> dict[str, Callable]:
    """Each program's timed loop (`_loop`), compiled for `operands` (carried, copies)."""
    return {name: jax.jit(_loop(fn)).lower(np.int32(1), *operands).compile()
            for name, fn in programs.items()}


def _loop(fn: Callable) -> Callable:
    """`fn` applied `calls` times to each copy of the other operands in turn."""
    def run(calls, carried, copies):
        def body(_, x):
            for rest in copies:
                x = x + 1e-30 * jnp.sum(fn(x, *rest))
            return x
        return jax.lax.fori_loop(0, calls, body, carried)
    return run


def _run(program: Callable, calls: np.int32, operands: tuple) -> None:
    jax.block_until_ready(program(calls, *operands))


def _last_level_cache_bytes() -> int:
    """The CPU's largest cache (Linux sysfs), 32 MiB where it cannot be read."""
    sizes = []
    for index in pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            size = (index / "size").read_text().strip().upper()
            sizes.append(int(size.rstrip("KMG")) * {"K": 2**10, "M": 2**20, "G": 2**30}.get(
                size[-1], 1))
        except (OSError, ValueError):
            continue
    return max(sizes, default=32 * 2**20)


def _cached(cache: pathlib.Path | None) -> dict[str, Ratios]:
    return {} if cache is None else outputs.read_json_cache(str(cache))


def _store(cache: pathlib.Path | None, key: str, ratios: Ratios) -> None:
    """Adds one measurement to the cache file (written whole: a concurrent or interrupted
    writer never leaves a partial file)."""
    if cache is not None:
        outputs.write_json_cache(str(cache), {**_cached(cache), key: ratios})
