"""Verification: one target pass over the pending token and every proposed node.

Node i is verified at cache slot `length + 1 + i` with RoPE position `length + depth` and sees
the committed slots, its ancestors and itself (`tree.tree_layout`); a chain keeps the ordinary
causal layout, so it runs exactly the program a plain chain of tokens would. Every layer's K/V
for those positions is written; `Cache.commit` later keeps the accepted ones.

When the drafter already ran the target's first layers on most positions (`Proposal.reuse`:
LayerSkip's shallow layers, whose K/V it wrote), only the positions it did not run go through
those layers here, and the deeper layers run once over all positions.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from specjax.cache import Cache
from specjax.config import ModelConfig
from specjax.decoding.proposal import Proposal
from specjax.decoding.tree import Layout, ancestor_matrix, chain_layout, tree_layout
from specjax.model import Params, embed, exit_logits, run_layers_cached


@flax.struct.dataclass
class Verified:
    """A verification pass: the logits [B, 1+T, V] at the pending token and each node; the
    cache with every layer's K/V written for them (lengths unchanged); when the proposal reuses
    the draft's layers, every position's hidden state at the reuse exit [B, 1+T, D] (else
    None); `trace`, per-position values [B, 1+T] reported with the token each position's
    logits produce (CALM's exit and confidence; empty for the full model)."""

    logits: jax.Array
    cache: Cache
    reused_hidden: jax.Array | None
    trace: dict[str, jax.Array]


def verify(params: Params, cfg: ModelConfig, cache: Cache, pending: jax.Array,
           proposal: Proposal) -> Verified:
    """The full target over the pending token [B] and every node of `proposal`."""
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
    hidden, cache = _run(params, cfg, hidden, cache, layout, (start, cfg.num_layers))
    return Verified(exit_logits(params, cfg, hidden), cache, reused, {})


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
