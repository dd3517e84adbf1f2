"""Grouped-query self-attention, with or without a KV cache.

The fused projection kernel is [d_model, num_kv_heads, group + 2, head_dim]: for each kv head, its
`group` query heads, then its key and its value. One matrix-vector product reads all of it during
decoding, and a tensor-parallel mesh can shard the kv-head axis without splitting a group.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.devices import traced_for_one_device
from specjax.kernels import cpu_attention
from specjax.nn.cache import LayerKV
from specjax.nn.linear import matmul
from specjax.nn.mlp import residual_init_std
from specjax.nn.norm import apply_rms_norm, norm_init
from specjax.nn.rope import Rope, apply_rope

_MASKED = float(jnp.finfo(jnp.float32).min)


class Attention(nn.Module):
    """Self-attention over the new tokens plus, when `kv` is given, the cached ones.

    Without a cache, `mask` is [1 or B, T, T] over the new tokens. With a cache, the new keys and
    values are written at slots `write_pos[b] + t` (or at `write_pos[b, t]` when it is [B, T])
    and `mask` is [B, T, max_len] over cache slots. `in_features`: the width of x (0: d_model;
    EAGLE-3's layer attends from the embedding and the feature side by side, 2 * d_model).
    """

    cfg: ModelConfig
    in_features: int = 0

    @nn.compact
    def __call__(self, x: jax.Array, rope: Rope | None, mask: jax.Array,
                 kv: LayerKV | None = None,
                 write_pos: jax.Array | None = None) -> tuple[jax.Array, LayerKV | None]:
        cfg = self.cfg
        batch, steps, _ = x.shape
        kv_heads, group, head_dim = cfg.num_kv_heads, cfg.group_size, cfg.head_dim
        qkv = self.param("qkv", nn.initializers.normal(cfg.init_std),
                         (self.in_features or cfg.d_model, kv_heads, group + 2, head_dim),
                         cfg.weight_dtype)
        out = self.param("out", nn.initializers.normal(residual_init_std(cfg)),
                         (kv_heads, group, head_dim, cfg.d_model), cfg.weight_dtype)

        weights = {"qkv": qkv}
        if cfg.attention_bias:
            weights["qkv_bias"] = self.param("qkv_bias", nn.initializers.zeros,
                                             (kv_heads, group + 2, head_dim), cfg.weight_dtype)
        if cfg.qk_norm:
            for name in ("q_norm", "k_norm"):
                weights[name] = self.param(name, norm_init(cfg), (head_dim,), cfg.weight_dtype)
        q, k, v = project(cfg, x, weights, rope)
        if kv is not None:
            kv = _write(kv, k, v, write_pos, kv_heads)
            k, v = kv.k, kv.v

        if kv is not None and _on_kernel(cfg, q, k, batch, steps):
            attended = _kernel_or_xla(cfg, q, k, v,
                                      jnp.broadcast_to(mask, (batch, steps, mask.shape[-1])))
        else:
            attended = _attend(cfg, q, k, v, mask)
        attended = attended.reshape(batch, kv_heads, group, steps, head_dim)
        attended = attended.transpose(0, 3, 1, 2, 4)
        out = out.reshape(-1, cfg.d_model).astype(cfg.compute_dtype)
        return matmul(attended.reshape(batch, steps, -1), out), kv


def _on_kernel(cfg: ModelConfig, q: jax.Array, k: jax.Array, batch: int, steps: int) -> bool:
    """Whether a cached layer's attention runs on the CPU kernel (`kernels.cpu_attention`):
    float32, a few new tokens (decoding, verification; not prefill), one device, the kernel
    available and measured faster than `_attend` on this CPU. The choice is made when tracing;
    `lax.platform_dependent` keeps GPU/TPU programs on `_attend`."""
    return (q.dtype == k.dtype == jnp.float32 and cfg.attn_softcap is None
            and traced_for_one_device()
            and cpu_attention.chosen(batch, cfg.num_kv_heads, cfg.group_size, steps, k.shape[1],
                                     cfg.head_dim, functools.partial(_attend, cfg)))


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _kernel_or_xla(cfg: ModelConfig, q: jax.Array, k: jax.Array, v: jax.Array,
                   mask: jax.Array) -> jax.Array:
    """`_attend` on the CPU kernel (mask [B, T, S]); its derivative is `_attend`'s."""
    return jax.lax.platform_dependent(
        q, k, v, mask, default=functools.partial(_attend, cfg),
        cpu=functools.partial(cpu_attention.cached_attention, scale=score_scale(cfg)))


@_kernel_or_xla.defjvp
def _kernel_or_xla_jvp(cfg, primals, tangents):
    q, k, v, mask = primals
    _, tangent = jax.jvp(lambda q, k, v: _attend(cfg, q, k, v, mask), (q, k, v), tangents[:3])
    return _kernel_or_xla(cfg, *primals), tangent


def _attend(cfg: ModelConfig, q: jax.Array, k: jax.Array, v: jax.Array,
            mask: jax.Array) -> jax.Array:
    """softmax(q k^T * `score_scale`) v over the slots `mask` [1 or B, T, S] shows (scores
    soft-capped where the config says), in XLA: queries [B*K, G*T, Dh] (`project`'s layout),
    keys and values [B*K, S, Dh]; the same layout out."""
    rows, queries, _ = q.shape
    steps = mask.shape[1]
    scores = jnp.einsum("nqd,nsd->nqs", q, k, preferred_element_type=jnp.float32)
    scores = scores.reshape(-1, cfg.num_kv_heads, queries // steps, steps,
                            k.shape[1]) * score_scale(cfg)
    scores = softcap(scores, cfg.attn_softcap)
    scores = jnp.where(mask[:, None, None], scores, _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(cfg.compute_dtype)
    return jnp.einsum("nqs,nsd->nqd", probs.reshape(rows, queries, -1), v)


def score_scale(cfg: ModelConfig) -> float:
    """What attention scores are multiplied by: 1 / sqrt(head_dim), or Gemma's
    1 / sqrt(query_pre_attn_scalar)."""
    return (cfg.query_pre_attn_scalar or cfg.head_dim) ** -0.5


def softcap(x: jax.Array, cap: float | None) -> jax.Array:
    """cap * tanh(x / cap): Gemma's soft-capping of scores and logits (x itself without a
    cap)."""
    return x if cap is None else cap * jnp.tanh(x / cap)


def project(cfg: ModelConfig, x: jax.Array, weights: dict,
            rope: Rope | None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Queries [B*K, G*T, Dh] and keys, values [B*K, T, Dh] of normalised inputs x [B, T, in],
    rotated and in the cache's merged batch-and-kv-head layout (see cache.py); `weights`: the
    layer's "qkv" and, where the config has them, "qkv_bias", "q_norm" and "k_norm". Shared by
    the layer and by CALM's state propagation (`write_kv`), so both write the same K/V."""
    batch, steps, _ = x.shape
    kv_heads, group, head_dim = cfg.num_kv_heads, cfg.group_size, cfg.head_dim
    qkv = weights["qkv"]
    # Matmuls against weights reshaped to 2D (free): an einsum over several weight axes can
    # make XLA re-lay the weight out in memory on every decode step.
    y = matmul(x, qkv.reshape(qkv.shape[0], -1).astype(cfg.compute_dtype)).reshape(
        batch, steps, kv_heads, group + 2, head_dim)
    if "qkv_bias" in weights:
        y = y + weights["qkv_bias"].astype(y.dtype)
    q, k, v = y[:, :, :, :group], y[:, :, :, group], y[:, :, :, group + 1]
    if cfg.qk_norm:  # per head, before RoPE (Qwen3)
        q, k = apply_rms_norm(q, weights["q_norm"], cfg), apply_rms_norm(k, weights["k_norm"], cfg)
    q = apply_rope(q, rope)                               # [B, T, K, G, Dh]
    k = apply_rope(k, rope)                               # [B, T, K, Dh]
    q = q.transpose(0, 2, 3, 1, 4).reshape(batch * kv_heads, group * steps, head_dim)
    k = k.transpose(0, 2, 1, 3).reshape(batch * kv_heads, steps, head_dim)
    v = v.transpose(0, 2, 1, 3).reshape(batch * kv_heads, steps, head_dim)
    return q, k, v


def write_kv(cfg: ModelConfig, attn_params: dict, x: jax.Array, rope: Rope | None,
             kv: LayerKV, write_pos: jax.Array) -> LayerKV:
    """The cache after writing the K/V an attention layer (params `attn_params`) projects from
    normalised inputs x [B, T, D], without attending: CALM's state propagation."""
    _, k, v = project(cfg, x, attn_params, rope)
    return _write(kv, k, v, write_pos, cfg.num_kv_heads)


def _write(kv: LayerKV, k: jax.Array, v: jax.Array, write_pos: jax.Array,
           kv_heads: int) -> LayerKV:
    """Scatters new keys/values [B*K, T, Dh] into the cache at slots write_pos[b] + t (write_pos
    [B]) or write_pos[b, t] (write_pos [B, T]), in place.

    Writes past the end of the buffer are dropped; callers size the cache so that rows still
    generating never reach it.
    """
    rows = jnp.arange(k.shape[0])[:, None]
    if write_pos.ndim == 1:
        write_pos = write_pos[:, None] + jnp.arange(k.shape[1])[None, :]
    slots = jnp.repeat(write_pos, kv_heads, axis=0)
    return LayerKV(kv.k.at[rows, slots].set(k, mode="drop"),
                   kv.v.at[rows, slots].set(v, mode="drop"))
