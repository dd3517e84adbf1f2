"""Kangaroo decoding: an adapter with its own K/V on exit E, chains (with η) and trees.

The adapters here are the shared head at exit E plus noise (`init_adapter` starts as exactly that
head), so their drafts differ from both the head's and the target's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import model as M
from specjax.cli.decoding import resolve_auto_tree
from specjax.config import ModelConfig
from specjax.decoding.drafter import DraftWeights
from specjax.decoding.drafters.kangaroo import Kangaroo
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.decoding.engine import Generator
from specjax.decoding.registry import DecodingConfig
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.dynamic_tree import DynamicTree
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.decoding.shapes.tree import chain_layout
from specjax.heads.kangaroo import init_adapter, run_adapter_cached
from specjax.nn.cache import LayerKV
from tests.support.decoding import check_eos_mid_draft, decode_rounds, export_decode_loop
from tests.support.models import TINY_MODEL, damped_params, noisy

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out

CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})
PROMPTS = [[1, 2, 3, 4, 5], [7], list(range(40, 59))]  # ragged, a 1-token prompt
NEW = 23
SHAPES = {"chain K=3": Chain(3), "chain K=6 eta=.5": Chain(6, 0.5),
          "static 2,2,1,1": StaticTree.from_branching((2, 2, 1, 1)),
          "dynamic T=8 k=2 D=3": DynamicTree(8, 2, 3)}
def _with_random_norms(params):
    """Norm scales other than 1, so that using the wrong norm changes the drafts."""
    key_final, key_layers = jax.random.split(jax.random.PRNGKey(9))
    layers = dict(params["layers"])
    scale = layers["attn_norm"]["scale"]
    layers["attn_norm"] = {"scale": scale * jax.random.uniform(key_layers, scale.shape, minval=.5,
                                                               maxval=1.5)}
    final = params["final_norm"]["scale"]
    return {**params, "layers": layers, "final_norm": {
        "scale": final * jax.random.uniform(key_final, final.shape, minval=.5, maxval=1.5)}}


PARAMS = _with_random_norms(damped_params(CFG, jax.random.PRNGKey(0), 0.5))


def noisy_adapter(exit_layer: int, noise: float, params=PARAMS):
    return noisy(init_adapter(params, CFG, exit_layer), noise, seed=exit_layer)


@pytest.fixture(scope="module")
def generator():
    return Generator(PARAMS, CFG, draft_weights={"kangaroo": DraftWeights(noisy_adapter(1, .3),
                                                                           1)})


@pytest.fixture(scope="module")
def reference(generator):
    return generator.generate(PROMPTS, max_new_tokens=NEW)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_greedy_kangaroo_equals_autoregressive(generator, reference, name):
    """Catches an adapter K/V that verification or commit corrupts into the target cache, a
    reuse of the wrong hidden state (the adapter's output instead of exit E's) and a tree
    commit that misplaces the target's K/V: each changes the committed tokens."""
    out = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=Kangaroo(1, SHAPES[name]))
    assert out.tokens == reference.tokens
    assert out.total.accepted > 0
    for stats in out.stats:
        assert stats.accepted + stats.rounds == NEW - 1


def test_eos_inside_a_kangaroo_draft_ends_the_row_like_autoregressive(generator):
    check_eos_mid_draft(generator, PROMPTS, Kangaroo(1, Chain(6, 0.5)), NEW)


@pytest.mark.parametrize("name", ["chain K=3", "static 2,2,1,1"])
def test_the_adapter_cache_equals_the_adapter_run_on_the_committed_tokens(name):
    """After several rounds the adapter's committed K/V equal its K/V over the committed
    sequence computed from scratch. Catches a commit that leaves a chain's last draft (never
    run by the draft) without K/V after a fully accepted round, or a tree commit that does not
    move the accepted path's K/V into place: the drafts would then attend to stale keys."""
    params = damped_params(CFG, jax.random.PRNGKey(0), 0.05)
    adapter = noisy_adapter(1, 0.01, params)  # a near-perfect draft: fully accepted rounds
    generator = Generator(params, CFG)
    drafter = Kangaroo(1, SHAPES[name])
    state = decode_rounds(generator.params, adapter, CFG, drafter, *generator.pad(PROMPTS),
                          rounds=4, max_new_tokens=NEW, cache_len=80)
    assert int(jnp.max(state.stats.accepted)) == 4 * drafter.shape.depth  # all accepted

    @jax.jit
    def from_scratch(params, adapter, tokens):
        width = tokens.shape[1]
        layout = chain_layout(jnp.zeros((1,), jnp.int32), width, 80)
        hidden, _ = M.run_layers_cached(params, CFG, M.embed(params, CFG, tokens),
                                        M.allocate_cache(CFG, 1, 80), jnp.zeros((1,), jnp.int32),
                                        layers=(0, 1))
        return run_adapter_cached(adapter, CFG, hidden, LayerKV.allocate(CFG, 1, 80),
                                  *layout)[1]

    kv_heads = CFG.num_kv_heads
    for b, prompt in enumerate(PROMPTS):
        committed = int(state.cache.lengths[b])
        emitted = state.tokens[b, :int(state.num_tokens[b])].tolist()
        sequence = (list(prompt) + emitted)[:committed]
        expected = from_scratch(generator.params, adapter, jnp.asarray([sequence]))
        for mine, theirs in zip(state.drafter, expected, strict=True):
            np.testing.assert_allclose(mine[b * kv_heads:(b + 1) * kv_heads, :committed],
                                       theirs[:, :committed], atol=2e-5)


@pytest.mark.parametrize("name", ["chain K=3"])
def test_an_untrained_adapter_drafts_exactly_like_the_shared_head(name):
    """`init_adapter` is the exit-E head: Kangaroo with it proposes what `selfspec` proposes,
    round for round. Catches an initialisation that does not start from LayerSkip's draft
    (e.g. an output norm other than the final norm, a non-zero output projection)."""
    generator = Generator(PARAMS, CFG)
    shape = SHAPES[name]
    plain = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=SelfSpeculative(2, shape))
    adapted = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=Kangaroo(2, shape),
                                 draft_params=init_adapter(PARAMS, CFG, 2))
    assert adapted.stats == plain.stats and adapted.tokens == plain.tokens


def test_kangaroo_needs_its_weights_for_its_exit(generator):
    with pytest.raises(ValueError, match="needs weights of its own and this model has none"):
        Generator(PARAMS, CFG).generate([[1]], max_new_tokens=4, strategy=Kangaroo(1))
    with pytest.raises(ValueError, match="trained at exit_layer=1, not 2"):
        generator.generate([[1]], max_new_tokens=4, strategy=Kangaroo(2))


def test_kangaroo_loop_exports_for_tpu_and_cuda(generator):
    export_decode_loop(generator.params, generator.draft_weights["kangaroo"].params, CFG,
                       Kangaroo(1, StaticTree.from_branching((2, 1))))


def test_auto_trees_refuse_drafters_they_do_not_measure():
    """`--tree auto` measures the shared head's acceptance: a plan for Kangaroo (or a draft
    model) built from it would be wrong, so it is refused before anything is measured."""
    with pytest.raises(ValueError, match=r"not of \['draft', 'kangaroo'\]"):
        resolve_auto_tree(DecodingConfig(tree="auto:8"), None, list, None, workdir="", step=0,
                          strategies=["ar", "selfspec", "kangaroo", "draft"])
