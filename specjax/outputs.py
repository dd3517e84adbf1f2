"""Output files written whole or not at all: a temporary file beside the target, created before
any work (a bad path fails at once) and renamed onto it when complete."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def staged(path: str | None, *, keep_interrupted: bool = False) -> Iterator[str | None]:
    """A temporary file beside `path`, created before any work (a bad path fails at once) and
    renamed onto `path` when the block completes; on failure it is removed and an existing
    `path` is left as it was. None for no path. `keep_interrupted`: a block stopped by Ctrl-C
    keeps what it wrote as `path` + ".partial" (rows streamed as they finish: nothing done is
    lost, and nothing incomplete takes the output's name)."""
    if path is None:
        yield None
        return
    if os.path.isdir(path):
        raise ValueError(f"cannot write {path}: is a directory")
    directory, name = os.path.split(os.path.abspath(path))
    try:
        handle, partial = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".partial")
    except OSError as error:
        raise ValueError(f"cannot write {path}: {error.strerror}") from None
    os.close(handle)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(partial, 0o666 & ~umask)  # as open() would create it, not mkstemp's 0600
    try:
        yield partial
        os.replace(partial, path)
    except KeyboardInterrupt:
        if keep_interrupted and os.path.getsize(partial):
            os.replace(partial, path + ".partial")
            print(f"kept what was written in {path}.partial", file=sys.stderr)
        raise
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
