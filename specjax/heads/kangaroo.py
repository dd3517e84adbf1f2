"""Kangaroo's adapter: one attention block without an MLP on an early exit's hidden state.

    out = out_norm(x + attn(in_norm(x)))

Its output goes straight to the frozen unembedding (the adapter's `out_norm` takes the place of
the model's final norm), as in Kangaroo's `adapter.py`: the draft of exit E is
`unembed(adapter(h_E))`, h_E the target's hidden state after E layers. The module, then its
calls as pure functions over (target params, adapter params). `init_adapter` starts the
adapter as exactly the shared head at exit E (its attention's output projection is zero and
`out_norm` is the final norm), so training starts from LayerSkip's draft and the adapter has to
earn its parameters from there.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.model import Params, causal_mask, init_params, layer_params, unembed
from specjax.nn.attention import Attention
from specjax.nn.cache import LayerKV
from specjax.nn.norm import RMSNorm
from specjax.nn.rope import Rope, rope_tables


class KangarooAdapter(nn.Module):
    """`kv`/`write_pos` as in `Attention` (the adapter keeps its own K/V while decoding)."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array, rope: Rope, mask: jax.Array, kv: LayerKV | None = None,
                 write_pos: jax.Array | None = None) -> tuple[jax.Array, LayerKV | None]:
        attended, kv = Attention(self.cfg, name="attn")(
            RMSNorm(self.cfg, name="in_norm")(x), rope, mask, kv, write_pos)
        return RMSNorm(self.cfg, name="out_norm")(x + attended), kv


def init_adapter(params: Params, cfg: ModelConfig, exit_layer: int) -> Params:
    """An adapter for exit `exit_layer` equal to the shared head there: attention weights and
    input norm from the target's attention layer nearest to layer `exit_layer` (a fresh one when
    the model has none), a zero output projection, the final norm (copies: training may donate
    the adapter's buffers, never the target's)."""
    attention = [i for i, kind in enumerate(cfg.layer_kinds) if kind == "attention"]
    if attention:
        layer = layer_params(params, cfg, min(attention, key=lambda i: abs(i - exit_layer)))
        attn, in_norm = dict(layer["attn"]), layer["attn_norm"]
    else:
        steps = jnp.zeros((1, 1), jnp.int32)
        fresh = KangarooAdapter(cfg).init(jax.random.PRNGKey(exit_layer),
                                          jnp.zeros((1, 1, cfg.d_model), cfg.compute_dtype),
                                          rope_tables(cfg, steps), causal_mask(1))["params"]
        attn, in_norm = dict(fresh["attn"]), fresh["in_norm"]
    attn["out"] = jnp.zeros_like(attn["out"])
    adapter = {"in_norm": in_norm, "attn": attn, "out_norm": params["final_norm"]}
    return jax.tree.map(jnp.copy, adapter)


def abstract_adapter(cfg: ModelConfig) -> Params:
    """Shapes and dtypes of an adapter for `cfg` (restore targets)."""
    return jax.eval_shape(lambda: init_adapter(init_params(cfg, jax.random.PRNGKey(0)), cfg, 0))


def adapter_logits(params: Params, adapter: Params, cfg: ModelConfig,
                   hidden: jax.Array) -> jax.Array:
    """Draft logits [B, T, V] (float32) from exit hidden states [B, T, D] of whole sequences
    (causal, positions 0..T-1: training and evaluation)."""
    return unembed(params, cfg, adapter_output(adapter, cfg, hidden))


def adapter_output(adapter: Params, cfg: ModelConfig, hidden: jax.Array) -> jax.Array:
    """The adapter's output [B, T, D] (normalised, as `run_adapter_cached`'s) on exit hidden
    states [B, T, D] of whole sequences (causal, positions 0..T-1)."""
    batch, steps, _ = hidden.shape
    rope = rope_tables(cfg, jnp.broadcast_to(jnp.arange(steps), (batch, steps)))
    out, _ = KangarooAdapter(cfg).apply({"params": adapter}, hidden, rope, causal_mask(steps))
    return out


def run_adapter_cached(adapter: Params, cfg: ModelConfig, hidden: jax.Array, kv: LayerKV,
                       slots: jax.Array, positions: jax.Array,
                       mask: jax.Array) -> tuple[jax.Array, LayerKV]:
    """The adapter's output [B, n, D] (normalised: `model.unembed` makes it logits) for new
    tokens' exit hidden states [B, n, D] against its own K/V cache, writing theirs at `slots`
    [B, n] (RoPE `positions` [B, n], visible cache slots `mask` [B, n, max_len])."""
    return KangarooAdapter(cfg).apply({"params": adapter}, hidden, rope_tables(cfg, positions),
                                      mask, kv, slots)
