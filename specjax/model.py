"""The multi-exit model as pure functions over a parameter pytree.

    params = {"embed": [V, D], "layers": <attention layers>, "mamba2_layers": <Mamba-2 layers>,
              "final_norm": {"scale": [D]}, "unembed": [D, V] (only when embeddings are untied)}

Layers are of the kinds `cfg.layer_pattern` names (`nn.layer_kinds`; all attention by default).
For training each kind's layers are stacked on a leading axis under the kind's key (a kind the
pattern lacks has no key), and `run_layers` scans each run of consecutive layers of one kind
and variant (`layer_variant`: e.g. a NoPE layer among rotating ones) with `lax.scan`.
Decoding takes the layers unstacked (`unstack_layers`: `layers` becomes a tuple of per-layer
pytrees in model order) and runs the layer range in a Python loop
(`run_layers_cached`). On XLA:CPU a slice of a stacked weight inside the decode loop is a copy;
per-layer buffers are read in place. Both paths apply the same layer modules.

A layer range is `(start, stop)`: layers start..stop-1, 0-based. Exit `e` is the hidden state after
`e` layers, so drafting with layers [0, E) and verifying with [E, L) splits at exit E. One shared
head (`exit_logits`: final norm + unembedding) reads any exit.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.nn.attention import softcap
from specjax.nn.cache import Cache
from specjax.nn.layer_kinds import LAYER_KINDS, Step, check_layer_kinds
from specjax.nn.linear import matmul
from specjax.nn.mtp import init_mtp
from specjax.nn.norm import apply_rms_norm, norm_init
from specjax.nn.rope import Rope, rope_tables
from specjax.sharding import constrain_cache

Params = dict[str, Any]
# `jax.checkpoint` policies by name (see `run_layers`); "none" does not rematerialise.
REMAT_POLICIES = {"dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable, "full": None}


@functools.partial(jax.jit, static_argnums=0)
def init_params(cfg: ModelConfig, key: jax.Array) -> Params:
    """Random parameters, each kind's layers stacked on a leading axis (layer i drawn from the
    i-th of `num_layers` keys, whatever its kind). One program per config: run op by op, the
    tiny test model's init compiled 180 small programs (2.1 s on a CPU, against 0.5 s)."""
    check_layer_kinds(cfg)
    k_embed, k_layers, k_unembed = jax.random.split(key, 3)
    layer_keys = jax.random.split(k_layers, cfg.num_layers)
    params = {"embed": _normal(k_embed, (cfg.vocab_size, cfg.d_model), cfg)}
    for name in dict.fromkeys(cfg.layer_kinds):
        kind = LAYER_KINDS[name]
        indices = jnp.asarray([i for i, k in enumerate(cfg.layer_kinds) if k == name])
        params[kind.params_key] = jax.vmap(lambda k, kind=kind: kind.init(cfg, k))(
            layer_keys[indices])
    params["final_norm"] = {"scale": norm_init(cfg)(key, (cfg.d_model,), cfg.weight_dtype)}
    if not cfg.tie_embeddings:
        params["unembed"] = _normal(k_unembed, (cfg.d_model, cfg.vocab_size), cfg)
    if cfg.mtp_depth:  # its own key: a model without them draws the same weights
        params["mtp"] = init_mtp(cfg, jax.random.fold_in(key, MTP_KEY), cfg.mtp_depth)
    return params


MTP_KEY = 7  # folded into the init key for the MTP modules


def _normal(key: jax.Array, shape: tuple[int, ...], cfg: ModelConfig) -> jax.Array:
    return (cfg.init_std * jax.random.normal(key, shape)).astype(cfg.weight_dtype)


def embed(params: Params, cfg: ModelConfig, tokens: jax.Array) -> jax.Array:
    """Token ids [B, T] -> hidden states [B, T, D] in the compute dtype (times sqrt(d_model)
    where `cfg.scale_embeddings`: Gemma)."""
    hidden = params["embed"][tokens].astype(cfg.compute_dtype)
    if cfg.scale_embeddings:
        hidden = hidden * jnp.asarray(cfg.d_model ** 0.5, cfg.compute_dtype)
    return hidden


def exit_logits(params: Params, cfg: ModelConfig, hidden: jax.Array) -> jax.Array:
    """The shared exit head: final norm + unembedding (soft-capped where the config says) of
    any layer's hidden state, float32."""
    return unembed(params, cfg, apply_rms_norm(hidden, params["final_norm"]["scale"], cfg))


