"""Drafting over part of the vocabulary (FR-Spec, Zhao et al. 2025; EAGLE-3's reduced head):
the arrays. A vocabulary head (the target's shared head, EAGLE-3's `lm_head`) scores only N
ids: its head becomes a real [N, D] product, its rows gathered once per generate call, and the
N scores are placed back among V logits at `MASKED_LOGIT` elsewhere. Every later step (the
argmax, the draft distribution q, acceptance) reads those V logits as it reads a full head's:
q is the draft distribution over the subset, zero outside it. `decoding.draft_vocab` says
which drafters do this and why the output is unchanged.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.model import Params, unembed
from specjax.nn.attention import softcap
from specjax.nn.linear import matmul
from specjax.nn.norm import apply_rms_norm

MASKED_LOGIT = -1e9  # the logit of an id a draft head does not score: q = 0 after softmax


@flax.struct.dataclass
class DraftVocab:
    """The ids drafted over [N] (ascending) and the target's unembedding rows for them [N, D]
    in the compute dtype."""

    ids: jax.Array
    rows: jax.Array
    vocab_size: int = flax.struct.field(pytree_node=False)

    @classmethod
    def gather(cls, params: Params, cfg: ModelConfig, ids: jax.Array) -> DraftVocab:
        """The rows of `ids` gathered from the target's unembedding (the tied embedding)."""
        table = params["embed"] if cfg.tie_embeddings else params["unembed"].T
        return cls(ids, table[ids].astype(cfg.compute_dtype), cfg.vocab_size)

    def expand(self, scores: jax.Array) -> jax.Array:
        """Scores of the N ids [..., N] as logits over the whole vocabulary [..., V]."""
        full = jnp.full((*scores.shape[:-1], self.vocab_size), MASKED_LOGIT, scores.dtype)
        return full.at[..., self.ids].set(scores, indices_are_sorted=True, unique_indices=True)


def head_logits(params: Params, cfg: ModelConfig, normed: jax.Array,
                vocab: DraftVocab | None) -> jax.Array:
    """The target's unembedding of normalised hidden states [..., V] (float32), over `vocab`'s
    ids only when one is given."""
    if vocab is None:
        return unembed(params, cfg, normed)
    return vocab.expand(softcap(matmul(normed, vocab.rows, transpose_w=True,
                                       out_dtype=jnp.float32), cfg.logit_softcap))


def exit_head_logits(params: Params, cfg: ModelConfig, hidden: jax.Array,
                     vocab: DraftVocab | None) -> jax.Array:
    """The shared exit head (final norm, then `head_logits`) of any layer's hidden state."""
    return head_logits(params, cfg, apply_rms_norm(hidden, params["final_norm"]["scale"], cfg),
                       vocab)
