"""train/train.py as a user runs it: SIGTERM saves and exits; the same command resumes."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from specjax.io.checkpoint import Checkpointer
from specjax.io.workdir import exclusive_workdir
from tests.support import ROOT
from tests.support.scripts import run_script, script_env

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out


def _args(workdir, *overrides):
    return ["--config", os.path.join(ROOT, "tests", "configs", "tiny.py"),
            "--workdir", str(workdir), *overrides]


def _train(*args):
    return run_script("train/train.py", *args)


def _train_steps(workdir):
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line)["step"] for line in f if '"train"' in line]


def test_sigterm_saves_then_resume_continues(tmp_path):
    """Catches a resume that restarts the data stream (the final data position would fall
    short), metrics.jsonl repeating the steps trained again after a resume, and an interrupted
    run that exits 0 like a finished one (a scheduler could not tell them apart)."""
    overrides = ["--config.train.total_steps=300", "--config.train.log_every=1",
                 "--config.train.save_every=10000", "--config.train.eval_every=10000"]
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train", "train.py"),
                             *_args(tmp_path, *overrides)], env=script_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while len(_train_steps(tmp_path)) < 3:
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() < deadline, "training did not start"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, output
    checkpoints = Checkpointer(str(tmp_path))
    stopped = checkpoints.latest_step()
    assert stopped is not None and 3 <= stopped < 300
    batch_size = checkpoints.read_meta(stopped)["config"]["train"]["batch_size"]
    assert checkpoints.read_meta(stopped)["data_position"] == stopped * batch_size
    assert f"interrupted at step {stopped}" in output

    finish = _train(*_args(tmp_path, *overrides[:1], "--config.train.log_every=500",
                           "--config.train.save_every=10000", "--config.train.eval_every=10000"))
    assert finish.returncode == 0, finish.stderr[-2000:]
    assert f"resuming {tmp_path} from step {stopped}" in finish.stdout
    assert "finished step 300" in finish.stdout
    assert "agree w/ final" in finish.stdout  # the per-exit table
    assert Checkpointer(str(tmp_path)).read_meta(300)["data_position"] == 300 * batch_size
    steps = _train_steps(tmp_path)
    assert steps == sorted(set(steps)) and steps[-1] == 300  # no step logged twice


@pytest.mark.parametrize("override, message", [
    ("--config.train.batch_size=0", "error: train.batch_size=0 must be > 0"),
    ("--config.model.num_kv_heads=3", "error: ModelConfig.num_kv_heads=3 must divide"),
])
def test_invalid_config_is_one_clear_line(tmp_path, override, message):
    result = _train(*_args(tmp_path, override))
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_config_file_errors_are_one_line(tmp_path):
    """Catches a missing config file or a mistyped --config field ending in a 40-line
    traceback from the flags library (the file loads lazily, after flag parsing), and the
    library's own wording of a missing file ("Configuration is not available because of an
    earlier failure to load: Failed loading config file config_config: [Errno 2]...")."""
    cases = [
        (["--config", str(tmp_path / "nope.py"), "--workdir", str(tmp_path)],
         f"error: --config {tmp_path / 'nope.py'}: no such file or shipped config "),
        (_args(tmp_path, "--config.train.totl_steps=3"),
         'Did you mean "total_steps" instead of "totl_steps"?'),
        (["--config", "kangaroo", "--workdir", str(tmp_path),
          "--config.layerskip.p_max=0.1"], "the config file has no field or section 'layerskip'"),
    ]
    for args, message in cases:
        result = _train(*args)
        assert result.returncode == 1 and message in result.stderr, result.stderr[-2000:]
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_a_second_run_in_a_busy_workdir_is_refused(tmp_path):
    """Catches two trainings in one workdir both running (checkpoints and metrics of two runs
    interleaved): while the lock is held, a second run exits 1 with one line."""
    with exclusive_workdir(str(tmp_path)):
        result = _train(*_args(tmp_path))
    assert result.returncode == 1 and "is in use by another training run" in result.stderr
    assert f"pid {os.getpid()}" in result.stderr


def test_help_lists_every_config_field():
    """Catches `train.py --help` saying nothing of the config fields one can override."""
    result = _train("--help")
    for section in ("model: vocab_size (required)", "data: source='stdlib', files=()",
                    "train: batch_size=16", "layerskip: p_max=0.0", "decoding: num_draft=4"):
        assert section in result.stdout, result.stdout[-3000:]
