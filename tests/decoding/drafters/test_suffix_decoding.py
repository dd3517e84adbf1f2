"""Suffix decoding (strategy `suffix`): the longest-match search and the continuation counts
against a plain-Python reference (across the batch's rows), greedy output against a per-step
argmax of `model.forward`, the draft limits, EOS inside a draft, export, and the drafter added
as one file. Its sampled law is in test_decoding_sampling."""

import functools
import math
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.cli.decoding import decoding_options
from specjax.config import ModelConfig
from specjax.decoding.drafter import DraftContext
from specjax.decoding.drafters.suffix import SuffixDecoding, next_counts, occurrences
from specjax.decoding.engine import Generator
from specjax.decoding.registry import DecodingConfig, make_strategy
from specjax.decoding.sampling import SamplingParams
from specjax.decoding.shapes.chain import Chain
from specjax.nn.cache import Cache
from tests.support.decoding import check_eos_mid_draft, export_decode_loop, per_step_argmax
from tests.support.models import TINY_MODEL, damped_params

CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})
# Repeating prompts and a row whose end recurs in another row (row 3 ends as row 0 begins).
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 9, 9], list(range(40, 50)) * 2, [3, 5, 6, 7]]
NEW = 24


def longest_match(texts, text, depth):
    """The longest suffix (<= depth) of `text` that ends at an earlier position s of any row
    of `texts` with a known next token: its length and the (row, s) where it ends."""
    for n in range(depth, 0, -1):
        if n > len(text):
            continue
        pattern = text[-n:]
        found = [(r, s) for r, other in enumerate(texts) for s in range(n - 1, len(other) - 1)
                 if other[s - n + 1:s + 1] == pattern]
        if found:
            return n, found
    return 0, []


def reference(texts, depth):
    """Per row: the longest suffix (<= depth) of its text that ends at an earlier position of
    any row with a known next token, and how often each token follows it, one and two tokens
    on (the second among the occurrences continuing with the most frequent first token; ties:
    the lowest id)."""
    out = []
    for text in texts:
        best, found = longest_match(texts, text, depth)
        first = {}
        for r, s in found:
            first[texts[r][s + 1]] = first.get(texts[r][s + 1], 0) + 1
        top = min(first, key=lambda t: (-first[t], t)) if first else None
        second = {}
        for r, s in found:
            if texts[r][s + 1] == top and s + 2 < len(texts[r]):
                second[texts[r][s + 2]] = second.get(texts[r][s + 2], 0) + 1
        out.append((best, first, top, second))
    return out


def test_the_match_and_its_counts_equal_a_plain_python_reference():
    """Catches a match that ignores the other rows, counts the row's own end as an occurrence,
    reads past a row's end, or filters the second depth by the wrong offset, on 200 random
    batches of a 3-token vocabulary."""
    rng = random.Random(0)
    for _ in range(200):
        texts = [[rng.randrange(3) for _ in range(rng.randrange(1, 14))] for _ in range(3)]
        width = 16
        text = jnp.asarray([t + [0] * (width - len(t)) for t in texts])
        ends = jnp.asarray([len(t) for t in texts])
        best, matching = occurrences(text, ends, 4)
        first = next_counts(text, ends, matching, 1, 3)
        for b, (want, counts, top, second) in enumerate(reference(texts, 4)):
            assert int(best[b]) == want, (texts, b)
            assert {t: int(c) for t, c in enumerate(first[b]) if c} == counts, (texts, b)
            if top is None:
                continue
            followed = jnp.take(text, jnp.clip(jnp.arange(width) + 1, 0, width - 1), axis=1)
            kept = matching & (followed[None] == top)
            got = next_counts(text, ends, kept, 2, 3)[b]
            assert {t: int(c) for t, c in enumerate(got) if c} == second, (texts, b)


