"""The layer kinds a model stacks (`ModelConfig.layer_pattern`), as one table.

Each kind says how to initialise one layer, run it over whole sequences (training, no cache), run
it on new tokens against its own cache (decoding, prefill, chains and trees), propagate an
early-exited token's state through it without running it (CALM), allocate that cache, the
bytes a decode step moves and its FLOPs beyond the weights' products, the layout axes of its
parameters and cache leaves (`sharding`), the parameters exempt from weight decay and its
Hugging Face tensors (`hf_leaves`). Each kind's layers are stacked under its own `params_key`
(`layers`, `mamba2_layers`); every layer of any kind is an exit, so LayerSkip's layer dropout,
early-exit loss and curricula apply unchanged. `model.py` only walks the pattern and looks
kinds up here; `ModelConfig` imports no layer, so the kinds a pattern names are checked here
(`check_layer_kinds`).

Besides its entry here a kind brings its layer cache (a `LayerCache` of `nn.cache`, as Mamba-2
brought `LayerSSM`), its settings in `ModelConfig` if it has any (Mamba-2's `SsmConfig`) and,
for Hugging Face interop, its `hf_leaves` (`nn.hf_layout`) and each architecture's names and
config keys (`specjax.convert`). `tests/nn/test_layer_kind_contract.py` registers a toy kind from
the test file and trains, decodes, lays out and checkpoints it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.nn.block import DecoderBlock, propagate_state
from specjax.nn.cache import LayerKV, LayerSSM
from specjax.nn.hf_layout import HfLeaf, attention_leaves, mamba2_leaves
from specjax.nn.mamba2 import Cached, Mamba2Block, Prefill, Sequence
from specjax.nn.rope import Rope, rope_tables

Params = dict[str, Any]


class Step(NamedTuple):
    """A cached pass over T new tokens: their RoPE tables, the cache slots they see `mask`
    [B, T, max_len], where they are written `write_pos` ([B]: consecutive from there, or
    [B, T]), the committed `lengths` [B], and for a prefill the prompts' real lengths [B]
    (the tokens are then right-padded prompts from slot 0, committed by the pass itself)."""

    rope: Rope | None  # per layer (model._layer_step); None: a NoPE layer
    mask: jax.Array
    write_pos: jax.Array
    lengths: jax.Array
    prompt_lengths: jax.Array | None = None

    @property
    def slots(self) -> jax.Array:
        """[B, T] the cache slot of every new token."""
        if self.write_pos.ndim == 2:
            return self.write_pos
        return self.write_pos[:, None] + jnp.arange(self.mask.shape[1])[None, :]


@dataclasses.dataclass(frozen=True)
class LayerKind:
    """What the model needs from one kind of layer (see the module docstring). `params_key`
    names the stack of this kind's layers in the training layout; `step_bytes(cfg, context)`,
    the bytes one decode step moves in this layer's cache at `context` committed tokens;
    `mixing_flops(cfg, seq_len)`, the forward FLOPs per token of the sequence mixing beyond the
    weights' matrix products (for model-FLOPs utilisation); `param_axes`, the logical axes of
    its own parameters by their innermost keys, and `cache_axes`, those of its cache's leaves by
    field name (`specjax.sharding` lays both out by them; the shared embeddings, norms and MLPs
    are declared there); `no_decay`, parameters that weight decay leaves alone; `depthwise`,
    weights applied elementwise (not matrix products, whatever their rank); `hf_leaves(cfg)`,
    how one layer's parameters are stored in Hugging Face checkpoints (`nn.hf_layout`; None:
    no HF layout, so `convert` refuses the model); `requires(cfg)`, why a model config cannot
    have this kind's layers (a one-line reason, None when it can)."""

    params_key: str
    init: Callable[[ModelConfig, jax.Array], Params]
    forward: Callable[[ModelConfig, Params, jax.Array, Rope, jax.Array], jax.Array]
    cached: Callable[[ModelConfig, Params, jax.Array, Any, Step], tuple[jax.Array, Any]]
    propagate: Callable[[ModelConfig, Params, jax.Array, Any, Step], Any]
    allocate: Callable[[ModelConfig, int, int, int], Any]
    step_bytes: Callable[[ModelConfig, float], float]
    mixing_flops: Callable[[ModelConfig, int], float]
    param_axes: Mapping[tuple[str, ...], tuple[str | None, ...]] = dataclasses.field(
        default_factory=dict)
    cache_axes: Mapping[str, tuple[str | None, ...]] = dataclasses.field(default_factory=dict)
    no_decay: tuple[str, ...] = ()
    depthwise: tuple[str, ...] = ()
    hf_leaves: Callable[[ModelConfig], tuple[HfLeaf, ...]] | None = None
    requires: Callable[[ModelConfig], str | None] = lambda cfg: None


