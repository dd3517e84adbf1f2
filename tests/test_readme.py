"""The README's Python example runs as written (on a briefly trained tiny workdir)."""

import os
import re
import subprocess
import sys

from specjax.training.trainer import Trainer
from tests.conftest import tiny_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python_blocks():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)


def test_the_readme_python_example_runs(tmp_path):
    """Catches an API change the README did not follow (names, arguments, imports)."""
    (block,) = _python_blocks()
    Trainer(tiny_run(train=dict(total_steps=4, eval_every=4, save_every=4)),
            str(tmp_path / "runs" / "tiny")).fit()
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) >= 2 and float(lines[-1]) >= 1.0  # the tree's tau
