"""Speculative sampling is lossless: the joint distribution of the first generated tokens under
self-speculation (chains and every tree rule) equals plain sampling's, computed exactly from the
model. The same test rejects a subtly wrong acceptance rule, so it has teeth."""

import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import model as M
from specjax.config import ModelConfig, SsmConfig
from specjax.decoding import acceptance, loop, registry
from specjax.decoding.acceptance import _prefix_length
from specjax.decoding.drafter import DraftWeights
from specjax.decoding.drafters.autoregressive import Autoregressive
from specjax.decoding.drafters.calm import CalmDraft
from specjax.decoding.drafters.calm_exit import EarlyExit
from specjax.decoding.drafters.draft_model import DraftModel
from specjax.decoding.drafters.eagle import Eagle
from specjax.decoding.drafters.kangaroo import Kangaroo
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.decoding.drafters.lookahead import Lookahead
from specjax.decoding.drafters.medusa import Medusa
from specjax.decoding.drafters.mixed import Mixed
from specjax.decoding.drafters.mtp import Mtp
from specjax.decoding.drafters.ngram import PromptLookup
from specjax.decoding.drafters.skip import SkipLayers
from specjax.decoding.drafters.specdec import SpecDecHead
from specjax.decoding.drafters.suffix import SuffixDecoding
from specjax.decoding.engine import Generator
from specjax.decoding.registry import DecodingConfig
from specjax.decoding.sampling import SamplingParams, probabilities, sample
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.dynamic_tree import DynamicTree
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.heads.eagle import EAGLE
from specjax.heads.kangaroo import init_adapter
from specjax.heads.medusa import init_medusa
from specjax.heads.mtp import MTP
from specjax.heads.specdec import init_acceptance_head
from tests.support.drafter import PerDepthDrafter
from tests.support.models import noisy

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out

VOCAB, NEW, ROWS, SEEDS = 8, 3, 2000, 6
CFG = ModelConfig(vocab_size=VOCAB, d_model=32, num_layers=3, num_heads=4, num_kv_heads=2,
                  mlp_dim=64, init_std=0.3)
PROMPT = [1, 4, 2]
RANKING = [5, 2, 7, 0, 3, 1, 6, 4]  # drafts over part of the vocabulary take its first ids
SHORT = 4  # 2,000 rows of 3-token prompts prefill 4 positions (16: 1.5x the time of a case)
SETTINGS = {"t1": dict(temperature=1.0), "filtered": dict(temperature=1.3, top_k=5, top_p=0.9)}


@pytest.fixture(scope="module")
def params():
    return M.init_params(CFG, jax.random.PRNGKey(11))


def exact_joint(params, sampling, cfg=CFG):
    """P(x1, x2, x3) under plain sampling, from the model's processed conditionals."""
    prefixes = np.array([PROMPT + list(p) for p in itertools.product(range(VOCAB), repeat=2)])
    logits = jax.jit(M.forward, static_argnames="cfg")(params, cfg, jnp.asarray(prefixes))
    probs = np.asarray(probabilities(logits[:, len(PROMPT) - 1:], sampling), np.float64)
    joint = np.zeros((VOCAB,) * 3)
    for row, (a, b) in enumerate(itertools.product(range(VOCAB), repeat=2)):
        joint[a, b] = probs[row, 0, a] * probs[row, 1, b] * probs[row, 2]
    return joint / joint.sum()


def generator_with_drafters(params):
    """A generator whose Kangaroo adapter (exit 1) is the shared head plus noise, whose draft
    model is the target's first two layers plus noise, whose acceptance head is random and
    whose two Medusa heads are the model's own head plus noise, and whose EAGLE-3 and MTP
    heads are fresh ones plus noise."""
    draft_cfg = dataclasses.replace(CFG, num_layers=2)
    draft = M.unstack_layers({**params, "layers": jax.tree.map(lambda w: w[:2],
                                                               params["layers"])}, draft_cfg)
    return Generator(params, CFG, draft_vocab=RANKING, min_prompt_width=SHORT, draft_weights={
        "kangaroo": DraftWeights(noisy(init_adapter(params, CFG, 1), 0.3), exit_layer=1),
        "draft": DraftWeights(noisy(draft, 0.1), cfg=draft_cfg),
        "specdec": DraftWeights(noisy(init_acceptance_head(CFG, 8, jax.random.PRNGKey(5)), 1.0),
                                exit_layer=1),
        "medusa": DraftWeights(noisy(init_medusa(params, CFG, 2), 0.3),
                               exit_layer=CFG.num_layers, settings={"num_heads": 2}),
        **{kind.name: DraftWeights(noisy(kind.init(params, CFG, settings), 0.3),
                                   settings={"exits": kind.exits(CFG, settings)})
           for kind, settings in ((EAGLE, {"layers": ""}), (MTP, {"depth": 2}))}})


