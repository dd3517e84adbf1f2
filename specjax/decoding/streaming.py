"""Tokens handed to the host as the decode loop commits them (`Generator.stream`): one ordered
host callback per round, compiled only into the streaming variant of the loop, so the
programs of `Generator.generate` and the benchmarks have no host round-trip."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import jax
import numpy as np
from jax.experimental import io_callback

Receiver = Callable[[np.ndarray, np.ndarray], None]

_LOCK = threading.Lock()  # one stream at a time in a process: the callback has one receiver
_receivers: list[Receiver] = []


def emit(tokens: jax.Array, counts: jax.Array) -> None:
    """Inside the loop: this round's tokens [B, W], of which row b keeps the first counts[b]
    (0 for a row that is done), to the receiver of the stream being run."""
    io_callback(_deliver, None, tokens, counts, ordered=True)


def _deliver(tokens: np.ndarray, counts: np.ndarray) -> None:
    if _receivers:
        _receivers[0](np.asarray(tokens), np.asarray(counts))


@contextlib.contextmanager
def receiving(receiver: Receiver) -> Iterator[None]:
    """Routes the streaming loop's rounds to `receiver` while the block runs."""
    with _LOCK:
        _receivers.append(receiver)
        try:
            yield
        finally:
            _receivers.clear()
