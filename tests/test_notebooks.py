"""Every notebook runs end to end at smoke size in a fresh kernel, as a user runs it, after the
README's smoke run (whose model the notebooks on the default model share)."""

import glob
import os
import re
import shlex
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import ROOT, script_env

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out

NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
CELL_TIMEOUT_S = 300


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
    os.symlink(os.path.join(ROOT, "configs"), folder / "configs")
    for command in _readme_smoke_commands():
        assert command[0] == ".venv/bin/python"
        result = subprocess.run([sys.executable, os.path.join(ROOT, command[1]), *command[2:]],
                                cwd=folder, env=script_env(), capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
    assert "--- tau=" in result.stdout  # generate.py printed a completion and its statistics
    return str(folder / "runs" / "smoke")


def test_the_readme_smoke_run_trains_and_drafts(smoke_run):
    """Catches a smoke config that stops training a model whose first exit drafts."""
    from specjax.api import load

    completion = load(smoke_run).generate("def main(", max_new_tokens=32, num_draft=4)
    assert completion.stats.tau > 1.5


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_the_notebook_runs_end_to_end(path, smoke_run, tmp_path, monkeypatch):
    """Catches an API change a notebook did not follow, a figure that fails to draw, and a
    notebook's own checks failing (greedy drafted text equal to `ar`'s)."""
    notebook = nbformat.read(path, as_version=4)
    os.symlink(os.path.join(ROOT, "configs"), tmp_path / "configs")  # run as from the repo
    for name, value in script_env(SPECJAX_SMOKE="1", SPECJAX_WORKDIR=smoke_run).items():
        monkeypatch.setenv(name, value)  # the kernel inherits this process's environment
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError naming the failing cell
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert any("image/png" in o.get("data", {}) for o in outputs)
