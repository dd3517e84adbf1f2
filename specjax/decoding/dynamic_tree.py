"""Dynamic token trees (EAGLE-2): the tree grows where the drafter is confident.

With a budget of T nodes, `top_k` = k and `depth` = D: the pending token's top k drafts form
depth 1; at every depth below, each of the k nodes of the previous depth proposes its top k
children, scored by cumulative draft log-probability along the path, and the k best of those
k^2 are expanded in turn (one batched drafter pass per depth, with the tree mask). The
remaining budget, T - k(D-1), goes to the best of all candidates that were not expanded
(children of expanded nodes at any depth). Unlike EAGLE-2's rerank, which may drop an expanded
node, every expanded node is kept: its K/V and exit state are reused by verification, so only
the leaves run the drafter's layers again and the verify pass has a static size.

Children are deterministic (the draft's top tokens), so sampling uses the top-k rule.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoding.proposal import DraftStep, Proposal
from specjax.decoding.sampling import SamplingParams, probabilities
from specjax.decoding.tree import ancestor_matrix, inherit_validity, tree_layout


@dataclasses.dataclass(frozen=True)
class DynamicTree:
    """T = `num_nodes`, k = `top_k` children per expanded node and expanded nodes per depth,
    nodes at most `depth` = D deep."""

    num_nodes: int = 16
    top_k: int = 4
    depth: int = 4

    is_chain: ClassVar[bool] = False
    children: ClassVar[str] = "top_k"

    @property
    def max_children(self) -> int:
        return self.top_k

    @property
    def num_expanded(self) -> int:
        return self.top_k * (self.depth - 1)

    @property
    def num_candidates(self) -> int:
        """Candidates that are never expanded: every leaf is chosen among them."""
        k = self.top_k
        return (self.depth - 2) * (k * k - k) + k * k

    def validate(self) -> None:
        if self.top_k < 1 or self.depth < 2:
            raise ValueError(f"dynamic tree: top_k={self.top_k} must be >= 1 and depth="
                             f"{self.depth} >= 2")
        leaves = self.num_nodes - self.num_expanded
        if not 1 <= leaves <= self.num_candidates:
            raise ValueError(
                f"dynamic tree: tree_nodes={self.num_nodes} must lie in "
                f"[{self.num_expanded + 1}, {self.num_expanded + self.num_candidates}] for "
                f"top_k={self.top_k}, depth={self.depth}: the top_k*(depth-1) expanded nodes "
                "plus at least one leaf, at most every candidate")

    def label(self) -> str:
        return f"dynamic T={self.num_nodes} k={self.top_k} D={self.depth}"

    def draft(self, step: DraftStep, carry: Any, lengths: jax.Array, pending: jax.Array,
              key: jax.Array, sampling: SamplingParams | None,
              max_len: int) -> tuple[Proposal, jax.Array, jax.Array, Any]:
        del key  # children are deterministic
        batch, k, size = pending.shape[0], self.top_k, self.num_nodes + 1
        tokens = jnp.zeros((batch, size), jnp.int32).at[:, 0].set(pending)
        parents = jnp.full((batch, size - 1), -1, jnp.int32)
        score = jnp.zeros((batch, size), jnp.float32)  # cumulative draft log-probability
        kept, pool = None, []
        frontier = np.zeros((1,), np.int32)
        for level in range(self.depth):
            layout = tree_layout(lengths, ancestor_matrix(parents), max_len).take(frontier)
            logits, kept_here, carry = step(carry, tokens[:, frontier], layout)
            if kept is None:
                kept = jnp.zeros((batch, size, *kept_here.shape[2:]), kept_here.dtype)
            kept = kept.at[:, frontier].set(kept_here)
            log_q = (jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1) if sampling is None
                     else jnp.log(probabilities(logits, sampling)))
            child_log_q, child_tokens = jax.lax.top_k(log_q, k)              # [B, n, k]
            candidates = {
                "tokens": child_tokens.reshape(batch, -1).astype(jnp.int32),
                "parents": jnp.broadcast_to(frontier[None, :, None] - 1,
                                            child_tokens.shape).reshape(batch, -1),
                "score": (score[:, frontier, None] + child_log_q).reshape(batch, -1)}
            if level < self.depth - 1:
                chosen = (jnp.broadcast_to(jnp.arange(k), (batch, k)) if level == 0 else
                          jax.lax.top_k(candidates["score"], k)[1])
                frontier = 1 + level * k + np.arange(k, dtype=np.int32)
                picked = {name: jnp.take_along_axis(values, chosen, axis=1)
                          for name, values in candidates.items()}
                tokens = tokens.at[:, frontier].set(picked["tokens"])
                parents = parents.at[:, frontier - 1].set(picked["parents"])
                score = score.at[:, frontier].set(picked["score"])
                rows = jnp.arange(batch)[:, None]
                candidates["score"] = candidates["score"].at[rows, chosen].set(-jnp.inf)
            if level > 0:
                pool.append(candidates)
        pool = {name: jnp.concatenate([c[name] for c in pool], axis=1) for name in pool[0]}
        leaf_score, best = jax.lax.top_k(pool["score"], self.num_nodes - self.num_expanded)
        leaves = slice(self.num_expanded + 1, size)
        tokens = tokens.at[:, leaves].set(jnp.take_along_axis(pool["tokens"], best, axis=1))
        parents = parents.at[:, leaves.start - 1:].set(
            jnp.take_along_axis(pool["parents"], best, axis=1))
        score = score.at[:, leaves].set(leaf_score)
        proposal = Proposal(
            tokens=tokens[:, 1:], parents=parents,
            valid=inherit_validity(score[:, 1:] > -jnp.inf, ancestor_matrix(parents)), q=None,
            reuse=None, stats={}, shape=self)
        missing = jnp.broadcast_to(jnp.arange(leaves.start, size), (batch, size - leaves.start))
        return proposal, kept, missing, carry
