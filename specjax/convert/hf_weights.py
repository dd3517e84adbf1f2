"""Hugging Face safetensors <-> specjax parameters: Llama-family decoders, Mamba2ForCausalLM and
BambaForCausalLM.

Each parameter leaf is described once per layer kind (`_ATTENTION_LEAVES`, `_MAMBA2_LEAVES`, the
shared `_MLP_LEAVES`, `_GLOBAL_LEAVES`): the HF tensors it is made of (named through an
architecture's `_Layout`), how to build it from them, and the exact inverse. Each kind's layers
form their own stack, filled from the HF layers of that kind in order. Both directions are reshapes,
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
from specjax.nn.layer_kinds import LAYER_KINDS

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


def _conv_from_hf(cfg: ModelConfig, w: np.ndarray) -> np.ndarray:
    """Conv1d's depthwise weight [C, 1, K] -> [K, C]."""
    return np.ascontiguousarray(w[:, 0].T)


def _same_to_hf(w: np.ndarray, cfg: ModelConfig) -> tuple[np.ndarray, ...]:
    return (w,)


def _transpose_to_hf(w: np.ndarray, cfg: ModelConfig) -> tuple[np.ndarray, ...]:
    return (np.ascontiguousarray(w.T),)


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Where one architecture keeps its tensors; leaves name them as `{field}rest`, and `{i}`
    in a field is the layer index."""

    embed: str
    final_norm: str
    layer: str       # one decoder layer's prefix
    mixer_norm: str  # the norm before a Mamba-2 mixer
    mixer: str
    mlp_norm: str
    mlp: str


_LAYOUTS = {
    "llama": _Layout(embed="model.embed_tokens.weight", final_norm="model.norm.weight",
                     layer="model.layers.{i}.", mixer_norm="", mixer="",
                     mlp_norm="post_attention_layernorm.", mlp="mlp."),
    "BambaForCausalLM": _Layout(embed="model.embed_tokens.weight",
                                final_norm="model.final_layernorm.weight",
                                layer="model.layers.{i}.", mixer_norm="input_layernorm.",
                                mixer="mamba.", mlp_norm="pre_ff_layernorm.",
                                mlp="feed_forward."),
    "Mamba2ForCausalLM": _Layout(embed="backbone.embeddings.weight",
                                 final_norm="backbone.norm_f.weight", layer="backbone.layers.{i}.",
                                 mixer_norm="norm.", mixer="mixer.", mlp_norm="", mlp=""),
}

_ATTN = "{layer}self_attn."
_MLP_LEAVES = (
    _Leaf(("mlp_norm", "scale"), ("{layer}{mlp_norm}weight",), _same, _same_to_hf),
    _Leaf(("mlp", "gate_up"), ("{layer}{mlp}gate_proj.weight", "{layer}{mlp}up_proj.weight"),
          lambda cfg, gate, up: np.stack([gate.T, up.T], axis=1),
          lambda w, cfg: (np.ascontiguousarray(w[:, 0].T), np.ascontiguousarray(w[:, 1].T))),
    _Leaf(("mlp", "down"), ("{layer}{mlp}down_proj.weight",), _transpose, _transpose_to_hf),
)
_ATTENTION_LEAVES = (
    _Leaf(("attn_norm", "scale"), ("{layer}input_layernorm.weight",), _same, _same_to_hf),
    _Leaf(("attn", "qkv"), tuple(_ATTN + p + "_proj.weight" for p in "qkv"), _qkv_from_hf,
          _qkv_to_hf),
    _Leaf(("attn", "qkv_bias"), tuple(_ATTN + p + "_proj.bias" for p in "qkv"), _bias_from_hf,
          _bias_to_hf, needs_bias=True),
    _Leaf(("attn", "out"), (_ATTN + "o_proj.weight",),
          lambda cfg, o: np.ascontiguousarray(o.T).reshape(
              cfg.num_kv_heads, cfg.group_size, cfg.head_dim, cfg.d_model),
          lambda w, cfg: (np.ascontiguousarray(w.reshape(-1, cfg.d_model).T),)),
)
_MIXER = "{layer}{mixer}"
_MAMBA2_LEAVES = (
    _Leaf(("norm", "scale"), ("{layer}{mixer_norm}weight",), _same, _same_to_hf),
    _Leaf(("mixer", "in_proj"), (_MIXER + "in_proj.weight",), _transpose, _transpose_to_hf),
    _Leaf(("mixer", "conv"), (_MIXER + "conv1d.weight",), _conv_from_hf,
          lambda w, cfg: (np.ascontiguousarray(w.T[:, None]),)),
    *(_Leaf(("mixer", name), (_MIXER + hf_name,), _same, _same_to_hf)
      for name, hf_name in (("conv_bias", "conv1d.bias"), ("dt_bias", "dt_bias"),
                            ("A_log", "A_log"), ("D", "D"), ("norm", "norm.weight"))),
    _Leaf(("mixer", "out_proj"), (_MIXER + "out_proj.weight",), _transpose, _transpose_to_hf),
)
_GLOBAL_LEAVES = (
    _Leaf(("embed",), ("{embed}",), _same, _same_to_hf),
    _Leaf(("final_norm", "scale"), ("{final_norm}",), _same, _same_to_hf),
)
_UNEMBED = _Leaf(("unembed",), ("lm_head.weight",), _transpose, _transpose_to_hf)


def _layout(arch: str) -> _Layout:
    return _LAYOUTS.get(arch, _LAYOUTS["llama"])


def _names(leaf: _Leaf, arch: str) -> tuple[str, ...]:
    """The leaf's HF tensor names in `arch`, with `{i}` left for the layer index."""
    return tuple(n.format(**dataclasses.asdict(_layout(arch))) for n in leaf.names)


