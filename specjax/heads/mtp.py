"""DeepSeek-V3's multi-token prediction as a feature head: `depth` modules
(`specjax.nn.mtp.MtpModule`) on the target's last hidden state, one per drafted depth (module k
drafts depth k + 1 from module k - 1's output; deeper drafts reuse the last), each module's
output read by the target's own head (final norm and unembedding, shared). Trained on a frozen
model (`specjax/configs/mtp.py`) or with it (`model.mtp_depth`: the modules live in its params).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax

from specjax.config import ModelConfig
from specjax.heads.vocab_subset import DraftVocab, exit_head_logits
from specjax.model import Params
from specjax.nn.mtp import MtpModule, init_mtp


class MtpKind:
    """MTP as a `feature_head.FeatureHeadKind`; settings: `depth` (modules)."""

    name = "mtp"

    def exits(self, cfg: ModelConfig, settings: Mapping[str, Any]) -> tuple[int, ...]:
        return (cfg.num_layers,)

    def cell(self, cfg: ModelConfig) -> nn.Module:
        return MtpModule(cfg)

    def fuse(self, params: Params, head: Params, cfg: ModelConfig,
             hidden: Sequence[jax.Array]) -> jax.Array:
        (last,) = hidden
        return last.astype(cfg.compute_dtype)

    def logits(self, params: Params, head: Params, cfg: ModelConfig, features: jax.Array,
               vocab: DraftVocab | None = None) -> jax.Array:
        return exit_head_logits(params, cfg, features, vocab)

    def restrict_vocab(self, head: Params, ids: jax.Array) -> Params:
        """Unchanged: the modules draft through the target's shared head."""
        return head

    def init(self, params: Params, cfg: ModelConfig, settings: Mapping[str, Any]) -> Params:
        """`depth` fresh modules."""
        return init_mtp(cfg, jax.random.PRNGKey(0), settings["depth"])


MTP = MtpKind()

