"""Acceptance rules at unit level, with non-degenerate target p and draft q.

Each sampled rule is run on many independent one-level trees (the children of one node, drawn
as the rule assumes) and held to an exact reference computed here by enumerating every draw
sequence: the emitted token must follow p (chi-square) and the acceptance rate must equal the
reference's. A rule that accepts with 1.05 p/q must fail the same test, so it has teeth."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.decoding import acceptance
from specjax.decoding.acceptance import accept, speculative_accept
from specjax.decoding.proposal import Proposal
from specjax.decoding.sampling import SamplingParams, draw_children
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.static_tree import StaticTree
from tests.decoding.test_decoding_sampling import chi_square_p_below

P = np.array([0.30, 0.25, 0.20, 0.12, 0.08, 0.05])
Q = np.array([0.05, 0.10, 0.15, 0.20, 0.25, 0.25])  # the draft disagrees with the target
TRIALS = 200_000
UNIT = SamplingParams.create(temperature=1.0)


def _exact(p, q, rule, children):
    """(distribution of the emitted token, probability that some child is accepted) for a node
    whose `children` were drawn by `rule`, by enumerating every draw sequence."""
    out, accepted = np.zeros_like(p), 0.0
    ranked = np.argsort(-q, kind="stable")

    def visit(i, running, remaining, weight):
        nonlocal accepted
        if i == children:
            out[:] += weight * running
            return
        if rule == "top_k":
            draws = [(ranked[i], 1.0, np.eye(len(p))[ranked[i]])]
        else:
            q_i = q if rule == "iid" else remaining / remaining.sum()
            draws = [(x, q_i[x], q_i) for x in range(len(p)) if q_i[x] > 0]
        for x, q_x, q_i in draws:
            ratio = min(1.0, running[x] / q_x)
            out[x] += weight * q_x * ratio
            accepted += weight * q_x * ratio
            rest = np.maximum(running - q_i, 0.0)
            left = remaining.copy()
            left[x] = 0.0
            visit(i + 1, rest / rest.sum() if rest.sum() > 0 else running, left,
                  weight * q_x * (1 - ratio))

    visit(0, p.astype(np.float64), q.astype(np.float64), 1.0)
    return out, accepted


@pytest.mark.parametrize("rule", ["iid", "without_replacement", "top_k"])
def test_the_exact_reference_is_itself_lossless(rule):
    """Guards the reference: every rule must emit exactly p."""
    for children in (1, 2, 3):
        out, _ = _exact(P, Q, rule, children)
        np.testing.assert_allclose(out, P, atol=1e-12)


def _one_level(rule, children, seed=0):
    """Runs `accept` on TRIALS independent one-level trees; returns emitted tokens and whether a
    child was accepted."""
    draw_key, accept_key = jax.random.split(jax.random.PRNGKey(seed))
    draft_logits = jnp.broadcast_to(jnp.log(jnp.asarray(Q, jnp.float32)), (TRIALS, len(Q)))
    tokens, q = draw_children(draw_key, draft_logits, UNIT, children, rule)
    tree = StaticTree.from_branching((children,), children=rule)
    q = None if rule == "top_k" else jnp.broadcast_to(q[:, None], (TRIALS, children, len(Q)))
    proposal = Proposal(tokens=tokens, parents=jnp.full((TRIALS, children), -1, jnp.int32),
                        valid=jnp.ones((TRIALS, children), bool), q=q, reuse=None, stats={},
                        shape=tree)
    target = jnp.broadcast_to(jnp.log(jnp.asarray(P, jnp.float32)),
                              (TRIALS, children + 1, len(P)))
    result = jax.jit(accept, static_argnums=())(accept_key, proposal, target, UNIT)
    return np.asarray(result.emitted[:, 0]), np.asarray(result.num_accepted) > 0


def _check(rule, children):
    emitted, hit = _one_level(rule, children)
    counts = np.bincount(emitted, minlength=len(P)).astype(float)
    rejected, stat, critical = chi_square_p_below(counts, P)
    _, expected_rate = _exact(P, Q, rule, children)
    return rejected, stat, critical, hit.mean(), expected_rate


@pytest.mark.parametrize("children", [1, 3])
@pytest.mark.parametrize("rule", ["iid", "without_replacement", "top_k"])
def test_tree_rules_emit_the_target_distribution_at_the_closed_form_rate(rule, children):
    """Catches a wrong residual (e.g. resampling from p, or from p - q with the wrong q_i for
    siblings drawn without replacement), a missing renormalisation, or acceptance tested
    against the wrong running distribution."""
    rejected, stat, critical, rate, expected_rate = _check(rule, children)
    assert not rejected, f"chi2={stat:.1f} > {critical:.1f}"
    assert abs(rate - expected_rate) < 4 * np.sqrt(expected_rate * (1 - expected_rate) / TRIALS)


@pytest.mark.parametrize("rule", ["iid", "without_replacement", "top_k"])
def test_a_rule_five_percent_too_permissive_fails(rule, monkeypatch):
    monkeypatch.setattr(acceptance, "_accepts", lambda u, p, q: u * q < 1.05 * p)
    rejected, stat, critical, _, _ = _check(rule, 2)
    assert rejected, f"a wrong rule passed: chi2={stat:.1f} <= {critical:.1f}"


def _chain_trial(key):
    draw_key, accept_key = jax.random.split(key)
    q = jnp.broadcast_to(jnp.asarray(Q, jnp.float32), (TRIALS, 1, len(Q)))
    draft = jax.random.categorical(draw_key, jnp.log(q[:, 0]))[:, None].astype(jnp.int32)
    p = jnp.broadcast_to(jnp.asarray(P, jnp.float32), (TRIALS, 2, len(P)))
    count, emitted = speculative_accept(accept_key, draft, q, p, jnp.ones((TRIALS,), jnp.int32))
    return np.asarray(emitted[:, 0]), np.asarray(count) > 0


def test_the_chain_rule_emits_p_at_rate_sum_min_p_q():
    """With p and q far apart (not one-hot): catches a chain rule that resamples from p instead
    of the residual, or accepts with the wrong ratio."""
    emitted, hit = _chain_trial(jax.random.PRNGKey(1))
    rejected, stat, critical = chi_square_p_below(np.bincount(emitted, minlength=6), P)
    assert not rejected, f"chi2={stat:.1f} > {critical:.1f}"
    alpha = np.minimum(P, Q).sum()
    assert abs(hit.mean() - alpha) < 4 * np.sqrt(alpha * (1 - alpha) / TRIALS)


def test_the_chain_test_fails_a_rule_five_percent_too_permissive(monkeypatch):
    monkeypatch.setattr(acceptance, "_accepts", lambda u, p, q: u * q < 1.05 * p)
    emitted, _ = _chain_trial(jax.random.PRNGKey(1))
    rejected, stat, critical = chi_square_p_below(np.bincount(emitted, minlength=6), P)
    assert rejected, f"a wrong rule passed: chi2={stat:.1f} <= {critical:.1f}"


def _longest_matching_path(parents, tokens, valid, target):
    """Brute force: the deepest node whose whole root path matches the target's argmax at each
    parent (first such node in index order), its depth and path."""
    best = (0, [])
    for node in range(len(parents)):
        path, n = [], node
        while n >= 0:
            path.append(n)
            n = parents[n]
        path.reverse()
        ok = all(valid[n] and tokens[n] == target[parents[n] + 1] for n in path)
        if ok and len(path) > best[0]:
            best = (len(path), path)
    return best


def test_greedy_tree_acceptance_takes_the_longest_matching_path():
    """Against brute force over random trees with invalid nodes: catches a walk that stops at
    the first mismatching sibling, follows an invalid node, or emits the wrong bonus token."""
    rng = np.random.default_rng(0)
    batch, size, vocab = 64, 9, 3
    parents = np.array([[rng.integers(-1, i) for i in range(size)] for _ in range(batch)])
    tokens = rng.integers(0, vocab, (batch, size))
    valid = rng.random((batch, size)) > 0.15
    target = rng.integers(0, vocab, (batch, size + 1))
    tree = StaticTree.from_branching((size,))  # only the shape's kind and bounds matter here
    proposal = Proposal(tokens=jnp.asarray(tokens, jnp.int32),
                        parents=jnp.asarray(parents, jnp.int32), valid=jnp.asarray(valid),
                        q=None, reuse=None, stats={},
                        shape=_Bounds(tree, depth=size, max_children=size))
    logits = jax.nn.one_hot(target, vocab) * 5.0
    result = accept(jax.random.PRNGKey(0), proposal, logits, None)
    for b in range(batch):
        depth, path = _longest_matching_path(parents[b], tokens[b], valid[b], target[b])
        assert int(result.num_accepted[b]) == depth
        assert result.path[b, :depth].tolist() == path
        positions = [0] + [n + 1 for n in path]
        assert result.emitted[b, :depth + 1].tolist() == target[b][positions].tolist()


class _Bounds:
    """A tree shape with given bounds (any parents fit)."""

    is_chain = False
    children = "top_k"

    def __init__(self, tree, depth, max_children):
        self.num_nodes, self.depth, self.max_children = tree.num_nodes, depth, max_children


def test_a_chain_proposal_takes_the_chain_rule_and_moves_nothing():
    """`accept` dispatches on the shape: a chain gives no path (nothing to compact)."""
    target = jnp.array([[5, 6, 7, 8], [1, 2, 3, 4]])
    draft = jnp.array([[5, 6, 9], [9, 2, 3]])
    proposal = Proposal(tokens=draft, parents=jnp.broadcast_to(jnp.arange(3) - 1, (2, 3)),
                        valid=jnp.ones((2, 3), bool), q=None, reuse=None, stats={},
                        shape=Chain(3))
    result = accept(jax.random.PRNGKey(0), proposal, jax.nn.one_hot(target, 10) * 10, None)
    assert result.path is None and result.num_accepted.tolist() == [2, 0]
    assert result.emitted.tolist() == target.tolist()
