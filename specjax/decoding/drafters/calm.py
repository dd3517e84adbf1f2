"""CALM in the one loop: `calm`, early exit without verification, and `calmdraft`, CALM's
per-token exits as the drafter of lossless speculative decoding.

`calm` proposes nothing; its verification is an early-exit pass (`calm_exit.EarlyExit`) over
the pending token, whose exit logits the loop samples or takes the argmax of: quality traded
for speed, bounded by Learn-then-Test calibration (`infer/learn_then_test.py`). Each token's
exit and confidence come back in the output's trace.

`calmdraft` drafts every token with the same early-exit pass (per-token depth: an easy token
leaves at the first candidate, a hard one at a later one, at the last candidate at most) and
verifies with the full model: lossless. Verification reuses the layers below the first
candidate exit, which every draft ran. With one candidate it is `selfspec` at that exit. Like
the other drafters with a vocabulary head it may draft over part of the vocabulary
(`decoding.draft_vocab`): every exit's head is then the subset's [N, D] product, and the
confidence reads the subset's scores (the softmax and its top two over the N ids), which moves
only where a draft leaves, never the output. `calm` takes no draft vocabulary: its exit logits
are its output, so `--draft_vocab` with it is the registry's one-line error for an unused
option.

The threshold lambda, its decay tau and the classifier's weights are traced (`ExitParams`):
sweeping lambda never recompiles. `threshold` and `decay` on the strategy are the values it
binds by default; they do not enter its hash.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.struct
import jax
import jax.numpy as jnp

from specjax.config import ModelConfig, layer_numbers
from specjax.decoding.draft_vocab import VocabHead, VocabOptions
from specjax.decoding.drafter import (
    DraftContext,
    DrafterBase,
    Prefilled,
    Strategy,
    trained_head_hint,
)
from specjax.decoding.drafters.autoregressive import Autoregressive
from specjax.decoding.drafters.calm_exit import EarlyExit, ExitParams, decayed_threshold
from specjax.decoding.options import at_least, option, within
from specjax.decoding.proposal import Proposal, Reuse, Shape
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.shape_options import ShapeOptions, shape_for
from specjax.decoding.shapes.tree import Layout, chain_layout
from specjax.decoding.verify import Verified
from specjax.model import Params
from specjax.nn.cache import Cache


@flax.struct.dataclass
class Position:
    """What the decaying threshold needs: each row's prompt length [B] and the budget N."""

    prompt_lengths: jax.Array
    horizon: jax.Array

    def threshold(self, params: ExitParams, cache: Cache) -> jax.Array:
        """[B]: lambda_t for the token after the pending one (t tokens generated so far)."""
        return decayed_threshold(params, cache.lengths - self.prompt_lengths + 1, self.horizon)


@dataclasses.dataclass(frozen=True)
class _EarlyExiting(DrafterBase):
    """What both CALM strategies share: the early exit, its default traced parameters and the
    classifier's weights when the measure is learned."""

    early_exit: EarlyExit = EarlyExit()
    threshold: float = dataclasses.field(default=0.9, compare=False)
    decay: float = dataclasses.field(default=4.0, compare=False)

    @property
    def needs_weights(self) -> bool:
        return self.early_exit.measure == "classifier"

    @property
    def weights_hint(self) -> str:
        return (trained_head_hint("CALM's confidence classifier", "calm")
                + "; or use --calm_measure softmax or state")

    def runtime_params(self, weights: Params | None) -> ExitParams:
        """The traced parameters: this strategy's threshold and decay, and `weights` (the
        classifier's) when its measure needs them."""
        return ExitParams(threshold=jnp.float32(self.threshold), decay=jnp.float32(self.decay),
                          head=weights if self.needs_weights else {})

    def validate(self, cfg: ModelConfig) -> None:
        self.early_exit.validate(cfg)
        if self.decay < 0:
            raise ValueError(f"calm_decay={self.decay} must be >= 0")

    def prefill(self, ctx: DraftContext, prefilled: Prefilled) -> Position:
        return Position(prefilled.lengths, jnp.asarray(prefilled.max_new_tokens, jnp.float32))


