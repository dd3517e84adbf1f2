"""Training Kangaroo's adapter on a frozen base, and decoding from the adapter's workdir."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

import specjax
from specjax.checkpoint import Checkpointer, CheckpointError
from specjax.loading import load_model
from specjax.training.frozen_base import load_base, params_checksum
from specjax.training.metrics_log import MetricsLog
from specjax.training.trainer import Trainer
from tests.conftest import TINY_RUN, tiny_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


BASE_RUN = tiny_run(model=dict(init_std=0.3),  # peaked distributions that exits disagree on
                    train=dict(total_steps=4, warmup_steps=1, eval_every=4, save_every=4))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("base"))
    Trainer(BASE_RUN, path).fit()
    return path


def adapter_run(base, **train):
    return {"base_workdir": base, "kangaroo": {"exit_layer": 1},
            "train": {**TINY_RUN["train"], "total_steps": 10, "eval_every": 10,
                      "save_every": 10, "weight_decay": 0.0, **train}}


def _losses(workdir):
    return {r["step"]: r["loss"] for r in MetricsLog(workdir).read() if r["split"] == "train"}


def test_the_adapter_learns_and_the_base_stays_bit_identical(base, tmp_path):
    """Catches gradients or optimizer updates reaching the base, a donated base buffer (the
    adapter starts from copies of base weights), and an adapter that does not learn."""
    before = load_base(base).checksum
    trainer = Trainer(adapter_run(base, total_steps=30, eval_every=30, save_every=30,
                                  learning_rate=1e-2), str(tmp_path))
    untrained = trainer.objective.evaluate(trainer.fresh_state(), trainer.eval_batches)
    assert untrained.soft_ce[0] == pytest.approx(untrained.soft_ce[1], abs=1e-6)  # = the head
    result = trainer.fit()
    assert result.report.soft_ce[1] < untrained.soft_ce[1] - 0.02
    losses = _losses(str(tmp_path))
    assert np.mean([losses[s] for s in (27, 30)]) < losses[3]
    assert params_checksum(trainer.objective.base.params) == before
    assert load_base(base).checksum == before
    meta = Checkpointer(str(tmp_path)).read_meta()
    assert meta["objective"] == "kangaroo" and meta["base"]["checksum"] == before
    assert meta["config"]["decoding"]["exit_layer"] == 1


def test_an_interrupted_adapter_run_resumes_exactly(base, tmp_path):
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    Trainer(adapter_run(base), straight).fit()
    first = Trainer(adapter_run(base), resumed).fit(stop_requested=lambda step: step == 4)
    assert first.interrupted and first.step == 4
    Trainer(adapter_run(base), resumed).fit()
    assert _losses(straight) == _losses(resumed)
    a, b = (load_model(w).draft_weights["kangaroo"].params for w in (straight, resumed))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_a_missing_or_changed_base_is_refused(base, tmp_path):
    """Catches an adapter resumed or decoded on a base trained again from scratch in the same
    workdir. A base that merely trained on keeps the step the adapter started on: resuming
    and decoding use that step (checked by its checksum)."""
    with pytest.raises(ValueError, match="config.base_workdir is required"):
        Trainer(adapter_run(""), str(tmp_path / "a")).fit()
    with pytest.raises(CheckpointError, match="does not exist: train the base model first"):
        Trainer(adapter_run(str(tmp_path / "nowhere")), str(tmp_path / "a")).fit()
    with pytest.raises(ValueError, match="takes its model from the base"):
        Trainer({**adapter_run(base), "model": TINY_RUN["model"]}, str(tmp_path / "a")).fit()
    moved = str(tmp_path / "base")
    shutil.copytree(base, moved)
    adapter = str(tmp_path / "adapter")
    Trainer(adapter_run(moved, total_steps=3, warmup_steps=1), adapter).fit()
    with pytest.raises(CheckpointError, match="holds a kangaroo run, not a model"):
        Trainer(adapter_run(adapter), str(tmp_path / "b")).fit()
    with pytest.raises(ValueError, match="holds a kangaroo run"):
        Trainer(BASE_RUN, adapter).fit()
    recorded = Checkpointer(adapter).read_meta()["base"]["checksum"]
    Trainer({**BASE_RUN, "train": {**BASE_RUN["train"], "total_steps": 5}}, moved).fit()
    assert load_base(moved).checksum != recorded  # the base trained on; its step 4 is kept
    assert params_checksum(load_model(adapter).params) == recorded
    Trainer(adapter_run(moved, total_steps=4, warmup_steps=1), adapter).fit()  # on step 4
    shutil.rmtree(moved)
    with pytest.raises(CheckpointError, match="which no longer exists: move that workdir back"):
        load_model(adapter)
    Trainer(tiny_run(model=dict(init_std=0.3), train={**BASE_RUN["train"], "seed": 1}),
            moved).fit()
    with pytest.raises(CheckpointError, match="is not the one this adapter was trained on"):
        Trainer(adapter_run(moved, total_steps=6, warmup_steps=1), adapter).fit()
    with pytest.raises(CheckpointError, match=f"is not the one {adapter} was trained on"):
        load_model(adapter)


def test_generate_kangaroo_from_the_adapter_workdir(base, tmp_path):
    """The CLI as the README runs it: greedy Kangaroo output is the base's `ar` output; a
    model without an adapter says how to train one."""
    adapter = str(tmp_path / "adapter")
    Trainer(adapter_run(base), adapter).fit()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "import os\\n"}\n{"prompt": "def f(x):"}\n')
    out = tmp_path / "out.jsonl"
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "infer", "generate.py"), "--workdir", adapter,
         "--strategy", "kangaroo", "--draft_threshold", "0.3", "--prompts_file", str(prompts),
         "--max_new_tokens", "24", "--output", str(out)],
        env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    plain = specjax.load(base).generate(["import os\n", "def f(x):"], max_new_tokens=24,
                                        strategy="ar")
    assert [r["completion"] for r in rows] == [c.text for c in plain]
    assert all(r["drafted"] > 0 for r in rows)
    with pytest.raises(ValueError, match="drafts with weights of its own and this model has none"):
        specjax.load(base).generate("x", strategy="kangaroo")