def _one_token(cfg: ModelConfig) -> tuple[jax.Array, Rope, jax.Array]:
    positions = jnp.zeros((1, 1), jnp.int32)
    return (jnp.zeros((1, 1, cfg.d_model), cfg.compute_dtype), rope_tables(cfg, positions),
            jnp.ones((1, 1, 1), bool))


def _attention_init(cfg: ModelConfig, key: jax.Array) -> Params:
    return DecoderBlock(cfg).init(key, *_one_token(cfg))["params"]


def _attention_forward(cfg: ModelConfig, params: Params, hidden: jax.Array,
                       rope: Rope | None, mask: jax.Array) -> jax.Array:
    return DecoderBlock(cfg).apply({"params": params}, hidden, rope, mask)[0]


def _attention_cached(cfg: ModelConfig, params: Params, hidden: jax.Array, kv: LayerKV,
                      step: Step) -> tuple[jax.Array, LayerKV]:
    return DecoderBlock(cfg).apply({"params": params}, hidden, step.rope, step.mask, kv,
                                   step.write_pos)


def _attention_propagate(cfg: ModelConfig, params: Params, hidden: jax.Array, kv: LayerKV,
                         step: Step) -> LayerKV:
    return propagate_state(cfg, params, hidden, step.rope, kv, step.write_pos)


def _attention_step_bytes(cfg: ModelConfig, context: float) -> float:
    """The live K and V of `context` tokens, read."""
    return 2 * cfg.num_kv_heads * cfg.head_dim * jnp.dtype(cfg.compute_dtype).itemsize * context


def _attention_mixing_flops(cfg: ModelConfig, seq_len: int) -> float:
    """Scores and the weighted sum of values over the whole sequence (PaLM's count: the causal
    half is not discounted)."""
    return 4 * seq_len * cfg.num_heads * cfg.head_dim


def _mamba2_init(cfg: ModelConfig, key: jax.Array) -> Params:
    return Mamba2Block(cfg).init(key, _one_token(cfg)[0], Sequence())["params"]


def _mamba2_forward(cfg: ModelConfig, params: Params, hidden: jax.Array, rope: Rope,
                    mask: jax.Array) -> jax.Array:
    return Mamba2Block(cfg).apply({"params": params}, hidden, Sequence())[0]


def _mamba2_cached(cfg: ModelConfig, params: Params, hidden: jax.Array, cache: LayerSSM,
                   step: Step) -> tuple[jax.Array, LayerSSM]:
    mixing = (Cached(cache, step.lengths, step.slots, step.mask)
              if step.prompt_lengths is None else Prefill(cache, step.prompt_lengths))
    return Mamba2Block(cfg).apply({"params": params}, hidden, mixing)


def _mamba2_step_bytes(cfg: ModelConfig, context: float) -> float:
    """The SSM state and conv history, read and written (whatever the context)."""
    ssm = cfg.ssm
    state = ssm.num_heads * ssm.head_dim * ssm.state_size * 4
    history = (ssm.conv_width - 1) * ssm.conv_channels * jnp.dtype(cfg.compute_dtype).itemsize
    return 2 * (state + history)


