"""Imported first by every entry point: Ctrl-C or SIGTERM while the heavy imports run (jax's
take a second or two) ends the process at once with status 130 and one line. Raised there, the
KeyboardInterrupt would cut into an extension module's initialisation, which aborts with a C++
trace. Nothing has been written yet, so nothing is lost; `entrypoint.run_cli` then installs the
run's own handling."""

import os
import signal
import sys
import threading


def exit_now(signum: int, frame: object) -> None:
    """The signal handler until `run_cli`'s: ends the process at once."""
    exit_interrupted()


def exit_interrupted() -> None:
    """Ends the process at once, one line and status 130 (a normal interpreter exit while
    JAX's threads are still starting can crash)."""
    sys.stdout.flush()
    print("interrupted", file=sys.stderr, flush=True)
    os._exit(130)


DEFAULTS = ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL))

if threading.current_thread() is threading.main_thread():
    for _signum, _default in DEFAULTS:
        if signal.getsignal(_signum) is _default:
            signal.signal(_signum, exit_now)
