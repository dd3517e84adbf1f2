"""A pre-norm Llama decoder layer: x + attn(norm(x)), then + mlp(norm(x)); with
`ModelConfig.post_norms` (Gemma-2/3) each branch's output is normalised again before the add."""

import flax.linen as nn
import jax

from specjax.config import ModelConfig
from specjax.nn.attention import Attention, write_kv
from specjax.nn.cache import LayerKV
from specjax.nn.mlp import MLP
from specjax.nn.norm import RMSNorm, apply_rms_norm
from specjax.nn.rope import Rope


class DecoderBlock(nn.Module):
    """One attention layer; `kv`/`write_pos` as in `Attention`."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array, rope: Rope | None, mask: jax.Array,
                 kv: LayerKV | None = None,
                 write_pos: jax.Array | None = None) -> tuple[jax.Array, LayerKV | None]:
        attended, kv = Attention(self.cfg, name="attn")(
            RMSNorm(self.cfg, name="attn_norm")(x), rope, mask, kv, write_pos)
        x = x + self._post_norm(attended, "attn_post_norm")
        mlp = MLP(self.cfg, name="mlp")(RMSNorm(self.cfg, name="mlp_norm")(x))
        return x + self._post_norm(mlp, "mlp_post_norm"), kv

    def _post_norm(self, branch: jax.Array, name: str) -> jax.Array:
        return RMSNorm(self.cfg, name=name)(branch) if self.cfg.post_norms else branch


def propagate_state(cfg: ModelConfig, params: dict, x: jax.Array, rope: Rope | None,
                    kv: LayerKV, write_pos: jax.Array) -> LayerKV:
    """The K/V the layer with `params` writes for inputs x [B, T, D], and nothing else: the
    cache of a layer that a token skipped after an early exit (CALM's state propagation: later
    tokens attend to K/V projected from the exited hidden state, not copied from below)."""
    return write_kv(cfg, params["attn"], apply_rms_norm(x, params["attn_norm"]["scale"], cfg),
                    rope, kv, write_pos)
