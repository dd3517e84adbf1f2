"""Token trees: tree attention against plain chains, greedy trees against `ar`, the cache after
a tree's commit against one-token-at-a-time decoding, and the chain's program without
compaction."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import model as M
from specjax.config import ModelConfig
from specjax.decoding import loop
from specjax.decoding.drafter import DraftContext
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.decoding.drafters.skip import SkipLayers
from specjax.decoding.engine import Generator
from specjax.decoding.proposal import Proposal
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.dynamic_tree import DynamicTree
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.decoding.shapes.tree import ancestor_matrix, inherit_validity
from specjax.decoding.verify import verify
from specjax.nn.cache import LayerKV
from tests.support.decoding import decode_rounds, export_decode_loop
from tests.support.models import TINY_MODEL, damped_params

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out

CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})
PROMPTS = [[1, 2, 3, 4, 5], [7], list(range(40, 59)), [9, 9, 8]]  # ragged, a 1-token prompt
NEW = 23
TREES = {
    "static 2,2,1,1": StaticTree.from_branching((2, 2, 1, 1)),
    "static 3,1": StaticTree.from_branching((3, 1)),
    "static irregular": StaticTree.from_parents([-1, 0, -1, 1, 2, 2, 0, 3, -1]),
    "dynamic T=8 k=2 D=3": DynamicTree(8, 2, 3),
    "dynamic T=16 k=4 D=4": DynamicTree(16, 4, 4),
}


@functools.cache
def _generator() -> Generator:
    return Generator(damped_params(CFG, jax.random.PRNGKey(0), 0.5), CFG)


@functools.cache
def _stacked():
    params = _generator().params
    return {**params, "layers": jax.tree.map(lambda *w: jnp.stack(w), *params["layers"])}


@pytest.fixture(scope="module")
def reference():
    return {4: _generator().generate(PROMPTS, max_new_tokens=NEW)}


def _random_tree(rng, size):
    """Parents before children, some nodes invalid (with their descendants)."""
    return [int(rng.integers(-1, i)) for i in range(size)]


def test_tree_verification_equals_each_path_run_as_a_plain_chain():
    """Every node's verification logits equal the model's output on its root-to-node path as an
    ordinary sequence (no cache, no loop). Catches a mask that lets a node see its siblings or
    other branches, RoPE at the node index instead of its depth, or K/V written to the wrong
    slot; random per-row trees with invalid nodes, batch 3, ragged prompts."""
    rng = np.random.default_rng(0)
    generator, size = _generator(), 10
    prompts = PROMPTS[:3]
    padded, lengths = generator.pad(prompts)
    batch = len(prompts)
    cache = M.allocate_cache(CFG, batch, 64)
    run = jax.jit(M.run_layers_cached, static_argnames=("cfg", "layers"))
    _, cache = run(generator.params, CFG, M.embed(generator.params, CFG, padded), cache,
                   jnp.zeros((batch,), jnp.int32))
    cache = cache.commit(lengths)
    parents = np.array([_random_tree(rng, size) for _ in range(batch)], np.int32)
    tokens = rng.integers(0, CFG.vocab_size, (batch, size))
    pending = rng.integers(0, CFG.vocab_size, (batch,))
    valid = inherit_validity(jnp.asarray(rng.random((batch, size)) > 0.2),
                             ancestor_matrix(jnp.asarray(parents)))
    proposal = Proposal(tokens=jnp.asarray(tokens, jnp.int32), parents=jnp.asarray(parents),
                        valid=valid, q=None, reuse=None, stats={},
                        shape=StaticTree.from_branching((size,)))
    logits = jax.jit(verify, static_argnames="cfg")(generator.params, CFG, cache,
                                                    jnp.asarray(pending, jnp.int32),
                                                    proposal).logits
    sequences = []
    for b in range(batch):
        for position in range(size + 1):
            path, node = [], position - 1
            while node >= 0:
                path.append(int(tokens[b, node]))
                node = int(parents[b, node])
            sequences.append(list(prompts[b]) + [int(pending[b])] + path[::-1])
    width = max(len(s) for s in sequences)  # causal: padding after a sequence changes nothing
    padded_paths = jnp.asarray([s + [0] * (width - len(s)) for s in sequences])
    expected = jax.jit(M.forward, static_argnames="cfg")(_stacked(), CFG, padded_paths)
    ends = jnp.asarray([len(s) - 1 for s in sequences])
    expected = expected[jnp.arange(len(sequences)), ends].reshape(batch, size + 1, -1)
    np.testing.assert_allclose(logits, expected, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("name,exit_layer", [(name, 1 + 2 * (i % 2))
                                             for i, name in enumerate(sorted(TREES))])
def test_greedy_trees_equal_autoregressive(reference, name, exit_layer):
    """Catches any acceptance, commit or reuse bug that changes the output: a wrong path
    compaction, a stale shallow K/V, a wrong bonus token, a row's tree leaking into another."""
    strategy = SelfSpeculative(exit_layer, TREES[name])
    out = _generator().generate(PROMPTS, max_new_tokens=NEW, strategy=strategy)
    assert out.tokens == reference[4].tokens
    for stats in out.stats:
        assert stats.accepted + stats.rounds == NEW - 1
        assert stats.drafted <= TREES[name].num_nodes * stats.rounds
    assert out.total.accepted > 0 and out.total.rounds < 4 * (NEW - 1)  # several a round


