"""What every entry point shares (`specjax.cli.entrypoint`): usage and exit statuses."""

import gc
import glob
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree

import pytest

from specjax.cli import entrypoint
from specjax.cli.decoding import DECODING_FLAGS
from specjax.cli.flags import HELP
from specjax.decoding.registry import declared_options
from tests.support import ROOT
from tests.support.scripts import run_script, script_env, with_default_sigint


@pytest.mark.parametrize("script", ["train/train.py", "infer/generate.py", "bench/bench.py",
                                    "infer/exit_report.py", "bench/calm_quality.py",
                                    "infer/learn_then_test.py", "infer/tune.py",
                                    "bench/compile_bench.py"])
def test_help_exits_zero_and_lists_every_flag(script):
    """Catches `--help` ending with status 1, as absl's does (a script asking for the usage
    would read it as a failure), a help that hides the decoding flags a script takes from
    `specjax.cli.decoding` (absl lists only the main module's own flags unless adopted), and
    learn_then_test.py or calm_quality.py offering `--ngram_max` and the like, options of strategies
    they cannot run (the third and fourth probes). A fresh interpreter, not the tests' forked
    one, so an import the script misses (but the test runner has made) fails here too."""
    result = run_script(script, "--help", fresh=True)
    text = result.stdout + result.stderr
    assert result.returncode == 0 and "--workdir" in text
    with open(os.path.join(ROOT, script), encoding="utf-8") as f:
        takes_decoding_flags = "define_decoding_flags(" in f.read()
    if takes_decoding_flags:
        wanted = {"infer/learn_then_test.py": declared_options(["calm", "selfspec"]),
                  "bench/calm_quality.py": declared_options(["calm"])}.get(script,
                                                                       set(DECODING_FLAGS))
        assert {name for name in DECODING_FLAGS if f"--{name}:" in text} == wanted



SHARED_DEFAULTS = ("workdir", "draft_workdir", "prompts_file", "temperature", "top_k", "top_p",
                   "output_json")  # the same in every script (lengths and counts are not)


def test_shared_flags_read_alike_in_every_script():
    """Catches a script defining a shared flag (`specjax.cli.flags`) itself, with its own help
    or default (the drift there was: `--workdir` described five ways, `--top_k` in two of the
    four samplers), and a shared flag missing from a script's own `--help` (absl lists only a
    module's key flags there). Each script's `--helpxml`: its flags as absl registered them."""
    seen: dict[str, dict[str, tuple[str, str]]] = {name: {} for name in HELP}
    scripts = sorted(path for folder in ("infer", "train", "bench", "tools")
                     for path in glob.glob(f"{folder}/*.py", root_dir=ROOT))
    for script in scripts:
        result = run_script(script, "--helpxml")
        assert result.returncode == 0, result.stderr[-2000:]
        for flag in ElementTree.fromstring(result.stdout).iter("flag"):
            name = flag.findtext("name")
            if name in HELP:
                assert flag.findtext("key") == "yes", f"{script} --help omits --{name}"
                seen[name][script] = (flag.findtext("meaning"), flag.findtext("default"))
    for name, by_script in seen.items():
        assert len(by_script) >= 2, f"--{name} is shared by {sorted(by_script)} only"
        for script, (meaning, _) in by_script.items():
            assert meaning.startswith(HELP[name]), f"{script} --{name}: {meaning!r}"
        if name in SHARED_DEFAULTS:
            assert len({default for _, default in by_script.values()}) == 1, (name, by_script)

def test_ctrl_c_inside_a_gc_callback_is_delivered_again(monkeypatch):
    """Catches Ctrl-C swallowed by Python inside JAX's garbage-collection callback ("Exception
    ignored in _xla_gc_callback"), after which calibrate ran on and wrote its outputs."""
    sent = []
    monkeypatch.setattr(os, "kill", lambda pid, signum: sent.append(signum))

    def callback(phase, info):
        entrypoint.interrupt(signal.SIGINT, sys._getframe())

    monkeypatch.setattr(gc, "callbacks", [callback])
    callback("start", {})
    deadline = time.time() + 5
    while not sent and time.time() < deadline:
        time.sleep(0.01)
    assert sent == [signal.SIGINT]
    with pytest.raises(KeyboardInterrupt):
        entrypoint.interrupt(signal.SIGINT, sys._getframe())


def test_ctrl_c_during_the_imports_ends_at_once_with_one_line():
    """Catches Ctrl-C in an entry point's first second (jax still importing) aborting with a
    C++ `terminate` trace from inside an extension module's initialisation. The child starts
    with SIGINT at its default whatever the test runner's worker left."""
    proc = subprocess.Popen(with_default_sigint(
        [sys.executable, "-c", "import specjax.cli.early_interrupt, sys; "
         "print('ready', flush=True); sys.stdin.readline(); import jax, time; time.sleep(30)"]),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=script_env())
    assert proc.stdout.readline() == "ready\n"
    proc.stdin.write("\n")
    proc.stdin.flush()
    time.sleep(0.05)  # jax's imports take far longer
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and stderr == "interrupted\n", stderr[-2000:]
