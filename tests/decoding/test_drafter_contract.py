"""The drafter contract with drafters written here, outside `decoding/`: one that owns weights
and state (a bigram table, traced params, not a static config, and a state the loop carries
across rounds, kept in step by the commit hook; its proposals are chains or trees like
LayerSkip's), and a feature head registered from this file that drafts from the target's
hidden states (the loop's `feature_exits` extension point), as EAGLE's and Medusa's do."""

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.config import ModelConfig
from specjax.decoding import registry
from specjax.decoding.drafter import DrafterBase, Strategy
from specjax.decoding.engine import Generator
from specjax.decoding.proposal import Shape, depth_step
from specjax.decoding.registry import STRATEGIES, DecodingConfig, make_strategy
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.dynamic_tree import DynamicTree
from specjax.decoding.shapes.shape_options import ShapeOptions, shape_for
from specjax.decoding.shapes.static_tree import StaticTree, node_depths
from specjax.model import embed, exit_logits
from specjax.nn.cache import along_path
from tests.support.decoding import per_step_argmax
from tests.support.drafter import PerDepthDrafter
from tests.support.models import TINY_MODEL, damped_params

CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})
PROMPTS = [[1, 2, 3, 4, 5], [7], list(range(40, 59))]


@dataclasses.dataclass(frozen=True)
class BigramDrafter(DrafterBase):
    """Drafts from a [V, V] table of next-token logits (its params). State: the target's
    committed lengths as the drafter last saw them (from prefill, then commit), the prompt's
    mean hidden state at exit 1 (from the prefill hook) and the rounds it has seen."""

    shape: Shape
    name: ClassVar[str] = "bigram"
    prefill_exits: ClassVar[tuple[int, ...]] = (1,)

    def validate(self, cfg):
        self.shape.validate()

    def label(self):
        return f"bigram {self.shape.label()}"

    def prefill(self, ctx, prefilled):
        return {"lengths": prefilled.lengths, "rounds": jnp.zeros_like(prefilled.lengths),
                "exit_mean": jnp.mean(prefilled.exit_hidden[1], axis=(1, 2))}

    def propose(self, ctx, state, cache, pending, key):
        def step(carry, tokens, layout):
            return ctx.draft_params["table"][tokens], jnp.zeros(tokens.shape + (1,)), carry

        proposal, _, _, _ = self.shape.draft(step, (), cache.lengths, pending, key,
                                             ctx.sampling, cache.max_len)
        stale = (state["lengths"] != cache.lengths).astype(jnp.int32)
        return proposal.replace(stats={"stale_state": stale,
                                       "rounds_seen": state["rounds"]}), cache, state

    def commit(self, ctx, state, done):
        return {**state, "lengths": done.lengths_after,
                "rounds": state["rounds"] + (done.lengths_after > done.lengths_before)}


@dataclasses.dataclass(frozen=True)
class LastFeatureDrafter(DrafterBase):
    """A feature head in the manner of Medusa and EAGLE, written with the three hooks of
    docs/extending.md only (verification is `DrafterBase`'s): its state is the target's
    last-layer hidden state at the last kept position, read from the prompt (`prefill_exits`)
    and then from each round's verified positions (`feature_exits`, `Round.features`); depth d
    drafts from the pending token's embedding plus that feature times its own traced weight
    `mix`, scaled by d + 1. The target's head turns that feature into the pending token, so a
    greedy round counts a stale feature (`stale_feature`)."""

    shape: Shape
    name: ClassVar[str] = "last-feature"
    prefill_exits: ClassVar[tuple[int, ...]] = (CFG.num_layers,)
    feature_exits: ClassVar[tuple[int, ...]] = (CFG.num_layers,)

    def validate(self, cfg):
        self.shape.validate()

    def label(self):
        return f"last-feature {self.shape.label()}"

    def prefill(self, ctx, prefilled):
        hidden = prefilled.exit_hidden[CFG.num_layers]
        return jnp.take_along_axis(hidden, (prefilled.lengths - 1)[:, None, None], axis=1)[:, 0]

    def propose(self, ctx, state, cache, pending, key):
        said = jnp.argmax(exit_logits(ctx.params, ctx.cfg, state), axis=-1)
        hidden = embed(ctx.params, ctx.cfg, pending[:, None]) + ctx.draft_params["mix"] * (
            state[:, None])
        logits = jnp.concatenate([exit_logits(ctx.params, ctx.cfg, hidden * (d + 1))
                                  for d in range(self.shape.depth)], axis=1)
        proposal, _, _, _ = self.shape.draft(depth_step(logits, cache.lengths), (),
                                             cache.lengths, pending, key, ctx.sampling,
                                             cache.max_len)
        return (proposal.replace(stats={"stale_feature": (said != pending).astype(jnp.int32)}),
                cache, state)

    def commit(self, ctx, state, done):
        return done.last_kept(along_path(done.features[CFG.num_layers], done.acceptance.path),
                              state)


@pytest.fixture(scope="module")
def generator():
    return Generator(damped_params(CFG, jax.random.PRNGKey(0), 0.5), CFG)


