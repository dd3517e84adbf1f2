"""Chains: a drafter proposes up to K tokens one after another, with a confidence stop.

The drafting is one `lax.while_loop` of at most K steps that ends early once every row's
latest draft is unconfident: its probability under the draft distribution is below
`stop_below` (HF's `assistant_confidence_threshold`, Kangaroo's η). A row that stops keeps
being computed with the batch but its later drafts do not count (`valid`), so shapes stay
static and the verifier sees K nodes whatever happened.

Stopping on the draft's own confidence keeps sampling lossless: the decision depends only on the
drafted prefix, and the verifier draws the token after the last valid draft from the target.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import flax.struct
import jax
import jax.numpy as jnp

from specjax.decoding.proposal import DraftStep, Proposal
from specjax.decoding.sampling import SamplingParams, probabilities, sample
from specjax.decoding.tree import chain_layout


@dataclasses.dataclass(frozen=True)
class Chain:
    """Up to `num_draft` = K tokens in a row; a row stops after a draft whose draft probability
    is below `stop_below` (0: always K)."""

    num_draft: int
    stop_below: float = 0.0

    is_chain: ClassVar[bool] = True
    max_children: ClassVar[int] = 1
    children: ClassVar[str] = "iid"  # one child per node: every sampled rule is the chain's

    @property
    def num_nodes(self) -> int:
        return self.num_draft

    @property
    def depth(self) -> int:
        return self.num_draft

    def validate(self) -> None:
        if self.num_draft < 1:
            raise ValueError(f"num_draft={self.num_draft} must be >= 1")
        if not 0 <= self.stop_below < 1:
            raise ValueError(f"draft_threshold={self.stop_below} must lie in [0, 1)")

    def label(self) -> str:
        return f"K={self.num_draft}" + (f" eta={self.stop_below:g}" if self.stop_below else "")

    def draft(self, step: DraftStep, carry: Any, lengths: jax.Array, pending: jax.Array,
              key: jax.Array, sampling: SamplingParams | None,
              max_len: int) -> tuple[Proposal, jax.Array, jax.Array, Any]:
        batch, num_draft, threshold = pending.shape[0], self.num_draft, self.stop_below

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
                probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1) if threshold else None
            else:
                probs = probabilities(logits, sampling)
                token = sample(jax.random.fold_in(key, s.k), probs)
            update = {"tokens": token, "kept": kept, "probs": probs}
            confident = (jnp.take_along_axis(probs, token[:, None], axis=-1)[:, 0] >= threshold
                         if threshold else jnp.ones((batch,), bool))
            return _State(k=s.k + 1, carry=carry, token=token,
                          chain={name: s.chain[name].at[s.k].set(update[name])
                                 for name in s.chain},
                          num_valid=s.num_valid + s.drafting, drafting=s.drafting & confident)

        start = _State(k=jnp.zeros((), jnp.int32), carry=carry, token=pending, chain=chain,
                       num_valid=jnp.zeros((batch,), jnp.int32),
                       drafting=jnp.ones((batch,), bool))
        end = jax.lax.while_loop(lambda s: (s.k < num_draft) & jnp.any(s.drafting), body, start)
        probs = end.chain.get("probs")
        nodes = jnp.arange(num_draft)[None, :]
        proposal = Proposal(
            tokens=end.chain["tokens"].T, parents=jnp.broadcast_to(nodes - 1, (batch, num_draft)),
            valid=nodes < end.num_valid[:, None],
            q=None if probs is None else probs.transpose(1, 0, 2), reuse=None, stats={},
            shape=self)
        # Step k ran at position k; the last valid draft's position never ran.
        kept = jnp.moveaxis(end.chain["kept"], 0, 1)
        kept = jnp.pad(kept, ((0, 0), (0, 1)) + ((0, 0),) * (kept.ndim - 2))
        return proposal, kept, end.num_valid[:, None], end.carry


@flax.struct.dataclass
class _State:
    k: jax.Array
    carry: Any
    token: jax.Array
    chain: Any
    num_valid: jax.Array
    drafting: jax.Array
