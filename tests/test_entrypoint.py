"""What every entry point shares (`specjax.entrypoint`): usage and exit statuses."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("script", ["train/train.py", "infer/generate.py", "infer/bench.py",
                                    "infer/exits.py"])
def test_help_exits_zero(script):
    """Catches `--help` ending with status 1, as absl's does (a script asking for the usage
    would read it as a failure)."""
    result = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": ROOT}, timeout=300)
    assert result.returncode == 0 and "--workdir" in result.stdout + result.stderr
