"""Lookahead decoding (strategy `lookahead`): greedy output against a per-step argmax of
`model.forward` (batch 3, ragged prompts), the Jacobi window, the n-gram pool and its capacity
against a plain-Python reference, the tree it proposes, EOS, options and export. The sampled
law is in test_decoding_sampling."""

import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import model as M
from specjax.decoding.acceptance import Acceptance
from specjax.decoding.drafter import DraftContext, Prefilled, Round
from specjax.decoding.drafters.lookahead import Lookahead
from specjax.decoding.engine import Generator
from specjax.decoding.registry import DecodingConfig, make_strategy
from tests.decoding.drafters.test_feature_heads import CFG, PROMPTS
from tests.support.decoding import check_eos_mid_draft, export_decode_loop, per_step_argmax
from tests.support.models import damped_params

NEW, VOCAB = 30, 9


@pytest.fixture(scope="module")
def generator():
    return Generator(M.unstack_layers(damped_params(CFG, jax.random.PRNGKey(0), 0.5), CFG),
                     CFG)


@pytest.mark.parametrize("drafter", [Lookahead(4, 3, 3, 64), Lookahead(3, 2, 2, 4),
                                     Lookahead(5, 4, 0, 8)], ids=lambda d: d.label())
def test_greedy_lookahead_is_a_per_step_argmax_of_the_model(generator, drafter):
    """Catches a window or pool token accepted that the model would not emit (window and guess
    nodes hung below the wrong parents, a stale window), with and without guesses."""
    out = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=drafter)
    assert out.tokens == per_step_argmax(generator, PROMPTS, NEW)
    assert 0 < out.total.accepted < out.total.drafted


def _reference_commit(window, predicted, shift, pool, capacity):
    """Plain Python: the n-grams on the diagonals of the iterates (oldest first, the new one
    last) added to `pool` (a list of (age, gram), distinct grams, the oldest evicted when
    full); the window without its oldest row, moved `shift` columns, the new iterate's
    extension filling the right."""
    n, w = len(window) + 1, len(window[0])
    rows = [list(r) for r in window] + [list(predicted)]  # the new iterate: W + 1 tokens
    evicted, clock = 0, max([age for age, _ in pool], default=-1) + 1
    for j in range(w - n + 2):
        gram = tuple(rows[k][j + k] for k in range(n))
        if any(g == gram for _, g in pool):
            continue
        if len(pool) == capacity:
            pool.remove(min(pool))
            evicted += 1
        pool.append((clock, gram))
        clock += 1
    extended = [r[:w] + [predicted[w]] for r in rows[1:]]
    moved = [[r[min(c + shift, w)] for c in range(w)] for r in extended]
    return moved, pool, evicted


def test_the_window_and_the_pool_follow_a_plain_python_reference():
    """Catches n-grams taken along rows or the wrong diagonal (or past the window's end, which
    indexing would clamp silently), the iterate read one node off
    (the pending token's argmax is the first column), the window not moved by the committed
    tokens, a pool that keeps duplicates, silently overwrites instead of evicting the oldest,
    or does not count evictions; on random tokens and rounds."""
    drafter = Lookahead(window=5, ngram=3, guesses=2, pool=6)
    shape, window_nodes, _ = drafter._layout
    rng = random.Random(0)
    batch, pool = 2, [[], []]
    state = drafter.prefill(None, Prefilled(
        prompts=jnp.asarray([[1, 2, 1, 2, 3, 0], [4, 4, 4, 4, 4, 4]]),
        lengths=jnp.asarray([5, 6]), exit_hidden={}, cache_len=32, max_new_tokens=8))
    for row, prompt in enumerate(([1, 2, 1, 2, 3], [4] * 6)):
        for start in range(len(prompt) - 2):
            gram = tuple(prompt[start:start + 3])
            if gram not in [g for _, g in pool[row]]:
                pool[row].append((len(pool[row]), gram))
    assert np.asarray(state.window).tolist() == [[[1, 2, 1, 2, 3]] * 2, [[4] * 5] * 2]
    for _ in range(12):
        window = np.asarray(state.window)
        logits = jnp.asarray(np.random.default_rng(rng.randrange(99)).normal(
            size=(batch, 1 + shape.num_nodes, VOCAB)))
        predicted = np.asarray(jnp.argmax(logits, -1))[:, np.r_[0, 1 + window_nodes]]
        shift = [rng.randrange(0, 4), rng.randrange(0, 4)]
        done = Round(pending=None, proposal=None, acceptance=Acceptance(None, None, None),
                     reused_hidden=None, lengths_before=jnp.asarray([10, 10]),
                     lengths_after=jnp.asarray([10 + s for s in shift]), logits=logits)
        state = drafter.commit(DraftContext(None, None, None, CFG), state, done)
        for row in range(batch):
            if shift[row] == 0:  # a row that is done keeps its window and pool
                assert np.asarray(state.window[row]).tolist() == window[row].tolist()
                continue
            moved, pool[row], evicted = _reference_commit(
                window[row].tolist(), predicted[row].tolist(), shift[row], pool[row], 6)
            assert np.asarray(state.window[row]).tolist() == moved
            held = sorted((int(a), (int(k), *map(int, g))) for a, k, g in zip(
                state.age[row], state.keys[row], state.grams[row], strict=True) if a >= 0)
            assert [g for _, g in held] == [g for _, g in sorted(pool[row])]
            assert int(state.evicted[row]) == evicted
    assert any(len(p) == 6 for p in pool)  # the pool filled up and evicted