def unembed(params: Params, cfg: ModelConfig, normed: jax.Array) -> jax.Array:
    """Logits [..., V] (float32) of normalised hidden states: the head without its norm,
    soft-capped to `cfg.logit_softcap` (Gemma-2) at every exit."""
    if cfg.tie_embeddings:  # contract with the [V, D] table as stored: no transposed copy
        logits = matmul(normed, params["embed"].astype(cfg.compute_dtype), transpose_w=True,
                        out_dtype=jnp.float32)
    else:
        logits = matmul(normed, params["unembed"].astype(cfg.compute_dtype),
                        out_dtype=jnp.float32)
    return softcap(logits, cfg.logit_softcap)


def causal_mask(steps: int) -> jax.Array:
    """[1, T, T]: token t sees tokens 0..t."""
    return jnp.tril(jnp.ones((steps, steps), bool))[None]


def run_layers(params: Params, cfg: ModelConfig, hidden: jax.Array, *,
               layers: tuple[int, int] | None = None, positions: jax.Array | None = None,
               keep: jax.Array | None = None, remat: str = "none") -> jax.Array:
    """Runs a contiguous layer range over full sequences with `lax.scan` (no cache).

    Args:
      hidden: [B, T, D] input to layer `start`.
      layers: static (start, stop); default all layers.
      positions: [B, T] RoPE positions; default 0..T-1.
      keep: optional [stop - start, B] layer-dropout mask; a dropped layer passes its input
        through unchanged for that sample (LayerSkip: x_{l+1} = x_l + M * f_l(x_l)).
      remat: what each layer's backward pass recomputes instead of storing: "none", "dots"
        (all but the outputs of products with a weight) or "full" (only the layer's input kept).
    Returns:
      [stop - start, B, T, D]: the hidden state after each layer; the last entry feeds the next
      range.
    """
    start, stop = layers or (0, cfg.num_layers)
    _check_range(cfg, start, stop)
    batch, steps, _ = hidden.shape
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(steps), (batch, steps))
    if keep is None:
        keep = jnp.ones((stop - start, batch), bool)
    per_layer = []
    for name, first, last in layer_runs(cfg, start, stop):
        kind = LAYER_KINDS[name]
        rank = _rank(cfg, first)
        stacked = jax.tree.map(lambda w, rank=rank, n=last - first: w[rank:rank + n],
                               params[kind.params_key])

        rope, mask = layer_inputs(cfg, first, positions, causal_mask(steps), positions)

        def layer(h, xs, kind=kind, rope=rope, mask=mask):
            layer_params, keep_layer = xs
            out = kind.forward(cfg, layer_params, h, rope, mask)
            out = jnp.where(keep_layer[:, None, None], out, h)
            return out, out

        if remat != "none":
            layer = jax.checkpoint(layer, policy=REMAT_POLICIES[remat])
        hidden, outs = jax.lax.scan(layer, hidden, (stacked, keep[first - start:last - start]))
        per_layer.append(outs)
    return jnp.concatenate(per_layer) if len(per_layer) > 1 else per_layer[0]


def layer_runs(cfg: ModelConfig, start: int, stop: int) -> list[tuple[str, int, int]]:
    """The maximal runs of consecutive layers of one kind and variant (`layer_variant`) in
    [start, stop): (kind, first, stop)."""
    runs: list[tuple[str, int, int]] = []
    for index in range(start, stop):
        name = cfg.layer_kinds[index]
        if runs and layer_variant(cfg, runs[-1][1]) == layer_variant(cfg, index):
            runs[-1] = (name, runs[-1][1], index + 1)
        else:
            runs.append((name, index, index + 1))
    return runs


def layer_variant(cfg: ModelConfig, index: int) -> tuple[str, bool, bool]:
    """What a layer's computation takes from its index beyond its weights (static): its kind,
    whether it applies RoPE, whether it attends over a sliding window. One `lax.scan` runs
    layers of one variant."""
    return (cfg.layer_kinds[index], index not in cfg.nope_layers,
            index in cfg.sliding_layers)


