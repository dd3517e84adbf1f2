"""Whole-checkpoint conversion between a Hugging Face directory and a specjax workdir."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any

import jax

from specjax.config import ModelConfig
from specjax.convert.gguf import GgufCheckpoint, is_gguf
from specjax.convert.hf_config import (
    ConversionError,
    architecture,
    export_architecture,
    hf_config_from_model,
    model_config_from_hf,
    read_hf_config,
)
from specjax.convert.hf_weights import SafetensorsReader, load_hf_params, save_hf_params
from specjax.decoding.registry import DecodingConfig
from specjax.io.checkpoint import Checkpointer, load_params
from specjax.outputs import staged_dir
from specjax.tokenizer import (
    TOKENIZER_FILE,
    TokenizerSource,
    get_tokenizer,
    read_tokenizer_folder,
)

TOKENIZER_KEY = "specjax_tokenizer"  # extra config.json key naming a non-HF tokenizer


class HfFolder:
    """A Hugging Face checkpoint folder: config.json, safetensors, tokenizer files."""

    def __init__(self, hf_dir: str):
        self.path = hf_dir
        self.config = read_hf_config(hf_dir)

    def hf_config(self) -> dict[str, Any]:
        return self.config

    def tensors(self) -> SafetensorsReader:
        return SafetensorsReader(self.path)

    def tokenizer(self) -> TokenizerSource | None:
        return read_tokenizer_folder(self.path)

    def tokenizer_problem(self) -> str:
        return f"it has no {TOKENIZER_FILE}"

    def summary(self) -> dict[str, Any]:
        return {"hf_dir": os.path.abspath(self.path), "architecture": architecture(self.config)}


def open_checkpoint(path: str) -> HfFolder | GgufCheckpoint:
    """A checkpoint to import: a GGUF file, else a Hugging Face folder."""
    return GgufCheckpoint(path) if is_gguf(path) else HfFolder(path)


def import_checkpoint(source: str, workdir: str, *, dtype: str | None = None,
                      tokenizer: str | None = None) -> ModelConfig:
    """Writes a specjax checkpoint (weights only, step 0) of a Hugging Face folder or a GGUF
    file into `workdir`, with the checkpoint's tokenizer files beside it (`HFTokenizer.
    save_files`); `tokenizer="bytes"` records specjax's byte tokenizer instead (a checkpoint
    without a tokenizer needs one to decode text)."""
    checkpoint = open_checkpoint(source)
    hf = checkpoint.hf_config()
    cfg = model_config_from_hf(hf, dtype=dtype)
    ids = get_tokenizer(tokenizer).vocab_size if tokenizer is not None else 0
    if ids > cfg.vocab_size:
        raise ConversionError(f"the {tokenizer!r} tokenizer has {ids} ids, more than the "
                              f"model's vocabulary of {cfg.vocab_size}")
    if (os.path.isdir(os.path.join(workdir, "checkpoints"))
            and Checkpointer(workdir, create=False).latest_step() is not None):
        raise ConversionError(f"{workdir!r} already holds checkpoints; import into a new workdir")
    params = load_hf_params(checkpoint.tensors(), cfg, architecture(hf), hf=hf)  # read first
    found = None if tokenizer is not None else checkpoint.tokenizer()
    if found is not None:
        found.check(cfg.vocab_size, checkpoint.path)
    checkpoints = Checkpointer(workdir)
    decoding = DecodingConfig(exit_layer=max(1, cfg.num_layers // 4))
    decoding.check(cfg)
    checkpoints.save(0, params, None, {
        "step": 0, "data_position": 0, "model": cfg.to_dict(),
        "tokenizer": tokenizer or (found.save(workdir).spec() if found is not None
                                   else _no_tokenizer(checkpoint, hf)),
        "config": {"decoding": dataclasses.asdict(decoding)},
        "source": checkpoint.summary()})
    checkpoints.close()
    return cfg


def _no_tokenizer(checkpoint: HfFolder | GgufCheckpoint, hf: dict[str, Any]) -> str | None:
    """The tokenizer a checkpoint without tokenizer files names (an export of a byte-level
    model's), else None, with a warning that the model cannot decode text yet."""
    if hf.get(TOKENIZER_KEY) is None:
        print(f"warning: {checkpoint.path}: {checkpoint.tokenizer_problem()}: the imported model "
              "cannot decode text until it has a tokenizer (import again with --tokenizer bytes "
              f"for specjax's byte tokenizer, or copy a {TOKENIZER_FILE} into a Hugging Face "
              "folder of it first)", file=sys.stderr)
    return hf.get(TOKENIZER_KEY)


def export_checkpoint(workdir: str, hf_dir: str, *, max_shard_bytes: int = 4 * 2**30,
                      overwrite: bool = False, dtype: str | None = None) -> list[str]:
    """Writes the workdir's latest weights as an HF checkpoint (config.json + safetensors, and the
    tokenizer), in `dtype` if given (e.g. the bfloat16 of a run with a float32 master copy);
    returns the files written. A non-empty `hf_dir` is refused unless `overwrite` and it is a
    Hugging Face checkpoint (a config.json: another folder's files are not ours to delete),
    and then replaced whole: the new checkpoint is written beside it and swapped in, so the
    directory never holds a mix of old and new files."""
    if os.path.isdir(hf_dir) and os.listdir(hf_dir):
        if not overwrite:
            raise ConversionError(f"{hf_dir!r} exists and is not empty; pass --overwrite to "
                                  "replace it (its files are removed)")
        if not os.path.isfile(os.path.join(hf_dir, "config.json")):
            raise ConversionError(f"{hf_dir!r} holds no config.json, so it is no Hugging Face "
                                  "checkpoint: --overwrite would delete files of another kind; "
                                  "export into a new or empty folder")
    if os.path.exists(hf_dir) and not os.path.isdir(hf_dir):
        raise ConversionError(f"{hf_dir!r} exists and is not a directory")
    params, cfg, meta = load_params(workdir)
    if dtype is not None:
        cfg = dataclasses.replace(cfg, dtype=dtype, param_dtype=dtype)
        params = jax.tree.map(lambda w: w.astype(cfg.weight_dtype), params)
    export_architecture(cfg, _imported(meta))  # no HF architecture computes it: before any file
    if cfg.mtp_depth:
        print(f"note: the model's {cfg.mtp_depth} MTP module(s) are not exported: the Hugging "
              "Face architecture has no place for them", file=sys.stderr)
    with staged_dir(hf_dir) as staging:
        files = _write_hf(params, cfg, meta, workdir, staging, max_shard_bytes)
    return files


def _write_hf(params: Any, cfg: ModelConfig, meta: dict[str, Any], workdir: str, out_dir: str,
              max_shard_bytes: int) -> list[str]:
    arch = export_architecture(cfg, _imported(meta))
    files = save_hf_params(params, cfg, out_dir, arch, max_shard_bytes)
    config = hf_config_from_model(cfg, arch)
    tokenizer = meta.get("tokenizer")
    if isinstance(tokenizer, dict):
        files += get_tokenizer(tokenizer, workdir).save_files(out_dir)
        config.update(bos_token_id=tokenizer.get("bos_id"), eos_token_id=tokenizer.get("eos_id"))
    elif tokenizer is not None:
        byte = get_tokenizer(tokenizer)
        config.update({TOKENIZER_KEY: tokenizer, "bos_token_id": byte.bos_id,
                       "eos_token_id": byte.eos_id, "pad_token_id": byte.pad_id})
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    return files + ["config.json"]


def _imported(meta: dict[str, Any]) -> str | None:
    """The architecture a workdir was imported from (`HfFolder.summary`), if any."""
    source = meta.get("source")
    return source.get("architecture") if isinstance(source, dict) else None
