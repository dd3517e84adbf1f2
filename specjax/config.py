"""ModelConfig: the static description of a specjax model.

Everything here changes the compiled program (shapes, dtypes, layer count), so it is a frozen,
hashable dataclass that can be passed to `jax.jit` as a static argument. It validates itself on
construction and names the offending field in a `ValueError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.machinery
import importlib.util
import numbers
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# The MLP's gate activations (`ModelConfig.mlp_activation`); "gelu_tanh" is transformers'
# gelu_pytorch_tanh (Gemma's GeGLU).
ACTIVATIONS = {"silu": jax.nn.silu, "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True)}


ROPE_TYPES = ("llama3", "linear")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """RoPE scaling as HF configs' `rope_type` names it: "llama3" (Llama-3's frequency-dependent
    scaling: long wavelengths slowed by `factor`, short ones kept, the band between
    interpolated) or "linear" (every frequency divided by `factor`: Gemma-3's global layers)."""

    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    rope_type: str = "llama3"

    def __post_init__(self) -> None:
        check(self.rope_type in ROPE_TYPES, "rope_scaling.rope_type", self.rope_type,
              f"must be one of {ROPE_TYPES}")
        check(self.factor >= 1.0, "rope_scaling.factor", self.factor, "must be >= 1")
        check(self.low_freq_factor > 0, "rope_scaling.low_freq_factor", self.low_freq_factor,
              "must be > 0")
        check(self.high_freq_factor > self.low_freq_factor, "rope_scaling.high_freq_factor",
              self.high_freq_factor, "must be > low_freq_factor")
        check(self.original_max_position > 0, "rope_scaling.original_max_position",
              self.original_max_position, "must be > 0")


@dataclasses.dataclass(frozen=True)
class SsmConfig:
    """The sizes of Mamba-2 layers (HF `Mamba2Config` names in brackets): `num_heads`
    [num_heads] x `head_dim` [head_dim] inner channels, `state_size` [state_size], `groups`
    [n_groups] of heads sharing B and C (and one gated-norm group each), the causal conv's
    `conv_width` [conv_kernel], the scan's `chunk_size` [chunk_size]; `mlp`: a SwiGLU MLP
    after the mixer (Bamba's layers) or none (Mamba2ForCausalLM's); dt_bias initialised for
    steps log-uniform in [`dt_min`, `dt_max`]."""

    num_heads: int
    head_dim: int = 16
    state_size: int = 16
    groups: int = 1
    conv_width: int = 4
    chunk_size: int = 64
    mlp: bool = True
    dt_min: float = 0.001
    dt_max: float = 0.1

    def __post_init__(self) -> None:
        for name in ("num_heads", "head_dim", "state_size", "groups", "conv_width", "chunk_size"):
            value = getattr(self, name)
            check(isinstance(value, int) and value > 0, f"ssm.{name}", value,
                  "must be a positive int")
        check(self.conv_width >= 2, "ssm.conv_width", self.conv_width, "must be >= 2")
        check(self.num_heads % self.groups == 0, "ssm.groups", self.groups,
              f"must divide num_heads={self.num_heads}")
        check(0 < self.dt_min < self.dt_max, "ssm.dt_min", self.dt_min,
              f"must lie in (0, dt_max={self.dt_max})")

    @property
    def inner_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        """x, B and C, the channels the conv mixes."""
        return self.inner_dim + 2 * self.groups * self.state_size


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A Llama-style decoder with a shared multi-exit head.

    Exits are numbered by how many layers ran: exit `e` in [1, num_layers] is the hidden state after
    layer `e` (1-based), so exit `num_layers` is the ordinary final output. `exit_layers` lists the
    exits that training supervises (default: all of them). `attention_bias` adds biases to the
    query/key/value projections (Qwen2-style checkpoints); `partial_rotary_factor` is the share
    of each head's channels RoPE rotates, the first ones (Bamba: half). `qk_norm` normalises
    each query and key head (an RMSNorm over head_dim, before RoPE: Qwen3). `nope_layers`: the
    attention layers (0-based) that apply no RoPE (SmolLM3's NoPE layers). Gemma-2/3's options:
    `scale_embeddings` multiplies embeddings by sqrt(d_model); every RMSNorm scales by
    `norm_offset` + w (Gemma: 1 + w); `post_norms` adds an RMSNorm after attention and after the
    MLP, before each residual add; `mlp_activation` gates the MLP ("silu": SwiGLU, "gelu_tanh":
    GeGLU); attention scores are scaled by `query_pre_attn_scalar`**-0.5 (None: head_dim**-0.5)
    and soft-capped to (-`attn_softcap`, `attn_softcap`) (tanh; None: not capped), logits at
    every exit to `logit_softcap`; the attention layers `sliding_layers` see only the last
    `sliding_window` positions, and rotate with `local_rope_theta` (None: rope_theta).
    `layer_pattern` names each layer's kind (`nn.layer_kinds`: "attention" or "mamba2"; None:
    all attention); Mamba-2 layers take their sizes from `ssm`. `mtp_depth` > 0 gives the model
    DeepSeek-V3's multi-token-prediction modules (`nn.mtp`), trained with it and drafting for
    it.
    """

    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    mlp_dim: int
    head_dim: int | None = None  # None: d_model // num_heads (resolved on construction)
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    partial_rotary_factor: float = 1.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    attention_bias: bool = False
    qk_norm: bool = False
    nope_layers: tuple[int, ...] = ()
    scale_embeddings: bool = False
    norm_offset: float = 0.0
    post_norms: bool = False
    mlp_activation: str = "silu"
    query_pre_attn_scalar: float | None = None
    attn_softcap: float | None = None
    logit_softcap: float | None = None
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] = ()
    local_rope_theta: float | None = None
    dtype: str = "float32"
    param_dtype: str = "float32"
    init_std: float = 0.02
    exit_layers: tuple[int, ...] | None = None
    layer_pattern: tuple[str, ...] | None = None
    ssm: SsmConfig | None = None
    mtp_depth: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "mlp_dim"):
            value = getattr(self, name)
            check(isinstance(value, int) and value > 0, f"ModelConfig.{name}", value,
                  "must be a positive int")
        check(self.num_heads % self.num_kv_heads == 0, "ModelConfig.num_kv_heads",
              self.num_kv_heads, f"must divide num_heads={self.num_heads}")
        if self.head_dim is None:  # canonical form: equal models have equal configs
            check(self.d_model % self.num_heads == 0, "ModelConfig.num_heads", self.num_heads,
                  f"must divide d_model={self.d_model} (or set head_dim)")
            object.__setattr__(self, "head_dim", self.d_model // self.num_heads)
        check(isinstance(self.head_dim, int) and self.head_dim > 0, "ModelConfig.head_dim",
              self.head_dim, "must be a positive int")
        check(self.head_dim % 2 == 0, "ModelConfig.head_dim", self.head_dim,
              "must be even for rotary embeddings")
        check(self.rope_theta > 0, "ModelConfig.rope_theta", self.rope_theta, "must be > 0")
        rotary = int(self.head_dim * self.partial_rotary_factor)
        check(0 < self.partial_rotary_factor <= 1 and rotary > 0 and rotary % 2 == 0,
              "ModelConfig.partial_rotary_factor", self.partial_rotary_factor,
              f"must rotate an even number of channels of head_dim={self.head_dim}, at most all")
        check(self.norm_eps > 0, "ModelConfig.norm_eps", self.norm_eps, "must be > 0")
        check(self.init_std > 0, "ModelConfig.init_std", self.init_std, "must be > 0")
        for name in ("dtype", "param_dtype"):
            check(getattr(self, name) in DTYPES, f"ModelConfig.{name}", getattr(self, name),
                  f"must be one of {sorted(DTYPES)}")
        check(isinstance(self.mtp_depth, int) and self.mtp_depth >= 0, "ModelConfig.mtp_depth",
              self.mtp_depth, "must be an int >= 0")
        if self.exit_layers is not None:
            exits = tuple(self.exit_layers)
            check(len(exits) > 0, "ModelConfig.exit_layers", exits,
                  "must not be empty (use None for all)")
            check(all(isinstance(e, int) and 1 <= e <= self.num_layers for e in exits),
                  "ModelConfig.exit_layers", exits,
                  f"must lie in [1, num_layers={self.num_layers}]")
            check(list(exits) == sorted(set(exits)), "ModelConfig.exit_layers", exits,
                  "must be strictly increasing")
            object.__setattr__(self, "exit_layers", exits)
        self._check_layer_pattern()
        for name in ("nope_layers", "sliding_layers"):
            layers = tuple(getattr(self, name))
            check(all(isinstance(i, int) and 0 <= i < self.num_layers
                      and self.layer_kinds[i] == "attention" for i in layers)
                  and list(layers) == sorted(set(layers)), f"ModelConfig.{name}", layers,
                  f"must be increasing indices of attention layers in [0, num_layers="
                  f"{self.num_layers})")
            object.__setattr__(self, name, layers)
        check(self.mlp_activation in ACTIVATIONS, "ModelConfig.mlp_activation",
              self.mlp_activation, f"must be one of {sorted(ACTIVATIONS)}")
        for name in ("query_pre_attn_scalar", "attn_softcap", "logit_softcap",
                     "local_rope_theta"):
            value = getattr(self, name)
            check(value is None or value > 0, f"ModelConfig.{name}", value,
                  "must be > 0 (or None)")
        check(self.sliding_window is None or (isinstance(self.sliding_window, int)
                                              and self.sliding_window > 0),
              "ModelConfig.sliding_window", self.sliding_window,
              "must be a positive int (or None)")
        check(not self.sliding_layers or self.sliding_window is not None,
              "ModelConfig.sliding_window", self.sliding_window,
              "must be set when sliding_layers are")

    def _check_layer_pattern(self) -> None:
        """Its length; the kinds it names are checked where they are looked up
        (`nn.layer_kinds.check_layer_kinds`: this module imports no layer)."""
        if self.layer_pattern is not None:
            pattern = tuple(self.layer_pattern)
            check(len(pattern) == self.num_layers, "ModelConfig.layer_pattern", pattern,
                  f"must name {self.num_layers} layers (num_layers)")
            # canonical form: an all-attention pattern is the default
            object.__setattr__(self, "layer_pattern",
                               None if set(pattern) == {"attention"} else pattern)

    @property
    def rotary_dim(self) -> int:
        """How many of each head's channels RoPE rotates (the first ones)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """Every layer's kind, in order."""
        return self.layer_pattern or ("attention",) * self.num_layers

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (GQA)."""
        return self.num_heads // self.num_kv_heads

    @property
    def supervised_exits(self) -> tuple[int, ...]:
        return self.exit_layers or tuple(range(1, self.num_layers + 1))

    @property
    def compute_dtype(self) -> jnp.dtype:
        return DTYPES[self.dtype]

    @property
    def weight_dtype(self) -> jnp.dtype:
        return DTYPES[self.param_dtype]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict; `from_dict(to_dict())` round-trips."""
        out = dataclasses.asdict(self)
        for name in ("exit_layers", "layer_pattern", "nope_layers", "sliding_layers"):
            if getattr(self, name) is not None:
                out[name] = list(getattr(self, name))
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ModelConfig:
        """Builds a config from a plain or ml_collections mapping, rejecting unknown keys."""
        values = dict(values)
        scaling = values.get("rope_scaling")
        if scaling is not None and not isinstance(scaling, RopeScaling):
            values["rope_scaling"] = dataclass_from_mapping(RopeScaling, scaling,
                                                            "model.rope_scaling")
        ssm = values.get("ssm")
        if ssm is not None and not isinstance(ssm, SsmConfig):
            values["ssm"] = dataclass_from_mapping(SsmConfig, ssm, "model.ssm")
        for name in ("exit_layers", "layer_pattern", "nope_layers", "sliding_layers"):
            if values.get(name) is not None:
                values[name] = tuple(values[name])
        return dataclass_from_mapping(cls, values, "model")

    def diff(self, other: ModelConfig) -> dict[str, tuple[Any, Any]]:
        """Fields whose values differ, as {field: (self_value, other_value)}."""
        mine, theirs = self.to_dict(), other.to_dict()
        return {k: (mine[k], theirs[k]) for k in mine if mine[k] != theirs[k]}


def dataclass_from_mapping(cls: type, values: Mapping[str, Any], section: str) -> Any:
    """Builds a config dataclass from a mapping, naming the config section for unknown keys."""
    values = dict(values)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        hints = [f"{name!r} -> did you mean {close[0]!r}?" for name in unknown
                 if (close := difflib.get_close_matches(name, known, n=1))]
        raise ValueError(f"{section}: unknown field(s) {unknown}" + (f" ({'; '.join(hints)})"
                                                                     if hints else "")
                         + f"; known fields: {sorted(known)}")
    return cls(**values)


SETTING_KINDS = {int: "an int", float: "a number", str: "a string"}


def kind_phrase(kind: type) -> str:
    """How messages name a setting's type (`SETTING_KINDS`): "an int", "a number"..."""
    return SETTING_KINDS[kind]


def kind_problem(value: Any, kind: type) -> str | None:
    """"must be an int" (or "a number", "a string") when `value` is not of the setting type
    `kind`, else None: an int is a number too, a bool is neither, and 2.7 is no int (truncated,
    it would be another setting than the one asked for)."""
    accepted = {int: numbers.Integral, float: numbers.Real}.get(kind, kind)
    if isinstance(value, bool) or not isinstance(value, accepted):
        return f"must be {kind_phrase(kind)}"
    return None


def check_number_fields(settings: Any, section: str) -> None:
    """A one-line error ("train.total_steps=25.5 must be an int") for the first int or float
    field of the dataclass `settings` holding a value of another type: a dict or an API
    override reaches a config unparsed, where a command-line flag is parsed by its type."""
    for field in dataclasses.fields(settings):
        if type(field.default) in (int, float):
            require_kind(f"{section}.{field.name}", getattr(settings, field.name),
                         type(field.default))


def require_kind(name: str, value: Any, kind: type) -> None:
    """A one-line error ("seed='s' must be an int") when `value` is not of the setting type
    `kind` (`kind_problem`)."""
    problem = kind_problem(value, kind)
    if problem:
        raise ValueError(f"{name}={value!r} {problem}")


def require_count(name: str, value: Any) -> None:
    """A one-line error ("max_new_tokens='8' must be an int", "--steps=0 must be >= 1") when
    `value` is not an int of at least 1: the API's keywords and the command line's counts."""
    require_kind(name, value, int)
    if value < 1:
        raise ValueError(f"{name}={value} must be >= 1")


def layer_numbers(value: str, setting: str) -> tuple[int, ...]:
    """Comma-separated layer numbers ("2,3,5"; empty parts skipped) as a tuple; a one-line
    error naming `setting` when a part is not a number."""
    try:
        return tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"{setting}={value!r}: expected comma-separated layer numbers, e.g. "
                         "2,3,5") from None


