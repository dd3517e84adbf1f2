"""Prompt lookup (strategy `ngram`): the n-gram match against hand-made texts and a plain-Python
reference, the drafter's text kept in step, greedy output against a per-step argmax of
`model.forward`, export, and the drafter added as one file (registered, flagged and swept
without an edit elsewhere). Its sampled law is in test_decoding_sampling."""

import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.cli.decoding import DECODING_FLAGS, decoding_options
from specjax.config import ModelConfig
from specjax.decoding.acceptance import Acceptance
from specjax.decoding.drafter import DraftContext, Prefilled, Round
from specjax.decoding.drafters.ngram import PromptLookup, continuation
from specjax.decoding.engine import Generator
from specjax.decoding.registry import DecodingConfig, make_strategy
from specjax.decoding.sampling import SamplingParams
from specjax.decoding.shapes.chain import Chain
from specjax.nn.cache import Cache
from tests.support.decoding import export_decode_loop, per_step_argmax
from tests.support.models import TINY_MODEL, damped_params

CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})
# Repeating prompts, so the output (a random model's greedy loop) and the prompt share n-grams.
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 9, 9], list(range(40, 50)) * 2]
NEW = 24


def _continue(text, ngram_max, count, ngram_min=1):
    tokens, found = continuation(jnp.asarray([text + [0] * 4]), jnp.asarray([len(text)]),
                                 ngram_min, ngram_max, count)
    return [int(t) for t, f in zip(tokens[0], found[0], strict=True) if f]


def reference_continuation(text, ngram_min, ngram_max, count):
    """The documented rule in plain Python: for the longest n in [min, max] whose last n tokens
    occurred before, the occurrence followed by the most tokens (up to count), then the latest;
    the tokens after it."""
    for n in range(ngram_max, ngram_min - 1, -1):
        occurrences = [start for start in range(len(text) - n)
                       if text[start:start + n] == text[len(text) - n:]]
        if occurrences:
            start = max(occurrences, key=lambda s: (min(count, len(text) - s - n), s))
            return text[start + n:start + n + count]
    return []


def test_the_latest_match_of_the_longest_suffix_is_continued():
    """Catches a search that takes an earlier match over the latest, the latest where it is
    followed by fewer tokens (a run of one token would draft one token a round), prefers a
    shorter n-gram over a longer one, matches the suffix against itself, or copies past the
    text."""
    assert _continue([1, 2, 3, 1, 2, 4, 1, 2], 2, 3) == [4, 1, 2]       # latest "1 2"
    assert _continue([7, 2, 9, 3, 2, 8, 3, 2], 2, 2) == [8, 3]           # "3 2" beats "2"
    assert _continue([7, 2, 9, 3, 2, 8, 3, 2], 1, 2) == [8, 3]           # latest "2"
    assert _continue([1, 2, 3, 4], 3, 2) == []                           # nothing repeats
    assert _continue([5, 5], 3, 4) == [5]                                # up to the text's end
    assert _continue([3, 3, 3, 3], 1, 2) == [3, 3]                       # the longest follow-up
    assert _continue([4], 3, 2) == []                                    # a lone token
    assert _continue([7, 2, 9, 3, 2, 8, 3, 2], 2, 2, ngram_min=2) == [8, 3]
    assert _continue([1, 2, 3, 4, 2], 3, 2, ngram_min=2) == []           # "2" alone is too short


def test_the_match_equals_a_plain_python_reference_on_random_streams():
    """Catches an off-by-one at either end of the text, a match that wraps around the buffer
    (`roll`: texts that fill it, padded with a token of the vocabulary otherwise), or a tie
    broken the other way, on 300 random streams of a 3-token vocabulary (matches everywhere)
    in one batch."""
    rng = random.Random(0)
    width, count = 40, 4
    texts = [[rng.randrange(3) for _ in range(rng.choice([width, rng.randrange(1, width)]))]
             for _ in range(300)]
    for ngram_min, ngram_max in [(1, 3), (2, 4)]:
        tokens, found = continuation(
            jnp.asarray([text + [0] * (width - len(text)) for text in texts]),
            jnp.asarray([len(text) for text in texts]), ngram_min, ngram_max, count)
        for text, row, mask in zip(texts, np.asarray(tokens), np.asarray(found), strict=True):
            assert row[mask].tolist() == reference_continuation(text, ngram_min, ngram_max, count)


def test_commit_writes_the_round_after_its_pending_token():
    """Catches a commit that writes the accepted drafts and the next pending token anywhere but
    right after the pending token the round started from (the text, and so every later match,
    would be out of step with the output), or that writes for a row that is done."""
    drafter = PromptLookup(2, 1, Chain(3))
    text = drafter.prefill(None, Prefilled(jnp.asarray([[1, 2, 3], [4, 5, 0]]), jnp.asarray([3, 2]),
                                           {}, cache_len=8, max_new_tokens=4))
    text = text.at[0, 3].set(7).at[1, 2].set(6)  # propose wrote each row's pending token
    done = Round(pending=jnp.asarray([7, 6]), proposal=None,
                 acceptance=Acceptance(jnp.asarray([2, 0]), jnp.asarray([[8, 9, 4, 0]] * 2), None),
                 reused_hidden=None, lengths_before=jnp.asarray([3, 2]),
                 lengths_after=jnp.asarray([6, 2]))  # row 1 is done: nothing to write
    text = drafter.commit(None, text, done)
    assert text[0, :7].tolist() == [1, 2, 3, 7, 8, 9, 4] and text[1, :4].tolist() == [4, 5, 6, 0]


