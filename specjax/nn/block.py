"""A pre-norm Llama decoder layer: x + attn(norm(x)), then + mlp(norm(x))."""

import flax.linen as nn
import jax

from specjax.cache import LayerKV
from specjax.config import ModelConfig
from specjax.nn.attention import Attention
from specjax.nn.mlp import MLP
from specjax.nn.norm import RMSNorm
from specjax.nn.rope import Rope


class DecoderBlock(nn.Module):
    """One attention layer; `kv`/`write_pos` as in `Attention`."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array, rope: Rope, mask: jax.Array, kv: LayerKV | None = None,
                 write_pos: jax.Array | None = None) -> tuple[jax.Array, LayerKV | None]:
        attended, kv = Attention(self.cfg, name="attn")(
            RMSNorm(self.cfg, name="attn_norm")(x), rope, mask, kv, write_pos)
        x = x + attended
        x = x + MLP(self.cfg, name="mlp")(RMSNorm(self.cfg, name="mlp_norm")(x))
        return x, kv
