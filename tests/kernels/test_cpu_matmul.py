"""The multi-threaded few-row CPU matmul (its build: test_kernel_library.py): it matches a float64
reference, gives each row a result independent of the other rows (the lossless loop relies on
it), is deterministic under concurrent calls, differentiates, and stays out of GPU/TPU exports."""

import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.kernels import cpu_matmul
from specjax.nn.linear import matmul
from tests.support.kernels import KERNEL_BUILDS, kernel_build

needs_kernel = pytest.mark.skipif(not cpu_matmul.available(), reason="no C++ compiler")
SHAPES = [(1, 37, 53), (3, 256, 1030), (7, 64, 8), (16, 131, 259)]  # (rows, K, N): ragged tails


def _operands(rows, k, n, transposed, seed=0):
    kx, kw = jax.random.split(jax.random.PRNGKey(seed))
    w_shape = (n, k) if transposed else (k, n)
    return jax.random.normal(kx, (rows, k)), jax.random.normal(kw, w_shape) / k ** 0.5


@needs_kernel
@pytest.mark.parametrize("build", KERNEL_BUILDS)
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("rows,k,n", SHAPES)
def test_kernel_matches_float64_reference(rows, k, n, transposed, build):
    x, w = _operands(rows, k, n, transposed)
    call = functools.partial(cpu_matmul.small_matmul, target=kernel_build(cpu_matmul, build))
    got = jax.jit(call, static_argnums=2)(x, w, transposed)
    w64 = np.asarray(w, np.float64)
    want = np.asarray(x, np.float64) @ (w64.T if transposed else w64)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("build", KERNEL_BUILDS)
@pytest.mark.parametrize("transposed", [False, True])
def test_each_row_is_bitwise_independent_of_the_others(transposed, build):
    """Catches a code path chosen by row count (registers for 1-2 rows, streaming for more)
    that sums in another order or fuses differently: rows must not depend on M."""
    x, w = _operands(16, 131, 1078, transposed)  # 1024 + 48 + 6: every column path
    call = jax.jit(functools.partial(cpu_matmul.small_matmul,
                                     target=kernel_build(cpu_matmul, build)), static_argnums=2)
    together = np.asarray(call(x, w, transposed))
    for rows in (slice(0, 1), slice(5, 12), slice(3, 4), slice(8, 10), slice(1, 4)):
        np.testing.assert_array_equal(np.asarray(call(x[rows], w, transposed)), together[rows])


@needs_kernel
def test_concurrent_calls_are_deterministic():
    """Products issued from several threads at once share one pool (the losers of the race run
    the same parts serially); every result is bitwise the single-call result."""
    x, w = _operands(4, 512, 768, False)
    call = jax.jit(cpu_matmul.small_matmul, static_argnums=2)
    want = np.asarray(call(x, w, False))
    results = []

    def worker():
        results.extend(np.asarray(call(x, w, False)) for _ in range(20))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 80
    for got in results:
        np.testing.assert_array_equal(got, want)


@needs_kernel
def test_matmul_routes_few_float32_rows_to_the_kernel():
    x, w = _operands(1, 32, 48, False)
    target = "specjax_small_matmul_f32"
    assert target in jax.jit(matmul).lower(x[None], w).as_text()
    assert target not in jax.jit(matmul).lower(jnp.tile(x, (17, 1)), w).as_text()
    assert target not in jax.jit(matmul).lower(x.astype(jnp.bfloat16),
                                               w.astype(jnp.bfloat16)).as_text()
    exported = jax.export.export(jax.jit(matmul), platforms=("tpu", "cuda"))(x, w)
    assert target not in exported.mlir_module()


@pytest.mark.parametrize("transpose_w", [False, True])
def test_matmul_values_and_gradients_match_xla(transpose_w):
    x, w = _operands(3, 40, 24, transpose_w)
    x = x.reshape(1, 3, 40)
    reference = lambda x, w: jnp.einsum("btk,nk->btn" if transpose_w else "btk,kn->btn", x, w)
    ours = lambda x, w: matmul(x, w, transpose_w=transpose_w)
    np.testing.assert_allclose(ours(x, w), reference(x, w), rtol=1e-5, atol=1e-5)
    loss = lambda f: lambda x, w: jnp.sum(jnp.sin(f(x, w)))
    grads = [jax.grad(loss(f), (0, 1))(x, w) for f in (ours, reference)]
    for got, want in zip(*grads, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
