"""Hugging Face safetensors <-> specjax parameters for Llama-family decoders.

Each parameter leaf is described once (`_LAYER_LEAVES`, `_GLOBAL_LEAVES`): the HF tensors it is
made of, how to build it from them, and the exact inverse. Both directions are reshapes,
transposes and concatenations, so a round trip is bit-identical.

Import streams: every stacked leaf is allocated once in its final dtype and filled one HF tensor
at a time, then moved to the device; the largest extra host allocation is one stacked leaf. Only
safetensors are read (never pickled `.bin` files).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from specjax.config import ModelConfig
from specjax.convert.hf_config import ConversionError
from specjax.model import Params, init_params

SINGLE_FILE, INDEX_FILE = "model.safetensors", "model.safetensors.index.json"


@dataclasses.dataclass(frozen=True)
class _Leaf:
    """path in params; HF tensor names (with {i} for the layer); to/from HF transforms."""

    path: tuple[str, ...]
    names: tuple[str, ...]
    from_hf: Callable[..., np.ndarray]
    to_hf: Callable[[np.ndarray, ModelConfig], tuple[np.ndarray, ...]]
    needs_bias: bool = False


def _qkv_from_hf(cfg: ModelConfig, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """[H*Dh, D], [K*Dh, D], [K*Dh, D] -> [D, K, G+2, Dh] (query head h belongs to kv head
    h // G, as in transformers' repeat_kv)."""
    kv, g, dh, d = cfg.num_kv_heads, cfg.group_size, cfg.head_dim, cfg.d_model
    return np.concatenate([q.T.reshape(d, kv, g, dh), k.T.reshape(d, kv, 1, dh),
                           v.T.reshape(d, kv, 1, dh)], axis=2)


def _qkv_to_hf(w: np.ndarray, cfg: ModelConfig) -> tuple[np.ndarray, ...]:
    d, g = cfg.d_model, cfg.group_size
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


def _transpose(cfg: ModelConfig, w: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(w.T)


def _same(cfg: ModelConfig, w: np.ndarray) -> np.ndarray:
    return w


_ATTN = "model.layers.{i}.self_attn."
_LAYER_LEAVES = (
    _Leaf(("attn_norm", "scale"), ("model.layers.{i}.input_layernorm.weight",), _same,
          lambda w, cfg: (w,)),
    _Leaf(("attn", "qkv"), tuple(_ATTN + p + "_proj.weight" for p in "qkv"), _qkv_from_hf,
          _qkv_to_hf),
    _Leaf(("attn", "qkv_bias"), tuple(_ATTN + p + "_proj.bias" for p in "qkv"), _bias_from_hf,
          _bias_to_hf, needs_bias=True),
    _Leaf(("attn", "out"), (_ATTN + "o_proj.weight",),
          lambda cfg, o: np.ascontiguousarray(o.T).reshape(
              cfg.num_kv_heads, cfg.group_size, cfg.head_dim, cfg.d_model),
          lambda w, cfg: (np.ascontiguousarray(w.reshape(-1, cfg.d_model).T),)),
    _Leaf(("mlp_norm", "scale"), ("model.layers.{i}.post_attention_layernorm.weight",), _same,
          lambda w, cfg: (w,)),
    _Leaf(("mlp", "gate_up"), ("model.layers.{i}.mlp.gate_proj.weight",
                               "model.layers.{i}.mlp.up_proj.weight"),
          lambda cfg, gate, up: np.stack([gate.T, up.T], axis=1),
          lambda w, cfg: (np.ascontiguousarray(w[:, 0].T), np.ascontiguousarray(w[:, 1].T))),
    _Leaf(("mlp", "down"), ("model.layers.{i}.mlp.down_proj.weight",), _transpose,
          lambda w, cfg: (np.ascontiguousarray(w.T),)),
)
_GLOBAL_LEAVES = (
    _Leaf(("embed",), ("model.embed_tokens.weight",), _same, lambda w, cfg: (w,)),
    _Leaf(("final_norm", "scale"), ("model.norm.weight",), _same, lambda w, cfg: (w,)),
)
_UNEMBED = _Leaf(("unembed",), ("lm_head.weight",), _transpose,
                 lambda w, cfg: (np.ascontiguousarray(w.T),))


def _layer_leaves(cfg: ModelConfig) -> tuple[_Leaf, ...]:
    return tuple(leaf for leaf in _LAYER_LEAVES if cfg.attention_bias or not leaf.needs_bias)


def _global_leaves(cfg: ModelConfig) -> tuple[_Leaf, ...]:
    return _GLOBAL_LEAVES + (() if cfg.tie_embeddings else (_UNEMBED,))


class SafetensorsReader:
    """Reads named tensors from a checkpoint's one or many safetensors files, lazily."""

    def __init__(self, hf_dir: str):
        index_path = os.path.join(hf_dir, INDEX_FILE)
        if os.path.isfile(index_path):
            with open(index_path, encoding="utf-8") as f:
                files = json.load(f)["weight_map"]
        elif os.path.isfile(os.path.join(hf_dir, SINGLE_FILE)):
            with safe_open(os.path.join(hf_dir, SINGLE_FILE), framework="flax") as f:
                files = {name: SINGLE_FILE for name in f.keys()}
        else:
            found = sorted(os.listdir(hf_dir)) if os.path.isdir(hf_dir) else []
            raise ConversionError(f"no {SINGLE_FILE} or {INDEX_FILE} in {hf_dir!r} (found "
                                  f"{found}); only safetensors checkpoints are read")
        self.hf_dir, self.files = hf_dir, files

    def get(self, name: str) -> np.ndarray:
        if name not in self.files:
            raise ConversionError(f"checkpoint {self.hf_dir!r} is missing tensor {name!r}")
        with safe_open(os.path.join(self.hf_dir, self.files[name]), framework="flax") as f:
            return np.asarray(f.get_tensor(name))


def load_hf_params(hf_dir: str, cfg: ModelConfig) -> Params:
    """Stacked specjax parameters (in cfg.param_dtype) from a checkpoint directory."""
    reader = SafetensorsReader(hf_dir)
    dtype = jnp.dtype(cfg.weight_dtype)
    params: dict = {}

    def build(leaf: _Leaf, layer: int | None) -> np.ndarray:
        tensors = [reader.get(n.format(i=layer)) for n in leaf.names]
        return leaf.from_hf(cfg, *tensors).astype(dtype, copy=False)

    for leaf in _global_leaves(cfg):
        _set(params, leaf.path, jnp.asarray(build(leaf, None)))
    for leaf in _layer_leaves(cfg):
        first = build(leaf, 0)
        stacked = np.empty((cfg.num_layers, *first.shape), dtype)
        stacked[0] = first
        for layer in range(1, cfg.num_layers):
            stacked[layer] = build(leaf, layer)
        _set(params, ("layers", *leaf.path), jnp.asarray(stacked))
        del stacked
    _check_shapes(params, cfg)
    return params


def hf_tensors(params: Params, cfg: ModelConfig) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, tensor) pairs of a specjax model, one tensor at a time."""
    for leaf in _global_leaves(cfg):
        for name, tensor in zip(leaf.names, leaf.to_hf(_host(params, leaf.path), cfg),
                                strict=True):
            yield name, tensor
    for leaf in _layer_leaves(cfg):
        stacked = _get(params, ("layers", *leaf.path))
        for layer in range(cfg.num_layers):
            pieces = leaf.to_hf(np.asarray(stacked[layer]), cfg)
            for name, tensor in zip(leaf.names, pieces, strict=True):
                yield name.format(i=layer), tensor


def save_hf_params(params: Params, cfg: ModelConfig, out_dir: str,
                   max_shard_bytes: int = 4 * 2**30) -> list[str]:
    """Writes safetensors shards (one file if it fits, else shards plus an index); returns the
    file names."""
    os.makedirs(out_dir, exist_ok=True)
    shards: list[dict[str, np.ndarray]] = [{}]
    sizes = [0]
    for name, tensor in hf_tensors(params, cfg):
        if sizes[-1] and sizes[-1] + tensor.nbytes > max_shard_bytes:
            shards.append({})
            sizes.append(0)
        shards[-1][name] = tensor
        sizes[-1] += tensor.nbytes
    metadata = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], os.path.join(out_dir, SINGLE_FILE), metadata=metadata)
        return [SINGLE_FILE]
    names = [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    weight_map = {}
    for file_name, shard in zip(names, shards, strict=True):
        save_file(shard, os.path.join(out_dir, file_name), metadata=metadata)
        weight_map.update({tensor: file_name for tensor in shard})
    with open(os.path.join(out_dir, INDEX_FILE), "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}, f, indent=2)
    return names + [INDEX_FILE]


def _check_shapes(params: Params, cfg: ModelConfig) -> None:
    expected = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    got = jax.tree.map(lambda x: (x.shape, x.dtype), params)
    want = jax.tree.map(lambda x: (x.shape, x.dtype), expected)
    if got != want:
        raise ConversionError(f"converted parameters do not match the model config: "
                              f"{got} vs {want}")


def _get(tree: dict, path: tuple[str, ...]):
    for key in path:
        tree = tree[key]
    return tree


def _host(params: Params, path: tuple[str, ...]) -> np.ndarray:
    return np.asarray(_get(params, path))


def _set(tree: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value
