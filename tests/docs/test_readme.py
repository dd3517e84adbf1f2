"""The Python examples of the README and the decoding guide, and the README's recipe for your
own text, run as written."""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from specjax.decoding.registry import STRATEGIES
from specjax.io.checkpoint import Checkpointer
from specjax.training.trainer import Trainer
from tests.support import ROOT
from tests.support.models import tiny_run
from tests.support.scripts import reader_files, run_script, script_env

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out


def _read(name: str) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


def _env():
    return script_env()


def test_the_python_examples_run(tmp_path):
    """Catches an API change the README or the decoding guide did not follow (names,
    arguments, imports)."""
    blocks = [re.findall(r"```python\n(.*?)```", _read(name), flags=re.S)
              for name in ("README.md", os.path.join("docs", "guide", "decoding.md"))]
    assert [len(found) for found in blocks] == [1, 1]
    config = tiny_run(train=dict(total_steps=4, eval_every=4, save_every=4),
                      data=dict(max_documents=400))  # held-out windows for the benchmark
    config["decoding"] = {"exit_layer": 1, "num_draft": 3}
    Trainer(config, str(tmp_path / "runs" / "tiny")).fit()
    outputs = []
    for block in (found[0] for found in blocks):
        result = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=_env(),
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        outputs.append(result.stdout.strip().splitlines())
    assert any(str(sorted(STRATEGIES)) in line for line in outputs[0])
    assert "'import os' ->" in "\n".join(outputs[0])
    assert "('ar', 1.0)" in outputs[0][-1] and "'tree'" in outputs[0][-1]
    assert float(outputs[1][-1]) >= 1.0  # the tree's tau


def test_the_readme_local_files_command_trains_on_those_files(tmp_path):
    """Catches a data source the shipped config cannot reach from the command line (the
    README's `--config.data.files=...` failed on a config without that field)."""
    command = re.search(r"(train/train\.py --config tiny_code --workdir runs/x"
                        r".*?--config\.data\.files=corpus\.jsonl)", _read("README.md"), flags=re.S)
    args = shlex.split(command.group(1).replace("\\\n", " "))
    reader_files(tmp_path)  # corpus.jsonl, and prompts.jsonl for the next command
    tiny = ["--config.train.total_steps=2", "--config.train.warmup_steps=1",
            "--config.train.batch_size=2",
            "--config.train.eval_every=2", "--config.train.save_every=2",
            "--config.train.eval_batches=1", "--config.data.seq_len=32",
            "--config.model.d_model=32", "--config.model.mlp_dim=64",
            "--config.model.num_layers=2", "--config.model.exit_layers=(1, 2)"]
    result = run_script(*args, *tiny, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    meta = Checkpointer(str(tmp_path / "runs" / "x")).read_meta()
    assert meta["config"]["data"]["source"] == "files"
    assert meta["config"]["data"]["files"] == "corpus.jsonl"
    assert meta["config"]["layerskip"]["p_max"] == 0.2
    # The recipe's next command decodes a prompts file from that workdir.
    generate = re.search(r"infer/generate\.py --workdir runs/x .*", _read("README.md")).group(0)
    result = run_script("infer/generate.py", *shlex.split(generate)[1:], "--max_new_tokens", "8",
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((tmp_path / "out.jsonl").read_text())["prompt"] == "def f("
