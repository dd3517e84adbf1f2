"""The model's products with a weight matrix, routed to the fastest kernel for the shape.

A few-row float32 product on CPU (decoding: one row per sequence, or K+1 drafted tokens) in a
one-device program goes to the multi-threaded kernel of `specjax.kernels.cpu_matmul` where it
measured faster than XLA's dot on this CPU (`kernels.decision`); everything else (training,
prefill, bf16, meshes, GPU, TPU) is XLA's dot. On a GPU a one-row product (batch-1 decoding)
is computed as a two-row one, the second row zeros: XLA's kernels for two rows read the 1B
config's matrices at 2.4 TB/s on one H200 where those for one row read 1.4, and batch-1 decoding
ran 16% faster (docs/results/2026-11-28-gpu-decode.md). The choice is made when tracing (shapes,
dtypes, mesh, platform, the cached measurement), so it costs nothing at run time, and
`lax.platform_dependent` keeps programs lowered or exported for GPU/TPU free of the CPU kernel
(and TPU's of the GPU's padding). Gradients go through XLA's dot.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from specjax.devices import traced_for_one_device
from specjax.kernels import cpu_matmul


def matmul(x: jax.Array, w: jax.Array, *, transpose_w: bool = False,
           out_dtype: jnp.dtype | None = None) -> jax.Array:
    """x [..., K] times w [K, N] (w [N, K], contracted on its last axis, when `transpose_w`):
    [..., N], accumulated in and returned as `out_dtype` (default x's dtype)."""
    rows = math.prod(x.shape[:-1])
    n = w.shape[0] if transpose_w else w.shape[1]
    if (x.dtype != jnp.float32 or w.dtype != jnp.float32
            or out_dtype not in (None, jnp.float32) or not traced_for_one_device()
            or not cpu_matmul.chosen(rows, x.shape[-1], n, transpose_w, _xla_matmul)):
        return _xla_matmul(x, w, transpose_w, out_dtype)
    flat = _cpu_or_xla(x.reshape(rows, x.shape[-1]), w, transpose_w)
    return flat.reshape(*x.shape[:-1], flat.shape[-1])


def _xla_matmul(x: jax.Array, w: jax.Array, transpose_w: bool,
                out_dtype: jnp.dtype | None = None) -> jax.Array:
    dot = functools.partial(_dot, transpose_w=transpose_w, out_dtype=out_dtype)
    if math.prod(x.shape[:-1]) != 1:
        return dot(x, w)
    return jax.lax.platform_dependent(x, w, cuda=lambda x, w: _as_two_rows(dot, x, w),
                                      default=dot)


def _dot(x: jax.Array, w: jax.Array, transpose_w: bool,
         out_dtype: jnp.dtype | None) -> jax.Array:
    return jnp.einsum("...k,nk->...n" if transpose_w else "...k,kn->...n", x, w,
                      preferred_element_type=out_dtype)


def _as_two_rows(dot: Callable[[jax.Array, jax.Array], jax.Array], x: jax.Array,
                 w: jax.Array) -> jax.Array:
    """`dot` of a one-row x, computed on x and a row of zeros and the first row kept."""
    row = x.reshape(1, x.shape[-1])
    out = dot(jnp.concatenate([row, jnp.zeros_like(row)]), w)[:1]
    return out.reshape(*x.shape[:-1], out.shape[-1])


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _cpu_or_xla(x: jax.Array, w: jax.Array, transpose_w: bool) -> jax.Array:
    return jax.lax.platform_dependent(
        x, w, cpu=lambda x, w: cpu_matmul.small_matmul(x, w, transpose_w),
        default=lambda x, w: _xla_matmul(x, w, transpose_w))


@_cpu_or_xla.defjvp
def _cpu_or_xla_jvp(transpose_w, primals, tangents):
    (x, w), (dx, dw) = primals, tangents
    return (_cpu_or_xla(x, w, transpose_w),
            _xla_matmul(dx, w, transpose_w) + _xla_matmul(x, dw, transpose_w))
