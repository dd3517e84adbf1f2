"""One training run per workdir: an exclusive lock the operating system releases with its holder.

`fcntl.flock` on `workdir/.lock` is held for the whole run; a second run on the same workdir
fails at once with a clear error naming the holder. The kernel drops the lock when the process
ends however it ends (a crash, `kill -9`), so a stale lock file never blocks the next run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator

from specjax.errors import SpecjaxError

LOCK_FILE = ".lock"


class WorkdirBusyError(SpecjaxError):
    """Another process is training in this workdir."""


@contextlib.contextmanager
def exclusive_workdir(workdir: str) -> Iterator[None]:
    """Holds the workdir's lock for the duration of the block."""
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, LOCK_FILE)
    with open(path, "a+", encoding="utf-8") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            raise WorkdirBusyError(
                f"workdir {workdir!r} is in use by another training run ({holder}); wait for it "
                "to finish or choose another --workdir") from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        lock.flush()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
