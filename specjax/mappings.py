"""The kernel's limit on a process's memory mappings, which compiling many programs exhausts.

XLA:CPU's JIT maps each compiled program in many pieces (on the default model about 350 for a
greedy `selfspec` decode loop, 1,700 for a sampled SpecDec++ one), and Linux allows a process
`vm.max_map_count` mappings (65,530 by default). Past the limit compilation fails with "LLVM
compilation error: Cannot allocate memory" and the process crashes: a sampled sweep of 19
strategies (two programs each) did, after ten minutes of work. `MappingBudget` projects the
next unit's need from the work done so far, so that a sweep can time and release what it
compiled before it gets there.
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
    """Counts the mappings each unit of work adds (a strategy's programs: `compiled()` after
    each) and says whether one more, mapping as much as the largest so far, stays within
    `MARGIN` of the limit (`room_for_another`). A release in between only makes one unit's
    count negative, which the largest ignores. Where /proc does not say, there is always
    room."""

    def __init__(self) -> None:
        self.last = mappings()
        self.largest = 0

    def compiled(self) -> None:
        now = mappings()
        if self.last is not None and now is not None:
            self.largest = max(self.largest, now - self.last)
        self.last = now

    def room_for_another(self) -> bool:
        now, limit = mappings(), mapping_limit()
        return now is None or limit is None or now + self.largest <= MARGIN * limit

    def refusal(self, what: str) -> str:
        """The one-line error when even `what` (the smallest unit left) does not fit."""
        now, limit = mappings() or 0, mapping_limit() or 0
        projected = now + self.largest
        return (f"compiling {what} would leave this process about {projected:,.0f} memory "
                f"mappings, more than {MARGIN:.0%} of the {limit:,} the machine allows "
                f"(vm.max_map_count; XLA:CPU maps each program in pieces, and past the limit "
                f"the process crashes): raise it with "
                f"'sudo sysctl -w vm.max_map_count={suggested_limit(projected)}'")


def suggested_limit(projected: float) -> int:
    """A limit with room for `projected` mappings: SUGGESTED_LIMIT, or the power of two that
    keeps them within MARGIN of it."""
    return max(SUGGESTED_LIMIT, 2 ** math.ceil(math.log2(projected / MARGIN)))
