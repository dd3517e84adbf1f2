"""Atomic outputs pinned where the fresh audit's plants got past tests/test_outputs.py: the
mode of a new output file, against the user's umask by hand, and a folder output that holds
the current directory refused."""

import os

import pytest

from specjax.outputs import staged


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_new_output_gets_the_mode_the_umask_gives(tmp_path, umask, mode):
    """A file `staged` creates has 0o666 less the umask, as `open(path, "w")` would give it.
    Catches the temporary file's own mode kept (mkstemp's 0o600: a results file or exported
    tokenizer other users of the machine cannot read)."""
    previous = os.umask(umask)
    try:
        path = tmp_path / "out.json"
        with staged(str(path)) as partial, open(partial, "w") as f:
            f.write("{}")
    finally:
        os.umask(previous)
    assert path.read_text() == "{}" and path.stat().st_mode & 0o777 == mode


def test_a_folder_holding_the_current_directory_is_never_replaced(tmp_path, monkeypatch):
    """Run from runs/export/logs, `staged_dir("runs/export")` would move the folder the process
    stands in (and everything in it) aside and delete it: a one-line error, the folder and its
    files left as they were. Catches only the current directory itself refused (the existing
    test replaces "."), not a folder above it."""
    from specjax.outputs import staged_dir

    inner = tmp_path / "export" / "logs"
    inner.mkdir(parents=True)
    (inner / "keep.txt").write_text("kept")
    monkeypatch.chdir(inner)
    with pytest.raises(ValueError, match="holds the current directory"), \
            staged_dir(str(tmp_path / "export")):
        pass
    assert (inner / "keep.txt").read_text() == "kept"
    assert sorted(os.listdir(tmp_path)) == ["export"]
