"""The multi-exit model as pure functions over a parameter pytree.

    params = {"embed": [V, D], "layers": <DecoderBlock params>, "final_norm": {"scale": [D]},
              "unembed": [D, V] (only when embeddings are untied)}

`layers` is stacked on a leading layer axis for training (`run_layers`, a `lax.scan`); decoding
takes it unstacked (`unstack_layers`, a tuple of per-layer pytrees) and runs the layer range in a
Python loop (`run_layers_cached`). On XLA:CPU a slice of a stacked weight inside the decode loop is
a copy; per-layer buffers are read in place. Both paths apply the same `DecoderBlock`.

A layer range is `(start, stop)`: layers start..stop-1, 0-based. Exit `e` is the hidden state after
`e` layers, so drafting with layers [0, E) and verifying with [E, L) splits at exit E. One shared
head (`exit_logits`: final norm + unembedding) reads any exit.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from specjax.cache import Cache
from specjax.config import ModelConfig
from specjax.nn import DecoderBlock
from specjax.nn.block import propagate_state
from specjax.nn.linear import matmul
from specjax.nn.norm import apply_rms_norm
from specjax.nn.rope import rope_tables

Params = dict[str, Any]


def init_params(cfg: ModelConfig, key: jax.Array) -> Params:
    """Random parameters with the layers stacked on a leading [num_layers] axis."""
    k_embed, k_layers, k_unembed = jax.random.split(key, 3)
    block = DecoderBlock(cfg)
    x = jnp.zeros((1, 1, cfg.d_model), cfg.compute_dtype)
    positions = jnp.zeros((1, 1), jnp.int32)
    mask = jnp.ones((1, 1, 1), bool)

    def init_layer(k):
        return block.init(k, x, rope_tables(cfg, positions), mask)["params"]

    params = {
        "embed": _normal(k_embed, (cfg.vocab_size, cfg.d_model), cfg),
        "layers": jax.vmap(init_layer)(jax.random.split(k_layers, cfg.num_layers)),
        "final_norm": {"scale": jnp.ones((cfg.d_model,), cfg.weight_dtype)},
    }
    if not cfg.tie_embeddings:
        params["unembed"] = _normal(k_unembed, (cfg.d_model, cfg.vocab_size), cfg)
    return params


def _normal(key: jax.Array, shape: tuple[int, ...], cfg: ModelConfig) -> jax.Array:
    return (cfg.init_std * jax.random.normal(key, shape)).astype(cfg.weight_dtype)


def embed(params: Params, cfg: ModelConfig, tokens: jax.Array) -> jax.Array:
    """Token ids [B, T] -> hidden states [B, T, D] in the compute dtype."""
    return params["embed"][tokens].astype(cfg.compute_dtype)


def exit_logits(params: Params, cfg: ModelConfig, hidden: jax.Array) -> jax.Array:
    """The shared exit head: final norm + unembedding of any layer's hidden state, float32."""
    return unembed(params, cfg, apply_rms_norm(hidden, params["final_norm"]["scale"], cfg))


def unembed(params: Params, cfg: ModelConfig, normed: jax.Array) -> jax.Array:
    """Logits [..., V] (float32) of normalised hidden states: the head without its norm."""
    if cfg.tie_embeddings:  # contract with the [V, D] table as stored: no transposed copy
        return matmul(normed, params["embed"].astype(cfg.compute_dtype), transpose_w=True,
                      out_dtype=jnp.float32)
    return matmul(normed, params["unembed"].astype(cfg.compute_dtype), out_dtype=jnp.float32)


def causal_mask(steps: int) -> jax.Array:
    """[1, T, T]: token t sees tokens 0..t."""
    return jnp.tril(jnp.ones((steps, steps), bool))[None]


def run_layers(params: Params, cfg: ModelConfig, hidden: jax.Array, *,
               layers: tuple[int, int] | None = None, positions: jax.Array | None = None,
               keep: jax.Array | None = None, remat: bool = False) -> jax.Array:
    """Runs a contiguous layer range over full sequences with `lax.scan` (no cache).

    Args:
      hidden: [B, T, D] input to layer `start`.
      layers: static (start, stop); default all layers.
      positions: [B, T] RoPE positions; default 0..T-1.
      keep: optional [stop - start, B] layer-dropout mask; a dropped layer passes its input
        through unchanged for that sample (LayerSkip: x_{l+1} = x_l + M * f_l(x_l)).
      remat: rematerialise each layer in the backward pass.
    Returns:
      [stop - start, B, T, D]: the hidden state after each layer; the last entry feeds the next
      range.
    """
    start, stop = layers or (0, cfg.num_layers)
    _check_range(cfg, start, stop)
    batch, steps, _ = hidden.shape
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(steps), (batch, steps))
    rope, mask = rope_tables(cfg, positions), causal_mask(steps)
    stacked = params["layers"]
    if (start, stop) != (0, cfg.num_layers):
        stacked = jax.tree.map(lambda w: w[start:stop], stacked)
    if keep is None:
        keep = jnp.ones((stop - start, batch), bool)

    def layer(h, xs):
        layer_params, keep_layer = xs
        out, _ = DecoderBlock(cfg).apply({"params": layer_params}, h, rope, mask)
        out = jnp.where(keep_layer[:, None, None], out, h)
        return out, out

    if remat:
        layer = jax.checkpoint(layer)
    _, per_layer = jax.lax.scan(layer, hidden, (stacked, keep))
    return per_layer