def _mamba2_mixing_flops(cfg: ModelConfig, seq_len: int) -> float:
    """The chunked scan: C.B scores and their weighted sum within a chunk, the chunk's state
    and the state read out (`ssd.ssd_chunked`)."""
    ssm = cfg.ssm
    heads, width, state = ssm.num_heads, ssm.head_dim, ssm.state_size
    return 2 * min(ssm.chunk_size, seq_len) * heads * (state + width) + 4 * heads * width * state


def _mamba2_propagate(cfg: ModelConfig, params: Params, hidden: jax.Array, cache: LayerSSM,
                      step: Step) -> LayerSSM:
    """A skipped SSM layer's window gets what it would have computed from the exited state
    (the analogue of projecting K/V from it): XLA drops the unused output."""
    return _mamba2_cached(cfg, params, hidden, cache, step)[1]


LAYER_KINDS: dict[str, LayerKind] = {
    "attention": LayerKind(
        params_key="layers", init=_attention_init, forward=_attention_forward,
        cached=_attention_cached, propagate=_attention_propagate,
        allocate=lambda cfg, batch, max_len, window: LayerKV.allocate(cfg, batch, max_len),
        step_bytes=_attention_step_bytes, mixing_flops=_attention_mixing_flops,
        param_axes={
            ("attn", "qkv"): ("embed", "heads", None, None),      # [D, K, G+2, Dh]
            ("attn", "qkv_bias"): ("heads", None, None),
            ("attn", "out"): ("heads", None, None, "embed"),      # [K, G, Dh, D]
        },
        # "rows*kv_heads": the merged axis of rows and K/V heads (row-major, see cache.py)
        cache_axes={"k": ("rows*kv_heads", None, None), "v": ("rows*kv_heads", None, None)},
        hf_leaves=attention_leaves),
    "mamba2": LayerKind(
        params_key="mamba2_layers", init=_mamba2_init, forward=_mamba2_forward,
        cached=_mamba2_cached, propagate=_mamba2_propagate,
        allocate=lambda cfg, batch, max_len, window: LayerSSM.allocate(cfg, batch, window),
        step_bytes=_mamba2_step_bytes, mixing_flops=_mamba2_mixing_flops,
        param_axes={
            ("mixer", "in_proj"): ("embed", None),  # z, xBC, dt side by side: kept whole
            ("mixer", "out_proj"): (None, "embed"),
            ("mixer", "dt_bias"): ("ssm_heads",),
            ("mixer", "A_log"): ("ssm_heads",),
            ("mixer", "D"): ("ssm_heads",),
        },
        cache_axes={"state": ("batch", "ssm_heads", None, None), "conv": ("batch", None, None),
                    "xbc": ("batch", None, None), "x": ("batch", None, "ssm_heads", None),
                    "b": ("batch", None, None, None), "dt": ("batch", None, "ssm_heads"),
                    "log_decay": ("batch", None, "ssm_heads")},
        no_decay=("A_log", "D", "dt_bias"), depthwise=("conv",), hf_leaves=mamba2_leaves,
        requires=lambda cfg: None if cfg.ssm is not None else (
            "ModelConfig.ssm=None must be set when layer_pattern has mamba2 layers")),
}


def check_layer_kinds(cfg: ModelConfig) -> None:
    """A one-line ValueError when `cfg` names a kind this table lacks, or one whose layers it
    cannot have (`LayerKind.requires`)."""
    unknown = sorted(set(cfg.layer_kinds) - set(LAYER_KINDS))
    if unknown:
        raise ValueError(f"ModelConfig.layer_pattern={cfg.layer_pattern!r} has unknown kinds "
                         f"{unknown}; known: {sorted(LAYER_KINDS)}")
    for name in dict.fromkeys(cfg.layer_kinds):
        reason = LAYER_KINDS[name].requires(cfg)
        if reason:
            raise ValueError(reason)
