"""The Mamba-2 layer's three mixings agree: whole sequences (chunked scan, causal conv), a prefill
that commits ragged prompts, and cached passes over chains and token trees (tree scan, conv along
each path) whose accepted path the commit folds into the state."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.config import ModelConfig, SsmConfig
from specjax.nn.cache import LayerSSM
from specjax.nn.mamba2 import Cached, Mamba2Block, Prefill, Sequence
from tests.nn.test_ssd import paths, random_tree

CFG = ModelConfig(vocab_size=11, d_model=24, num_layers=1, num_heads=2, num_kv_heads=1, mlp_dim=40,
                  init_std=0.3,
                  layer_pattern=("mamba2",),
                  ssm=SsmConfig(num_heads=4, head_dim=6, state_size=5, groups=2, chunk_size=5,
                                dt_min=0.05, dt_max=0.5))
BLOCK = Mamba2Block(CFG)
LENGTH = 13
PARAMS = BLOCK.init(jax.random.PRNGKey(0), jnp.zeros((1, 1, CFG.d_model)), Sequence())["params"]


def hidden(seed, length=LENGTH, batch=2):
    return jax.random.normal(jax.random.PRNGKey(seed), (batch, length, CFG.d_model))


@jax.jit
def sequence(x):
    return BLOCK.apply({"params": PARAMS}, x, Sequence())[0]


def last_of_each(sequences):
    """The whole-sequence output at the last token of each of several sequences, in one
    compiled call (right-padded: the pass is causal)."""
    width = max(len(t) for t in sequences)
    padded = jnp.stack([jnp.pad(t, [(0, width - len(t)), (0, 0)]) for t in sequences])
    out = sequence(padded)
    return jnp.stack([out[i, len(t) - 1] for i, t in enumerate(sequences)])


@functools.partial(jax.jit, static_argnames="window")
def prefill(x, lengths, window):
    cache = LayerSSM.allocate(CFG, x.shape[0], window)
    return BLOCK.apply({"params": PARAMS}, x, Prefill(cache, lengths))


@jax.jit
def cached(x, cache, lengths, slots, mask):
    return BLOCK.apply({"params": PARAMS}, x, Cached(cache, lengths, slots, mask))


def chain_mask(lengths, steps, max_len):
    slots = lengths[:, None] + jnp.arange(steps)[None, :]
    return slots, jnp.arange(max_len)[None, None, :] <= slots[:, :, None]


def test_prefill_then_one_token_at_a_time_equals_the_whole_sequence():
    """Ragged prompts (13 and 4 tokens: padding after the second) prefilled, then each later
    token decoded alone and committed: every output equals the whole-sequence pass. Catches a
    prefill whose state or conv history includes padding, a conv history taken at the wrong
    offset, and a commit that folds the wrong window slots."""
    x = hidden(1, LENGTH + 6)
    expected = sequence(x)
    lengths = jnp.asarray([LENGTH, 4])
    out, cache = prefill(x[:, :LENGTH], lengths, window=1)
    np.testing.assert_allclose(out[0], expected[0, :LENGTH], rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(out[1, :4], expected[1, :4], rtol=2e-4, atol=2e-4)
    for t in range(6):
        position = lengths
        token = jnp.take_along_axis(x, position[:, None, None], axis=1)
        slots, mask = chain_mask(position, 1, 64)
        out, cache = cached(token, cache, position, slots, mask)
        want = jnp.take_along_axis(expected, position[:, None, None], axis=1)
        np.testing.assert_allclose(out, want, rtol=2e-4, atol=2e-4, err_msg=f"step {t}")
        cache = cache.commit(lengths, lengths + 1, None)
        lengths = lengths + 1


@pytest.mark.parametrize("accepted", [0, 1, 3])
def test_a_tree_pass_equals_each_path_and_the_commit_keeps_only_the_accepted_one(accepted):
    """A token tree (a different random one per row, with padding nodes) after prefilled
    prompts: each node's output equals the whole-sequence pass over prompt + its path; after
    committing the pending token and `accepted` nodes of a deepest path, the next token's output
    equals the whole-sequence pass over prompt + that path + it. Catches siblings leaking into
    the scan or the conv, and rejected nodes left in the state or the conv history."""
    rng = np.random.default_rng(accepted)
    size, prompt = 9, 7
    parents = np.stack([random_tree(rng, size, padding) for padding in (0, 2)])
    parents[:, 1:] = np.maximum(parents[:, 1:], 0)      # position 0, the pending token, is the root
    ancestry = np.stack([paths(p) for p in parents])                       # [B, size, size]
    prefix = hidden(10 + accepted, prompt)
    tree_x = hidden(20 + accepted, size)
    lengths = jnp.full((2,), prompt)
    _, cache = prefill(prefix, lengths, window=size)
    max_len = 32
    slots = lengths[:, None] + jnp.arange(size)[None, :]
    columns = jnp.arange(max_len)[None, None, :] - lengths[:, None, None]
    in_tree = jnp.take_along_axis(jnp.asarray(ancestry), jnp.clip(columns, 0, size - 1)
                                  .repeat(size, axis=1), axis=2) & (columns >= 0) & (columns < size)
    mask = (columns < 0) | in_tree
    out, cache = cached(tree_x, cache, lengths, slots, mask)
    wholes = last_of_each([jnp.concatenate([prefix[row], tree_x[row, np.flatnonzero(
        ancestry[row, node])]]) for row in range(2) for node in range(size)])
    np.testing.assert_allclose(out.reshape(wholes.shape), wholes, rtol=2e-4, atol=2e-4)

    deepest = [np.flatnonzero(ancestry[row, int(np.argmax(ancestry[row].sum(1)))])
               for row in range(2)]
    kept = [path[1:accepted + 1] for path in deepest]                       # nodes after the root
    path = jnp.asarray([np.pad(k, (0, size - 1 - len(k))) - 1 for k in kept])
    after = lengths + 1 + jnp.asarray([len(k) for k in kept])
    cache = cache.commit(lengths, after, path)
    nxt = hidden(30 + accepted, 1)
    slots, mask = chain_mask(after, 1, max_len)
    out, _ = cached(nxt, cache, after, slots, mask)
    wholes = last_of_each([jnp.concatenate([prefix[row], tree_x[row, np.concatenate(
        [[0], kept[row]]).astype(int)], nxt[row]]) for row in range(2)])
    np.testing.assert_allclose(out[:, 0], wholes, rtol=2e-4, atol=2e-4)
