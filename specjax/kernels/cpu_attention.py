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

MAX_TOKENS = 64  # new tokens per call the kernel takes (decoding, verification); more: prefill
_TARGET = "specjax_cached_attention_f32"


def available() -> bool:
    """Whether cached attention traced now goes to the kernel (`library.available`)."""
    return library.available("cpu_attention.cc", "SpecjaxCachedAttentionF32", _TARGET,
                             "SPECJAX_CPU_ATTENTION")


def cached_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                     scale: float) -> jax.Array:
    """softmax(scale * q k^T over the visible slots) v, float32, on the CPU kernel; requires
    `available()`. q [B*H, G*T, Dh] (row g*T + t: head g of the group, token t), the cache's
    k, v [B*H, S, Dh], mask [B, T, S] (True: visible). Each query row's result is bitwise
    independent of the other rows and tokens and of what hidden slots hold."""
    call = jax.ffi.ffi_call(_TARGET, jax.ShapeDtypeStruct(q.shape, np.float32),
                            vmap_method="sequential")
    return call(q, k, v, mask, scale=np.float32(scale))
