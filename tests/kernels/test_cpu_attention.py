"""The CPU attention kernel for decoding (its build: test_kernel_library.py): it matches a float64
reference, gives each query a result independent of the other queries and of hidden slots (the
lossless loop relies on it), is what cached attention runs on CPU (never in GPU/TPU exports or
prefill), and keeps greedy decoding identical to a per-step argmax of the model."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType

from specjax import model as M
from specjax.config import ModelConfig
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.decoding.engine import Generator
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.kernels import cpu_attention, cpu_matmul, library
from specjax.nn.attention import Attention
from specjax.nn.cache import LayerKV
from specjax.nn.rope import rope_tables
from tests.support.kernels import KERNEL_BUILDS, kernel_build

needs_kernel = pytest.mark.skipif(not cpu_attention.available(), reason="no C++ compiler")
# (batch, kv heads, group, tokens, slots, head_dim): head_dim 64 and 128 (whole vectors), 32,
# 24 and 8 (tails); slot counts that end mid-block.
SHAPES = [(1, 2, 2, 1, 45, 64), (2, 2, 3, 5, 37, 24), (1, 1, 1, 9, 70, 8),
          (2, 1, 2, 7, 130, 128), (1, 2, 2, 33, 64, 32)]


def _operands(batch, heads, group, steps, slots, dim, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(batch * heads, group * steps, dim)).astype(np.float32)
    k, v = (rng.normal(size=(batch * heads, slots, dim)).astype(np.float32) for _ in range(2))
    mask = rng.random((batch, steps, slots)) < 0.5
    mask[..., 0] = True
    return q, k, v, mask


def _kernel(q, k, v, mask, build="native"):
    attend = functools.partial(cpu_attention.cached_attention, scale=q.shape[-1] ** -0.5,
                               target=kernel_build(cpu_attention, build))
    return np.asarray(jax.jit(attend)(q, k, v, mask))


def _reference(q, k, v, mask):
    """float64 softmax attention over the visible slots, in the kernel's layout."""
    rows, queries, dim = q.shape
    batch, steps, _ = mask.shape
    scores = np.einsum("nqd,nsd->nqs", q.astype(np.float64), k.astype(np.float64)) * dim ** -0.5
    visible = np.repeat(mask, rows // batch, axis=0)  # [N, T, S]
    visible = np.tile(visible, (1, queries // steps, 1))  # row g * T + t sees mask[b, t]
    scores = np.where(visible, scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("nqs,nsd->nqd", weights, v.astype(np.float64))


@needs_kernel
@pytest.mark.parametrize("build", KERNEL_BUILDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_kernel_matches_float64_reference(shape, build):
    q, k, v, mask = _operands(*shape)
    np.testing.assert_allclose(_kernel(q, k, v, mask, build), _reference(q, k, v, mask),
                               rtol=2e-5, atol=2e-6)


@needs_kernel
def test_a_query_that_sees_nothing_gets_zeros():
    q, k, v, mask = _operands(1, 2, 2, 3, 40, 32)
    mask[0, 1] = False
    out = _kernel(q, k, v, mask)
    assert np.all(out[:, [1, 4]] == 0) and np.all(np.isfinite(out))


@needs_kernel
@pytest.mark.parametrize("build", KERNEL_BUILDS)
@pytest.mark.parametrize("dim", [64, 24, 8])
def test_each_query_is_bitwise_independent_of_the_others_and_of_hidden_slots(dim, build):
    """What verification relies on: a drafted token's attention has the bits of decoding it
    alone. Token t of a tree-shaped call sees a prefix of 40 + t slots; tokens 2 and 5 each
    also see 8 slots far beyond it (one block more, with 16 lanes or 8), so token 5's far block
    is one block later in the call than alone. Catches any sum whose order follows the call
    rather than the query (e.g. the softmax's sum kept in two accumulators alternating over the
    blocks visited: 32 queries of token 5 with 8 lanes each exposed), and hidden slots that leak
    (their contents replaced by large finite garbage)."""
    batch, heads, group, steps, slots = 2, 4, 4, 6, 170
    mask = np.zeros((batch, steps, slots), bool)
    for t in range(steps):
        mask[:, t, :40 + t] = True
    mask[:, 2, 96:104] = mask[:, 5, 128:136] = True
    mask[1, :, :5] = False  # a ragged row: its prompt starts later
    seen = np.repeat(mask.any(1), heads, axis=0)[..., None]
    for seed in (1, 2):
        q, k, v, _ = _operands(batch, heads, group, steps, slots, dim, seed=seed)
        together = _kernel(q, k, v, mask, build)
        garbage = np.where(seen, 0, 1e4).astype(np.float32)
        np.testing.assert_array_equal(_kernel(q, k + garbage, v - garbage, mask, build),
                                      together)
        rows, split = q.reshape(batch * heads, group, steps, dim), together.reshape(-1, group,
                                                                                    steps, dim)
        for t in range(steps):  # each token alone
            alone = _kernel(rows[:, :, t], k, v, mask[:, t:t + 1], build)
            np.testing.assert_array_equal(alone, split[:, :, t])
        for g in (0, group - 1):  # a head of the group alone
            np.testing.assert_array_equal(_kernel(rows[:, g], k, v, mask, build), split[:, g])
        for b in range(batch):  # each sequence alone
            n = slice(b * heads, (b + 1) * heads)
            np.testing.assert_array_equal(_kernel(q[n], k[n], v[n], mask[b:b + 1], build),
                                          together[n])


def _cached_attention(cfg, steps, dtype=jnp.float32):
    """An attention layer's call against a cache of 40 slots, `steps` new tokens."""
    layer = Attention(cfg)
    x = jnp.zeros((1, steps, cfg.d_model), dtype)
    positions = jnp.arange(steps)[None]
    params = layer.init(jax.random.PRNGKey(0), x, rope_tables(cfg, positions),
                        jnp.ones((1, steps, steps), bool))["params"]
    kv = LayerKV(jnp.zeros((cfg.num_kv_heads, 40, cfg.head_dim), dtype),
                 jnp.zeros((cfg.num_kv_heads, 40, cfg.head_dim), dtype))

    def call(params, x, kv):
        mask = jnp.arange(40)[None, None] <= positions[..., None]
        return layer.apply({"params": params}, x, rope_tables(cfg, positions), mask, kv,
                           jnp.zeros((1,), jnp.int32))[0]
    return call, (params, x, kv)


@needs_kernel
def test_cached_attention_routes_decoding_to_the_kernel():
    """Decoding and verification (float32, at most MAX_TOKENS new tokens) on CPU in a program for
    one device; not prefill, not bfloat16, not on a mesh of several devices (both kernels: XLA
    would gather their operands onto every device), never in a program exported for GPU/TPU."""
    target = cpu_attention.TARGET
    cfg = ModelConfig(vocab_size=16, d_model=64, num_layers=1, num_heads=2, num_kv_heads=1,
                      mlp_dim=32)
    call, args = _cached_attention(cfg, 3)
    assert target in jax.jit(call).lower(*args).as_text()
    mesh = AbstractMesh((2,), ("data",), axis_types=(AxisType.Auto,))
    with jax.sharding.use_abstract_mesh(mesh):
        on_mesh = jax.jit(call).trace(*args).lower().as_text()
    assert target not in on_mesh and cpu_matmul.TARGET not in on_mesh
    exported = jax.export.export(jax.jit(call), platforms=("tpu", "cuda"))(*args)
    assert target not in exported.mlir_module()
    call, args = _cached_attention(cfg, cpu_attention.MAX_TOKENS + 1)
    assert target not in jax.jit(call).lower(*args).as_text()
    bf16 = ModelConfig(**{**cfg.to_dict(), "dtype": "bfloat16", "param_dtype": "bfloat16"})
    call, args = _cached_attention(bf16, 3, jnp.bfloat16)
    assert target not in jax.jit(call).lower(*args).as_text()


@needs_kernel
def test_cached_attention_differentiates_like_xla():
    """The kernel has no derivative of its own: catches a routing that makes a cached layer
    impossible to differentiate (its gradient is XLA's attention's)."""
    cfg = ModelConfig(vocab_size=16, d_model=64, num_layers=1, num_heads=2, num_kv_heads=1,
                      mlp_dim=32)
    call, (params, x, kv) = _cached_attention(cfg, 3)
    x = jax.random.normal(jax.random.PRNGKey(1), x.shape)
    loss = lambda params, x: jnp.sum(jnp.sin(call(params, x, kv)))  # noqa: E731
    grads = jax.jit(jax.grad(loss, (0, 1)))(params, x)
    with library.xla_only(cpu_attention.SOURCE):
        reference = jax.jit(jax.grad(lambda *a: loss(*a), (0, 1)))(params, x)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(reference), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@needs_kernel
def test_greedy_decoding_on_the_kernel_is_a_per_step_argmax_of_the_model():
    """A model whose head_dim (64) takes the kernel's vector paths: `ar`, a chain and a tree
    decode the tokens a per-step argmax of `model.forward` (XLA's attention, no cache) picks.
    Catches a kernel that misreads which mask row a query reads (its token) or the group
    layout in real decoding."""
    cfg = ModelConfig(vocab_size=64, d_model=128, num_layers=3, num_heads=4, num_kv_heads=2,
                      mlp_dim=96, init_std=0.3)
    params = M.init_params(cfg, jax.random.PRNGKey(3))
    generator = Generator(params, cfg)
    prompts, new = [[1, 2, 3, 4, 5, 6, 7], [9, 8]], 20
    ar = generator.generate(prompts, max_new_tokens=new).tokens

    @jax.jit
    def next_token(sequence, length):
        return jnp.argmax(M.forward(params, cfg, sequence[None])[0, length - 1])

    for prompt, generated in zip(prompts, ar, strict=True):
        sequence = list(prompt)
        for _ in range(new):
            padded = jnp.asarray(sequence + [0] * (len(prompt) + new - len(sequence)))
            sequence.append(int(next_token(padded, len(sequence))))
        assert generated == sequence[len(prompt):]
    for shape in (Chain(4), StaticTree.from_branching((2, 2, 1))):
        out = generator.generate(prompts, max_new_tokens=new,
                                 strategy=SelfSpeculative(1, shape))
        assert out.tokens == ar
