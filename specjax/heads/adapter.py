"""Kangaroo's adapter: one attention block without an MLP on an early exit's hidden state.

    out = out_norm(x + attn(in_norm(x)))

Its output goes straight to the frozen unembedding (the adapter's `out_norm` takes the place of
the model's final norm), as in Kangaroo's `adapter.py`.
"""

import flax.linen as nn
import jax

from specjax.cache import LayerKV
from specjax.config import ModelConfig
from specjax.nn.attention import Attention
from specjax.nn.norm import RMSNorm
from specjax.nn.rope import Rope


class KangarooAdapter(nn.Module):
    """`kv`/`write_pos` as in `Attention` (the adapter keeps its own K/V while decoding)."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array, rope: Rope, mask: jax.Array, kv: LayerKV | None = None,
                 write_pos: jax.Array | None = None) -> tuple[jax.Array, LayerKV | None]:
        attended, kv = Attention(self.cfg, name="attn")(
            RMSNorm(self.cfg, name="in_norm")(x), rope, mask, kv, write_pos)
        return RMSNorm(self.cfg, name="out_norm")(x + attended), kv
