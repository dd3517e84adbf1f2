"""The training loop end to end on tiny runs of the embedded corpus."""

import glob
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.errors import SpecjaxError
from specjax.io.checkpoint import Checkpointer, CheckpointError, load_params
from specjax.io.workdir import WorkdirBusyError, exclusive_workdir
from specjax.training import objective as objective_module
from specjax.training.config import parse_run_config
from specjax.training.metrics_log import MetricsLog
from specjax.training.optimizer import make_optimizer
from specjax.training.train_step import StepSchedule, init_train_state, make_train_step
from specjax.training.trainer import Trainer, TrainingDivergedError
from tests.support.models import tiny_run

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out


def _train_losses(workdir):
    return {r["step"]: r["loss"] for r in MetricsLog(workdir).read() if r["split"] == "train"}


def _final_params(workdir, trainer):
    abstract = jax.eval_shape(trainer.fresh_state)
    params, _, meta = Checkpointer(workdir).restore(abstract.params)
    return params, meta


def test_loss_decreases_on_the_embedded_corpus(tmp_path):
    trainer = Trainer(tiny_run(train=dict(total_steps=40, eval_every=40, save_every=40)),
                      str(tmp_path))
    before = trainer.objective.evaluate(trainer.fresh_state(), trainer.eval_batches)
    result = trainer.fit()
    after = result.report
    assert before.final_loss > 5.0  # ~ln(259) at initialisation
    assert after.final_loss < before.final_loss - 1.5
    assert all(a < b for a, b in zip(after.loss, before.loss, strict=True))  # every exit learned
    losses = _train_losses(str(tmp_path))
    assert np.mean([losses[s] for s in (36, 39, 40) if s in losses]) < losses[3] - 1.0
    assert set(after.to_dict()) >= {"exit_loss", "exit_agreement", "bits_per_token"}
    assert after.agreement[-1] == 1.0 and len(after.loss) == 4


