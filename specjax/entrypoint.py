"""What every command-line entry point shares: user errors end as one line, not a traceback."""

import sys
from collections.abc import Callable
from typing import TypeVar

from absl import logging

T = TypeVar("T")


class SpecjaxError(RuntimeError):
    """A problem the user can fix (bad checkpoint, diverged run...), reported without traceback."""


USER_ERRORS = (SpecjaxError, ValueError, FileNotFoundError)


def run_cli(body: Callable[[], T], verbosity: int = logging.WARNING) -> T:
    """Runs an entry point's body; a user error is printed as `error: ...` and exits with 1."""
    logging.set_verbosity(verbosity)
    try:
        return body()
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
