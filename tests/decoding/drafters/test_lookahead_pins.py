"""Lookahead's pool pinned where the fresh audit's plant got past test_lookahead.py: the
`evicted` counter (a decoding statistic) against a hand count."""

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
