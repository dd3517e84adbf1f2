"""LayerSkip's self-speculation (strategy `selfspec`; Elhoushi et al. 2024): draft with the
target's first E layers and its shared head (`exit_drafting.ExitDrafter`), verify with all of
them, reusing the drafted layers.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from specjax.decoding.draft_vocab import VocabOptions
from specjax.decoding.drafter import Strategy
from specjax.decoding.drafters.exit_drafting import ExitDrafter, ExitOptions
from specjax.decoding.shapes.shape_options import ShapeOptions, shape_for


@dataclasses.dataclass(frozen=True)
class SelfSpeculative(ExitDrafter):
    """LayerSkip: exit_layer = E and shape as for `ExitDrafter`."""

    name: ClassVar[str] = "selfspec"

    def hf_options(self) -> dict[str, Any] | None:
        """transformers `generate()` options for the same drafting policy (chains only: HF's
        assisted generation has no trees)."""
        if not self.shape.is_chain:
            return None
        return {"assistant_early_exit": self.exit_layer,
                "num_assistant_tokens": self.shape.num_draft,
                "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": self.shape.stop_below}


STRATEGIES = {
    "selfspec": Strategy(lambda options: SelfSpeculative(options.exit_layer, shape_for(options)),
                         (ExitOptions, ShapeOptions, VocabOptions)),
}
