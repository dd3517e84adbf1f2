"""Decoding through Mamba-2 layers: a hybrid (attention and Mamba-2) and a pure Mamba-2 model.
`ar` equals a per-step argmax of `model.forward` (the whole-sequence scan, an independent path),
and self-speculative chains and token trees equal `ar` token for token."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import model as M
from specjax.config import ModelConfig, SsmConfig
from specjax.decoding.drafter import DraftWeights
from specjax.decoding.drafters.calm import CalmDraft
from specjax.decoding.drafters.calm_exit import EarlyExit
from specjax.decoding.drafters.draft_model import DraftModel
from specjax.decoding.drafters.kangaroo import Kangaroo
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.decoding.drafters.skip import SkipLayers
from specjax.decoding.engine import Generator
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.dynamic_tree import DynamicTree
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.heads.kangaroo import init_adapter
from specjax.tools.skip_search import AcceptanceProbe
from tests.support.decoding import decode_rounds, export_decode_loop
from tests.support.models import TINY_MODEL, damped_params, first_layers

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out

SSM = SsmConfig(num_heads=4, head_dim=8, state_size=8, groups=2, chunk_size=8, dt_min=0.05,
                dt_max=0.5)
CONFIGS = {
    "hybrid": ModelConfig(**{**TINY_MODEL, "init_std": 0.3, "ssm": SSM,
                             "layer_pattern": ("mamba2", "attention", "mamba2", "mamba2")}),
    "mamba2": ModelConfig(**{**TINY_MODEL, "init_std": 0.3, "layer_pattern": ("mamba2",) * 4,
                             "ssm": SsmConfig(**{**SSM.__dict__, "mlp": False})}),
}
PROMPTS = [[1, 2, 3, 4, 5], [7], list(range(40, 59))]  # ragged, including a 1-token prompt
NEW = 19


@functools.cache
def generator(name: str) -> Generator:
    """The damped model, with a Kangaroo adapter on exit 1 (the shared head plus noise) and a
    draft model of its first two layers (a Mamba-2 and an attention layer in the hybrid)."""
    cfg = CONFIGS[name]
    params = damped_params(cfg, jax.random.PRNGKey(0), 0.4)
    adapter = jax.tree.map(lambda w: w + 0.05 * jax.random.normal(jax.random.PRNGKey(1), w.shape),
                           init_adapter(params, cfg, 1))
    draft, draft_cfg = first_layers(params, cfg, 2)
    return Generator(params, cfg,
                     draft_weights={"kangaroo": DraftWeights(adapter, exit_layer=1),
                                    "draft": DraftWeights(draft, cfg=draft_cfg)})


@functools.cache
def reference(name: str) -> list[list[int]]:
    return generator(name).generate(PROMPTS, max_new_tokens=NEW).tokens


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_greedy_decoding_is_a_per_step_argmax_of_the_whole_sequence_model(name):
    """Catches a prefill that keeps padding in the SSM state, a decode step that reads the
    wrong conv history, and a commit that folds the wrong tokens: the whole-sequence forward
    shares none of the cache code."""
    cfg = CONFIGS[name]
    params = damped_params(cfg, jax.random.PRNGKey(0), 0.4)
    width = max(map(len, PROMPTS)) + NEW
    forward = jax.jit(functools.partial(M.forward, cfg=cfg))
    rows = [list(p) for p in PROMPTS]
    for _ in range(NEW):
        tokens = jnp.asarray([r + [0] * (width - len(r)) for r in rows])
        logits = forward(params, tokens=tokens)
        for row in rows:
            row.append(int(jnp.argmax(logits[rows.index(row), len(row) - 1])))
    assert reference(name) == [row[len(p):] for row, p in zip(rows, PROMPTS, strict=True)]


SHAPES = {
    "chain exit 1 K=4": SelfSpeculative(1, Chain(4)),
    "kangaroo tree 2,1": Kangaroo(1, StaticTree.from_branching((2, 1))),
    "calmdraft chain K=3": CalmDraft(EarlyExit((1, 2)), 0.3, 4.0, Chain(3)),
    "chain exit 2 K=3": SelfSpeculative(2, Chain(3)),
    "static tree 2,2,1": SelfSpeculative(1, StaticTree.from_branching((2, 2, 1))),
    "dynamic tree T=8": SelfSpeculative(1, DynamicTree(8, 2, 3)),
    "skip 2 chain K=3": SkipLayers((2,), Chain(3)),
    "draft model tree 2,1": DraftModel(StaticTree.from_branching((2, 1))),
}


# Each case compiles a decode loop: a shape runs on one model, the drafters on the hybrid.
CASES = [("hybrid", "chain exit 1 K=4"), ("hybrid", "kangaroo tree 2,1"),
         ("hybrid", "calmdraft chain K=3"), ("hybrid", "static tree 2,2,1"),
         ("hybrid", "skip 2 chain K=3"), ("mamba2", "draft model tree 2,1"),
         ("mamba2", "chain exit 2 K=3"), ("mamba2", "dynamic tree T=8")]


@pytest.mark.parametrize("name,shape", CASES)
def test_self_speculation_equals_autoregressive_decoding(name, shape):
    """Chains (drafts through the shallow SSM layers, reused by verification) and trees (the
    tree scan, the conv along each path, the closed-form commit of the accepted path), with
    rejections and accepted runs (the damped model), ragged prompts; every other drafter that
    drafts through the target's layers (Kangaroo's adapter after an SSM layer, CALM's early
    exits, whose skipped SSM layers take the exited state, a skipped SSM layer) and a draft
    model with SSM layers of its own. Catches a rejected draft left in an SSM state, a tree
    node mixing in its siblings and a draft model whose state misses its catch-up token."""
    out = generator(name).generate(PROMPTS, max_new_tokens=NEW, strategy=SHAPES[shape])
    assert out.tokens == reference(name)
    assert 0 < out.total.accepted < out.total.drafted


def test_the_tree_decode_loop_with_ssm_layers_exports_for_tpu_and_cuda():
    """Catches an SSM layer's cached pass that only lowers for the CPU (a host callback, a
    CPU-only custom call, a shape known only at run time)."""
    cfg = CONFIGS["hybrid"]
    export_decode_loop(generator("hybrid").params, {}, cfg, SHAPES["static tree 2,2,1"],
                       sampled=False, max_new_tokens=16, cache_len=48)


def test_the_ssm_draft_models_cache_equals_it_run_alone_on_the_committed_tokens():
    """After rounds with rejections and fully accepted chains, every layer of a draft model
    with a Mamba-2 and an attention layer holds what a prefill of the committed tokens gives:
    the SSM state and conv history, and the K/V of the committed slots. Catches a commit that
    folds the never-run last draft (or skips the catch-up) and a catch-up at the wrong slot."""
    gen = generator("hybrid")
    weights = gen.draft_weights["draft"]
    drafter = DraftModel(Chain(3), weights.cfg)
    prompts, lengths = gen.pad(PROMPTS)
    state = decode_rounds(gen.params, weights.params, CONFIGS["hybrid"], drafter, prompts,
                          lengths, rounds=5, max_new_tokens=NEW, cache_len=64)
    accepted = state.stats.accepted
    assert 0 < int(jnp.sum(accepted)) < int(jnp.sum(state.stats.drafted))
    assert int(jnp.max(accepted)) >= 3  # some round kept the chain's last draft
    alone = jax.jit(lambda p, tokens, n: M.prefill_cached(
        p, weights.cfg, M.embed(p, weights.cfg, tokens), M.allocate_cache(
            weights.cfg, 1, 64, 4), n)[1])
    kv_heads = weights.cfg.num_kv_heads
    for b, prompt in enumerate(PROMPTS):
        committed = int(state.drafter.lengths[b])
        assert committed == int(state.cache.lengths[b]) == len(prompt) + int(
            state.num_tokens[b]) - 1
        emitted = state.tokens[b, :int(state.num_tokens[b])].tolist()
        tokens = (list(prompt) + emitted)[:committed]
        expected = alone(weights.params, jnp.asarray([tokens + [0] * (48 - committed)]),
                         jnp.asarray([committed]))
        ssm, attention = state.drafter.layers
        np.testing.assert_allclose(ssm.state[b], expected.layers[0].state[0], atol=2e-5)
        np.testing.assert_allclose(ssm.conv[b], expected.layers[0].conv[0], atol=2e-5)
        for mine, theirs in zip(attention, expected.layers[1], strict=True):
            np.testing.assert_allclose(mine[b * kv_heads:(b + 1) * kv_heads, :committed],
                                       theirs[:, :committed], atol=2e-5)


def test_the_skip_search_on_ssm_layers_is_a_clear_error():
    """The skip-set search drafts every position at once against the full model's K/V, which
    state-space layers do not keep per position: refused, naming why."""
    with pytest.raises(ValueError, match="state-space layers do not have"):
        AcceptanceProbe(generator("hybrid"), PROMPTS, None)
