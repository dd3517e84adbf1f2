"""Chains: a drafter proposes up to K tokens one after another, with optional stop rules.

The drafting is one `lax.while_loop` of at most K steps that ends early once every row has
stopped. A row stops after a draft that is unconfident: its probability under the draft
distribution is below `stop_below` (HF's `assistant_confidence_threshold`, Kangaroo's η); or,
with an acceptance model (SpecDec++'s head), once the predicted probability that some draft so
far is rejected, 1 - prod(accept), exceeds `stop_risk` (h). Verification then covers the
longest row's drafts rounded up to one of `verify_sizes`, and every row's chain is filled to
that size: the pass costs the same with or without those drafts, and a draft step costs a small
part of a pass (exit 1 at the default size: about 0.06 ms against 3-6 ms). So a stop rule picks
one of a few verification sizes, and every draft the pass covers counts (the statistic
`stopped_after` counts the drafts the rule itself kept). Shapes stay static: drafts past the
size are computed but invalid (`valid`).

Both rules keep sampling lossless: where a chain ends depends only on the drafted tokens (the
batch's), never on the target, and the verifier draws the token after the last valid draft
from the target.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import flax.struct
import jax
import jax.numpy as jnp

from specjax.decoding.proposal import AcceptModel, DraftStep, Proposal, pass_index
from specjax.decoding.sampling import SamplingParams, probabilities, sample
from specjax.decoding.shapes.tree import chain_layout

VERIFY_STEPS = 3  # verification sizes of a chain whose rows may stop early (`verify_sizes`)

@dataclasses.dataclass(frozen=True)
class Chain:
    """Up to `num_draft` = K tokens in a row; a row stops after a draft whose draft probability
    is below `stop_below`, or once 1 - prod(predicted acceptance) exceeds `stop_risk` (0: rule
    off; `stop_risk` needs the drafter's acceptance model), and is then filled to the
    verification size the batch's longest row needs."""

    num_draft: int
    stop_below: float = 0.0
    stop_risk: float = 0.0

    is_chain: ClassVar[bool] = True
    max_children: ClassVar[int] = 1
    children: ClassVar[str] = "iid"  # one child per node: every sampled rule is the chain's

    @property
    def num_nodes(self) -> int:
        return self.num_draft

    @property
    def depth(self) -> int:
        return self.num_draft

    @property
    def verify_sizes(self) -> tuple[int, ...]:
        """Node counts a verification pass may cover: K, and when rows may stop early also
        1/3 and 2/3 of it, rounded up (each size is one more compiled pass: every count 1..K
        made the compile of K = 8 five times longer; on a 2-core CPU a pass costs about 1.8 ms
        + 0.27 ms a token at the default size)."""
        if not (self.stop_below or self.stop_risk):
            return (self.num_draft,)
        steps = min(VERIFY_STEPS, self.num_draft)
        return tuple(sorted({-(-self.num_draft * i // steps) for i in range(1, steps + 1)}))

    def validate(self) -> None:
        if self.num_draft < 1:
            raise ValueError(f"num_draft={self.num_draft} must be >= 1")
        if not 0 <= self.stop_below < 1:
            raise ValueError(f"draft_threshold={self.stop_below} must lie in [0, 1)")
        if not 0 <= self.stop_risk < 1:
            raise ValueError(f"draft_risk={self.stop_risk} must lie in [0, 1)")

    def label(self) -> str:
        return (f"K={self.num_draft}" + (f" eta={self.stop_below:g}" if self.stop_below else "")
                + (f" h={self.stop_risk:g}" if self.stop_risk else ""))

    def draft(self, step: DraftStep, carry: Any, lengths: jax.Array, pending: jax.Array,
              key: jax.Array, sampling: SamplingParams | None, max_len: int,
              accept: AcceptModel | None = None,
              forced: jax.Array | None = None) -> tuple[Proposal, jax.Array, jax.Array, Any]:
        """As `Shape.draft`; `accept` is the acceptance model `stop_risk` reads. `forced`
        [B, K] (teacher forcing): the tokens each depth drafts after, in place of the
        drafts before it; the proposal still holds each depth's own draft and q. Along a
        known text, q at depth d is then the q the loop draws from when the d drafts before
        it were that text's tokens (`tools.copied_play` plays sampled rounds from it)."""
        batch, num_draft, threshold = pending.shape[0], self.num_draft, self.stop_below
        if self.stop_risk and accept is None:
            raise ValueError("draft_risk (SpecDec++'s stop) needs an acceptance head: use "
                             "strategy specdec on a head's workdir, or set draft_risk to 0")

        def one_step(carry, token, k):
            logits, kept, carry = step(carry, token[:, None], chain_layout(lengths + k, 1,
                                                                           max_len))
            return logits[:, 0], kept[:, 0], carry

        logits_like, kept_like, _ = jax.eval_shape(one_step, carry, pending,
                                                   jnp.zeros((), jnp.int32))
        chain = {"tokens": jnp.zeros((num_draft, batch), jnp.int32),
                 "kept": jnp.zeros((num_draft, *kept_like.shape), kept_like.dtype)}
        if sampling is not None:
            chain["probs"] = jnp.zeros((num_draft, *logits_like.shape), jnp.float32)

        def body(s: _State) -> _State:
            logits, kept, carry = one_step(s.carry, s.token, s.k)
            if sampling is None:
                token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
                probs = (jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
                         if threshold or self.stop_risk else None)
            else:
                probs = probabilities(logits, sampling)
                token = sample(jax.random.fold_in(key, s.k), probs)
            update = {"tokens": token, "kept": kept, "probs": probs}
            after = token if forced is None else forced[:, s.k]
            confident = (jnp.take_along_axis(probs, token[:, None], axis=-1)[:, 0] >= threshold
                         if threshold else jnp.ones((batch,), bool))
            survive, within = s.survive, True
            if self.stop_risk:
                survive = survive * accept(kept, probs, token)
                within = 1 - survive <= self.stop_risk
            return _State(k=s.k + 1, carry=carry, token=after,
                          chain={name: s.chain[name].at[s.k].set(update[name])
                                 for name in s.chain},
                          num_valid=s.num_valid + s.drafting, survive=survive,
                          drafting=s.drafting & confident & within)

        start = _State(k=jnp.zeros((), jnp.int32), carry=carry, token=pending, chain=chain,
                       num_valid=jnp.zeros((batch,), jnp.int32),
                       survive=jnp.ones((batch,), jnp.float32),
                       drafting=jnp.ones((batch,), bool))
        sizes = jnp.asarray(self.verify_sizes)

        def verified(num_valid: jax.Array) -> jax.Array:
            """The node count of the pass that holds every row's drafts."""
            return sizes[pass_index(self.verify_sizes, num_valid)]

        end = jax.lax.while_loop(
            lambda s: (s.k < num_draft) & (jnp.any(s.drafting) | (s.k < verified(s.num_valid))),
            body, start)
        num_valid = jnp.broadcast_to(verified(end.num_valid), (batch,))  # filled to the pass
        probs = end.chain.get("probs")
        nodes = jnp.arange(num_draft)[None, :]
        proposal = Proposal(
            tokens=end.chain["tokens"].T, parents=jnp.broadcast_to(nodes - 1, (batch, num_draft)),
            valid=nodes < num_valid[:, None],
            q=None if probs is None else probs.transpose(1, 0, 2), reuse=None,
            stats={"stopped_after": end.num_valid} if self.verify_sizes != (num_draft,) else {},
            shape=self)
        # Step k ran at position k; the last valid draft's position never ran.
        kept = jnp.moveaxis(end.chain["kept"], 0, 1)
        kept = jnp.pad(kept, ((0, 0), (0, 1)) + ((0, 0),) * (kept.ndim - 2))
        return proposal, kept, num_valid[:, None], end.carry


@flax.struct.dataclass
class _State:
    k: jax.Array
    carry: Any
    token: jax.Array
    chain: Any
    num_valid: jax.Array
    survive: jax.Array  # prod of the predicted acceptance of the row's drafts so far
    drafting: jax.Array
