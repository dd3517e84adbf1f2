"""Feature heads (EAGLE-3, DeepSeek's multi-token prediction): one small block that drafts the
token after x from the embedding of x and the *feature* of x's parent, the position before it.

At a position the target has verified the feature is the target's (EAGLE-3: its hidden states
after three layers fused by a linear map; MTP: its last hidden state); at a drafted position it
is the block's own output there, so drafting runs the block once per depth and no target layer.
The block keeps its own K/V (one attention layer, laid out like a target layer's) at the slot
of the token it read: slot s holds what the block computed from (feature at s - 1, token s).
Slot 0 has no parent and is never attended. `cells` stacks one block per drafted depth (MTP's
modules; EAGLE-3's one block serves every depth): depth d runs cell min(d, cells - 1).

A kind (`eagle.EAGLE`, `mtp.MTP`) says how features are fused, which block a cell is and how
its output becomes logits; `run_cell` and `unrolled_logits` (training-time test) are shared.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.heads.vocab_subset import DraftVocab
from specjax.model import Params, embed
from specjax.nn.cache import LayerKV
from specjax.nn.rope import rope_tables


class FeatureHeadKind(Protocol):
    """What distinguishes one feature head from another."""

    name: str

    def exits(self, cfg: ModelConfig, settings: Mapping[str, Any]) -> tuple[int, ...]:
        """The target's layer counts whose hidden states make a feature."""

    def cell(self, cfg: ModelConfig) -> nn.Module:
        """One block: (embedded tokens [B, n, D], parent features [B, n, D], rope, mask, kv,
        write_pos) -> (features [B, n, D], kv), attention as `nn.attention.Attention`."""

    def fuse(self, params: Params, head: Params, cfg: ModelConfig,
             hidden: Sequence[jax.Array]) -> jax.Array:
        """The feature [..., D] of the target's hidden states at `exits` ([..., D] each)."""

    def logits(self, params: Params, head: Params, cfg: ModelConfig, features: jax.Array,
               vocab: DraftVocab | None = None) -> jax.Array:
        """Draft logits [..., V] (float32) of the block's output features (scored over
        `vocab`'s ids only when given, the head cut to them by `restrict_vocab`)."""

    def restrict_vocab(self, head: Params, ids: jax.Array) -> Params:
        """The head with a vocabulary projection of its own cut to `ids` (or unchanged)."""

    def init(self, params: Params, cfg: ModelConfig, settings: Mapping[str, Any]) -> Params:
        """A head for the target `params` before training."""


def num_cells(head: Params) -> int:
    """How many blocks the head stacks (one per drafted depth, the last serving deeper ones)."""
    return jax.tree.leaves(head["cells"])[0].shape[0]


def run_cell(kind: FeatureHeadKind, params: Params, head: Params, cfg: ModelConfig,
             depth: jax.Array | int, parents: jax.Array, tokens: jax.Array, positions: jax.Array,
             mask: jax.Array, kv: LayerKV, slots: jax.Array) -> tuple[jax.Array, LayerKV]:
    """The block of drafted depth `depth` (0: the token after the pending one) on `tokens`
    [B, n] whose parents' features are `parents` [B, n, D], at RoPE `positions` [B, n], seeing
    the cache slots `mask` [B, n, S] (slot 0 never) and writing its K/V at `slots` [B, n]:
    the output features [B, n, D] and the cache."""
    index = jnp.minimum(depth, num_cells(head) - 1)
    cell = jax.tree.map(lambda w: w[index], head["cells"])
    visible = mask & (jnp.arange(mask.shape[-1]) >= 1)
    return kind.cell(cfg).apply({"params": cell}, embed(params, cfg, tokens),
                                parents.astype(cfg.compute_dtype), rope_tables(cfg, positions),
                                visible, kv, slots)


def unrolled_logits(kind: FeatureHeadKind, params: Params, head: Params, cfg: ModelConfig,
                    tokens: jax.Array, hidden: Sequence[jax.Array], steps: int) -> jax.Array:
    """Training-time test (EAGLE-3): draft logits [steps, B, T, V] over a sequence `tokens`
    [B, T + 1] whose target hidden states at the kind's exits are `hidden` ([B, T, D] each, of
    tokens[:, :T]). Entry [j, b, s] is what a chain drafted from the pending token at s (its
    parent feature the target's at s - 1) gives at depth j + 1, when its tokens are the
    sequence's own: the logits for tokens[b, s + j + 1]. As in decoding, step j at s reads the
    block's own output of step j - 1 at s and the token s + j, and attends to step 0's K/V at
    slots 1..s (the target-fed ones) and to its own chain's, steps 1..j at s; s = 0 has no
    parent (its entries are not meaningful)."""
    batch, width = tokens.shape[0], tokens.shape[1] - 1
    fused = kind.fuse(params, head, cfg, hidden)
    features = jnp.pad(fused, ((0, 0), (1, 0), (0, 0)))[:, :width]   # feature at s - 1
    kv = LayerKV.allocate(cfg, batch, steps * width)
    base = jnp.arange(width)
    key_step, key_base = jnp.divmod(jnp.arange(steps * width), width)
    padded = jnp.pad(tokens, ((0, 0), (0, steps)))
    logits = []
    for j in range(steps):
        mask = (((key_step == 0) & (key_base[None, :] <= base[:, None]) & (key_base >= 1))
                | ((key_step >= 1) & (key_step <= j) & (key_base[None, :] == base[:, None])))
        slots = jnp.broadcast_to(j * width + base, (batch, width))
        features, kv = kind.cell(cfg).apply(
            {"params": jax.tree.map(lambda w, j=j: w[min(j, num_cells(head) - 1)],
                                    head["cells"])},
            embed(params, cfg, padded[:, j:j + width]), features.astype(cfg.compute_dtype),
            rope_tables(cfg, jnp.broadcast_to(base + j, (batch, width))),
            jnp.broadcast_to(mask, (batch, width, steps * width)), kv, slots)
        logits.append(kind.logits(params, head, cfg, features))
    return jnp.stack(logits)
