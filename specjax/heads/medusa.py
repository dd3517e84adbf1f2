"""Medusa heads (Cai et al. 2024, Medusa-1): K heads on the frozen model's last hidden state,
head k drafting the token k + 1 places after the model's own next token.

    head_k(h) = U_k (x + SiLU(W_k x + b_k)),   x = final_norm(h)

one residual block and a vocabulary projection per head, as Medusa's `ResBlock` + `Linear`.
`init_medusa` starts every head as exactly the model's own head (W_k, b_k zero, U_k a copy of
the unembedding), as Medusa copies `lm_head`. The module, then its calls as pure functions over
(target params, head params). Every depth is drafted at once from one hidden state
(`proposal.depth_step`), so a round costs one small matmul per head and no target layer.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.heads.vocab_subset import DraftVocab
from specjax.model import Params, init_params
from specjax.nn.norm import apply_rms_norm


class MedusaHeads(nn.Module):
    """`num_heads` heads over normalised hidden states [..., D] -> logits [..., K, V] (float32);
    `outputs` ids projected to (default the vocabulary; fewer for heads cut to a draft
    vocabulary, `restrict_medusa`)."""

    cfg: ModelConfig
    num_heads: int
    outputs: int | None = None

    @nn.compact
    def __call__(self, normed: jax.Array) -> jax.Array:
        d, dtype = self.cfg.d_model, self.cfg.compute_dtype
        w = self.param("w", nn.initializers.zeros, (self.num_heads, d, d), self.cfg.param_dtype)
        b = self.param("b", nn.initializers.zeros, (self.num_heads, d), self.cfg.param_dtype)
        out = self.param("out", nn.initializers.zeros,
                         (self.num_heads, d, self.outputs or self.cfg.vocab_size),
                         self.cfg.param_dtype)
        x = normed.astype(dtype)
        residual = x[..., None, :] + nn.silu(jnp.einsum("...d,kde->...ke", x, w.astype(dtype))
                                              + b.astype(dtype))
        return jnp.einsum("...kd,kdv->...kv", residual, out.astype(dtype),
                          preferred_element_type=jnp.float32)


def init_medusa(params: Params, cfg: ModelConfig, num_heads: int) -> Params:
    """Heads equal to the model's own head: zero residual blocks, each projection a copy of the
    unembedding [D, V] (training may donate the heads' buffers, never the target's)."""
    unembedding = params["embed"].T if cfg.tie_embeddings else params["unembed"]
    d = cfg.d_model
    return {"w": jnp.zeros((num_heads, d, d), cfg.param_dtype),
            "b": jnp.zeros((num_heads, d), cfg.param_dtype),
            "out": jnp.tile(unembedding.astype(cfg.param_dtype)[None], (num_heads, 1, 1))}


def abstract_medusa(cfg: ModelConfig, num_heads: int) -> Params:
    """Shapes and dtypes of `num_heads` heads for `cfg` (restore targets)."""
    return jax.eval_shape(lambda: init_medusa(init_params(cfg, jax.random.PRNGKey(0)), cfg,
                                              num_heads))


def medusa_logits(params: Params, heads: Params, cfg: ModelConfig, hidden: jax.Array,
                  vocab: DraftVocab | None = None) -> jax.Array:
    """Every head's logits [..., K, V] (float32) from the target's last-layer hidden states
    [..., D] (before the final norm, which the heads share with the model's own head); scored
    over `vocab`'s ids only when given (the heads cut to them by `restrict_medusa`)."""
    normed = apply_rms_norm(hidden, params["final_norm"]["scale"], cfg)
    scores = MedusaHeads(cfg, heads["w"].shape[0], heads["out"].shape[-1]).apply(
        {"params": heads}, normed)
    return scores if vocab is None else vocab.expand(scores)


def restrict_medusa(heads: Params, ids: jax.Array) -> Params:
    """The heads with each vocabulary projection's columns at `ids` [N]."""
    return {**heads, "out": heads["out"][:, :, ids]}