SHIPPED_CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


def shipped_configs() -> list[str]:
    """The names of the configs shipped in the package (`specjax/configs/*.py`)."""
    return sorted(name[:-3] for name in os.listdir(SHIPPED_CONFIGS)
                  if name.endswith(".py") and not name.startswith("_"))


def config_file(spec: str) -> str:
    """`spec` ("tiny_code:smoke", "my_config.py:variant") with a shipped config's name replaced
    by its file's path, so that the shipped configs work from any folder; a file that exists
    (or anything else) is left as it is."""
    path, colon, variant = spec.partition(":")
    if os.path.isfile(path) or path not in shipped_configs():
        return spec
    return os.path.join(SHIPPED_CONFIGS, f"{path}.py") + colon + variant


def load_config_file(spec: str, name: str = "config file") -> Any:
    """`get_config(variant)` of the config `spec` (a shipped config's name or a file,
    "tiny_code:smoke" or "my_config.py:variant", as `train/train.py` takes it): a ConfigDict or
    a mapping of sections. A one-line error naming `name` and the file for a missing file, one
    that is not Python or fails to run, one without get_config() and one whose get_config()
    returns no config."""
    path, _, variant = config_file(spec).partition(":")
    where = f"{name} {path}"
    if not os.path.isfile(path):
        raise ValueError(f"{where}: no such file or shipped config (shipped: "
                         f"{', '.join(shipped_configs())})")
    loader = importlib.machinery.SourceFileLoader("specjax_user_config", path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    try:
        loader.exec_module(module)
    except SyntaxError as error:
        raise ValueError(f"{where}: not a Python config file ({error.msg} at line "
                         f"{error.lineno})") from None
    except Exception as error:  # whatever the file's code raises
        raise ValueError(f"{where}: running it raised {_first_line(error)}") from None
    if not callable(getattr(module, "get_config", None)):
        raise ValueError(f"{where}: defines no get_config() returning the config")
    call = f"get_config({variant!r})" if variant else "get_config()"
    try:
        config = module.get_config(variant) if variant else module.get_config()
    except Exception as error:  # an unknown variant, or the function's own bug
        raise ValueError(f"{where}: {call} raised {_first_line(error)}") from None
    if not isinstance(config, Mapping) and not hasattr(config, "to_dict"):
        raise ValueError(f"{where}: {call} returned {type(config).__name__}, not a config (an "
                         "ml_collections.ConfigDict or a dict of sections)")
    return config


def _first_line(error: Exception) -> str:
    """An exception as "Type: its message's first line"."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def check(ok: bool, field: str, value: Any, why: str) -> None:
    """A config setting's one-line error: "section.field=value why" (every section's checks:
    the model's, the run's and the heads')."""
    if not ok:
        raise ValueError(f"{field}={value!r} {why}")
