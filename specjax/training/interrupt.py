"""Turns SIGTERM / SIGINT into a flag the training loop checks between steps (save, then exit)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from absl import logging


class InterruptFlag:
    def __init__(self) -> None:
        self.signal_name: str | None = None

    @property
    def requested(self) -> bool:
        return self.signal_name is not None


@contextlib.contextmanager
def catch_interrupts() -> Iterator[InterruptFlag]:
    """Within the block, SIGTERM and SIGINT set the flag instead of killing the process.

    Outside the main thread (where Python cannot install handlers) the flag simply stays unset.
    """
    flag = InterruptFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, _frame):
        flag.signal_name = signal.Signals(signum).name
        logging.warning("%s received: finishing this step, saving a checkpoint, then exiting",
                        flag.signal_name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield flag
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
