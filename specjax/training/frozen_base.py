"""A trained model that a run builds on without changing it (Kangaroo's adapter, SpecDec++'s
acceptance head, a distilled draft's teacher): loaded from its workdir, fingerprinted, and
checked to be the same model whenever the run resumes or its weights are used for decoding;
and what every head trained on such a base shares (`HeadOnBase`)."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from specjax.config import ModelConfig, dataclass_from_mapping
from specjax.io.checkpoint import Checkpointer, CheckpointError, load_params
from specjax.model import Params, embed, exit_logits, run_layers
from specjax.tokenizer import NO_TOKENIZER, data_fields, get_tokenizer
from specjax.training.config import RunConfig
from specjax.training.optimizer import make_optimizer
from specjax.training.run_mesh import RunMesh
from specjax.training.train_step import TrainState


@dataclasses.dataclass(frozen=True)
class FrozenBase:
    """The base model: workdir (absolute), checkpoint step, params, config, its checkpoint's
    metadata, and a checksum of its weights."""

    workdir: str
    step: int
    params: Params
    cfg: ModelConfig
    meta: dict[str, Any]
    checksum: str

    def record(self) -> dict[str, Any]:
        """What a run on this base stores in its checkpoints."""
        return {"workdir": self.workdir, "step": self.step, "checksum": self.checksum}

    def check_unchanged(self, recorded: Mapping[str, Any], user: str) -> None:
        """Refuses a base whose weights differ from the ones `recorded` when `user` (a workdir)
        was trained on it."""
        if recorded.get("checksum") != self.checksum:
            raise CheckpointError(
                f"the base model in {self.workdir} (step {self.step}) is not the one {user} was "
                f"trained on (step {recorded.get('step')} of {recorded.get('workdir')}): its "
                "weights differ. Restore that base or train again in a new --workdir")


def params_checksum(params: Params) -> str:
    """SHA-256 over every weight's dtype, shape and bytes, in tree order."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        array = np.asarray(leaf)
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def load_base(workdir: str, step: int | None = None, *, mesh: Mesh | None = None) -> FrozenBase:
    """The model in `workdir` (its latest checkpoint, or `step`) as a frozen base, on one
    device or laid out on `mesh` (one process's; the checksum reads every weight)."""
    if not workdir:
        raise ValueError("config.base_workdir is required: the workdir of the trained model "
                         "to build on (e.g. --config.base_workdir=runs/tiny)")
    if not os.path.isdir(workdir):
        raise CheckpointError(f"base_workdir {workdir!r} does not exist: train the base model "
                              "first (python train/train.py --config tiny_code "
                              f"--workdir {workdir})")
    params, cfg, meta = load_params(workdir, step, mesh=mesh)
    return FrozenBase(os.path.abspath(workdir), int(meta["step"]), params, cfg, meta,
                      params_checksum(params))


def trained_base(recorded: Mapping[str, Any], user: str, *, current: FrozenBase | None = None,
                 mesh: Mesh | None = None) -> FrozenBase:
    """The base `user` (a head's workdir) was trained on, from its checkpoint's `recorded`
    base: `current` when its weights are those, else the recorded step of the recorded
    workdir (the base trained on since), else, that step rotated out, `current` or the
    workdir's latest; refused (`FrozenBase.check_unchanged`) unless its weights are the
    recorded ones. Resuming a head and decoding from one both read it."""
    base = current
    if base is None or base.checksum != recorded.get("checksum"):
        try:
            base = load_base(recorded["workdir"], recorded["step"], mesh=mesh)
        except CheckpointError:
            base = current or load_base(recorded["workdir"], mesh=mesh)
    base.check_unchanged(recorded, user)
    return base


def config_on_base(config: Mapping[str, Any], base: FrozenBase) -> dict[str, Any]:
    """The run config with the base's model and tokenizer, and the base's data and decoding
    sections under the run's own overrides (a run cannot change the base's model)."""
    if "model" in config:
        raise ValueError("a run on config.base_workdir takes its model from the base; remove "
                         "the model section")
    saved = base.meta.get("config", {})
    out = copy.deepcopy(dict(config))
    out["model"] = base.cfg.to_dict()
    for section in ("data", "decoding"):
        out[section] = {**saved.get(section, {}), **dict(config.get(section) or {})}
    tokenizer = data_fields(base.meta.get("tokenizer", "bytes"), base.workdir)
    if tokenizer is None:
        raise ValueError(f"{base.workdir}: {NO_TOKENIZER}")
    given = dict(config.get("data") or {}).get("tokenizer", tokenizer["tokenizer"])
    if given != tokenizer["tokenizer"]:
        raise ValueError(f"data.tokenizer={given!r} differs from the base's "
                         f"{tokenizer['tokenizer']!r}")
    out["data"].update(tokenizer)
    return out


