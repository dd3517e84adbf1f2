"""Whole-checkpoint conversion between a Hugging Face directory and a specjax workdir."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any

from specjax.checkpoint import Checkpointer, load_params
from specjax.config import DecodingConfig, ModelConfig
from specjax.convert.hf_config import (
    ConversionError,
    architecture,
    hf_config_from_model,
    model_config_from_hf,
    read_hf_config,
)
from specjax.convert.hf_weights import load_hf_params, save_hf_params
from specjax.tokenizer import get_tokenizer

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_KEY = "specjax_tokenizer"  # extra config.json key naming a non-HF tokenizer


def import_checkpoint(hf_dir: str, workdir: str, *, dtype: str | None = None) -> ModelConfig:
    """Writes a specjax checkpoint (weights only, step 0) of an HF checkpoint into `workdir`,
    with its tokenizer.json copied beside it."""
    hf = read_hf_config(hf_dir)
    cfg = model_config_from_hf(hf, dtype=dtype)
    checkpoints = Checkpointer(workdir)
    if checkpoints.latest_step() is not None:
        raise ConversionError(f"{workdir!r} already holds checkpoints; import into a new workdir")
    params = load_hf_params(hf_dir, cfg)
    decoding = DecodingConfig(exit_layer=max(1, cfg.num_layers // 4))
    decoding.check(cfg)
    checkpoints.save(0, params, None, {
        "step": 0, "data_position": 0, "model": cfg.to_dict(),
        "tokenizer": _import_tokenizer(hf_dir, workdir, hf),
        "config": {"decoding": dataclasses.asdict(decoding)},
        "source": {"hf_dir": os.path.abspath(hf_dir), "architecture": architecture(hf)}})
    checkpoints.close()
    return cfg


def export_checkpoint(workdir: str, hf_dir: str, *, max_shard_bytes: int = 4 * 2**30) -> list[str]:
    """Writes the workdir's latest weights as an HF checkpoint (config.json + safetensors, and the
    tokenizer); returns the files written."""
    params, cfg, meta = load_params(workdir)
    files = save_hf_params(params, cfg, hf_dir, max_shard_bytes)
    config = hf_config_from_model(cfg)
    tokenizer = meta.get("tokenizer")
    if isinstance(tokenizer, dict):
        shutil.copy(os.path.join(workdir, tokenizer["file"]), os.path.join(hf_dir, TOKENIZER_FILE))
        files.append(TOKENIZER_FILE)
        config.update(bos_token_id=tokenizer.get("bos_id"), eos_token_id=tokenizer.get("eos_id"))
    elif tokenizer is not None:
        byte = get_tokenizer(tokenizer)
        config.update({TOKENIZER_KEY: tokenizer, "bos_token_id": byte.bos_id,
                       "eos_token_id": byte.eos_id, "pad_token_id": byte.pad_id})
    with open(os.path.join(hf_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    return files + ["config.json"]


def _import_tokenizer(hf_dir: str, workdir: str, hf: dict[str, Any]) -> str | dict | None:
    """The tokenizer spec for the checkpoint metadata (copying tokenizer.json if any)."""
    source = os.path.join(hf_dir, TOKENIZER_FILE)
    if os.path.isfile(source):
        shutil.copy(source, os.path.join(workdir, TOKENIZER_FILE))
        eos = hf.get("eos_token_id")
        return {"kind": "hf", "file": TOKENIZER_FILE, "bos_id": hf.get("bos_token_id"),
                "eos_id": eos[0] if isinstance(eos, list) else eos}
    return hf.get(TOKENIZER_KEY)
