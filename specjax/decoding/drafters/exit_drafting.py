"""What the drafters at an exit share: `draft_with_layers`, drafting with a subset of the target's
layers and a head (the shared one, `shared_head`, or a trained one), `ExitDrafter`, drafting with
the first E layers (the base of `selfspec`, `kangaroo` and `specdec`), `HeadDrafter`, one with
a head trained at E (Kangaroo's adapter, SpecDec++'s acceptance head), and `ExitOptions`, the
exit E they read.

`draft_with_layers` runs the drafted layers on the nodes of the proposal's shape, writing their
K/V at the nodes' slots, and keeps each node's hidden state after the last layer before the
first one it leaves out. Up to there the draft is the target's own computation, so
verification reuses it (`Proposal.reuse`): those layers run only on the positions the drafting
never ran (a chain's last draft, a tree's leaves), the rest once on all of them, overwriting
whatever K/V the draft wrote there. Rejected slots are left behind the committed length.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax

from specjax.config import ModelConfig
from specjax.decoding.draft_vocab import VocabHead
from specjax.decoding.drafter import (
    DraftContext,
    DrafterBase,
    DraftWeights,
    trained_head_hint,
)
from specjax.decoding.options import option
from specjax.decoding.proposal import AcceptModel, Proposal, Reuse, Shape
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.tree import Layout
from specjax.heads.vocab_subset import exit_head_logits
from specjax.model import embed, run_layers_cached
from specjax.nn.cache import Cache

# head(ctx, hidden after the last drafted layer [B, n, D], layout, head_state) ->
# (draft logits [B, n, V], head_state): the shared exit head, or Kangaroo's adapter with its K/V.
DraftHead = Callable[[DraftContext, jax.Array, Layout, Any], tuple[jax.Array, Any]]


def shared_head(ctx: DraftContext, hidden: jax.Array, layout: Layout,
                head_state: Any) -> tuple[jax.Array, Any]:
    """The target's own exit head (final norm + unembedding, over `ctx.vocab`'s ids when the
    drafter drafts over part of the vocabulary); no state."""
    return exit_head_logits(ctx.params, ctx.cfg, hidden, ctx.vocab), head_state


def draft_with_layers(ctx: DraftContext, shape: Shape, cache: Cache, pending: jax.Array,
                      key: jax.Array, ranges: tuple[tuple[int, int], ...],
                      head: DraftHead = shared_head, head_state: Any = (),
                      accept: AcceptModel | None = None) -> tuple[Proposal, Cache, Any]:
    """A proposal of `shape` drafted by the layer ranges `ranges` (ascending, disjoint; the
    layers between them pass their input through) and `head`. The first range starts at layer
    0; its end is the exit whose hidden states verification reuses, and which the acceptance
    model `accept` reads (a chain's stop, a dynamic tree's scores). Returns the proposal, the
    target cache and the head's state."""
    reuse_exit = ranges[0][1]

    def step(carry: tuple[Cache, Any], tokens: jax.Array, layout: Layout):
        cache, head_state = carry

        def run(hidden, cache, layers):
            return run_layers_cached(ctx.params, ctx.cfg, hidden, cache, layout.slots,
                                     layers=layers, positions=layout.positions, mask=layout.mask)

        kept, cache = run(embed(ctx.params, ctx.cfg, tokens), cache, ranges[0])
        hidden = kept
        for layers in ranges[1:]:
            hidden, cache = run(hidden, cache, layers)
        logits, head_state = head(ctx, hidden, layout, head_state)
        return logits, kept, (cache, head_state)

    proposal, kept, missing, (cache, head_state) = shape.draft(
        step, (cache, head_state), cache.lengths, pending, key, ctx.sampling, cache.max_len,
        accept=accept)
    return proposal.replace(reuse=Reuse(kept, missing, reuse_exit)), cache, head_state


@dataclasses.dataclass(frozen=True)
class ExitDrafter(VocabHead, DrafterBase):
    """Self-speculation at exit E: exit_layer = E (draft layers [0, E) and the shared head);
    shape: a `Chain` (K drafts, optional confidence stop), a `StaticTree` or a `DynamicTree`.
    The base of `selfspec` (`drafters.layerskip`) and of the drafters with a head at E."""

    exit_layer: int
    shape: Shape = Chain(num_draft=4)

    name: ClassVar[str]

    def validate(self, cfg: ModelConfig) -> None:
        problem = _inside_the_model(self.exit_layer, cfg)
        if problem:
            raise ValueError(f"exit_layer={self.exit_layer} {problem}")
        self.shape.validate()

    def label(self) -> str:
        return f"{self.name} E={self.exit_layer} {self.shape.label()}{self.vocab_label()}"

    @property
    def verify_from(self) -> int:
        """Verification reuses the draft's layers [0, E) (their cache is written)."""
        return self.exit_layer

    def propose(self, ctx: DraftContext, state: Any, cache: Cache, pending: jax.Array,
                key: jax.Array) -> tuple[Proposal, Cache, Any]:
        proposal, cache, _ = draft_with_layers(ctx, self.shape, cache, pending, key,
                                               ((0, self.exit_layer),))
        return proposal, cache, state


@dataclasses.dataclass(frozen=True)
class HeadDrafter(ExitDrafter):
    """Self-speculation at exit E with a head trained there on the frozen target (Kangaroo's
    adapter, SpecDec++'s acceptance head): its params are the head's, trained by
    `specjax/configs/<name>.py` and loaded from the head's workdir."""

    needs_weights: ClassVar[bool] = True
    head_kind: ClassVar[str]  # what the head is, for messages

    @property
    def weights_hint(self) -> str:
        return trained_head_hint(self.head_kind, self.name)

    def bind(self, weights: DraftWeights) -> HeadDrafter:
        """This drafter, checked against the head it is given."""
        if weights.exit_layer != self.exit_layer:
            raise ValueError(f"the {self.name} head was trained at exit_layer="
                             f"{weights.exit_layer}, not {self.exit_layer}")
        return self  # no hf_options: transformers has neither head


def _inside_the_model(value: int, cfg: ModelConfig) -> str | None:
    return (None if 1 <= value < cfg.num_layers
            else f"must lie in [1, num_layers - 1 = {cfg.num_layers - 1}]")


@dataclasses.dataclass(frozen=True)
class ExitOptions:
    """The exit E whose layers [0, E) draft (LayerSkip; Kangaroo's and SpecDec++'s heads sit
    there)."""

    exit_layer: int = option(1, "Draft exit layer E: drafting runs layers [0, E) and the shared "
                                "head.", _inside_the_model)
