"""LayerSkip training through Mamba-2 layers: a hybrid trains end to end from its config (layer
dropout, early-exit loss, a curriculum), weight decay spares A_log, D and dt_bias, and the train
step exports for TPU and GPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.io.checkpoint import load_params
from specjax.training.config import parse_run_config
from specjax.training.metrics_log import MetricsLog
from specjax.training.optimizer import make_optimizer
from specjax.training.train_step import StepSchedule, init_train_state, make_train_step
from specjax.training.trainer import Trainer
from tests.support.models import tiny_run

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out

HYBRID = dict(layer_pattern=["mamba2", "attention", "mamba2", "attention"],
              ssm=dict(num_heads=4, head_dim=8, state_size=8, groups=2, chunk_size=8))


def test_a_hybrid_trains_from_its_config_and_its_loss_falls(tmp_path):
    """Catches a layer kind the training scan skips or runs out of order (the loss would not
    fall, or the checkpoint would lack the Mamba-2 stack), and a config that does not round-trip
    through the workdir's metadata."""
    run = tiny_run(model=HYBRID, train=dict(total_steps=12, learning_rate=1e-2))
    Trainer(run, str(tmp_path)).fit()
    losses = [r["loss"] for r in MetricsLog(str(tmp_path)).read() if r["split"] == "train"]
    assert losses[-1] < losses[0] - 0.5
    params, cfg, _ = load_params(str(tmp_path))
    assert cfg.layer_kinds == tuple(HYBRID["layer_pattern"])
    assert params["mamba2_layers"]["mixer"]["A_log"].shape == (2, 4)
    assert params["layers"]["attn"]["qkv"].shape[0] == 2


def test_weight_decay_spares_the_state_space_parameters():
    """With a zero gradient, AdamW only decays: A_log, D and dt_bias (and norm scales) must not
    move, matrices must. Catches a decay mask that only knows attention's names."""
    run = parse_run_config(tiny_run(model=HYBRID, train=dict(weight_decay=0.5,
                                                              learning_rate=0.1,
                                                              warmup_steps=0)))
    optimizer = make_optimizer(run.train)
    params = init_train_state(run.model, optimizer, jax.random.PRNGKey(0)).params
    updates, _ = optimizer.update(jax.tree.map(jnp.zeros_like, params), optimizer.init(params),
                                  params)
    mixer = updates["mamba2_layers"]["mixer"]
    for name in ("A_log", "D", "dt_bias", "norm"):
        assert not np.any(mixer[name]), name
    assert np.any(mixer["in_proj"]) and np.any(mixer["conv"])


def test_the_hybrid_train_step_exports_for_tpu_and_cuda():
    """Catches a Mamba-2 training path that lowers only for the CPU (a host callback, the CPU
    kernel outside `lax.platform_dependent`, a shape known only at run time)."""
    run = parse_run_config(tiny_run(model=HYBRID))
    optimizer = make_optimizer(run.train)
    state = jax.eval_shape(lambda: init_train_state(run.model, optimizer, jax.random.PRNGKey(0)))
    schedule = StepSchedule(drop_rates=jax.ShapeDtypeStruct((4,), jnp.float32),
                            exit_layers=jax.ShapeDtypeStruct((2,), jnp.int32),
                            exit_weights=jax.ShapeDtypeStruct((2,), jnp.float32))
    step = jax.jit(make_train_step(run.model, optimizer))
    exported = jax.export.export(step, platforms=("tpu", "cuda"))(
        state, jax.ShapeDtypeStruct((4, 33), jnp.int32), jax.ShapeDtypeStruct((2,), jnp.uint32),
        schedule)
    assert exported.platforms == ("tpu", "cuda")
