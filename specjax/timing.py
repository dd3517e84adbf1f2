"""Wall-clock timing shared by the specjax and peer benchmarks, and the progress bars of long
loops (on a terminal, or in a notebook as one line updated in place)."""

from __future__ import annotations

import importlib.util
import io
import sys
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from tqdm import tqdm


def tqdm_bar(iterable: Iterable | None = None, **options: Any) -> tqdm:
    """A tqdm bar (`options` are tqdm's) where the user looks: in a Jupyter kernel tqdm's
    notebook display, one line updated in place (a text line where ipywidgets is missing),
    elsewhere its terminal bar on stderr. A terminal bar in a notebook would add an output
    per refresh: hundreds of lines per training cell."""
    if not in_notebook():
        return tqdm(iterable, file=sys.stderr, **options)
    if importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.notebook import tqdm as notebook_tqdm

        return notebook_tqdm(iterable, **options)
    return _TextLineBar(iterable, **{**options, "disable": bool(options.get("disable"))})


def progress_bar(iterable: Iterable | None = None, *, desc: str,
                 total: int | None = None) -> tqdm:
    """A bar with the time left for a long command's loop: shown on a terminal or in a
    notebook (logs and tests stay quiet), cleared when done."""
    return tqdm_bar(iterable, desc=desc, total=total, disable=None, leave=False)


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (IPython's, as in Jupyter and Colab)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and "IPKernelApp" in shell.config


class _TextLineBar(tqdm):
    """tqdm's bar as one text output of the running cell, replaced at each refresh: a Jupyter
    kernel without ipywidgets, where tqdm's notebook display cannot draw."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from IPython.display import DisplayHandle

        self._line, self._shown = DisplayHandle(), False
        kwargs.setdefault("ascii", False)  # blocks, as a terminal draws them
        super().__init__(*args, file=io.StringIO(), **kwargs)  # drawn by `display` alone

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        text = {"text/plain": str(self) if msg is None else msg}
        if self._shown:
            self._line.update(text, raw=True)
        else:
            self._line.display(text, raw=True)
            self._shown = True
        return True


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
