"""The decode cache: one cache per layer, each of its kind, plus per-row committed lengths.

Protocol. A layer cache is allocated for a batch and a slot count, is written by its layer during
a forward pass, and is told what was accepted by `commit(lengths, path)`: `lengths` [B] are the
committed lengths before the round, `path` [B, D] the accepted draft nodes in root-to-leaf
order (node i was verified at slot lengths + 1 + i; the pending token at slot lengths). A chain
passes no path: its accepted drafts already sit in the slots after the committed length. An
attention layer gathers a tree's accepted path into those slots; a state-space layer will
recompute its state at the accepted node from what its verification pass kept. Only the
`Cache` decides the new lengths.

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


class LayerCache(Protocol):
    """What the decode loop needs from one layer's cache (see the module docstring)."""

    def commit(self, lengths: jax.Array, path: jax.Array) -> LayerCache:
        """The cache after accepting `path` [B, D] of the tree verified after `lengths` [B]."""


class LayerKV(NamedTuple):
    """One attention layer's keys and values, each [B * num_kv_heads, max_len, head_dim]."""

    k: jax.Array
    v: jax.Array

    @classmethod
    def allocate(cls, cfg: ModelConfig, batch: int, max_len: int) -> LayerKV:
        shape = (batch * cfg.num_kv_heads, max_len, cfg.head_dim)
        return cls(jnp.zeros(shape, cfg.compute_dtype), jnp.zeros(shape, cfg.compute_dtype))

    def commit(self, lengths: jax.Array, path: jax.Array) -> LayerKV:
        """Moves the K/V of the accepted nodes into slots lengths + 1 .. lengths + D (all D
        moves happen; those past the accepted count land beyond the new length, unseen)."""
        kv_heads = self.k.shape[0] // lengths.shape[0]
        depth = path.shape[1]
        start = jnp.repeat(lengths, kv_heads)[:, None] + 1
        source = start + jnp.repeat(path, kv_heads, axis=0)
        target = start + jnp.arange(depth)[None, :]
        rows = jnp.arange(self.k.shape[0])[:, None]
        return LayerKV(*(buffer.at[rows, target].set(buffer[rows, source], mode="drop")
                         for buffer in self))


@flax.struct.dataclass
class Cache:
    """Every layer's cache plus the committed length of each row ([B] int32)."""

    layers: tuple[LayerKV, ...]
    lengths: jax.Array

    @classmethod
    def allocate(cls, cfg: ModelConfig, batch: int, max_len: int) -> Cache:
        """Zero-filled caches for `batch` rows of at most `max_len` tokens each."""
        layers = tuple(LayerKV.allocate(cfg, batch, max_len) for _ in range(cfg.num_layers))
        return cls(layers=layers, lengths=jnp.zeros((batch,), jnp.int32))

    @property
    def max_len(self) -> int:
        return self.layers[0].k.shape[1]

    @property
    def batch(self) -> int:
        return self.lengths.shape[0]

    def commit(self, lengths: jax.Array, path: jax.Array | None = None) -> Cache:
        """Declares the first `lengths[b]` slots of row b valid in every layer, after moving a
        tree's accepted `path` [B, D] into place (None: a chain, nothing moves)."""
        layers = self.layers
        if path is not None:
            layers = tuple(layer.commit(self.lengths, path) for layer in layers)
        return self.replace(layers=layers, lengths=lengths.astype(jnp.int32))

    def with_layers(self, start: int, new_layers: tuple[LayerKV, ...]) -> Cache:
        """Replaces layers [start, start + len(new_layers)) with `new_layers`."""
        layers = list(self.layers)
        layers[start:start + len(new_layers)] = new_layers
        return self.replace(layers=tuple(layers))
