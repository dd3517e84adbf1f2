"""What every entry point shares (`specjax.entrypoint`): usage and exit statuses."""

import gc
import os
import signal
import sys
import time

import pytest

from specjax import entrypoint
from tests.conftest import run_script


@pytest.mark.parametrize("script", ["train/train.py", "infer/generate.py", "infer/bench.py",
                                    "infer/exits.py"])
def test_help_exits_zero(script):
    """Catches `--help` ending with status 1, as absl's does (a script asking for the usage
    would read it as a failure)."""
    result = run_script(script, "--help")
    assert result.returncode == 0 and "--workdir" in result.stdout + result.stderr


def test_ctrl_c_inside_a_gc_callback_is_delivered_again(monkeypatch):
    """Catches Ctrl-C swallowed by Python inside JAX's garbage-collection callback ("Exception
    ignored in _xla_gc_callback"), after which calibrate ran on and wrote its outputs."""
    sent = []
    monkeypatch.setattr(os, "kill", lambda pid, signum: sent.append(signum))

    def callback(phase, info):
        entrypoint.interrupt(signal.SIGINT, sys._getframe())

    monkeypatch.setattr(gc, "callbacks", [callback])
    callback("start", {})
    deadline = time.time() + 5
    while not sent and time.time() < deadline:
        time.sleep(0.01)
    assert sent == [signal.SIGINT]
    with pytest.raises(KeyboardInterrupt):
        entrypoint.interrupt(signal.SIGINT, sys._getframe())
