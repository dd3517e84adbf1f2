"""CALM: early exit without verification (`calm`) against a plain per-token reference, its
end points, per-row exits, state propagation's K/V, CALM's exits as a lossless drafter
(`calmdraft`), one-line errors and export."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import model as M
from specjax.config import ModelConfig
from specjax.decoding import loop
from specjax.decoding.drafters.calm import Calm, CalmDraft
from specjax.decoding.drafters.calm_exit import EarlyExit
from specjax.decoding.engine import Generator
from specjax.decoding.registry import DecodingConfig, make_strategy
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.nn.block import DecoderBlock
from specjax.nn.norm import apply_rms_norm
from specjax.nn.rope import apply_rope, rope_tables
from tests.support.decoding import check_eos_mid_draft, decode_rounds, export_decode_loop
from tests.support.models import TINY_MODEL, damped_params

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out

CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})  # 4 layers: candidates 1, 2, 3
PROMPTS = [[1, 2, 3, 4, 5], [7], list(range(40, 59))]  # ragged, a 1-token prompt
NEW = 20
PARAMS = damped_params(CFG, jax.random.PRNGKey(0), 0.5)
STACKED = PARAMS  # damped_params keeps the training layout (layers stacked)
LAMBDA = 0.1  # on PARAMS, tokens leave at every candidate exit and at the last layer


@pytest.fixture(scope="module")
def generator():
    return Generator(PARAMS, CFG)


def calm(measure="softmax", threshold=LAMBDA, exits=(), decay=4.0):
    return Calm(EarlyExit(exits, measure), threshold, decay)


def reference_calm(prompt, exits, threshold, decay=4.0, new=NEW):
    """CALM written out per token: each layer keeps the inputs it saw for every token so far
    and runs over them without a cache (a causal pass over the sequence); a token that leaves
    at exit e hands its exit hidden state to every later layer as that layer's input. The
    measure is the softmax response, in numpy. Returns tokens, exits, confidences."""
    L, width = CFG.num_layers, len(prompt) + new

    @jax.jit
    def block(layer, inputs):  # inputs [width, D] (zero-padded: causal, so harmless)
        rope = rope_tables(CFG, jnp.arange(width)[None])
        return DecoderBlock(CFG).apply({"params": layer}, inputs[None], rope,
                                       M.causal_mask(width))[0][0]

    head = jax.jit(lambda h: M.exit_logits(STACKED, CFG, h))
    layers = [jax.tree.map(lambda w, i=i: w[i], STACKED["layers"]) for i in range(L)]
    inputs = np.zeros((L, width, CFG.d_model), np.float32)

    def run_token(position, hidden, early=True):
        """Runs the token at `position` with input `hidden`: (exit logits, exit, confidence);
        the prompt's tokens (`early` False) run every layer, as in a prefill."""
        exit_at = None
        for index in range(L):
            inputs[index, position] = hidden
            if exit_at is None:
                hidden = np.asarray(block(layers[index], jnp.asarray(inputs[index])))[position]
                logits = np.asarray(head(jnp.asarray(hidden)), np.float64)
                probs = np.exp(logits - logits.max())
                probs /= probs.sum()
                top = np.sort(probs)[-2:]
                score = top[1] - top[0]
                generated = position - len(prompt) + 1
                lam_t = threshold * (0.9 + 0.1 * np.exp(-decay * generated / new))
                leaves = early and index + 1 in exits and threshold < 1 and score >= lam_t
                if index + 1 == L or leaves:
                    exit_at, result = index + 1, (logits, index + 1, score)
        return result

    embedded = np.asarray(M.embed(STACKED, CFG, jnp.asarray(prompt)))
    for position, hidden in enumerate(embedded):
        logits = run_token(position, hidden, early=False)[0]
    tokens, exit_layers, scores = [int(np.argmax(logits))], [-1], [-1.0]
    for position in range(len(prompt), width - 1):
        hidden = np.asarray(M.embed(STACKED, CFG, jnp.asarray([tokens[-1]])))[0]
        logits, exit_at, score = run_token(position, hidden)
        tokens.append(int(np.argmax(logits)))
        exit_layers.append(exit_at)
        scores.append(score)
    return tokens, exit_layers, scores, inputs


