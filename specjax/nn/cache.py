"""The decode cache: one cache per layer, each of its kind, plus per-row committed lengths.

Protocol. A layer cache is allocated for a batch, a slot count and a window (the most tokens a
round puts after the committed length), is written by its layer during a forward pass, and is
told what was accepted by `commit(before, after, path)`: the committed lengths [B] before and
after the round and `path` [B, D], the accepted draft nodes in root-to-leaf order (node i was
verified at slot before + 1 + i; the pending token at slot before), or None for a chain, whose
accepted drafts already sit in the slots after the committed length. An attention layer
gathers a tree's accepted path into those slots (`LayerKV`); a state-space layer folds the
accepted tokens' values from its window into its state in closed form (`LayerSSM`). Only the
`Cache` decides the new lengths. A drafter's pass through the shallow layers writes these
caches as verification would (K/V, or the SSM window), so verification reuses either alike.
A prefill commits its own tokens: the loop then sets the lengths without a layer commit
(`Cache.prefilled`).

Attention layout. Each attention layer owns two buffers of shape [B * num_kv_heads, max_len,
head_dim]: the batch and kv-head axes are already merged into the single batch axis of the
attention dot products. Measured on XLA:CPU (jax 0.10), any reshape, slice or transpose between
the in-place cache write and the dot that reads it makes XLA duplicate the write and copy the
whole buffer several times per step (4 extra copies, 107 vs 15 us per layer-step); the merged
layout and one buffer per layer (not a stacked [L, ...] array, whose slices are copies) avoid
every copy.

Commit by length. A forward pass writes new K/V at its write slots but never moves `lengths`;
`commit` does. Slots at or beyond a row's length hold stale drafts that the attention mask hides
and later writes overwrite: a rejected draft costs nothing to undo.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import flax.struct
import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.nn.ssd import ssd_fold


class LayerCache(Protocol):
    """What the decode loop needs from one layer's cache (see the module docstring)."""

    def commit(self, before: jax.Array, after: jax.Array, path: jax.Array | None) -> LayerCache:
        """The cache after a round that took the committed lengths [B] from `before` to
        `after` along `path` [B, D] (None: a chain)."""


class LayerKV(NamedTuple):
    """One attention layer's keys and values, each [B * num_kv_heads, max_len, head_dim]."""

    k: jax.Array
    v: jax.Array

    @classmethod
    def allocate(cls, cfg: ModelConfig, batch: int, max_len: int) -> LayerKV:
        shape = (batch * cfg.num_kv_heads, max_len, cfg.head_dim)
        return cls(jnp.zeros(shape, cfg.compute_dtype), jnp.zeros(shape, cfg.compute_dtype))

    def commit(self, before: jax.Array, after: jax.Array, path: jax.Array | None) -> LayerKV:
        """Moves the K/V of a tree's accepted nodes into slots before + 1 .. before + D (all D
        moves happen; those past the accepted count land beyond the new length, unseen); a
        chain's are in place already."""
        if path is None:
            return self
        lengths = before
        kv_heads = self.k.shape[0] // lengths.shape[0]
        depth = path.shape[1]
        start = jnp.repeat(lengths, kv_heads)[:, None] + 1
        source = start + jnp.repeat(path, kv_heads, axis=0)
        target = start + jnp.arange(depth)[None, :]
        rows = jnp.arange(self.k.shape[0])[:, None]
        return LayerKV(*(buffer.at[rows, target].set(buffer[rows, source], mode="drop")
                         for buffer in self))


