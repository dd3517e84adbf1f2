"""Training an EAGLE-3 head (`specjax.heads.eagle`) on a frozen base with training-time test
(`training.heads.feature_head`), and importing published ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open

from specjax.config import ModelConfig, check, layer_numbers
from specjax.convert.hf_config import read_config_json
from specjax.heads.eagle import EAGLE, default_layers, drafted_ids
from specjax.heads.feature_head import FeatureHeadKind
from specjax.heads.vocab_subset import MASKED_LOGIT  # a token a published head's vocab lacks
from specjax.io.calibrated_defaults import write_calibrated
from specjax.io.draft_vocab import read_ranking, within, write_ranking
from specjax.model import Params
from specjax.nn.hf_layout import ATTENTION_LEAVES, MLP_LEAVES
from specjax.training.frozen_base import load_base, save_imported_head
from specjax.training.heads.feature_head import UnrolledHead, recorded


@dataclasses.dataclass(frozen=True)
class EagleConfig:
    """An EAGLE-3 head on the frozen model in `base_workdir`: it fuses the hidden states after
    `layers` ("2,4,5"; empty: EAGLE-3's 2, L // 2, L - 3), is unrolled `unroll` depths in
    training (training-time test; EAGLE-3 uses 7) and weights depth j's loss by `decay`**j.
    Decoding with it: `--strategy eagle` on the head's workdir (chains and trees)."""

    layers: str = ""
    unroll: int = 4
    decay: float = 0.8

    def __post_init__(self) -> None:
        parsed = None  # not layer numbers: the check below names what the setting expects
        if isinstance(self.layers, str):
            with contextlib.suppress(ValueError):
                parsed = layer_numbers(self.layers, "eagle.layers")
        check(parsed is not None and all(e >= 1 for e in parsed), "eagle.layers", self.layers,
              "must be layer counts >= 1 separated by commas, e.g. 2,4,5 (empty: EAGLE-3's)")
        check(isinstance(self.unroll, int) and self.unroll >= 1, "eagle.unroll", self.unroll,
              "must be an int >= 1")
        check(isinstance(self.decay, (int, float)) and 0 < self.decay <= 1, "eagle.decay",
              self.decay, "must lie in (0, 1]")

    @property
    def steps(self) -> int:
        return self.unroll


class EagleObjective(UnrolledHead):
    """An EAGLE-3 head on the frozen `base`."""

    name: ClassVar[str] = "eagle"
    config_class: ClassVar[type] = EagleConfig
    record_key: ClassVar[str] = "eagle"
    kind: ClassVar[FeatureHeadKind] = EAGLE


HEADS = {"eagle": EagleObjective}


WEIGHTS = "model.safetensors"


def is_eagle3(hf_dir: str) -> bool:
    """Whether `hf_dir`'s config.json describes an EAGLE-3 head (EAGLE's and SpecForge's
    `LlamaForCausalLMEagle3`)."""
    config = read_config_json(hf_dir, "a drafter checkpoint")
    return any("Eagle3" in name for name in config.get("architectures") or [])


def import_eagle(eagle_dir: str, base_workdir: str, workdir: str) -> tuple[int, ...]:
    """Writes a head workdir (step 0, like a trained one: decode it with --strategy eagle) from
    an EAGLE-3 checkpoint as EAGLE and SpecForge publish it for the model in `base_workdir`:
    config.json (`LlamaForCausalLMEagle3`, the sizes, `draft_vocab_size`, the fused layers in
    `eagle_config.eagle_aux_hidden_state_layer_ids`, else EAGLE-3's default) and
    model.safetensors: `fc.weight`, `midlayer.*` (its `self_attn` reading 2 d_model,
    `hidden_norm`, `input_layernorm`, `post_attention_layernorm`, `mlp`), `norm.weight`,
    `lm_head.weight` [V', D] and `d2t` [V'] (target id = draft id + d2t). A head with V' < V
    ids records them as the workdir's draft vocabulary (ranked as the base ranks them, if it
    does; `io.draft_vocab`) and V' as its `draft_vocab` default: it drafts with a V'-row
    product. One-line errors, before anything is written, for a file or size that does not fit
    the base. Returns the fused layers."""
    hf = read_config_json(eagle_dir, "an EAGLE-3 checkpoint")
    if not is_eagle3(eagle_dir):
        raise ValueError(f"{eagle_dir}/config.json: architectures "
                         f"{hf.get('architectures')!r} is not an EAGLE-3 head "
                         "(LlamaForCausalLMEagle3)")
    base = load_base(base_workdir)
    cfg = base.cfg
    for field, want in (("hidden_size", cfg.d_model), ("num_attention_heads", cfg.num_heads),
                        ("num_key_value_heads", cfg.num_kv_heads),
                        ("intermediate_size", cfg.mlp_dim), ("vocab_size", cfg.vocab_size)):
        if hf.get(field, want) != want:
            raise ValueError(f"{eagle_dir}/config.json: {field}={hf[field]} but the base model "
                             f"({base_workdir}) has {want}; specjax's EAGLE-3 layer has the "
                             "base's sizes")
    layers = tuple((hf.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
                   or default_layers(cfg.num_layers))
    if not all(isinstance(e, int) and 1 <= e <= cfg.num_layers for e in layers):
        raise ValueError(f"{eagle_dir}/config.json: eagle_aux_hidden_state_layer_ids "
                         f"{list(layers)} must lie in [1, {cfg.num_layers}]")
    path = os.path.join(eagle_dir, WEIGHTS)
    if not os.path.isfile(path):
        raise ValueError(f"{eagle_dir!r} has no {WEIGHTS} (specjax reads safetensors only, "
                         "never pickled .bin files)")
    with safe_open(path, framework="numpy") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    params = _head_params(tensors, cfg, len(layers), path)
    ids, base_ranking = drafted_ids(params), read_ranking(base_workdir, cfg.vocab_size)
    section = EagleConfig(layers=",".join(map(str, layers)))
    save_imported_head(EagleObjective, section, params, base, workdir,
                       recorded(EAGLE, section, cfg), {"eagle_dir": os.path.abspath(eagle_dir)})
    if ids is not None:
        record = {"source": f"the d2t of {os.path.abspath(eagle_dir)}", "size": len(ids),
                  "ranked_by": "the base's ranking" if base_ranking is not None else "id"}
        write_ranking(workdir, within(base_ranking, ids), record)
        write_calibrated(workdir, 0, {"draft_vocab": len(ids)}, {"draft_vocab": record})
    return layers


def _head_params(tensors: dict[str, np.ndarray], cfg: ModelConfig, fused: int,
                 path: str) -> Params:
    """The head's params from the published tensors, each checked against its shape."""
    d, v = cfg.d_model, cfg.vocab_size

    def get(name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        if name not in tensors:
            raise ValueError(f"{path} lacks {name}")
        if shape is not None and tensors[name].shape != shape:
            raise ValueError(f"{path}: {name} is {tensors[name].shape}, but the base model "
                             f"(hidden_size {d}, {fused} fused layers) needs {shape}")
        return tensors[name]

    hd, heads, kv_heads = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    layout = {"layer": "midlayer.", "mlp_norm": "post_attention_layernorm.", "mlp": "mlp."}
    shapes = {"q_proj": (heads * hd, 2 * d), "k_proj": (kv_heads * hd, 2 * d),
              "v_proj": (kv_heads * hd, 2 * d), "o_proj": (d, heads * hd),
              "gate_proj": (cfg.mlp_dim, d), "up_proj": (cfg.mlp_dim, d),
              "down_proj": (d, cfg.mlp_dim), "post_attention_layernorm": (d,)}

    def leaf(hf_leaf) -> np.ndarray:
        names = [name.format(**layout) for name in hf_leaf.names]
        return hf_leaf.from_hf(cfg, *(get(name, next(s for key, s in shapes.items()
                                                     if key in name)) for name in names))

    by_path = {leaf_.path: leaf_ for leaf_ in ATTENTION_LEAVES + MLP_LEAVES}
    cell = {"attn": {"qkv": leaf(by_path["attn", "qkv"]), "out": leaf(by_path["attn", "out"])},
            "mlp": {"gate_up": leaf(by_path["mlp", "gate_up"]),
                    "down": leaf(by_path["mlp", "down"])},
            "mlp_norm": {"scale": leaf(by_path["mlp_norm", "scale"])},
            "input_norm": {"scale": get("midlayer.input_layernorm.weight", (d,))},
            "hidden_norm": {"scale": get("midlayer.hidden_norm.weight", (d,))}}
    lm_head = get("lm_head.weight")
    if lm_head.ndim != 2 or lm_head.shape[1] != d or lm_head.shape[0] > v:
        raise ValueError(f"{path}: lm_head.weight is {lm_head.shape}, but the base model needs "
                         f"[draft vocabulary <= {v}, {d}]")
    draft = lm_head.shape[0]
    offsets = get("d2t", (draft,)) if "d2t" in tensors or draft != v else np.zeros(draft, int)
    ids = np.arange(draft) + offsets
    if ids.min() < 0 or ids.max() >= v or len(set(ids.tolist())) != draft:
        raise ValueError(f"{path}: d2t maps the draft vocabulary outside [0, {v}) or twice "
                         "onto one token")
    full_head = np.zeros((d, v), np.float32)
    full_head[:, ids] = lm_head.T
    bias = np.full((v,), MASKED_LOGIT, np.float32)
    bias[ids] = 0.0
    dtype = jnp.dtype(cfg.param_dtype)
    head = {"fc": get("fc.weight", (d, fused * d)).T, "cells": {
                name: {k: w[None] for k, w in part.items()} for name, part in cell.items()},
            "norm": {"scale": get("norm.weight", (d,))}, "lm_head": full_head,
            "vocab_bias": bias}
    return jax.tree.map(lambda w: jnp.asarray(np.asarray(w).astype(dtype)), head)
