"""LayerSkip self-speculation: draft with layers [0, E) + the shared head, verify with [E, L).

Drafting runs the shallow layers token by token, writing their K/V at slots lengths + k and
keeping each token's layer-E hidden state (the exit cache). Verification reuses both: the
shallow layers run only on the last valid draft (whose shallow K/V was never written), and the
deep layers run once on all K+1 saved hidden states. Nothing is recomputed or copied back; rejected
slots are left behind the committed length.
"""

import dataclasses

import jax
import jax.numpy as jnp

from specjax.cache import Cache
from specjax.config import ModelConfig
from specjax.decoding.drafting import draft_chain
from specjax.decoding.sampling import SamplingParams
from specjax.decoding.strategy import Draft
from specjax.model import Params, embed, exit_logits, run_layers_cached


@dataclasses.dataclass(frozen=True)
class SelfSpeculative:
    """exit_layer = E (draft layers [0, E)); num_draft = K, the static maximum draft length;
    draft_threshold = η: a row stops drafting after a draft whose draft probability is below η
    (0: always K drafts). See `drafting.draft_chain`."""

    exit_layer: int
    num_draft: int
    draft_threshold: float = 0.0

    def validate(self, cfg: ModelConfig) -> None:
        if not 1 <= self.exit_layer < cfg.num_layers:
            raise ValueError(f"exit_layer={self.exit_layer} must lie in [1, num_layers - 1 = "
                             f"{cfg.num_layers - 1}]")
        if self.num_draft < 1:
            raise ValueError(f"num_draft={self.num_draft} must be >= 1")
        if not 0 <= self.draft_threshold < 1:
            raise ValueError(f"draft_threshold={self.draft_threshold} must lie in [0, 1)")

    def _shallow(self, params: Params, cfg: ModelConfig, tokens: jax.Array, cache: Cache,
                 write_pos: jax.Array) -> tuple[jax.Array, Cache]:
        return run_layers_cached(params, cfg, embed(params, cfg, tokens), cache, write_pos,
                                 layers=(0, self.exit_layer))

    def draft(self, params: Params, cfg: ModelConfig, cache: Cache, pending: jax.Array,
              key: jax.Array, sampling: SamplingParams | None) -> Draft:
        def step(cache, token, k):
            hidden, cache = self._shallow(params, cfg, token[:, None], cache, cache.lengths + k)
            return exit_logits(params, cfg, hidden[:, 0]), hidden[:, 0], cache

        chain = draft_chain(step, cache, pending, key, sampling, num_draft=self.num_draft,
                            threshold=self.draft_threshold)
        return Draft(tokens=chain.tokens, probs=chain.probs, num_valid=chain.num_valid,
                     carry=chain.kept, cache=chain.cache)

    def verify(self, params: Params, cfg: ModelConfig, pending: jax.Array,
               draft: Draft) -> tuple[jax.Array, Cache]:
        cache, count = draft.cache, draft.num_valid
        last_token = jnp.take_along_axis(draft.tokens, (count - 1)[:, None], axis=1)
        last, cache = self._shallow(params, cfg, last_token, cache, cache.lengths + count)
        slots = jnp.arange(self.num_draft + 1)[None, :, None]
        exit_hidden = jnp.where(slots == count[:, None, None], last,
                                jnp.pad(draft.carry, ((0, 0), (0, 1), (0, 0))))
        hidden, cache = run_layers_cached(params, cfg, exit_hidden, cache, cache.lengths,
                                          layers=(self.exit_layer, cfg.num_layers))
        return exit_logits(params, cfg, hidden), cache