def empirical_counts(params, strategy, sampling, generator=None, batch=ROWS):
    """Counts of the first NEW tokens over SEEDS x ROWS samples (decoded `batch` rows at a
    time), and the last batch's stats."""
    generator = generator or generator_with_drafters(params)
    counts = np.zeros((VOCAB,) * 3)
    for seed in range(SEEDS * ROWS // batch):
        out = generator.generate([PROMPT] * batch, max_new_tokens=NEW, strategy=strategy,
                                 sampling=sampling, seed=seed)
        for tokens in out.tokens:
            counts[tuple(tokens)] += 1
    return counts, out.total


def chi_square_p_below(observed, expected_probs, alpha=1e-4):
    """True if a chi-square goodness-of-fit test rejects at level alpha (bins with an expected
    count under 5 are pooled; critical value by the Wilson-Hilferty approximation)."""
    total = observed.sum()
    expected = expected_probs.ravel() * total
    observed = observed.ravel()
    big = expected >= 5
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    stat = np.sum((obs[keep] - exp[keep]) ** 2 / exp[keep])
    df = keep.sum() - 1
    z = 3.719  # one-sided standard normal quantile for 1e-4
    critical = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat > critical, stat, critical


STRATEGIES = {
    "ar": Autoregressive(),
    "chain": SelfSpeculative(1, Chain(2)),
    "chain-threshold": SelfSpeculative(1, Chain(3, stop_below=0.3)),
    # Trees whose nodes have several children, one per way of drawing them.
    **{f"tree-{rule}": SelfSpeculative(1, StaticTree.from_branching((2, 1), children=rule))
       for rule in ("without_replacement", "iid", "top_k")},
    "dynamic-tree": SelfSpeculative(1, DynamicTree(4, 2, 2)),
    "skip-chain": SkipLayers((1,), Chain(2)),
    "skip-tree": SkipLayers((1,), StaticTree.from_branching((2, 1))),
    "kangaroo-chain": Kangaroo(1, Chain(3, stop_below=0.3)),
    "kangaroo-tree": Kangaroo(1, StaticTree.from_branching((2, 1))),
    "draft-chain": DraftModel(Chain(3, stop_below=0.3)),
    "draft-tree": DraftModel(StaticTree.from_branching((2, 1))),
    "specdec-chain": SpecDecHead(1, Chain(3, stop_risk=0.6)),
    "specdec-tree": SpecDecHead(1, DynamicTree(4, 2, 2)),
    "calmdraft-chain": CalmDraft(EarlyExit((1, 2)), 0.3, 4.0, Chain(3)),
    # Point-mass drafts copied from the text: PROMPT's tokens recur among VOCAB = 8.
    "ngram-chain": PromptLookup(2, 1, Chain(2)),
    # Drafts from the batch's other rows: every row shares PROMPT, so their continuations are
    # samples of the same distribution, drawn from as the empirical one. A min_prob that
    # binds: drafts drawn from every continuation, then dropped for their share, fail here
    # (chi2 224 > 81 at 50 rows a call).
    "suffix-chain": SuffixDecoding(4, 0.2, 2.0, Chain(2)),
    # Every depth proposed at once (Medusa's kind of proposal), drawn into a tree.
    "per-depth-tree": PerDepthDrafter(StaticTree.from_branching((2, 1))),
    "medusa-tree": Medusa(StaticTree.from_branching((2, 1))),
    # A block drafting each depth from its parent's feature (the K/V it keeps across rounds).
    "eagle-chain": Eagle(Chain(3)),
    "mtp-tree": Mtp(StaticTree.from_branching((2, 1))),
    # Drafts over 3 of the 8 ids (q zero outside them): the shared head's, at CALM's exits
    # and a head's own.
    "vocab-chain": SelfSpeculative(1, Chain(2), draft_vocab=3),
    "vocab-calmdraft-chain": CalmDraft(EarlyExit((1, 2)), 0.3, 4.0, Chain(2), draft_vocab=3),
    "vocab-medusa-tree": Medusa(StaticTree.from_branching((2, 1)), draft_vocab=3),
    # Jacobi guesses beside pool n-grams, every child deterministic.
    "lookahead-tree": Lookahead(3, 2, 2, 8),
    # Branches from different drafters: every child deterministic (the top_k rule).
    "mixed-tree": Mixed((PromptLookup(2, 1, Chain(2)), SelfSpeculative(1, Chain(2)),
                         Medusa(StaticTree.from_branching((2, 1))))),
}


def test_every_lossless_strategy_in_the_registry_is_covered_here():
    """Catches a drafter registered (and declared lossless) without a case in this
    distribution test: the registry, not this file, says what must be covered."""
    covered = {strategy.name for strategy in STRATEGIES.values()}
    lossless = {name for name in registry.STRATEGIES
                if registry.make_strategy(name, DecodingConfig(skip_layers="1")).lossless}
    assert lossless - covered == set() and "calm" not in lossless


# Acceptance rules run at both settings; a drafter that only changes where drafts come from
# (whose rule is a chain's or a tree's above) at the harder, filtered one.
RULES = ("ar", "chain", "chain-threshold", "dynamic-tree",
         *(f"tree-{rule}" for rule in ("without_replacement", "iid", "top_k")))
CASES = [(name, setting) for name in sorted(STRATEGIES) for setting in sorted(SETTINGS)
         if name in RULES or setting == "filtered"]


@pytest.mark.parametrize("name,setting", CASES)
def test_sampled_tokens_follow_the_plain_distribution(params, setting, name):
    """Catches any rule or residual that is not exactly lossless, end to end: drafting, tree
    verification, acceptance and commit across three tokens."""
    strategy = STRATEGIES[name]
    sampling = SamplingParams.create(**SETTINGS[setting])
    # suffix searches every row of the batch for every row: 50 rows at a time, not 2000
    counts, total = empirical_counts(params, strategy, sampling,
                                     batch=50 if name == "suffix-chain" else ROWS)
    rejected, stat, critical = chi_square_p_below(counts, exact_joint(params, sampling))
    assert not rejected, f"chi2={stat:.1f} > {critical:.1f}"
    if name in ("ngram-chain", "suffix-chain"):  # drafts were both accepted and rejected
        assert 0 < total.accepted < total.drafted
    shape = strategy.shape
    if getattr(shape, "stop_below", 0) or getattr(shape, "stop_risk", 0):  # stops really cut
        assert total.rounds <= total.extra["stopped_after"] < shape.num_draft * total.rounds


def _resample_from_target(key, draft, draft_probs, target_probs, num_valid):
    """A classic bug: on rejection, sample from p instead of norm(max(0, p - q))."""
    accept_key, resample_key = jax.random.split(key)
    num_draft = draft.shape[1]
    p_draft = jnp.take_along_axis(target_probs[:, :num_draft], draft[..., None], -1)[..., 0]
    q_draft = jnp.take_along_axis(draft_probs, draft[..., None], -1)[..., 0]
    accepted = _prefix_length(jax.random.uniform(accept_key, draft.shape) * q_draft < p_draft)
    stop = jnp.take_along_axis(target_probs, accepted[:, None, None], axis=1)[:, 0]
    final = sample(resample_key, stop)
    padded = jnp.pad(draft, ((0, 0), (0, 1)))
    emitted = jnp.where(jnp.arange(num_draft + 1) == accepted[:, None], final[:, None], padded)
    return accepted, emitted


def test_the_distribution_test_catches_a_wrong_acceptance_rule(params, monkeypatch):
    sampling = SamplingParams.create(**SETTINGS["t1"])
    monkeypatch.setattr(acceptance, "speculative_accept", _resample_from_target)
    loop.generate_tokens.clear_cache()
    try:
        counts, _ = empirical_counts(params, SelfSpeculative(1, Chain(2)), sampling)
    finally:
        loop.generate_tokens.clear_cache()
    rejected, stat, critical = chi_square_p_below(counts, exact_joint(params, sampling))
    assert rejected, f"a wrong rule passed: chi2={stat:.1f} <= {critical:.1f}"


# Large weights and steps, so that the SSM state moves the next token's distribution a lot.
HYBRID = dataclasses.replace(CFG, init_std=0.6,
                             layer_pattern=("mamba2", "attention", "mamba2"),
                             ssm=SsmConfig(num_heads=4, head_dim=8, state_size=8, groups=2,
                                           chunk_size=4, dt_min=0.5, dt_max=2.0))


def test_sampling_through_ssm_layers_follows_the_plain_distribution():
    """A hybrid (Mamba-2, attention, Mamba-2) sampling with a tree drafted through its first SSM
    layer, two children a round (so the third token always reads a committed state): catches a
    rejected node's values left in an SSM state or conv history (the next tokens' distribution
    would shift), which greedy tests only see when the argmax flips."""
    params = M.init_params(HYBRID, jax.random.PRNGKey(11))
    sampling = SamplingParams.create(**SETTINGS["filtered"])
    strategy = SelfSpeculative(1, StaticTree.from_branching((2,)))  # a round emits <= 2 tokens
    counts, _ = empirical_counts(params, strategy, sampling,
                                 Generator(params, HYBRID, min_prompt_width=SHORT))
    rejected, stat, critical = chi_square_p_below(counts, exact_joint(params, sampling, HYBRID))
    assert not rejected, f"chi2={stat:.1f} > {critical:.1f}"