class LayerSSM(NamedTuple):
    """One Mamba-2 layer: the committed SSM state [B, H, P, N] (float32) and conv history
    [B, width - 1, C] (the last inputs before the conv, oldest first), and a window of W
    uncommitted tokens at slots length .. length + W - 1 (a round's pending token and nodes):
    their conv inputs `xbc` [B, W, C], and after the conv x [B, W, H, P], b [B, W, G, N], dt
    and log_decay (dt A) [B, W, H]. A forward pass writes the window and never the state; the
    commit folds the accepted path's tokens into the state (`ssd.ssd_fold`) and the history, so
    no per-node state is ever stored and a rejected draft leaves no trace."""

    state: jax.Array
    conv: jax.Array
    xbc: jax.Array
    x: jax.Array
    b: jax.Array
    dt: jax.Array
    log_decay: jax.Array

    @classmethod
    def allocate(cls, cfg: ModelConfig, batch: int, window: int) -> LayerSSM:
        ssm, dtype = cfg.ssm, cfg.compute_dtype
        return cls(
            state=jnp.zeros((batch, ssm.num_heads, ssm.head_dim, ssm.state_size), jnp.float32),
            conv=jnp.zeros((batch, ssm.conv_width - 1, ssm.conv_channels), dtype),
            xbc=jnp.zeros((batch, window, ssm.conv_channels), dtype),
            x=jnp.zeros((batch, window, ssm.num_heads, ssm.head_dim), dtype),
            b=jnp.zeros((batch, window, ssm.groups, ssm.state_size), dtype),
            dt=jnp.zeros((batch, window, ssm.num_heads), jnp.float32),
            log_decay=jnp.zeros((batch, window, ssm.num_heads), jnp.float32))

    @property
    def window(self) -> int:
        return self.xbc.shape[1]

    def commit(self, before: jax.Array, after: jax.Array, path: jax.Array | None) -> LayerSSM:
        """Folds the round's first `after - before` accepted tokens (the pending token, then
        the path's nodes; a chain's in window order) into the state and the conv history."""
        count = after - before
        kept = (jnp.arange(self.window if path is None else path.shape[1] + 1)[None, :]
                < count[:, None])[..., None]

        def along(buffer):
            return along_path(buffer, path)

        dt, log_decay = (jnp.where(kept, along(t), 0.0) for t in (self.dt, self.log_decay))
        state = ssd_fold(self.state, along(self.x), dt, log_decay, along(self.b))
        history = jnp.concatenate([self.conv, along(self.xbc)], axis=1)
        last = count[:, None] + jnp.arange(self.conv.shape[1])[None, :]
        conv = jnp.take_along_axis(history, last[..., None], axis=1)
        return self._replace(state=state, conv=conv)


def along_path(values: jax.Array, path: jax.Array | None) -> jax.Array:
    """Per-position values [B, W, ...] of a round's window (the pending token at position 0,
    draft node i at i + 1) at the tokens the round keeps, in order: the root, then each node of
    `path` [B, D] (giving [B, D+1, ...]); a chain (None) keeps its window in order."""
    if path is None:
        return values
    positions = jnp.concatenate([jnp.zeros_like(path[:, :1]), path + 1], axis=1)
    return jnp.take_along_axis(
        values, positions.reshape(positions.shape + (1,) * (values.ndim - 2)), axis=1)


@flax.struct.dataclass
class Cache:
    """Every layer's cache, the committed length of each row ([B] int32) and the slot count
    (static). `model.allocate_cache` builds one for a model's layer pattern."""

    layers: tuple[LayerKV | LayerSSM, ...]
    lengths: jax.Array
    max_len: int = flax.struct.field(pytree_node=False)

    @property
    def batch(self) -> int:
        return self.lengths.shape[0]

    def commit(self, lengths: jax.Array, path: jax.Array | None = None) -> Cache:
        """Declares the first `lengths[b]` slots of row b valid in every layer, each layer
        keeping the round's accepted tokens (a tree's `path` [B, D]; None: a chain)."""
        layers = tuple(layer.commit(self.lengths, lengths, path) for layer in self.layers)
        return self.replace(layers=layers, lengths=lengths.astype(jnp.int32))

    def prefilled(self, lengths: jax.Array) -> Cache:
        """The cache after a prefill pass that committed `lengths` [B] tokens itself."""
        return self.replace(lengths=lengths.astype(jnp.int32))

    def with_layers(self, start: int, new_layers: tuple[LayerKV, ...]) -> Cache:
        """Replaces layers [start, start + len(new_layers)) with `new_layers`."""
        layers = list(self.layers)
        layers[start:start + len(new_layers)] = new_layers
        return self.replace(layers=tuple(layers))
