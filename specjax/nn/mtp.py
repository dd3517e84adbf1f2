"""DeepSeek-V3's multi-token-prediction module (DeepSeek-AI 2024, section 2.2): the previous
depth's feature and the next token's embedding, each normalised, projected to d, then one
Transformer block of the model's attention layer shape.

    x = proj([h_norm(feature); e_norm(emb(token))]);  out = block(x)

A model trained with them (`ModelConfig.mtp_depth`) keeps them in its params (`init_mtp`); a
frozen model gets them as a head (`specjax.heads.mtp`). Either way they draft (`--strategy
mtp`) through `specjax.heads.feature_head`.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.nn.block import DecoderBlock
from specjax.nn.cache import LayerKV
from specjax.nn.linear import matmul
from specjax.nn.norm import RMSNorm
from specjax.nn.rope import Rope, rope_tables


class MtpModule(nn.Module):
    """One MTP module (DeepSeek's `eh_proj`, `hnorm`, `enorm` and block)."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, embedded: jax.Array, feature: jax.Array, rope: Rope, mask: jax.Array,
                 kv: LayerKV | None = None,
                 write_pos: jax.Array | None = None) -> tuple[jax.Array, LayerKV | None]:
        cfg = self.cfg
        proj = self.param("proj", nn.initializers.normal(cfg.init_std),
                          (2 * cfg.d_model, cfg.d_model), cfg.weight_dtype)
        both = jnp.concatenate([RMSNorm(cfg, name="h_norm")(feature),
                                RMSNorm(cfg, name="e_norm")(embedded)], axis=-1)
        return DecoderBlock(cfg, name="block")(matmul(both, proj.astype(cfg.compute_dtype)),
                                               rope, mask, kv, write_pos)


def init_mtp(cfg: ModelConfig, key: jax.Array, depth: int) -> dict:
    """`depth` fresh modules stacked on a leading axis ({"cells": ...}), module k drawn from
    the k-th of `depth` keys."""
    zeros = jnp.zeros((1, 1, cfg.d_model), cfg.compute_dtype)
    rope = rope_tables(cfg, jnp.zeros((1, 1), jnp.int32))
    modules = [MtpModule(cfg).init(k, zeros, zeros, rope, jnp.ones((1, 1, 1), bool))["params"]
               for k in jax.random.split(key, depth)]
    return {"cells": jax.tree.map(lambda *w: jnp.stack(w), *modules)}
