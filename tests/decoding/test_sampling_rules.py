"""Logits processing against a plain reference, and the acceptance rules on hand-made cases."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.decoding.acceptance import greedy_accept, speculative_accept
from specjax.decoding.sampling import SamplingParams, probabilities


def _reference(logits, temperature, top_k, top_p):
    out = []
    for row in np.asarray(logits, np.float64) / temperature:
        order = np.argsort(-row)
        kept = order[:top_k or len(row)]
        probs = np.exp(row[kept] - row[kept[0]])
        probs /= probs.sum()
        mass_before = np.cumsum(probs) - probs
        keep = np.zeros(len(row), bool)
        keep[kept[mass_before < top_p]] = True
        x = np.where(keep, row, -np.inf)
        e = np.exp(x - x.max())
        out.append(e / e.sum())
    return np.array(out)


@pytest.mark.parametrize("temperature, top_k, top_p", [
    (1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.9, 10, 0.5), (1.0, 40, 0.99), (2.0, 1, 1.0)])
def test_probabilities_match_a_plain_reference(temperature, top_k, top_p):
    logits = np.random.default_rng(0).normal(size=(6, 37)) * 2
    got = probabilities(jnp.asarray(logits, jnp.float32),
                        SamplingParams.create(temperature, top_k, top_p))
    np.testing.assert_allclose(got, _reference(logits, temperature, top_k, top_p), atol=1e-6)


def test_greedy_accept_takes_the_longest_matching_prefix_plus_one():
    target = jnp.array([[5, 6, 7, 8], [5, 6, 7, 8], [1, 2, 3, 4]])
    logits = jax.nn.one_hot(target, 10) * 10
    draft = jnp.array([[5, 6, 7], [5, 9, 7], [9, 2, 3]])
    accepted, emitted = greedy_accept(draft, logits, jnp.array([3, 3, 3]))
    assert accepted.tolist() == [3, 1, 0]
    assert emitted.tolist() == target.tolist()
    accepted, emitted = greedy_accept(draft, logits, jnp.array([2, 1, 3]))  # shorter drafts
    assert accepted.tolist() == [2, 1, 0]
    assert emitted.tolist() == target.tolist()


def test_speculative_accept_edge_cases():
    vocab = 4
    p = jax.nn.one_hot(jnp.array([[2, 3, 1]]), vocab)       # target is deterministic
    q_same = p[:, :2]
    key, both = jax.random.PRNGKey(0), jnp.array([2])
    accepted, emitted = speculative_accept(key, jnp.array([[2, 3]]), q_same, p, both)
    assert accepted.tolist() == [2] and emitted.tolist() == [[2, 3, 1]]  # all in + bonus
    q_wrong = jax.nn.one_hot(jnp.array([[0, 3]]), vocab)
    accepted, emitted = speculative_accept(key, jnp.array([[0, 3]]), q_wrong, p, both)
    # p(0) = 0: the first draft is always rejected and replaced from max(0, p - q) = p.
    assert accepted.tolist() == [0] and emitted[0, 0] == 2
    # Only the first draft counts: it is accepted and the next token comes from p_1 = 3, even
    # though q_1 puts all its mass there (a residual p - q would be empty).
    accepted, emitted = speculative_accept(key, jnp.array([[2, 3]]), q_same, p, jnp.array([1]))
    assert accepted.tolist() == [1] and emitted[0, :2].tolist() == [2, 3]


def test_rejection_resamples_from_the_residual_and_accepts_with_p_over_q():
    """Catches resampling from p instead of norm(max(0, p - q)) after a rejection (the edge
    cases above have one-hot p, where the two agree), and an acceptance probability off by 5%.
    p = (.5, .5), q = one-hot(0): accept token 0 half the time, else emit token 1 always."""
    rows = 20000
    p = jnp.broadcast_to(jnp.array([0.5, 0.5, 0.0, 0.0]), (rows, 2, 4))
    q = jnp.broadcast_to(jax.nn.one_hot(0, 4), (rows, 1, 4))
    accepted, emitted = speculative_accept(jax.random.PRNGKey(7), jnp.zeros((rows, 1), int), q, p,
                                           jnp.ones((rows,), int))
    accepted, emitted = np.asarray(accepted), np.asarray(emitted)
    assert abs(accepted.mean() - 0.5) < 0.0125  # 3.5 standard errors; a 5% error is 7
    assert (emitted[accepted == 0, 0] == 1).all()


def test_filters_keep_ties_at_the_cut_and_order_negative_logits():
    """The nucleus here ends inside three tied tokens: all three are kept, the lower ones cut.
    Would catch a cut that breaks ties (keeping one of the tied tokens, as a sort would), a
    strict comparison at the cut (dropping all three), keys that misorder negative logits (-2
    ranked above -1: the bit patterns of negative floats grow as they fall), a top-p that
    weighs only k of the tokens top-k kept, or keys that tell -0 from +0."""
    logits = jnp.asarray([[-1.0, 1.0, 3.0, 1.0, -2.0, 1.0]])
    # p(3) = .69 < .8: the nucleus needs the next logit, 1, and so all three 1s.
    kept = probabilities(logits, SamplingParams.create(1.0, 0, 0.8)) > 0
    np.testing.assert_array_equal(kept[0], [False, True, True, True, False, True])
    # top-2 is the 3 and every token tied with the second largest logit.
    kept = probabilities(logits, SamplingParams.create(1.0, 2, 1.0)) > 0
    np.testing.assert_array_equal(kept[0], [False, True, True, True, False, True])
    kept = probabilities(logits, SamplingParams.create(1.0, 5, 1.0)) > 0
    np.testing.assert_array_equal(kept[0], [True, True, True, True, False, True])
    # Top-p weighs every token top-k kept, ties too (Hugging Face's order of filters): with
    # the three 1s, p(3) = .71 < .8, so they stay; over exactly two tokens it would be .88.
    kept = probabilities(logits, SamplingParams.create(1.0, 2, 0.8)) > 0
    np.testing.assert_array_equal(kept[0], [False, True, True, True, False, True])
    # -0 equals +0: a cut at zero keeps both.
    kept = probabilities(jnp.asarray([[1.0, 0.0, -0.0, -1.0]]),
                         SamplingParams.create(1.0, 2, 1.0)) > 0
    np.testing.assert_array_equal(kept[0], [True, True, True, False])


def test_filters_match_the_reference_at_a_large_vocabulary():
    """32,000 logits, one row of them consecutive floats (each one unit in the last place above
    the one before): would catch a cut search that stops before the last bit, which keeps
    tokens just below the cut once logits are that close."""
    logits = np.random.default_rng(1).normal(size=(4, 32_000)).astype(np.float32) * 3
    logits[0] = np.float32(1) + np.arange(32_000, dtype=np.float32) * np.spacing(np.float32(1))
    # Neighbouring cuts, so that one of each pair falls on an odd key.
    for top_k, top_p in [(500, 1.0), (501, 1.0), (0, 0.5), (0, 0.5 + 1 / 32_000), (500, 0.9)]:
        got = probabilities(jnp.asarray(logits), SamplingParams.create(1.0, top_k, top_p))
        want = _reference(logits, 1.0, top_k, top_p)
        np.testing.assert_array_equal(np.asarray(got) > 0, want > 0)
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_the_loop_key_follows_the_seed_for_raw_and_typed_keys():
    """The decode loop draws from an rbg key derived from the caller's key. Would catch a
    derivation that ignores the caller's key (every seed sampling the same tokens) or one that
    rejects new-style typed keys."""
    from specjax.decoding.loop import bit_generator_key

    def bits(key):
        return jax.random.bits(bit_generator_key(key), (8,), jnp.uint32)

    np.testing.assert_array_equal(bits(jax.random.PRNGKey(3)), bits(jax.random.key(3)))
    assert not np.array_equal(bits(jax.random.PRNGKey(3)), bits(jax.random.PRNGKey(4)))
    assert str(jax.random.key_impl(bit_generator_key(jax.random.PRNGKey(0)))) == "rbg"


def test_the_filters_compile_for_a_batch_under_xla_default_flags():
    """Eight rows of logits, compiled fresh with XLA's default flags (as users run; the suite's
    cheaper pipeline hid it): would catch a cut search whose steps each use the running cut
    twice (`where(weight >= target, cut | bit, cut)`). XLA fuses the whole chain into every
    step, and XLA:CPU's code for it grows with each use: sampled decoding of 8 or more rows
    then compiled for over ten minutes, where it takes about a second."""
    from tests.conftest import CHEAP_COMPILE

    code = ("import jax; from specjax.decoding.sampling import SamplingParams, probabilities; "
            "jax.jit(probabilities).lower(jax.numpy.zeros((8, 8)), "
            "SamplingParams.create(0.8, 5, 0.9)).compile()")
    env = {**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false",
           "XLA_FLAGS": os.environ.get("XLA_FLAGS", "").replace(CHEAP_COMPILE, "").strip()}
    try:
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the sampling filters did not compile for 8 rows within 120 s")