@pytest.mark.parametrize("skip", [(2,), (1, 3)])
@pytest.mark.parametrize("name", ["static 2,2,1,1", "dynamic T=8 k=2 D=3"])
def test_greedy_skip_layer_trees_equal_autoregressive(reference, name, skip):
    """Catches a layer-skip tree whose leaves (never run by the draft) miss the layers before
    the first skipped one, or whose reuse starts at the wrong layer."""
    out = _generator().generate(PROMPTS, max_new_tokens=NEW,
                                strategy=SkipLayers(skip, TREES[name]))
    assert out.tokens == reference[4].tokens
    assert out.total.accepted > 0


@pytest.mark.parametrize("name", ["static 2,2,1,1", "dynamic T=8 k=2 D=3"])
def test_eos_inside_a_tree_and_budgets_that_end_mid_path(reference, name):
    """A row must stop at an EOS that sits in the middle of an accepted path, and at a budget
    that ends mid-path, exactly where `ar` stops."""
    generator, strategy = _generator(), SelfSpeculative(1, TREES[name])
    full = reference[4].tokens
    eos = next(t for i, t in enumerate(full[0]) if i >= 4 and t not in full[0][:i])
    expected = generator.generate(PROMPTS, max_new_tokens=NEW, eos_id=eos).tokens
    assert expected[0][-1] == eos and len(expected[0]) < NEW
    assert generator.generate(PROMPTS, max_new_tokens=NEW, eos_id=eos,
                              strategy=strategy).tokens == expected
    for budget in (3,):
        short = generator.generate(PROMPTS, max_new_tokens=budget, strategy=strategy)
        assert short.tokens == [t[:budget] for t in full]


DRAFTERS = {"selfspec E=2 static 2,2,1,1": SelfSpeculative(2, TREES["static 2,2,1,1"]),
            "selfspec E=2 dynamic": SelfSpeculative(2, TREES["dynamic T=16 k=4 D=4"]),
            "skip 1 static 2,2,1,1": SkipLayers((1,), TREES["static 2,2,1,1"]),
            "skip 1,2 chain 4": SkipLayers((1, 2), Chain(4))}