@pytest.fixture(scope="module")
def references():
    return [reference_calm(p, (1, 2, 3), LAMBDA) for p in PROMPTS]


def test_calm_equals_a_plain_per_token_reference(generator, references):
    """Catches wrong state propagation (the skipped layers' K/V copied from the exit layer,
    projected from the wrong hidden state, or not written), an exit taken one segment late or
    at the wrong confidence, and a wrong threshold decay: every later token would change.
    Three ragged rows in one batch, each against its own reference."""
    out = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=calm())
    for row, (tokens, exits, scores, _) in enumerate(references):
        assert out.tokens[row] == tokens
        assert out.trace[row]["exit"] == exits
        np.testing.assert_allclose(out.trace[row]["confidence"][1:], scores[1:], atol=1e-5)
    used = {e for ref in references for e in ref[1][1:]}
    assert used == {1, 2, 3, 4}, used  # every candidate and the last layer


def test_skipped_layers_hold_the_k_v_projected_from_the_exit_state(references):
    """The cache itself after 6 rounds: every layer's K/V of every generated token equals the
    projection of that layer's input in the reference (the exit hidden state in the layers the
    token skipped). Catches propagation that writes the exit layer's K/V into the skipped ones,
    or none."""
    rounds, prompt = 6, PROMPTS[0]
    state = decode_rounds(M.unstack_layers(PARAMS, CFG), calm().runtime_params(None), CFG, calm(),
                          jnp.asarray([prompt + [0] * (16 - len(prompt))]),
                          jnp.asarray([len(prompt)]), rounds=rounds, max_new_tokens=NEW,
                          cache_len=48)
    inputs = references[0][3]
    exits = references[0][1][1:rounds + 1]
    assert min(exits) < CFG.num_layers  # some token skipped layers
    slots = np.arange(len(prompt), len(prompt) + rounds)
    group, heads = CFG.group_size, CFG.num_kv_heads
    for index in range(CFG.num_layers):
        layer = jax.tree.map(lambda w, i=index: w[i], STACKED["layers"])
        normed = apply_rms_norm(jnp.asarray(inputs[index, slots]),
                                layer["attn_norm"]["scale"], CFG)
        k = jnp.einsum("td,dhe->the", normed, layer["attn"]["qkv"][:, :, group])
        v = jnp.einsum("td,dhe->the", normed, layer["attn"]["qkv"][:, :, group + 1])
        k = apply_rope(k[None], rope_tables(CFG, jnp.asarray(slots)[None]))[0]
        cache = state.cache.layers[index]
        for h in range(heads):
            np.testing.assert_allclose(cache.k[h, slots], k[:, h], atol=1e-5)
            np.testing.assert_allclose(cache.v[h, slots], v[:, h], atol=1e-5)


@pytest.mark.parametrize("measure", ["softmax", "state"])
def test_the_thresholds_end_points(generator, measure):
    """lambda = 1 never exits early: exactly `ar`'s tokens, every exit the last layer (catches
    a threshold that decays below 1). lambda = 0 exits every token at the first candidate
    (catches the paper's printed decay 0.9 lambda + 0.1 exp(-tau t / N), which stays above 0)."""
    reference = generator.generate(PROMPTS, max_new_tokens=NEW)
    full = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=calm(measure, 1.0))
    assert full.tokens == reference.tokens
    assert all(set(t["exit"][1:]) == {CFG.num_layers} for t in full.trace)
    first = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=calm(measure, 0.0,
                                                                           exits=(2, 3)))
    assert all(set(t["exit"][1:]) == {2} for t in first.trace)
    assert first.tokens != reference.tokens


