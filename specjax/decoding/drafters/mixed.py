"""Mixed trees: one proposal whose branches below the pending token come from several drafters
(an n-gram chain beside an EAGLE chain, a Medusa tree beside a LayerSkip chain), verified in
one pass.

Each branch drafter proposes its own tree of its own shape, with its own state, in turn; the
mixed proposal places them side by side (branch b's node i is node offset_b + i, its roots
children of the pending token), and verification runs the full model on all of them (a branch
that drafted with the target's layers may have written their K/V at its own slots: the full
pass overwrites every node's). Every branch then commits the round as a chain of what was
accepted (`accepted_chain`), whichever branch drafted it: so a branch is a drafter whose state
follows the committed text and the target's features along it (`mixable`), not one that keeps
the K/V of its own drafts (a draft model, Kangaroo's adapter).

Acceptance. Greedy: the deepest path the target's argmax follows, whichever branch it lies in.
Sampled: children of one node may come from different drafters, so they are not draws of one
distribution q; every node is taken as a deterministic child (`children="top_k"`): child x is
accepted with the running target probability p(x), else x is removed from p and p
renormalised before the next child, the token drawn from what is left if none is. The rule is
exact for any drafts chosen independently of the target's draws, so the mixed tree is
lossless whatever each branch drafted and however; it gives up the min(1, p/q) acceptance of a
single sampled branch (one deterministic child accepted with p(x) <= min(1, p(x)/q(x))).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.decoding.acceptance import Acceptance
from specjax.decoding.drafter import (
    DraftContext,
    Drafter,
    DrafterBase,
    DraftWeights,
    Prefilled,
    Round,
    Strategy,
)
from specjax.decoding.options import option
from specjax.decoding.proposal import Proposal, Shape
from specjax.decoding.shapes.chain import Chain
from specjax.nn.cache import Cache, along_path


@dataclasses.dataclass(frozen=True)
class MixedShape:
    """Branch shapes side by side under the pending token (drafted by their drafters, never by
    the shape itself); its children are deterministic (`top_k`, see the module)."""

    branches: tuple[Shape, ...]

    is_chain: ClassVar[bool] = False
    children: ClassVar[str] = "top_k"

    @property
    def num_nodes(self) -> int:
        return sum(shape.num_nodes for shape in self.branches)

    @property
    def verify_sizes(self) -> tuple[int, ...]:
        """A pass up to each branch's last node: a round whose later branches drafted nothing
        (no n-gram matched) verifies only the earlier ones."""
        return tuple(offset + shape.num_nodes
                     for offset, shape in zip(self.offsets, self.branches, strict=True))

    @property
    def depth(self) -> int:
        return max(shape.depth for shape in self.branches)

    @property
    def max_children(self) -> int:
        """At most every branch's roots under the pending token (a bound elsewhere)."""
        return sum(shape.max_children for shape in self.branches)

    @property
    def offsets(self) -> tuple[int, ...]:
        """Each branch's first node in the mixed tree."""
        sizes = [shape.num_nodes for shape in self.branches]
        return tuple(sum(sizes[:b]) for b in range(len(sizes)))

    def validate(self) -> None:
        for shape in self.branches:
            shape.validate()

    def label(self) -> str:
        return " + ".join(shape.label() for shape in self.branches)

    def draft(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a mixed tree is drafted by its branches' drafters")


@dataclasses.dataclass(frozen=True)
class Mixed(DrafterBase):
    """branches: the drafters of the tree's branches, in order (at least two, distinct)."""

    branches: tuple[Drafter, ...]

    name: ClassVar[str] = "mixed"
    mixable: ClassVar[bool] = False

    @property
    def shape(self) -> MixedShape:
        return MixedShape(tuple(branch.shape for branch in self.branches))

    @property
    def needs_weights(self) -> bool:
        return any(branch.needs_weights for branch in self.branches)

    @property
    def weights_hint(self) -> str:
        return "; ".join(b.weights_hint for b in self.branches if b.needs_weights)

    @property
    def prefill_exits(self) -> tuple[int, ...]:
        return tuple(sorted({e for branch in self.branches for e in branch.prefill_exits}))

    @property
    def feature_exits(self) -> tuple[int, ...]:
        return tuple(sorted({e for branch in self.branches for e in branch.feature_exits}))

    def with_weights(self, weights: Mapping[str, DraftWeights]) -> tuple[Mixed, Any]:
        bound = [branch.with_weights(weights) for branch in self.branches]
        return (dataclasses.replace(self, branches=tuple(b for b, _ in bound)),
                tuple(params for _, params in bound))

    @property
    def draft_vocab(self) -> int:
        """The ids its branches with a vocabulary head draft over (0: all)."""
        return max(getattr(branch, "draft_vocab", 0) for branch in self.branches)

    def restrict_vocab(self, draft_params: tuple, ids: jax.Array) -> tuple:
        return tuple(branch.restrict_vocab(params, ids)
                     for branch, params in zip(self.branches, draft_params, strict=True))

    def bind(self, weights: DraftWeights) -> Mixed:
        raise TypeError("a mixed tree binds each branch to its own weights (with_weights)")

    def validate(self, cfg: ModelConfig) -> None:
        names = [branch.name for branch in self.branches]
        if len(names) < 2 or len(set(names)) != len(names):
            raise ValueError(f"mix={','.join(names)}: a mixed tree needs two or more distinct "
                             "drafters")
        for branch in self.branches:
            if not branch.mixable:
                raise ValueError(f"mix={','.join(names)}: {branch.name} cannot be a branch "
                                 "of a mixed tree (it proposes nothing, verifies on its own or "
                                 "keeps state of its own drafts)")
            branch.validate(cfg)

    def label(self) -> str:
        return f"{self.name} " + " + ".join(branch.label() for branch in self.branches)

    def _contexts(self, ctx: DraftContext) -> list[DraftContext]:
        return [ctx.replace(draft_params=params) for params in ctx.draft_params]

    def prefill(self, ctx: DraftContext, prefilled: Prefilled) -> tuple:
        return tuple(branch.prefill(sub, prefilled)
                     for branch, sub in zip(self.branches, self._contexts(ctx), strict=True))

    def propose(self, ctx: DraftContext, state: tuple, cache: Cache, pending: jax.Array,
                key: jax.Array) -> tuple[Proposal, Cache, tuple]:
        proposals, states = [], []
        for b, (branch, sub, sub_state) in enumerate(zip(self.branches, self._contexts(ctx),
                                                         state, strict=True)):
            proposal, cache, sub_state = branch.propose(sub, sub_state, cache, pending,
                                                        jax.random.fold_in(key, b))
            proposals.append(proposal)
            states.append(sub_state)
        shape = self.shape
        parents = [jnp.where(p.parents < 0, -1, p.parents + offset)
                   for p, offset in zip(proposals, shape.offsets, strict=True)]
        stats = {f"{branch.name}_{name}": value for branch, p in zip(
            self.branches, proposals, strict=True) for name, value in p.stats.items()}
        mixed = Proposal(tokens=jnp.concatenate([p.tokens for p in proposals], axis=1),
                         parents=jnp.concatenate(parents, axis=1),
                         valid=jnp.concatenate([p.valid for p in proposals], axis=1),
                         q=None, reuse=None, stats=stats, shape=shape)
        return mixed, cache, tuple(states)

    def commit(self, ctx: DraftContext, state: tuple, done: Round) -> tuple:
        chain = accepted_chain(done)
        return tuple(branch.commit(sub, sub_state, chain) for branch, sub, sub_state in zip(
            self.branches, self._contexts(ctx), state, strict=True))


def accepted_chain(done: Round) -> Round:
    """A mixed round as every branch sees it: a chain of the mixed tree's depth whose first
    `num_accepted` nodes are the accepted path, whichever branch drafted it (the target's
    features and logits along it), so a branch's state follows the committed text even when
    another branch's drafts were taken."""
    accepted, nodes = done.acceptance, done.proposal
    depth = accepted.path.shape[1]
    steps = jnp.arange(depth)[None, :]
    chain = Proposal(tokens=jnp.take_along_axis(nodes.tokens, accepted.path, axis=1),
                     parents=jnp.broadcast_to(steps - 1, accepted.path.shape),
                     valid=steps < accepted.num_accepted[:, None], q=None, reuse=None,
                     stats={}, shape=Chain(depth))
    return dataclasses.replace(
        done, proposal=chain, acceptance=Acceptance(accepted.num_accepted, accepted.emitted,
                                                    None),
        reused_hidden=None,
        features={e: along_path(f, accepted.path) for e, f in done.features.items()},
        logits=None if done.logits is None else along_path(done.logits, accepted.path))


def _mix_spec(value: str, cfg: object) -> str | None:
    names = [name.strip() for name in value.split(",") if name.strip()]
    if value.strip() and len(names) < 2:
        return "must name two or more drafters, comma-separated (e.g. selfspec,ngram)"
    return None


@dataclasses.dataclass(frozen=True)
class MixOptions:
    """The drafters whose proposals the `mixed` strategy puts side by side."""

    mix: str = option("selfspec,ngram", "Strategy mixed: the drafters whose proposals are its "
                                        "tree's branches, comma-separated (each drafts the "
                                        "chain or tree the shape options describe; put those "
                                        "that often draft nothing last: a round verifies up "
                                        "to the last branch that drafted).",
                      _mix_spec, listed=True)


def _build(options: Any, make: Callable[[str], Drafter]) -> Mixed:
    return Mixed(tuple(make(name.strip()) for name in options.mix.split(",") if name.strip()))


STRATEGIES = {"mixed": Strategy(_build, (MixOptions,), composite=True)}
