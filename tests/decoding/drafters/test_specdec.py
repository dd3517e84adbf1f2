"""SpecDec++: an acceptance head decides where each row's chain ends, or where a dynamic tree
grows. The stop rule against a plain reference, the tree's scores by hand, lossless greedy
decoding at several h and with trees, the head's evaluation metric, export.

The heads here are random (their output layer scaled up, so predictions spread over (0, 1) and
rows stop after different numbers of drafts)."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.config import ModelConfig
from specjax.decoding.drafter import DraftWeights
from specjax.decoding.drafters import specdec
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.decoding.drafters.specdec import SpecDecHead
from specjax.decoding.engine import Generator
from specjax.decoding.registry import DecodingConfig, make_strategy
from specjax.decoding.sampling import SamplingParams, probabilities
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.dynamic_tree import DynamicTree
from specjax.heads.specdec import init_acceptance_head
from specjax.model import forward
from specjax.training.heads.specdec import draft_labels
from specjax.training.ranking import auc
from tests.support.decoding import check_eos_mid_draft, export_decode_loop
from tests.support.models import TINY_MODEL, damped_params

CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})
PROMPTS = [[1, 2, 3, 4, 5], [7], list(range(40, 59))]  # ragged, a 1-token prompt
NEW = 23
PARAMS = damped_params(CFG, jax.random.PRNGKey(0), 0.5)


def random_head(cfg=CFG, key=1, scale=5.0):
    head = init_acceptance_head(cfg, 16, jax.random.PRNGKey(key))
    return {**head, "out": {**head["out"], "kernel": head["out"]["kernel"] * scale}}


@pytest.fixture(scope="module")
def generator():
    return Generator(PARAMS, CFG, draft_weights={"specdec": DraftWeights(random_head(), 1)})


def test_a_chain_stops_where_the_predicted_risk_first_exceeds_h():
    """Catches a stop that drops the draft that crossed h (or keeps one more), a risk from
    the latest draft alone instead of the product over the chain, and rows stopping together;
    then every row is filled to the smallest verification size that holds the longest (a
    chain cut at its own stop, or filled past that size, fails). The reference is the rule
    written out per row in numpy."""
    batch, num_draft, vocab = 5, 6, 7
    table = np.asarray(jax.random.uniform(jax.random.PRNGKey(0), (batch, num_draft),
                                          minval=0.4, maxval=1.0))

    def step(k, tokens, layout):  # the carry counts steps; `kept` hands k to the model
        logits = jnp.zeros((batch, 1, vocab)).at[:, 0, (k + 1) % vocab].set(1.0)
        return logits, jnp.full((batch, 1, 1), k), k + 1

    def accept(kept, probs, token):
        return jnp.asarray(table)[jnp.arange(batch), kept[:, 0]]

    for h in (0.05, 0.3, 0.6, 0.9):
        proposal, *_ = Chain(num_draft, stop_risk=h).draft(
            step, jnp.int32(0), jnp.zeros((batch,), jnp.int32), jnp.zeros((batch,), jnp.int32),
            jax.random.PRNGKey(0), None, 64, accept=accept)
        expected = []
        for row in table:
            survive = np.cumprod(row)
            over = np.nonzero(1 - survive > h)[0]
            expected.append(over[0] + 1 if over.size else num_draft)
        np.testing.assert_array_equal(proposal.stats["stopped_after"], expected)
        size = min(s for s in (2, 4, 6) if s >= max(expected))  # Chain(6).verify_sizes
        assert np.all(np.asarray(proposal.valid) == (np.arange(num_draft) < size))


def test_a_dynamic_tree_keeps_the_path_the_head_expects_accepted():
    """Top 2 children per node, depth 2, one leaf: the draft prefers token 0 (q .4 against
    .35 for token 1), the head token 1 (accept .9 against .3). Scored by the head, the leaf is
    the path 1 -> 1 (.81, against .27 for 0 -> 1 and 1 -> 0); scored by q it would be 0 -> 0.
    Catches the head's scores ignored (q's tree), a path scored by its last draft alone
    (0 -> 1 ties 1 -> 1) and the head handed log q (or anything but q) as the distribution."""
    batch, vocab = 2, 5
    q = jnp.array([0.4, 0.35, 0.15, 0.06, 0.04])

    def step(carry, tokens, layout):  # the same distribution at every node; keeps the token
        return (jnp.broadcast_to(jnp.log(q), (*tokens.shape, vocab)), tokens[..., None] * 1.0,
                carry)

    def accept(kept, probs, token):  # q(token) / probs(token) is 1 when handed q
        assert kept.shape == (*token.shape, 1) and probs.shape == (*token.shape, vocab)
        handed = jnp.take_along_axis(probs, token[..., None], axis=-1)[..., 0]
        return jnp.where(token == 1, 0.9, 0.3) * handed / q[token]

    def leaf_path(**accept_model):
        proposal, *_ = DynamicTree(3, 2, 2).draft(
            step, (), jnp.zeros((batch,), jnp.int32), jnp.zeros((batch,), jnp.int32),
            jax.random.PRNGKey(0), None, 16, **accept_model)
        tokens, parents = np.asarray(proposal.tokens), np.asarray(proposal.parents)
        assert proposal.valid.all()
        return [(tokens[row, parents[row, 2]], tokens[row, 2]) for row in range(batch)]

    assert leaf_path(accept=accept) == [(1, 1)] * batch
    assert leaf_path() == [(0, 0)] * batch


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_tree_training_labels_each_top_child_with_the_targets_probability(sampled):
    """`children` = 3: q's top 3 tokens at every position, labelled p(x) (greedy: x is the
    target's argmax), against the model and its first layer run as plain forward passes.
    Catches children other than q's top k, the chain's label min(1, p/q) kept, and labels
    read from q or at the wrong position."""
    tokens = jax.random.randint(jax.random.PRNGKey(3), (2, 12), 0, CFG.vocab_size)
    sampling = SamplingParams.create(0.8, top_p=0.95) if sampled else None
    hidden, q, children, label = draft_labels(PARAMS, CFG, 1, sampling, tokens,
                                              jax.random.PRNGKey(0), children=3)
    shallow = {**PARAMS, "layers": jax.tree.map(lambda w: w[:1], PARAMS["layers"])}
    draft = forward(shallow, dataclasses.replace(CFG, num_layers=1), tokens)
    final = forward(PARAMS, CFG, tokens)
    if sampled:
        want_q, p = probabilities(draft, sampling), probabilities(final, sampling)
        want_label = np.take_along_axis(np.asarray(p), np.asarray(children), axis=-1)
    else:
        want_q = jax.nn.softmax(draft, axis=-1)
        want_label = np.asarray(jnp.argmax(final, axis=-1))[..., None] == np.asarray(children)
    assert hidden.shape == (2, 12, 3, CFG.d_model) and q.shape == (2, 12, 3, CFG.vocab_size)
    np.testing.assert_allclose(np.asarray(q[:, :, 0]), want_q, rtol=1e-5, atol=1e-7)
    drafted = np.take_along_axis(np.asarray(want_q), np.asarray(children), axis=-1)
    np.testing.assert_allclose(drafted, -np.sort(-np.asarray(want_q), axis=-1)[..., :3],
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(label), want_label, rtol=1e-5, atol=1e-7)
    assert 0 < np.asarray(label).mean() < 1


@pytest.mark.parametrize("h", [0.3, 0.7])
def test_greedy_specdec_equals_autoregressive(generator, h):
    """Catches a stop wired so that rows never stop early or always stop after the first
    draft, and a stop that corrupts what is committed (ragged prompts, batch 3)."""
    reference = generator.generate(PROMPTS, max_new_tokens=NEW)
    out = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=SpecDecHead(1, Chain(8, 0.0,
                                                                                        h)))
    assert out.tokens == reference.tokens
    for stats in out.stats:
        assert stats.accepted + stats.rounds == NEW - 1
    assert out.total.rounds < out.total.extra["stopped_after"] < 8 * out.total.rounds


def test_greedy_specdec_trees_equal_autoregressive(generator):
    """Catches a head-scored tree that breaks the cache, the reuse of drafted states or the
    commit along the accepted path (ragged prompts, batch 3); which nodes the head keeps is
    checked by hand above."""
    reference = generator.generate(PROMPTS, max_new_tokens=NEW)
    out = generator.generate(PROMPTS, max_new_tokens=NEW,
                             strategy=SpecDecHead(1, DynamicTree(8, 2, 3)))
    assert out.tokens == reference.tokens
    assert out.total.accepted > 0


def test_eos_inside_a_specdec_draft_ends_the_row_like_autoregressive(generator):
    check_eos_mid_draft(generator, PROMPTS, SpecDecHead(1, Chain(8, 0.0, 0.7)), NEW)


def test_specdec_refuses_what_it_cannot_run(generator):
    with pytest.raises(ValueError, match="draft_risk h in"):
        generator.generate([[1]], max_new_tokens=4, strategy=SpecDecHead(1, Chain(4)))
    with pytest.raises(ValueError, match="not a static tree"):
        generator.generate([[1]], max_new_tokens=4,
                           strategy=make_strategy("specdec", DecodingConfig(tree="2,1",
                                                                            draft_risk=0.5)))
    with pytest.raises(ValueError, match="needs an acceptance head"):
        generator.generate([[1]], max_new_tokens=4, strategy=SelfSpeculative(1, Chain(4, 0, .5)))
    with pytest.raises(ValueError, match="trained at exit_layer=1, not 2"):
        generator.generate([[1]], max_new_tokens=4, strategy=SpecDecHead(2, Chain(4, 0, .5)))
    assert make_strategy("specdec", DecodingConfig(tree="dynamic", draft_risk=0.5)) == \
        SpecDecHead(1, DynamicTree())
    with pytest.raises(ValueError, match="needs weights of its own and this model has none"):
        Generator(PARAMS, CFG).generate([[1]], max_new_tokens=4,
                                        strategy=SpecDecHead(1, Chain(4, 0, .5)))


@pytest.mark.parametrize("trained, shape, warned", [
    (0, Chain(4, 0, .5), False), (2, DynamicTree(8, 2, 3), False),
    (3, DynamicTree(8, 2, 3), False), (None, DynamicTree(8, 2, 3), False),
    (0, DynamicTree(8, 2, 3), True), (2, DynamicTree(8, 3, 3), True),
    (2, Chain(4, 0, .5), True),
    (2, make_strategy("specdec", DecodingConfig(tree="2,1", draft_risk=0.5)).shape, False)])
def test_a_head_asked_about_other_drafts_than_it_learned_warns(caplog, trained, shape,
                                                               warned):
    """Catches a silent mismatch between what a head learned and what decoding asks of it: a
    chain's head (min(1, p/q) of a sampled draft) scoring a tree's children, a tree head of
    top_k 2 scoring a tree of top_k 3, or a tree head (p(x)) deciding a chain's stops; and a
    warning where nothing is wrong (a head that saw more children than the tree asks about,
    hand-built weights with no recorded settings); and a crash instead of `validate`'s clear
    refusal for a static tree, which has no stop rule to read."""
    specdec._warn_once.cache_clear()
    weights = DraftWeights(random_head(), 1,
                           settings={} if trained is None else {"children": trained})
    with caplog.at_level("WARNING"):
        assert SpecDecHead(1, shape).bind(weights) == SpecDecHead(1, shape)
    messages = [r.getMessage() for r in caplog.records]
    assert bool(messages) == warned
    if warned:
        assert f"--config.specdec.children={getattr(shape, 'top_k', 0)}" in messages[0]


def test_soft_label_auc_equals_counting_pairs():
    """Catches ties counted as wins (or losses) and soft labels treated as hard ones."""
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 6, 60).astype(float)  # many ties
    labels = np.where(rng.random(60) < 0.3, 1.0, rng.random(60))
    wins = total = 0.0
    for i, j in itertools.product(range(60), repeat=2):
        weight = labels[i] * (1 - labels[j])
        total += weight
        wins += weight * (1.0 if scores[i] > scores[j] else 0.5 if scores[i] == scores[j] else 0)
    assert auc(scores, labels) == pytest.approx(wins / total, rel=1e-12)
    assert auc(np.arange(4.0), np.array([0, 0, 1, 1.0])) == 1.0


def test_specdec_loop_exports_for_tpu_and_cuda(generator):
    exported = export_decode_loop(generator.params, random_head(), CFG,
                                  SpecDecHead(1, Chain(6, 0.0, 0.5)))
    assert exported.mlir_module().count("stablehlo.while") >= 2
