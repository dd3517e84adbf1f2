"""Plain autoregressive decoding: the degenerate strategy with nothing drafted."""

import dataclasses

import jax
import jax.numpy as jnp

from specjax.cache import Cache
from specjax.config import ModelConfig
from specjax.decoding.sampling import SamplingParams
from specjax.decoding.strategy import Draft
from specjax.model import Params, embed, exit_logits, run_layers_cached


@dataclasses.dataclass(frozen=True)
class Autoregressive:
    num_draft: int = 0

    def validate(self, cfg: ModelConfig) -> None:
        if self.num_draft != 0:
            raise ValueError("Autoregressive drafts nothing: num_draft must be 0")

    def draft(self, params: Params, cfg: ModelConfig, cache: Cache, pending: jax.Array,
              key: jax.Array, sampling: SamplingParams | None) -> Draft:
        batch = pending.shape[0]
        probs = None if sampling is None else jnp.zeros((batch, 0, cfg.vocab_size), jnp.float32)
        return Draft(tokens=jnp.zeros((batch, 0), jnp.int32), probs=probs,
                     num_valid=jnp.zeros((batch,), jnp.int32), carry=None, cache=cache)

    def verify(self, params: Params, cfg: ModelConfig, pending: jax.Array,
               draft: Draft) -> tuple[jax.Array, Cache]:
        hidden, cache = run_layers_cached(params, cfg, embed(params, cfg, pending[:, None]),
                                          draft.cache, draft.cache.lengths)
        return exit_logits(params, cfg, hidden), cache