def test_guesses_are_the_latest_pool_ngrams_that_continue_the_pending_token():
    """Catches guesses keyed on another token than the pending one, the oldest matches
    chosen over the latest, and empty or unmatched guess slots left valid."""
    drafter = Lookahead(window=3, ngram=3, guesses=2, pool=8)
    shape, window_nodes, gram_nodes = drafter._layout
    state = drafter.prefill(None, Prefilled(
        prompts=jnp.asarray([[5, 1, 2, 5, 3, 4, 5, 6, 7, 9]]), lengths=jnp.asarray([10]),
        exit_hidden={}, cache_len=32, max_new_tokens=8))
    ctx = DraftContext(None, None, None, CFG)
    cache = type("C", (), {"lengths": jnp.asarray([10])})()
    proposal, _, _ = drafter.propose(ctx, state, cache, jnp.asarray([5]), None)
    tokens, valid = np.asarray(proposal.tokens[0]), np.asarray(proposal.valid[0])
    assert tokens[window_nodes].tolist() == np.asarray(state.window[0, -1]).tolist()
    assert [tokens[g].tolist() for g in gram_nodes] == [[6, 7], [3, 4]]  # latest first
    assert valid.all()
    proposal, _, _ = drafter.propose(ctx, state, cache, jnp.asarray([2]), None)
    assert np.asarray(proposal.valid[0])[gram_nodes].tolist() == [[True, True], [False, False]]
    assert list(shape.parents[:3]) == [-1, -1, -1]


def test_the_oldest_pool_ngram_is_guessed_when_it_is_the_only_match():
    """The prompt 5 1 2 3 4 6 seeds the pool with (5, 1, 2) first (age 0, slot 0) and no other
    n-gram keyed 5: with 5 pending, the first guess is 1 2 (valid) and the second slot is
    empty (invalid). Catches the first-inserted n-gram never guessed (age 0 taken for an empty
    slot's -1 or for no match), which the test above misses: every n-gram it guesses is
    younger."""
    drafter = Lookahead(window=3, ngram=3, guesses=2, pool=8)
    _, _, gram_nodes = drafter._layout
    state = drafter.prefill(None, Prefilled(
        prompts=jnp.asarray([[5, 1, 2, 3, 4, 6]]), lengths=jnp.asarray([6]),
        exit_hidden={}, cache_len=32, max_new_tokens=8))
    assert (int(state.keys[0, 0]), np.asarray(state.grams[0, 0]).tolist(),
            int(state.age[0, 0])) == (5, [1, 2], 0)
    cache = type("C", (), {"lengths": jnp.asarray([6])})()
    proposal, _, _ = drafter.propose(DraftContext(None, None, None, CFG), state, cache,
                                     jnp.asarray([5]), None)
    tokens, valid = np.asarray(proposal.tokens[0]), np.asarray(proposal.valid[0])
    assert tokens[gram_nodes[0]].tolist() == [1, 2]
    assert valid[gram_nodes].tolist() == [[True, True], [False, False]]


def test_an_eos_inside_a_draft_ends_the_row_as_plain_decoding_does(generator):
    """Catches tokens committed past an EOS that arrived as an accepted guess."""
    check_eos_mid_draft(generator, PROMPTS, Lookahead(4, 3, 3, 64), NEW)


def test_lookahead_is_registered_and_bad_options_are_one_line():
    """Catches options that do not reach the drafter and a window too short for its n-grams
    or a pool smaller than its guesses failing late."""
    options = DecodingConfig(lookahead_window=6, lookahead_ngram=4, lookahead_guesses=5,
                             lookahead_pool=32)
    assert make_strategy("lookahead", options) == Lookahead(6, 4, 5, 32)
    for drafter, message in ((Lookahead(2, 4, 1, 8), "lookahead_window=2 must be >= "),
                             (Lookahead(4, 3, 9, 8), "lookahead_pool=8 must be >= ")):
        with pytest.raises(ValueError, match=message):
            drafter.validate(CFG)
    with pytest.raises(ValueError, match="decoding.lookahead_ngram=1 must be >= 2"):
        DecodingConfig(lookahead_ngram=1).check(CFG)


def test_the_lookahead_loop_exports_for_tpu_and_cuda(generator):
    """Catches host-side work: the sampled loop with its pool must trace into one program
    that exports for both accelerators."""
    export_decode_loop(generator.params, {}, CFG, Lookahead(4, 3, 2, 16))
