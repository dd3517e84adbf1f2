"""Lookahead decoding (Fu et al. 2024, `lade`): Jacobi iteration on a window of W guessed
tokens feeds a pool of n-grams, and up to G pool n-grams that continue the pending token are
verified in the same pass. No weights, no draft compute beyond the pass itself.

The window's newest row is a chain of guesses for the W positions after the pending token;
verification runs it beside the guesses (one token tree: the window chain and G chains of
N - 1 pool tokens under the pending token), so the target's argmax at the pending token and at
each window token is the next Jacobi iterate (W + 1 tokens: the last window token's argmax
extends it). The last N - 1 iterates are kept: the diagonal (row 0 at column j, row 1 at
j + 1, ..., the new iterate at j + N - 1) is an n-gram whose
tokens were each generated after the one before it, and goes into the pool. The window then
moves forward by the tokens the round committed. The pool (a fixed capacity per row, seeded
with the prompt's n-grams) keeps distinct n-grams; when full, the oldest make room (counted:
stat `evicted`). All of it is state inside the jitted loop.

Our formulation runs only the newest iterate through the model (Jacobi decoding proper);
`lade` also runs the older rows for context, a cost we do not pay. Every draft is
deterministic, so acceptance treats every child as one (`children="top_k"`): exact when
sampling too. The window chain is itself verified: a Jacobi guess that has converged is
accepted like any draft.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.decoding.drafter import DraftContext, DrafterBase, Prefilled, Round, Strategy
from specjax.decoding.options import at_least, option
from specjax.decoding.proposal import Proposal
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.nn.cache import Cache


@dataclasses.dataclass(frozen=True)
class LookaheadOptions:
    """Lookahead decoding's window, n-gram size, guesses and pool (lade: W 7, N 5, G 7)."""

    lookahead_window: int = option(4, "Strategy lookahead: W, the Jacobi window's guessed "
                                      "positions.", at_least(1))
    lookahead_ngram: int = option(3, "Strategy lookahead: N, the n-gram size (N - 1 iterates "
                                     "kept; each n-gram drafts N - 1 tokens).", at_least(2))
    lookahead_guesses: int = option(3, "Strategy lookahead: G, the pool's n-grams verified "
                                       "per round.", at_least(0))
    lookahead_pool: int = option(64, "Strategy lookahead: the n-grams each row's pool holds "
                                     "(the oldest make room).", at_least(1))


@flax.struct.dataclass
class LookaheadState:
    """window [B, N-1, W]: the last N - 1 iterates, oldest first, over the W positions after the
    next pending token; keys [B, P] and grams [B, P, N-1]: the pool's n-grams (first token,
    the rest), `age` [B, P] their insertion order (-1: empty slot); `clock` [B] the next;
    `evicted` [B], the n-grams the last commit's insertions pushed out."""

    window: jax.Array
    keys: jax.Array
    grams: jax.Array
    age: jax.Array
    clock: jax.Array
    evicted: jax.Array