def test_interrupted_and_resumed_run_matches_uninterrupted(tmp_path):
    """Also catches metrics.jsonl keeping records that a run logged after its last checkpoint
    (a crash there): the resumed run trains those steps again and must log them once."""
    config = tiny_run()
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    trainer = Trainer(config, straight)
    full = trainer.fit()
    first = Trainer(config, resumed).fit(stop_requested=lambda step: step == 5)
    assert first.interrupted and first.step == 5
    assert Checkpointer(resumed).latest_step() == 5
    for step in (6, 9):  # as if the run had crashed after logging step 9
        MetricsLog(resumed).write({"split": "train", "step": step, "loss": 99.0})
    second = Trainer(config, resumed).fit()
    assert second.step == full.step == 12 and not second.interrupted
    a, b = _train_losses(straight), _train_losses(resumed)
    assert [a[s] for s in (6, 9, 12)] == [b[s] for s in (6, 9, 12)]
    steps = [r["step"] for r in MetricsLog(resumed).read() if r["split"] == "train"]
    assert steps == sorted(set(steps))
    assert full.report.loss == second.report.loss
    params_a, meta_a = _final_params(straight, trainer)
    params_b, meta_b = _final_params(resumed, trainer)
    assert meta_a["data_position"] == meta_b["data_position"] == 12 * 4  # steps x batch
    for x, y in zip(jax.tree.leaves(params_a), jax.tree.leaves(params_b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_nan_loss_stops_training_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    real = objective_module.make_train_step

    def poisoned(cfg, optimizer, **options):
        step_fn = real(cfg, optimizer, **options)

        def train_step(state, batch, key, schedule):
            new_state, metrics = step_fn(state, batch, key, schedule)
            loss = jnp.where(state.step >= 7, jnp.nan, metrics["loss"])
            return new_state, {**metrics, "loss": loss}
        return train_step

    monkeypatch.setattr(objective_module, "make_train_step", poisoned)
    with pytest.raises(TrainingDivergedError, match=r"loss is nan at step 8.*step 6"):
        Trainer(tiny_run(), str(tmp_path)).fit()
    assert Checkpointer(str(tmp_path)).latest_step() == 6


def test_resume_with_a_different_model_is_refused(tmp_path, capsys):
    """Also: a changed seq_len (the data position would point elsewhere) is refused, a
    total_steps the checkpoint has reached says so, and a busy workdir refuses a second run
    while a stale lock file left by a crashed run does not block."""
    (tmp_path / ".lock").write_text("pid 1 on a crashed run\n")
    Trainer(tiny_run(train=dict(total_steps=3, warmup_steps=1)), str(tmp_path)).fit()
    with exclusive_workdir(str(tmp_path)), pytest.raises(WorkdirBusyError, match="in use"):
        Trainer(tiny_run(train=dict(total_steps=6)), str(tmp_path)).fit()
    with pytest.raises(SpecjaxError, match="data.seq_len=16 differs from the checkpoint's 32"):
        Trainer(tiny_run(data=dict(seq_len=16), train=dict(total_steps=6)), str(tmp_path)).fit()
    capsys.readouterr()
    Trainer(tiny_run(train=dict(total_steps=4, batch_size=2)), str(tmp_path)).fit()
    assert "resuming with train.batch_size=2 (checkpoint: 4)" in capsys.readouterr().out
    done = Trainer(tiny_run(train=dict(total_steps=3)), str(tmp_path)).fit()
    assert done.already_done and done.step == 4 and Checkpointer(str(tmp_path)).latest_step() == 4
    other = tiny_run(model=dict(d_model=64, mlp_dim=96), train=dict(total_steps=6))
    with pytest.raises(CheckpointError, match=r"different model \(d_model: checkpoint=32 vs "
                                              r"config=64, head_dim: checkpoint=8 vs config=16, "
                                              r"mlp_dim: checkpoint=64 vs config=96\)"):
        Trainer(other, str(tmp_path)).fit()


def test_corrupt_or_missing_checkpoint_is_a_clear_error(tmp_path, capsys):
    """Catches a corrupt latest checkpoint ending in a library traceback (training must name
    the step to remove and the one it falls back to) and inference not falling back to the
    previous readable step."""
    with pytest.raises(CheckpointError, match="no checkpoints in"):
        Checkpointer(str(tmp_path / "empty"), create=False)
    Trainer(tiny_run(train=dict(total_steps=6, warmup_steps=1, save_every=3)),
            str(tmp_path)).fit()
    for path in glob.glob(str(tmp_path / "checkpoints" / "6" / "params" / "**"), recursive=True):
        if os.path.isfile(path):
            with open(path, "wb") as f:
                f.write(b"\x00garbage")
    step_dir = os.path.join(str(tmp_path), "checkpoints", "6")
    with pytest.raises(CheckpointError, match=rf"step 6 .* could not be restored .*; remove "
                                              rf"{step_dir} to resume from step 3"):
        Trainer(tiny_run(train=dict(total_steps=9)), str(tmp_path)).fit()
    _, _, meta = load_params(str(tmp_path))
    assert meta["step"] == 3
    assert "checkpoint of step 6" in capsys.readouterr().err


@pytest.mark.parametrize("options", [{}, {"grad_accum": 2, "remat": "dots"}],
                         ids=["plain", "accumulated-remat"])
def test_train_step_exports_for_tpu_and_cuda(tiny_cfg, options):
    """Catches a step (plain, or with accumulation, rematerialisation and frozen groups) that
    cannot be lowered for TPU or GPU from a CPU machine."""
    run = parse_run_config(tiny_run(train=dict(frozen="embed") if options else {}))
    optimizer = make_optimizer(run.train)
    state = jax.eval_shape(lambda: init_train_state(tiny_cfg, optimizer, jax.random.PRNGKey(0)))
    batch = jax.ShapeDtypeStruct((4, 33), jnp.int32)
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    schedule = StepSchedule(drop_rates=jax.ShapeDtypeStruct((4,), jnp.float32),
                            exit_layers=jax.ShapeDtypeStruct((3,), jnp.int32),
                            exit_weights=jax.ShapeDtypeStruct((3,), jnp.float32))
    step = jax.jit(make_train_step(tiny_cfg, optimizer, **options))
    exported = jax.export.export(step, platforms=("tpu", "cuda"))(state, batch, key, schedule)
    assert exported.platforms == ("tpu", "cuda")
    assert len(exported.in_avals) == len(jax.tree.leaves((state, batch, key, schedule)))
    assert "stablehlo.while" in exported.mlir_module()  # the layer scan survives lowering


def test_remat_changes_memory_not_results(tiny_cfg):
    """Catches a rematerialisation policy whose step computes a different loss or gradient."""
    run = parse_run_config(tiny_run())
    optimizer = make_optimizer(run.train)
    state = init_train_state(tiny_cfg, optimizer, jax.random.PRNGKey(0))
    batch = jax.random.randint(jax.random.PRNGKey(1), (4, 33), 0, 259)
    schedule = StepSchedule(drop_rates=jnp.full((4,), 0.1), exit_layers=jnp.array([1, 2, 4]),
                            exit_weights=jnp.array([0.25, 0.25, 0.5]))
    key = jax.random.PRNGKey(2)
    outs = {remat: jax.jit(make_train_step(tiny_cfg, optimizer, remat=remat))(
        state, batch, key, schedule) for remat in ("none", "dots", "full")}
    for remat in ("dots", "full"):
        np.testing.assert_allclose(outs[remat][1]["loss"], outs["none"][1]["loss"], rtol=1e-6)
        np.testing.assert_allclose(outs[remat][1]["grad_norm"], outs["none"][1]["grad_norm"],
                                   rtol=1e-5)