Features = dict[int, jax.Array]  # the frozen model's hidden states [B, T, D] by layer number


def base_hidden(base: Params, cfg: ModelConfig, layers: Sequence[int],
                inputs: jax.Array) -> Features:
    """The frozen base's hidden states on `inputs` [B, T] after each of `layers` (layer
    numbers 1..L): what a head's step reads of it, and what `train.feature_cache` stores. The
    layers run in ranges between them, so only those states are kept."""
    hidden, start, kept = embed(base, cfg, inputs), 0, {}
    for stop in sorted(set(layers)):
        if stop > start:
            hidden = run_layers(base, cfg, hidden, layers=(start, stop))[-1]
        kept[stop], start = hidden, stop
    return kept


def base_features(base: Params, cfg: ModelConfig, exits: Sequence[int], inputs: jax.Array,
                  features: Features | None = None) -> tuple[list[jax.Array], jax.Array]:
    """The frozen base on `inputs` [B, T]: its hidden states after each of `exits` layers
    ([B, T, D] each, in the order given) and the final layer's logits [B, T, V], recomputed
    from the last hidden state by the frozen head (exact, and a cache stores D, not V, numbers
    a token). `features`: those states already computed (`feature_cache`); None: run the base
    here."""
    if features is None:
        features = base_hidden(base, cfg, (*exits, cfg.num_layers), inputs)
    return ([features[e] for e in exits],
            exit_logits(base, cfg, features[cfg.num_layers]))


