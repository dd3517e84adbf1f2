"""Checkpoints in a workdir, through orbax's CheckpointManager.

Each step is one orbax checkpoint with three items: `params`, `opt_state` and `meta` (JSON: the
full run config, the model config, the data position). Orbax writes to a temporary directory and
renames it when complete, so a crash mid-save never leaves a half-written "latest" checkpoint.
Inference restores `params` alone. Resume is exact (same data order and PRNG stream); a
different model config, a corrupt or missing checkpoint or a NaN loss is a one-line error and
the last good checkpoint is kept. An unreadable latest checkpoint names the step folder to
remove (training) or falls back to the newest readable one with a warning (inference).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import jax
import orbax.checkpoint as ocp
from jax.sharding import Mesh

from specjax.config import ModelConfig
from specjax.errors import SpecjaxError
from specjax.model import init_params
from specjax.sharding import tree_shardings, with_shardings


class CheckpointError(SpecjaxError):
    """A checkpoint is missing, unreadable or does not belong to this model."""


class UnreadableCheckpointError(CheckpointError):
    """A checkpoint's files could not be read."""


class Checkpointer:
    """Save / restore / resume in `workdir/checkpoints`, keeping the last `keep` steps."""

    def __init__(self, workdir: str, keep: int = 3, *, create: bool = True):
        self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
        if not create and not os.path.isdir(self.directory):
            raise CheckpointError(f"no checkpoints in {workdir!r} (expected {self.directory}); "
                                  "train a model there first with train/train.py")
        self._manager = ocp.CheckpointManager(
            self.directory, item_names=("params", "opt_state", "meta"),
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=create,
                                                 enable_async_checkpointing=False))

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def save(self, step: int, params: Any, opt_state: Any | None, meta: dict[str, Any]) -> None:
        """Saves a step; `opt_state` None (an imported model) records that there is none."""
        items = {"params": ocp.args.StandardSave(params),
                 "meta": ocp.args.JsonSave({**meta, "optimizer_state": opt_state is not None})}
        if opt_state is not None:
            items["opt_state"] = ocp.args.StandardSave(opt_state)
        self._manager.save(step, args=ocp.args.Composite(**items), force=True)
        self._manager.wait_until_finished()

    def read_meta(self, step: int | None = None) -> dict[str, Any]:
        step = self._resolve(step)
        return self._restore(step, meta=ocp.args.JsonRestore())["meta"]

    def restore(self, abstract_params: Any, abstract_opt_state: Any | None = None,
                step: int | None = None) -> tuple[Any, Any | None, dict[str, Any]]:
        """Restores (params, opt_state or None, meta); abstract trees give shapes and dtypes."""
        step = self._resolve(step)
        items = {"params": ocp.args.StandardRestore(abstract_params),
                 "meta": ocp.args.JsonRestore()}
        if abstract_opt_state is not None:
            if not self.read_meta(step).get("optimizer_state", True):
                raise CheckpointError(
                    f"checkpoint of step {step} in {self.directory} holds weights only (an "
                    "imported model): training cannot resume from it; use it with "
                    "infer/generate.py or bench/bench.py")
            items["opt_state"] = ocp.args.StandardRestore(abstract_opt_state)
        restored = self._restore(step, **items)
        return restored["params"], restored.get("opt_state"), restored["meta"]

    def _resolve(self, step: int | None) -> int:
        if step is None:
            step = self.latest_step()
            if step is None:
                raise CheckpointError(f"no checkpoint found in {self.directory}")
        elif step not in self._manager.all_steps():
            raise CheckpointError(f"no checkpoint for step {step} in {self.directory} "
                                  f"(available: {sorted(self._manager.all_steps())})")
        return step

    def _restore(self, step: int, **items: Any) -> Any:
        try:
            return self._manager.restore(step, args=ocp.args.Composite(**items))
        except Exception as error:  # orbax raises many types for unreadable files
            earlier = [s for s in self.all_steps() if s < step]
            fallback = (f"remove {os.path.join(self.directory, str(step))} to resume from step "
                        f"{earlier[-1]}, the previous checkpoint" if earlier else
                        "there is no earlier checkpoint to fall back to")
            raise UnreadableCheckpointError(
                f"checkpoint of step {step} in {self.directory} could not be restored (it may be "
                f"corrupt or written by a different model: {type(error).__name__}); "
                f"{fallback}") from error

    def close(self) -> None:
        self._manager.close()


