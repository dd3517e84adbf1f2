"""Static token trees (Medusa, Sequoia): a fixed shape whose nodes get the draft's tokens.

The drafter runs once per depth, on every node of that depth that has children (one batched
pass with the tree mask), and each such node's children take the draft's top tokens in order
(greedy, or `children="top_k"` when sampling) or draws from its draft distribution q
(`"without_replacement"`: distinct tokens in sequence; `"iid"`: independent draws). Leaves
never run the drafter: verification runs them (`missing`), so every position is computed once.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoding.proposal import CHILD_RULES, AcceptModel, DraftStep, Proposal
from specjax.decoding.sampling import SamplingParams, draw_children
from specjax.decoding.shapes.tree import ancestor_matrix, inherit_validity, tree_layout


@dataclasses.dataclass(frozen=True)
class StaticTree:
    """Node i hangs below node parents[i] (-1: the pending token); nodes are in level order
    (every depth contiguous, parents first); `children` is how sampled children are drawn."""

    parents: tuple[int, ...]
    children: str = "without_replacement"

    is_chain: ClassVar[bool] = False

    @classmethod
    def from_branching(cls, branching: Sequence[int],
                       children: str = "without_replacement") -> StaticTree:
        """Every node at depth d has branching[d] children (`--tree 2,2,1,1`)."""
        parents, frontier = [], [-1]
        for width in branching:
            if width < 1:
                raise ValueError(f"tree branching {list(branching)}: every depth needs >= 1 "
                                 "child per node")
            next_frontier = []
            for parent in frontier:
                for _ in range(width):
                    parents.append(parent)
                    next_frontier.append(len(parents) - 1)
            frontier = next_frontier
        return cls(tuple(parents), children)

    @classmethod
    def from_parents(cls, parents: Sequence[int],
                     children: str = "without_replacement") -> StaticTree:
        """Any tree given as a parents list (parents before children), renumbered level by
        level; siblings keep their order (their rank among the draft's tokens)."""
        parents = [int(p) for p in parents]
        for i, parent in enumerate(parents):
            if not -1 <= parent < i:
                raise ValueError(f"tree parents: node {i} has parent {parent}; a parent must be "
                                 "-1 (the pending token) or an earlier node")
        depth = node_depths(parents)
        order = sorted(range(len(parents)), key=lambda i: (depth[i], i))
        renumbered = {old: new for new, old in enumerate(order)}
        return cls(tuple(renumbered[parents[old]] if parents[old] >= 0 else -1
                         for old in order), children)

    @classmethod
    def parse(cls, spec: str, children: str = "without_replacement") -> StaticTree:
        """`2,2,1,1` (children per node at each depth), a parents list in JSON (`[-1,0,0,1]`)
        or a JSON file holding one (or an object with a "parents" list)."""
        source = spec
        if os.path.isdir(spec):
            raise ValueError(f"tree {spec!r} is a directory, not a JSON file of parents")
        if os.path.exists(spec):
            try:
                with open(spec, encoding="utf-8") as f:
                    source = f.read()
            except (OSError, UnicodeDecodeError) as error:
                raise ValueError(f"tree {spec!r}: cannot read it ({error})") from None
        elif spec.endswith(".json") or os.sep in spec:
            raise ValueError(f"tree {spec!r}: no such file")
        elif not spec.lstrip().startswith("["):
            try:
                branching = [int(part) for part in spec.split(",")]
            except ValueError:
                raise ValueError(f"tree {spec!r}: expected children per depth like 2,2,1,1, a "
                                 "parents list, a JSON file of parents, 'dynamic' or 'auto'"
                                 ) from None
            return cls.from_branching(branching, children)
        try:
            loaded = json.loads(source)
        except json.JSONDecodeError as error:
            raise ValueError(f"tree {spec}: not valid JSON ({error})") from error
        parents = loaded.get("parents") if isinstance(loaded, dict) else loaded
        if not isinstance(parents, list) or not all(isinstance(p, int) for p in parents):
            raise ValueError(f'tree {spec}: expected a list of parent indices (or {{"parents": '
                             "[...]}})")
        return cls.from_parents(parents, children)

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    @property
    def verify_sizes(self) -> tuple[int, ...]:
        return (self.num_nodes,)  # every node is verified

    @functools.cached_property
    def _node_depths(self) -> list[int]:
        return node_depths(self.parents)

    @property
    def depth(self) -> int:
        return max(self._node_depths)

    @functools.cached_property
    def child_lists(self) -> list[list[int]]:
        """Child positions of every position (0: the pending token, node i at i + 1), siblings
        in order (their rank among the draft's tokens)."""
        lists = [[] for _ in range(self.num_nodes + 1)]
        for node, parent in enumerate(self.parents):
            lists[parent + 1].append(node + 1)
        return lists

    @property
    def max_children(self) -> int:
        return max(len(c) for c in self.child_lists)

    @functools.cached_property
    def expansions(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per depth: the positions with children [n] and their child positions [n, width]
        (-1 past a node's last child)."""
        depth_of = [0] + self._node_depths
        levels = []
        for level in range(self.depth):
            positions = [p for p, kids in enumerate(self.child_lists)
                         if kids and depth_of[p] == level]
            width = max(len(self.child_lists[p]) for p in positions)
            table = np.full((len(positions), width), -1, np.int32)
            for row, p in enumerate(positions):
                table[row, :len(self.child_lists[p])] = self.child_lists[p]
            levels.append((np.asarray(positions, np.int32), table))
        return levels

    @property
    def leaves(self) -> np.ndarray:
        """Positions of the nodes without children."""
        return np.asarray([p for p, kids in enumerate(self.child_lists) if p and not kids],
                          np.int32)

    def round_from_passes(self, draft: Callable[[int], float], leaves: Callable[[int], float],
                          verify: Callable[[int], float]) -> float:
        """A round's seconds from the seconds of its passes on n tokens, as `StaticTree.draft`
        and verification run them: `draft(n)`, a draft pass at each depth on the n nodes with
        children (the pending token first); `leaves(n)`, the drafter's layers on the leaves,
        which verification runs (`missing`); `verify(n)`, the rest of the verification, on
        the N nodes and the pending token. A chain of K is K one-token drafts, the last
        draft's drafter layers and a K + 1 token verification."""
        return (sum(draft(len(positions)) for positions, _ in self.expansions)
                + leaves(len(self.leaves)) + verify(self.num_nodes + 1))

    def validate(self) -> None:
        if not self.parents:
            raise ValueError("a tree needs at least one node")
        if self.children not in CHILD_RULES:
            raise ValueError(f"tree children={self.children!r} must be one of {CHILD_RULES}")
        if StaticTree.from_parents(self.parents, self.children) != self:
            raise ValueError(f"tree parents {list(self.parents)} must be in level order with "
                             "parents first (use StaticTree.from_parents)")

    def label(self) -> str:
        depth_of = [0] + self._node_depths
        branching = [len(self.child_lists[depth_of.index(d)]) for d in range(self.depth)]
        if StaticTree.from_branching(branching, self.children) == self:
            label = "tree " + ",".join(map(str, branching))
        else:
            label = f"tree T={self.num_nodes} D={self.depth}"
        return label + ("" if self.children == "without_replacement" else f" {self.children}")

    @functools.cached_property
    def segments(self) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """`expansions` grouped into runs of consecutive depths of the same shape (the long
        single-child tails of Sequoia trees, a chain's every depth): (first depth, positions
        [levels, n], child positions [levels, n, width] with -1 for no child). A run is drafted
        by one `fori_loop`, so the program does not grow with the depth."""
        runs: list[tuple[int, list, list]] = []
        for level, (positions, children) in enumerate(self.expansions):
            if runs and runs[-1][1][0].shape == positions.shape and (
                    runs[-1][2][0].shape == children.shape):
                runs[-1][1].append(positions)
                runs[-1][2].append(children)
            else:
                runs.append((level, [positions], [children]))
        return [(first, np.stack(positions), np.stack(children))
                for first, positions, children in runs]

    def draft(self, step: DraftStep, carry: Any, lengths: jax.Array, pending: jax.Array,
              key: jax.Array, sampling: SamplingParams | None, max_len: int,
              accept: AcceptModel | None = None) -> tuple[Proposal, jax.Array, jax.Array, Any]:
        """As `Shape.draft`; the nodes are fixed, so an acceptance model has nothing to decide."""
        del accept
        batch, size = pending.shape[0], self.num_nodes + 1
        parents = jnp.broadcast_to(jnp.asarray(self.parents, jnp.int32), (batch, size - 1))
        ancestors = ancestor_matrix(parents)
        layout = tree_layout(lengths, ancestors, max_len)
        sampled_q = sampling is not None and self.children != "top_k"
        # One spare position past the tree absorbs the writes of absent children.
        tokens = jnp.zeros((batch, size + 1), jnp.int32).at[:, 0].set(pending)
        logits_like, kept_like, _ = jax.eval_shape(step, carry, tokens[:, :1],
                                                   layout.take(np.zeros(1, np.int32)))
        state = (tokens, jnp.zeros((batch, size + 1, *kept_like.shape[2:]), kept_like.dtype),
                 jnp.zeros((batch, size + 1, logits_like.shape[-1]), jnp.float32)
                 if sampled_q else None, carry)

        def level(state, depth, positions, children):
            tokens, kept, q, carry = state
            logits, kept_here, carry = step(carry, tokens[:, positions], layout.take(positions))
            drawn, probs = draw_children(jax.random.fold_in(key, depth), logits, sampling,
                                         children.shape[1], self.children)
            targets = jnp.where(children >= 0, children, size)
            tokens = tokens.at[:, targets].set(drawn)
            if q is not None:
                q = q.at[:, targets].set(jnp.broadcast_to(probs[:, :, None], (
                    *drawn.shape, probs.shape[-1])))
            return tokens, kept.at[:, positions].set(kept_here), q, carry

        for first, positions, children in self.segments:
            if len(positions) == 1:
                state = level(state, first, positions[0], children[0])
            else:
                state = jax.lax.fori_loop(
                    0, len(positions), lambda i, state, first=first, positions=positions,
                    children=children: level(state, first + i, jnp.asarray(positions)[i],
                                             jnp.asarray(children)[i]), state)
        tokens, kept, q, carry = state
        tokens, kept, valid = tokens[:, 1:size], kept[:, :size], jnp.ones((batch, size - 1), bool)
        if q is not None:  # a distinct draw beyond q's support has probability 0: drop it
            q = q[:, 1:size]
            valid = jnp.take_along_axis(q, tokens[..., None], axis=-1)[..., 0] > 0
        proposal = Proposal(tokens=tokens, parents=parents,
                            valid=inherit_validity(valid, ancestors), q=q, reuse=None, stats={},
                            shape=self)
        missing = jnp.broadcast_to(jnp.asarray(self.leaves), (batch, len(self.leaves)))
        return proposal, kept, missing, carry


def node_depths(parents: Sequence[int]) -> list[int]:
    """The depth of every node of a parents list (1: a child of the pending token)."""
    depth = []
    for parent in parents:
        depth.append(1 if parent < 0 else depth[parent] + 1)
    return depth