@pytest.mark.parametrize("name", sorted(DRAFTERS))
def test_the_cache_after_tree_commits_equals_one_token_at_a_time(name):
    """After several rounds every layer's committed K/V (shallow, written while drafting, and
    deep, written by verification) equals the K/V of feeding the committed tokens one at a
    time. Catches a compaction that moves the wrong slots or forgets a layer, and a layer-skip
    draft's K/V (layers after a skipped one) left in the cache."""
    generator = _generator()
    drafter = DRAFTERS[name]
    state = decode_rounds(generator.params, {}, CFG, drafter, *generator.pad(PROMPTS), rounds=4,
                          max_new_tokens=NEW, cache_len=80)
    assert int(jnp.max(state.stats.accepted)) > 0
    step = jax.jit(M.run_layers_cached, static_argnames=("cfg", "layers"))
    for b, prompt in enumerate(PROMPTS):
        committed = int(state.cache.lengths[b])
        emitted = state.tokens[b, :int(state.num_tokens[b])].tolist()
        sequence = (list(prompt) + emitted)[:committed]
        cache = M.allocate_cache(CFG, 1, 80)
        for t, token in enumerate(sequence):
            _, cache = step(generator.params, CFG,
                            M.embed(generator.params, CFG, jnp.asarray([[token]])), cache,
                            jnp.asarray([t]))
        kv_heads = CFG.num_kv_heads
        for mine, theirs in zip(state.cache.layers, cache.layers, strict=True):
            for a, c in zip(mine, theirs, strict=True):
                np.testing.assert_allclose(a[b * kv_heads:(b + 1) * kv_heads, :committed],
                                           c[:, :committed], atol=2e-5)


@pytest.mark.parametrize("shape", [DynamicTree(16, 4, 4), DynamicTree(10, 2, 4),
                                   StaticTree.from_branching((3, 2, 1))],
                         ids=["dynamic T=16", "dynamic T=10 k=2", "static 3,2,1"])
def test_greedy_trees_never_propose_the_same_child_twice(shape):
    """Each node's children are distinct tokens. Catches a dynamic tree that picks an expanded
    node again as a leaf (a wasted node: losslessness alone cannot see it)."""
    generator, drafter = _generator(), SelfSpeculative(1, shape)
    padded, lengths = generator.pad(PROMPTS)
    ctx = DraftContext(params=generator.params, draft_params={}, sampling=None, cfg=CFG)
    key = jax.random.PRNGKey(0)

    @jax.jit
    def proposals(params):
        ctx_ = ctx.replace(params=params)
        state = loop.prefill(ctx_, drafter, padded, lengths, key, jnp.int32(-1),
                             max_new_tokens=NEW, cache_len=80)
        out = []
        for _ in range(3):
            out.append(drafter.propose(ctx_, state.drafter, state.cache, state.pending, key)[0])
            state = loop.decode_round(ctx_, drafter, key, jnp.int32(-1), state)
        return out

    for proposal in proposals(generator.params):
        for b in range(len(PROMPTS)):
            pairs = [(int(p), int(t)) for p, t, v in zip(
                proposal.parents[b], proposal.tokens[b], proposal.valid[b], strict=True) if v]
            assert len(pairs) == len(set(pairs)) == shape.num_nodes


def test_a_chain_compiles_without_compaction(monkeypatch):
    """Chains keep their accepted drafts in place: lowering the chain's loop must never reach
    the attention cache's compaction. The positive control (a tree) shows the probe fires."""
    original = LayerKV.commit

    def forbidden(self, before, after, path):
        if path is not None:
            raise AssertionError("compaction traced")
        return original(self, before, after, path)

    monkeypatch.setattr(LayerKV, "commit", forbidden)
    generator = _generator()
    padded, lengths = generator.pad(PROMPTS)

    def lower(drafter):
        return loop.generate_tokens.lower(
            generator.params, {}, padded, lengths, jax.random.PRNGKey(0), None, jnp.int32(-1),
            cfg=CFG, drafter=drafter, max_new_tokens=8, cache_len=64)

    lower(SelfSpeculative(1, Chain(4)))
    with pytest.raises(AssertionError, match="compaction traced"):
        lower(SelfSpeculative(1, StaticTree.from_branching((1, 1, 1, 1))))


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampling"])
@pytest.mark.parametrize("name", ["static 2,2,1,1", "dynamic T=8 k=2 D=3"])
def test_tree_loops_export_for_tpu_and_cuda(name, sampled):
    generator = _generator()
    exported = export_decode_loop(generator.params, {}, CFG, SelfSpeculative(2, TREES[name]),
                                  sampled=sampled)
    assert "stablehlo.while" in exported.mlir_module()
