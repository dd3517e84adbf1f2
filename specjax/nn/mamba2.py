"""A Mamba-2 layer (HF `Mamba2Mixer` / `BambaMixer` layout) and three ways to mix its sequence.

    z, xBC, dt = in_proj(x)                   xBC: x [d_inner], B and C [groups * state_size]
    xBC = silu(causal depthwise conv1d(xBC))  width conv_width, with bias
    y = SSD(x, softplus(dt + dt_bias), A = -exp(A_log), B, C) + D x
    out = out_proj(gated RMSNorm(y, z))       (y * silu(z), normalised per group of heads)

The layer (`Mamba2Block`) is pre-norm, residual, with an optional SwiGLU MLP after the mixer
(Bamba's layers have one, Mamba2ForCausalLM's do not). What differs between training, prefill and
decoding is only how the conv and the scan see the other tokens, a `Mixing`:

  `Sequence`  whole sequences, no cache: causal conv, chunked scan (training, `model.forward`).
  `Prefill`   a right-padded prompt on a committed cache: the same, then the state and conv history
              after each row's last real token are committed directly.
  `Cached`    new tokens at cache slots (a chain or a token tree) seeing the slots the attention
              mask says: the conv runs over each token's path, the scan is the tree scan from the
              committed state (`ssd.ssd_tree`); the tokens' values enter the cache's window, and
              `LayerSSM.commit` folds in the accepted path.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple, Protocol

import einops
import flax.linen as nn
import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.nn.cache import LayerSSM
from specjax.nn.linear import matmul
from specjax.nn.mlp import MLP, residual_init_std
from specjax.nn.norm import RMSNorm
from specjax.nn.ssd import ssd_chunked, ssd_tree


class MixerWeights(NamedTuple):
    """The mixer's per-channel parameters: conv [conv_width, C] and its bias [C]; per head
    dt_bias, A (= -exp(A_log)) and D [H]."""

    conv: jax.Array
    conv_bias: jax.Array
    dt_bias: jax.Array
    A: jax.Array
    D: jax.Array


class Mixing(Protocol):
    """mixing(cfg, weights, xbc [B, T, C] before the conv, dt [B, T, H] before softplus) ->
    (y [B, T, H, P] with the D skip, the layer's new cache or None)."""

    def __call__(self, cfg: ModelConfig, w: MixerWeights, xbc: jax.Array,
                 dt: jax.Array) -> tuple[jax.Array, LayerSSM | None]: ...


class Mamba2Block(nn.Module):
    """norm -> Mamba-2 mixer -> residual, then (when `ssm.mlp`) norm -> MLP -> residual."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array, mixing: Mixing) -> tuple[jax.Array, LayerSSM | None]:
        mixed, cache = Mamba2Mixer(self.cfg, name="mixer")(RMSNorm(self.cfg, name="norm")(x),
                                                           mixing)
        x = x + mixed
        if self.cfg.ssm.mlp:
            x = x + MLP(self.cfg, name="mlp")(RMSNorm(self.cfg, name="mlp_norm")(x))
        return x, cache


class Mamba2Mixer(nn.Module):
    """The Mamba-2 mixer; parameters named and laid out as HF's (conv as [width, channels])."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array, mixing: Mixing) -> tuple[jax.Array, LayerSSM | None]:
        cfg, ssm = self.cfg, self.cfg.ssm
        inner, heads, channels = ssm.inner_dim, ssm.num_heads, ssm.conv_channels
        in_proj = self.param("in_proj", nn.initializers.normal(cfg.init_std),
                             (cfg.d_model, inner + channels + heads), cfg.weight_dtype)
        conv = self.param("conv", _conv_init, (ssm.conv_width, channels), cfg.weight_dtype)
        conv_bias = self.param("conv_bias", nn.initializers.zeros, (channels,), cfg.weight_dtype)
        dt_bias = self.param("dt_bias", _dt_bias_init(ssm.dt_min, ssm.dt_max), (heads,),
                             jnp.float32)
        a_log = self.param("A_log", lambda _, shape: jnp.log(jnp.arange(1, shape[0] + 1.0)),
                           (heads,))
        skip = self.param("D", nn.initializers.ones, (heads,), jnp.float32)
        norm = self.param("norm", nn.initializers.ones, (inner,), cfg.weight_dtype)
        out_proj = self.param("out_proj", nn.initializers.normal(residual_init_std(cfg)),
                              (inner, cfg.d_model), cfg.weight_dtype)

        projected = matmul(x, in_proj.astype(cfg.compute_dtype))
        z, xbc, dt = jnp.split(projected, [inner, inner + channels], axis=-1)
        weights = MixerWeights(conv.astype(cfg.compute_dtype), conv_bias.astype(cfg.compute_dtype),
                               dt_bias, -jnp.exp(a_log), skip)
        y, cache = mixing(cfg, weights, xbc, dt)
        y = gated_rms_norm(y.reshape(*y.shape[:2], inner), z, norm, cfg)
        return matmul(y, out_proj.astype(cfg.compute_dtype)), cache


def gated_rms_norm(y: jax.Array, z: jax.Array, scale: jax.Array, cfg: ModelConfig) -> jax.Array:
    """RMSNorm(y * silu(z)) over each group of `inner / groups` channels (HF
    `MambaRMSNormGated` with `group_size`), in float32."""
    gated = y.astype(jnp.float32) * jax.nn.silu(z.astype(jnp.float32))
    grouped = einops.rearrange(gated, "... (g c) -> ... g c", g=cfg.ssm.groups)
    normed = grouped * jax.lax.rsqrt(jnp.mean(grouped * grouped, -1, keepdims=True) + cfg.norm_eps)
    return (scale.astype(jnp.float32) * einops.rearrange(normed, "... g c -> ... (g c)")).astype(
        cfg.compute_dtype)


@dataclasses.dataclass(frozen=True)
class Sequence:
    """Whole sequences from a zero state (training, `model.forward`)."""

    def __call__(self, cfg: ModelConfig, w: MixerWeights, xbc: jax.Array,
                 dt: jax.Array) -> tuple[jax.Array, None]:
        history = jnp.zeros((xbc.shape[0], cfg.ssm.conv_width - 1, xbc.shape[2]), xbc.dtype)
        x, B, C, dt = _activate(cfg, w, causal_conv(xbc, history, w), dt)
        y, _ = ssd_chunked(x, dt, w.A, B, C, chunk=cfg.ssm.chunk_size)
        return y + _skip(w, x), None


@dataclasses.dataclass(frozen=True)
class Prefill:
    """Right-padded prompts [B, T] continuing `cache`'s committed state; `lengths` [B] real
    tokens per row. The cache comes back with the state and conv history after each row's last
    real token committed (padding tokens get dt = 0, which leaves the state as it is)."""

    cache: LayerSSM
    lengths: jax.Array

    def __call__(self, cfg: ModelConfig, w: MixerWeights, xbc: jax.Array,
                 dt: jax.Array) -> tuple[jax.Array, LayerSSM]:
        history = self.cache.conv
        x, B, C, dt = _activate(cfg, w, causal_conv(xbc, history, w), dt)
        real = jnp.arange(xbc.shape[1])[None, :] < self.lengths[:, None]
        dt = jnp.where(real[..., None], dt, 0.0)
        y, state = ssd_chunked(x, dt, w.A, B, C, chunk=cfg.ssm.chunk_size,
                               initial_state=self.cache.state)
        extended = jnp.concatenate([history, xbc], axis=1)
        last = self.lengths[:, None] + jnp.arange(history.shape[1])[None, :]
        conv = jnp.take_along_axis(extended, last[..., None], axis=1)
        return y + _skip(w, x), self.cache._replace(state=state.astype(self.cache.state.dtype),
                                                    conv=conv)


@dataclasses.dataclass(frozen=True)
class Cached:
    """New tokens at cache `slots` [B, T] that see the cache slots `mask` [B, T, max_len] (the
    attention layers' mask: committed slots, then the token's path), after `lengths` [B]
    committed tokens. Tokens sit in the window at slot - length; those outside it are dropped."""

    cache: LayerSSM
    lengths: jax.Array
    slots: jax.Array
    mask: jax.Array

    def __call__(self, cfg: ModelConfig, w: MixerWeights, xbc: jax.Array,
                 dt: jax.Array) -> tuple[jax.Array, LayerSSM]:
        cache, window = self.cache, self.cache.window
        offsets = self.slots - self.lengths[:, None]
        offsets = jnp.where((offsets >= 0) & (offsets < window), offsets, window)
        rows = jnp.arange(xbc.shape[0])[:, None]

        def put(buffer, values):
            return buffer.at[rows, offsets].set(values.astype(buffer.dtype), mode="drop")

        raw = put(cache.xbc, xbc)
        ancestry = _window_ancestry(self.mask, self.lengths, window)
        x, B, C, dt = _activate(cfg, w, path_conv(raw, cache.conv, ancestry, w), dt)
        log_decay = dt * w.A
        cache = cache._replace(xbc=raw, x=put(cache.x, x), b=put(cache.b, B), dt=put(cache.dt, dt),
                               log_decay=put(cache.log_decay, log_decay))
        y = ssd_tree(cache.x, cache.dt, cache.log_decay, cache.b, C, ancestry, cache.state)
        return y + _skip(w, x), cache


def causal_conv(xbc: jax.Array, history: jax.Array, w: MixerWeights) -> jax.Array:
    """Depthwise causal conv of xbc [B, T, C] after `history` [B, width - 1, C] (the inputs
    before the first token, oldest first)."""
    width, steps = w.conv.shape[0], xbc.shape[1]
    extended = jnp.concatenate([history.astype(xbc.dtype), xbc], axis=1)
    return sum(extended[:, k:k + steps] * w.conv[k] for k in range(width)) + w.conv_bias


def path_conv(window: jax.Array, history: jax.Array, ancestry: jax.Array,
              w: MixerWeights) -> jax.Array:
    """The conv of T tokens along their paths: token t's inputs are the window tokens on its path
    (`ancestry` [B, T, W], itself included; window [B, W, C]), nearest first, then the committed
    history [B, width - 1, C] (newest last). Returns [B, T, C]."""
    width = w.conv.shape[0]
    path = ancestry.astype(jnp.int32)
    later = jnp.triu(jnp.ones((path.shape[-1],) * 2, jnp.int32), 1).T           # [k, j]: k > j
    distance = jnp.einsum("btk,kj->btj", path, later)            # path tokens after j
    count = jnp.sum(path, axis=-1)                                              # [B, T]
    taps = jnp.arange(width)
    from_window = ancestry[:, :, None, :] & (distance[:, :, None, :] == taps[None, None, :, None])
    slot = (width - 2) - (taps[None, None, :] - count[..., None])               # [B, T, width]
    from_history = slot[..., None] == jnp.arange(width - 1)[None, None, None, :]
    gathered = (jnp.einsum("btij,bjc->btic", from_window.astype(window.dtype), window)
                + jnp.einsum("btih,bhc->btic", from_history.astype(window.dtype),
                             history.astype(window.dtype)))
    return jnp.einsum("btic,ic->btc", gathered, jnp.flip(w.conv, 0)) + w.conv_bias


def _window_ancestry(mask: jax.Array, lengths: jax.Array, window: int) -> jax.Array:
    """[B, T, W]: the mask's columns for the window's slots lengths .. lengths + W - 1."""
    max_len = mask.shape[-1]
    columns = lengths[:, None] + jnp.arange(window)[None, :]
    index = jnp.broadcast_to(jnp.minimum(columns, max_len - 1)[:, None, :],
                             (*mask.shape[:2], window))
    return jnp.take_along_axis(mask, index, axis=2) & (columns < max_len)[:, None, :]


def _activate(cfg: ModelConfig, w: MixerWeights, conv: jax.Array,
              dt: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """x [B, T, H, P], B and C [B, T, G, N], dt [B, T, H] (float32, after softplus)."""
    ssm = cfg.ssm
    x, B, C = jnp.split(jax.nn.silu(conv), [ssm.inner_dim, ssm.inner_dim + ssm.groups *
                                            ssm.state_size], axis=-1)
    x = x.reshape(*x.shape[:2], ssm.num_heads, ssm.head_dim)
    B, C = (t.reshape(*t.shape[:2], ssm.groups, ssm.state_size) for t in (B, C))
    return x, B, C, jax.nn.softplus(dt.astype(jnp.float32) + w.dt_bias)


def _skip(w: MixerWeights, x: jax.Array) -> jax.Array:
    return (w.D[:, None] * x).astype(x.dtype)


def _conv_init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype) -> jax.Array:
    """PyTorch's Conv1d default (uniform with bound 1/sqrt(fan_in) = 1/sqrt(width))."""
    bound = 1.0 / math.sqrt(shape[0])
    return jax.random.uniform(key, shape, dtype, -bound, bound)


def _dt_bias_init(dt_min: float, dt_max: float):
    """dt log-uniform in [dt_min, dt_max], stored through the inverse softplus (Mamba's init)."""
    def init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype = jnp.float32) -> jax.Array:
        dt = jnp.exp(jax.random.uniform(key, shape, dtype, math.log(dt_min), math.log(dt_max)))
        return dt + jnp.log(-jnp.expm1(-dt))
    return init
