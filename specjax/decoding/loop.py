"""The generate loop: prefill, then one `lax.while_loop` of draft -> verify -> accept -> commit.

One compiled program per (model config, strategy, static shapes, greedy or sampling). Rows are
independent: each keeps its own committed length, output count, done flag and statistics, and a
finished row simply stops committing while the others continue. The host sees nothing until the
loop ends.
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp

from specjax.cache import Cache
from specjax.config import ModelConfig
from specjax.decoding.acceptance import greedy_accept, speculative_accept
from specjax.decoding.sampling import SamplingParams, probabilities, sample
from specjax.decoding.strategy import Strategy
from specjax.model import Params, embed, exit_logits, run_layers_cached


@flax.struct.dataclass
class DecodeStats:
    """Per-row counters: rounds run, tokens drafted, drafts accepted."""

    rounds: jax.Array
    drafted: jax.Array
    accepted: jax.Array


@flax.struct.dataclass
class DecodeOutput:
    """tokens [B, max_new_tokens + K + 1] (row b valid up to num_tokens[b]) and statistics."""

    tokens: jax.Array
    num_tokens: jax.Array
    stats: DecodeStats


@flax.struct.dataclass
class _LoopState:
    cache: Cache
    pending: jax.Array      # [B] last emitted token, not yet in the cache
    tokens: jax.Array       # [B, max_new_tokens + K + 1]
    num_tokens: jax.Array   # [B] tokens emitted so far
    done: jax.Array         # [B]
    stats: DecodeStats
    round: jax.Array        # scalar, for PRNG keys


@functools.partial(jax.jit, static_argnames=("cfg", "strategy", "max_new_tokens", "cache_len"))
def generate_tokens(params: Params, prompts: jax.Array, prompt_lengths: jax.Array,
                    key: jax.Array, sampling: SamplingParams | None, eos_id: jax.Array, *,
                    cfg: ModelConfig, strategy: Strategy, max_new_tokens: int,
                    cache_len: int) -> DecodeOutput:
    """Generates up to `max_new_tokens` per row after right-padded prompts [B, P].

    Args:
      params: model parameters, layers unstacked (`model.unstack_layers`).
      prompt_lengths: [B] true prompt lengths (>= 1); padding after them is ignored.
      sampling: None for greedy decoding, else the sampling distribution's parameters.
      eos_id: scalar token id that ends a row (-1 for none); it is included in the output.
      cache_len: static cache size; must be >= P + max_new_tokens + num_draft.
    """
    batch = prompts.shape[0]
    num_draft = strategy.num_draft
    cache = Cache.allocate(cfg, batch, cache_len)
    hidden, cache = run_layers_cached(params, cfg, embed(params, cfg, prompts), cache,
                                      jnp.zeros((batch,), jnp.int32))
    last = jnp.take_along_axis(hidden, (prompt_lengths - 1)[:, None, None], axis=1)[:, 0]
    prefill_key, loop_key = jax.random.split(key)
    first = _pick(prefill_key, exit_logits(params, cfg, last), sampling)
    tokens = jnp.zeros((batch, max_new_tokens + num_draft + 1), jnp.int32).at[:, 0].set(first)
    zeros = jnp.zeros((batch,), jnp.int32)
    state = _LoopState(
        cache=cache.commit(prompt_lengths), pending=first, tokens=tokens,
        num_tokens=jnp.ones((batch,), jnp.int32),
        done=(first == eos_id) | (max_new_tokens <= 1),
        stats=DecodeStats(rounds=zeros, drafted=zeros, accepted=zeros),
        round=jnp.zeros((), jnp.int32))

    def one_round(s: _LoopState) -> _LoopState:
        draft_key, accept_key = jax.random.split(jax.random.fold_in(loop_key, s.round))
        draft = strategy.draft(params, cfg, s.cache, s.pending, draft_key, sampling)
        target_logits, cache = strategy.verify(params, cfg, s.pending, draft)
        if sampling is None:
            num_accepted, emitted = greedy_accept(draft.tokens, target_logits, draft.num_valid)
        else:
            num_accepted, emitted = speculative_accept(
                accept_key, draft.tokens, draft.probs, probabilities(target_logits, sampling),
                draft.num_valid)
        active = ~s.done
        count, hit_eos = _emitted_count(emitted, num_accepted, eos_id,
                                        max_new_tokens - s.num_tokens)
        written = jax.vmap(lambda row, new, at: jax.lax.dynamic_update_slice(row, new, (at,)))(
            s.tokens, emitted, s.num_tokens)
        num_tokens = s.num_tokens + jnp.where(active, count, 0)
        return _LoopState(
            cache=cache.commit(jnp.where(active, s.cache.lengths + num_accepted + 1,
                                         s.cache.lengths)),
            pending=jnp.where(active, jnp.take_along_axis(emitted, num_accepted[:, None], 1)[:, 0],
                              s.pending),
            tokens=jnp.where(active[:, None], written, s.tokens),
            num_tokens=num_tokens,
            done=s.done | hit_eos | (num_tokens >= max_new_tokens),
            stats=DecodeStats(rounds=s.stats.rounds + active,
                              drafted=s.stats.drafted + active * draft.num_valid,
                              accepted=s.stats.accepted + active * num_accepted),
            round=s.round + 1)

    final = jax.lax.while_loop(lambda s: ~jnp.all(s.done), one_round, state)
    return DecodeOutput(tokens=final.tokens, num_tokens=final.num_tokens, stats=final.stats)


def _pick(key: jax.Array, logits: jax.Array, sampling: SamplingParams | None) -> jax.Array:
    if sampling is None:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return sample(key, probabilities(logits, sampling))


def _emitted_count(emitted: jax.Array, num_accepted: jax.Array, eos_id: jax.Array,
                   room: jax.Array) -> tuple[jax.Array, jax.Array]:
    """How many of this round's tokens a row keeps: the accepted drafts plus one, cut after the
    first EOS and at the remaining budget `room`; and whether an EOS was kept."""
    positions = jnp.arange(emitted.shape[1])[None, :]
    is_eos = (emitted == eos_id) & (positions <= num_accepted[:, None])
    first_eos = jnp.argmax(is_eos, axis=1)
    hit = jnp.any(is_eos, axis=1) & (first_eos < room)
    count = jnp.where(hit, first_eos + 1, num_accepted + 1)
    return jnp.minimum(count, room).astype(jnp.int32), hit
