"""Feature heads (strategies `eagle` and `mtp`): training-time test against a step-by-step
computation, decoding against training (the drafts a round makes are the unrolled training
logits' argmax on the sequence it produced), greedy output against a per-step argmax of
`model.forward` (chains, static and dynamic trees, batch 3 with ragged prompts), EOS inside a
draft, export, registration and errors. The sampled law is in test_decoding_sampling; the CLIs
and the EAGLE-3 import in test_feature_head_cli."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from specjax import model as M
from specjax.config import ModelConfig
from specjax.decoding.drafter import DraftContext, DraftWeights, Prefilled
from specjax.decoding.drafters.eagle import Eagle
from specjax.decoding.drafters.mtp import Mtp
from specjax.decoding.engine import Generator
from specjax.decoding.registry import DecodingConfig, make_strategy
from specjax.decoding.sampling import SamplingParams
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.dynamic_tree import DynamicTree
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.heads.eagle import EAGLE
from specjax.heads.feature_head import num_cells, unrolled_logits
from specjax.heads.mtp import MTP
from specjax.nn.cache import LayerKV
from specjax.nn.rope import rope_tables
from specjax.training.frozen_base import base_features
from specjax.training.heads.eagle import EagleConfig
from specjax.training.heads.feature_head import depth_sums, recorded
from tests.support.decoding import check_eos_mid_draft, export_decode_loop, per_step_argmax
from tests.support.models import TINY_MODEL, damped_params

CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})
PROMPTS = [[1, 2, 3, 4, 5], [7], list(range(40, 59))]
NEW, STEPS = 20, 3
KINDS = {"eagle": (EAGLE, Eagle, {"layers": "1,2,3"}), "mtp": (MTP, Mtp, {"depth": 2})}


@pytest.fixture(scope="session")
def params():
    return damped_params(CFG, jax.random.PRNGKey(0), 0.5)


@pytest.fixture(scope="session")
def heads(params):
    """Each kind's head after 100 steps of training-time test on random text (enough for
    drafts to be both accepted and rejected); once per test process (test_mixed_trees too)."""
    trained = {}
    for name, (kind, _, settings) in KINDS.items():
        exits = kind.exits(CFG, settings)
        optimizer = optax.adam(1e-2)

        @jax.jit
        def step(head, opt_state, batch, kind=kind, exits=exits, optimizer=optimizer):
            def loss(h):
                sums = depth_sums(kind, params, h, CFG, exits, batch, STEPS)
                return jnp.sum(sums["ce"] / sums["count"])
            updates, opt_state = optimizer.update(jax.grad(loss)(head), opt_state)
            return optax.apply_updates(head, updates), opt_state

        head = kind.init(params, CFG, settings)
        opt_state = optimizer.init(head)
        for i in range(100):
            batch = jax.random.randint(jax.random.PRNGKey(i), (8, 33), 0, CFG.vocab_size)
            head, opt_state = step(head, opt_state, batch)
        trained[name] = head
    return trained


def _generator(params, name, head):
    kind, _, settings = KINDS[name]
    return Generator(M.unstack_layers(params, CFG), CFG, draft_weights={
        name: DraftWeights(head, settings={"exits": kind.exits(CFG, settings)})})


def recording(cls, records: list) -> type:
    """`cls` whose every proposal's draft distribution q and the rows' committed lengths are
    appended to `records` (from inside the jitted loop)."""

    @dataclasses.dataclass(frozen=True)
    class Recording(cls):
        def propose(self, ctx, state, cache, pending, key):
            proposal, cache, state = super().propose(ctx, state, cache, pending, key)
            jax.debug.callback(lambda q, lengths: records.append((np.asarray(q),
                                                                  np.asarray(lengths))),
                               proposal.q, cache.lengths)
            return proposal, cache, state

    return Recording


@functools.partial(jax.jit, static_argnums=(0, 5, 6))
def _step_by_step(kind, params, head, tokens, hidden, base, depth):
    """The chain from the pending token at `base` run one depth at a time through a plain
    cache: block 0 over slots 1..base fed the target's features, then depth j's block at slot
    base + j fed the previous output; the logits of the last."""
    fused = kind.fuse(params, head, CFG, hidden)[:1]
    embedded = M.embed(params, CFG, tokens[:1])
    slots = jnp.arange(base + depth + 1)

    def run(index, parents, first, count, kv):
        cell = jax.tree.map(lambda w: w[index], head["cells"])
        write = first + jnp.arange(count)
        mask = (slots[None, :] <= write[:, None]) & (slots[None, :] >= 1)
        return kind.cell(CFG).apply({"params": cell}, embedded[:, first:first + count],
                                    parents, rope_tables(CFG, write[None]), mask[None], kv,
                                    write[None])

    out, kv = run(0, fused[:, :base], 1, base, LayerKV.allocate(CFG, 1, len(slots)))
    feature = out[:, -1:]
    for j in range(1, depth + 1):
        feature, kv = run(min(j, num_cells(head) - 1), feature, base + j, 1, kv)
    return kind.logits(params, head, CFG, feature[0, -1])


@pytest.mark.parametrize("name", sorted(KINDS))
def test_unrolled_training_logits_are_the_chain_run_step_by_step(params, heads, name):
    """Catches a training-time-test mask that lets a step see the future or another chain's
    drafts, a step fed the wrong parent (the target's feature instead of its own output, or
    one position off), tokens or RoPE positions shifted, and the wrong module per depth."""
    kind, _, settings = KINDS[name]
    tokens = jax.random.randint(jax.random.PRNGKey(7), (2, 13), 0, CFG.vocab_size)
    hidden, _ = base_features(params, CFG, kind.exits(CFG, settings), tokens[:, :-1])
    unrolled = unrolled_logits(kind, params, heads[name], CFG, tokens, hidden, STEPS)
    for base in (1, 9):
        for depth in range(STEPS):
            expected = _step_by_step(kind, params, heads[name], tokens, hidden, base, depth)
            np.testing.assert_allclose(np.asarray(unrolled[depth, 0, base]),
                                       np.asarray(expected), rtol=2e-4, atol=2e-4)


def test_the_training_loss_is_the_soft_cross_entropy_to_the_base_at_each_depth(params, heads):
    """Catches labels shifted by a depth (step j distilled to the base at s + j + 1 or s), the
    position without a parent counted, and positions past the sequence counted."""
    kind, _, settings = KINDS["eagle"]
    tokens = jax.random.randint(jax.random.PRNGKey(8), (2, 11), 0, CFG.vocab_size)
    exits = kind.exits(CFG, settings)
    sums = depth_sums(kind, params, heads["eagle"], CFG, exits, tokens, STEPS)
    hidden, base_logits = base_features(params, CFG, exits, tokens[:, :-1])
    logits = np.asarray(unrolled_logits(kind, params, heads["eagle"], CFG, tokens, hidden,
                                        STEPS), np.float64)
    p = np.asarray(jax.nn.softmax(base_logits, axis=-1), np.float64)
    for j in range(STEPS):
        positions = range(1, 10 - j)
        log_q = logits[j] - np.log(np.sum(np.exp(logits[j]), axis=-1, keepdims=True))
        ce = sum(-np.sum(p[b, s + j] * log_q[b, s]) for b in range(2) for s in positions)
        assert int(sums["count"][j]) == 2 * len(positions)
        assert float(sums["ce"][j]) == pytest.approx(ce, rel=1e-4)


def test_the_depth_agreement_is_the_drafts_argmax_against_the_bases_at_s_plus_j(params,
                                                                                monkeypatch):
    """Each depth's top-1 agreements count the positions s (1..T-1-j) where the argmax of
    step j's logits at s equals the argmax of the full model's logits (`model.forward`) at
    s + j, the token that draft stands for: with scripted drafts, right where (b + s + j) % 3
    is nonzero and wrong elsewhere, counted in numpy. Catches the draft compared with the base
    at s (its own position's next token, which a draft past depth 1 never stands for)."""
    from specjax.training.heads import feature_head

    kind, _, settings = KINDS["eagle"]
    tokens = jax.random.randint(jax.random.PRNGKey(9), (3, 15), 0, CFG.vocab_size)
    base = np.argmax(np.asarray(M.forward(params, CFG, tokens[:, :-1])), axis=-1)  # [B, T]
    width = base.shape[1]
    drafted = np.zeros((STEPS, 3, width), np.int64)
    for j, b, s in np.ndindex(drafted.shape):
        target = base[b, min(s + j, width - 1)]
        drafted[j, b, s] = target if (b + s + j) % 3 else (target + 1) % CFG.vocab_size
    monkeypatch.setattr(feature_head, "unrolled_logits", lambda *args: 5.0 * jax.nn.one_hot(
        jnp.asarray(drafted), CFG.vocab_size))
    sums = depth_sums(kind, params, None, CFG, kind.exits(CFG, settings), tokens, STEPS)
    for j in range(STEPS):
        positions = [(b, s) for b in range(3) for s in range(1, width - j)]
        assert int(sums["count"][j]) == len(positions)
        assert int(sums["agree"][j]) == sum(int(drafted[j, b, s] == base[b, s + j])
                                            for b, s in positions)
        assert int(sums["agree"][j]) == sum(1 for b, s in positions if (b + s + j) % 3)


def test_unsorted_fused_layers_are_concatenated_in_the_configured_order(params):
    """An EAGLE-3 head configured with layers "3,1,2" fuses fc @ [h3; h1; h2], the target's
    hidden states after layers 3, 1 and 2 in that order (computed directly from every layer's
    output), in its checkpoint record, in training (`base_features`, `fuse`) and in decoding
    (the drafter's prefill feature at each prompt's last token). Catches the layers sorted on
    the way (every other test configures sorted ones): fc's rows would then read another
    layer's state than the one they were trained, or published, for."""
    settings = {"layers": "3,1,2"}
    exits = EAGLE.exits(CFG, settings)
    assert exits == (3, 1, 2)
    assert recorded(EAGLE, EagleConfig(layers="3,1,2"), CFG)["exits"] == [3, 1, 2]
    head = EAGLE.init(params, CFG, settings)
    tokens = jax.random.randint(jax.random.PRNGKey(9), (2, 7), 0, CFG.vocab_size)
    every = M.run_layers(params, CFG, M.embed(params, CFG, tokens))        # [L, B, T, D]
    after = np.asarray(every, np.float64)
    expected = (np.concatenate([after[2], after[0], after[1]], axis=-1)
                @ np.asarray(head["fc"], np.float64))
    hidden, _ = base_features(params, CFG, exits, tokens)
    np.testing.assert_allclose(np.asarray(EAGLE.fuse(params, head, CFG, hidden)), expected,
                               rtol=1e-4, atol=1e-4)
    drafter = Eagle(Chain(2)).bind(DraftWeights(head, settings={"exits": list(exits)}))
    lengths = jnp.asarray([7, 4])
    state = drafter.prefill(DraftContext(params, head, None, CFG), Prefilled(
        tokens, lengths, {e: every[e - 1] for e in drafter.prefill_exits}, 16, 4))
    np.testing.assert_allclose(np.asarray(state.feature), expected[[0, 1], [6, 3]],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_each_round_drafts_what_training_predicts_on_the_sequence_it_produced(params, heads,
                                                                               name):
    """Catches a decoding path that differs from the one trained: a prefill, propose or
    commit that writes the block's K/V from other features or slots (drafted features kept
    at committed slots, one slot off, slot 0 attended), a parent read from the wrong slot, or
    the wrong module per depth. Every round's draft distribution at each depth whose parents
    were all accepted (sampled at temperature 1: q is softmax of the draft logits) is the
    unrolled training distribution at the round's pending position, on the final sequence."""
    kind, cls, settings = KINDS[name]
    records = []
    generator = _generator(params, name, heads[name])
    out = generator.generate(PROMPTS, max_new_tokens=NEW,
                             strategy=recording(cls, records)(Chain(STEPS)),
                             sampling=SamplingParams.create(temperature=1.0), seed=0)
    checked = 0
    for row, (prompt, tokens) in enumerate(zip(PROMPTS, out.tokens, strict=True)):
        sequence = prompt + tokens
        hidden, _ = base_features(params, CFG, kind.exits(CFG, settings),
                                  jnp.asarray([sequence[:-1]]))
        expected = np.asarray(jax.nn.softmax(unrolled_logits(
            kind, params, heads[name], CFG, jnp.asarray([sequence]), hidden, STEPS)))[:, 0]
        depth = out.trace[row]["depth"]
        for q, lengths in records:
            pending = int(lengths[row])
            if pending >= len(sequence) - 1:  # the row is done
                continue
            for j in range(STEPS):
                np.testing.assert_allclose(q[row, j], expected[j, pending], atol=1e-4)
                checked += 1
                kept = pending + 1 + j - len(prompt)  # the draft's index in the output
                if kept >= len(tokens) or depth[kept] != j + 1:
                    break
    assert checked > 30
    assert 0 < out.total.accepted < out.total.drafted


@pytest.mark.parametrize("shape", [Chain(STEPS), StaticTree.from_branching((2, 2, 1)),
                                   DynamicTree(6, 2, 3)], ids=["chain", "static", "dynamic"])
@pytest.mark.parametrize("name", sorted(KINDS))
def test_greedy_output_is_a_per_step_argmax_of_the_model(params, heads, name, shape):
    """Catches drafts accepted that the model would not emit, on every shape."""
    generator = _generator(params, name, heads[name])
    out = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=KINDS[name][1](shape))
    assert out.tokens == per_step_argmax(generator, PROMPTS, NEW)
    assert 0 < out.total.accepted < out.total.drafted


def test_an_eos_inside_a_draft_ends_the_row_as_plain_decoding_does(params, heads):
    """Catches tokens committed past an EOS that arrived as an accepted draft."""
    check_eos_mid_draft(_generator(params, "eagle", heads["eagle"]), PROMPTS, Eagle(Chain(3)),
                        NEW)


def test_feature_heads_are_registered_and_need_their_weights(params):
    """Catches a drafter that needs edits outside its file, and decoding without a head
    failing somewhere deep instead of saying how to get one."""
    assert make_strategy("eagle", DecodingConfig(num_draft=3)) == Eagle(Chain(3))
    assert make_strategy("mtp", DecodingConfig(tree="2,1")) == Mtp(StaticTree.from_branching(
        (2, 1)))
    with pytest.raises(ValueError, match="needs weights of its own"):
        Generator(M.unstack_layers(params, CFG), CFG).generate(
            PROMPTS, max_new_tokens=4, strategy=Eagle(Chain(2)))


@pytest.mark.parametrize("name", sorted(KINDS))
def test_the_feature_head_loop_exports_for_tpu_and_cuda(params, heads, name):
    """Catches host-side work in the drafter: the sampled tree loop must trace into one
    program that exports for both accelerators."""
    kind, cls, settings = KINDS[name]
    drafter = cls(StaticTree.from_branching((2, 1)), exits=kind.exits(CFG, settings))
    export_decode_loop(M.unstack_layers(params, CFG), heads[name], CFG, drafter)