def test_a_sampled_copy_is_its_one_hot_drawn_without_the_sampling_filters():
    """Sampled (top-k and top-p binding), a copied draft's q is the one-hot of the copy and the
    proposal holds none of the filters' branches (`cond`s, as its greedy proposal). Catches
    the copies pushed through the sampling's filters (a point mass either way, but 64 passes
    over every id at every depth: 2.4 ms a depth at SmolLM2's 49,152 ids on a 2-core CPU)
    and a sampled proposal that hands the loop no q."""
    drafter = PromptLookup(2, 1, Chain(3))
    ctx = DraftContext(params={}, draft_params={}, sampling=SamplingParams(0.8, 5, 0.9), cfg=CFG)
    text = jnp.asarray([[5, 6, 7, 5, 6, 0, 0, 0]])
    cache = Cache(layers=(), lengths=jnp.asarray([4]), max_len=7)

    def propose(text):
        return drafter.propose(ctx, text, cache, jnp.asarray([6]), jax.random.PRNGKey(0))[0]

    proposal = propose(text)
    assert proposal.tokens[0].tolist() == [7, 5, 6] and proposal.valid[0].tolist() == [1, 1, 1]
    np.testing.assert_array_equal(proposal.q[0], jax.nn.one_hot([7, 5, 6], CFG.vocab_size))
    assert "cond[" not in str(jax.make_jaxpr(propose)(text))


@pytest.fixture(scope="module")
def generator():
    return Generator(damped_params(CFG, jax.random.PRNGKey(0), 0.5), CFG)


def test_greedy_lookup_is_a_per_step_argmax_of_the_model(generator):
    """Catches drafts accepted that the model would not emit, or a text the drafter keeps out
    of step with the output (a commit writing at the wrong place drafts stale tokens: still
    lossless, but then nothing is accepted, which the count checks)."""
    strategy = make_strategy("ngram", DecodingConfig(num_draft=3, ngram_max=2))
    assert strategy == PromptLookup(2, 1, Chain(3))
    out = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=strategy)
    assert out.tokens == per_step_argmax(generator, PROMPTS, NEW)
    assert out.total.extra["matched"] > 0 and out.total.accepted >= 8  # 12 when in step
    for stats in out.stats:
        assert stats.accepted + stats.rounds == NEW - 1


def test_an_eos_copied_inside_a_draft_ends_the_row_as_plain_decoding_does(generator):
    """Catches tokens committed past an EOS that arrived as an accepted copied draft (or a row
    that stops a token early): for every token the outputs hold, as EOS, the rows equal `ar`'s,
    and at least one EOS is an accepted draft (its recorded depth > 0)."""
    strategy = PromptLookup(3, 1, Chain(4))
    # Prompts followed by their own first 12 greedy tokens: later output repeats prompt text.
    prompts = [prompt + row[:12] for prompt, row in zip(
        PROMPTS, generator.generate(PROMPTS, max_new_tokens=12).tokens, strict=True)]
    plain = generator.generate(prompts, max_new_tokens=NEW)
    from_a_draft = 0
    for eos in sorted({token for row in plain.tokens for token in row[1:]}):
        reference = generator.generate(prompts, max_new_tokens=NEW, eos_id=eos)
        out = generator.generate(prompts, max_new_tokens=NEW, strategy=strategy, eos_id=eos)
        assert out.tokens == reference.tokens
        for tokens, trace in zip(out.tokens, out.trace, strict=True):
            if tokens and tokens[-1] == eos and trace["depth"][len(tokens) - 1] > 0:
                from_a_draft += 1
    assert from_a_draft > 0


def test_ngram_is_one_file_registered_flagged_and_checked():
    """Catches a drafter whose options need edits outside its file (its options are flags and
    config fields with one-line checks), a checkpoint's stored tree or confidence stop (a
    selfspec default) that blocks or bends ngram, the same given as a flag silently ignored,
    and a Hugging Face peer given parameters it does not have (no minimum n)."""
    assert {"ngram_min", "ngram_max"} <= set(DECODING_FLAGS)
    assert (DecodingConfig().ngram_min, DecodingConfig().ngram_max) == (1, 3)
    with pytest.raises(ValueError, match=r"decoding.ngram_max=0 must lie in \[1, 16\]"):
        DecodingConfig(ngram_max=0).check(CFG)
    with pytest.raises(ValueError, match=r"decoding.ngram_max=17 must lie in \[1, 16\]"):
        DecodingConfig(ngram_max=17).check(CFG)
    with pytest.raises(ValueError, match=r"ngram_min=3 must be <= ngram_max=2"):
        make_strategy("ngram", DecodingConfig(ngram_min=3, ngram_max=2)).validate(CFG)
    stored = DecodingConfig(tree="2,1", draft_threshold=0.3)
    assert make_strategy("ngram", stored).shape == Chain(4)
    for flag, value in (("tree", "2,1"), ("draft_threshold", 0.3), ("exit_layer", 2)):
        with pytest.raises(ValueError, match=f"--{flag} is not used by strategy ngram"):
            decoding_options(DecodingConfig(), CFG, {flag: value}, ["ngram"])
    assert make_strategy("ngram", DecodingConfig()).hf_options() == {
        "prompt_lookup_num_tokens": 4, "max_matching_ngram_size": 3}
    assert make_strategy("ngram", DecodingConfig(ngram_min=2)).hf_options() is None


def test_the_ngram_loop_exports_for_tpu_and_cuda(generator):
    """Catches host-side state in the drafter (a Python list of tokens, a numpy search): the
    sampled loop must trace into one program that exports for both accelerators."""
    export_decode_loop(generator.params, {}, CFG, PromptLookup(3, 1, Chain(4)))