def run_layers_cached(params: Params, cfg: ModelConfig, hidden: jax.Array, cache: Cache,
                      write_pos: jax.Array, *, layers: tuple[int, int] | None = None,
                      positions: jax.Array | None = None,
                      mask: jax.Array | None = None) -> tuple[jax.Array, Cache]:
    """Runs a layer range on new tokens against the KV cache (decoding and prefill).

    The new tokens' K/V are written at slots `write_pos[b] + t` (or `write_pos[b, t]`) of each
    layer in the range; `cache.lengths` is not changed (see `Cache.commit`).

    Args:
      params: parameters with per-layer `layers` (see `unstack_layers`); stacked also works but
        copies each layer's weights inside a compiled loop.
      hidden: [B, T, D] input to layer `start`.
      write_pos: [B] cache slot of the first new token of each row (the rest follow it), or
        [B, T] the slot of every new token (a token tree, see `decoding.tree`).
      layers: static (start, stop); default all layers.
      positions: [B, T] RoPE positions; default write_pos + t (a chain; required for [B, T]).
      mask: [B, T, max_len] visibility of cache slots; default a chain: slot <= write_pos + t
        (required for [B, T]).
    Returns:
      The hidden state after layer stop-1, [B, T, D], and the updated cache.
    """
    start, stop = layers or (0, cfg.num_layers)
    _check_range(cfg, start, stop)
    steps = hidden.shape[1]
    if write_pos.ndim == 2 and (positions is None or mask is None):
        raise ValueError("per-token write slots need explicit positions and mask")
    if positions is None:
        positions = write_pos[:, None] + jnp.arange(steps)[None, :]
    if mask is None:
        mask = chain_mask(write_pos, steps, cache.max_len)
    rope = rope_tables(cfg, positions)
    block = DecoderBlock(cfg)
    new_layers = []
    for index in range(start, stop):
        hidden, layer_kv = block.apply({"params": layer_params(params, index)}, hidden, rope, mask,
                                       cache.layers[index], write_pos)
        new_layers.append(layer_kv)
    return hidden, cache.with_layers(start, tuple(new_layers))


def propagate_cached(params: Params, cfg: ModelConfig, hidden: jax.Array, cache: Cache,
                     write_pos: jax.Array, positions: jax.Array, *,
                     layers: tuple[int, int]) -> Cache:
    """Writes into each layer of the range the K/V it projects from the same hidden states
    [B, T, D] at slots `write_pos` ([B] or [B, T]) and RoPE `positions` [B, T], running no
    attention or MLP: the layers a token skipped after exiting early (CALM)."""
    start, stop = layers
    _check_range(cfg, start, stop)
    rope = rope_tables(cfg, positions)
    return cache.with_layers(start, tuple(
        propagate_state(cfg, layer_params(params, index), hidden, rope, cache.layers[index],
                        write_pos) for index in range(start, stop)))


def chain_mask(write_pos: jax.Array, steps: int, max_len: int) -> jax.Array:
    """[B, T, max_len]: new token t of row b sees cache slots 0 .. write_pos[b] + t."""
    last_visible = write_pos[:, None, None] + jnp.arange(steps)[None, :, None]
    return jnp.arange(max_len)[None, None, :] <= last_visible


def layer_params(params: Params, index: int) -> Params:
    """Parameters of layer `index`, from either the stacked or the unstacked layout."""
    layers = params["layers"]
    if isinstance(layers, (tuple, list)):
        return layers[index]
    return jax.tree.map(lambda w: w[index], layers)


def unstack_layers(params: Params) -> Params:
    """The decoding layout: `layers` as a tuple of per-layer pytrees."""
    stacked = params["layers"]
    num_layers = jax.tree.leaves(stacked)[0].shape[0]
    out = dict(params)
    out["layers"] = tuple(jax.tree.map(lambda w, i=i: w[i], stacked) for i in range(num_layers))
    return out


def forward(params: Params, cfg: ModelConfig, tokens: jax.Array) -> jax.Array:
    """Full-model logits [B, T, V] for tokens [B, T] (no cache)."""
    return exit_logits(params, cfg, run_layers(params, cfg, embed(params, cfg, tokens))[-1])


def _check_range(cfg: ModelConfig, start: int, stop: int) -> None:
    if not 0 <= start < stop <= cfg.num_layers:
        raise ValueError(f"layer range ({start}, {stop}) must satisfy "
                         f"0 <= start < stop <= num_layers={cfg.num_layers}")