def _table(generator, noise):
    """Bigram logits from the model's own one-token predictions, plus noise: drafts that are
    often but not always right."""
    vocab = jnp.arange(CFG.vocab_size)[:, None]
    out = generator.generate([[int(t)] for t in vocab[:, 0]], max_new_tokens=1)
    best = jnp.asarray([t[0] for t in out.tokens])
    return {"table": jax.nn.one_hot(best, CFG.vocab_size) * 3.0 + noise * jax.random.normal(
        jax.random.PRNGKey(1), (CFG.vocab_size, CFG.vocab_size))}


@pytest.mark.parametrize("shape", [Chain(3), StaticTree.from_branching((2, 1)),
                                   DynamicTree(6, 2, 3)], ids=["chain", "static", "dynamic"])
def test_a_drafter_with_weights_and_state_is_lossless_and_kept_in_step(generator, shape):
    """Catches a loop that drops the drafter's params, forgets its state between rounds or
    calls commit with the wrong lengths (stale_state would count), or loses drafter stats."""
    reference = generator.generate(PROMPTS, max_new_tokens=20)
    drafter = BigramDrafter(shape)
    for noise in (0.5, 3.0):
        out = generator.generate(PROMPTS, max_new_tokens=20, strategy=drafter,
                                 draft_params=_table(generator, noise))
        assert out.tokens == reference.tokens
        for stats in out.stats:
            assert stats.extra["stale_state"] == 0
            # rounds_seen adds 0 + 1 + ... + (rounds - 1): the state advanced every round.
            assert stats.extra["rounds_seen"] == stats.rounds * (stats.rounds - 1) // 2
        if noise == 0.5:
            assert out.total.accepted > 0  # the table's weights reached the drafts


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_registered_strategy_has_the_optional_hooks(name):
    """The engine and the bench call the optional hooks (needs_weights, bind, runtime_params,
    hf_options, verify_from) without getattr: catches a registered drafter that does not
    derive from `DrafterBase` (an AttributeError at decode time) or that registers under
    another name than its own."""
    strategy = make_strategy(name, DecodingConfig(skip_layers="1"))
    assert isinstance(strategy, DrafterBase) and strategy.name == name
    assert isinstance(strategy.needs_weights, bool) and isinstance(strategy.verify_from, int)
    assert strategy.hf_options() is None or name in {"selfspec", "ngram", "draft"}


@pytest.mark.parametrize("shape", [Chain(3), StaticTree.from_branching((2, 2, 1)),
                                   DynamicTree(6, 2, 3)], ids=["chain", "static", "dynamic"])
def test_a_drafter_proposing_every_depth_at_once_drafts_any_shape_losslessly(generator, shape):
    """Catches a shape that cannot draft from a step proposing every depth at once (Medusa's
    and MTP's kind of proposal), or a loop that then commits anything but the target's
    tokens."""
    reference = generator.generate(PROMPTS, max_new_tokens=20)
    out = generator.generate(PROMPTS, max_new_tokens=20, strategy=PerDepthDrafter(shape))
    assert out.tokens == reference.tokens and out.total.accepted > 0


def test_depth_step_gives_every_node_its_own_depths_distribution():
    """Catches `depth_step` reading a node's distribution from the wrong depth (its parent's,
    or depth 0 for all): depth d's distribution here peaks at tokens 10d + 1 and 10d + 2, so a
    greedy (2, 2, 1) tree's nodes must hold exactly those, level by level."""
    vocab, lengths = 40, jnp.asarray([5, 9])
    peaks = jnp.asarray([[10 * d + 1, 10 * d + 2] for d in range(3)])
    logits = jnp.zeros((3, vocab)).at[jnp.arange(3)[:, None], peaks].set(jnp.asarray([5., 4.]))
    shape = StaticTree.from_branching((2, 2, 1))
    proposal, _, _, _ = shape.draft(depth_step(jnp.broadcast_to(logits, (2, 3, vocab)), lengths),
                                    (), lengths, jnp.asarray([7, 7]), jax.random.PRNGKey(0),
                                    None, 32)
    depths = np.asarray(node_depths(shape.parents))
    for row in np.asarray(proposal.tokens):
        for depth in (1, 2, 3):
            assert set(row[depths == depth]) == set(np.asarray(peaks[depth - 1]).tolist()[
                :2 if depth < 3 else 1])


@pytest.mark.parametrize("tree", ["", "2,1"], ids=["chain", "static"])
def test_a_feature_head_written_outside_decoding_is_registered_and_lossless(generator,
                                                                            monkeypatch, tree):
    """Catches a contract that needs `decoding/` edited for a new feature head: a `DrafterBase`
    that does not verify or lacks a no-op hook (an AttributeError in the loop), a loop that
    hands `commit` features of the wrong exit or position or drops them (`stale_feature`
    counts), drops the drafter's own params, or commits anything but the target's greedy
    tokens (compared with one full forward pass per token)."""
    monkeypatch.setitem(registry.STRATEGIES, LastFeatureDrafter.name, Strategy(
        lambda options: LastFeatureDrafter(shape_for(options)), (ShapeOptions,)))
    drafter = make_strategy(LastFeatureDrafter.name, DecodingConfig(num_draft=3, tree=tree))
    out = generator.generate(PROMPTS, max_new_tokens=12, strategy=drafter,
                             draft_params={"mix": jnp.float32(0.05)})
    assert out.tokens == per_step_argmax(generator, PROMPTS, 12)
    assert all(stats.extra["stale_feature"] == 0 for stats in out.stats)
    assert out.total.accepted > 0  # the features and `mix` reached the drafts