def _kind_leaves(cfg: ModelConfig, kind: str) -> tuple[_Leaf, ...]:
    """The leaves of one layer of `kind` (its MLP's included)."""
    if kind == "attention":
        return tuple(leaf for leaf in _ATTENTION_LEAVES + _MLP_LEAVES
                     if cfg.attention_bias or not leaf.needs_bias)
    if kind == "mamba2":
        return _MAMBA2_LEAVES + (_MLP_LEAVES if cfg.ssm.mlp else ())
    raise ConversionError(f"layers of kind {kind!r} have no Hugging Face layout")


def _stacks(cfg: ModelConfig) -> Iterator[tuple[str, list[int], tuple[_Leaf, ...]]]:
    """Per layer kind: its parameter stack's key, its layers' indices in the model, its leaves."""
    kinds = cfg.layer_kinds
    for kind in dict.fromkeys(kinds):
        yield (LAYER_KINDS[kind].params_key, [i for i, k in enumerate(kinds) if k == kind],
               _kind_leaves(cfg, kind))


def _global_leaves(cfg: ModelConfig) -> tuple[_Leaf, ...]:
    return _GLOBAL_LEAVES + (() if cfg.tie_embeddings else (_UNEMBED,))


class SafetensorsReader:
    """Reads named tensors from a checkpoint's one or many safetensors files, lazily."""

    def __init__(self, hf_dir: str):
        index_path = os.path.join(hf_dir, INDEX_FILE)
        if os.path.isfile(index_path):
            try:
                with open(index_path, encoding="utf-8") as f:
                    files = json.load(f)["weight_map"]
            except (ValueError, KeyError, TypeError) as error:
                raise ConversionError(f"{index_path} is not a safetensors index "
                                      f"({type(error).__name__}: {error})") from None
        elif os.path.isfile(os.path.join(hf_dir, SINGLE_FILE)):
            with _readable(os.path.join(hf_dir, SINGLE_FILE)) as f:
                files = {name: SINGLE_FILE for name in f.keys()}
        else:
            found = sorted(os.listdir(hf_dir)) if os.path.isdir(hf_dir) else []
            raise ConversionError(f"no {SINGLE_FILE} or {INDEX_FILE} in {hf_dir!r} (found "
                                  f"{found}); only safetensors checkpoints are read")
        self.hf_dir, self.files = hf_dir, files

    def get(self, name: str) -> np.ndarray:
        if name not in self.files:
            raise ConversionError(f"checkpoint {self.hf_dir!r} is missing tensor {name!r}")
        with _readable(os.path.join(self.hf_dir, self.files[name])) as f:
            return np.asarray(f.get_tensor(name))


