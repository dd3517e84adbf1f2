"""The notebooks on the default model run end to end at smoke size in a fresh kernel each,
after the README's smoke run, whose model they share (the notebooks that train their own
models: test_notebooks_training.py)."""

import os
import re
import shlex

import pytest

from tests.support import ROOT
from tests.support.notebook_runner import run_notebook
from tests.support.scripts import run_script

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out


def _readme_smoke_commands() -> list[list[str]]:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme[readme.index("## Smoke run"):]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
    return [shlex.split(line) for line in block.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> str:
    """The README's smoke run, its commands as written, in a scratch folder: its workdir."""
    folder = tmp_path_factory.mktemp("smoke")
    for command in _readme_smoke_commands():
        assert command[0] == ".venv/bin/python"
        result = run_script(*command[1:], cwd=folder)
        assert result.returncode == 0, result.stderr[-2000:]
    assert "--- tau=" in result.stdout  # generate.py printed a completion and its statistics
    return str(folder / "runs" / "smoke")


def test_the_readme_smoke_run_trains_and_drafts(smoke_run):
    """Catches a smoke config that stops training a model whose first exit drafts."""
    from specjax.api import load

    completion = load(smoke_run).generate("def main(", max_new_tokens=32, num_draft=4)
    assert completion.stats.tau > 1.5


ON_THE_DEFAULT_MODEL = ["quickstart", "trees", "calm"]


@pytest.mark.parametrize("name", ON_THE_DEFAULT_MODEL)
def test_the_notebook_runs_end_to_end(name, smoke_run, tmp_path, monkeypatch):
    """Catches an API change a notebook did not follow, a figure that fails to draw, and a
    notebook's own checks failing (greedy drafted text equal to `ar`'s)."""
    run_notebook(name, tmp_path, monkeypatch, SPECJAX_WORKDIR=smoke_run)
