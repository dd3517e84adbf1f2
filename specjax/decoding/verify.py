"""Verification: one target pass over the pending token and every proposed node.

Node i is verified at cache slot `length + 1 + i` with RoPE position `length + depth` and sees
the committed slots, its ancestors and itself (`tree.tree_layout`); a chain keeps the ordinary
causal layout, so it runs exactly the program a plain chain of tokens would. Every layer's K/V
for those positions is written; `Cache.commit` later keeps the accepted ones.

When the drafter already ran the target's first layers on most positions (`Proposal.reuse`:
LayerSkip's shallow layers, whose K/V it wrote), only the positions it did not run go through
those layers here, and the deeper layers run once over all positions.

A chain whose rows may stop drafting early (a confidence stop, SpecDec++'s head) is verified
only as far as the longest row drafted, rounded up to one of its shape's `verify_sizes` (one
compiled pass per size, the one that fits chosen at run time, `branching.switch`); the logits
past it are zeros, which acceptance never reads (those nodes are invalid). On a CPU a pass
costs about its token count, so a stop saves verification as well as drafting.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.struct
import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.decoding.branching import switch
from specjax.decoding.proposal import Proposal, pass_index
from specjax.decoding.shapes.tree import Layout, ancestor_matrix, chain_layout, tree_layout
from specjax.model import Params, embed, exit_logits, run_layers_cached
from specjax.nn.cache import Cache


@flax.struct.dataclass
class Verified:
    """A verification pass: the logits [B, 1+T, V] at the pending token and each node; the
    cache with every layer's K/V written for them (lengths unchanged); when the proposal reuses
    the draft's layers, every position's hidden state at the reuse exit [B, 1+T, D] (else
    None); `trace`, per-position values [B, 1+T] reported with the token each position's
    logits produce (CALM's exit and confidence; empty for the full model); `positions`, how
    many positions the pass ran (a scalar: 1 + T, or fewer for a chain cut short); `features`,
    every position's hidden state after each layer count the drafter asked for
    ({exit: [B, 1+T, D]}, `Drafter.feature_exits`: what feature heads draft from)."""

    logits: jax.Array
    cache: Cache
    reused_hidden: jax.Array | None
    trace: dict[str, jax.Array]
    positions: jax.Array
    features: dict[int, jax.Array] = flax.struct.field(default_factory=dict)


def verify(params: Params, cfg: ModelConfig, cache: Cache, pending: jax.Array,
           proposal: Proposal, features: tuple[int, ...] = ()) -> Verified:
    """The full target over the pending token [B] and every valid node of `proposal` (or more:
    the smallest of its shape's `verify_sizes` that holds every row's last valid node), keeping
    the hidden states after each layer count in `features` (at or above a reuse exit)."""
    sizes = proposal.shape.verify_sizes
    if len(sizes) == 1:
        return _verify(params, cfg, cache, pending, proposal, features)
    num_nodes = proposal.tokens.shape[1]

    def first_nodes(size: int) -> Callable[[Verified], Verified]:
        def run(verified: Verified) -> Verified:
            out = _verify(params, cfg, verified.cache, pending, _first(proposal, size), features)
            return out.replace(logits=_pad_nodes(out.logits, num_nodes),
                               reused_hidden=_pad_nodes(out.reused_hidden, num_nodes),
                               features={exit: _pad_nodes(hidden, num_nodes)
                                         for exit, hidden in out.features.items()})
        return run

    full = jax.eval_shape(lambda: _verify(params, cfg, cache, pending, proposal, features))
    empty = jax.tree.map(lambda like: jnp.zeros(like.shape, like.dtype), full).replace(
        cache=cache)
    last_valid = jnp.max(jnp.where(proposal.valid, jnp.arange(num_nodes) + 1, 0), axis=1)
    return switch(pass_index(sizes, last_valid), [first_nodes(size) for size in sizes], empty)


def _verify(params: Params, cfg: ModelConfig, cache: Cache, pending: jax.Array,
            proposal: Proposal, features: tuple[int, ...]) -> Verified:
    tokens = jnp.concatenate([pending[:, None], proposal.tokens], axis=1)
    layout = proposal_layout(cache.lengths, proposal, cache.max_len)
    reuse, start, reused = proposal.reuse, 0, None
    if reuse is None:
        hidden = embed(params, cfg, tokens)
    else:
        start = reuse.exit_layer
        missing = reuse.missing
        ran, cache = _run(params, cfg, embed(params, cfg, jnp.take_along_axis(tokens, missing, 1)),
                          cache, layout.take(missing), (0, start))
        rows = jnp.arange(tokens.shape[0])[:, None]
        hidden = reused = reuse.hidden.at[rows, missing].set(ran)
    kept = {}
    for stop in sorted({*features, cfg.num_layers}):
        if stop < start:
            raise ValueError(f"feature exit {stop} lies below the reuse exit {start}")
        if stop > start:
            hidden, cache = _run(params, cfg, hidden, cache, layout, (start, stop))
        kept[stop], start = hidden, stop
    return Verified(exit_logits(params, cfg, hidden), cache, reused, {},
                    jnp.int32(tokens.shape[1]), {exit: kept[exit] for exit in features})


def _first(proposal: Proposal, size: int) -> Proposal:
    """The first `size` nodes (and the reused hidden states of the pending token and them):
    every valid node, when no row has one after them."""
    reuse = proposal.reuse
    if reuse is not None:
        reuse = reuse.replace(hidden=reuse.hidden[:, :size + 1])
    return proposal.replace(
        tokens=proposal.tokens[:, :size], parents=proposal.parents[:, :size],
        valid=proposal.valid[:, :size], q=None if proposal.q is None else proposal.q[:, :size],
        reuse=reuse)


def _pad_nodes(values: jax.Array | None, num_nodes: int) -> jax.Array | None:
    """[B, 1 + n, ...] -> [B, 1 + num_nodes, ...], zeros after."""
    if values is None:
        return None
    return jnp.pad(values, [(0, 0), (0, num_nodes + 1 - values.shape[1])]
                   + [(0, 0)] * (values.ndim - 2))


def proposal_layout(lengths: jax.Array, proposal: Proposal, max_len: int) -> Layout:
    """Slots, positions and mask of the pending token and the nodes."""
    size = proposal.tokens.shape[1] + 1
    if proposal.shape.is_chain:
        return chain_layout(lengths, size, max_len)
    return tree_layout(lengths, ancestor_matrix(proposal.parents), max_len)


def _run(params: Params, cfg: ModelConfig, hidden: jax.Array, cache: Cache, layout: Layout,
         layers: tuple[int, int]) -> tuple[jax.Array, Cache]:
    return run_layers_cached(params, cfg, hidden, cache, layout.slots, layers=layers,
                             positions=layout.positions, mask=layout.mask)
