"""EAGLE-3's draft head (Li et al. 2025): the target's hidden states after three layers (low,
mid, high) fused by one linear map, then one Llama decoder layer whose attention reads the
embedding of the token and the feature side by side, then a norm and the head's own vocabulary
projection.

    feature = fc([h_a; h_b; h_c])                                   (the target's positions)
    x = feature + attn([input_norm(emb(token)); hidden_norm(feature)])
    out = x + mlp(mlp_norm(x));  logits = lm_head(norm(out)) + vocab_bias

as EAGLE's `cnets.py` (its `midlayer`, `fc`, `norm`, `lm_head`). Published heads draft from a
reduced vocabulary (`d2t`); specjax stores the head over the target's ids, masking those it
cannot draft with `vocab_bias` (-1e9; 0 for a head trained here), and drafts over its own ids
(`drafted_ids`) as the draft vocabulary its import records: `restrict_vocab` cuts `lm_head` to
those V' columns, a V'-row product. The default layers are EAGLE-3's (2, L // 2, L - 3),
clipped into the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig, layer_numbers
from specjax.heads.vocab_subset import MASKED_LOGIT, DraftVocab
from specjax.model import Params
from specjax.nn.attention import Attention
from specjax.nn.cache import LayerKV
from specjax.nn.linear import matmul
from specjax.nn.mlp import MLP
from specjax.nn.norm import RMSNorm, apply_rms_norm
from specjax.nn.rope import Rope, rope_tables


class Eagle3Layer(nn.Module):
    """EAGLE-3's decoder layer (its `midlayer`); the residual stream is the feature."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, embedded: jax.Array, feature: jax.Array, rope: Rope, mask: jax.Array,
                 kv: LayerKV | None = None,
                 write_pos: jax.Array | None = None) -> tuple[jax.Array, LayerKV | None]:
        cfg = self.cfg
        both = jnp.concatenate([RMSNorm(cfg, name="input_norm")(embedded),
                                RMSNorm(cfg, name="hidden_norm")(feature)], axis=-1)
        attended, kv = Attention(cfg, in_features=2 * cfg.d_model, name="attn")(
            both, rope, mask, kv, write_pos)
        x = feature + attended
        return x + MLP(cfg, name="mlp")(RMSNorm(cfg, name="mlp_norm")(x)), kv


def default_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low, mid and high layer counts (2, L // 2, L - 3), clipped into [1, L]."""
    return tuple(min(max(e, 1), num_layers) for e in (2, num_layers // 2, num_layers - 3))


class EagleKind:
    """EAGLE-3 as a `feature_head.FeatureHeadKind`; settings: `layers`, the exits fused ("2,4,5";
    empty: `default_layers`)."""

    name = "eagle"

    def exits(self, cfg: ModelConfig, settings: Mapping[str, Any]) -> tuple[int, ...]:
        layers = layer_numbers(settings["layers"], "eagle.layers") or default_layers(cfg.num_layers)
        if not all(1 <= e <= cfg.num_layers for e in layers):
            raise ValueError(f"eagle.layers={settings['layers']}: each must lie in [1, "
                             f"num_layers = {cfg.num_layers}]")
        return layers

    def cell(self, cfg: ModelConfig) -> nn.Module:
        return Eagle3Layer(cfg)

    def fuse(self, params: Params, head: Params, cfg: ModelConfig,
             hidden: Sequence[jax.Array]) -> jax.Array:
        both = jnp.concatenate([h.astype(cfg.compute_dtype) for h in hidden], axis=-1)
        return matmul(both, head["fc"].astype(cfg.compute_dtype))

    def logits(self, params: Params, head: Params, cfg: ModelConfig, features: jax.Array,
               vocab: DraftVocab | None = None) -> jax.Array:
        normed = apply_rms_norm(features, head["norm"]["scale"], cfg)
        scores = (matmul(normed, head["lm_head"].astype(cfg.compute_dtype), out_dtype=jnp.float32)
                  + head["vocab_bias"].astype(jnp.float32))
        return scores if vocab is None else vocab.expand(scores)

    def restrict_vocab(self, head: Params, ids: jax.Array) -> Params:
        """`lm_head`'s columns and `vocab_bias` at `ids`."""
        return {**head, "lm_head": head["lm_head"][:, ids], "vocab_bias": head["vocab_bias"][ids]}

    def init(self, params: Params, cfg: ModelConfig, settings: Mapping[str, Any]) -> Params:
        """A fresh layer and fc (seeded by the layers), the target's final norm and
        unembedding as the head's (copies: training may donate the head's buffers)."""
        layers = self.exits(cfg, settings)
        key_fc, key_layer = jax.random.split(jax.random.PRNGKey(sum(layers)))
        zeros = jnp.zeros((1, 1, cfg.d_model), cfg.compute_dtype)
        steps = jnp.zeros((1, 1), jnp.int32)
        layer = Eagle3Layer(cfg).init(key_layer, zeros, zeros, rope_tables(cfg, steps),
                                      jnp.ones((1, 1, 1), bool))["params"]
        unembedding = params["embed"].T if cfg.tie_embeddings else params["unembed"]
        head = {"fc": cfg.init_std * jax.random.normal(
                    key_fc, (len(layers) * cfg.d_model, cfg.d_model), cfg.param_dtype),
                "cells": jax.tree.map(lambda w: w[None], layer),
                "norm": params["final_norm"],
                "lm_head": unembedding.astype(cfg.param_dtype),
                "vocab_bias": jnp.zeros((cfg.vocab_size,), cfg.param_dtype)}
        return jax.tree.map(jnp.copy, head)


EAGLE = EagleKind()


def drafted_ids(head: Params) -> np.ndarray | None:
    """The ascending target ids an EAGLE-3 head drafts: those `vocab_bias` leaves unmasked (a
    published head's d2t, in workdirs imported before and after it was recorded as their draft
    vocabulary); None when it drafts every id."""
    bias = np.asarray(head["vocab_bias"], np.float32)
    ids = np.flatnonzero(bias > MASKED_LOGIT / 2)
    return None if len(ids) == len(bias) else ids
