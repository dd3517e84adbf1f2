"""Mamba-2's state-space duality (SSD) core: the selective scan three ways, as pure functions.

Per head h, with a scalar decay A_h < 0, step sizes dt_t > 0, inputs x_t [P] and the head's
group's B_t, C_t [N]:

    state_t = exp(dt_t A_h) state_{t-1} + dt_t x_t B_t^T      ([P, N])
    y_t     = state_t C_t                                      ([P])

Shapes: x [b, l, h, p], dt [b, l, h] (after softplus and bias), A [h], B and C [b, l, g, n]
with h a multiple of g (heads h*g/h .. share group g's B and C, as HF's `n_groups`), states
[b, h, p, n]. The skip term D x, the gate and the projections belong to the layer, not here.

  `ssd_step`      the recurrence, one token (decoding).
  `ssd_chunked`   the chunked scan (training, prefill): within a chunk the quadratic form, across
                  chunks the recurrence on chunk states; any length (padded with dt = 0, which
                  leaves the state unchanged); returns the final state for the cache.
  `ssd_reference` the quadratic form over the whole sequence at once, after
                  state-spaces/mamba `ssd_minimal.py`: short, O(l^2), for tests.
  `ssd_tree`      STree's tree scan (decoding, drafting, verifying chains and trees): the
                  quadratic form with the causal mask replaced by the ancestor mask the
                  attention layers use too, log-decays summed along each path.
  `ssd_fold`      the state after the accepted path's tokens, in closed form (`LayerSSM.commit`).
Each form is tested against a float64 recurrence (along every path, for the tree scan).

Segment sums (`segsum`) are formed from masked cumulative sums and masked to -inf before `exp`,
never as differences of long cumulative sums, which lose precision and overflow off the mask.
"""

from __future__ import annotations

import einops
import jax
import jax.numpy as jnp


def segsum(a: jax.Array) -> jax.Array:
    """[..., T] log-decays -> [..., T, T]: entry (i, j) = a_{j+1} + ... + a_i for j <= i
    (0 on the diagonal), -inf above it."""
    steps = a.shape[-1]
    a = einops.repeat(a, "... i -> ... i j", j=steps)
    a = jnp.where(jnp.tril(jnp.ones((steps, steps), bool), -1), a, 0.0)
    sums = jnp.cumsum(a, axis=-2)
    return jnp.where(jnp.tril(jnp.ones((steps, steps), bool)), sums, -jnp.inf)


