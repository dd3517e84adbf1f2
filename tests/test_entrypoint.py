"""What every entry point shares (`specjax.entrypoint`): usage and exit statuses."""


import pytest

from tests.conftest import run_script


@pytest.mark.parametrize("script", ["train/train.py", "infer/generate.py", "infer/bench.py",
                                    "infer/exits.py"])
def test_help_exits_zero(script):
    """Catches `--help` ending with status 1, as absl's does (a script asking for the usage
    would read it as a failure)."""
    result = run_script(script, "--help")
    assert result.returncode == 0 and "--workdir" in result.stdout + result.stderr
