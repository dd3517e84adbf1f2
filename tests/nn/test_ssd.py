"""Mamba-2's SSD core: the chunked scan, the recurrent step and the quadratic reference agree
with each other and with the recurrence written out in float64 numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.nn.ssd import segsum, ssd_chunked, ssd_fold, ssd_reference, ssd_step, ssd_tree

BATCH, LENGTH, HEADS, WIDTH, GROUPS, STATE = 2, 13, 4, 3, 2, 5


def inputs(seed=0, length=LENGTH):
    keys = jax.random.split(jax.random.PRNGKey(seed), 6)
    x = jax.random.normal(keys[0], (BATCH, length, HEADS, WIDTH))
    dt = jax.nn.softplus(jax.random.normal(keys[1], (BATCH, length, HEADS)))
    A = -jnp.exp(jax.random.normal(keys[2], (HEADS,)))
    B = jax.random.normal(keys[3], (BATCH, length, GROUPS, STATE))
    C = jax.random.normal(keys[4], (BATCH, length, GROUPS, STATE))
    h0 = jax.random.normal(keys[5], (BATCH, HEADS, WIDTH, STATE))
    return x, dt, A, B, C, h0


def numpy_recurrence(x, dt, A, B, C, h0):
    """state_t = exp(dt_t A) state_{t-1} + dt_t x_t B_t^T, y_t = state_t C_t, per head, head
    h reading group h // (HEADS // GROUPS)."""
    x, dt, A, B, C, h0 = (np.asarray(t, np.float64) for t in (x, dt, A, B, C, h0))
    group = np.arange(HEADS) // (HEADS // GROUPS)
    state, ys = h0.copy(), []
    for t in range(x.shape[1]):
        Bt, Ct = B[:, t][:, group], C[:, t][:, group]                       # [b h n]
        state = (np.exp(dt[:, t] * A)[..., None, None] * state
                 + dt[:, t][..., None, None] * x[:, t][..., None] * Bt[:, :, None, :])
        ys.append(np.einsum("bhpn,bhn->bhp", state, Ct))
    return np.stack(ys, axis=1), state


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("chunk", [1, 4, 5, 13, 16])
def test_the_chunked_scan_equals_the_recurrence(chunk, with_state):
    """Chunk sizes that divide the length, do not (13 = 2 x 5 + 3: padded steps) or exceed it,
    with and without an initial state, groups shared by two heads each. Catches a wrong
    inter-chunk decay, padding that moves the state, and heads reading the wrong group."""
    x, dt, A, B, C, h0 = inputs()
    h0 = h0 if with_state else jnp.zeros_like(h0)
    expected_y, expected_state = numpy_recurrence(x, dt, A, B, C, h0)
    y, state = ssd_chunked(x, dt, A, B, C, chunk=chunk,
                           initial_state=h0 if with_state else None)
    np.testing.assert_allclose(y, expected_y, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(state, expected_state, rtol=1e-4, atol=1e-4)


def test_the_step_and_the_reference_equal_the_recurrence():
    """The decoding step run token by token and the whole-sequence quadratic form. Catches a
    step that decays after adding the new token instead of before, and a reference whose
    initial state is read without its decay."""
    x, dt, A, B, C, h0 = inputs(1)
    expected_y, expected_state = numpy_recurrence(x, dt, A, B, C, h0)
    state, ys = h0, []
    for t in range(LENGTH):
        y, state = ssd_step(state, x[:, t], dt[:, t], A, B[:, t], C[:, t])
        ys.append(y)
    np.testing.assert_allclose(jnp.stack(ys, 1), expected_y, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(state, expected_state, rtol=1e-4, atol=1e-4)
    y, state = ssd_reference(x, dt, A, B, C, h0)
    np.testing.assert_allclose(y, expected_y, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(state, expected_state, rtol=1e-4, atol=1e-4)


def test_segment_sums_keep_their_precision_after_long_strong_decay():
    """Catches segment sums taken as differences of cumulative sums: after 2,000 steps of
    decay -1,000 the cumulative sum is -2e6, where float32 resolves only 0.25, so the sum of
    the next 47 small steps (-0.047) would be lost. Also: the chunked scan's output and
    gradient stay finite under strong decay."""
    a = jnp.concatenate([jnp.full((2000,), -1000.0), jnp.full((48,), -1e-3)])
    sums = segsum(a)
    assert float(sums[-1, 2000]) == pytest.approx(-0.047, abs=1e-6)
    assert float(sums[5, 5]) == 0.0 and float(sums[5, 6]) == -np.inf
    x, dt, A, B, C, _ = inputs(2, length=256)

    def loss(dt):
        return jnp.sum(ssd_chunked(x, dt * 50, A, B, C, chunk=64)[0] ** 2)

    value, grad = jax.value_and_grad(loss)(dt)
    assert jnp.isfinite(value) and jnp.all(jnp.isfinite(grad))


def random_tree(rng, size, padding):
    """Parents [size] (-1: a root-level node; parents first) whose last `padding` nodes are
    padding: they hang below node 0 as leaves and no query's path goes through them."""
    parents = [-1] + [int(rng.integers(-1, i)) for i in range(1, size - padding)]
    return np.array(parents + [0] * padding)


def paths(parents):
    """[size, size] bool: row i marks i and its ancestors."""
    size = len(parents)
    ancestry = np.zeros((size, size), bool)
    for i in range(size):
        j = i
        while j >= 0:
            ancestry[i, j], j = True, parents[j]
    return ancestry


def test_the_tree_scan_and_the_closed_form_state_equal_each_path_run_as_a_chain():
    """Random trees with padding nodes, a different tree per row, groups shared by heads: each
    node's output from the tree scan, and the state after each node from the closed form, equal
    the float64 recurrence along that node's root-to-node path from the committed state. Catches
    a decay summed over non-ancestors (siblings leaking in), a mask applied after exp, and a
    closed form that decays from the wrong end."""
    rng = np.random.default_rng(0)
    x, dt, A, B, C, h0 = inputs(3, length=12)
    trees = np.stack([paths(random_tree(rng, 12, padding)) for padding in (0, 3)])
    y = ssd_tree(x, dt, dt * A, B, C, jnp.asarray(trees), h0)
    for row in range(BATCH):
        for node in range(12):
            path = np.flatnonzero(trees[row, node])
            take = (lambda t, path=path, row=row: t[row:row + 1, path])
            expected_y, expected_state = numpy_recurrence(take(x), take(dt), A, take(B), take(C),
                                                          h0[row:row + 1])
            np.testing.assert_allclose(y[row, node], expected_y[0, -1], rtol=1e-4, atol=1e-4)
            state = ssd_fold(h0[row:row + 1], take(x), take(dt), take(dt) * A, take(B))
            np.testing.assert_allclose(state[0], expected_state[0], rtol=1e-4, atol=1e-4)


def test_tokens_with_zero_step_leave_the_folded_state_unchanged():
    """How commits drop tokens past the accepted count: dt = 0 must be an identity step.
    Catches a fold that decays the state by tokens it drops (or adds their dt x B^T)."""
    x, dt, A, B, C, h0 = inputs(4, length=6)
    keep = jnp.arange(6) < 4
    dropped = jnp.where(keep[None, :, None], dt, 0.0)
    np.testing.assert_allclose(ssd_fold(h0, x, dropped, dropped * A, B),
                               ssd_fold(h0, x[:, :4], dt[:, :4], dt[:, :4] * A, B[:, :4]),
                               rtol=1e-5, atol=1e-5)
