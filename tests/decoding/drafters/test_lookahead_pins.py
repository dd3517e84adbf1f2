"""Lookahead's pool pinned where the fresh audits' plants got past test_lookahead.py: the
`evicted` counter (a decoding statistic) and an all-zero n-gram's insertion, by hand."""

import jax.numpy as jnp
import pytest

from specjax.decoding.drafter import Prefilled
from specjax.decoding.drafters.lookahead import Lookahead


@pytest.mark.parametrize("prompt, evicted", [([4] * 6, 0), ([1, 2, 3, 4, 5], 2)])
def test_only_an_inserted_ngram_counts_an_eviction(prompt, evicted):
    """A pool of one slot prefilled with 4 4 4 4 4 4 holds (4, 4, 4) once: its three repeats
    are already held, insert nothing and evict nothing (0); 1 2 3 4 5 inserts three distinct
    n-grams, each after the first pushing one out (2). Catches a full pool counted as an
    eviction whether or not an n-gram went in (3 for the repeats), which the random-token
    reference misses: its n-grams almost never repeat once the pool is full."""
    state = Lookahead(window=3, ngram=3, guesses=1, pool=1).prefill(None, Prefilled(
        prompts=jnp.asarray([prompt]), lengths=jnp.asarray([len(prompt)]), exit_hidden={},
        cache_len=16, max_new_tokens=4))
    assert int(state.evicted[0]) == evicted
    assert (int(state.keys[0, 0]), state.grams[0, 0].tolist()) == (prompt[-3], prompt[-2:])


def test_an_all_zero_ngram_goes_into_an_empty_pool():
    """The prompt 0 0 0 5 holds the n-grams (0, 0, 0) and (0, 0, 5); a pool of four empty
    slots takes both (ages 0 and 1), and a pending 0 then guesses 0 0. Catches an empty slot
    (age -1, its key and tokens 0) taken as holding the all-zero n-gram, so that it is never
    pooled or guessed, which random-token references rarely meet."""
    state = Lookahead(window=2, ngram=3, guesses=1, pool=4).prefill(None, Prefilled(
        prompts=jnp.asarray([[0, 0, 0, 5]]), lengths=jnp.asarray([4]), exit_hidden={},
        cache_len=16, max_new_tokens=4))
    held = sorted((int(a), int(k), state.grams[0, i].tolist())
                  for i, (a, k) in enumerate(zip(state.age[0], state.keys[0], strict=True))
                  if a >= 0)
    assert held == [(0, 0, [0, 0]), (1, 0, [0, 5])]
