"""Hugging Face safetensors <-> specjax parameters: the attention families
(`hf_config.FAMILIES`), Mamba2ForCausalLM and BambaForCausalLM.

Each layer kind declares its parameter leaves (`LayerKind.hf_leaves`, `nn.hf_layout`): the HF
tensors each is made of, named through an architecture's `_Layout` here, how to build it from
them, and the exact inverse; the model's own leaves (embeddings, final norm, unembedding) are
`_GLOBAL_LEAVES`. Each kind's layers form their own stack, filled from the HF layers of that
kind in order. An architecture that stores tensors fused (Phi-3's qkv_proj and gate_up_proj,
`_FUSIONS`) is read split into Llama's names and written concatenated again. Both directions
are reshapes, transposes, splits and concatenations, so a round trip is bit-identical.

Import streams: every stacked leaf is allocated once in its final dtype and filled one HF tensor
at a time, then moved to the device; the largest extra host allocation is one stacked leaf. Only
safetensors are read (never pickled `.bin` files).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from specjax.config import ModelConfig
from specjax.convert.hf_config import HF_NAMES, ConversionError, model_config_from_hf
from specjax.model import Params, init_params
from specjax.nn.hf_layout import HfLeaf, same, same_to_hf, transpose, transpose_to_hf
from specjax.nn.layer_kinds import LAYER_KINDS

SINGLE_FILE, INDEX_FILE = "model.safetensors", "model.safetensors.index.json"


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
    **{arch: _Layout(embed="model.embed_tokens.weight", final_norm="model.norm.weight",
                     layer="model.layers.{i}.", mixer_norm="", mixer="",
                     mlp_norm="pre_feedforward_layernorm.", mlp="mlp.")
       for arch in ("Gemma2ForCausalLM", "Gemma3ForCausalLM")},
    "BambaForCausalLM": _Layout(embed="model.embed_tokens.weight",
                                final_norm="model.final_layernorm.weight",
                                layer="model.layers.{i}.", mixer_norm="input_layernorm.",
                                mixer="mamba.", mlp_norm="pre_ff_layernorm.",
                                mlp="feed_forward."),
    "Mamba2ForCausalLM": _Layout(embed="backbone.embeddings.weight",
                                 final_norm="backbone.norm_f.weight", layer="backbone.layers.{i}.",
                                 mixer_norm="norm.", mixer="mixer.", mlp_norm="", mlp=""),
}



@dataclasses.dataclass(frozen=True)
class _Fusion:
    """Tensors an architecture stores concatenated along their first axis: the fused tensor's
    name (`{i}` the layer index), its parts' names in Llama's layout and each part's rows."""

    fused: str
    parts: tuple[str, ...]
    rows: Callable[[ModelConfig], tuple[int, ...]]


_PHI3_LAYER = "model.layers.{i}."
_FUSIONS = {
    "Phi3ForCausalLM": (
        _Fusion(_PHI3_LAYER + "self_attn.qkv_proj.weight",
                tuple(f"{_PHI3_LAYER}self_attn.{p}_proj.weight" for p in "qkv"),
                lambda cfg: tuple(n * cfg.head_dim for n in (cfg.num_heads, cfg.num_kv_heads,
                                                             cfg.num_kv_heads))),
        _Fusion(_PHI3_LAYER + "mlp.gate_up_proj.weight",
                (_PHI3_LAYER + "mlp.gate_proj.weight", _PHI3_LAYER + "mlp.up_proj.weight"),
                lambda cfg: (cfg.mlp_dim,) * 2),
    ),
}

_GLOBAL_LEAVES = (
    HfLeaf(("embed",), ("{embed}",), same, same_to_hf),
    HfLeaf(("final_norm", "scale"), ("{final_norm}",), same, same_to_hf),
)
_UNEMBED = HfLeaf(("unembed",), ("lm_head.weight",), transpose, transpose_to_hf)


def _layout(arch: str) -> _Layout:
    return _LAYOUTS.get(arch, _LAYOUTS["llama"])


def _names(leaf: HfLeaf, arch: str) -> tuple[str, ...]:
    """The leaf's HF tensor names in `arch`, with `{i}` left for the layer index."""
    return tuple(n.format(**dataclasses.asdict(_layout(arch))) for n in leaf.names)


def _kind_leaves(cfg: ModelConfig, kind: str) -> tuple[HfLeaf, ...]:
    """The leaves of one layer of `kind`, as the kind declares them."""
    leaves = LAYER_KINDS[kind].hf_leaves
    if leaves is None:
        raise ConversionError(f"layers of kind {kind!r} have no Hugging Face layout")
    return leaves(cfg)


def _stacks(cfg: ModelConfig) -> Iterator[tuple[str, list[int], tuple[HfLeaf, ...]]]:
    """Per layer kind: its parameter stack's key, its layers' indices in the model, its leaves."""
    kinds = cfg.layer_kinds
    for kind in dict.fromkeys(kinds):
        yield (LAYER_KINDS[kind].params_key, [i for i, k in enumerate(kinds) if k == kind],
               _kind_leaves(cfg, kind))


