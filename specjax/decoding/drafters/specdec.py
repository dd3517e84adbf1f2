"""SpecDec++ (Huang et al. 2024): self-speculation at exit E whose chain length a trained
acceptance head decides. After each draft the head predicts the probability that the target
accepts it (`specjax.heads.specdec`, from exit E's hidden state and the draft distribution);
a row stops drafting once the predicted probability that some draft so far is rejected,
1 - prod(accept), exceeds h (`Chain.stop_risk`, `--draft_risk`). K is the upper bound. A
dynamic tree (`--tree dynamic`) grows instead where the head predicts that the whole path is
accepted (`DynamicTree`: paths scored by the log of prod(accept), not of prod(q)).

The drafts are `selfspec`'s (the shared head at exit E), so verification reuses the shallow
layers the same way; the head only decides where a row's chain ends or which nodes a tree
keeps, which depends on the drafts alone: sampled decoding stays lossless.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import jax
from absl import logging

from specjax.config import ModelConfig
from specjax.decoding.draft_vocab import VocabOptions
from specjax.decoding.drafter import DraftContext, DraftWeights, Strategy
from specjax.decoding.drafters.exit_drafting import ExitOptions, HeadDrafter, draft_with_layers
from specjax.decoding.options import option, within
from specjax.decoding.proposal import Proposal
from specjax.decoding.shapes.dynamic_tree import DynamicTree
from specjax.decoding.shapes.shape_options import ShapeOptions, shape_for
from specjax.heads.specdec import acceptance_probability
from specjax.nn.cache import Cache


@dataclasses.dataclass(frozen=True)
class SpecDecHead(HeadDrafter):
    """exit_layer = E, the exit the head was trained on; shape: a `Chain` with `stop_risk` = h
    (and `num_draft` = K, the longest chain) or a `DynamicTree` the head scores. Its params are
    the head's."""

    name: ClassVar[str] = "specdec"
    head_kind: ClassVar[str] = "an acceptance head"

    def validate(self, cfg: ModelConfig) -> None:
        super().validate(cfg)
        if isinstance(self.shape, DynamicTree):
            return
        if not self.shape.is_chain or not self.shape.stop_risk:
            raise ValueError("strategy specdec drafts a chain whose length the acceptance head "
                             "decides (draft_risk h in (0, 1)) or a dynamic tree it grows "
                             "(--tree dynamic), not a static tree or a chain without h")

    def bind(self, weights: DraftWeights) -> SpecDecHead:
        """As `HeadDrafter.bind`; warns (once) when a head's recorded settings say it learned
        other drafts than this shape asks it about: a chain's drafts (`children` 0) against a
        dynamic tree's top k children, or fewer children than the tree's top k."""
        super().bind(weights)
        if isinstance(self.shape, DynamicTree):
            wanted = self.shape.top_k
        elif self.shape.is_chain and self.shape.stop_risk:
            wanted = 0
        else:
            return self  # a shape `validate` refuses (a static tree, a chain without h)
        if not weights.settings:
            return self  # hand-built weights: nothing recorded to compare
        trained = weights.settings.get("children", 0)
        if (trained == 0) != (wanted == 0) or trained < wanted:
            _warn_once(f"the specdec head was trained on {_drafts(trained)} and now scores "
                       f"{_drafts(wanted)}: train one with --config.specdec.children={wanted} "
                       "for what it predicts to match what decoding asks")
        return self

    def propose(self, ctx: DraftContext, state: Any, cache: Cache, pending: jax.Array,
                key: jax.Array) -> tuple[Proposal, Cache, Any]:
        def accept(hidden: jax.Array, probs: jax.Array, token: jax.Array) -> jax.Array:
            return acceptance_probability(ctx.draft_params, ctx.cfg, hidden, probs, token)

        proposal, cache, _ = draft_with_layers(ctx, self.shape, cache, pending, key,
                                               ((0, self.exit_layer),), accept=accept)
        return proposal, cache, state


def _drafts(children: int) -> str:
    return ("a chain's drafts (P(accepted) = min(1, p/q) sampled)" if not children else
            f"a dynamic tree's top {children} children (P(accepted) = p(x))")


@functools.cache
def _warn_once(message: str) -> None:
    logging.warning(message)


@dataclasses.dataclass(frozen=True)
class SpecDecOptions:
    """SpecDec++'s stop rule for a chain drafted with its acceptance head."""

    draft_risk: float = option(
        0.0, "Strategy specdec: a chain row stops drafting once its acceptance head predicts "
             "that some draft so far is rejected with probability above this (SpecDec++'s h; "
             "K is the longest chain). Other strategies, and specdec's dynamic trees (which the "
             "head scores), ignore it.", within(0, 1, high_included=False))


STRATEGIES = {"specdec": Strategy(
    lambda options: SpecDecHead(options.exit_layer, shape_for(options, options.draft_risk)),
    (ExitOptions, ShapeOptions, SpecDecOptions, VocabOptions))}
