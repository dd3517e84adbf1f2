"""Teacher-forced CALM: reference text run token by token through the early exit, as decoding
would run it had it produced that text. Gives each reference token's log-loss under its exit's
distribution (CALM's risk consistency, the bench's per-token loss) and the exits taken."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.decoding.drafters.calm_exit import EarlyExit, ExitParams, decayed_threshold
from specjax.decoding.loop import prefill_target
from specjax.decoding.shapes.tree import chain_layout
from specjax.model import Params
from specjax.nn.cache import Cache


@functools.partial(jax.jit, static_argnames=("cfg", "early_exit", "cache_len"))
def forced_losses(params: Params, exit_params: ExitParams, prompts: jax.Array,
                  prompt_lengths: jax.Array, targets: jax.Array, *, cfg: ModelConfig,
                  early_exit: EarlyExit, cache_len: int) -> tuple[jax.Array, jax.Array]:
    """Per-token log-loss (nats) [B, T] of `targets` [B, T] after right-padded `prompts`
    [B, P] (true lengths [B]) and the exit that scored each [B, T]. The first target is scored
    by the prefill's full pass (exit num_layers), each later one by the early-exit pass over the
    target before it, whose threshold decays over the T targets as over a T-token generation.
    `params` has its layers unstacked; cache_len >= P + T."""
    batch, steps = targets.shape
    cache, last_logits, _ = prefill_target(params, cfg, prompts, prompt_lengths, cache_len)
    first_loss = _log_loss(last_logits, targets[:, 0])

    def step(cache: Cache, t: jax.Array):
        layout = chain_layout(cache.lengths, 1, cache.max_len)
        threshold = decayed_threshold(exit_params, jnp.full((batch, 1), t + 1), steps)
        exited, cache = early_exit.run(params, cfg, exit_params.head, cache, targets[:, t, None],
                                       layout, threshold)
        loss = _log_loss(exited.logits[:, 0], targets[:, t + 1])
        return cache.commit(cache.lengths + 1), (loss, exited.exit[:, 0])

    _, (losses, exits) = jax.lax.scan(step, cache, jnp.arange(steps - 1))
    full = jnp.full((batch, 1), cfg.num_layers, jnp.int32)
    return (jnp.concatenate([first_loss[:, None], losses.T], axis=1),
            jnp.concatenate([full, exits.T], axis=1))


def _log_loss(logits: jax.Array, targets: jax.Array) -> jax.Array:
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(log_probs, targets[:, None], axis=-1)[:, 0]
