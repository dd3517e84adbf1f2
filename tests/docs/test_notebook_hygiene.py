"""The notebooks' outputs stay readable: a progress bar in a notebook is one line updated in
place, and the committed outputs hold no machine paths, no progress-bar spam and no log lines
(each notebook states its run time at its top instead)."""

import glob
import importlib.util
import os
import re

import nbformat
import pytest

from specjax import timing
from tests.support import ROOT
from tests.support.scripts import script_env

NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb"))
                   + glob.glob(os.path.join(ROOT, "docs", "**", "*.ipynb"), recursive=True))
# An absolute path of a machine: a home, a scratch or a work folder (POSIX, macOS, Windows).
MACHINE_PATH = re.compile(r"(?<![\w.~])(/(home|root|tmp|work|mnt|Users|private|var/folders)/"
                          r"|[A-Za-z]:\\Users\\)")
TERMINAL_BAR = re.compile(r"\r|\d+%\|")  # tqdm's terminal bar: carriage returns, "37%|###"
LOG_LINE = re.compile(r"kernel measured for|TqdmWarning")
BARS_PER_CELL = 3  # a cell may run a few bars (one output each), not an output per refresh


def _texts(cell) -> list[str]:
    """The text a code cell's outputs show: streams, text data (not images), tracebacks."""
    texts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            texts.append(output.text)
        elif output.output_type == "error":
            texts.append("\n".join(output.traceback))
        texts += [value for kind, value in output.get("data", {}).items()
                  if kind.startswith("text/")]
    return texts


def test_there_are_notebooks_to_check():
    """Catches a moved notebooks folder that would leave the checks below nothing to check."""
    assert len(NOTEBOOKS) >= 5


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_committed_outputs_hold_no_machine_paths_bar_spam_or_log_lines(path):
    """Catches a committed output naming the machine it ran on (/work/..., /home/...), a
    terminal progress bar saved refresh by refresh (hundreds of lines per training cell),
    kernel-measurement log lines, and more bars per cell than it runs."""
    notebook = nbformat.read(path, as_version=4)
    problems = []
    for index, cell in enumerate(notebook.cells):
        texts = _texts(cell)
        for text in texts:
            for pattern in (MACHINE_PATH, LOG_LINE):
                found = pattern.search(text)
                if found:
                    problems.append(f"cell {index}: {text[max(0, found.start() - 30):][:90]!r}")
        if sum(bool(TERMINAL_BAR.search(text)) for text in texts) > BARS_PER_CELL or any(
                "\r" in text for text in texts):
            problems.append(f"cell {index}: progress-bar spam")
    assert not problems, f"{os.path.basename(path)}: {problems[:5]}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_each_notebook_states_its_run_time_at_the_top(path):
    """Catches a notebook whose reader cannot tell before running it whether it takes a
    minute or twenty."""
    first = nbformat.read(path, as_version=4).cells[0]
    assert first.cell_type == "markdown"
    assert re.search(r"\*\*Run time:\*\* about [\d.]+ minutes? on", first.source), first.source


def test_a_progress_bar_in_a_notebook_is_one_output_updated_in_place(tmp_path, monkeypatch):
    """Catches tqdm's terminal bar in a Jupyter kernel (an output per refresh: the committed
    notebooks held up to 339 per cell) for the training bar and a long command's bar, which
    on a terminal only (disable=None) also stayed hidden in notebooks."""
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.v4.new_notebook()
    notebook.cells.append(nbformat.v4.new_code_cell(
        "from specjax.timing import progress_bar, tqdm_bar\n"
        "bar = tqdm_bar(total=300, desc='train', mininterval=0, dynamic_ncols=True)\n"
        "for _ in range(300):\n"
        "    bar.update(1)\n"
        "    bar.set_postfix(loss='1.0')\n"
        "bar.close()\n"
        "for _ in progress_bar(range(100), desc='thresholds', total=100):\n"
        "    pass\n"))
    for key, value in script_env().items():
        monkeypatch.setenv(key, value)  # the kernel imports this checkout's specjax
    nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = notebook.cells[0].outputs
    assert [o.output_type for o in outputs] == ["display_data"] * 2, outputs
    if importlib.util.find_spec("ipywidgets") is None:  # the text line, else tqdm's widget
        assert re.fullmatch(r"train: 100%\|█+\| 300/300 .*loss=1\.0\]",
                            outputs[0].data["text/plain"]), outputs[0]
        assert outputs[1].data["text/plain"] == ""  # leave=False: cleared when done


def test_a_kernel_without_ipywidgets_shows_a_long_commands_bar_as_one_line(monkeypatch):
    """Catches the text-line bar (a Jupyter kernel without ipywidgets) taking progress_bar's
    disable=None as tqdm does, "hide unless the output is a terminal": its output is a
    string buffer, so a long command's bar never showed. In-process, the kernel and its
    display stubbed: the bar is shown, then only updated in place."""
    shown = []

    class Handle:
        def display(self, data, raw):
            shown.append(("display", data["text/plain"]))

        def update(self, data, raw):
            shown.append(("update", data["text/plain"]))

    pytest.importorskip("IPython")
    import IPython.display

    monkeypatch.setattr(IPython.display, "DisplayHandle", Handle)
    monkeypatch.setattr(timing, "in_notebook", lambda: True)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ipywidgets" else find_spec(name, *a))
    for _ in timing.progress_bar(range(5), desc="thresholds", total=5):
        pass
    assert shown and shown[0][0] == "display" and "thresholds" in shown[0][1], shown
    assert all(kind == "update" for kind, _ in shown[1:])  # in place, not an output each
