"""The model-free and feature-head drafters' refusals of a shape they cannot draft, pinned by
their messages (issue 52's scan: raise sites no test triggered). A `Drafter` built by hand
reaches `generate` as it is (the registry's options never make these), and the engine calls
`validate` before anything compiles."""

import pytest

from specjax.config import ModelConfig
from specjax.decoding.drafters.eagle import Eagle
from specjax.decoding.drafters.ngram import PromptLookup
from specjax.decoding.drafters.suffix import SuffixDecoding
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.static_tree import StaticTree
from tests.support.models import TINY_MODEL

CFG = ModelConfig(**TINY_MODEL)
TREE = StaticTree((-1, -1, 0))
STOPPED = Chain(num_draft=4, stop_below=0.5)

REFUSALS = {  # id: (drafter, the message's distinctive fragment)
    "ngram on a tree": (PromptLookup(shape=TREE),
                        r"^strategy 'ngram' drafts a chain \(one continuation per match\): "
                        "drop --tree$"),
    "ngram with a confidence stop": (PromptLookup(shape=STOPPED),
                                     "^strategy 'ngram' drafts without a confidence stop"),
    "suffix on a tree": (SuffixDecoding(shape=TREE),
                         "^strategy 'suffix' drafts a chain without a confidence stop"),
    "suffix with a confidence stop": (SuffixDecoding(shape=STOPPED),
                                      "drop --tree and --draft_threshold$"),
    "an unbound feature head": (Eagle(Chain(num_draft=4)),
                                "^the eagle drafter has no head: bind it to its weights$"),
}


@pytest.mark.parametrize("drafter, message", REFUSALS.values(), ids=REFUSALS.keys())
def test_a_drafter_refuses_a_shape_it_cannot_draft(drafter, message):
    """Catches each check dropped: ngram or suffix given a tree (they would draft its first
    branch only, every other node a wasted verification) or a confidence stop (a copied draft
    has probability 1: the stop never fires, silently), and an Eagle built without binding to
    its weights (no exits: it would read no features and fail inside the traced loop)."""
    with pytest.raises(ValueError, match=message):
        drafter.validate(CFG)


def test_the_same_drafters_on_a_plain_chain_are_accepted():
    """The limits themselves pass: a chain with no stop (stop_below=0) for ngram and suffix,
    and an Eagle bound to an exit. Catches the checks tightened into refusing every shape
    (`stop_below >= 0` as the test, or `is_chain` inverted)."""
    for drafter in (PromptLookup(), SuffixDecoding(), Eagle(Chain(num_draft=4), exits=(2,))):
        drafter.validate(CFG)
