"""EAGLE-3 (Li et al. 2025; strategy `eagle`): the feature-head drafter
(`drafters.feature_head`) with EAGLE-3's layer (`specjax.heads.eagle`)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from specjax.decoding.drafter import Strategy
from specjax.decoding.drafters.feature_head import OPTIONS, FeatureHead
from specjax.decoding.shapes.shape_options import shape_for
from specjax.heads.eagle import EAGLE
from specjax.heads.feature_head import FeatureHeadKind


@dataclasses.dataclass(frozen=True)
class Eagle(FeatureHead):
    """EAGLE-3 (`specjax.heads.eagle`)."""

    name: ClassVar[str] = "eagle"
    kind: ClassVar[FeatureHeadKind] = EAGLE


STRATEGIES = {"eagle": Strategy(lambda options: Eagle(shape_for(options)), OPTIONS)}
