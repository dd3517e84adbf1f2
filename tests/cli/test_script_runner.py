"""`tests.support.scripts.run_script` (a child forked from a process that has imported JAX)
gives what `python script` gives: the exit status, the two streams, argv, the folder and the
environment."""

import os
import subprocess
import sys

import pytest

from tests.support.scripts import run_script, script_env

PROBE = '''
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "name": __name__,
                  "var": os.environ.get("PROBE_VAR"), "stdin": sys.stdin.read()}))
print("to stderr", file=sys.stderr)
mode = sys.argv[1]
if mode == "code":
    sys.exit(3)
if mode == "message":
    sys.exit("error: one line")
if mode == "raise":
    raise ValueError("boom")
'''


@pytest.mark.parametrize("mode", ["ok", "code", "message", "raise"])
def test_a_forked_script_run_matches_a_fresh_interpreter(tmp_path, monkeypatch, mode):
    """Catches a runner that loses the exit status (sys.exit(3), sys.exit("message") printed
    with status 1, an uncaught error's status 1 and last line), mixes the streams, leaves the
    argv, folder or environment of the server (a variable the test set after the server
    started), or lets the script read the server's request pipe as its stdin."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.setenv("PROBE_VAR", "set by the test")
    forked = run_script(str(script), mode, "--flag=1", cwd=folder)
    fresh = subprocess.run([sys.executable, str(script), mode, "--flag=1"], cwd=folder,
                           env=script_env(), capture_output=True, text=True,
                           stdin=subprocess.DEVNULL)
    assert forked.returncode == fresh.returncode
    assert forked.stdout == fresh.stdout and os.path.realpath(folder) in forked.stdout
    assert forked.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1]
    assert forked.stderr.startswith("to stderr\n")


def test_a_changed_start_up_variable_gets_a_fresh_interpreter(tmp_path, monkeypatch):
    """Catches a runner that forks from its server even when the test changed a variable read
    only at start-up (JAX's at import): the script would run under the server's JAX settings."""
    script = tmp_path / "probe.py"
    script.write_text("import os, sys\n"
                      "print('jax' in sys.modules, os.environ.get('JAX_PROBE'))\n")
    assert run_script(str(script)).stdout == "True None\n"  # forked: JAX imported already
    monkeypatch.setenv("JAX_PROBE", "one")
    assert run_script(str(script)).stdout == "False one\n"
    assert run_script(str(script), env={"JAX_PROBE": "two"}).stdout == "False two\n"
