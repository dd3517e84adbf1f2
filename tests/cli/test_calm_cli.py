"""CALM from the command line: Learn-then-Test calibration writes the workdir's decoding
defaults, which generation then uses; the lambda sweep's table and curve."""

import json
import os

import pytest

from specjax.io.calibrated_defaults import FILE, read_calibrated, write_calibrated
from tests.support.scripts import run_script

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out

SMALL = ["--prompt_len", "16", "--max_new_tokens", "8"]
CALIBRATION = [*SMALL, "--num_prompts", "6", "--per_document", "2", "--skip_documents", "0",
               "--speed_prompts", "1", "--grid", "1,0.5,0"]


@pytest.fixture(scope="module")
def workdir(trained_workdir):
    return trained_workdir


def _run(script, *args):
    return run_script(script, *args)


def _mean_exit(workdir, *args):
    result = _run("infer/generate.py", "--workdir", workdir, "--strategy", "calm", "--prompt",
                  "def f(x):", "--max_new_tokens", "8", *args)
    assert result.returncode == 0, result.stderr[-2000:]
    return float(result.stdout.split("mean_exit=")[1].split()[0])


def test_a_recalibration_at_the_same_step_replaces_its_fields_and_keeps_the_others(tmp_path):
    """Calibrating calm_threshold 0.7 (with draft_threshold 0.3), then calm_threshold 0.5
    at the same step, reads back 0.5, draft_threshold still 0.3, and both calibration
    records; a calibration at a later step replaces the whole record. Catches the earlier
    values winning the merge (the recalibrated 0.5 written and then lost to the stale 0.7)."""
    workdir = str(tmp_path)
    write_calibrated(workdir, 6, {"calm_threshold": 0.7, "draft_threshold": 0.3},
                     {"calm_threshold": {"delta": 0.1}, "draft_threshold": {"delta": 0.2}})
    write_calibrated(workdir, 6, {"calm_threshold": 0.5}, {"calm_threshold": {"delta": 0.05}})
    assert read_calibrated(workdir) == {
        "step": 6, "decoding": {"calm_threshold": 0.5, "draft_threshold": 0.3},
        "calibration": {"calm_threshold": {"delta": 0.05}, "draft_threshold": {"delta": 0.2}}}
    write_calibrated(workdir, 9, {"calm_threshold": 0.4}, {})
    assert read_calibrated(workdir) == {"step": 9, "decoding": {"calm_threshold": 0.4},
                                        "calibration": {}}


def test_calibration_writes_the_certified_lambda_that_generation_then_uses(workdir, tmp_path):
    """With delta 0.99 every lambda is certified, so LTT must pick the grid's last (0): calm
    then exits every token at the first candidate by default, and a flag still overrides the
    calibrated default. Catches a calibration that is computed but not written, or written
    where loading does not read it."""
    assert _mean_exit(workdir) == 4.0  # the untrained model is never confident at 0.9
    report = tmp_path / "calibration.json"
    result = _run("infer/learn_then_test.py", "--workdir", workdir, "--delta", "0.99", *CALIBRATION,
                  "--output_json", str(report))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "<- chosen" in result.stdout and "speed-up over ar" in result.stdout
    record = json.loads(report.read_text())
    assert record["threshold"] == 0.0 and len(record["p_values"]) == 3
    with open(os.path.join(workdir, FILE)) as f:
        assert json.load(f)["decoding"]["calm_threshold"] == 0.0
    assert _mean_exit(workdir) == 1.0
    assert _mean_exit(workdir, "--calm_threshold", "1") == 4.0
    os.remove(os.path.join(workdir, FILE))


def test_selfspec_eta_calibration_sets_the_chains_confidence_stop(workdir, tmp_path):
    """The same machinery for selfspec's eta (risk: wasted drafts): with every value certified
    the last, 0.5, is written, and the untrained model's drafts (all below 0.5) then stop each
    chain after one draft where the default (eta 0) drafts K."""
    result = _run("infer/learn_then_test.py", "--workdir", workdir, "--strategy", "selfspec",
                  "--delta", "0.99", *CALIBRATION[:-1], "0.9,0.5")
    assert result.returncode == 0, result.stderr[-2000:]
    out = tmp_path / "out.jsonl"
    result = _run("infer/generate.py", "--workdir", workdir, "--strategy", "selfspec", "--prompt",
                  "def f(x):", "--max_new_tokens", "8", "--num_draft", "3", "--output", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["drafted"] == record["rounds"]
    os.remove(os.path.join(workdir, FILE))


def test_an_uncertifiable_delta_writes_nothing(workdir):
    result = _run("infer/learn_then_test.py", "--workdir", workdir, "--delta", "0.0001",
                  *CALIBRATION)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "no value is certified" in result.stdout
    assert not os.path.exists(os.path.join(workdir, FILE))


@pytest.mark.parametrize("args, message", [
    (["--grid", "0.5,1"], "descending"),
    (["--grid", "a"], "expected numbers"),
    (["--calm_measure", "soft"], "calm_measure='soft'"),
])
def test_calibration_errors_are_one_line(workdir, args, message):
    result = _run("infer/learn_then_test.py", "--workdir", workdir, *CALIBRATION, *args)
    assert result.returncode == 1 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_the_lambda_sweep_prints_its_table_and_saves_the_curve(workdir, tmp_path):
    plot = tmp_path / "curve.png"
    result = _run("bench/calm_quality.py", "--workdir", workdir, *SMALL, "--num_prompts", "2",
                  "--thresholds", "1,0", "--repeats", "1", "--plot", str(plot))
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["lambda", "exit"])
    full, first = (line.split() for line in lines[header + 1:header + 3])
    assert full[:2] == ["1.00", "4.00"] and first[:2] == ["0.00", "1.00"]
    assert full[4] == "1.000"  # lambda 1 is the full model: ROUGE-L 1 with itself
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