def layer_inputs(cfg: ModelConfig, index: int, positions: jax.Array, mask: jax.Array,
                 key_positions: jax.Array) -> tuple[Rope | None, jax.Array]:
    """The RoPE tables and the mask layer `index` applies, given the new tokens' positions
    [B, T], the model's mask [1 or B, T, S] and the positions [1 or B, S] of what they attend
    to: no tables in a NoPE layer; in a sliding layer, `local_rope_theta`'s tables (Gemma-3)
    and only keys less than `sliding_window` positions back (transformers' rule)."""
    _, rotates, sliding = layer_variant(cfg, index)
    theta = cfg.local_rope_theta if sliding else None
    rope = rope_tables(cfg, positions, theta) if rotates else None
    if sliding:
        mask = mask & (key_positions[:, None, :] > positions[:, :, None] - cfg.sliding_window)
    return rope, mask


def _rank(cfg: ModelConfig, index: int) -> int:
    """Layer `index`'s position in its kind's stack."""
    return cfg.layer_kinds[:index].count(cfg.layer_kinds[index])


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
        [B, T] the slot of every new token (a token tree, see `decoding.shapes.tree`).
      layers: static (start, stop); default all layers.
      positions: [B, T] RoPE positions; default write_pos + t (a chain; required for [B, T]).
      mask: [B, T, max_len] visibility of cache slots; default a chain: slot <= write_pos + t
        (required for [B, T]).
    Returns:
      The hidden state after layer stop-1, [B, T, D], and the updated cache.
    """
    steps = hidden.shape[1]
    if write_pos.ndim == 2 and (positions is None or mask is None):
        raise ValueError("per-token write slots need explicit positions and mask")
    if positions is None:
        positions = write_pos[:, None] + jnp.arange(steps)[None, :]
    if mask is None:
        mask = chain_mask(write_pos, steps, cache.max_len)
    step = Step(None, mask, write_pos, cache.lengths)
    return _run_cached(params, cfg, hidden, cache, step, positions,
                       layers or (0, cfg.num_layers))


def prefill_cached(params: Params, cfg: ModelConfig, hidden: jax.Array, cache: Cache,
                   prompt_lengths: jax.Array, *,
                   layers: tuple[int, int] | None = None) -> tuple[jax.Array, Cache]:
    """Runs a layer range over right-padded prompts [B, P, D] from slot 0 of an empty cache,
    each layer committing the first `prompt_lengths[b]` tokens of row b itself (attention
    layers write every slot; state-space layers keep the state after the last real token);
    `Cache.prefilled` then sets the lengths. Returns the hidden state after the range."""
    batch, steps, _ = hidden.shape
    write_pos = jnp.zeros((batch,), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(steps), (batch, steps))
    step = Step(None, chain_mask(write_pos, steps, cache.max_len), write_pos, cache.lengths,
                prompt_lengths)
    return _run_cached(params, cfg, hidden, cache, step, positions,
                       layers or (0, cfg.num_layers))


def _run_cached(params: Params, cfg: ModelConfig, hidden: jax.Array, cache: Cache, step: Step,
                positions: jax.Array, layers: tuple[int, int]) -> tuple[jax.Array, Cache]:
    start, stop = layers
    _check_range(cfg, start, stop)
    new_layers = []
    for index in range(start, stop):
        kind = LAYER_KINDS[cfg.layer_kinds[index]]
        hidden, layer_cache = kind.cached(cfg, layer_params(params, cfg, index), hidden,
                                          cache.layers[index],
                                          _layer_step(cfg, index, step, positions))
        new_layers.append(layer_cache)
    return hidden, cache.with_layers(start, tuple(new_layers))


def _layer_step(cfg: ModelConfig, index: int, step: Step, positions: jax.Array) -> Step:
    """`step` (its `rope` unset) for layer `index` (`layer_inputs`). A cache slot's key is at
    the position of the slot's index: exactly so for committed tokens and a chain's; a tree
    node's slot is at least its position, which a window wider than a round's tokens cannot
    tell apart (`allocate_cache` refuses narrower ones)."""
    rope, mask = layer_inputs(cfg, index, positions, step.mask,
                              jnp.arange(step.mask.shape[-1])[None])
    return step._replace(rope=rope, mask=mask)


def propagate_cached(params: Params, cfg: ModelConfig, hidden: jax.Array, cache: Cache,
                     write_pos: jax.Array, positions: jax.Array, mask: jax.Array, *,
                     layers: tuple[int, int]) -> Cache:
    """Writes into each layer of the range the state it derives from the same hidden states
    [B, T, D] at slots `write_pos` ([B] or [B, T]), RoPE `positions` [B, T] and visible slots
    `mask` [B, T, max_len], running no attention or MLP: the layers a token skipped after
    exiting early (CALM)."""
    start, stop = layers
    _check_range(cfg, start, stop)
    step = Step(None, mask, write_pos, cache.lengths)
    return cache.with_layers(start, tuple(
        LAYER_KINDS[cfg.layer_kinds[index]].propagate(
            cfg, layer_params(params, cfg, index), hidden, cache.layers[index],
            _layer_step(cfg, index, step, positions))
        for index in range(start, stop)))


def allocate_cache(cfg: ModelConfig, batch: int, max_len: int, window: int = 1) -> Cache:
    """Zero-filled caches for `batch` rows of at most `max_len` slots each, every layer's of its
    kind; `window`: the most tokens a round puts after the committed length (1 + the proposal's
    nodes), which state-space layers keep uncommitted (`check_window`)."""
    check_window(cfg, window)
    layers = tuple(LAYER_KINDS[name].allocate(cfg, batch, max_len, window)
                   for name in cfg.layer_kinds)
    return constrain_cache(Cache(layers=layers, lengths=jnp.zeros((batch,), jnp.int32),
                                 max_len=max_len), batch)


def check_window(cfg: ModelConfig, window: int) -> None:
    """A one-line error when sliding-window layers would decode rounds of `window` tokens (1 +
    the drafts): a window narrower than a round cannot tell a tree node's slot from its
    position (`_layer_step`)."""
    if cfg.sliding_layers and window > cfg.sliding_window:
        raise ValueError(f"ModelConfig.sliding_window={cfg.sliding_window} is narrower than a "
                         f"decoding round's {window} tokens (1 + the drafts): draft fewer")


def chain_mask(write_pos: jax.Array, steps: int, max_len: int) -> jax.Array:
    """[B, T, max_len]: new token t of row b sees cache slots 0 .. write_pos[b] + t."""
    last_visible = write_pos[:, None, None] + jnp.arange(steps)[None, :, None]
    return jnp.arange(max_len)[None, None, :] <= last_visible


def layer_params(params: Params, cfg: ModelConfig, index: int) -> Params:
    """Parameters of layer `index`, from either the stacked or the unstacked layout."""
    layers = params.get("layers")
    if isinstance(layers, (tuple, list)):
        return layers[index]
    rank = _rank(cfg, index)
    return jax.tree.map(lambda w: w[rank], params[LAYER_KINDS[cfg.layer_kinds[index]].params_key])


def unstack_layers(params: Params, cfg: ModelConfig) -> Params:
    """The decoding layout: `layers` as a tuple of per-layer pytrees in model order (and no
    per-kind stacks)."""
    out = {k: v for k, v in params.items()
           if k not in {kind.params_key for kind in LAYER_KINDS.values()}}
    out["layers"] = tuple(layer_params(params, cfg, i) for i in range(cfg.num_layers))
    return out


def matmul_weights(params: Params, cfg: ModelConfig) -> list[tuple[str, Any]]:
    """(top-level key, weight) for every weight a token's pass multiplies by, from per-layer
    params (`unstack_layers`; arrays or shape structs): matrices of any rank and the tied
    embedding (as the head), not an untied embedding (only gathered from) nor depthwise filters
    (`LayerKind.depthwise`: Mamba-2's conv)."""
    depthwise = {name for kind in LAYER_KINDS.values() for name in kind.depthwise}
    weights = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        top = getattr(path[0], "key", None)
        if not (len(leaf.shape) < 2 or (top == "embed" and not cfg.tie_embeddings)
                or getattr(path[-1], "key", None) in depthwise):
            weights.append((top, leaf))
    return weights


def forward(params: Params, cfg: ModelConfig, tokens: jax.Array) -> jax.Array:
    """Full-model logits [B, T, V] for tokens [B, T] (no cache)."""
    return exit_logits(params, cfg, run_layers(params, cfg, embed(params, cfg, tokens))[-1])


def _check_range(cfg: ModelConfig, start: int, stop: int) -> None:
    if not 0 <= start < stop <= cfg.num_layers:
        raise ValueError(f"layer range ({start}, {stop}) must satisfy "
                         f"0 <= start < stop <= num_layers={cfg.num_layers}")
