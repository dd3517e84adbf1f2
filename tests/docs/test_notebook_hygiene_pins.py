"""Notebook hygiene pinned where the fresh audit's plants got past
tests/test_notebook_hygiene.py: which IPython shells count as a notebook, by hand-built shells,
and which stream a terminal bar draws on."""

import sys
import types

import pytest
from tqdm import std

from specjax import timing


def _shell(monkeypatch, config):
    """An IPython module whose running shell holds `config` (None: no shell running)."""
    shell = None if config is None else types.SimpleNamespace(config=config)
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))


@pytest.mark.parametrize("config", [
    {"TerminalIPythonApp": {"display_banner": False}},  # `ipython` in a terminal
    {},  # an embedded shell
    None,  # IPython imported, no shell running
])
def test_an_ipython_shell_that_is_no_kernel_gets_the_terminal_bar(monkeypatch, config):
    """Catches any IPython shell taken for a Jupyter kernel: `ipython` in a terminal would
    get tqdm's notebook widget or the text-line display (no bar on the terminal, only
    display objects printed) for every training and long command's bar. Only a shell whose
    config holds IPKernelApp (Jupyter, Colab) is a notebook."""
    _shell(monkeypatch, {"IPKernelApp": {"connection_file": "kernel-1.json"}})
    assert timing.in_notebook() is True
    _shell(monkeypatch, config)
    assert timing.in_notebook() is False
    bar = timing.tqdm_bar(range(2), disable=True)
    assert type(bar) is std.tqdm


def test_a_terminal_bar_is_drawn_on_stderr_only(monkeypatch, capsys):
    """Outside a notebook the bar goes to stderr and stdout stays the command's output alone
    (`infer/generate.py ... > out.txt`, a JSON result piped on). Catches the terminal bar
    drawn on stdout (bar frames mixed into the redirected text or JSON)."""
    _shell(monkeypatch, None)
    for _ in timing.tqdm_bar(range(3), desc="steps", disable=False):
        pass
    captured = capsys.readouterr()
    assert captured.out == "" and "steps" in captured.err
