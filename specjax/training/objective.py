"""What a training run optimises: the `Objective` interface the trainer drives, and LayerSkip's.

The trainer owns the data stream, the loop, logging, checkpoints, resume and interrupts; an
objective owns the parameters being trained, the compiled train and eval steps and what its
checkpoints must record. LayerSkip trains the whole model (layer dropout, early-exit loss); a
head on a frozen base (Kangaroo's adapter, `training.kangaroo`) trains only its own weights.
The objectives are registered in `training.registry`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.nn.mtp import init_mtp
from specjax.sharding import batch_sharding
from specjax.training.config import RunConfig
from specjax.training.curriculum import exit_schedule
from specjax.training.evaluate import ExitReport, evaluate, make_eval_step
from specjax.training.frozen_base import FrozenBase
from specjax.training.init_source import InitSource
from specjax.training.layer_dropout import dropout_rates
from specjax.training.memory import StepMemory, step_memory
from specjax.training.optimizer import make_optimizer
from specjax.training.run_mesh import RunMesh
from specjax.training.train_step import StepSchedule, TrainState, init_train_state, make_train_step


class Report(Protocol):
    """Validation metrics: printed as a table, logged as a dict."""

    def table(self) -> str: ...

    def to_dict(self) -> dict: ...


class Objective(Protocol):
    name: ClassVar[str]
    run: RunConfig
    config: dict[str, Any]  # the config as run (a base fills in the model, data, decoding)
    state_shardings: Any  # the state's layout on the run's mesh; None: one device
    memory: StepMemory | None  # the train step's memory estimate, once it has compiled
    batch_rows: slice  # the rows of each global batch this process reads and passes

    def init_state(self) -> TrainState:
        """The state before step 0 (from the run's seed, or from the base a head starts as)."""

    def frozen_layers(self) -> tuple[FrozenBase, tuple[int, ...]] | None:
        """The frozen model the train step runs and the layers (1..L) whose hidden states it
        reads: what `train.feature_cache` may store. None: the step runs no frozen model."""

    def train_step(self, state: TrainState, batch: np.ndarray, step: int,
                   features: Mapping[int, np.ndarray] | None = None
                   ) -> tuple[TrainState, dict[str, jax.Array]]:
        """One optimiser step on the global batch [B, T+1], of which `batch` holds this
        process's `batch_rows`; `features`: the frozen model's hidden states on those rows
        (`frozen_layers`), None to compute them in the step. Metrics include a scalar "loss"."""

    def evaluate(self, state: TrainState, batches: Sequence[np.ndarray]) -> Report:
        """Validation metrics over `batches`."""

    def meta(self) -> dict[str, Any]:
        """What each checkpoint records beyond the trainer's own metadata."""

    def check_resume(self, meta: dict[str, Any]) -> None:
        """Raises if the checkpoint (its `meta`) cannot be continued by this objective."""


def step_schedule(run: RunConfig, step: int) -> StepSchedule:
    """The host-built per-step inputs of the LayerSkip train step."""
    cfg = run.model
    layers, weights = exit_schedule(run.layerskip, cfg.supervised_exits, cfg.num_layers, step,
                                    run.train.total_steps)
    rates = dropout_rates(run.layerskip, cfg.num_layers, step, run.train.total_steps)
    return StepSchedule(drop_rates=jnp.asarray(rates), exit_layers=jnp.asarray(layers),
                        exit_weights=jnp.asarray(weights))


def with_mtp(params: Any, cfg: ModelConfig, seed: int) -> Any:
    """A source's weights with the MTP modules `cfg` asks for: fresh ones when it has none
    (continual training adds them), none when `cfg` has none."""
    params = {k: v for k, v in params.items() if k != "mtp" or cfg.mtp_depth}
    if cfg.mtp_depth and "mtp" not in params:
        params["mtp"] = init_mtp(cfg, jax.random.PRNGKey(seed), cfg.mtp_depth)
    return params


class LayerSkip:
    """The whole model, trained with layer dropout and the early-exit loss (`layerskip`), from
    a random initialisation or from `source`'s weights (continual training)."""

    name: ClassVar[str] = "layerskip"

    def __init__(self, run: RunConfig, config: dict[str, Any], source: InitSource | None = None):
        self.run, self.config, self.source = run, config, source
        self.optimizer = make_optimizer(run.train)
        self.on_mesh = RunMesh(run)
        self.mesh, self.batch_rows = self.on_mesh.mesh, self.on_mesh.batch_rows

        def init(key: jax.Array) -> TrainState:
            return init_train_state(run.model, self.optimizer, key)

        # Initialised already laid out on the mesh: no device ever holds the whole state.
        shardings = self.on_mesh.shardings(jax.eval_shape(init, jax.random.PRNGKey(0)))
        self.state_shardings = shardings
        self._init = jax.jit(init, out_shardings=shardings)
        self._init_from = jax.jit(  # the source's weights: a fresh optimizer at step 0
            lambda params: TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                      opt_state=self.optimizer.init(params)),
            in_shardings=(shardings.params,), out_shardings=shardings)
        self.jitted_step = jax.jit(  # public for export, so its inputs' layouts are explicit
            make_train_step(run.model, self.optimizer, remat=run.train.remat,
                            grad_accum=run.train.grad_accum,
                            mtp_weight=run.layerskip.mtp_weight,
                            exit_distill=run.layerskip.exit_distill),
            in_shardings=(shardings, batch_sharding(self.mesh), None, None),
            out_shardings=(shardings, None), donate_argnums=0)
        self._compiled_step: jax.stages.Compiled | None = None
        self.memory: StepMemory | None = None
        self._eval_step = jax.jit(make_eval_step(run.model))
        self._key = jax.random.PRNGKey(run.train.seed + 1)

    def init_state(self) -> TrainState:
        if self.source is not None:
            params = with_mtp(self.source.load_params(self.run.model, self.mesh), self.run.model,
                              self.run.train.seed)
            return self._init_from(jax.device_put(params, self.state_shardings.params))
        return self._init(jax.random.PRNGKey(self.run.train.seed))

    def frozen_layers(self) -> None:
        """None: the whole model trains, no frozen one runs."""
        return None

    def train_step(self, state: TrainState, batch: np.ndarray, step: int,
                   features: None = None) -> tuple[TrainState, dict[str, jax.Array]]:
        args = (state, self.on_mesh.train_batch(batch), jax.random.fold_in(self._key, step),
                step_schedule(self.run, step))
        if self._compiled_step is None:  # compiled ahead of the first step, for its estimate
            self._compiled_step = self.jitted_step.lower(*args).compile()
            self.memory = step_memory(self._compiled_step, state)
        return self._compiled_step(*args)

    def evaluate(self, state: TrainState, batches: Sequence[np.ndarray]) -> ExitReport:
        return evaluate(self._eval_on_mesh, state.params, batches)

    def _eval_on_mesh(self, params: Any, batch: np.ndarray) -> dict[str, jax.Array]:
        return self._eval_step(params, self.on_mesh.eval_batch(batch))

    def meta(self) -> dict[str, Any]:
        return {}

    def check_resume(self, meta: dict[str, Any]) -> None:
        if meta.get("objective", self.name) != self.name:
            raise ValueError(f"the workdir holds a {meta['objective']} run, not a LayerSkip "
                             "one; use a new --workdir")