def _global_leaves(cfg: ModelConfig) -> tuple[HfLeaf, ...]:
    return _GLOBAL_LEAVES + (() if cfg.tie_embeddings else (_UNEMBED,))


class TensorReader(Protocol):
    """Named tensors of a checkpoint in transformers' names and layout."""

    files: Mapping[str, str]  # every tensor's name -> where it is stored

    def get(self, name: str) -> np.ndarray: ...


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


class _UnfusedReader:
    """A checkpoint's tensors with its `_FUSIONS` split into their parts' names; a fused
    tensor whose rows are not its parts' (as config.json sizes them) is a one-line error."""

    def __init__(self, reader: TensorReader, fusions: tuple[_Fusion, ...], cfg: ModelConfig):
        self.reader, self.cfg, self.parts = reader, cfg, {}
        self.files = dict(reader.files)
        for fusion in fusions:
            pattern = re.compile(re.escape(fusion.fused).replace(re.escape("{i}"), r"(\d+)"))
            for name in list(self.files):
                if match := pattern.fullmatch(name):
                    for k, part in enumerate(fusion.parts):
                        self.parts[part.format(i=match.group(1))] = (name, fusion, k)
                        self.files[part.format(i=match.group(1))] = self.files[name]
                    del self.files[name]

    def get(self, name: str) -> np.ndarray:
        if name not in self.parts:
            return self.reader.get(name)
        fused, fusion, k = self.parts[name]
        tensor = self.reader.get(fused)
        rows = fusion.rows(self.cfg)
        if tensor.shape[0] != sum(rows):
            raise ConversionError(f"the weights' {fused} {tuple(tensor.shape)} does not split "
                                  f"into the {rows} rows config.json gives: the config and the "
                                  "weights disagree")
        return np.split(tensor, np.cumsum(rows)[:-1])[k]


def _fused(tensors: Iterator[tuple[str, np.ndarray]], fusions: tuple[_Fusion, ...]
           ) -> Iterator[tuple[str, np.ndarray]]:
    """`tensors` with the parts of each of `fusions` concatenated into the fused tensor, which
    comes when its last part does."""
    parts = {part: (fusion, k) for fusion in fusions for k, part in enumerate(fusion.parts)}
    patterns = [(re.compile(re.escape(part).replace(re.escape("{i}"), r"(\d+)")), part)
                for part in parts]
    pending: dict[str, list] = {}
    for name, tensor in tensors:
        found = next(((m, part) for pattern, part in patterns
                      if (m := pattern.fullmatch(name))), None)
        if found is None:
            yield name, tensor
            continue
        fusion, k = parts[found[1]]
        fused = fusion.fused.format(i=found[0].group(1))
        pieces = pending.setdefault(fused, [None] * len(fusion.parts))
        pieces[k] = tensor
        if all(piece is not None for piece in pieces):
            yield fused, np.concatenate(pending.pop(fused))


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


def load_hf_params(source: str | TensorReader, cfg: ModelConfig, arch: str, *,
                   hf: dict | None = None) -> Params:
    """Stacked specjax parameters (in cfg.param_dtype) from a checkpoint directory of `arch`
    (or another reader of its tensors under their HF names: a GGUF file); a tensor whose shape
    the config does not give is a one-line `ConversionError`, which names the config.json
    field (of `hf`, the config `cfg` was made from) that disagrees."""
    reader = SafetensorsReader(source) if isinstance(source, str) else source
    if arch in _FUSIONS:
        reader = _UnfusedReader(reader, _FUSIONS[arch], cfg)
    _check_layer_count(reader, cfg, arch)
    dtype = jnp.dtype(cfg.weight_dtype)
    expected = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    params: dict = {}

    def build(leaf: HfLeaf, layer: int | None, path: tuple[str, ...]) -> np.ndarray:
        names = [n.format(i=layer) for n in _names(leaf, arch)]
        tensors = [reader.get(name) for name in names]
        want = _get(expected, path).shape[0 if layer is None else 1:]
        try:
            built = leaf.from_hf(cfg, *tensors)
        except ValueError:  # a reshape the tensors' sizes do not allow
            built = None
        if built is None or built.shape != want:
            raise _disagreement(names, tensors, want, cfg,
                                _misfits(hf, leaf, layer is None, path, tensors))
        return built.astype(dtype, copy=False)

    for leaf in _global_leaves(cfg):
        _set(params, leaf.path, jnp.asarray(build(leaf, None, leaf.path)))
    for key, layers, leaves in _stacks(cfg):
        for leaf in leaves:
            first = build(leaf, layers[0], (key, *leaf.path))
            stacked = np.empty((len(layers), *first.shape), dtype)
            stacked[0] = first
            for row, layer in enumerate(layers[1:], start=1):
                stacked[row] = build(leaf, layer, (key, *leaf.path))
            _set(params, (key, *leaf.path), jnp.asarray(stacked))
            del stacked
    _check_shapes(params, expected)
    return params


