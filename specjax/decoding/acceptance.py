"""Accepting a proposal against the target model's distributions.

`accept` picks the rule from the proposal's static shape: a chain's (a prefix test) or a
tree's, greedy or sampled. Every rule returns the accepted count n, the emitted tokens
[B, D+1] (the round commits emitted[:, :n+1]: the accepted drafts, then one token from the
target, a correction or the bonus token) and, for trees, the accepted path of node ids.

A greedy tree accepts the deepest node whose whole path matches the target's argmaxes
(`_greedy_tree_path`). A sampled tree decides every position independently and in parallel:
which of its children the target accepts, if any, and the token it would emit if none is
(`_sampled_decisions`); `tree.walk` then follows the accepted children from the root. The
randomness of each position is its own, so this equals visiting the accepted path in order.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from specjax.decoding.proposal import Proposal
from specjax.decoding.sampling import SamplingParams, probabilities, sample
from specjax.decoding.shapes.tree import ancestor_matrix, children_table, walk
from specjax.nn.cache import along_path


@flax.struct.dataclass
class Acceptance:
    """num_accepted [B]; emitted [B, D+1]; path [B, D], the accepted node ids in root-to-leaf
    order (past num_accepted: each entry its own index), None for a chain (the first n)."""

    num_accepted: jax.Array
    emitted: jax.Array
    path: jax.Array | None


def accept(key: jax.Array, proposal: Proposal, target_logits: jax.Array,
           sampling: SamplingParams | None) -> Acceptance:
    """The accepted part of `proposal` given target logits [B, 1+T, V] at the pending token
    and every node; greedy when `sampling` is None, else lossless speculative sampling."""
    shape = proposal.shape
    target_probs = None if sampling is None else probabilities(target_logits, sampling)
    if shape.is_chain:
        num_valid = jnp.sum(proposal.valid, axis=1, dtype=jnp.int32)
        if sampling is None:
            count, emitted = greedy_accept(proposal.tokens, target_logits, num_valid)
        else:
            count, emitted = speculative_accept(key, proposal.tokens, proposal.q, target_probs,
                                                num_valid)
        return Acceptance(count, emitted, None)
    if sampling is None:
        target = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)
        path, count = _greedy_tree_path(proposal, target, shape.depth)
        # An accepted node's token is the target's argmax at its parent: emit argmaxes along
        # the path, ending with the one at the last accepted node (the bonus token).
        return Acceptance(count, along_path(target, path), path)
    accept_key, final_key = jax.random.split(key)
    children = children_table(proposal.parents, shape.max_children)
    accepted_child, leftover = _sampled_decisions(accept_key, proposal, target_probs, children)
    path, count, last = walk(accepted_child, shape.depth)
    drafted = jnp.take_along_axis(proposal.tokens, path, axis=1)
    # The last accepted node rejected all its children (or has none): draw from what is left.
    final = sample(final_key, jnp.take_along_axis(leftover, last[:, None, None], axis=1))
    steps = jnp.arange(shape.depth + 1)[None, :]
    emitted = jnp.where(steps < count[:, None], jnp.pad(drafted, ((0, 0), (0, 1))), final)
    return Acceptance(count, emitted, path)


def greedy_accept(draft: jax.Array, target_logits: jax.Array,
                  num_valid: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Longest prefix of the first `num_valid` [B] drafts that equals the target's argmax, plus
    the target's next token.

    draft [B, K], target_logits [B, K+1, V]. Where drafts match, the target argmax *is* the
    draft, so the emitted tokens are simply the target argmaxes.
    """
    target = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)
    matches = (draft == target[:, :draft.shape[1]]) & _valid(draft, num_valid)
    return _prefix_length(matches), target