def walk(texts, strategy):
    """Per row: the drafts of a plain walk down the suffix tree of `texts` (each row's text
    ending with its pending token): from the longest match's occurrences, depth d drafts the
    token most of them continue with d + 1 tokens on (ties: the lowest id), while its share of
    those continuing is at least min_prob and d < ceil(factor x the match's length); the
    occurrences that continued otherwise drop out."""
    out = []
    for text in texts:
        best, matching = longest_match(texts, text, strategy.depth)
        drafts = []
        for d in range(strategy.shape.num_draft):
            going = [(r, s) for r, s in matching if s + d + 1 < len(texts[r])]
            counts = {}
            for r, s in going:
                counts[texts[r][s + d + 1]] = counts.get(texts[r][s + d + 1], 0) + 1
            if not counts:
                break
            top = min(counts, key=lambda t: (-counts[t], t))
            if (counts[top] / len(going) < strategy.min_prob
                    or d >= math.ceil(strategy.factor * best)):
                break
            drafts.append(top)
            matching = [(r, s) for r, s in going if texts[r][s + d + 1] == top]
        out.append(drafts)
    return out


@functools.cache
def _proposer(strategy):
    """strategy.propose, jitted, on texts [B, 16] holding `lengths` committed tokens."""
    def propose(text, lengths, pending):
        proposal, _, _ = strategy.propose(DraftContext(None, None, None, CFG), text,
                                          Cache((), lengths, text.shape[1] - 1), pending,
                                          jax.random.PRNGKey(0))
        return proposal.tokens, proposal.valid
    return jax.jit(propose)


def proposed(strategy, texts):
    """The drafts `strategy` proposes per row for `texts` (each ending with the pending
    token): the valid prefix of its chain (the valid nodes must be a prefix)."""
    width = 16
    text = jnp.asarray([t[:-1] + [0] * (width - len(t) + 1) for t in texts])
    tokens, valid = _proposer(strategy)(text, jnp.asarray([len(t) - 1 for t in texts]),
                                        jnp.asarray([t[-1] for t in texts]))
    tokens, valid = np.asarray(tokens), np.asarray(valid)
    counts = valid.sum(axis=1)
    assert all(valid[b].tolist() == [True] * n + [False] * (valid.shape[1] - n)
               for b, n in enumerate(counts))
    return [tokens[b, :n].tolist() for b, n in enumerate(counts)]


@pytest.mark.parametrize("rows", [1, 3])
def test_the_drafted_tokens_are_a_plain_python_walk_of_the_suffix_tree(rows):
    """Every row's drafts in `propose` equal a plain-Python walk down the suffix tree of the
    batch's texts (pending tokens included), on 100 random batches of a 3-token vocabulary,
    for two settings. Catches the walk at the wrong offset (the occurrences filtered, or their
    continuations counted, one token off), a tie broken towards another token,
    `suffix_factor` or `suffix_min_prob` applied to another depth, and (3 rows) occurrences
    in another row filtered by that row's drafts instead of the drafting row's."""
    rng = random.Random(1)
    for strategy in (SuffixDecoding(4, 0.0, 1.0, Chain(4)), SuffixDecoding(3, 0.4, 2.0, Chain(5))):
        for _ in range(100):
            texts = [[rng.randrange(3) for _ in range(rng.randrange(1, 15))]
                     for _ in range(rows)]
            assert proposed(strategy, texts) == walk(texts, strategy), texts


def test_min_prob_keeps_a_draft_whose_share_is_exactly_the_threshold():
    """The text 7 1 2 7 1 2 7 1 3 7 1 2 8, pending 7: the four earlier 7s continue 1 (share
    1), then 2 (3 of 4), then 7 (2 of 3), then 1 (2 of 2). A minimum share of exactly .75 or
    just below drafts 1 2; just above, 1 only; 0, all four. Catches the boundary taken as a
    strict inequality (and a test that only checks "fewer drafts", which passes when nothing
    is drafted)."""
    text = [[7, 1, 2, 7, 1, 2, 7, 1, 3, 7, 1, 2, 8, 7]]
    for min_prob, drafts in ((0.75, [1, 2]), (0.749, [1, 2]), (0.751, [1]),
                             (0.0, [1, 2, 7, 1])):
        strategy = SuffixDecoding(8, min_prob, 4.0, Chain(4))
        assert walk(text, strategy) == [drafts]
        assert proposed(strategy, text) == [drafts], min_prob


