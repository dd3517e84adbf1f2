"""The per-token round record (`trace["depth"]`: the draft depth each token was accepted at, 0
for the target's own) against what decoding must give, and its agreement with the totals."""

import jax
import pytest

from specjax.config import ModelConfig
from specjax.decoding.drafter import DraftWeights
from specjax.decoding.drafters.draft_model import DraftModel
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.decoding.engine import Generator, acceptance_by_depth, accepted_runs
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.static_tree import StaticTree
from tests.support.models import TINY_MODEL, damped_params

CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})
PARAMS = damped_params(CFG, jax.random.PRNGKey(0), 0.5)
PROMPTS = [[1, 2, 3, 4, 5], [7], list(range(40, 59))]
NEW = 23


@pytest.fixture(scope="module")
def generator():
    """The target drafting for itself as a draft model: every draft is accepted."""
    return Generator(PARAMS, CFG, draft_weights={"draft": DraftWeights(PARAMS, cfg=CFG)})


@pytest.mark.parametrize("shape,depth", [(Chain(3), 3),
                                         (StaticTree.from_branching((2, 2, 1, 1)), 4)])
def test_a_drafter_that_is_the_target_has_every_draft_accepted(generator, shape, depth):
    """Catches a depth written at the wrong offset (the previous round's tokens overwritten),
    the target's token marked as a draft, or a tree's depths counted by node index: when the
    draft model is the target itself, each round is exactly 1..D then 0."""
    out = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=DraftModel(shape))
    for trace, stats in zip(out.trace, out.stats, strict=True):
        expected = [0] + ([*range(1, depth + 1), 0] * NEW)[:NEW - 1]
        assert trace["depth"] == expected
        assert accepted_runs(trace["depth"])[:-1] == [depth] * (stats.rounds - 1)


@pytest.mark.parametrize("shape", [Chain(4), Chain(6, 0.5),
                                   StaticTree.from_branching((2, 2, 1))])
def test_the_round_record_agrees_with_the_totals(generator, shape):
    """Catches a record that disagrees with the loop's counters: a round per run of depths,
    and every accepted draft marked (the last round, cut by the budget, may end on a draft)."""
    out = generator.generate(PROMPTS, max_new_tokens=NEW,
                             strategy=SelfSpeculative(1, shape))
    assert out.total.accepted > 0 and out.total.accepted < out.total.drafted  # rejections
    for trace, stats, tokens in zip(out.trace, out.stats, out.tokens, strict=True):
        depths = trace["depth"]
        assert len(depths) == len(tokens) == NEW
        runs = accepted_runs(depths)
        assert len(runs) == stats.rounds
        assert sum(d > 0 for d in depths) == stats.accepted + (depths[-1] > 0)
        reach = acceptance_by_depth(runs)
        assert reach == sorted(reach, reverse=True) and reach[0] <= 1


def test_plain_decoding_marks_every_token_the_targets(generator):
    out = generator.generate(PROMPTS, max_new_tokens=NEW)
    assert all(set(t["depth"]) == {0} for t in out.trace)
    assert accepted_runs(out.trace[0]["depth"]) == [0] * out.stats[0].rounds
