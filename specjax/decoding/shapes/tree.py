"""Token-tree geometry: ancestors, depths, children, cache layouts and accepted paths.

A proposal of T nodes is `parents` [B, T]: node i hangs below node parents[b, i], or below the
pending token when it is -1, and parents come before their children. The verified sequence is
indexed by *position*: position 0 is the pending token (the root), position i + 1 is node i.
Node i is verified at cache slot `length + 1 + i` with RoPE position `length + depth`, and
sees the committed slots, its ancestors and itself. A chain is parents = i - 1, whose layout
is the ordinary causal one.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp


class Layout(NamedTuple):
    """Where new tokens go and what they see: cache `slots` [B, n], RoPE `positions` [B, n] and
    the visible cache slots `mask` [B, n, max_len]."""

    slots: jax.Array
    positions: jax.Array
    mask: jax.Array

    def take(self, index: jax.Array) -> Layout:
        """The layout of tokens `index` [B, m] (or [m], the same for every row)."""
        index = jnp.broadcast_to(index, (self.slots.shape[0], *jnp.shape(index)[-1:]))
        return Layout(jnp.take_along_axis(self.slots, index, axis=1),
                      jnp.take_along_axis(self.positions, index, axis=1),
                      jnp.take_along_axis(self.mask, index[..., None], axis=1))


def chain_layout(start: jax.Array, steps: int, max_len: int) -> Layout:
    """`steps` consecutive tokens from slot start [B]: token t sees slots 0 .. start + t."""
    slots = start[:, None] + jnp.arange(steps)[None, :]
    return Layout(slots, slots, jnp.arange(max_len)[None, None, :] <= slots[:, :, None])


def tree_layout(lengths: jax.Array, ancestors: jax.Array, max_len: int) -> Layout:
    """The pending token and T nodes after `lengths` [B] committed tokens; `ancestors`
    [B, 1+T, 1+T] as from `ancestor_matrix`."""
    size = ancestors.shape[-1]
    depth = jnp.sum(ancestors, axis=-1, dtype=jnp.int32) - 1
    relative = jnp.arange(max_len)[None, :] - lengths[:, None]                   # [B, S]
    in_tree = (relative >= 0) & (relative < size)
    gathered = jnp.take_along_axis(
        ancestors, jnp.broadcast_to(jnp.clip(relative, 0, size - 1)[:, None, :],
                                    (*ancestors.shape[:2], max_len)), axis=2)
    mask = (relative < 0)[:, None, :] | (in_tree[:, None, :] & gathered)
    slots = lengths[:, None] + jnp.arange(size)[None, :]
    return Layout(slots, lengths[:, None] + depth, mask)


def ancestor_matrix(parents: jax.Array) -> jax.Array:
    """[B, 1+T, 1+T] bool over positions: [b, i, j] when j is i, an ancestor of i, or the root.
    Built by repeated squaring of the one-step parent relation (log2 T matrix products)."""
    batch, size = parents.shape[0], parents.shape[1] + 1
    parent_position = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), parents + 1], axis=1)
    reach = (jax.nn.one_hot(parent_position, size, dtype=jnp.float32)
             + jnp.eye(size, dtype=jnp.float32)[None]) > 0
    for _ in range(max(1, math.ceil(math.log2(size)))):
        reach = jnp.einsum("bij,bjk->bik", reach.astype(jnp.float32),
                           reach.astype(jnp.float32)) > 0
    return reach


def inherit_validity(valid: jax.Array, ancestors: jax.Array) -> jax.Array:
    """[B, T]: a node counts only if it and every ancestor node count (`valid` [B, T])."""
    with_root = jnp.concatenate([jnp.ones_like(valid[:, :1]), valid], axis=1)
    return ~jnp.any(ancestors & ~with_root[:, None, :], axis=-1)[:, 1:]


def children_table(parents: jax.Array, max_children: int) -> jax.Array:
    """[B, 1+T, C]: the nodes below each position in index order, -1 past the last child
    (children beyond C are dropped: callers size C from the tree's shape)."""
    batch, size = parents.shape
    owner = parents + 1
    earlier = jnp.tril(jnp.ones((size, size), bool), -1)[None]
    rank = jnp.sum((owner[:, :, None] == owner[:, None, :]) & earlier, axis=2)
    table = jnp.full((batch, size + 1, max_children), -1, jnp.int32)
    rows = jnp.arange(batch)[:, None]
    return table.at[rows, owner, rank].set(jnp.arange(size, dtype=jnp.int32)[None, :],
                                           mode="drop")


def walk(accepted_child: jax.Array, max_depth: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Follows each row's accepted child from the root, `accepted_child` [B, 1+T] being the node
    accepted below each position (-1: none).

    Returns the path [B, D] (entries past the count hold their own index, so moving a cache
    slot to itself), the accepted count [B] and the position of the last accepted node [B]."""
    batch = accepted_child.shape[0]
    position = jnp.zeros((batch,), jnp.int32)
    count = jnp.zeros((batch,), jnp.int32)
    alive = jnp.ones((batch,), bool)
    path = []
    for step in range(max_depth):
        child = jnp.take_along_axis(accepted_child, position[:, None], axis=1)[:, 0]
        alive = alive & (child >= 0)
        path.append(jnp.where(alive, child, step))
        position = jnp.where(alive, child + 1, position)
        count = count + alive
    path = jnp.stack(path, axis=1) if path else jnp.zeros((batch, 0), jnp.int32)
    return path, count, position