def _readable(path: str):
    """`safe_open` of a safetensors file, a truncated or empty one a one-line error naming it
    (the library raises its own error types)."""
    try:
        return safe_open(path, framework="flax")
    except FileNotFoundError:
        raise ConversionError(f"{path} is missing (named by the checkpoint's index)") from None
    except Exception as error:  # safetensors_rust.SafetensorError and others
        raise ConversionError(f"{path} is not a readable safetensors file (truncated or "
                              f"empty?): {str(error).splitlines()[0]}") from None


def load_hf_params(hf_dir: str, cfg: ModelConfig, arch: str) -> Params:
    """Stacked specjax parameters (in cfg.param_dtype) from a checkpoint directory of `arch`."""
    reader = SafetensorsReader(hf_dir)
    dtype = jnp.dtype(cfg.weight_dtype)
    params: dict = {}

    def build(leaf: _Leaf, layer: int | None) -> np.ndarray:
        tensors = [reader.get(n.format(i=layer)) for n in _names(leaf, arch)]
        return leaf.from_hf(cfg, *tensors).astype(dtype, copy=False)

    for leaf in _global_leaves(cfg):
        _set(params, leaf.path, jnp.asarray(build(leaf, None)))
    for key, layers, leaves in _stacks(cfg):
        for leaf in leaves:
            first = build(leaf, layers[0])
            stacked = np.empty((len(layers), *first.shape), dtype)
            stacked[0] = first
            for row, layer in enumerate(layers[1:], start=1):
                stacked[row] = build(leaf, layer)
            _set(params, (key, *leaf.path), jnp.asarray(stacked))
            del stacked
    _check_shapes(params, cfg)
    return params


def hf_tensors(params: Params, cfg: ModelConfig, arch: str) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, tensor) pairs of a specjax model in `arch`'s layout, one tensor at a time."""
    for leaf in _global_leaves(cfg):
        for name, tensor in zip(_names(leaf, arch), leaf.to_hf(_host(params, leaf.path), cfg),
                                strict=True):
            yield name, tensor
    for key, layers, leaves in _stacks(cfg):
        for leaf in leaves:
            stacked = _get(params, (key, *leaf.path))
            for row, layer in enumerate(layers):
                pieces = leaf.to_hf(np.asarray(stacked[row]), cfg)
                for name, tensor in zip(_names(leaf, arch), pieces, strict=True):
                    yield name.format(i=layer), tensor


def save_hf_params(params: Params, cfg: ModelConfig, out_dir: str, arch: str,
                   max_shard_bytes: int = 4 * 2**30) -> list[str]:
    """Writes safetensors shards in `arch`'s layout (one file if it fits, else shards plus an
    index); returns the file names."""
    os.makedirs(out_dir, exist_ok=True)
    shards: list[dict[str, np.ndarray]] = [{}]
    sizes = [0]
    for name, tensor in hf_tensors(params, cfg, arch):
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
    """One line naming the first converted tensor whose shape or dtype is not the config's, and
    the config fields that size its differing dimensions."""
    expected = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    got = dict(jax.tree_util.tree_flatten_with_path(params)[0])
    for path, want in jax.tree_util.tree_flatten_with_path(expected)[0]:
        have = got.get(path)
        if have is not None and (have.shape, have.dtype) == (want.shape, want.dtype):
            continue
        name = jax.tree_util.keystr(path, simple=True, separator=".")
        if have is None:
            raise ConversionError(f"the converted parameters lack {name}")
        sizes = {b for a, b in zip(have.shape, want.shape, strict=False) if a != b}
        fields = [f"{field}={getattr(cfg, field)}" for field in _SIZE_FIELDS
                  if getattr(cfg, field) in sizes]
        raise ConversionError(
            f"the weights' {name} is {tuple(have.shape)} {have.dtype}, but config.json makes it "
            f"{tuple(want.shape)} {want.dtype}" + (f" ({', '.join(fields)})" if fields else "")
            + ": the config and the weights disagree")


_SIZE_FIELDS = ("vocab_size", "d_model", "mlp_dim", "num_heads", "num_kv_heads", "head_dim",
                "num_layers")


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
