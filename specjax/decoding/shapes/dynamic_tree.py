"""Dynamic token trees (EAGLE-2): the tree grows where the drafter is confident.

With a budget of T nodes, `top_k` = k and `depth` = D: the pending token's top k drafts form
depth 1; at every depth below, each of the k nodes of the previous depth proposes its top k
children, scored by cumulative draft log-probability along the path, and the k best of those
k^2 are expanded in turn (one batched drafter pass per depth, with the tree mask). The
remaining budget, T - k(D-1), goes to the best of all candidates that were not expanded
(children of expanded nodes at any depth). Unlike EAGLE-2's rerank, which may drop an expanded
node, every expanded node is kept: its K/V and exit state are reused by verification, so only
the leaves run the drafter's layers again and the verify pass has a static size.

With an acceptance model (SpecDec++'s head, `strategy specdec`) a path is scored instead by the
cumulative log of its drafts' predicted acceptance, the log-probability that the target accepts
the whole path: the tree grows where the head expects acceptance, not where the draft is sure.

Children are deterministic (the draft's top tokens), so sampling uses the top-k rule; which of
them the tree keeps depends on the draft alone, so any scoring stays lossless.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import flax.struct
import jax
import jax.numpy as jnp

from specjax.decoding.proposal import AcceptModel, DraftStep, Proposal
from specjax.decoding.sampling import SamplingParams, probabilities
from specjax.decoding.shapes.tree import ancestor_matrix, inherit_validity, tree_layout


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
    def verify_sizes(self) -> tuple[int, ...]:
        return (self.num_nodes,)  # every node is verified

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
              key: jax.Array, sampling: SamplingParams | None, max_len: int,
              accept: AcceptModel | None = None) -> tuple[Proposal, jax.Array, jax.Array, Any]:
        """As `Shape.draft`; with `accept`, paths are scored by predicted acceptance."""
        del key  # children are deterministic
        batch, k, size = pending.shape[0], self.top_k, self.num_nodes + 1
        rows = jnp.arange(batch)[:, None]
        # Positions: 0 the pending token, then k expanded nodes per depth 1 .. D-1, then leaves.
        # pool: every candidate of depths 2 .. D, k^2 per depth (expanded ones scored -inf).
        tree = _Drafting(
            tokens=jnp.zeros((batch, size), jnp.int32).at[:, 0].set(pending),
            parents=jnp.full((batch, size - 1), -1, jnp.int32),
            score=jnp.zeros((batch, size), jnp.float32),  # cumulative log q (or log accept)
            pool_tokens=jnp.zeros((batch, (self.depth - 1) * k * k), jnp.int32),
            pool_parents=jnp.zeros((batch, (self.depth - 1) * k * k), jnp.int32),
            pool_score=jnp.full((batch, (self.depth - 1) * k * k), -jnp.inf, jnp.float32),
            kept=None, carry=carry)

        def expand(tree: _Drafting, frontier: jax.Array):
            """Runs the drafter on the `frontier` positions; their top-k children, scored."""
            layout = tree_layout(lengths, ancestor_matrix(tree.parents), max_len).take(frontier)
            logits, kept_here, carry = step(tree.carry, tree.tokens[:, frontier], layout)
            kept = (jnp.zeros((batch, size, *kept_here.shape[2:]), kept_here.dtype)
                    if tree.kept is None else tree.kept).at[:, frontier].set(kept_here)
            log_q = (jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1) if sampling is None
                     else jnp.log(probabilities(logits, sampling)))
            child_score, child_tokens = jax.lax.top_k(log_q, k)              # [B, n, k]
            if accept is not None:
                child_score = jnp.where(child_score > -jnp.inf,
                                        _log_accept(accept, kept_here, log_q, child_tokens),
                                        -jnp.inf)
            candidates = (child_tokens.reshape(batch, -1).astype(jnp.int32),
                          jnp.broadcast_to(frontier[None, :, None] - 1,
                                           child_tokens.shape).reshape(batch, -1),
                          (tree.score[:, frontier, None] + child_score).reshape(batch, -1))
            return tree.replace(kept=kept, carry=carry), candidates

        def place(tree: _Drafting, depth, chosen, candidates) -> _Drafting:
            """Makes the `chosen` candidates [B, k] the expanded nodes of `depth`."""
            at = 1 + (depth - 1) * k + jnp.arange(k)
            token, parent, score = (jnp.take_along_axis(c, chosen, axis=1) for c in candidates)
            return tree.replace(tokens=tree.tokens.at[:, at].set(token),
                                parents=tree.parents.at[:, at - 1].set(parent),
                                score=tree.score.at[:, at].set(score))

        def pool(tree: _Drafting, depth, candidates) -> _Drafting:
            """Adds depth's candidates (already placed ones scored -inf) to the pool."""
            offset = (depth - 2) * k * k
            token, parent, score = candidates
            update = lambda buffer, values: jax.lax.dynamic_update_slice(buffer, values,
                                                                         (0, offset))
            return tree.replace(pool_tokens=update(tree.pool_tokens, token),
                                pool_parents=update(tree.pool_parents, parent),
                                pool_score=update(tree.pool_score, score))

        tree, candidates = expand(tree, jnp.zeros((1,), jnp.int32))
        tree = place(tree, 1, jnp.broadcast_to(jnp.arange(k), (batch, k)), candidates)

        def middle(depth, tree):  # expand depth - 1's nodes; the best k become depth's
            tree, candidates = expand(tree, 1 + (depth - 2) * k + jnp.arange(k))
            chosen = jax.lax.top_k(candidates[2], k)[1]
            tree = place(tree, depth, chosen, candidates)
            return pool(tree, depth, (*candidates[:2],
                                      candidates[2].at[rows, chosen].set(-jnp.inf)))

        tree = jax.lax.fori_loop(2, self.depth, middle, tree)
        tree, candidates = expand(tree, 1 + (self.depth - 2) * k + jnp.arange(k))
        tree = pool(tree, self.depth, candidates)
        leaf_score, best = jax.lax.top_k(tree.pool_score, self.num_nodes - self.num_expanded)
        leaves = slice(self.num_expanded + 1, size)
        tokens = tree.tokens.at[:, leaves].set(
            jnp.take_along_axis(tree.pool_tokens, best, axis=1))
        parents = tree.parents.at[:, leaves.start - 1:].set(
            jnp.take_along_axis(tree.pool_parents, best, axis=1))
        score = tree.score.at[:, leaves].set(leaf_score)
        proposal = Proposal(
            tokens=tokens[:, 1:], parents=parents,
            valid=inherit_validity(score[:, 1:] > -jnp.inf, ancestor_matrix(parents)), q=None,
            reuse=None, stats={}, shape=self)
        missing = jnp.broadcast_to(jnp.arange(leaves.start, size), (batch, size - leaves.start))
        return proposal, tree.kept, missing, tree.carry


def _log_accept(accept: AcceptModel, kept: jax.Array, log_q: jax.Array,
                tokens: jax.Array) -> jax.Array:
    """log P(accepted) [B, n, k] of the children `tokens` [B, n, k] of n nodes, from what the
    step kept at each node [B, n, ...] and its draft log-probabilities [B, n, V]."""
    kept = jnp.broadcast_to(kept[:, :, None], (*tokens.shape, *kept.shape[2:]))
    probs = jnp.broadcast_to(jnp.exp(log_q)[:, :, None], (*tokens.shape, log_q.shape[-1]))
    return jnp.log(jnp.maximum(accept(kept, probs, tokens), jnp.finfo(jnp.float32).tiny))


@flax.struct.dataclass
class _Drafting:
    """The tree as it grows (see `DynamicTree.draft`)."""

    tokens: jax.Array
    parents: jax.Array
    score: jax.Array
    pool_tokens: jax.Array
    pool_parents: jax.Array
    pool_score: jax.Array
    kept: Any
    carry: Any
