"""Mixed trees (strategy `mixed`): branches from several drafters in one proposal. Greedy output
against a per-step argmax of `model.forward` (batch 3, ragged prompts), a branch's state kept
right when another branch's drafts are taken, the options and errors, and export. The sampled
law (the deterministic-children rule) is in test_decoding_sampling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import model as M
from specjax.decoding.drafter import DraftWeights
from specjax.decoding.drafters.eagle import Eagle
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.decoding.drafters.medusa import Medusa
from specjax.decoding.drafters.mixed import Mixed
from specjax.decoding.drafters.ngram import PromptLookup
from specjax.decoding.engine import Generator
from specjax.decoding.registry import DecodingConfig, make_strategy, require_used
from specjax.decoding.sampling import SamplingParams
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.heads.eagle import EAGLE
from specjax.heads.feature_head import unrolled_logits
from specjax.heads.medusa import init_medusa
from specjax.training.frozen_base import base_features
from tests.decoding.drafters.test_feature_heads import (  # noqa: F401  (fixtures)
    CFG,
    KINDS,
    NEW,
    PROMPTS,
    heads,
    params,
    recording,
)
from tests.support.decoding import check_eos_mid_draft, export_decode_loop, per_step_argmax

EXITS = EAGLE.exits(CFG, KINDS["eagle"][2])
TEMPERATURE = 0.3


@pytest.fixture(scope="module")
def generator(params, heads):  # noqa: F811
    return Generator(M.unstack_layers(params, CFG), CFG, draft_weights={
        "eagle": DraftWeights(heads["eagle"], settings={"exits": EXITS}),
        "medusa": DraftWeights(init_medusa(params, CFG, 3), exit_layer=CFG.num_layers,
                               settings={"num_heads": 3})})


MIXES = {
    "ngram+selfspec": Mixed((PromptLookup(2, 1, Chain(3)), SelfSpeculative(1, Chain(3)))),
    "eagle+selfspec-tree+medusa": Mixed((Eagle(Chain(3)),
                                         SelfSpeculative(2, StaticTree.from_branching((2, 1))),
                                         Medusa(Chain(2)))),
    "tree+ngram": Mixed((SelfSpeculative(1, StaticTree.from_branching((2, 1))),
                         PromptLookup(3, 1, Chain(4)))),
}


@pytest.mark.parametrize("name", sorted(MIXES))
def test_greedy_mixed_trees_are_a_per_step_argmax_of_the_model(generator, name):
    """Catches branch node ids not offset into the mixed tree (a branch's root hung below
    another branch's node), a branch's K/V writes left in place of the verified ones (the
    reuse of one branch's layers for all), a path accepted across branches, and a shorter
    pass (up to the last branch that drafted) that drops a valid node or never runs."""
    out = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=MIXES[name])
    assert out.tokens == per_step_argmax(generator, PROMPTS, NEW)
    assert 0 < out.total.accepted < out.total.drafted
    if name == "tree+ngram":  # rounds where no row matched verified the tree alone
        assert out.total.verified < out.total.rounds * (1 + MIXES[name].shape.num_nodes)


def test_a_branch_follows_the_text_when_another_branch_wins(params, heads):  # noqa: F811
    """Catches a mixed commit that shows each branch only its own nodes (EAGLE's block then
    rewrites its K/V from its own rejected nodes' features, and keeps the pending token's
    feature while the text moved on): every round's first EAGLE draft distribution is the
    unrolled training distribution at the round's pending position on the final sequence,
    also after rounds that accepted LayerSkip's drafts (sampled at a temperature that has
    them accepted often)."""
    records = []
    generator = Generator(M.unstack_layers(params, CFG), CFG, draft_weights={
        "eagle": DraftWeights(heads["eagle"], settings={"exits": EXITS})})
    strategy = Mixed((recording(Eagle, records)(Chain(2)), SelfSpeculative(1, Chain(3))))
    out = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=strategy,
                             sampling=SamplingParams.create(temperature=TEMPERATURE), seed=1)
    assert out.total.accepted > 10
    checked = 0
    for row, (prompt, tokens) in enumerate(zip(PROMPTS, out.tokens, strict=True)):
        sequence = prompt + tokens
        hidden, _ = base_features(params, CFG, EXITS, jnp.asarray([sequence[:-1]]))
        expected = np.asarray(jax.nn.softmax(unrolled_logits(
            EAGLE, params, heads["eagle"], CFG, jnp.asarray([sequence]), hidden, 1)
            / TEMPERATURE))[0, 0]
        for q, lengths in records:
            pending = int(lengths[row])
            if pending < len(sequence) - 1:  # the row is not done
                np.testing.assert_allclose(q[row, 0], expected[pending], atol=1e-4)
                checked += 1
    assert checked > 20


def test_an_eos_inside_a_draft_ends_the_row_as_plain_decoding_does(generator):
    """Catches tokens committed past an EOS that arrived in either branch."""
    check_eos_mid_draft(generator, PROMPTS, MIXES["ngram+selfspec"], NEW)


def test_the_mix_option_builds_the_branches_and_bad_mixes_are_one_line(generator):
    """Catches a mixed strategy that cannot be built from the decoding options (the CLI's
    --strategy mixed --mix ...), branch options it does not pass on, and mixes that cannot
    work (one drafter, a repeated one, a drafter that proposes nothing or keeps its own drafts'
    state, an unknown name) failing late or cryptically."""
    options = DecodingConfig(mix="ngram,selfspec", num_draft=3, exit_layer=2, ngram_max=2)
    assert make_strategy("mixed", options) == Mixed((PromptLookup(2, 1, Chain(3)),
                                                     SelfSpeculative(2, Chain(3))))
    require_used(["mixed"], [options], ["mix", "num_draft", "exit_layer", "ngram_max"])
    with pytest.raises(ValueError, match="--tree_nodes is not used by strategy mixed"):
        require_used(["mixed"], [options], ["tree_nodes"])
    with pytest.raises(ValueError, match="decoding.mix='ngram' must name two or more"):
        DecodingConfig(mix="ngram").check(CFG)
    with pytest.raises(ValueError, match="unknown strategy 'nope'"):
        make_strategy("mixed", DecodingConfig(mix="ngram,nope"))
    for mix, message in (("ngram,ngram", "two or more distinct drafters"),
                         ("ar,ngram", "ar cannot be a branch"),
                         ("draft,ngram", "draft cannot be a branch"),
                         ("kangaroo,ngram", "kangaroo cannot be a branch")):
        with pytest.raises(ValueError, match=message):
            make_strategy("mixed", DecodingConfig(mix=mix)).validate(CFG)


def test_the_mixed_loop_exports_for_tpu_and_cuda(params, heads):  # noqa: F811
    """Catches host-side work in the composition: the sampled mixed loop must trace into one
    program that exports for both accelerators."""
    drafter = Mixed((Eagle(Chain(2), exits=EXITS), PromptLookup(2, 1, Chain(2))))
    export_decode_loop(M.unstack_layers(params, CFG), (heads["eagle"], None), CFG, drafter)