@dataclasses.dataclass(frozen=True)
class Calm(_EarlyExiting):
    """Early-exit decoding (no drafts, no verification): each token from its first confident
    exit."""

    name: ClassVar[str] = "calm"
    mixable: ClassVar[bool] = False  # verification is its own (an early exit per token)
    shape: ClassVar[Chain] = Autoregressive.shape
    lossless: ClassVar[bool] = False  # its tokens leave early: quality traded for speed

    def label(self) -> str:
        return f"{self.name} {self.early_exit.label()} lambda={self.threshold:g}"

    def propose(self, ctx: DraftContext, state: Position, cache: Cache, pending: jax.Array,
                key: jax.Array) -> tuple[Proposal, Cache, Position]:
        return Autoregressive().propose(ctx, state, cache, pending, key)

    def verify(self, ctx: DraftContext, state: Position, cache: Cache, pending: jax.Array,
               proposal: Proposal) -> Verified:
        layout = chain_layout(cache.lengths, 1, cache.max_len)
        threshold = state.threshold(ctx.draft_params, cache)[:, None]
        exited, cache = self.early_exit.run(ctx.params, ctx.cfg, ctx.draft_params.head, cache,
                                            pending[:, None], layout, threshold)
        return Verified(exited.logits, cache, None,
                        {"exit": exited.exit, "confidence": exited.confidence}, jnp.int32(1))


@dataclasses.dataclass(frozen=True)
class CalmDraft(VocabHead, _EarlyExiting):
    """Speculative decoding whose drafts leave at CALM's exits; shape: a chain or a tree."""

    shape: Shape = Chain(num_draft=4)

    name: ClassVar[str] = "calmdraft"

    def validate(self, cfg: ModelConfig) -> None:
        super().validate(cfg)
        self.shape.validate()

    def label(self) -> str:
        return (f"{self.name} {self.early_exit.label()} lambda={self.threshold:g} "
                f"{self.shape.label()}{self.vocab_label()}")

    def propose(self, ctx: DraftContext, state: Position, cache: Cache, pending: jax.Array,
                key: jax.Array) -> tuple[Proposal, Cache, Position]:
        threshold = state.threshold(ctx.draft_params, cache)[:, None]

        def step(carry: tuple[Cache, dict[str, jax.Array]], tokens: jax.Array, layout: Layout):
            cache, stats = carry
            exited, cache = self.early_exit.run(ctx.params, ctx.cfg, ctx.draft_params.head,
                                                cache, tokens, layout, threshold, draft=True,
                                                vocab=ctx.vocab)
            stats = {"draft_passes": stats["draft_passes"] + tokens.shape[1],
                     "draft_layers": stats["draft_layers"] + jnp.sum(exited.exit, axis=1)}
            return exited.logits, exited.first, (cache, stats)

        zeros = jnp.zeros(pending.shape, jnp.int32)
        # Stats: the token passes the drafting ran and the layers they ran, summed.
        proposal, kept, missing, (cache, stats) = self.shape.draft(
            step, (cache, {"draft_passes": zeros, "draft_layers": zeros}), cache.lengths,
            pending, key, ctx.sampling, cache.max_len)
        first = self.early_exit.candidates(ctx.cfg)[0]
        return proposal.replace(reuse=Reuse(kept, missing, first), stats=stats), cache, state


@dataclasses.dataclass(frozen=True)
class CalmOptions:
    """CALM (strategies calm, calmdraft): a token leaves at the first of the candidate exits
    `calm_exits` ("2,4,6"; empty: the model's trained exits below the last) whose confidence
    (`calm_measure`: softmax, state or classifier) reaches lambda_t = `calm_threshold` *
    (0.9 + 0.1 exp(-`calm_decay` t / N)); `calm_threshold` 1 never exits early."""

    calm_exits: str = option("", "Strategies calm and calmdraft: the candidate exits "
                                 "(comma-separated, e.g. 2,4,6); empty: the model's trained "
                                 "exits below the last.", listed=True)
    calm_measure: str = option("softmax", "CALM's confidence measure: softmax (top-1 minus "
                                          "top-2 probability), state (cosine of consecutive "
                                          "hidden states) or classifier (trained by "
                                          "specjax/configs/calm.py).")
    calm_threshold: float = option(0.9, "CALM's threshold lambda in [0, 1]: a token leaves at "
                                        "the first candidate exit with confidence >= lambda_t "
                                        "(1: never early).", within(0, 1, high_included=True))
    calm_decay: float = option(4.0, "CALM's threshold decay tau: lambda_t = lambda (0.9 + 0.1 "
                                    "exp(-tau t / N)).", at_least(0))


def early_exit(options: CalmOptions) -> EarlyExit:
    """CALM's early exit as the options describe it."""
    return EarlyExit(layer_numbers(options.calm_exits, "calm_exits"), options.calm_measure)


STRATEGIES = {
    "calm": Strategy(lambda options: Calm(early_exit(options), options.calm_threshold,
                                          options.calm_decay), (CalmOptions,)),
    "calmdraft": Strategy(lambda options: CalmDraft(early_exit(options), options.calm_threshold,
                                                    options.calm_decay, shape_for(options)),
                          (CalmOptions, ShapeOptions, VocabOptions)),
}