def test_a_rows_tokens_and_exits_do_not_depend_on_its_batch(generator):
    """Catches CALM's batch-level rule (the whole batch exits at its least confident row):
    each row decoded alone must give the same tokens and exits as in the batch."""
    batch = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=calm("state", 0.95))
    assert len({e for t in batch.trace for e in t["exit"][1:]}) > 1
    for row, prompt in enumerate(PROMPTS):
        alone = generator.generate([prompt], max_new_tokens=NEW, strategy=calm("state", 0.95))
        assert alone.tokens[0] == batch.tokens[row]
        assert alone.trace[0]["exit"] == batch.trace[row]["exit"]


def test_the_threshold_is_traced_one_program_serves_every_lambda(generator):
    """Catches lambda baked into the compiled program: a sweep must not recompile, and a
    second lambda must not reuse the first one's value."""
    loop.generate_tokens.clear_cache()
    outs = [generator.generate(PROMPTS[:1], max_new_tokens=NEW, strategy=calm("softmax", lam))
            for lam in (1.0, 0.0)]
    assert loop.generate_tokens._cache_size() == 1
    assert outs[0].trace[0]["exit"] != outs[1].trace[0]["exit"]


@pytest.mark.parametrize("shape", [Chain(4), StaticTree.from_branching((2, 2, 1))],
                         ids=["chain", "tree"])
@pytest.mark.parametrize("threshold", [0.0, LAMBDA])
def test_greedy_calmdraft_equals_autoregressive(generator, shape, threshold):
    """CALM's exits as the drafter (each draft leaving at exit 1, 2 or 3), verified by the full
    model: lossless whatever the drafts' depths. Catches verification reusing layers past the
    first candidate exit (drafts that left there never ran them) and draft K/V surviving
    verification."""
    reference = generator.generate(PROMPTS, max_new_tokens=NEW)
    strategy = CalmDraft(EarlyExit((1, 2, 3)), threshold, 4.0, shape)
    out = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=strategy)
    assert out.tokens == reference.tokens
    total = out.total
    assert 0 < total.accepted < total.drafted
    depth = total.extra["draft_layers"] / total.extra["draft_passes"]
    assert (depth == 1) if threshold == 0 else (1 < depth < 3)  # drafts stop at exit 3


def test_eos_inside_a_calm_draft_ends_the_row_like_autoregressive(generator):
    check_eos_mid_draft(generator, PROMPTS, CalmDraft(EarlyExit((1, 2)), LAMBDA, 4.0, Chain(4)),
                        NEW)


def test_calm_refuses_what_it_cannot_run(generator):
    with pytest.raises(ValueError, match="calm_measure='soft'"):
        generator.generate([[1]], max_new_tokens=4, strategy=calm("soft"))
    with pytest.raises(ValueError, match=r"calm_exits=\[2, 4\] must be"):
        generator.generate([[1]], max_new_tokens=4, strategy=calm(exits=(2, 4)))
    with pytest.raises(ValueError, match="calm_exits='1,x'"):
        make_strategy("calm", DecodingConfig(calm_exits="1,x"))
    with pytest.raises(ValueError, match="decoding.calm_threshold"):
        DecodingConfig(calm_threshold=1.5).check(CFG)
    no_exits = dataclasses.replace(CFG, exit_layers=(CFG.num_layers,))
    with pytest.raises(ValueError, match="no trained exit below its last layer"):
        calm().validate(no_exits)


@pytest.mark.parametrize("strategy", [calm(), CalmDraft(EarlyExit(), LAMBDA, 4.0, Chain(4))],
                         ids=["calm", "calmdraft"])
def test_calm_loops_export_for_tpu_and_cuda(generator, strategy):
    exported = export_decode_loop(generator.params, strategy.runtime_params(None), CFG, strategy)
    assert exported.mlir_module().count("stablehlo.case") >= 1  # the per-segment lax.cond

