"""DeepSeek-V3's multi-token prediction (strategy `mtp`): the feature-head drafter
(`drafters.feature_head`) with the MTP modules (`specjax.heads.mtp`)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from specjax.decoding.drafter import Strategy
from specjax.decoding.drafters.feature_head import OPTIONS, FeatureHead
from specjax.decoding.shapes.shape_options import shape_for
from specjax.heads.feature_head import FeatureHeadKind
from specjax.heads.mtp import MTP


@dataclasses.dataclass(frozen=True)
class Mtp(FeatureHead):
    """DeepSeek's multi-token prediction modules (`specjax.heads.mtp`)."""

    name: ClassVar[str] = "mtp"
    kind: ClassVar[FeatureHeadKind] = MTP


STRATEGIES = {"mtp": Strategy(lambda options: Mtp(shape_for(options)), OPTIONS)}
