"""The drafting-strategy interface of the generate loop.

A strategy is a frozen (hashable, static) dataclass with two pure functions. Each round the loop
calls `draft` (propose up to `num_draft` tokens after the pending token) and `verify` (target
logits for the pending token and every draft); acceptance and commit are the loop's. New ideas
(Kangaroo, CALM, a separate draft model) are new strategies, not new loops.
"""

from __future__ import annotations

from typing import Any, Protocol

import flax.struct
import jax

from specjax.cache import Cache
from specjax.config import ModelConfig
from specjax.decoding.sampling import SamplingParams
from specjax.model import Params


@flax.struct.dataclass
class Draft:
    """A proposal: tokens [B, K], their draft distributions q [B, K, V] (None when greedy), how
    many leading drafts of each row count (`num_valid` [B]; the verifier ignores the rest), any
    strategy-specific state for `verify` (`carry`), and the cache after drafting."""

    tokens: jax.Array
    probs: jax.Array | None
    num_valid: jax.Array
    carry: Any
    cache: Cache


class Strategy(Protocol):
    num_draft: int

    def validate(self, cfg: ModelConfig) -> None:
        """Raises ValueError if the strategy cannot run on this model."""

    def draft(self, params: Params, cfg: ModelConfig, cache: Cache, pending: jax.Array,
              key: jax.Array, sampling: SamplingParams | None) -> Draft:
        """Proposes up to `num_draft` tokens after `pending` [B] (the last emitted token, not
        yet in the cache). `sampling` is None for greedy decoding."""

    def verify(self, params: Params, cfg: ModelConfig, pending: jax.Array,
               draft: Draft) -> tuple[jax.Array, Cache]:
        """Target logits [B, K+1, V] at the pending token and each draft, and the cache with
        every layer's K/V written for those tokens at slots lengths .. lengths + K; slots after
        a row's `num_valid` drafts may hold anything."""