def speculative_accept(key: jax.Array, draft: jax.Array, draft_probs: jax.Array,
                       target_probs: jax.Array,
                       num_valid: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Leviathan et al. / Chen et al. speculative sampling, lossless for any draft q.

    Draft token x_i (drawn from q_i) is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at
    the first rejection the replacement is drawn from norm(max(0, p_i - q_i)); if all K are
    accepted a bonus token is drawn from p_K. Only a row's first `num_valid` [B] drafts count;
    after them q is taken as zero, so the next token is drawn from p.

    draft [B, K]; draft_probs q [B, K, V]; target_probs p [B, K+1, V].
    """
    batch, num_draft = draft.shape
    accept_key, resample_key = jax.random.split(key)
    valid = _valid(draft, num_valid)
    draft_probs = jnp.where(valid[..., None], draft_probs, 0.0)
    p_draft = jnp.take_along_axis(target_probs[:, :num_draft], draft[..., None], -1)[..., 0]
    q_draft = jnp.take_along_axis(draft_probs, draft[..., None], -1)[..., 0]
    uniform = jax.random.uniform(accept_key, (batch, num_draft))
    num_accepted = _prefix_length(_accepts(uniform, p_draft, q_draft) & valid)
    # Residual at the stopping position; where q is zero (after the valid drafts) it is p.
    q_padded = jnp.pad(draft_probs, ((0, 0), (0, 1), (0, 0)))
    index = num_accepted[:, None, None]
    p_stop = jnp.take_along_axis(target_probs, index, axis=1)[:, 0]
    final = sample(resample_key, residual(p_stop, jnp.take_along_axis(q_padded, index,
                                                                      axis=1)[:, 0]))
    positions = jnp.arange(num_draft + 1)[None, :]
    padded_draft = jnp.pad(draft, ((0, 0), (0, 1)))
    emitted = jnp.where(positions == num_accepted[:, None], final[:, None], padded_draft)
    return num_accepted, emitted


def residual(p: jax.Array, q: jax.Array) -> jax.Array:
    """norm(max(0, p - q)) over the last axis: what a rejection leaves to draw from (p itself
    where nothing is left, i.e. where p <= q everywhere and the draft was always accepted)."""
    rest = jnp.maximum(p - q, 0.0)
    mass = jnp.sum(rest, axis=-1, keepdims=True)
    return jnp.where(mass > 0, rest / jnp.where(mass > 0, mass, 1.0), p)


def _accepts(uniform: jax.Array, p: jax.Array, q: jax.Array) -> jax.Array:
    """Accept a draft x with probability min(1, p(x) / q(x)), given uniform draws."""
    return uniform * q < p


def _greedy_tree_path(proposal: Proposal, target: jax.Array,
                      max_depth: int) -> tuple[jax.Array, jax.Array]:
    """The deepest node (the first in index order among equals) whose every path node is valid
    and equals the target's argmax `target` [B, 1+T] at its parent: its path [B, D] (entries
    past the depth hold their own index) and depth [B]. Exact even when siblings repeat a
    token."""
    ancestors = ancestor_matrix(proposal.parents)[:, 1:, 1:]                # [B, T, T]
    at_parent = jnp.take_along_axis(target, proposal.parents + 1, axis=1)
    good = proposal.valid & (proposal.tokens == at_parent)
    reached = ~jnp.any(ancestors & ~good[:, None, :], axis=-1)
    depth = jnp.sum(ancestors, axis=-1, dtype=jnp.int32)
    best = jnp.argmax(jnp.where(reached, depth, 0), axis=1)
    count = jnp.max(jnp.where(reached, depth, 0), axis=1)
    on_path = jnp.take_along_axis(ancestors, best[:, None, None], axis=1)[:, 0]  # [B, T]
    steps = jnp.arange(max_depth)
    at_step = on_path[:, None, :] & (depth[:, None, :] == steps[None, :, None] + 1)
    path = jnp.where(steps[None, :] < count[:, None], jnp.argmax(at_step, axis=-1), steps)
    return path.astype(jnp.int32), count.astype(jnp.int32)


def _sampled_decisions(key: jax.Array, proposal: Proposal, target_probs: jax.Array,
                       children: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Multi-draft speculative sampling at every position: its children are tried in order
    against a running target distribution, the first accepted one wins, and if none is the
    token is drawn from what the rejections left. Returns the accepted child per position
    [B, 1+T] (-1: none) and that leftover distribution [B, 1+T, V].

    Child i, drawn from q_i, is accepted with probability min(1, p_i(x_i) / q_i(x_i)); a
    rejection leaves p_{i+1} = norm(max(0, p_i - q_i)). q_i follows how the children were drawn
    (`proposal.shape.children`): "iid", q_i = q; "without_replacement", q with the earlier
    siblings removed and renormalised (RSD, SpecExec); "top_k" (deterministic), q_i = the point
    mass on x_i, so x_i is accepted with p_i(x_i) and removed from p on rejection.
    """
    rule = proposal.shape.children
    uniform = jax.random.uniform(key, children.shape)
    running = target_probs
    accepted = jnp.full(children.shape[:2], -1, jnp.int32)
    drawn_from = None
    if rule != "top_k":  # every child of a position was drawn from its parent's q
        drawn_from = _take_nodes(proposal.q, children[..., 0])
    for rank in range(children.shape[-1]):
        child = children[..., rank]
        token, valid = _node_values(proposal, child)
        q_i = (jax.nn.one_hot(token, running.shape[-1], dtype=running.dtype)
               if rule == "top_k" else drawn_from)
        tried = valid & (accepted < 0)
        p_x = jnp.take_along_axis(running, token[..., None], axis=-1)[..., 0]
        q_x = jnp.take_along_axis(q_i, token[..., None], axis=-1)[..., 0]
        hit = tried & _accepts(uniform[..., rank], p_x, q_x)
        accepted = jnp.where(hit, child, accepted)
        running = jnp.where((tried & ~hit)[..., None], residual(running, q_i), running)
        if rule == "without_replacement":
            removed = jnp.where(jax.nn.one_hot(token, q_i.shape[-1], dtype=bool), 0.0, q_i)
            drawn_from = jnp.where(valid[..., None], _normalise(removed), drawn_from)
    return accepted, running


def _node_values(proposal: Proposal, node: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Token and validity of node ids [B, P] (-1: no node, never valid)."""
    index = jnp.maximum(node, 0)
    token = jnp.take_along_axis(proposal.tokens, index, axis=1)
    return token, (node >= 0) & jnp.take_along_axis(proposal.valid, index, axis=1)


def _take_nodes(values: jax.Array, node: jax.Array) -> jax.Array:
    """values [B, T, ...] at node ids [B, P] (-1 reads node 0; callers mask it)."""
    index = jnp.maximum(node, 0).reshape(node.shape + (1,) * (values.ndim - 2))
    return jnp.take_along_axis(values, index, axis=1)


def _normalise(weights: jax.Array) -> jax.Array:
    mass = jnp.sum(weights, axis=-1, keepdims=True)
    return weights / jnp.where(mass > 0, mass, 1.0)


def _prefix_length(flags: jax.Array) -> jax.Array:
    """Number of leading True values per row of flags [B, K]."""
    return jnp.sum(jnp.cumprod(flags.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)


def _valid(draft: jax.Array, num_valid: jax.Array) -> jax.Array:
    """[B, K]: which drafts count."""
    return jnp.arange(draft.shape[1])[None, :] < num_valid[:, None]
