"""How the built-in layer kinds' parameters are stored in Hugging Face checkpoints.

A `HfLeaf` describes one parameter leaf of a layer: the HF tensors it is made of (names with
placeholders that an architecture's layout fills in: `{layer}` a decoder layer's prefix, with
`{i}` its index; `{mlp_norm}`, `{mlp}`, `{mixer_norm}`, `{mixer}` the names of its parts), how
to build it from them and the exact inverse. A layer kind lists its leaves (`LayerKind.hf_leaves`,
`nn.layer_kinds`); `convert.hf_weights` reads and writes every kind through them. Both
directions are reshapes, transposes and concatenations, so a round trip is bit-identical.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from specjax.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class HfLeaf:
    """A leaf's path in a layer's params; its HF tensor names (placeholders: the module's
    docstring); from_hf(cfg, *tensors) -> the leaf, to_hf(leaf, cfg) -> the tensors;
    present(cfg): whether models of that config have the leaf (attention biases, Q/K norms)."""

    path: tuple[str, ...]
    names: tuple[str, ...]
    from_hf: Callable[..., np.ndarray]
    to_hf: Callable[[np.ndarray, ModelConfig], tuple[np.ndarray, ...]]
    present: Callable[[ModelConfig], bool] = lambda cfg: True


def _qkv_from_hf(cfg: ModelConfig, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """[H*Dh, D], [K*Dh, D], [K*Dh, D] -> [D, K, G+2, Dh] (query head h belongs to kv head
    h // G, as in transformers' repeat_kv; D is the input width: 2 d_model for EAGLE-3)."""
    kv, g, dh, d = cfg.num_kv_heads, cfg.group_size, cfg.head_dim, q.shape[1]
    return np.concatenate([q.T.reshape(d, kv, g, dh), k.T.reshape(d, kv, 1, dh),
                           v.T.reshape(d, kv, 1, dh)], axis=2)


def _qkv_to_hf(w: np.ndarray, cfg: ModelConfig) -> tuple[np.ndarray, ...]:
    d, g = w.shape[0], cfg.group_size
    return (np.ascontiguousarray(w[:, :, :g].reshape(d, -1).T),
            np.ascontiguousarray(w[:, :, g].reshape(d, -1).T),
            np.ascontiguousarray(w[:, :, g + 1].reshape(d, -1).T))


def _bias_from_hf(cfg: ModelConfig, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    kv, g, dh = cfg.num_kv_heads, cfg.group_size, cfg.head_dim
    return np.concatenate([q.reshape(kv, g, dh), k.reshape(kv, 1, dh), v.reshape(kv, 1, dh)],
                          axis=1)


def _bias_to_hf(b: np.ndarray, cfg: ModelConfig) -> tuple[np.ndarray, ...]:
    g = cfg.group_size
    return (b[:, :g].reshape(-1), b[:, g].reshape(-1), b[:, g + 1].reshape(-1))


def transpose(cfg: ModelConfig, w: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(w.T)


def same(cfg: ModelConfig, w: np.ndarray) -> np.ndarray:
    return w


def _conv_from_hf(cfg: ModelConfig, w: np.ndarray) -> np.ndarray:
    """Conv1d's depthwise weight [C, 1, K] -> [K, C]."""
    return np.ascontiguousarray(w[:, 0].T)


def same_to_hf(w: np.ndarray, cfg: ModelConfig) -> tuple[np.ndarray, ...]:
    return (w,)


def transpose_to_hf(w: np.ndarray, cfg: ModelConfig) -> tuple[np.ndarray, ...]:
    return (np.ascontiguousarray(w.T),)


_ATTN = "{layer}self_attn."
MLP_LEAVES = (
    HfLeaf(("mlp_norm", "scale"), ("{layer}{mlp_norm}weight",), same, same_to_hf),
    HfLeaf(("mlp", "gate_up"), ("{layer}{mlp}gate_proj.weight", "{layer}{mlp}up_proj.weight"),
          lambda cfg, gate, up: np.stack([gate.T, up.T], axis=1),
          lambda w, cfg: (np.ascontiguousarray(w[:, 0].T), np.ascontiguousarray(w[:, 1].T))),
    HfLeaf(("mlp", "down"), ("{layer}{mlp}down_proj.weight",), transpose, transpose_to_hf),
)
ATTENTION_LEAVES = (
    HfLeaf(("attn_norm", "scale"), ("{layer}input_layernorm.weight",), same, same_to_hf),
    HfLeaf(("attn", "qkv"), tuple(_ATTN + p + "_proj.weight" for p in "qkv"), _qkv_from_hf,
          _qkv_to_hf),
    HfLeaf(("attn", "qkv_bias"), tuple(_ATTN + p + "_proj.bias" for p in "qkv"), _bias_from_hf,
          _bias_to_hf, present=lambda cfg: cfg.attention_bias),
    *(HfLeaf(("attn", name), (_ATTN + name + ".weight",), same, same_to_hf,
             present=lambda cfg: cfg.qk_norm) for name in ("q_norm", "k_norm")),
    # Gemma's norms after attention and after the MLP (its MLP's own is pre_feedforward_...)
    *(HfLeaf((name, "scale"), (f"{{layer}}{hf_name}.weight",), same, same_to_hf,
             present=lambda cfg: cfg.post_norms)
      for name, hf_name in (("attn_post_norm", "post_attention_layernorm"),
                            ("mlp_post_norm", "post_feedforward_layernorm"))),
    HfLeaf(("attn", "out"), (_ATTN + "o_proj.weight",),
          lambda cfg, o: np.ascontiguousarray(o.T).reshape(
              cfg.num_kv_heads, cfg.group_size, cfg.head_dim, cfg.d_model),
          lambda w, cfg: (np.ascontiguousarray(w.reshape(-1, cfg.d_model).T),)),
)
_MIXER = "{layer}{mixer}"
MAMBA2_LEAVES = (
    HfLeaf(("norm", "scale"), ("{layer}{mixer_norm}weight",), same, same_to_hf),
    HfLeaf(("mixer", "in_proj"), (_MIXER + "in_proj.weight",), transpose, transpose_to_hf),
    HfLeaf(("mixer", "conv"), (_MIXER + "conv1d.weight",), _conv_from_hf,
          lambda w, cfg: (np.ascontiguousarray(w.T[:, None]),)),
    *(HfLeaf(("mixer", name), (_MIXER + hf_name,), same, same_to_hf)
      for name, hf_name in (("conv_bias", "conv1d.bias"), ("dt_bias", "dt_bias"),
                            ("A_log", "A_log"), ("D", "D"), ("norm", "norm.weight"))),
    HfLeaf(("mixer", "out_proj"), (_MIXER + "out_proj.weight",), transpose, transpose_to_hf),
)


def attention_leaves(cfg: ModelConfig) -> tuple[HfLeaf, ...]:
    """An attention layer's leaves, its MLP's included (the q/k/v biases and Q/K norms where
    it has them)."""
    return tuple(leaf for leaf in ATTENTION_LEAVES + MLP_LEAVES if leaf.present(cfg))


def mamba2_leaves(cfg: ModelConfig) -> tuple[HfLeaf, ...]:
    """A Mamba-2 layer's leaves (and its MLP's, in hybrids that give it one)."""
    return MAMBA2_LEAVES + (MLP_LEAVES if cfg.ssm.mlp else ())
