"""The drafter interface of the generate loop.

A drafter is three things: a static, hashable config (a frozen dataclass: what to compile),
a params pytree traced into the program (its own weights; empty for LayerSkip) and a state
pytree the loop carries across rounds (a draft model's cache, an adapter's K/V; empty for
LayerSkip). The loop calls its hooks:

  prefill   once, after the target's prefill: the initial state;
  propose   every round: a `Proposal` (a token tree of the static `shape`), the target cache
            (a drafter may write the target's K/V for layers it ran) and the new state;
  verify    every round: the target's logits at the pending token and every node
            (by default the full model; CALM's own strategy exits early instead);
  commit    every round, after acceptance: the state with the accepted path kept (`Round`:
            what the round proposed, accepted and verified).

The loop owns acceptance, the target cache's commit, EOS, budgets and statistics. New ideas
(Kangaroo, a draft model, CALM) are new drafters: a module in `decoding.drafters` that exports
`STRATEGIES`, {name: `Strategy`}, which the registry discovers, with the options it reads
declared beside it (`decoding.options`). A drafter with trained weights (`needs_weights`) gets
them from the `Generator` by strategy name (`DraftWeights`; `bind` checks the exit they were
trained on). Every drafter derives from `DrafterBase`, which gives every hook but `propose`,
`validate` and `label` its default (no state, full verification, no weights of its own) and
declares the loop's extension points. A drafter that proposes every depth at once (heads per
depth, copied text) drafts through `proposal.depth_step`; a feature head (Medusa, MTP, EAGLE)
reads the target's hidden states at the prompt (`prefill_exits`) and at each verified
position (`feature_exits`, handed to `commit`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol

import flax.struct
import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.decoding.acceptance import Acceptance
from specjax.decoding.proposal import Proposal, Shape
from specjax.decoding.sampling import SamplingParams
from specjax.decoding.verify import Verified, verify
from specjax.heads.vocab_subset import DraftVocab
from specjax.model import Params
from specjax.nn.cache import Cache


@dataclasses.dataclass(frozen=True)
class DraftWeights:
    """A drafter's own weights: a Kangaroo adapter's (and the exit it was trained on) or a
    draft model's (and its config); a head's `settings` are those its checkpoint records
    (SpecDec++'s: exit_layer, width, temperature, top_p, children)."""

    params: Params
    exit_layer: int | None = None
    cfg: ModelConfig | None = None
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    workdir: str | None = None  # where a draft model was loaded from (its HF peer exports it)


@flax.struct.dataclass
class DraftContext:
    """What every hook may read: the target's params, the drafter's own params, the model
    config, the sampling parameters (None: greedy decoding), the ids a vocabulary head
    drafts over (`draft_vocab`; None: all) and, outside the loop, the tokens a chain drafts
    after in place of its own drafts (`forced` [B, K], `Chain.draft`'s teacher forcing: a
    drafter that `copies_text` honours it; None in the loop)."""

    params: Params
    draft_params: Any
    sampling: SamplingParams | None
    cfg: ModelConfig = flax.struct.field(pytree_node=False)
    vocab: DraftVocab | None = None
    forced: jax.Array | None = None


@flax.struct.dataclass
class Prefilled:
    """What the target's prefill hands a drafter: prompts [B, P] (right-padded), their lengths
    [B], the target's hidden states after each layer count in the drafter's `prefill_exits`
    ({exit: [B, P, D]}), the cache size and the generation budget of the run (a traced scalar:
    budgets share programs)."""

    prompts: jax.Array
    lengths: jax.Array
    exit_hidden: dict[int, jax.Array]
    cache_len: int = flax.struct.field(pytree_node=False)
    max_new_tokens: jax.Array | int

    def at_last_token(self, values: jax.Array) -> jax.Array:
        """Each row's value at its prompt's last token, from `values` [B, P, ...]: the feature
        a head drafts the first token from."""
        return at_positions(values, self.lengths - 1)


def at_positions(values: jax.Array, positions: jax.Array) -> jax.Array:
    """Each row's value at its own position of `values` [B, T, ...]: [B, ...]."""
    index = positions.reshape((-1, 1) + (1,) * (values.ndim - 2))
    return jnp.take_along_axis(values, index, axis=1)[:, 0]


@flax.struct.dataclass
class Round:
    """What one round did, for `Drafter.commit`: the pending token it started from [B], the
    proposal and its acceptance; the target's hidden states at the proposal's reuse exit for
    the pending token and every node [B, 1+T, D] (verification filled in the positions the
    draft never ran; None without reuse); the target's committed lengths [B] before and after
    (unchanged for rows that are done); `features`, the target's hidden states after each of
    the drafter's `feature_exits` for the pending token and every node ({exit: [B, 1+T, D]});
    `logits`, the target's logits there [B, 1+T, V] (what Lookahead's window iterates on).
    """

    pending: jax.Array
    proposal: Proposal
    acceptance: Acceptance
    reused_hidden: jax.Array | None
    lengths_before: jax.Array
    lengths_after: jax.Array
    features: dict[int, jax.Array] = flax.struct.field(default_factory=dict)
    logits: jax.Array | None = None

    def last_kept(self, kept: jax.Array, previous: jax.Array) -> jax.Array:
        """The value at the last position the round kept, from `kept` [B, 1+D, ...] (along the
        accepted path, the pending token's first: `nn.cache.along_path`), for each row the
        round advanced; `previous` [B, ...] for rows that are done."""
        last = at_positions(kept, self.acceptance.num_accepted)
        active = (self.lengths_after > self.lengths_before).reshape(
            (-1,) + (1,) * (previous.ndim - 1))
        return jnp.where(active, last.astype(previous.dtype), previous)


class Drafter(Protocol):
    name: ClassVar[str]       # the registry's and the CLI's name for this kind of drafter
    shape: Shape              # the static shape of every proposal
    prefill_exits: tuple[int, ...]  # exits whose prompt hidden states `prefill` reads
    feature_exits: tuple[int, ...]  # exits whose hidden states verification hands `commit`
    needs_weights: bool       # drafts with weights of its own (`bind`, `Generator`)
    weights_hint: str         # how to get them, for the error when they are missing
    verify_from: int          # layers below this verification reuses from the draft (0: none)
    lossless: bool            # its output is the target's (greedy: identical; sampled: in law)
    mixable: bool             # may be a branch of a mixed tree (`drafters.mixed`)

    def bind(self, weights: DraftWeights) -> Drafter:
        """This drafter for these weights of its own (checked against them)."""

    def with_weights(self, weights: Mapping[str, DraftWeights]) -> tuple[Drafter, Any]:
        """This drafter bound to its weights among `weights` (by strategy name), and the params
        traced into its program (a mixed tree binds each branch)."""

    def runtime_params(self, draft_params: Any) -> Any:
        """The params traced into the program: its weights' (default) plus traced settings."""

    def restrict_vocab(self, draft_params: Any, ids: jax.Array) -> Any:
        """Its params with its own vocabulary head cut to `ids` [N] (`draft_vocab`)."""

    def forced_logits(self, ctx: DraftContext, tokens: jax.Array, hidden: jax.Array,
                      at: jax.Array) -> jax.Array:
        """Where `plays_forced`: the logits [B, M, V] of its drafts at positions `at` [B, M]
        of texts `tokens` [B, T], whose target hidden states after each layer are `hidden`
        [L, B, T, D]."""

    def hf_options(self) -> dict[str, Any] | None:
        """`generate()` options of the equivalent Hugging Face decoding (None: none exists)."""

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


class DrafterBase:
    """Every hook's default (see `Drafter`), so a drafter writes `propose`, `validate` and
    `label` and overrides the rest only where it needs to: no state across rounds (`prefill`
    gives `()`, `commit` keeps it), verification by the full target model, no weights of its
    own, no traced settings, no Hugging Face equivalent, lossless, mixable.

    The loop's extension points are declared here, each with its default: `prefill_exits`
    (the prompt's hidden states `prefill` reads), `feature_exits` (the hidden states
    verification keeps at the pending token and every node, handed to `commit` as
    `Round.features`: what a feature head drafts from), `verify_from` (layers verification
    reuses from the draft, `Proposal.reuse`), `verify` (CALM's own exits early),
    `restrict_vocab` (a vocabulary head of its own, `draft_vocab`); a strategy built from
    others is a `Strategy(..., composite=True)`. `copies_text`: the drafter's state is the text
    so far (`drafters.text_history`) and its proposal a function of it alone (its chain drafts
    after `ctx.forced` when given), so its rounds, greedy and sampled, can be played without
    the loop (`tools.copied_play.play_copied`). `plays_forced`: its draft at a position is a
    function of the text before it alone, not of where the round started (the loop drafts
    after accepted drafts, which are the text's tokens), so one teacher-forced pass over a
    text gives every draft a round can make there (`forced_logits`), and its rounds are
    played as an exit's are (`tools.exit_workload.exit_runs`)."""

    prefill_exits: ClassVar[tuple[int, ...]] = ()
    feature_exits: ClassVar[tuple[int, ...]] = ()
    lossless: ClassVar[bool] = True
    mixable: ClassVar[bool] = True
    needs_weights: ClassVar[bool] = False
    weights_hint: ClassVar[str] = ""
    verify_from: ClassVar[int] = 0
    copies_text: ClassVar[bool] = False
    plays_forced: ClassVar[bool] = False

    def bind(self, weights: DraftWeights) -> Drafter:
        return self

    def with_weights(self, weights: Mapping[str, DraftWeights]) -> tuple[Drafter, Any]:
        params, drafter = None, self
        if self.needs_weights:
            found = weights.get(self.name)
            if found is None:
                raise ValueError(f"strategy {self.name!r} needs weights of its own and this "
                                 f"model has none: {self.weights_hint}")
            drafter, params = self.bind(found), found.params
        return drafter, drafter.runtime_params(params)

    def runtime_params(self, draft_params: Any) -> Any:
        return draft_params

    def restrict_vocab(self, draft_params: Any, ids: jax.Array) -> Any:
        """Its own weights with a vocabulary head of its own cut to `ids` (once per generate
        call, when it drafts over part of the vocabulary); unchanged by default."""
        return draft_params

    def hf_options(self) -> dict[str, Any] | None:
        return None

    def forced_logits(self, ctx: DraftContext, tokens: jax.Array, hidden: jax.Array,
                      at: jax.Array) -> jax.Array:
        raise NotImplementedError(f"strategy {self.name!r} drafts from where its round starts, "
                                  "not from a teacher-forced pass")

    def prefill(self, ctx: DraftContext, prefilled: Prefilled) -> Any:
        """No state: `()`."""
        return ()

    def verify(self, ctx: DraftContext, state: Any, cache: Cache, pending: jax.Array,
               proposal: Proposal) -> Verified:
        """The full target model's pass, keeping the hidden states at `feature_exits`."""
        return verify(ctx.params, ctx.cfg, cache, pending, proposal, self.feature_exits)

    def commit(self, ctx: DraftContext, state: Any, done: Round) -> Any:
        """The state unchanged."""
        return state


def trained_head_hint(what: str, name: str) -> str:
    """A `weights_hint` for weights trained on a frozen model by the shipped config `name`
    (`specjax/configs/<name>.py`): `what` they are ("an adapter")."""
    return (f"train {what} (python train/train.py --config {name} "
            f"--config.base_workdir=<this model's workdir> --workdir runs/{name}) and decode "
            "from its workdir, or add it with --draft_workdir")


@dataclasses.dataclass(frozen=True)
class Strategy:
    """How the registry builds a drafter: `build(options)` from the decoding options, of which
    it reads only the fields of its option groups `options` (frozen dataclasses of
    `decoding.options.option` fields; a group may be shared, as the shape's is). A
    `composite` strategy (a mixed tree) is built as `build(options, make)`, `make(name)` giving
    another registered strategy built from the same options."""

    build: Callable[..., Drafter]
    options: tuple[type, ...] = ()
    composite: bool = False
