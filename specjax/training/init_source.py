"""Continual training from an existing model (`config.init.source`): a Hugging Face checkpoint
directory or a specjax workdir.

The source fixes the model and, unless the data's tokenizer is set explicitly, the tokenizer;
the run's config fixes everything else (LayerSkip's dropout and exit losses, the optimizer and
its schedule, data). The config file's model section is a default the source replaces: a model
field set explicitly (a command-line override) must agree with the source, except the fields a
run may choose (`RUN_CHOSEN`: compute and master dtypes, the supervised exits). Supervised exits
the file names that the source lacks are dropped (the final exit is always kept).

A workdir that already holds this run's checkpoints resumes from them and never reads the source
again: its model and tokenizer come from the checkpoint.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from collections.abc import Collection, Mapping
from typing import Any

import jax
from jax.sharding import Mesh

from specjax.config import ModelConfig
from specjax.convert.hf import TOKENIZER_KEY
from specjax.convert.hf_config import architecture, model_config_from_hf, read_hf_config
from specjax.convert.hf_weights import load_hf_params
from specjax.io.checkpoint import Checkpointer, CheckpointError, load_params
from specjax.model import Params
from specjax.tokenizer import TOKENIZER_FILE, UNSET_ID, data_fields

RUN_CHOSEN = ("dtype", "param_dtype", "exit_layers", "mtp_depth")
TOKENIZER_FIELDS = ("tokenizer", "bos_id", "eos_id")


@dataclasses.dataclass(frozen=True)
class InitSource:
    """A model to start from: its path (absolute), kind ("hf" or "workdir"), model config and
    tokenizer (data config fields, or None when it has none)."""

    path: str
    kind: str
    cfg: ModelConfig
    tokenizer: dict[str, Any] | None

    def load_params(self, cfg: ModelConfig, mesh: Mesh) -> Params:
        """The source's weights as `cfg` stores them (its param_dtype), stacked: a workdir's
        restored straight into their layout on `mesh` (no device holds them whole), a Hugging
        Face checkpoint's read tensor by tensor in that dtype."""
        if self.kind == "hf":
            hf = read_hf_config(self.path)
            return load_hf_params(self.path, dataclasses.replace(
                self.cfg, param_dtype=cfg.param_dtype), architecture(hf), hf=hf)
        params, _, _ = load_params(self.path, mesh=mesh)
        return jax.tree.map(lambda w: w.astype(cfg.weight_dtype), params)