def _check_layer_count(reader: TensorReader, cfg: ModelConfig, arch: str) -> None:
    """One line when the weights hold another number of decoder layers than the config (fewer
    would fail on a missing tensor; more would be dropped without a word)."""
    prefix = re.escape(_layout(arch).layer).replace(re.escape("{i}"), r"(\d+)")
    indices = {int(match.group(1)) for name in reader.files
               if (match := re.match(prefix, name))}
    if indices and max(indices) + 1 != cfg.num_layers:
        raise ConversionError(f"the weights hold {max(indices) + 1} decoder layers, but "
                              f"config.json's num_hidden_layers is {cfg.num_layers}: the config "
                              "and the weights disagree")


def _disagreement(names: list[str], tensors: list[np.ndarray], want: tuple[int, ...],
                  cfg: ModelConfig, misfits: list[str]) -> ConversionError:
    """One line: the tensors, their shapes, and the config.json fields to check: `misfits`
    when a one-field change explains the tensors, else the fields that size what they should
    make (those of its dimensions that no tensor has, else all of them)."""
    shown = ", ".join(f"{name} {tuple(tensor.shape)}" for name, tensor in
                      zip(names, tensors, strict=True))
    if misfits:
        return ConversionError(f"the weights' {shown} do not make the {want} that config.json "
                               f"gives: {' or '.join(misfits)}; the config and the weights "
                               "disagree")
    have = {size for tensor in tensors for size in tensor.shape}
    sized = [field for field in _SIZE_FIELDS if getattr(cfg, field) in set(want)]
    fields = [field for field in sized if getattr(cfg, field) not in have] or sized
    named = ", ".join(f"{_SIZE_FIELDS[field]}={getattr(cfg, field)}" for field in fields)
    return ConversionError(f"the weights' {shown} do not make the {want} that config.json "
                           f"gives ({named}): the config and the weights disagree")


def _misfits(hf: dict | None, leaf: HfLeaf, is_global: bool, path: tuple[str, ...],
             tensors: list[np.ndarray]) -> list[str]:
    """The config.json size fields which, changed alone to a value the tensors' sizes suggest,
    make `leaf` from `tensors`: "num_attention_heads=10 (the weights fit 5)". Only on the error
    path, so a few abstract inits (milliseconds each) are fine."""
    if hf is None:
        return []
    dims = {size for tensor in tensors for size in tensor.shape}
    scales = {1} | {hf[key] for key in _SIZE_FIELDS.values() if isinstance(hf.get(key), int)}
    candidates = sorted({d // s for d in dims for s in scales if s > 0 and d % s == 0})
    found = []
    for key in _SIZE_FIELDS.values():
        if not isinstance(hf.get(key), int):
            continue
        for value in candidates:
            if value != hf[key] and _fits(leaf, is_global, path, tensors, {**hf, key: value}):
                found.append(f"{key}={hf[key]} (the weights fit {value})")
                break
    return found


def _fits(leaf: HfLeaf, is_global: bool, path: tuple[str, ...], tensors: list[np.ndarray],
          hf: dict) -> bool:
    try:
        cfg = model_config_from_hf(hf)
        want = _get(jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0))),
                    path).shape[0 if is_global else 1:]
        return leaf.from_hf(cfg, *tensors).shape == want
    except (ValueError, KeyError, ConversionError):  # no such config, or an impossible reshape
        return False


def hf_tensors(params: Params, cfg: ModelConfig, arch: str) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, tensor) pairs of a specjax model in `arch`'s layout, one tensor at a time
    (a fused one once its parts are made: `_FUSIONS`)."""
    return _fused(_unfused_tensors(params, cfg, arch), _FUSIONS.get(arch, ()))


def _unfused_tensors(params: Params, cfg: ModelConfig,
                     arch: str) -> Iterator[tuple[str, np.ndarray]]:
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


def _check_shapes(params: Params, abstract: Params) -> None:
    """One line naming the first converted leaf that the config's model (`abstract`, its
    shapes and dtypes) lacks, or holds with another dtype, or that the conversion did not
    make."""
    expected = dict(jax.tree_util.tree_flatten_with_path(abstract)[0])
    got = dict(jax.tree_util.tree_flatten_with_path(params)[0])
    for path in [*expected, *got]:
        name = jax.tree_util.keystr(path, simple=True, separator=".")
        if path not in got:
            raise ConversionError(f"the converted parameters lack {name}")
        if path not in expected:
            raise ConversionError(f"the converted parameters hold {name}, which the model "
                                  "config does not have")
        have, want = got[path], expected[path]
        if (have.shape, have.dtype) != (want.shape, want.dtype):
            raise ConversionError(f"the converted {name} is {tuple(have.shape)} {have.dtype}, "
                                  f"not the config's {tuple(want.shape)} {want.dtype}")


# The config fields that size tensors, by their names in a Llama-style config.json.
_SIZE_FIELDS = {field: HF_NAMES[field] for field in
                ("vocab_size", "d_model", "mlp_dim", "num_heads", "num_kv_heads", "head_dim")}


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
