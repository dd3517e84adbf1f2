"""train/train.py as a user runs it: SIGTERM saves and exits; the same command resumes."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from specjax.checkpoint import Checkpointer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _command(workdir, *overrides):
    return [sys.executable, os.path.join(ROOT, "train", "train.py"),
            "--config", os.path.join(ROOT, "tests", "configs", "tiny.py"),
            "--workdir", str(workdir), *overrides]


def _env():
    return {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _train_steps(workdir):
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line)["step"] for line in f if '"train"' in line]


def test_sigterm_saves_then_resume_continues(tmp_path):
    overrides = ["--config.train.total_steps=300", "--config.train.log_every=1",
                 "--config.train.save_every=10000", "--config.train.eval_every=10000"]
    proc = subprocess.Popen(_command(tmp_path, *overrides), env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while len(_train_steps(tmp_path)) < 3:
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() < deadline, "training did not start"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output
    stopped = Checkpointer(str(tmp_path)).latest_step()
    assert stopped is not None and 3 <= stopped < 300
    assert f"interrupted at step {stopped}" in output

    finish = subprocess.run(_command(tmp_path, *overrides[:1], "--config.train.log_every=500",
                                     "--config.train.save_every=10000",
                                     "--config.train.eval_every=10000"),
                            env=_env(), capture_output=True, text=True, timeout=300)
    assert finish.returncode == 0, finish.stderr[-2000:]
    assert f"resuming {tmp_path} from step {stopped}" in finish.stdout
    assert "finished step 300" in finish.stdout
    assert "agree w/ final" in finish.stdout  # the per-exit table


@pytest.mark.parametrize("override, message", [
    ("--config.train.batch_size=0", "error: train.batch_size=0 must be > 0"),
    ("--config.model.num_kv_heads=3", "error: ModelConfig.num_kv_heads=3 must divide"),
])
def test_invalid_config_is_one_clear_line(tmp_path, override, message):
    result = subprocess.run(_command(tmp_path, override), env=_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr
