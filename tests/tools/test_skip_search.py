"""The skip-set search: its acceptance against an independent measurement, its search against
exhaustive enumeration, and the CLI."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.config import ModelConfig
from specjax.decoding.drafter import DraftContext
from specjax.decoding.drafters.exit_drafting import draft_with_layers
from specjax.decoding.drafters.skip import SkipLayers
from specjax.decoding.engine import Generator
from specjax.decoding.sampling import SamplingParams
from specjax.decoding.shapes.chain import Chain
from specjax.model import allocate_cache, embed, exit_logits, run_layers_cached
from specjax.tools.skip_search import (
    AcceptanceProbe,
    SkipCosts,
    best_chain,
    chain_tau,
    search,
)
from specjax.tools.tree_search import child_acceptance
from tests.support.models import TINY_MODEL, damped_params

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out

CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})
PROMPTS = [[1, 2, 3, 4, 5], [7, 8], list(range(40, 59))]


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_a_tail_skip_set_is_accepted_like_the_exit_head(sampled):
    """Skipping layers E..L-1 is drafting from exit E: its acceptance must match the
    positional acceptance `--tree auto` measures for exit E through the cached decode path
    and the loop's own acceptance rule. Catches a keep mask that skips the wrong layers, a
    score over the wrong positions (the prompt, padding) or the wrong sampled rule."""
    generator = Generator(damped_params(CFG, jax.random.PRNGKey(0), 0.5), CFG)
    sampling = SamplingParams.create(temperature=0.9) if sampled else None
    probe = AcceptanceProbe(generator, PROMPTS, sampling, new_tokens=40)
    for exit_layer in (1, 2):
        reference = child_acceptance(generator, exit_layer, PROMPTS, sampling=sampling,
                                     children="iid", new_tokens=40, repeats=16)[0]
        measured = probe(tuple(range(exit_layer, CFG.num_layers)))
        assert measured == pytest.approx(reference, abs=0.03 if sampled else 1e-6)
    assert probe(()) == pytest.approx(1.0)


@pytest.mark.parametrize("skip", [(1,), (1, 2)])
def test_a_skip_set_is_accepted_as_decoding_drafts_it(skip):
    """For a set that keeps layers after a skipped one, the probe's per-position drafts must
    be the decoder's: each draft's later layers see the committed context's K/V as the full
    model wrote them (verification), not as the skip path would. Reference: the decoder's own
    draft function (`draft_with_layers` with `SkipLayers.ranges`) run position by position on
    a cache the full model filled. Catches a probe whose context K/V come from the skip path."""
    generator = Generator(damped_params(CFG, jax.random.PRNGKey(0), 0.5), CFG)
    prompts, new = PROMPTS[:2], 12
    probe = AcceptanceProbe(generator, prompts, None, new_tokens=new)
    ranges = SkipLayers(skip, Chain(1)).ranges(CFG.num_layers)
    width = 48

    @jax.jit
    def draft_and_target(params, tokens, length):
        cache = allocate_cache(CFG, 1, width)
        hidden, cache = run_layers_cached(params, CFG, embed(params, CFG, tokens), cache,
                                          jnp.zeros((1,), jnp.int32))
        target = jnp.argmax(exit_logits(params, CFG, hidden)[0, length])
        ctx = DraftContext(params=params, draft_params={}, sampling=None, cfg=CFG)
        proposal, _, _ = draft_with_layers(ctx, Chain(1), cache.commit(length[None]),
                                           tokens[:, length], jax.random.PRNGKey(0), ranges)
        return proposal.tokens[0, 0], target

    agree = []
    for prompt, tokens in zip(prompts, generator.generate(prompts, max_new_tokens=new).tokens,
                              strict=True):
        sequence = list(prompt) + tokens
        padded = jnp.asarray([sequence + [0] * (width - len(sequence))])
        for position in range(len(prompt) - 1, len(sequence) - 1):
            drafted, target = draft_and_target(generator.params, padded, jnp.int32(position))
            agree.append(int(drafted) == int(target))
    assert 0 < np.mean(agree) < 1
    assert probe(skip) == pytest.approx(np.mean(agree), abs=1e-6)


def test_chain_tau_is_the_expected_committed_tokens():
    for a, k in ((0.0, 3), (0.5, 1), (0.8, 6), (1.0, 4)):
        assert chain_tau(a, k) == pytest.approx(sum(a ** i for i in range(k + 1)))


def test_the_search_finds_the_best_set_on_a_separable_problem():
    """With acceptance a product of per-layer factors (greedy selection is then optimal), the
    search's best set and K equal exhaustive enumeration's. Catches a search that stops
    early, scores the wrong K, or ranks by something else than the expected speed-up."""
    num_layers = 7
    factor = {1: 0.995, 2: 0.99, 3: 0.97, 4: 0.999, 5: 0.6, 6: 0.99}  # best: not a tail
    costs = SkipCosts(num_layers=num_layers, layer=1.0, head=0.5,
                      verify=np.linspace(7.5, 12.0, 14), overhead=0.3, ar_step=7.8)

    def acceptance(skip):
        return float(np.prod([factor[layer] for layer in skip])) * 0.98

    found = search(acceptance, costs, max_draft=12)
    subsets = [s for n in range(1, num_layers) for s in
               itertools.combinations(range(1, num_layers), n)]
    best = max((best_chain(s, acceptance(s), costs, 12) for s in subsets),
               key=lambda c: c.expected_speedup)
    assert (found[0].skip, found[0].num_draft) == (best.skip, best.num_draft)
    assert found[0].expected_speedup == pytest.approx(best.expected_speedup)
    speedups = [c.expected_speedup for c in found]
    assert speedups == sorted(speedups, reverse=True)
