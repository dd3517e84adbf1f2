"""Drafting over part of the vocabulary pinned where the fresh audit's plants got past
tests/test_draft_vocab.py (whose model has no logit soft-cap, whose rankings repeat no id
within a row): the subset head against a NumPy computation, the ranking against a Counter."""

import collections

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.decoding.drafters.calm import CalmDraft
from specjax.decoding.drafters.calm_exit import EarlyExit
from specjax.decoding.engine import Generator
from specjax.decoding.shapes.chain import Chain
from specjax.heads.vocab_subset import MASKED_LOGIT, DraftVocab, head_logits
from specjax.io.draft_vocab import rank_ids
from specjax.model import init_params
from tests.support.models import TINY_MODEL, damped_params

CAP = 2.0  # far below the logits' scale: the soft-cap changes every one of them


def test_a_soft_capped_subset_head_caps_as_the_full_head_does():
    """Catches the logit soft-cap (Gemma-2's `final_logit_softcapping`) left out of the draft
    head over a subset: greedy output cannot see it (tanh keeps the order) and sampled output
    stays exact (acceptance reads the wrong q), but every subset draft is then drawn from
    another distribution than the full head's restricted to the subset. The subset's logits
    equal cap * tanh(h E[ids]^T / cap) in NumPy, every other id is masked."""
    cfg = ModelConfig(**{**TINY_MODEL, "init_std": 0.5, "logit_softcap": CAP})
    params = init_params(cfg, jax.random.PRNGKey(0))
    ids = np.sort(np.random.default_rng(0).permutation(cfg.vocab_size)[:cfg.vocab_size // 4])
    normed = np.random.default_rng(1).normal(size=(2, 3, cfg.d_model)).astype(np.float32)
    raw = normed @ np.asarray(params["embed"], np.float32)[ids].T
    assert np.abs(raw).max() > 3 * CAP  # the cap matters
    logits = np.asarray(head_logits(params, cfg, jnp.asarray(normed),
                                    DraftVocab.gather(params, cfg, jnp.asarray(ids, jnp.int32))))
    np.testing.assert_allclose(logits[..., ids], CAP * np.tanh(raw / CAP), rtol=1e-5, atol=1e-5)
    assert np.all(np.delete(logits, ids, axis=-1) == MASKED_LOGIT)


def test_rank_ids_counts_every_occurrence_as_a_counter_does():
    """The ranking is by token frequency in the text (`collections.Counter` over every token
    of every row, then ascending id): an id repeated within one row counts each time. Catches
    the count taken per row (a document frequency: a token filling one long document ranked
    below one seen once in each of two short ones, so the subset drops the text's commonest
    ids)."""
    rows = [[4, 4, 4, 4, 6], [6, 3], [3, 8]]
    counts = collections.Counter(token for row in rows for token in row)
    expected = sorted(range(10), key=lambda i: (-counts[i], i))[:5]
    assert expected == [4, 3, 6, 8, 0]
    assert rank_ids(rows, vocab_size=10, size=5).tolist() == expected


def test_calmdrafts_accepted_drafts_lie_in_its_subset():
    """calmdraft over a subset holding every other id of the model's own greedy text: every
    token its trace marks as an accepted draft (depth > 0) is in the subset, and some are.
    Catches the subset dropped where calmdraft drafts (its exits scoring the whole vocabulary
    while it reports `vocab N`): greedy output cannot see it, but drafts of the other ids are
    then accepted too."""
    cfg = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})
    params = damped_params(cfg, jax.random.PRNGKey(0), 0.5)
    prompts = [[1, 2, 3, 4, 5], [7], list(range(40, 59))]
    plain = Generator(params, cfg).generate(prompts, max_new_tokens=16)
    subset = sorted({token for row in plain.tokens for token in row})[::2]
    ranking = np.asarray(subset + [i for i in range(cfg.vocab_size) if i not in subset])
    out = Generator(params, cfg, draft_vocab=ranking).generate(
        prompts, max_new_tokens=16, strategy=CalmDraft(EarlyExit((1, 2)), 0.4, 4.0, Chain(3),
                                                       draft_vocab=len(subset)))
    assert out.tokens == plain.tokens
    drafted = [token for row, trace in zip(out.tokens, out.trace, strict=True)
               for token, depth in zip(row, trace["depth"], strict=True) if depth > 0]
    assert drafted and set(drafted) <= set(subset), drafted