class HeadOnBase:
    """What every objective training a head on a frozen base shares: the head's exit as the
    decoding default (a head trained at one exit, its section's `exit_layer`), the checkpoint
    record (the base's fingerprint and the head's `settings`) and the resume checks. A head
    sets `name` (its objective, its config section, read as the dataclass `config_class`, and
    the decoding strategy that reads its weights; `strategies()` when several do),
    `record_key` (where checkpoints record its settings), `abstract_params(cfg, settings)`
    (restore targets), `initial_params()`, its pure steps (`make_train_step`,
    `make_eval_step`, compiled here) and `evaluate`. On the run's mesh the base's weights
    (`base_params`) and the head's state are laid out by the sharding rules."""

    name: ClassVar[str]
    config_class: ClassVar[type]
    record_key: ClassVar[str]
    memory = None  # a head is small: no memory estimate

    def __init__(self, run: RunConfig, config: dict[str, Any], base: FrozenBase):
        self.run, self.config, self.base = run, config, base
        self.section = self.read_section(config)
        self.exit_layer = getattr(self.section, "exit_layer", None)
        if self.exit_layer is not None and self.exit_layer >= run.model.num_layers:
            raise ValueError(f"{self.name}.exit_layer={self.exit_layer} must lie in [1, "
                             f"num_layers - 1 = {run.model.num_layers - 1}]")
        self.optimizer = make_optimizer(run.train)
        self.on_mesh = RunMesh(run)
        self.batch_rows = self.on_mesh.batch_rows
        self.state_shardings = self.on_mesh.shardings(jax.eval_shape(self._unplaced_state))
        self._placed_base: tuple[FrozenBase, Params] | None = None
        self._train_step = self.on_mesh.jit_step(self.make_train_step(), self.state_shardings)
        self._eval_step = jax.jit(self.make_eval_step())

    def initial_params(self) -> Params:
        """The head's weights before training."""
        raise NotImplementedError

    def make_train_step(self) -> Callable:
        """The pure step(state, base params, batch [B, T+1], features, *step_inputs(step)) ->
        (state, metrics with a scalar "loss"); `features`: the base's hidden states at
        `feature_layers` (`base_features`), or None to run the base in the step."""
        raise NotImplementedError

    def make_eval_step(self) -> Callable:
        """The pure step(head params, base params, batch, *eval_inputs(index)) -> arrays."""
        raise NotImplementedError

    def step_inputs(self, step: int) -> tuple:
        """What a train step takes after the batch (a sampling key); nothing by default."""
        return ()

    def eval_inputs(self, index: int) -> tuple:
        """What the eval step of the `index`-th batch takes after it; nothing by default."""
        return ()

    @property
    def exits(self) -> tuple[int, ...]:
        """The base's layers the head reads besides the last (its `exit_layer`, if any)."""
        return () if self.exit_layer is None else (self.exit_layer,)

    def frozen_layers(self) -> tuple[FrozenBase, tuple[int, ...]]:
        """The frozen model and the layers whose hidden states the train step reads."""
        return self.base, tuple(sorted({*self.exits, self.run.model.num_layers}))

    def train_step(self, state: TrainState, batch: np.ndarray, step: int,
                   features: Mapping[int, np.ndarray] | None = None
                   ) -> tuple[TrainState, dict[str, jax.Array]]:
        return self._train_step(state, self.base_params, self.on_mesh.train_batch(batch),
                                self.on_mesh.train_features(features), *self.step_inputs(step))

    def eval_batch(self, state: TrainState, batch: np.ndarray, index: int = 0) -> Any:
        """The eval step's outputs for one validation batch (on the device)."""
        return self._eval_step(state.params, self.base_params, self.on_mesh.eval_batch(batch),
                               *self.eval_inputs(index))

    def _unplaced_state(self) -> TrainState:
        params = self.initial_params()
        return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                          opt_state=self.optimizer.init(params))

    def init_state(self) -> TrainState:
        return jax.device_put(self._unplaced_state(), self.state_shardings)  # a head is small

    @property
    def base_params(self) -> Params:
        """The base's weights on the run's mesh, placed once per base (a resume may switch to
        the base's step the head started on)."""
        if self._placed_base is None or self._placed_base[0] is not self.base:
            self._placed_base = (self.base, self.on_mesh.place(self.base.params))
        return self._placed_base[1]

    def settings(self) -> dict[str, Any]:
        """The head's config section: its shape and training settings, fixed for a workdir's
        life."""
        return dataclasses.asdict(self.section)

    @staticmethod
    def abstract_params(cfg: ModelConfig, settings: Mapping[str, Any]) -> Params:
        raise NotImplementedError

    @classmethod
    def strategies(cls) -> tuple[str, ...]:
        """The decoding strategies that read this head's weights."""
        return (cls.name,)

    @classmethod
    def read_section(cls, config: Mapping[str, Any]) -> Any:
        """The head's config section, checked, as its `config_class`."""
        return dataclass_from_mapping(cls.config_class, config.get(cls.name) or {}, cls.name)

    @classmethod
    def on_base(cls, config: dict[str, Any]) -> dict[str, Any]:
        """The run config with the head's exit (if it has one) as the decoding default:
        decoding from the head's workdir drafts where the head was trained."""
        section = cls.read_section(config)
        if hasattr(section, "exit_layer"):
            config["decoding"] = {**config["decoding"], "exit_layer": section.exit_layer}
        return config

    def meta(self) -> dict[str, Any]:
        return {"base": self.base.record(), self.record_key: self.settings()}

    def check_resume(self, meta: dict[str, Any]) -> None:
        if meta.get("objective") != self.name:
            raise CheckpointError(f"the workdir holds a {meta.get('objective', 'layerskip')} "
                                  f"run, not a {self.name} head; use a new --workdir")
        current = self.base
        self.base = trained_base(meta["base"], f"this {self.name} head", current=current)
        if self.base is not current:  # the base trained on since
            print(f"resuming on step {self.base.step} of the base, the one this head "
                  "started on")
        # A setting added since the checkpoint was written holds its default there.
        saved = {**{field.name: field.default for field in dataclasses.fields(self.section)},
                 **meta[self.record_key]}
        for key, value in self.settings().items():
            if saved.get(key) != value:
                raise CheckpointError(f"{self.name}.{key}={value!r} differs from the "
                                      f"checkpoint's {saved.get(key)!r}; use a new --workdir")


def save_imported_head(objective: type[HeadOnBase], section: Any, params: Params,
                       base: FrozenBase, workdir: str, settings: Mapping[str, Any],
                       source: Mapping[str, Any]) -> None:
    """Writes a published head as step 0 of a new head workdir, recorded as one trained by
    `objective` with `section` on `base` would be (its settings, the base's fingerprint, the
    decoding defaults `on_base` gives, the base's tokenizer), so decoding reads it the same way.
    """
    checkpoints = Checkpointer(workdir)
    if checkpoints.latest_step() is not None:
        raise ValueError(f"{workdir!r} already holds checkpoints; import into a new workdir")
    tokenizer = base.meta.get("tokenizer", "bytes")
    if isinstance(tokenizer, dict):  # the workdir decodes text on its own, as a trained one
        get_tokenizer(tokenizer, base.workdir).save_files(workdir)
    config = objective.on_base({
        "decoding": dict(base.meta.get("config", {}).get("decoding") or {}),
        objective.name: dataclasses.asdict(section)})
    checkpoints.save(0, params, None, {
        "step": 0, "data_position": 0, "model": base.cfg.to_dict(), "tokenizer": tokenizer,
        "objective": objective.name, "config": config, "base": base.record(),
        objective.record_key: dict(settings), "source": dict(source)})
    checkpoints.close()
