"""`nn.linear.matmul` on a GPU: a one-row product is computed as a two-row XLA dot (faster on an
H200; docs/results/2026-11-28-gpu-decode.md) whose first row is the product, and nothing else
changes: more rows, TPU and CPU programs keep the plain dot."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.nn import linear


def _lowered(platform, rows, transpose_w=False):
    x = jnp.ones((1, rows, 64), jnp.bfloat16)
    w = jnp.ones((32, 64) if transpose_w else (64, 32), jnp.bfloat16)
    f = functools.partial(linear.matmul, transpose_w=transpose_w)
    return jax.jit(f).trace(x, w).lower(lowering_platforms=(platform,)).as_text()


@pytest.mark.parametrize("transpose_w", [False, True])
def test_only_a_gpu_one_row_product_is_padded_to_two_rows(transpose_w):
    """Catches the padding dropped on a GPU (batch-1 decoding 16% slower there), applied on TPU
    or CPU, or applied to products of several rows (verification, prefill)."""
    assert "tensor<2x64xbf16>" in _lowered("cuda", 1, transpose_w)
    for platform in ("tpu", "cpu"):
        assert "tensor<2x64xbf16>" not in _lowered(platform, 1, transpose_w)
    assert "tensor<2x64xbf16>" not in _lowered("cuda", 5, transpose_w)
    assert "tensor<6x64xbf16>" not in _lowered("cuda", 5, transpose_w)


@pytest.mark.parametrize("transpose_w", [False, True])
def test_the_padded_product_is_the_first_rows_product(transpose_w):
    """Catches the zero row kept in place of the product, or the output reshaped to the wrong
    leading axes: the padded product runs here through the same dot as the GPU's branch."""
    kx, kw = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.normal(kx, (1, 1, 40))
    w = jax.random.normal(kw, (24, 40) if transpose_w else (40, 24))
    dot = functools.partial(linear._dot, transpose_w=transpose_w, out_dtype=None)
    padded = linear._as_two_rows(dot, x, w)
    assert padded.shape == (1, 1, 24)
    np.testing.assert_allclose(padded, dot(x, w), rtol=1e-6, atol=1e-6)


def test_a_one_row_product_exports_for_tpu_and_gpu():
    """Catches a GPU branch that cannot be lowered beside TPU's (one exported program serves
    both)."""
    x, w = jnp.ones((1, 1, 64), jnp.bfloat16), jnp.ones((64, 32), jnp.bfloat16)
    exported = jax.export.export(jax.jit(linear.matmul), platforms=("tpu", "cuda"))(x, w)
    assert exported.out_avals[0].shape == (1, 1, 32)
