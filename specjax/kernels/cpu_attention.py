"""Attention of a few new tokens over a KV cache for XLA:CPU decoding (cpu_attention.cc).

XLA:CPU computes a cached layer's masked softmax over every slot of the cache in several fused
loops, each dispatched on its own: tens of microseconds a layer for one decode step, however
little of the cache is filled. The kernel attends each query over the slots its mask shows, in
one pass on the calling thread. Built on first use (`library`); `decision` picks it per shape
class (`SPECJAX_CPU_ATTENTION`: auto, 1 or 0).

Measured on the default model: XLA took 12 us a layer for one token at 512 slots, about 30%
of an `ar` token. Per kv head the kernel scores the blocks of slots some new token sees, up to
8 queries at once while a block's keys sit in L1 (one query at a time was 2.5x slower on
verification's 14 queries), then a vectorised `exp` (Cephes' polynomial, about 1 ulp) and the
weighted values in registers. A query's bits are independent of the other queries, tokens and
rows of the call (cpu_attention.cc), tested for the 16- and the 8-lane build. A query that sees
nothing gets zeros (XLA's ops: the mean of the values; in decoding every query sees itself).
Prefill (more than `MAX_TOKENS` tokens), other dtypes and meshes of several devices use XLA's
ops; the derivative is XLA's attention's (`nn.attention`, `custom_jvp`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import jax
import numpy as np

from specjax.kernels import decision, library

# New tokens per call the kernel takes (decoding, verification; more: prefill, XLA). Measured
# (bench/attention_bench.py, default model, 512 slots): at most as slow as XLA up to 48 tokens
# whatever the cache's fill; at 64 tokens 7% slower with 440 slots filled.
MAX_TOKENS = 48
TOKEN_CLASSES = (1, 8, 16, 32, MAX_TOKENS)  # calls are measured against XLA at these counts
SOURCE = "cpu_attention.cc"  # in this folder; its FFI handler SYMBOL registers as TARGET
SYMBOL = "SpecjaxCachedAttentionF32"
TARGET = "specjax_cached_attention_f32"
SWITCH = "SPECJAX_CPU_ATTENTION"  # set to 0: XLA's own ops


def available() -> bool:
    """Whether cached attention traced now goes to the kernel (`library.available`)."""
    return library.available(SOURCE, SYMBOL, TARGET, SWITCH)


def cached_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                     scale: float, target: str = TARGET) -> jax.Array:
    """softmax(scale * q k^T over the visible slots) v, float32, on the CPU kernel; requires
    `available()`. q [B*H, G*T, Dh] (row g*T + t: head g of the group, token t), the cache's
    k, v [B*H, S, Dh], mask [B, T, S] (True: visible). Each query row's result is bitwise
    independent of the other rows and tokens and of what hidden slots hold. `target`: a
    variant build's FFI target (`library.load`)."""
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(q.shape, np.float32),
                            vmap_method="sequential")
    return call(q, k, v, mask.astype(bool), scale=np.float32(scale))


Attend = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]  # (q, k, v, mask)


def chosen(batch: int, kv_heads: int, group: int, tokens: int, slots: int, head_dim: int,
           xla: Attend) -> bool:
    """Whether a cached layer's attention of `tokens` new tokens (layouts: `cached_attention`)
    runs on the kernel: few tokens, the kernel available, and `decision` picks it (against
    `xla`, XLA's attention, measured at the token class's largest size)."""
    if tokens > MAX_TOKENS or not available():
        return False
    tokens = decision.class_of(tokens, TOKEN_CLASSES)
    shape = (batch, kv_heads, group, tokens, slots, head_dim)
    return decision.use_kernel(
        "attention", SWITCH, library.decisions_file(SOURCE),
        f"batch {batch}, {kv_heads}x{group} heads of {head_dim}, {tokens} tokens, {slots} slots",
        lambda: _measure(shape, xla))


def _measure(shape: tuple[int, ...], xla: Attend) -> decision.Ratios:
    """XLA's time over the kernel's with the cache a quarter, half and three quarters filled
    (typical: their mean) and, at worst, also full (the kernel reads only filled slots; XLA
    reads them all)."""
    batch, kv_heads, group, tokens, slots, head_dim = shape
    tokens = min(tokens, slots)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((batch * kv_heads, group * tokens, head_dim), dtype=np.float32)
    k, v = (rng.standard_normal((batch * kv_heads, slots, head_dim), dtype=np.float32)
            for _ in range(2))
    fills = [min(slots * quarter // 4, slots - tokens) for quarter in (1, 2, 3, 4)]
    masks = [np.broadcast_to(np.arange(slots) < fill + 1 + np.arange(tokens)[:, None],
                             (batch, tokens, slots)) for fill in fills]
    scale = head_dim ** -0.5
    ratios = decision.ratios_per_call(
        {"xla": xla, "kernel": lambda q, k, v, mask: cached_attention(q, k, v, mask, scale)},
        [(q, k, v, mask) for mask in masks])
    per_fill = [r["kernel"] for r in ratios]
    return {"typical": statistics.mean(per_fill[:3]), "worst": min(per_fill)}