def heads_of_groups(bc: jax.Array, num_heads: int) -> jax.Array:
    """B or C [b, l, g, n] -> [b, l, h, n]: each head reads its group's."""
    return jnp.repeat(bc, num_heads // bc.shape[2], axis=2)


def ssd_step(state: jax.Array, x: jax.Array, dt: jax.Array, A: jax.Array, B: jax.Array,
             C: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One token: x [b, h, p], dt [b, h], B and C [b, g, n], state [b, h, p, n] -> (y
    [b, h, p], the next state)."""
    heads = x.shape[1]
    B, C = (jnp.repeat(t, heads // t.shape[1], axis=1) for t in (B, C))
    decay = jnp.exp(dt * A)[..., None, None]
    state = decay * state + jnp.einsum("bh,bhp,bhn->bhpn", dt, x, B)
    return jnp.einsum("bhpn,bhn->bhp", state, C), state


def ssd_chunked(x: jax.Array, dt: jax.Array, A: jax.Array, B: jax.Array, C: jax.Array, *,
                chunk: int, initial_state: jax.Array | None = None
                ) -> tuple[jax.Array, jax.Array]:
    """The scan over a sequence in chunks of `chunk` tokens: (y [b, l, h, p], final state
    [b, h, p, n]); `initial_state` defaults to zeros."""
    batch, length, heads, width = x.shape
    pad = -length % chunk
    if pad:
        x, dt, B, C = (jnp.pad(t, [(0, 0), (0, pad)] + [(0, 0)] * (t.ndim - 2))
                       for t in (x, dt, B, C))
    B, C = heads_of_groups(B, heads), heads_of_groups(C, heads)
    X = einops.rearrange(x * dt[..., None], "b (c s) h p -> b c s h p", s=chunk)
    B, C = (einops.rearrange(t, "b (c s) h n -> b c s h n", s=chunk) for t in (B, C))
    log_decay = einops.rearrange(dt * A, "b (c s) h -> b h c s", s=chunk)
    cumulative = jnp.cumsum(log_decay, axis=-1)

    within = jnp.exp(segsum(log_decay))                                     # [b h c s s]
    y_diag = jnp.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", C, B, within, X)
    to_end = jnp.exp(cumulative[..., -1:] - cumulative)                     # [b h c s]
    chunk_states = jnp.einsum("bclhn,bhcl,bclhp->bchpn", B, to_end, X)
    if initial_state is None:
        initial_state = jnp.zeros((batch, heads, width, B.shape[-1]), x.dtype)
    chunk_states = jnp.concatenate([initial_state[:, None], chunk_states], axis=1)
    across = jnp.exp(segsum(jnp.pad(cumulative[..., -1], [(0, 0), (0, 0), (1, 0)])))
    states = jnp.einsum("bhzc,bchpn->bzhpn", across, chunk_states)
    y_off = jnp.einsum("bclhn,bchpn,bhcl->bclhp", C, states[:, :-1], jnp.exp(cumulative))
    y = einops.rearrange(y_diag + y_off, "b c s h p -> b (c s) h p")[:, :length]
    return y, states[:, -1]


def ssd_reference(x: jax.Array, dt: jax.Array, A: jax.Array, B: jax.Array, C: jax.Array,
                  initial_state: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """The whole sequence as one quadratic form (y_i = sum_j C_i.B_j exp(a_{j+1..i}) dt_j x_j
    plus the decayed initial state read by C_i): (y, final state). O(l^2); for tests."""
    heads = x.shape[2]
    B, C = heads_of_groups(B, heads), heads_of_groups(C, heads)
    log_decay = einops.rearrange(dt * A, "b l h -> b h l")
    mixing = jnp.exp(segsum(log_decay))                                     # [b h l l]
    X = x * dt[..., None]
    y = jnp.einsum("blhn,bshn,bhls,bshp->blhp", C, B, mixing, X)
    state = jnp.einsum("bshn,bhs,bshp->bhpn", B, mixing[:, :, -1], X)
    if initial_state is not None:
        decay = jnp.exp(jnp.cumsum(log_decay, axis=-1))                     # [b h l]
        y = y + jnp.einsum("blhn,bhpn,bhl->blhp", C, initial_state, decay)
        state = state + decay[..., -1, None, None] * initial_state
    return y, state


def ssd_fold(state: jax.Array, x: jax.Array, dt: jax.Array, log_decay: jax.Array,
             B: jax.Array) -> jax.Array:
    """The state after the tokens x [b, l, h, p], dt and log_decay (dt A) [b, l, h], B
    [b, l, g, n] from `state` [b, h, p, n], in closed form (no outputs): decay(all) state +
    sum_j decay(after j) dt_j x_j B_j^T. A token with dt = log_decay = 0 leaves the state
    unchanged (how callers drop tokens)."""
    B = heads_of_groups(B, x.shape[2])
    log_decay = _at_least_f32(log_decay)
    after = jnp.pad(log_decay[:, 1:], [(0, 0), (0, 1), (0, 0)])             # a_{j+1}, 0 at end
    to_end = jnp.exp(jnp.flip(jnp.cumsum(jnp.flip(after, 1), axis=1), 1))   # exp(a_{j+1..l})
    total = jnp.exp(jnp.sum(log_decay, axis=1))                             # [b h]
    return (total[..., None, None] * state
            + jnp.einsum("blh,blh,blhp,blhn->bhpn", to_end, dt, x, B).astype(state.dtype))


def ssd_tree(x: jax.Array, dt: jax.Array, log_decay: jax.Array, B: jax.Array, C: jax.Array,
             ancestry: jax.Array, state: jax.Array) -> jax.Array:
    """Outputs of T query tokens that continue `state` [b, h, p, n] along paths through W
    window tokens (STree's tree scan: SSD's quadratic form with the causal mask replaced by
    ancestry). Window tokens: x [b, W, h, p], dt and log_decay (dt A) [b, W, h], B
    [b, W, g, n]; queries: C
    [b, T, g, n] and `ancestry` [b, T, W] (query t's path: the window tokens it descends from,
    itself included, in window order). Returns y [b, T, h, p].

    The log-decay from window token j to query t is the sum of the path's log-decays after j,
    summed directly (no difference of cumulative sums) and masked to -inf off the path before
    `exp`, so neither values nor gradients can overflow."""
    heads = x.shape[2]
    B, C = heads_of_groups(B, heads), heads_of_groups(C, heads)
    log_decay = _at_least_f32(log_decay)                                    # [b W h]
    path = ancestry.astype(log_decay.dtype)
    width = x.shape[1]
    later = jnp.triu(jnp.ones((width, width), path.dtype), 1).T             # [k, j]: k > j
    after = jnp.einsum("btk,kj,bkh->bhtj", path, later, log_decay)
    on_path = ancestry[:, None]                                             # [b 1 T W]
    mixing = jnp.where(on_path, jnp.exp(jnp.where(on_path, after, -jnp.inf)), 0.0)
    scores = jnp.einsum("bthn,bjhn->bhtj", C, B, preferred_element_type=path.dtype)
    y = jnp.einsum("bhtj,bjh,bjhp->bthp", mixing * scores, dt.astype(path.dtype), x)
    from_state = jnp.exp(jnp.einsum("btk,bkh->bht", path, log_decay))        # [b h T]
    y = y + jnp.einsum("bthn,bhpn,bht->bthp", C, state, from_state)
    return y.astype(x.dtype)


def _at_least_f32(values: jax.Array) -> jax.Array:
    """Log-decays are summed and exponentiated in float32 (or wider, when given wider)."""
    return values.astype(jnp.promote_types(values.dtype, jnp.float32))
