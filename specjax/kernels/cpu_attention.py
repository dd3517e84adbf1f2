"""Attention of a few new tokens over a KV cache for XLA:CPU decoding (cpu_attention.cc).

XLA:CPU computes a cached layer's masked softmax over every slot of the cache in several fused
loops, each dispatched on its own: tens of microseconds a layer for one decode step, however
little of the cache is filled. The kernel attends each query over the slots its mask shows, in
one pass on the calling thread. Built on first use (`library`); `SPECJAX_CPU_ATTENTION=0`
leaves XLA's ops in place.
"""

from __future__ import annotations

import jax
import numpy as np

from specjax.kernels import library

# New tokens per call the kernel takes (decoding, verification; more: prefill, XLA). Measured
# (infer/attention_bench.py, default model, 512 slots): at most as slow as XLA up to 48 tokens
# whatever the cache's fill; at 64 tokens 7% slower with 440 slots filled.
MAX_TOKENS = 48
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
