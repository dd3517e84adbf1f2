"""Hugging Face `config.json` <-> ModelConfig for Llama-family decoders.

Reads both the transformers 4 keys (`rope_theta`, `rope_scaling`) and the transformers 5 key
(`rope_parameters`); writes the former, which both versions load.
"""

from __future__ import annotations

import json
import os
from typing import Any

from specjax.config import DTYPES, ModelConfig, RopeScaling
from specjax.entrypoint import SpecjaxError

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
MAX_POSITIONS = 8192  # written to exported configs; RoPE itself has no length limit


class ConversionError(SpecjaxError):
    """A checkpoint that cannot be converted: unknown architecture, feature or missing tensor."""


def read_hf_config(hf_dir: str) -> dict[str, Any]:
    path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(path):
        raise ConversionError(f"{hf_dir!r} has no config.json: not a Hugging Face checkpoint")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def architecture(hf: dict[str, Any]) -> str:
    names = hf.get("architectures") or []
    supported = [n for n in names if n in ARCHITECTURES]
    if not supported:
        raise ConversionError(f"unsupported architecture {names or hf.get('model_type')!r}; "
                              f"supported: {list(ARCHITECTURES)}")
    return supported[0]


def model_config_from_hf(hf: dict[str, Any], *, dtype: str | None = None) -> ModelConfig:
    """The ModelConfig of a checkpoint's config.json; `dtype` overrides the stored weight dtype
    (it becomes both the parameter and the compute dtype)."""
    arch = architecture(hf)
    _require_equal(hf, "hidden_act", "silu", arch)
    _require_equal(hf, "mlp_bias", False, arch)
    if arch == "LlamaForCausalLM":
        _require_equal(hf, "attention_bias", False, arch)  # Llama would bias o_proj too
    if hf.get("sliding_window") is not None and hf.get("use_sliding_window", True):
        raise ConversionError(f"{arch} with sliding_window={hf['sliding_window']} is not supported "
                              "(full attention only)")
    heads = hf["num_attention_heads"]
    weights = dtype or _stored_dtype(hf)
    if weights not in DTYPES:
        raise ConversionError(f"dtype {weights!r} is not one of {sorted(DTYPES)}")
    theta, scaling = _rope(hf)
    return ModelConfig(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"], num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads, mlp_dim=hf["intermediate_size"],
        head_dim=hf.get("head_dim") or None, rope_theta=theta, rope_scaling=scaling,
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        tie_embeddings=bool(hf.get("tie_word_embeddings", arch != "LlamaForCausalLM")),
        attention_bias=arch == "Qwen2ForCausalLM", dtype=weights, param_dtype=weights)


def hf_config_from_model(cfg: ModelConfig) -> dict[str, Any]:
    """A config.json for transformers' LlamaForCausalLM (Qwen2ForCausalLM with q/k/v biases)."""
    arch, model_type = (("Qwen2ForCausalLM", "qwen2") if cfg.attention_bias
                        else ("LlamaForCausalLM", "llama"))
    out = {
        "architectures": [arch], "model_type": model_type, "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model, "intermediate_size": cfg.mlp_dim,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "hidden_act": "silu", "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
        "rope_scaling": None, "tie_word_embeddings": cfg.tie_embeddings, "mlp_bias": False,
        "max_position_embeddings": MAX_POSITIONS, "torch_dtype": cfg.param_dtype,
    }
    if model_type == "llama":
        out["attention_bias"] = False
    if cfg.rope_scaling is not None:
        s = cfg.rope_scaling
        out["rope_scaling"] = {"rope_type": "llama3", "factor": s.factor,
                               "low_freq_factor": s.low_freq_factor,
                               "high_freq_factor": s.high_freq_factor,
                               "original_max_position_embeddings": s.original_max_position}
    return out


def _rope(hf: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    params = dict(hf.get("rope_parameters") or {})
    legacy = dict(hf.get("rope_scaling") or {})
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    scaling = params if params.get("rope_type", "default") != "default" else legacy
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return float(theta), None
    if kind != "llama3":
        raise ConversionError(f"rope type {kind!r} is not supported (default and llama3 are)")
    return float(theta), RopeScaling(
        factor=float(scaling["factor"]),
        low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
        high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
        original_max_position=int(scaling.get("original_max_position_embeddings", 8192)))


def _stored_dtype(hf: dict[str, Any]) -> str:
    return str(hf.get("dtype") or hf.get("torch_dtype") or "float32").replace("torch.", "")


def _require_equal(hf: dict[str, Any], key: str, expected: Any, arch: str) -> None:
    if key in hf and hf[key] != expected:
        raise ConversionError(f"{arch} with {key}={hf[key]!r} is not supported "
                              f"(expected {expected!r})")