def read_source(path: str) -> InitSource:
    """The model at `path`, read without loading its weights; one-line errors for a path that
    is neither kind, a checkpoint without weights, a head's workdir."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"init.source {path!r} does not exist")
    full = os.path.abspath(path)
    if os.path.isdir(os.path.join(path, "checkpoints")):
        meta = Checkpointer(path, create=False).read_meta()
        if "base" in meta:
            raise CheckpointError(f"init.source {path!r} holds a {meta.get('objective')} head, "
                                  "not a model")
        return InitSource(full, "workdir", ModelConfig.from_dict(meta["model"]),
                          data_fields(meta.get("tokenizer"), path))
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"init.source {path!r} is neither a Hugging Face checkpoint "
                                "(config.json + *.safetensors) nor a specjax workdir "
                                "(checkpoints/)")
    if not glob.glob(os.path.join(path, "*.safetensors")):
        raise FileNotFoundError(f"init.source {path!r} has a config.json but no *.safetensors "
                                "weights")
    hf = read_hf_config(path)
    if os.path.isfile(os.path.join(path, TOKENIZER_FILE)):  # BOS/EOS from its config.json
        tokenizer = {"tokenizer": os.path.join(full, TOKENIZER_FILE), "bos_id": UNSET_ID,
                     "eos_id": UNSET_ID}
    else:
        tokenizer = data_fields(hf.get(TOKENIZER_KEY), path)
    return InitSource(full, "hf", model_config_from_hf(hf), tokenizer)


def resolve_init(config: Mapping[str, Any], explicit: Collection[str],
                 workdir: str) -> tuple[dict[str, Any], InitSource | None]:
    """(the config with the source's model and tokenizer, the source to load weights from:
    None when there is none, or when `workdir` resumes a run that already started from it).
    `explicit`: the dotted fields the user set on purpose ("model.num_layers", ...)."""
    config = dict(config)
    path = str(dict(config.get("init") or {}).get("source") or "")
    if not path:
        return config, None
    for section in ("kangaroo", "specdec", "calm"):
        if section in config or config.get("base_workdir"):
            raise ValueError("init.source starts a model's own training; a head on a frozen "
                             "base takes config.base_workdir instead")
    if dict(config.get("distill") or {}).get("teacher_workdir"):
        raise ValueError("init.source and distill.teacher_workdir cannot be combined")
    resumed = _resumed(workdir, path)
    if resumed is not None:
        model, tokenizer = resumed
        return _with(config, model, tokenizer), None
    source = read_source(path)
    model = _model_from_source(dict(config.get("model") or {}), source.cfg, explicit)
    data = dict(config.get("data") or {})
    if any(f"data.{name}" in explicit for name in TOKENIZER_FIELDS):
        tokenizer = {name: data[name] for name in TOKENIZER_FIELDS if name in data}
    elif source.tokenizer is None:
        raise ValueError(f"init.source {path!r} has no tokenizer: set --config.data.tokenizer "
                         "(a tokenizer.json, or bytes)")
    else:
        tokenizer = source.tokenizer
    return _with(config, model, tokenizer), source


def _with(config: dict[str, Any], model: dict[str, Any],
          tokenizer: dict[str, Any]) -> dict[str, Any]:
    return {**config, "model": model, "data": {**dict(config.get("data") or {}), **tokenizer}}


def _resumed(workdir: str, source: str) -> tuple[dict, dict] | None:
    """The model and tokenizer of `workdir`'s checkpoint, when it holds a run started from
    `source`."""
    if not os.path.isdir(os.path.join(workdir, "checkpoints")):
        return None
    checkpoints = Checkpointer(workdir, create=False)
    if checkpoints.latest_step() is None:
        return None
    meta = checkpoints.read_meta()
    recorded = meta.get("init", {}).get("source")
    if recorded is None:
        return None
    if recorded != os.path.abspath(source):
        raise CheckpointError(f"the workdir {workdir} continues a run started from {recorded}, "
                              f"not from {source}; use a new --workdir")
    return meta["model"], data_fields(meta.get("tokenizer"), workdir)


def _model_from_source(file_model: dict[str, Any], source: ModelConfig,
                       explicit: Collection[str]) -> dict[str, Any]:
    """The source's model config, with the explicit run-chosen fields, and the file's
    supervised exits that the source has."""
    model = source.to_dict()
    for name in sorted(f.split(".", 1)[1] for f in explicit if f.startswith("model.")):
        value, theirs = _get(file_model, name), _get(model, name)
        if name in RUN_CHOSEN:
            model[name] = _plain(value)
        elif _plain(value) != _plain(theirs):
            raise ValueError(f"--config.model.{name}={value!r} contradicts init.source, whose "
                             f"model has {name}={theirs!r}; the source fixes the model (a run "
                             f"may set only {', '.join(RUN_CHOSEN)})")
    if "model.exit_layers" not in explicit and file_model.get("exit_layers") is not None:
        last = source.num_layers
        model["exit_layers"] = sorted({e for e in file_model["exit_layers"] if e < last} | {last})
    return model


def _get(tree: Mapping[str, Any] | None, dotted: str) -> Any:
    for key in dotted.split("."):
        tree = dict(tree).get(key) if isinstance(tree, Mapping) else None
    return tree


def _plain(value: Any) -> Any:
    """A config value comparable with its JSON form (tuples as lists, mappings as dicts)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
