"""Greedy decoding: `ar` is a per-step argmax of the model, and self-speculative chains are
token-for-token identical to it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import model as M
from specjax.config import ModelConfig
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.decoding.drafters.skip import SkipLayers
from specjax.decoding.engine import Generator
from specjax.decoding.sampling import SamplingParams
from specjax.decoding.shapes.chain import Chain
from tests.support.decoding import decode_rounds, export_decode_loop
from tests.support.models import TINY_MODEL, damped_params

CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})
PROMPTS = [[1, 2, 3, 4, 5], [7], list(range(40, 59))]  # ragged, including a 1-token prompt
NEW = 23  # not a multiple of K + 1 for any K below


GENERATORS = {}


def chain(exit_layer: int, num_draft: int, threshold: float = 0.0) -> SelfSpeculative:
    return SelfSpeculative(exit_layer, Chain(num_draft, threshold))


def _generator(deep_scale: float) -> Generator:
    if deep_scale not in GENERATORS:
        GENERATORS[deep_scale] = Generator(damped_params(CFG, jax.random.PRNGKey(0), deep_scale),
                                           CFG)
    return GENERATORS[deep_scale]


@pytest.fixture(scope="module", params=[0.5, 0.3], ids=["mixed", "agreeable"])
def generators(request):
    """Both test models: equality must hold at low and at high acceptance."""
    return _generator(request.param)


@pytest.fixture(scope="module")
def generator():
    return _generator(0.5)


@pytest.fixture(scope="module")
def reference(generators):
    return {batch: generators.generate(PROMPTS[:batch], max_new_tokens=NEW) for batch in (1, 3)}


@pytest.mark.parametrize("exit_layer,num_draft", [(1, 1), (1, 4), (2, 8), (3, 2)])
def test_greedy_selfspec_equals_autoregressive(generators, reference, exit_layer, num_draft):
    """Every exit and a spread of K (1: a lone draft; 8: longer than most accepted runs); a
    batch of ragged prompts, and one prompt alone once."""
    for batch in (1, 3) if num_draft == 1 else (3,):
        out = generators.generate(PROMPTS[:batch], max_new_tokens=NEW,
                                 strategy=chain(exit_layer, num_draft))
        assert out.tokens == reference[batch].tokens
        assert all(len(t) == NEW for t in out.tokens)
        for stats in out.stats:
            assert stats.drafted == num_draft * stats.rounds
            assert 0 <= stats.accepted <= stats.drafted
            assert stats.accepted + stats.rounds == NEW - 1  # stats count committed tokens


@pytest.mark.parametrize("skip", [(1,), (2,), (1, 3), (2, 3)])
def test_greedy_skip_layers_equals_autoregressive(generators, reference, skip):
    """Catches a layer-skip drafter whose reused hidden state is not the target's own (taken
    after a skipped layer), or whose draft K/V in the layers after a skipped one survive
    verification: either changes the committed tokens. A draft that runs the skipped layers
    anyway is the target itself: it would never be rejected."""
    for batch in (3,):
        out = generators.generate(PROMPTS[:batch], max_new_tokens=NEW,
                                 strategy=SkipLayers(skip, Chain(3)))
        assert out.tokens == reference[batch].tokens
        for stats in out.stats:
            assert stats.accepted + stats.rounds == NEW - 1
    perfect_rounds = -(-(NEW - 1) // 4)  # every draft accepted: 4 tokens a round
    assert out.total.accepted > 0 and out.total.rounds > 3 * perfect_rounds


def test_greedy_autoregressive_is_a_per_step_argmax_of_the_model(generator):
    """The reference itself, against the model without the loop: catches a prefill or cache
    bug that `ar` and every speculative strategy share (they are compared with each other)."""
    width = max(map(len, PROMPTS)) + NEW  # causal: padding after the sequence changes nothing

    @jax.jit
    def next_token(params, sequence, length):
        return jnp.argmax(M.forward(params, CFG, sequence[None])[0, length - 1])

    out = generator.generate(PROMPTS, max_new_tokens=NEW)
    params = {**generator.params, "layers": jax.tree.map(lambda *w: jnp.stack(w),
                                                        *generator.params["layers"])}
    for prompt, generated in zip(PROMPTS, out.tokens, strict=True):
        sequence = list(prompt)
        for _ in range(NEW):
            padded = jnp.asarray(sequence + [0] * (width - len(sequence)))
            sequence.append(int(next_token(params, padded, len(sequence))))
        assert generated == sequence[len(prompt):]


def test_stats_count_only_committed_tokens(generator):
    """A budget smaller than one round's drafts: accepted drafts past the budget are not
    committed, so they must not count (τ would exceed the tokens generated)."""
    out = generator.generate(PROMPTS[:1], max_new_tokens=3, strategy=chain(1, 8))
    stats = out.stats[0]
    assert len(out.tokens[0]) == 3 and stats.accepted + stats.rounds == 2


@pytest.mark.parametrize("exit_layer,num_draft,threshold", [(1, 8, 0.3), (2, 4, 0.95)])
def test_confidence_stopped_drafts_equal_autoregressive(generators, reference, exit_layer,
                                                        num_draft, threshold):
    strategy = chain(exit_layer, num_draft, threshold)
    for batch in (1, 3):
        out = generators.generate(PROMPTS[:batch], max_new_tokens=NEW, strategy=strategy)
        assert out.tokens == reference[batch].tokens
        for stats in out.stats:
            assert stats.rounds <= stats.drafted <= num_draft * stats.rounds
            assert 0 <= stats.accepted <= stats.drafted
    if threshold == 0.95:  # drafts really were cut short
        assert out.total.extra["stopped_after"] < num_draft * out.total.rounds


def test_rows_that_stop_drafting_early_are_verified_only_as_far_as_they_drafted(generator):
    """A confidence stop no draft can pass (eta .999): every row stops after its first draft,
    so one round's verification is the smallest pass (2 of K = 6 nodes), which the chain fills:
    2 drafts per row, and the deep layers' K/V written at the pending token's and two nodes'
    slots and nowhere after. Catches verification that runs all K nodes whatever the rows
    drafted (the stop would then save drafting only), and a chain not filled to its pass (1
    draft counted where the pass verifies 2)."""
    strategy = chain(1, 6, 0.999)
    assert strategy.shape.verify_sizes == (2, 4, 6)
    prompts, lengths = generator.pad([list(range(1, 33))] * 2)  # no padding slots
    state = decode_rounds(generator.params, {}, CFG, strategy, prompts, lengths, rounds=1,
                          max_new_tokens=8, cache_len=48)
    assert state.stats.drafted.tolist() == [2, 2] and state.stats.verified.tolist() == [3, 3]
    written = jnp.any(state.cache.layers[-1].k != 0, axis=(0, 2))  # per slot
    assert written.tolist() == [True] * 35 + [False] * 13  # prompt, pending, two nodes


def test_speculation_actually_accepts_and_rejects(generators):
    out = generators.generate(PROMPTS, max_new_tokens=NEW, strategy=chain(2, 4))
    perfect_rounds = -(-(NEW - 1) // 4)  # every draft accepted: 4 tokens a round
    assert out.total.accepted > 0 and out.total.rounds > 3 * perfect_rounds
    assert out.total.rounds < 3 * (NEW - 1)  # fewer rounds than autoregressive steps


def test_autoregressive_stats(reference):
    for stats in reference[3].stats:
        assert (stats.rounds, stats.drafted, stats.accepted) == (NEW - 1, 0, 0)
        assert stats.tau == 1.0


@pytest.mark.parametrize("num_draft,threshold", [(3, 0.0), (8, 0.0), (8, 0.5)])
def test_eos_inside_a_draft_ends_the_row_exactly_like_autoregressive(generators, num_draft,
                                                                     threshold):
    generator = generators
    full = generator.generate(PROMPTS, max_new_tokens=NEW).tokens
    # A token that first appears mid-output in row 0 becomes the EOS.
    eos = next(t for i, t in enumerate(full[0]) if i >= 4 and t not in full[0][:i])
    expected = generator.generate(PROMPTS, max_new_tokens=NEW, eos_id=eos).tokens
    assert expected[0][-1] == eos and len(expected[0]) < NEW
    out = generator.generate(PROMPTS, max_new_tokens=NEW, eos_id=eos,
                             strategy=chain(1, num_draft, threshold))
    assert out.tokens == expected
    for tokens in expected:
        assert eos not in tokens[:-1]
        if tokens[-1] != eos:
            assert len(tokens) == NEW


def test_rows_are_independent_of_each_others_content(generator):
    sampling = SamplingParams.create(temperature=1.0)
    for sp in (None, sampling):
        a = generator.generate([PROMPTS[0], PROMPTS[1]], max_new_tokens=12, sampling=sp,
                               strategy=chain(1, 3), seed=5)
        b = generator.generate([PROMPTS[0], [200, 201, 202]], max_new_tokens=12, sampling=sp,
                               strategy=chain(1, 3), seed=5)
        assert a.tokens[0] == b.tokens[0]
        assert a.tokens[1] != b.tokens[1]
    alone = generator.generate(PROMPTS[2:], max_new_tokens=NEW, strategy=chain(3, 2))
    batched = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=chain(3, 2))
    assert batched.tokens[2] == alone.tokens[0]


def test_same_key_same_output_and_keys_matter(generator):
    sampling = SamplingParams.create(temperature=1.0, top_k=50)
    runs = [generator.generate(PROMPTS, max_new_tokens=15, sampling=sampling, seed=seed,
                               strategy=chain(2, 4)).tokens for seed in (3, 3, 4)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_bad_requests_are_clear_errors(generator):
    small = Generator(generator.params, CFG, max_cache_len=64)
    with pytest.raises(ValueError, match="exceeds the cache limit max_cache_len=64"):
        small.generate([list(range(60))], max_new_tokens=10)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generator.generate([[1], []], max_new_tokens=4)
    with pytest.raises(ValueError, match=r"outside \[0, 259\)"):
        generator.generate([[1, 300]], max_new_tokens=4)
    with pytest.raises(ValueError, match=r"exit_layer=4 must lie in \[1, num_layers - 1 = 3\]"):
        generator.generate([[1]], max_new_tokens=4, strategy=chain(4, 2))
    with pytest.raises(ValueError, match=r"skip_layers=\[0\] must lie in \[1, num_layers - 1"):
        generator.generate([[1]], max_new_tokens=4, strategy=SkipLayers((0,)))
    with pytest.raises(ValueError, match="must be distinct layer indices in ascending order"):
        generator.generate([[1]], max_new_tokens=4, strategy=SkipLayers((2, 1)))
    with pytest.raises(ValueError, match="temperature=0.0 must be > 0"):
        SamplingParams.create(temperature=0.0)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampling"])
def test_generate_loop_exports_for_tpu_and_cuda(generator, sampled):
    exported = export_decode_loop(generator.params, {}, CFG,
                                  chain(2, 4, 0.5 if sampled else 0.0), sampled=sampled)
    module = exported.mlir_module()
    assert module.count("stablehlo.while") >= 2  # the decode loop and the draft loop


def test_exactly_the_given_eos_ids_end_a_row():
    """Catches the loop's EOS slots padded with an id a model can emit (padded with 0, every
    row emitting token 0 would end there) and a listed id ignored: over the whole
    vocabulary, exactly the given ids are stops, and more than the slots hold is refused."""
    from specjax.decoding.engine import MAX_STOP_IDS, stop_ids
    from specjax.decoding.loop import is_stop

    vocab = jnp.arange(300)
    for ids in (None, 5, [], [5], [0, 7, 299]):
        given = [] if ids is None else [ids] if isinstance(ids, int) else ids
        assert np.flatnonzero(is_stop(vocab, stop_ids(ids))).tolist() == sorted(given)
    with pytest.raises(ValueError, match=f"at most {MAX_STOP_IDS} end a row"):
        stop_ids(list(range(MAX_STOP_IDS + 1)))
