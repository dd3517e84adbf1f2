"""LayerSkip self-speculation: draft with layers [0, E) + the shared head, verify with [E, L).

Drafting runs the shallow layers token by token, writing their K/V at slots lengths + k and
keeping each token's layer-E hidden state (the exit cache). Verification reuses both: the
shallow layers run only on the last draft (whose shallow K/V was never written), and the deep
layers run once on all K+1 saved hidden states. Nothing is recomputed or copied back; rejected
slots are left behind the committed length.
"""

import dataclasses

import jax
import jax.numpy as jnp

from specjax.cache import Cache
from specjax.config import ModelConfig
from specjax.decoding.sampling import SamplingParams, probabilities, sample
from specjax.decoding.strategy import Draft
from specjax.model import Params, embed, exit_logits, run_layers_cached


@dataclasses.dataclass(frozen=True)
class SelfSpeculative:
    """exit_layer = E (draft layers [0, E)); num_draft = K, the static draft length."""

    exit_layer: int
    num_draft: int

    def validate(self, cfg: ModelConfig) -> None:
        if not 1 <= self.exit_layer < cfg.num_layers:
            raise ValueError(f"exit_layer={self.exit_layer} must lie in [1, num_layers - 1 = "
                             f"{cfg.num_layers - 1}]")
        if self.num_draft < 1:
            raise ValueError(f"num_draft={self.num_draft} must be >= 1")

    def _shallow(self, params: Params, cfg: ModelConfig, tokens: jax.Array, cache: Cache,
                 write_pos: jax.Array) -> tuple[jax.Array, Cache]:
        return run_layers_cached(params, cfg, embed(params, cfg, tokens), cache, write_pos,
                                 layers=(0, self.exit_layer))

    def draft(self, params: Params, cfg: ModelConfig, cache: Cache, pending: jax.Array,
              key: jax.Array, sampling: SamplingParams | None) -> Draft:
        def step(carry, k):
            cache, token = carry
            hidden, cache = self._shallow(params, cfg, token[:, None], cache, cache.lengths + k)
            logits = exit_logits(params, cfg, hidden[:, 0])
            if sampling is None:
                probs, nxt = None, jnp.argmax(logits, axis=-1).astype(jnp.int32)
            else:
                probs = probabilities(logits, sampling)
                nxt = sample(jax.random.fold_in(key, k), probs)
            return (cache, nxt), (nxt, probs, hidden[:, 0])

        (cache, _), (tokens, probs, hidden) = jax.lax.scan(
            step, (cache, pending), jnp.arange(self.num_draft))
        return Draft(tokens=tokens.T, probs=None if probs is None else probs.transpose(1, 0, 2),
                     carry=hidden.transpose(1, 0, 2), cache=cache)

    def verify(self, params: Params, cfg: ModelConfig, pending: jax.Array,
               draft: Draft) -> tuple[jax.Array, Cache]:
        cache = draft.cache
        last, cache = self._shallow(params, cfg, draft.tokens[:, -1:], cache,
                                    cache.lengths + self.num_draft)
        exit_hidden = jnp.concatenate([draft.carry, last], axis=1)
        hidden, cache = run_layers_cached(params, cfg, exit_hidden, cache, cache.lengths,
                                          layers=(self.exit_layer, cfg.num_layers))
        return exit_logits(params, cfg, hidden), cache