@pytest.mark.parametrize("temperature, share", [(1.0, 2 / 3), (0.5, 4 / 5)])
def test_a_sampled_draft_is_drawn_from_the_counts_at_the_temperature_unfiltered(temperature,
                                                                               share):
    """The text 5 1 5 1 5 2, pending 5: the earlier 5s continue 1 twice and 2 once, so the
    first draft's q is (2/3, 1/3) at temperature 1 and (4/5, 1/5) at 0.5 (counts ** (1 / T)),
    under a top-k of 1 and a top-p of 0.5 that would leave all of q on 1. Catches the
    sampling's filters applied to the draft (a pass over the whole vocabulary at every
    depth) and the temperature dropped from it."""
    sampling = SamplingParams.create(temperature, top_k=1, top_p=0.5)
    strategy = SuffixDecoding(8, 0.1, 4.0, Chain(2))
    text = jnp.asarray([[5, 1, 5, 1, 5, 2] + [0] * 10])

    def first_q(text):
        proposal, _, _ = strategy.propose(DraftContext(None, None, sampling, CFG), text,
                                          Cache((), jnp.asarray([6]), 15), jnp.asarray([5]),
                                          jax.random.PRNGKey(0))
        return proposal.q[0, 0]
    q = np.asarray(jax.jit(first_q)(text))
    np.testing.assert_allclose(q[[1, 2]], [share, 1 - share], rtol=1e-5)
    assert q.sum() == pytest.approx(1.0)


@pytest.fixture(scope="module")
def generator():
    return Generator(damped_params(CFG, jax.random.PRNGKey(0), 0.5), CFG)


def test_greedy_suffix_decoding_is_a_per_step_argmax_of_the_model(generator):
    """Catches drafts accepted that the model would not emit, and a text the drafter keeps out
    of step with the output (then little is accepted, which the count checks)."""
    strategy = make_strategy("suffix", DecodingConfig(num_draft=4, suffix_factor=2.0))
    out = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=strategy)
    assert out.tokens == per_step_argmax(generator, PROMPTS, NEW)
    assert out.total.extra["matched"] > 0 and out.total.accepted >= 8


def test_the_draft_limits_hold(generator):
    """Catches `suffix_factor` or `suffix_min_prob` ignored: a factor of .1 lets a row draft
    one token a round (ceil(.1 x n) for a match of n <= 8 tokens), and a minimum share of 1
    drafts fewer tokens than none."""
    def run(**options):
        strategy = make_strategy("suffix", DecodingConfig(num_draft=4, **options))
        return generator.generate(PROMPTS, max_new_tokens=NEW, strategy=strategy).total

    one = run(suffix_factor=0.1, suffix_min_prob=0.0)
    assert 0 < one.drafted <= one.rounds
    assert run(suffix_factor=4.0, suffix_min_prob=1.0).drafted < run(
        suffix_factor=4.0, suffix_min_prob=0.0).drafted


def test_an_eos_inside_a_draft_ends_the_row_as_plain_decoding_does(generator):
    """Catches tokens committed past an EOS that arrived as an accepted suffix draft."""
    check_eos_mid_draft(generator, PROMPTS, SuffixDecoding(8, 0.0, 4.0, Chain(4)), NEW)


def test_suffix_is_one_file_registered_flagged_and_checked():
    """Catches options that need edits outside the drafter's file, bad values accepted, and a
    tree or a chain's confidence stop given as flags silently ignored."""
    assert make_strategy("suffix", DecodingConfig(num_draft=3, suffix_depth=5)) == \
        SuffixDecoding(5, 0.1, 1.0, Chain(3))
    for field, value, message in (("suffix_depth", 17, r"must lie in \[1, 16\]"),
                                  ("suffix_min_prob", 1.5, r"must lie in \[0, 1\]")):
        with pytest.raises(ValueError, match=f"decoding.{field}={value} {message}"):
            DecodingConfig(**{field: value}).check(CFG)
    for flag, value in (("tree", "2,1"), ("draft_threshold", 0.3)):
        with pytest.raises(ValueError, match=f"--{flag} is not used by strategy suffix"):
            decoding_options(DecodingConfig(), CFG, {flag: value}, ["suffix"])


def test_the_suffix_loop_exports_for_tpu_and_cuda(generator):
    """Catches host-side state in the drafter: the sampled loop must trace into one program
    that exports for both accelerators."""
    export_decode_loop(generator.params, {}, CFG, SuffixDecoding())