@dataclasses.dataclass(frozen=True)
class Lookahead(DrafterBase):
    """window W, ngram N, guesses G, pool P (see `LookaheadOptions`)."""

    window: int = 4
    ngram: int = 3
    guesses: int = 3
    pool: int = 64

    name: ClassVar[str] = "lookahead"
    mixable: ClassVar[bool] = False  # its commit reads the target at its own window's nodes

    @functools.cached_property
    def _layout(self) -> tuple[StaticTree, np.ndarray, np.ndarray]:
        """The proposal tree (level order) and where the window chain's [W] and each guess's
        [G, N-1] nodes sit in it."""
        chains = [("window", self.window)] + [(g, self.ngram - 1) for g in range(self.guesses)]
        index, parents, last = {}, [], {}
        for depth in range(max(length for _, length in chains)):
            for name, length in chains:
                if depth < length:
                    index[name, depth] = len(parents)
                    parents.append(last.get(name, -1))
                    last[name] = index[name, depth]
        window = np.asarray([index["window", d] for d in range(self.window)], np.int32)
        grams = np.asarray([[index[g, d] for d in range(self.ngram - 1)]
                            for g in range(self.guesses)], np.int32).reshape(
                                self.guesses, self.ngram - 1)
        return StaticTree(tuple(parents), "top_k"), window, grams

    @property
    def shape(self) -> StaticTree:
        return self._layout[0]

    def validate(self, cfg: ModelConfig) -> None:
        if self.window < self.ngram - 1:
            raise ValueError(f"lookahead_window={self.window} must be >= lookahead_ngram - 1 = "
                             f"{self.ngram - 1} (an n-gram spans N - 1 window columns)")
        if self.pool < self.guesses:
            raise ValueError(f"lookahead_pool={self.pool} must be >= lookahead_guesses="
                             f"{self.guesses}")

    def label(self) -> str:
        return f"{self.name} W={self.window} N={self.ngram} G={self.guesses}"

    def prefill(self, ctx: DraftContext, prefilled: Prefilled) -> LookaheadState:
        """The window filled with the prompt's last tokens; the pool with its n-grams."""
        prompts, lengths = prefilled.prompts, prefilled.lengths
        batch, width = prompts.shape
        n = self.ngram
        columns = lengths[:, None] - self.window + jnp.arange(self.window)[None, :]
        row = jnp.take_along_axis(prompts, jnp.clip(columns, 0, width - 1), axis=1)
        window = jnp.broadcast_to(row[:, None], (batch, n - 1, self.window))
        starts = jnp.arange(max(width - n + 1, 1))
        grams = jnp.take_along_axis(prompts[:, None, :], jnp.clip(
            starts[:, None] + jnp.arange(n)[None, :], 0, width - 1)[None], axis=2)
        found = starts[None, :] + n <= lengths[:, None]                         # [B, S]
        empty = LookaheadState(window, jnp.zeros((batch, self.pool), jnp.int32),
                               jnp.zeros((batch, self.pool, n - 1), jnp.int32),
                               jnp.full((batch, self.pool), -1, jnp.int32),
                               jnp.zeros((batch,), jnp.int32), jnp.zeros((batch,), jnp.int32))
        return self._insert(empty, grams, found)

    def propose(self, ctx: DraftContext, state: LookaheadState, cache: Cache,
                pending: jax.Array, key: jax.Array) -> tuple[Proposal, Cache, LookaheadState]:
        shape, window_nodes, gram_nodes = self._layout
        batch = pending.shape[0]
        tokens = jnp.zeros((batch, shape.num_nodes), jnp.int32)
        tokens = tokens.at[:, window_nodes].set(state.window[:, -1])
        valid = jnp.ones((batch, shape.num_nodes), bool)
        if self.guesses:
            match = (state.keys == pending[:, None]) & (state.age >= 0)
            recency, chosen = jax.lax.top_k(jnp.where(match, state.age, -1), self.guesses)
            guesses = jnp.take_along_axis(state.grams, chosen[..., None], axis=1)  # [B, G, N-1]
            tokens = tokens.at[:, gram_nodes].set(guesses)
            valid = valid.at[:, gram_nodes].set(jnp.broadcast_to(
                (recency >= 0)[..., None], guesses.shape))
        parents = jnp.broadcast_to(jnp.asarray(shape.parents, jnp.int32), tokens.shape)
        proposal = Proposal(tokens=tokens, parents=parents, valid=valid, q=None, reuse=None,
                            stats={"evicted": state.evicted}, shape=shape)
        return proposal, cache, state

    def commit(self, ctx: DraftContext, state: LookaheadState, done: Round) -> LookaheadState:
        """The next iterate from the target's argmax at the pending token and the window's
        nodes, its diagonal n-grams into the pool, the window moved past what was committed."""
        _, window_nodes, _ = self._layout
        n, w = self.ngram, self.window
        at = jnp.concatenate([jnp.zeros((1,), jnp.int32), 1 + jnp.asarray(window_nodes)])
        predicted = jnp.argmax(done.logits[:, at], axis=-1).astype(jnp.int32)  # [B, W+1]
        columns = jnp.arange(w - n + 2)[:, None] + jnp.arange(n)[None, :]        # [J, N]
        grams = jnp.concatenate([state.window[:, jnp.arange(n - 1)[None, :], columns[:, :-1]],
                                 predicted[:, columns[:, -1:]]], axis=2)         # [B, J, N]
        active = done.lengths_after > done.lengths_before
        state = self._insert(state, grams, jnp.broadcast_to(active[:, None], grams.shape[:2]))
        shift = jnp.where(active, done.lengths_after - done.lengths_before, 0)
        moved = jnp.clip(jnp.arange(w)[None, :] + shift[:, None], 0, w)            # [B, W]
        rows = jnp.concatenate([state.window[:, 1:], predicted[:, None, :w]], axis=1)
        extended = jnp.concatenate([rows, predicted[:, None, w:].repeat(n - 1, axis=1)],
                                   axis=2)                                       # [B, N-1, W+1]
        window = jnp.take_along_axis(extended, jnp.broadcast_to(moved[:, None], (
            moved.shape[0], n - 1, w)), axis=2)
        return state.replace(window=jnp.where(active[:, None, None], window, state.window))

    def _insert(self, state: LookaheadState, grams: jax.Array,
                keep: jax.Array) -> LookaheadState:
        """The pool with the n-grams `grams` [B, M, N] that `keep` [B, M] selects and it lacks
        added, one at a time into the oldest (or an empty) slot, counting the held n-grams
        that made room (`evicted`)."""

        def add(i, state):
            gram = grams[:, i]
            held = jnp.any((state.keys == gram[:, :1]) & jnp.all(
                state.grams == gram[:, None, 1:], axis=-1) & (state.age >= 0), axis=1)
            new = keep[:, i] & ~held
            slot = jnp.argmin(state.age, axis=1)   # an empty slot (-1), else the oldest
            rows = jnp.arange(gram.shape[0])
            full = jnp.take_along_axis(state.age, slot[:, None], axis=1)[:, 0] >= 0
            put = lambda table, value: table.at[rows, slot].set(  # noqa: E731
                jnp.where(new.reshape((-1,) + (1,) * (value.ndim - 1)), value, table[rows, slot]))
            return state.replace(keys=put(state.keys, gram[:, 0]),
                                 grams=put(state.grams, gram[:, 1:]),
                                 age=put(state.age, state.clock), clock=state.clock + new,
                                 evicted=state.evicted + (new & full))

        start = state.replace(evicted=jnp.zeros_like(state.evicted))
        return jax.lax.fori_loop(0, grams.shape[1], add, start)


STRATEGIES = {"lookahead": Strategy(lambda options: Lookahead(
    options.lookahead_window, options.lookahead_ngram, options.lookahead_guesses,
    options.lookahead_pool), (LookaheadOptions,))}
