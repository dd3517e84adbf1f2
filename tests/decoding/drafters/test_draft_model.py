"""A separate draft model: its own cache kept in step with the target's, lossless greedy and
sampled decoding with chains and trees, and loading one from a workdir."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.config import ModelConfig
from specjax.decoding.drafter import DraftWeights
from specjax.decoding.drafters.draft_model import DraftModel
from specjax.decoding.engine import Generator
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.dynamic_tree import DynamicTree
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.model import allocate_cache, embed, run_layers_cached
from tests.support.decoding import check_eos_mid_draft, decode_rounds
from tests.support.models import TINY_MODEL, damped_params, first_layers, noisy

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out

CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})
DRAFT_CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3, "num_layers": 2})
PROMPTS = [[1, 2, 3, 4, 5], [7], list(range(40, 59))]  # ragged, a 1-token prompt
NEW = 23
SHAPES = {"chain K=3": Chain(3), "chain K=6 eta=.5": Chain(6, 0.5),
          "static 2,2,1,1": StaticTree.from_branching((2, 2, 1, 1)),
          "dynamic T=8 k=2 D=3": DynamicTree(8, 2, 3)}


def draft_of(params, noise=0.0):
    """A 2-layer draft model: the target's first two layers and head (so it often agrees with
    the target's damped deeper layers), plus noise."""
    draft, cfg = first_layers(params, CFG, 2)
    assert cfg == DRAFT_CFG
    return noisy(draft, noise, seed=7)


PARAMS = damped_params(CFG, jax.random.PRNGKey(0), 0.5)


@pytest.fixture(scope="module")
def generator():
    weights = DraftWeights(draft_of(PARAMS, 0.02), cfg=DRAFT_CFG)
    return Generator(PARAMS, CFG, draft_weights={"draft": weights})


@pytest.fixture(scope="module")
def reference(generator):
    return generator.generate(PROMPTS, max_new_tokens=NEW)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_greedy_draft_model_equals_autoregressive(generator, reference, name):
    """Catches a draft cache that corrupts the target's, a proposal drafted at the wrong
    positions, and a tree commit that misplaces K/V: each changes the committed tokens."""
    out = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=DraftModel(SHAPES[name]))
    assert out.tokens == reference.tokens
    assert out.total.accepted > 0
    for stats in out.stats:
        assert stats.accepted + stats.rounds == NEW - 1


def test_eos_inside_a_draft_model_draft(generator):
    check_eos_mid_draft(generator, PROMPTS, DraftModel(Chain(6)), NEW)


@pytest.mark.parametrize("name", ["chain K=3", "static 2,2,1,1"])
def test_the_draft_cache_equals_the_draft_model_run_alone_on_the_committed_tokens(name):
    """After several rounds the draft model's committed K/V equal its K/V over the committed
    sequence run alone, so its logits at every round are those of running it alone on the
    committed prefix. Catches a missing catch-up of the last accepted draft (a chain's last
    draft is never run while drafting) and a tree commit that does not move the path."""
    params = damped_params(CFG, jax.random.PRNGKey(0), 0.05)
    draft = draft_of(params)  # a near-perfect draft: fully accepted rounds
    generator = Generator(params, CFG)
    drafter = DraftModel(SHAPES[name], DRAFT_CFG)
    state = decode_rounds(generator.params, draft, CFG, drafter, *generator.pad(PROMPTS),
                          rounds=4, max_new_tokens=NEW, cache_len=80)
    assert int(jnp.max(state.stats.accepted)) == 4 * drafter.shape.depth  # all accepted
    alone = jax.jit(lambda p, tokens: run_layers_cached(
        p, DRAFT_CFG, embed(p, DRAFT_CFG, tokens), allocate_cache(DRAFT_CFG, 1, 80),
        jnp.zeros((1,), jnp.int32))[1])
    kv_heads = DRAFT_CFG.num_kv_heads
    for b, prompt in enumerate(PROMPTS):
        committed = int(state.cache.lengths[b])
        assert int(state.drafter.lengths[b]) == committed
        emitted = state.tokens[b, :int(state.num_tokens[b])].tolist()
        expected = alone(draft, jnp.asarray([(list(prompt) + emitted)[:committed]]))
        for mine, theirs in zip(state.drafter.layers, expected.layers, strict=True):
            for a, c in zip(mine, theirs, strict=True):
                np.testing.assert_allclose(a[b * kv_heads:(b + 1) * kv_heads, :committed],
                                           c[:, :committed], atol=2e-5)


def test_a_draft_model_needs_weights_and_the_same_vocabulary(generator):
    with pytest.raises(ValueError, match="pass --draft_workdir"):
        Generator(PARAMS, CFG).generate([[1]], max_new_tokens=4, strategy=DraftModel())
    other = ModelConfig(**{**TINY_MODEL, "num_layers": 2, "vocab_size": 300})
    with pytest.raises(ValueError, match=r"vocabulary \(300 ids\) differs from the target's"):
        generator.generate([[1]], max_new_tokens=4, strategy=DraftModel(Chain(2), other),
                           draft_params=generator.draft_weights["draft"].params)
