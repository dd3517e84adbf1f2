"""Hugging Face `config.json` <-> ModelConfig: the attention decoders of `FAMILIES` (Llama,
Mistral, Qwen2, Qwen3, ...), Mamba2ForCausalLM (Mamba-2 layers only) and BambaForCausalLM
(Mamba-2 and attention layers, each followed by an MLP).

Reads both the transformers 4 keys (`rope_theta`, `rope_scaling`) and the transformers 5 key
(`rope_parameters`); writes the former, which both versions load. A feature specjax's layers do
not have (biased Mamba-2 projections, a clamped time step, ...) is refused by name.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from specjax.config import DTYPES, ROPE_TYPES, ModelConfig, RopeScaling, SsmConfig
from specjax.errors import SpecjaxError
from specjax.outputs import read_json_object


@dataclasses.dataclass(frozen=True)
class Family:
    """An all-attention decoder architecture, as a Llama config.json plus its differences:
    `sets`, the ModelConfig `FEATURES` it always has (the others are off); `reads`, the fields
    it takes from its config.json beyond Llama's (`free` names the `FEATURES` among them) and
    `writes`, their config.json keys; `accepts`, which values of those it can write (Mistral
    and Phi-3: a window on every layer or none); `tied`, whether its embeddings are tied when
    config.json does not say."""

    model_type: str
    sets: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    free: tuple[str, ...] = ()
    reads: Callable[[dict[str, Any]], dict[str, Any]] = lambda hf: {}
    writes: Callable[[ModelConfig], dict[str, Any]] = lambda cfg: {}
    accepts: Callable[[ModelConfig], bool] = lambda cfg: True
    tied: bool = True

    def computes(self, cfg: ModelConfig) -> bool:
        """Whether this architecture computes exactly the attention model `cfg`."""
        return self.accepts(cfg) and all(getattr(cfg, name) == self.sets.get(name, off)
                                         for name, off in FEATURES.items()
                                         if name not in self.free)


# The ModelConfig fields by which attention decoders differ from Llama's, with their Llama value.
FEATURES = {"attention_bias": False, "qk_norm": False, "nope_layers": (),
            "partial_rotary_factor": 1.0, "scale_embeddings": False, "norm_offset": 0.0,
            "post_norms": False, "mlp_activation": "silu", "query_pre_attn_scalar": None,
            "attn_softcap": None, "logit_softcap": None, "sliding_window": None,
            "sliding_layers": (), "local_rope_theta": None}
# The MLP activations by their config.json names (`hidden_act`, Gemma's `hidden_activation`).
HF_ACTIVATIONS = {"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh"}
# Gemma-2 and -3: scaled embeddings, (1 + w) norms, post-norms, GeGLU; their attention options.
_GEMMA = {"scale_embeddings": True, "norm_offset": 1.0, "post_norms": True,
          "mlp_activation": "gelu_tanh"}
_WINDOWS = ("sliding_window", "sliding_layers")
_GEMMA_FREE = ("query_pre_attn_scalar", "attn_softcap", "logit_softcap", *_WINDOWS)
# Export picks the first family that computes a model (the imported one's first).
FAMILIES = {
    "LlamaForCausalLM": Family("llama", tied=False),
    "MistralForCausalLM": Family(
        "mistral", free=_WINDOWS, reads=lambda hf: _every_layer_window(hf),
        writes=lambda cfg: _every_layer_window_keys(cfg), accepts=lambda cfg: _every_or_none(cfg)),
    "Qwen2ForCausalLM": Family(
        "qwen2", sets={"attention_bias": True}, free=_WINDOWS,
        reads=lambda hf: _listed_windows(hf), writes=lambda cfg: _listed_window_keys(cfg)),
    "Qwen3ForCausalLM": Family(
        "qwen3", sets={"qk_norm": True}, free=_WINDOWS, tied=False,
        reads=lambda hf: _listed_windows(hf), writes=lambda cfg: _listed_window_keys(cfg)),
    "SmolLM3ForCausalLM": Family(
        "smollm3", free=("nope_layers",), reads=lambda hf: {"nope_layers": _nope_layers(hf)},
        writes=lambda cfg: {"no_rope_layers": [int(i not in cfg.nope_layers)
                                               for i in range(cfg.num_layers)],
                            "use_sliding_window": False}),
    "Phi3ForCausalLM": Family(  # fused qkv_proj and gate_up_proj: convert.hf_weights._FUSIONS
        "phi3", free=("partial_rotary_factor", *_WINDOWS), tied=False,
        reads=lambda hf: {**_every_layer_window(hf), "partial_rotary_factor": float(
            (hf.get("rope_parameters") or {}).get("partial_rotary_factor")
            or hf.get("partial_rotary_factor", 1.0))},
        writes=lambda cfg: {**_every_layer_window_keys(cfg),
                            "partial_rotary_factor": cfg.partial_rotary_factor},
        accepts=lambda cfg: _every_or_none(cfg)),
    "Gemma2ForCausalLM": Family(
        "gemma2", sets=_GEMMA, free=_GEMMA_FREE,
        reads=lambda hf: _gemma_options(hf, attn_softcap=50.0, logit_softcap=30.0, every=2),
        writes=lambda cfg: _gemma_keys(cfg)),
    "Gemma3ForCausalLM": Family(
        "gemma3_text", sets={**_GEMMA, "qk_norm": True},
        free=(*_GEMMA_FREE, "local_rope_theta"),
        reads=lambda hf: {**_gemma_options(hf, attn_softcap=None, logit_softcap=None, every=6),
                          **_gemma3_rope(hf)},
        writes=lambda cfg: {**_gemma_keys(cfg), "rope_parameters": {
            "full_attention": {**_scaling_keys(cfg.rope_scaling), "rope_theta": cfg.rope_theta},
            "sliding_attention": {"rope_type": "default",
                                  "rope_theta": cfg.local_rope_theta or cfg.rope_theta}}}),
}
ARCHITECTURES = (*FAMILIES, "Mamba2ForCausalLM", "BambaForCausalLM")
BAMBA_ROTARY_FACTOR = 0.5  # transformers' Bamba rotates the first half of each head, always
MAX_POSITIONS = 8192  # written to exported configs; RoPE itself has no length limit


class ConversionError(SpecjaxError):
    """A checkpoint that cannot be converted: unknown architecture, feature or missing tensor."""


def read_hf_config(hf_dir: str) -> dict[str, Any]:
    """A checkpoint's config.json, checked to be readable and to hold the sizes every
    architecture needs (one-line errors naming the directory or the file)."""
    path = os.path.join(hf_dir, "config.json")
    config = read_config_json(hf_dir, "a Hugging Face checkpoint")
    missing = [key for key in ("vocab_size", "hidden_size", "num_hidden_layers")
               if key not in config]
    if missing:
        raise ConversionError(f"{path} lacks {missing}, which every {architecture(config)} "
                              "checkpoint has")
    return config


def read_config_json(directory: str, what: str) -> dict[str, Any]:
    """The JSON object in `directory`'s config.json, `what` (e.g. "a Hugging Face checkpoint")
    naming the directory expected in the one-line errors."""
    path = os.path.join(directory, "config.json")
    if not os.path.isdir(directory):
        problem = "is not a directory" if os.path.exists(directory) else "does not exist"
        raise ConversionError(f"{directory!r} {problem}: {what} directory is expected")
    if not os.path.isfile(path):
        raise ConversionError(f"{directory!r} has no config.json: not {what}")
    try:
        return read_json_object(path)
    except ValueError as error:
        raise ConversionError(str(error)) from None


def architecture(hf: dict[str, Any]) -> str:
    names = hf.get("architectures") or []
    supported = [n for n in names if n in ARCHITECTURES]
    if not supported:
        raise ConversionError(f"unsupported architecture {names or hf.get('model_type')!r}; "
                              f"supported: {list(ARCHITECTURES)}")
    return supported[0]


def model_config_from_hf(hf: dict[str, Any], *, dtype: str | None = None) -> ModelConfig:
    """The ModelConfig of a checkpoint's config.json (as `read_hf_config` checked it); `dtype`
    overrides the stored weight dtype (it becomes both the parameter and the compute dtype).
    A size ModelConfig refuses is named by its config.json field (num_key_value_heads, not
    num_kv_heads)."""
    try:
        return _model_config(hf, dtype)
    except ValueError as error:
        text = re.sub(r"\bModelConfig\.", "", str(error))
        text = re.sub(r"\b(" + "|".join(HF_NAMES) + r")=",
                      lambda match: f"{HF_NAMES[match.group(1)]}=", text)
        raise ConversionError(f"config.json's {text}") from None


# ModelConfig's fields by their names in a Llama-style config.json.
HF_NAMES = {"vocab_size": "vocab_size", "d_model": "hidden_size", "num_layers":
            "num_hidden_layers", "mlp_dim": "intermediate_size", "num_heads":
            "num_attention_heads", "num_kv_heads": "num_key_value_heads", "head_dim": "head_dim",
            "norm_eps": "rms_norm_eps", "rope_theta": "rope_theta"}


def _model_config(hf: dict[str, Any], dtype: str | None) -> ModelConfig:
    arch = architecture(hf)
    weights = dtype or _stored_dtype(hf)
    if weights not in DTYPES:
        raise ConversionError(f"dtype {weights!r} is not one of {sorted(DTYPES)}")
    common = dict(vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
                  num_layers=hf["num_hidden_layers"], dtype=weights, param_dtype=weights)
    if arch in ("Mamba2ForCausalLM", "BambaForCausalLM"):
        _require_equal(hf, "hidden_act", "silu", arch)
        return (_mamba2_config if arch == "Mamba2ForCausalLM" else _bamba_config)(hf, common)
    family = FAMILIES[arch]
    _require_equal(hf, "mlp_bias", False, arch)
    _require_equal(hf, "attention_bias", False, arch)  # it would bias o_proj too
    if ("sliding_layers" not in family.free and hf.get("sliding_window") is not None
            and hf.get("use_sliding_window", True)):
        raise ConversionError(f"{arch} with sliding_window={hf['sliding_window']} is not supported "
                              "(full attention only)")
    heads = hf["num_attention_heads"]
    theta, scaling = _rope(hf)
    fields = {**FEATURES, **family.sets, "rope_theta": theta, "rope_scaling": scaling}
    fields.update(family.reads(hf))
    for key in ("hidden_act", "hidden_activation"):
        _require_equal(hf, key, HF_ACTIVATIONS[fields["mlp_activation"]], arch)
    return ModelConfig(
        **common, num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
        mlp_dim=hf["intermediate_size"], head_dim=hf.get("head_dim") or None,
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        tie_embeddings=bool(hf.get("tie_word_embeddings", family.tied)), **fields)


def _mamba2_config(hf: dict[str, Any], common: dict[str, Any]) -> ModelConfig:
    """Mamba-2 layers without MLPs. The attention and MLP sizes ModelConfig requires are unused
    (no layer has attention or an MLP) and set to the smallest valid values."""
    arch = "Mamba2ForCausalLM"
    _require_equal(hf, "use_bias", False, arch)
    _require_equal(hf, "use_conv_bias", True, arch)
    _require_unclamped_time_step(hf, arch)
    ssm = SsmConfig(num_heads=hf["num_heads"], head_dim=hf["head_dim"],
                    state_size=hf["state_size"], groups=hf.get("n_groups", 8),
                    conv_width=hf.get("conv_kernel", 4), chunk_size=hf.get("chunk_size", 256),
                    mlp=False, dt_min=hf.get("time_step_min", 0.001),
                    dt_max=hf.get("time_step_max", 0.1))
    return ModelConfig(**common, num_heads=1, num_kv_heads=1, head_dim=2, mlp_dim=1,
                       norm_eps=hf.get("layer_norm_epsilon", 1e-5),
                       tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
                       layer_pattern=("mamba2",) * common["num_layers"], ssm=ssm)


def _bamba_config(hf: dict[str, Any], common: dict[str, Any]) -> ModelConfig:
    arch = "BambaForCausalLM"
    for key, expected in (("mamba_proj_bias", False), ("mamba_conv_bias", True),
                          ("attention_bias", False), ("mlp_bias", False)):
        _require_equal(hf, key, expected, arch)
    _require_unclamped_time_step(hf, arch)
    attention = set(hf.get("attn_layer_indices") or ())
    heads, inner = hf["num_attention_heads"], hf.get("mamba_expand", 2) * hf["hidden_size"]
    ssm_heads = hf.get("mamba_n_heads", 128)
    head_dim = hf.get("mamba_d_head", "auto")
    ssm = SsmConfig(num_heads=ssm_heads,
                    head_dim=inner // ssm_heads if head_dim == "auto" else head_dim,
                    state_size=hf.get("mamba_d_state", 256), groups=hf.get("mamba_n_groups", 1),
                    conv_width=hf.get("mamba_d_conv", 4),
                    chunk_size=hf.get("mamba_chunk_size", 256), mlp=True)
    theta, scaling = _rope(hf)
    return ModelConfig(
        **common, num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
        mlp_dim=hf["intermediate_size"], rope_theta=theta, rope_scaling=scaling,
        partial_rotary_factor=BAMBA_ROTARY_FACTOR, norm_eps=hf.get("rms_norm_eps", 1e-5),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        layer_pattern=tuple("attention" if i in attention else "mamba2"
                            for i in range(common["num_layers"])), ssm=ssm)


def export_architecture(cfg: ModelConfig, imported: str | None = None) -> str:
    """The HF architecture that computes exactly this model (`imported`, the architecture it
    was imported from, where that one does); a clear error if none does."""
    if cfg.layer_pattern is None:
        order = [imported] if imported in FAMILIES else []
        found = [arch for arch in [*order, *FAMILIES] if FAMILIES[arch].computes(cfg)]
        if not found:
            features = {name: getattr(cfg, name) for name in FEATURES
                        if getattr(cfg, name) != FEATURES[name]}
            raise ConversionError(f"no Hugging Face architecture computes an attention model "
                                  f"with {features}; supported: {list(FAMILIES)}")
        return found[0]
    if cfg.ssm.inner_dim % cfg.d_model:
        raise ConversionError(f"Mamba2Config and BambaConfig need the Mamba-2 inner width "
                              f"(ssm.num_heads * ssm.head_dim = {cfg.ssm.inner_dim}) to be a "
                              f"multiple of d_model={cfg.d_model}")
    if "attention" not in cfg.layer_kinds and not cfg.ssm.mlp:
        return "Mamba2ForCausalLM"
    refusals = [(not cfg.ssm.mlp, "an MLP after every Mamba-2 layer (ssm.mlp=True)"),
                (cfg.partial_rotary_factor != BAMBA_ROTARY_FACTOR,
                 f"rotates half of each head (partial_rotary_factor={BAMBA_ROTARY_FACTOR})"),
                (cfg.attention_bias, "no attention biases"), (cfg.qk_norm, "no Q/K norms"),
                (cfg.rope_scaling is not None, "unscaled RoPE"),
                (cfg.head_dim * cfg.num_heads != cfg.d_model, "head_dim = d_model / num_heads")]
    unmet = [need for refused, need in refusals if refused]
    if unmet:
        raise ConversionError("this hybrid has no Hugging Face architecture: BambaForCausalLM "
                              f"needs {'; '.join(unmet)}")
    return "BambaForCausalLM"


def hf_config_from_model(cfg: ModelConfig, imported: str | None = None) -> dict[str, Any]:
    """A config.json for the architecture `export_architecture` names."""
    arch = export_architecture(cfg, imported)
    out = {"architectures": [arch], "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
           "num_hidden_layers": cfg.num_layers, "hidden_act": "silu",
           "tie_word_embeddings": cfg.tie_embeddings, "torch_dtype": cfg.param_dtype}
    if arch == "Mamba2ForCausalLM":
        return {**out, **_ssm_keys(cfg, "mamba2"), "model_type": "mamba2",
                "layer_norm_epsilon": cfg.norm_eps, "use_bias": False, "use_conv_bias": True,
                "time_step_min": cfg.ssm.dt_min, "time_step_max": cfg.ssm.dt_max}
    out.update({
        "intermediate_size": cfg.mlp_dim, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta, "max_position_embeddings": MAX_POSITIONS,
        "mlp_bias": False})
    if arch == "BambaForCausalLM":
        return {**out, **_ssm_keys(cfg, "bamba"), "model_type": "bamba", "attention_bias": False,
                "attn_layer_indices": [i for i, kind in enumerate(cfg.layer_kinds)
                                       if kind == "attention"],
                "mamba_conv_bias": True, "mamba_proj_bias": False}
    family = FAMILIES[arch]
    # pad_token_id: the tokenizer's to give (`convert.hf`); a family's default may lie past
    # the vocabulary (SmolLM3's 128004), which transformers refuses
    out.update({"model_type": family.model_type, "head_dim": cfg.head_dim,
                "rope_scaling": None, "pad_token_id": None, **family.writes(cfg)})
    if not cfg.attention_bias:
        out["attention_bias"] = False
    if cfg.rope_scaling is not None and "rope_parameters" not in out:
        out["rope_scaling"] = _scaling_keys(cfg.rope_scaling)
    return out


def _scaling_keys(s: RopeScaling | None) -> dict[str, Any]:
    """A RoPE scaling as HF's rope_scaling / rope_parameters write it."""
    if s is None:
        return {"rope_type": "default"}
    if s.rope_type == "linear":
        return {"rope_type": "linear", "factor": s.factor}
    return {"rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position}


def _ssm_keys(cfg: ModelConfig, family: str) -> dict[str, Any]:
    """The Mamba-2 sizes under Mamba2Config's or BambaConfig's names."""
    ssm = cfg.ssm
    names = {"mamba2": ("num_heads", "head_dim", "state_size", "n_groups", "conv_kernel",
                        "chunk_size", "expand"),
             "bamba": ("mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups",
                       "mamba_d_conv", "mamba_chunk_size", "mamba_expand")}[family]
    values = (ssm.num_heads, ssm.head_dim, ssm.state_size, ssm.groups, ssm.conv_width,
              ssm.chunk_size, ssm.inner_dim // cfg.d_model)
    return dict(zip(names, values, strict=True))


def _rope(hf: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    params = dict(hf.get("rope_parameters") or {})
    legacy = dict(hf.get("rope_scaling") or {})
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    scaling = params if params.get("rope_type", "default") != "default" else legacy
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return float(theta), None
    if kind not in ROPE_TYPES:
        raise ConversionError(f"rope type {kind!r} is not supported (default, "
                              f"{', '.join(ROPE_TYPES)} are)")
    return float(theta), RopeScaling(
        rope_type=kind, factor=float(scaling["factor"]),
        low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
        high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
        original_max_position=int(scaling.get("original_max_position_embeddings", 8192)))


def _gemma_options(hf: dict[str, Any], *, attn_softcap: float | None,
                   logit_softcap: float | None, every: int) -> dict[str, Any]:
    """Gemma-2/3's attention options from config.json (the defaults: the family's, where the
    file lacks a key); sliding layers from `layer_types`, else all but every `every`-th
    (`sliding_window_pattern`), as transformers derives them."""
    if hf.get("use_bidirectional_attention"):
        raise ConversionError("Gemma with use_bidirectional_attention=true is not supported "
                              "(a causal decoder only)")
    every = hf.get("sliding_window_pattern", every)
    return {"query_pre_attn_scalar": hf.get("query_pre_attn_scalar", 256),
            "attn_softcap": hf.get("attn_logit_softcapping", attn_softcap),
            "logit_softcap": hf.get("final_logit_softcapping", logit_softcap),
            **_windows(hf, hf.get("sliding_window"), lambda i: (i + 1) % every != 0)}


def _windows(hf: dict[str, Any], window: int | None,
             slides: Callable[[int], bool]) -> dict[str, Any]:
    """`sliding_window` and `sliding_layers` of a config.json whose window is `window` (None:
    none): the layers its `layer_types` marks "sliding_attention", else those `slides`
    (transformers' default for the family)."""
    types = hf.get("layer_types") or ["sliding_attention" if slides(i) else "full_attention"
                                      for i in range(hf["num_hidden_layers"])]
    sliding = tuple(i for i, kind in enumerate(types) if kind == "sliding_attention")
    return {"sliding_window": window if window and sliding else None,
            "sliding_layers": sliding if window else ()}


def _layer_types(cfg: ModelConfig) -> list[str]:
    return ["sliding_attention" if i in cfg.sliding_layers else "full_attention"
            for i in range(cfg.num_layers)]


def _every_layer_window(hf: dict[str, Any]) -> dict[str, Any]:
    """Mistral's and Phi-3's window: on every layer, where `sliding_window` is set."""
    return _windows({**hf, "layer_types": None}, hf.get("sliding_window"), lambda i: True)


def _every_layer_window_keys(cfg: ModelConfig) -> dict[str, Any]:
    return {"sliding_window": cfg.sliding_window if cfg.sliding_layers else None}


def _every_or_none(cfg: ModelConfig) -> bool:
    return cfg.sliding_layers in ((), tuple(range(cfg.num_layers)))


def _listed_windows(hf: dict[str, Any]) -> dict[str, Any]:
    """Qwen2's and Qwen3's: where `use_sliding_window`, the layers `layer_types` lists, else
    those from `max_window_layers` on."""
    window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
    return _windows(hf, window, lambda i: i >= hf.get("max_window_layers", 28))


def _listed_window_keys(cfg: ModelConfig) -> dict[str, Any]:
    return {"use_sliding_window": bool(cfg.sliding_layers),
            "sliding_window": cfg.sliding_window, "layer_types": _layer_types(cfg)}


def _gemma3_rope(hf: dict[str, Any]) -> dict[str, Any]:
    """Gemma-3's RoPE: `rope_parameters` per layer type in transformers 5 (global and local
    theta; the global may be scaled as `_rope` reads it), else `rope_theta` and
    `rope_local_base_freq`."""
    params = hf.get("rope_parameters") or {}
    if "full_attention" not in params:
        _, scaling = _rope(hf)
        return {"rope_theta": float(hf.get("rope_theta", 1e6)), "rope_scaling": scaling,
                "local_rope_theta": float(hf.get("rope_local_base_freq", 1e4))}
    local = params.get("sliding_attention") or {}
    if local.get("rope_type", "default") != "default":
        raise ConversionError(f"rope type {local['rope_type']!r} on Gemma-3's sliding layers "
                              "is not supported (default only)")
    theta, scaling = _rope({"rope_parameters": params["full_attention"]})
    return {"rope_theta": theta, "rope_scaling": scaling,
            "local_rope_theta": float(local.get("rope_theta", 1e4))}


def _gemma_keys(cfg: ModelConfig) -> dict[str, Any]:
    """Gemma-2/3's config.json keys of what `_gemma_options` reads."""
    activation = HF_ACTIVATIONS[cfg.mlp_activation]
    return {"hidden_act": activation, "hidden_activation": activation,
            "query_pre_attn_scalar": cfg.query_pre_attn_scalar,
            "attn_logit_softcapping": cfg.attn_softcap,
            "final_logit_softcapping": cfg.logit_softcap,
            "sliding_window": cfg.sliding_window, "layer_types": _layer_types(cfg)}


def _nope_layers(hf: dict[str, Any]) -> tuple[int, ...]:
    """SmolLM3's layers without RoPE: `no_rope_layers` (1: rotates, 0: NoPE), else every
    `no_rope_layer_interval`-th layer, as transformers' SmolLM3Config derives them."""
    rotates = hf.get("no_rope_layers")
    if rotates is None:
        interval = hf.get("no_rope_layer_interval", 4)
        rotates = [(i + 1) % interval != 0 for i in range(hf["num_hidden_layers"])]
    return tuple(i for i, rotate in enumerate(rotates) if not rotate)


def _stored_dtype(hf: dict[str, Any]) -> str:
    return str(hf.get("dtype") or hf.get("torch_dtype") or "float32").replace("torch.", "")


def _require_equal(hf: dict[str, Any], key: str, expected: Any, arch: str) -> None:
    if key in hf and hf[key] != expected:
        raise ConversionError(f"{arch} with {key}={hf[key]!r} is not supported "
                              f"(expected {expected!r})")


def _require_unclamped_time_step(hf: dict[str, Any], arch: str) -> None:
    """specjax's Mamba-2 layer does not clamp dt after the softplus."""
    low, high = (_json_float(v) for v in hf.get("time_step_limit") or (0.0, float("inf")))
    if low > 0 or high != float("inf"):
        raise ConversionError(f"{arch} with time_step_limit={[low, high]} is not supported "
                              "(an unclamped time step only)")


def _json_float(value: Any) -> float:
    """A float from config.json; transformers 5 writes infinities as {"__float__": "Infinity"}."""
    return float(value["__float__"] if isinstance(value, dict) else value)
