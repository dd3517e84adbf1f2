"""CALM's early exit (Schuster et al. 2022): a token leaves the model at the first candidate
exit where its confidence reaches a threshold, and the layers it skips still get its K/V.

A pass runs the layers exit segment by exit segment (static segments between the candidate
exits). After each segment the shared head reads the exit, a confidence measure scores it
(`specjax.heads.calm.MEASURES`: the softmax response, top-1 minus top-2 probability;
saturation, the cosine of consecutive hidden states; or the learned classifier), and
every token whose confidence reaches its threshold leaves with that exit's logits. Exits are
per token: a token that has left keeps its hidden state frozen while the others go on, so the
next segments still run on it, masked, and write the K/V each skipped layer projects from the
exited hidden state (CALM's state propagation; copying the exit layer's K/V instead is much
worse, per the paper). Once every token of the pass has left, the remaining segments run only
those K/V projections (`either`: a while loop of zero or one trip, since a `lax.cond` there
copied every layer cache it updated, about 8% of a decode step), skipping attention and MLP.
A token's exit therefore never depends on the other rows of its batch.

Thresholds decay with the position of the generated token (t5x `contrib/calm`):
lambda_t = lambda * (0.9 + 0.1 * exp(-tau * t / N)), N the generation budget. The paper prints
0.9 * lambda + 0.1 * exp(-tau * t / N), which never reaches 0; the released code's form makes
lambda = 0 exit every token at the first candidate. lambda >= 1 never exits early: the full
model.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import flax.struct
import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.decoding.branching import either
from specjax.decoding.shapes.tree import Layout
from specjax.heads.calm import MEASURES
from specjax.heads.vocab_subset import DraftVocab, exit_head_logits
from specjax.model import Params, embed, propagate_cached, run_layers_cached
from specjax.nn.cache import Cache


@flax.struct.dataclass
class ExitParams:
    """The traced part of early exiting (changing it never recompiles): the threshold lambda,
    its decay tau, and the classifier's weights ({} for the other measures)."""

    threshold: jax.Array
    decay: jax.Array
    head: Params


def decayed_threshold(params: ExitParams, generated: jax.Array, horizon: jax.Array) -> jax.Array:
    """lambda_t for the token after `generated` [...] generated ones, of `horizon` N; +inf (no
    early exit) when lambda >= 1."""
    lam = params.threshold
    value = lam * (0.9 + 0.1 * jnp.exp(-params.decay * generated / horizon))
    return jnp.where(lam >= 1, jnp.inf, value)


@flax.struct.dataclass
class Exited:
    """A pass's result per token [B, n]: the logits at its exit [B, n, V], its exit (the layers
    it ran), its confidence there, and the hidden state after the first candidate exit, which
    every token ran [B, n, D]."""

    logits: jax.Array
    exit: jax.Array
    confidence: jax.Array
    first: jax.Array


@flax.struct.dataclass
class _Pass:
    hidden: jax.Array    # frozen at the exit for tokens that have left
    below: jax.Array     # the hidden state one layer below `hidden`
    cache: Cache
    done: jax.Array
    exit: jax.Array
    confidence: jax.Array
    logits: jax.Array


@dataclasses.dataclass(frozen=True)
class EarlyExit:
    """exits: the candidate exits (ascending, each below num_layers; empty: the model's trained
    exits below the last); measure: a name in MEASURES."""

    exits: tuple[int, ...] = ()
    measure: str = "softmax"

    def candidates(self, cfg: ModelConfig) -> tuple[int, ...]:
        return self.exits or tuple(e for e in cfg.supervised_exits if e < cfg.num_layers)

    def validate(self, cfg: ModelConfig) -> None:
        if self.measure not in MEASURES:
            raise ValueError(f"calm_measure={self.measure!r}: choose from {sorted(MEASURES)}")
        exits = self.candidates(cfg)
        if not exits:
            raise ValueError("calm_exits: the model has no trained exit below its last layer; "
                             "name the candidate exits, e.g. --calm_exits 2,4,6")
        if list(exits) != sorted(set(exits)) or exits[0] < 1 or exits[-1] >= cfg.num_layers:
            raise ValueError(f"calm_exits={list(exits)} must be distinct ascending exits in "
                             f"[1, num_layers - 1 = {cfg.num_layers - 1}]")

    def label(self) -> str:
        return self.measure + (f" exits {','.join(map(str, self.exits))}" if self.exits else "")

    def run(self, params: Params, cfg: ModelConfig, head: Params, cache: Cache,
            tokens: jax.Array, layout: Layout, threshold: jax.Array, *,
            draft: bool = False, vocab: DraftVocab | None = None) -> tuple[Exited, Cache]:
        """Tokens [B, n] at `layout`, each leaving at its first candidate exit with confidence
        >= its `threshold` [B, n], else after the last layer (`draft`: at the last candidate,
        and the layers past it never run); every layer's K/V written at the tokens' slots,
        projected from the exited hidden state in the layers a token skipped. With `vocab`
        (a draft over part of the vocabulary) every exit's head scores its ids only, and the
        measure reads those logits: the softmax and its top two over the subset."""
        measure = MEASURES[self.measure]
        candidates = self.candidates(cfg)
        num_layers = candidates[-1] if draft else cfg.num_layers
        candidates = candidates[:-1] if draft else candidates
        hidden = embed(params, cfg, tokens)
        state = _Pass(hidden=hidden, below=hidden, cache=cache,
                      done=jnp.zeros(tokens.shape, bool),
                      exit=jnp.full(tokens.shape, num_layers, jnp.int32),
                      confidence=jnp.zeros(tokens.shape, jnp.float32),
                      logits=jnp.zeros((*tokens.shape, cfg.vocab_size), jnp.float32))

        def advance(s: _Pass, start: int, stop: int) -> _Pass:
            hidden, below, cache = s.hidden, s.below, s.cache
            for index in range(start, stop):
                out, cache = run_layers_cached(params, cfg, hidden, cache, layout.slots,
                                               layers=(index, index + 1),
                                               positions=layout.positions, mask=layout.mask)
                below, hidden = hidden, jnp.where(s.done[..., None], hidden, out)
            logits = exit_head_logits(params, cfg, hidden, vocab)
            score = measure(head, cfg, hidden, below, logits)
            leave = ~s.done & ((score >= threshold) | (stop == num_layers))
            return _Pass(hidden=hidden, below=below, cache=cache, done=s.done | leave,
                         exit=jnp.where(leave, stop, s.exit),
                         confidence=jnp.where(leave, score, s.confidence),
                         logits=jnp.where(leave[..., None], logits, s.logits))

        def propagate(s: _Pass, start: int, stop: int) -> _Pass:
            return s.replace(cache=propagate_cached(params, cfg, s.hidden, s.cache, layout.slots,
                                                    layout.positions, layout.mask,
                                                    layers=(start, stop)))

        segments = list(itertools.pairwise((0, *candidates, num_layers)))
        state = advance(state, *segments[0])  # every token runs up to the first candidate
        first = state.hidden
        for start, stop in segments[1:]:
            state = either(jnp.all(state.done),
                           functools.partial(propagate, start=start, stop=stop),
                           functools.partial(advance, start=start, stop=stop), state)
        return Exited(logits=state.logits, exit=state.exit, confidence=state.confidence,
                      first=first), state.cache
