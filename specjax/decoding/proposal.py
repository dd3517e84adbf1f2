"""What a drafter hands the loop each round: a token tree of static size, and the work its
verification may reuse.

Shapes. A proposal's static `shape` (chain.Chain, static_tree.StaticTree,
dynamic_tree.DynamicTree) drafts it from a one-token-per-node `DraftStep` and tells acceptance
which rule applies: a chain's or a tree's, greedy or by how sampled children were drawn
(`children`: "iid" from the parent's q, "without_replacement" from q with earlier siblings
removed, or "top_k", deterministic). The loop never branches on the shape itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import flax.struct
import jax
import jax.numpy as jnp

from specjax.decoding.sampling import SamplingParams
from specjax.decoding.shapes.tree import Layout

CHILD_RULES = ("iid", "without_replacement", "top_k")

# step(carry, tokens [B, n], layout) -> (draft logits [B, n, V] for the token after each input
# token, a per-token array [B, n, ...] the drafter keeps (e.g. its exit hidden state), carry).
# The layout says where each input token sits (cache slot, RoPE position, visible slots).
DraftStep = Callable[[Any, jax.Array, Layout], tuple[jax.Array, jax.Array, Any]]

# accept(what the step kept at the draft's input position [B, ..., D], the draft distribution
# [B, ..., V] (greedy: softmax at temperature 1), the drafted tokens [B, ...]) ->
# P(accepted) [B, ...]: a chain asks for one draft per row, a dynamic tree for every child
AcceptModel = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


@flax.struct.dataclass
class Reuse:
    """Verification work the drafter already did: `hidden` [B, 1+T, D] is every position's
    hidden state after layers [0, exit_layer), whose K/V the drafter wrote at the position's
    slot, except at positions `missing` [B, U], where those layers have not run."""

    hidden: jax.Array
    missing: jax.Array
    exit_layer: int = flax.struct.field(pytree_node=False)


@flax.struct.dataclass
class Proposal:
    """A token tree after the pending token (see `decoding.shapes.tree` for positions and slots).

    tokens [B, T]; parents [B, T] (-1: the pending token); valid [B, T] (invalid nodes and
    their descendants are never accepted); q [B, T, V], the draft distribution each node was
    drawn from (None when greedy or when sampled children are deterministic); reuse (None:
    verification runs every layer); stats, per-row counters [B] for this round that the loop
    adds up (a drafter's own statistics); shape, the static shape that drafted it.
    """

    tokens: jax.Array
    parents: jax.Array
    valid: jax.Array
    q: jax.Array | None
    reuse: Reuse | None
    stats: dict[str, jax.Array]
    shape: Shape = flax.struct.field(pytree_node=False)


class Shape(Protocol):
    """A static proposal shape: T nodes, at most D deep, at most C children per node."""

    is_chain: bool
    num_nodes: int
    verify_sizes: tuple[int, ...]  # node counts a verification pass may cover (ascending, the
    # last is num_nodes): the smallest holding every row's valid nodes runs (`pass_index`)
    depth: int
    max_children: int
    children: str  # how sampled children are drawn: one of CHILD_RULES

    def validate(self) -> None:
        """Raises ValueError for an impossible shape."""

    def label(self) -> str:
        """A short name for reports."""

    def draft(self, step: DraftStep, carry: Any, lengths: jax.Array, pending: jax.Array,
              key: jax.Array, sampling: SamplingParams | None, max_len: int,
              accept: AcceptModel | None = None) -> tuple[Proposal, jax.Array, jax.Array, Any]:
        """Drafts a proposal after `pending` [B] with `lengths` [B] committed tokens; `accept`,
        an acceptance model, decides where a chain stops (SpecDec++) and scores a dynamic
        tree's paths (a static tree's nodes are fixed: it has nothing to decide).

        Returns the proposal (reuse None, empty stats), what `step` kept at each position
        [B, 1+T, ...] (zeros where it did not run), the positions where it did not run [B, U],
        and the final carry."""


def pass_index(verify_sizes: tuple[int, ...], num_valid: jax.Array) -> jax.Array:
    """Which of a shape's `verify_sizes` a round verifies: the smallest that holds the most
    valid nodes of any row (`num_valid` [B]). A chain fills its rows to it, and `verify.verify`
    runs the pass of that size."""
    return jnp.searchsorted(jnp.asarray(verify_sizes), jnp.max(num_valid))


def depth_step(depth_logits: jax.Array, lengths: jax.Array) -> DraftStep:
    """The `DraftStep` of a drafter that proposes every depth at once (heads per depth as in
    Medusa or multi-token prediction, text copied by prompt lookup): a node at depth d + 1
    is drawn from `depth_logits` [B, D, V] row d, whatever its parent, so any shape drafts from
    it. `lengths` [B]: committed tokens (the pending token sits at depth 0). It runs nothing,
    keeps nothing and carries its carry through."""
    rows = jnp.arange(depth_logits.shape[0])[:, None]

    def step(carry: Any, tokens: jax.Array, layout: Layout) -> tuple[jax.Array, jax.Array, Any]:
        depth = jnp.clip(layout.positions - lengths[:, None], 0, depth_logits.shape[1] - 1)
        return depth_logits[rows, depth], jnp.zeros((*tokens.shape, 1), jnp.float32), carry

    return step