def check_model_config(meta: dict[str, Any], cfg: ModelConfig, directory: str) -> None:
    """Refuses a checkpoint whose model differs from `cfg`, naming every differing field."""
    if "model" not in meta:
        raise CheckpointError(f"checkpoint in {directory} has no model config in its metadata")
    saved = ModelConfig.from_dict(meta["model"])
    differences = saved.diff(cfg)
    if differences:
        listing = ", ".join(f"{k}: checkpoint={a!r} vs config={b!r}"
                            for k, (a, b) in sorted(differences.items()))
        raise CheckpointError(f"the workdir {directory} holds a different model ({listing}); "
                              "use a new --workdir or the matching config")


def abstract_tree(tree: Any) -> Any:
    """Shape/dtype structs (with shardings, if any) for orbax restore targets."""
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def load_params(workdir: str, step: int | None = None,
                abstract: Callable[[ModelConfig], Any] | None = None, *,
                mesh: Mesh | None = None) -> tuple[Any, ModelConfig, dict[str, Any]]:
    """(params, model config, metadata) of a workdir's latest (or given) checkpoint, for
    inference: the optimizer state is not read. `abstract(cfg)` gives the params' shapes when
    they are not the model's (an adapter's). Restored onto one device, or straight into the
    layout `sharding.RULES` gives on `mesh` (never whole on one device). An unreadable latest
    checkpoint falls back to the newest readable one, with a warning."""
    return _newest_readable(workdir, step, lambda checkpoints, candidate: _load_step(
        checkpoints, candidate, abstract, mesh))


def load_model_config(workdir: str) -> tuple[ModelConfig, dict[str, Any]]:
    """(model config, metadata) of the checkpoint `load_params` would read, its weights left
    unread, for tools that need only the model's shape and tokenizer; the same refusals."""
    return _newest_readable(workdir, None, lambda checkpoints, candidate: _model_meta(
        checkpoints, candidate, model_only=True))


def _newest_readable(workdir: str, step: int | None,
                     read: Callable[[Checkpointer, int], Any]) -> Any:
    """`read` of the workdir's checkpoint `step`, else of its latest one, falling back to the
    newest readable one with a warning."""
    checkpoints = Checkpointer(workdir, create=False)
    candidates = [step] if step is not None else checkpoints.all_steps()[::-1]
    if not candidates:
        raise CheckpointError(f"no checkpoint found in {checkpoints.directory}")
    for candidate, earlier in zip(candidates[:-1], candidates[1:], strict=True):
        try:
            return read(checkpoints, candidate)
        except UnreadableCheckpointError as error:
            print(f"warning: checkpoint of step {candidate} in {checkpoints.directory} is "
                  f"unreadable ({type(error.__cause__).__name__}); trying step {earlier}",
                  file=sys.stderr)
    return read(checkpoints, candidates[-1])


def _model_meta(checkpoints: Checkpointer, step: int, *, model_only: bool
                ) -> tuple[ModelConfig, dict[str, Any]]:
    """The model config and metadata of `step`; a head's checkpoint refused when `model_only`."""
    meta = checkpoints.read_meta(step)
    if "model" not in meta:
        raise CheckpointError(f"checkpoint in {checkpoints.directory} has no model config")
    if model_only and "base" in meta:  # a head's weights, not a model's
        raise CheckpointError(f"{checkpoints.directory} holds a {meta.get('objective')} run, "
                              f"not a model (a head on the model in {meta['base']['workdir']})")
    return ModelConfig.from_dict(meta["model"]), meta


def _load_step(checkpoints: Checkpointer, step: int,
               abstract: Callable[[ModelConfig], Any] | None, mesh: Mesh | None
               ) -> tuple[Any, ModelConfig, dict[str, Any]]:
    cfg, _ = _model_meta(checkpoints, step, model_only=abstract is None)
    shapes = (abstract(cfg) if abstract is not None else
              jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0))))
    if mesh is None:  # whatever layout saved it
        one_device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        shardings = jax.tree.map(lambda _: one_device, shapes)
    else:
        shardings = tree_shardings(mesh, shapes)
    params, _, meta = checkpoints.restore(with_shardings(shapes, shardings), step=step)
    return params, cfg, meta
