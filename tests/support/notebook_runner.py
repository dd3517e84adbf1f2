"""Runs a notebook end to end in a fresh kernel at smoke size, as a user runs it from the
repository (shared by the two notebook test files, which the workers run side by side)."""

import os

import nbformat
from nbclient import NotebookClient

from tests.support import ROOT
from tests.support.scripts import script_env

CELL_TIMEOUT_S = 300


def notebook_path(name: str) -> str:
    return os.path.join(ROOT, "notebooks", f"{name}.ipynb")


def run_notebook(name: str, folder, monkeypatch, **env: str) -> None:
    """Executes notebooks/<name>.ipynb in `folder` (a scratch folder: no clone's files)
    with SPECJAX_SMOKE=1 and `env`; raises CellExecutionError naming a failing cell, and
    fails unless the outputs hold a figure."""
    notebook = nbformat.read(notebook_path(name), as_version=4)
    for key, value in script_env(SPECJAX_SMOKE="1", **env).items():
        monkeypatch.setenv(key, value)  # the kernel inherits this process's environment
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(folder)}})
    client.execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert any("image/png" in o.get("data", {}) for o in outputs)
