"""Layer skipping (strategy `skip`; Draft & Verify, Zhang et al. 2023; SWIFT, Xia et al. 2024):
draft with every layer of the target but a skipped set, each skipped layer passing its input
through, and the shared head (`exit_drafting.draft_with_layers`); verification reuses the
layers before the first skipped one. `infer/skip_search.py` searches for a set.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, ClassVar

import jax

from specjax.config import ModelConfig, layer_numbers
from specjax.decoding.draft_vocab import VocabHead, VocabOptions
from specjax.decoding.drafter import DraftContext, DrafterBase, Strategy
from specjax.decoding.drafters.exit_drafting import draft_with_layers
from specjax.decoding.options import option
from specjax.decoding.proposal import Proposal, Shape
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.shape_options import ShapeOptions, shape_for
from specjax.nn.cache import Cache


@dataclasses.dataclass(frozen=True)
class SkipLayers(VocabHead, DrafterBase):
    """skip: the 0-based indices of the layers the draft passes over (Draft & Verify, SWIFT);
    shape: as for `ExitDrafter`. Skipping layers E..L-1 is `selfspec` at exit E."""

    skip: tuple[int, ...]
    shape: Shape = Chain(num_draft=4)

    name: ClassVar[str] = "skip"

    def validate(self, cfg: ModelConfig) -> None:
        if not self.skip or list(self.skip) != sorted(set(self.skip)):
            raise ValueError(f"skip_layers={list(self.skip)} must be distinct layer indices in "
                             "ascending order, at least one")
        if self.skip[0] < 1 or self.skip[-1] >= cfg.num_layers:
            raise ValueError(f"skip_layers={list(self.skip)} must lie in [1, num_layers - 1 = "
                             f"{cfg.num_layers - 1}] (the draft needs layer 0)")
        self.shape.validate()

    def label(self) -> str:
        return (f"{self.name} {','.join(map(str, self.skip))} {self.shape.label()}"
                f"{self.vocab_label()}")

    def ranges(self, num_layers: int) -> tuple[tuple[int, int], ...]:
        """The contiguous runs of drafted layers, as (start, stop)."""
        bounds = [-1, *self.skip, num_layers]
        return tuple((a + 1, b) for a, b in itertools.pairwise(bounds) if b > a + 1)

    def propose(self, ctx: DraftContext, state: Any, cache: Cache, pending: jax.Array,
                key: jax.Array) -> tuple[Proposal, Cache, Any]:
        proposal, cache, _ = draft_with_layers(ctx, self.shape, cache, pending, key,
                                               self.ranges(ctx.cfg.num_layers))
        return proposal, cache, state


@dataclasses.dataclass(frozen=True)
class SkipOptions:
    """The layers the `skip` strategy's draft passes over."""

    skip_layers: str = option("", "Strategy skip: the layers its draft passes over (0-based, "
                                  "comma-separated, e.g. 2,3,5).", listed=True)


def skip_set(options: SkipOptions) -> tuple[int, ...]:
    """The layers `skip_layers` names ("2,3,5"), as sorted indices."""
    layers = layer_numbers(options.skip_layers, "skip_layers")
    if not layers:
        raise ValueError("strategy 'skip' needs --skip_layers (comma-separated layer indices)")
    return layers


STRATEGIES = {
    "skip": Strategy(lambda options: SkipLayers(skip_set(options), shape_for(options)),
                     (SkipOptions, ShapeOptions, VocabOptions)),
}
