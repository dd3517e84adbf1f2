"""The kernel's limit on a process's memory mappings, which compiling many programs exhausts.

XLA:CPU's JIT maps each compiled program in many pieces (on the default model about 350 for a
greedy `selfspec` decode loop, 1,700 for a sampled SpecDec++ one), and Linux allows a process
`vm.max_map_count` mappings (65,530 by default). Past the limit compilation fails with "LLVM
compilation error: Cannot allocate memory" and the process crashes: a sampled sweep of 19
strategies (two programs each) did, after ten minutes of work. `MappingBudget` projects a
sweep's need from the work done so far and refuses it before it gets there.
"""

from __future__ import annotations

import math

LIMIT_FILE = "/proc/sys/vm/max_map_count"
MAPS_FILE = "/proc/self/maps"
MARGIN = 0.9  # of the limit: what the process maps besides the sweep's programs grows too
SUGGESTED_LIMIT = 262144  # the value Elasticsearch and Julia's docs ask for


def mappings() -> int | None:
    """This process's memory mappings, or None where /proc does not say (not Linux)."""
    try:
        with open(MAPS_FILE, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def mapping_limit() -> int | None:
    """The kernel's limit on a process's memory mappings, or None where it cannot be read."""
    try:
        with open(LIMIT_FILE, encoding="ascii") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


class MappingBudget:
    """Counts the mappings from its creation; `check(done, total, what)`, called after each
    unit of work (`what`: "strategies", each compiling its programs), raises a one-line
    ValueError when the `total - done` units left, each mapping as much as the largest so far,
    would take the process past `MARGIN` of the limit. Where /proc does not say, it never
    raises."""

    def __init__(self) -> None:
        self.last = mappings()
        self.largest = 0

    def check(self, done: int, total: int, what: str) -> None:
        now, limit = mappings(), mapping_limit()
        if self.last is None or now is None or limit is None:
            return
        self.largest, self.last = max(self.largest, now - self.last), now
        projected = now + self.largest * (total - done)
        if done < total and projected > MARGIN * limit:
            raise ValueError(
                f"compiling all {total} {what} would leave this process about "
                f"{projected:,.0f} memory mappings, more than {MARGIN:.0%} of the {limit:,} "
                f"the machine allows (vm.max_map_count; XLA:CPU maps each program in pieces, "
                f"and past the limit the process crashes): sweep fewer, or raise it with "
                f"'sudo sysctl -w vm.max_map_count={suggested_limit(projected)}'")


def suggested_limit(projected: float) -> int:
    """A limit with room for `projected` mappings: SUGGESTED_LIMIT, or the power of two that
    keeps them within MARGIN of it."""
    return max(SUGGESTED_LIMIT, 2 ** math.ceil(math.log2(projected / MARGIN)))
