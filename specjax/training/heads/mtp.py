"""Training DeepSeek-style multi-token-prediction modules (`specjax.heads.mtp`) on a frozen
base: module k drafts depth k + 1 from module k - 1's output, trained by training-time test
(`training.heads.feature_head`), the depths' losses weighted by decay**k (DeepSeek-V3 averages
them: decay 1)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from specjax.config import check
from specjax.heads.feature_head import FeatureHeadKind
from specjax.heads.mtp import MTP
from specjax.training.heads.feature_head import UnrolledHead


@dataclasses.dataclass(frozen=True)
class MtpConfig:
    """`depth` MTP modules on the last hidden state of the frozen model in `base_workdir`.
    Decoding with them: `--strategy mtp` on the head's workdir (chains and trees of any depth;
    depths past `depth` reuse the last module)."""

    depth: int = 2
    decay: float = 1.0

    def __post_init__(self) -> None:
        check(isinstance(self.depth, int) and self.depth >= 1, "mtp.depth", self.depth,
              "must be an int >= 1")
        check(isinstance(self.decay, (int, float)) and 0 < self.decay <= 1, "mtp.decay",
              self.decay, "must lie in (0, 1]")

    @property
    def steps(self) -> int:
        """Training-time test unrolls one step per module."""
        return self.depth


class MtpObjective(UnrolledHead):
    """`mtp.depth` modules on the frozen `base`."""

    name: ClassVar[str] = "mtp"
    config_class: ClassVar[type] = MtpConfig
    record_key: ClassVar[str] = "mtp"
    kind: ClassVar[FeatureHeadKind] = MTP


HEADS = {"mtp": MtpObjective}
