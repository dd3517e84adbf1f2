"""Wall-clock timing shared by the specjax and peer benchmarks."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from tqdm import tqdm


def progress_bar(iterable: Iterable | None = None, *, desc: str,
                 total: int | None = None) -> tqdm:
    """A bar with the time left for a long command's loop: on stderr, shown on a terminal only
    (logs, notebooks and tests stay quiet), cleared when done."""
    return tqdm(iterable, desc=desc, total=total, file=sys.stderr, disable=None, leave=False)


def time_left(started: float, done: int, total: int) -> str:
    """"about N s left" after `done` of `total` equal steps begun at `started`
    (`time.perf_counter()`), for progress lines of long commands."""
    if done >= total:
        return "done"
    left = (time.perf_counter() - started) / max(done, 1) * (total - done)
    return f"about {left:.0f} s left" if left < 120 else f"about {left / 60:.0f} min left"


def timed(fn: Callable[..., Any], *args: Any) -> float:
    """Seconds one call of fn(*args) takes (callers block on asynchronous results inside fn)."""
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def time_interleaved(calls: dict[Hashable, Callable[[int], Any]], items: int, repeats: int,
                     progress: Callable[[int], None] | None = None
                     ) -> tuple[dict[Hashable, list[list[float]]], dict[Hashable, list[Any]]]:
    """Runs every call on item 0..items-1, `repeats` times: per repeat and item, each call in
    turn, so drift in machine speed hits all of them alike. Returns each call's seconds per item
    (one entry per repeat) and its last output per item; `progress(repeats_done)` is called
    after each repeat."""
    seconds = {key: [[] for _ in range(items)] for key in calls}
    outputs = {key: [None] * items for key in calls}
    for repeat in range(repeats):
        for item in range(items):
            for key, call in calls.items():
                start = time.perf_counter()
                outputs[key][item] = call(item)
                seconds[key][item].append(time.perf_counter() - start)
        if progress:
            progress(repeat + 1)
    return seconds, outputs
