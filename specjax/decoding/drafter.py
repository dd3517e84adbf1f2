"""The drafter interface of the generate loop.

A drafter is three things: a static, hashable config (a frozen dataclass: what to compile),
a params pytree traced into the program (its own weights; empty for LayerSkip) and a state
pytree the loop carries across rounds (a draft model's cache, an adapter's K/V; empty for
LayerSkip). The loop calls its hooks:

  prefill   once, after the target's prefill: the initial state;
  propose   every round: a `Proposal` (a token tree of the static `shape`), the target cache
            (a drafter may write the target's K/V for layers it ran) and the new state;
  verify    every round: the target's logits at the pending token and every node
            (`FullVerification`: the full model; CALM's own strategy exits early instead);
  commit    every round, after acceptance: the state with the accepted path kept (`Round`:
            what the round proposed, accepted and verified).

The loop owns acceptance, the target cache's commit, EOS, budgets and statistics. New ideas
(Kangaroo, a draft model, CALM) are new drafters, registered once in `decoding.registry`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import flax.struct
import jax

from specjax.cache import Cache
from specjax.config import ModelConfig
from specjax.decoding.acceptance import Acceptance
from specjax.decoding.proposal import Proposal, Shape
from specjax.decoding.sampling import SamplingParams
from specjax.decoding.verify import Verified, verify
from specjax.model import Params


@flax.struct.dataclass
class DraftContext:
    """What every hook may read: the target's params, the drafter's own params, the model
    config and the sampling parameters (None: greedy decoding)."""

    params: Params
    draft_params: Any
    sampling: SamplingParams | None
    cfg: ModelConfig = flax.struct.field(pytree_node=False)


@flax.struct.dataclass
class Prefilled:
    """What the target's prefill hands a drafter: prompts [B, P] (right-padded), their lengths
    [B], the target's hidden states after each layer count in the drafter's `prefill_exits`
    ({exit: [B, P, D]}), the cache size and the generation budget of the run."""

    prompts: jax.Array
    lengths: jax.Array
    exit_hidden: dict[int, jax.Array]
    cache_len: int = flax.struct.field(pytree_node=False)
    max_new_tokens: int = flax.struct.field(pytree_node=False)


@flax.struct.dataclass
class Round:
    """What one round did, for `Drafter.commit`: the pending token it started from [B], the
    proposal and its acceptance; the target's hidden states at the proposal's reuse exit for
    the pending token and every node [B, 1+T, D] (verification filled in the positions the
    draft never ran; None without reuse); the target's committed lengths [B] before and after
    (unchanged for rows that are done)."""

    pending: jax.Array
    proposal: Proposal
    acceptance: Acceptance
    reused_hidden: jax.Array | None
    lengths_before: jax.Array
    lengths_after: jax.Array


class Drafter(Protocol):
    name: ClassVar[str]       # the registry's and the CLI's name for this kind of drafter
    shape: Shape              # the static shape of every proposal
    prefill_exits: tuple[int, ...]

    def validate(self, cfg: ModelConfig) -> None:
        """Raises ValueError if the drafter cannot run on this model."""

    def label(self) -> str:
        """A short name for reports: "ar", "selfspec E=1 K=6", "selfspec E=1 tree 2,2,1,1"."""

    def prefill(self, ctx: DraftContext, prefilled: Prefilled) -> Any:
        """The state before the first round."""

    def propose(self, ctx: DraftContext, state: Any, cache: Cache, pending: jax.Array,
                key: jax.Array) -> tuple[Proposal, Cache, Any]:
        """Proposes nodes after `pending` [B] (the last emitted token, not yet in the cache)."""

    def verify(self, ctx: DraftContext, state: Any, cache: Cache, pending: jax.Array,
               proposal: Proposal) -> Verified:
        """The target's pass over `pending` and the proposal's nodes."""

    def commit(self, ctx: DraftContext, state: Any, done: Round) -> Any:
        """The state after the round `done`."""


class FullVerification:
    """Verification by the full target model: every drafter's but CALM's."""

    def verify(self, ctx: DraftContext, state: Any, cache: Cache, pending: jax.Array,
               proposal: Proposal) -> Verified:
        return verify(ctx.params, ctx.cfg, cache, pending, proposal)


class Stateless(FullVerification):
    """Hooks of a drafter that needs no state across rounds (LayerSkip, autoregressive)."""

    prefill_exits: ClassVar[tuple[int, ...]] = ()

    def prefill(self, ctx: DraftContext, prefilled: Prefilled) -> tuple:
        return ()

    def commit(self, ctx: DraftContext, state: Any, done: Round) -> Any:
        return state
