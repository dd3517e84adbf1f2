"""The generate loop: a prefill stage, then one `lax.while_loop` of rounds.

A round is propose (the drafter) -> verify (one target pass, `verify.verify`) -> accept (the
rule the proposal's shape implies, `acceptance.accept`) -> commit (the target cache, the
drafter's state, the output). One compiled program per (model config, drafter, static shapes,
greedy or sampling). Rows are independent: each keeps its own committed length, output count,
done flag and statistics, and a finished row simply stops committing while the others go on;
statistics count only committed tokens. The host sees nothing until the loop ends
(`Generator.stream` compiles a second program that hands each round over, `streaming`).

Each output slot also gets, written with its token, the draft depth it was accepted at and
whatever per-position values the verification reports (`Verified.trace`: CALM's exit and
confidence), so the per-round record (drafts accepted per round, acceptance by depth, drafts
shaded in text) costs no host round-trip (`DecodeOutput.trace`, `Generation.trace`).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.decoding import streaming
from specjax.decoding.acceptance import Acceptance, accept
from specjax.decoding.drafter import DraftContext, Drafter, Prefilled, Round, at_positions
from specjax.decoding.proposal import Proposal
from specjax.decoding.sampling import SamplingParams, probabilities, sample, token_logprobs
from specjax.decoding.stop_strings import StopTable, advance
from specjax.decoding.verify import Verified
from specjax.heads.vocab_subset import DraftVocab
from specjax.model import Params, allocate_cache, embed, exit_logits, prefill_cached
from specjax.nn.cache import Cache, along_path

DEPTH = "depth"  # the loop's own per-token trace; the verifier's traces sit beside it
LOGPROB = "logprob"  # with `logprobs`: each token's log-probability under the target


@flax.struct.dataclass
class DecodeStats:
    """Per-row counters [B]: rounds run, nodes drafted (valid ones), drafts committed,
    positions verified (the pending token and the nodes each pass ran), and the drafter's own
    counters (`Proposal.stats`, summed over rounds)."""

    rounds: jax.Array
    drafted: jax.Array
    accepted: jax.Array
    verified: jax.Array
    extra: dict[str, jax.Array]

    def add(self, active: jax.Array, proposal: Proposal, kept: jax.Array,
            positions: jax.Array) -> DecodeStats:
        """These counters after a round that drafted `proposal`, kept `kept` [B] tokens (its
        accepted drafts and the target's one, 0 for rows that are done) and verified
        `positions`, in the rows `active` [B]."""
        return DecodeStats(
            rounds=self.rounds + active,
            drafted=self.drafted + active * jnp.sum(proposal.valid, axis=1, dtype=jnp.int32),
            accepted=self.accepted + jnp.maximum(kept - 1, 0),
            verified=self.verified + active * positions,
            extra={name: total + active * proposal.stats[name]
                   for name, total in self.extra.items()})


@flax.struct.dataclass
class DecodeOutput:
    """tokens [B, max_new_tokens + D + 1] (row b valid up to num_tokens[b]), statistics, and
    per-token traces ({name: [B, same width]}): "depth", the draft depth each token was
    accepted at (0: the target's own token, the prefill's included), and the verifier's (e.g.
    CALM's exit and confidence of each token; -1 for the prefill's token); with `logprobs`,
    "logprob": the log-probability of each token under the distribution the target verified
    it with (`sampling.token_logprobs`)."""

    tokens: jax.Array
    num_tokens: jax.Array
    stats: DecodeStats
    trace: dict[str, jax.Array]


@flax.struct.dataclass
class LoopState:
    """The loop's carry. B rows, N = max_new_tokens + D + 1 output slots (D: the deepest
    proposal node, so a round's emitted tokens always fit); `limit` (<= max_new_tokens, traced:
    a smaller budget needs no new program) ends each row."""

    cache: Cache        # the target's; lengths [B] = tokens committed (prompt + emitted - 1)
    drafter: Any        # the drafter's state pytree
    pending: jax.Array  # [B] the last emitted token, not yet in the cache
    tokens: jax.Array   # [B, N] emitted tokens
    num_tokens: jax.Array  # [B]
    done: jax.Array     # [B]
    stats: DecodeStats
    trace: dict[str, jax.Array]  # [B, N] per emitted token, see DecodeOutput
    round: jax.Array    # scalar, folds into the PRNG key
    limit: jax.Array    # scalar, the new tokens a row may emit
    stop_state: jax.Array | None = None  # [B] with stop strings: the automaton's state


@functools.partial(jax.jit, static_argnames=("cfg", "drafter", "max_new_tokens", "cache_len",
                                             "stream", "logprobs"))
def generate_tokens(params: Params, draft_params: Any, prompts: jax.Array,
                    prompt_lengths: jax.Array, key: jax.Array, sampling: SamplingParams | None,
                    eos_id: jax.Array, draft_ids: jax.Array | None = None,
                    new_tokens: jax.Array | None = None, stops: StopTable | None = None,
                    num_rows: jax.Array | None = None, *, cfg: ModelConfig,
                    drafter: Drafter, max_new_tokens: int, cache_len: int,
                    stream: bool = False, logprobs: bool = False) -> DecodeOutput:
    """Generates up to `new_tokens` (default `max_new_tokens`) per row after right-padded
    prompts [B, P].

    Args:
      params: model parameters, layers unstacked (`model.unstack_layers`).
      draft_params: the drafter's own parameters (an empty dict for LayerSkip).
      prompt_lengths: [B] true prompt lengths (>= 1); padding after them is ignored.
      sampling: None for greedy decoding, else the sampling distribution's parameters.
      eos_id: the token ids that end a row, a scalar or a vector (-1: none); the one that
        ends it is included in the output.
      draft_ids: [N] ascending ids a vocabulary head drafts over (`draft_vocab`; None: all):
        the target's rows and the drafter's own head are cut to them once, before the loop.
      new_tokens: the budget per row, a traced scalar <= `max_new_tokens` (the static size of
        the output; `Generator` rounds it up to a bucket so that budgets share programs).
      cache_len: static cache size; must be >= P + max_new_tokens + the shape's node count.
      stream: hand each round's committed tokens to the host as it finishes
        (`streaming.emit`; a separate program, so the default one has no host round-trip).
      stops: stop strings' automaton over the vocabulary and each row's state after its
        prompt (`stop_strings.StopTable`; None: none, and a program without them).
      num_rows: the real rows, a traced scalar (default: all B); the rows after them pad the
        batch to a bucket (`Generator`) and are done from the start, so they change nothing.
      logprobs: trace each token's log-probability under the target ("logprob"; a separate
        program, so the default one computes none).
    """
    vocab = None
    if draft_ids is not None:
        vocab = DraftVocab.gather(params, cfg, draft_ids)
        draft_params = drafter.restrict_vocab(draft_params, draft_ids)
    ctx = DraftContext(params=params, draft_params=draft_params, sampling=sampling, cfg=cfg,
                       vocab=vocab)
    prefill_key, loop_key = jax.random.split(bit_generator_key(key))
    state = prefill(ctx, drafter, prompts, prompt_lengths, prefill_key, eos_id,
                    max_new_tokens=max_new_tokens, cache_len=cache_len, limit=new_tokens,
                    stops=stops, logprobs=logprobs, num_rows=num_rows)
    if stream:
        streaming.emit(state.tokens[:, :1], state.num_tokens)
    final = jax.lax.while_loop(
        lambda s: ~jnp.all(s.done),
        lambda s: decode_round(ctx, drafter, loop_key, eos_id, s, stops, stream=stream,
                               logprobs=logprobs),
        state)
    return DecodeOutput(tokens=final.tokens, num_tokens=final.num_tokens, stats=final.stats,
                        trace=final.trace)


def bit_generator_key(key: jax.Array) -> jax.Array:
    """A key of JAX's "rbg" PRNG seeded from `key` (any PRNG's, raw or typed), for the loop's
    draws. XLA:CPU lowers a threefry draw as a while loop of five trips (about a hundred small
    operations, each launched on its own), and a sampled round draws K + 3 times; rbg draws
    with one `RngBitGenerator` operation (its split and fold_in still hash the key with
    threefry). The distributions are the same; the tokens a seed gives may differ between
    backends. Not for `jax.vmap` over keys: JAX batches `RngBitGenerator` by drawing from the
    first key only."""
    return jax.random.wrap_key_data(jax.random.bits(key, (4,), jnp.uint32), impl="rbg")


def prefill(ctx: DraftContext, drafter: Drafter, prompts: jax.Array, prompt_lengths: jax.Array,
            key: jax.Array, eos_id: jax.Array, *, max_new_tokens: int,
            cache_len: int, limit: jax.Array | None = None, stops: StopTable | None = None,
            logprobs: bool = False, num_rows: jax.Array | None = None) -> LoopState:
    """The target's prefill over the prompts, the first token, then the drafter's prefill;
    rows end after `limit` new tokens (default `max_new_tokens`, the output's size) or a
    first token that completes a stop string; rows from `num_rows` on (padding) are done from
    the start. With `logprobs`, the "logprob" trace starts with the first token's."""
    batch = prompts.shape[0]
    limit = jnp.asarray(max_new_tokens if limit is None else limit, jnp.int32)
    cache, last_logits, exit_hidden = prefill_target(ctx.params, ctx.cfg, prompts,
                                                     prompt_lengths, cache_len,
                                                     drafter.prefill_exits,
                                                     window=1 + drafter.shape.num_nodes)
    first = _pick(key, last_logits, ctx.sampling)
    draft_state = drafter.prefill(ctx, Prefilled(
        prompts=prompts, lengths=prompt_lengths, cache_len=cache_len,
        exit_hidden=exit_hidden,
        max_new_tokens=limit))
    proposal_like = jax.eval_shape(drafter.propose, ctx, draft_state, cache, first, key)[0]
    trace_like = jax.eval_shape(drafter.verify, ctx, draft_state, cache, first,
                                proposal_like).trace
    zeros = jnp.zeros((batch,), jnp.int32)
    width = max_new_tokens + drafter.shape.depth + 1
    stopped, stop_state = jnp.zeros((batch,), bool), None
    if stops is not None:
        _, stopped, stop_state = advance(stops, stops.state, first[:, None], jnp.ones_like(first))
    scores = ({LOGPROB: jnp.zeros((batch, width), jnp.float32).at[:, 0].set(
        token_logprobs(last_logits, first, ctx.sampling))} if logprobs else {})
    return LoopState(
        cache=cache, drafter=draft_state, pending=first,
        tokens=jnp.zeros((batch, width), jnp.int32).at[:, 0].set(first),
        num_tokens=jnp.ones((batch,), jnp.int32),
        done=is_stop(first, eos_id) | stopped | (limit <= 1) | (
            jnp.arange(batch) >= (batch if num_rows is None else num_rows)),
        stop_state=stop_state,
        stats=DecodeStats(rounds=zeros, drafted=zeros, accepted=zeros, verified=zeros,
                          extra={name: jnp.zeros(like.shape, like.dtype)
                                 for name, like in proposal_like.stats.items()}),
        trace={DEPTH: jnp.zeros((batch, width), jnp.int32), **scores,
               **{name: jnp.full((batch, width), -1, like.dtype)
                  for name, like in trace_like.items()}},
        round=jnp.zeros((), jnp.int32), limit=limit)


def prefill_target(params: Params, cfg: ModelConfig, prompts: jax.Array,
                   prompt_lengths: jax.Array, cache_len: int, exits: tuple[int, ...] = (), *,
                   window: int = 1) -> tuple[Cache, jax.Array, dict[int, jax.Array]]:
    """The target model over right-padded prompts [B, P]: a cache of `cache_len` slots (and a
    `window` of uncommitted tokens a round, see `model.allocate_cache`) with the prompts
    committed, the logits after each prompt's last token [B, V] and the hidden states after
    each layer count in `exits` ({exit: [B, P, D]})."""
    cache = allocate_cache(cfg, prompts.shape[0], cache_len, window)
    hidden, exit_hidden, start = embed(params, cfg, prompts), {}, 0
    for stop in sorted({*exits, cfg.num_layers}):
        hidden, cache = prefill_cached(params, cfg, hidden, cache, prompt_lengths,
                                       layers=(start, stop))
        exit_hidden[stop], start = hidden, stop
    last = at_positions(hidden, prompt_lengths - 1)
    return (cache.prefilled(prompt_lengths), exit_logits(params, cfg, last),
            {e: exit_hidden[e] for e in exits})


def decode_round(ctx: DraftContext, drafter: Drafter, key: jax.Array, eos_id: jax.Array,
                 s: LoopState, stops: StopTable | None = None, *, stream: bool = False,
                 logprobs: bool = False) -> LoopState:
    """One draft -> verify -> accept -> commit round for every row that is not done, cut
    after a token that completes a stop string."""
    draft_key, accept_key = jax.random.split(jax.random.fold_in(key, s.round))
    proposal, cache, draft_state = drafter.propose(ctx, s.drafter, s.cache, s.pending,
                                                   draft_key)
    verified = drafter.verify(ctx, draft_state, cache, s.pending, proposal)
    accepted = accept(accept_key, proposal, verified.logits, ctx.sampling)

    # What each row keeps: its accepted drafts and the target's token after them, cut after
    # an EOS, at its budget and after a completed stop string; nothing once it is done.
    active = ~s.done
    kept, hit_eos = _emitted_count(accepted.emitted, accepted.num_accepted, eos_id,
                                   s.limit - s.num_tokens)
    kept = jnp.where(active, kept, 0)
    stopped, stop_state = jnp.zeros_like(active), s.stop_state
    if stops is not None:
        kept, stopped, stop_state = advance(stops, s.stop_state, accepted.emitted, kept)
    if stream:
        streaming.emit(accepted.emitted, kept)
    num_tokens = s.num_tokens + kept
    lengths = jnp.where(active, s.cache.lengths + accepted.num_accepted + 1, s.cache.lengths)
    last = jnp.take_along_axis(accepted.emitted, accepted.num_accepted[:, None], axis=1)[:, 0]
    tokens, trace = _record(s, active, accepted, verified, ctx.sampling, logprobs)

    # Commit: the target cache along the accepted path, the drafter's state, the output.
    done = Round(pending=s.pending, proposal=proposal, acceptance=accepted,
                 reused_hidden=verified.reused_hidden, lengths_before=s.cache.lengths,
                 lengths_after=lengths, features=verified.features, logits=verified.logits)
    return LoopState(
        cache=verified.cache.commit(lengths, accepted.path),
        drafter=drafter.commit(ctx, draft_state, done),
        pending=jnp.where(active, last, s.pending),
        tokens=tokens, trace=trace, num_tokens=num_tokens,
        done=s.done | hit_eos | stopped | (num_tokens >= s.limit),
        stats=s.stats.add(active, proposal, kept, verified.positions),
        round=s.round + 1, limit=s.limit, stop_state=stop_state)


def _record(s: LoopState, active: jax.Array, accepted: Acceptance, verified: Verified,
            sampling: SamplingParams | None, logprobs: bool) -> tuple[jax.Array, dict]:
    """The output tokens and per-token traces with a round's emitted tokens written from each
    active row's next slot (slots past what it keeps are overwritten by the next round)."""
    write = jax.vmap(lambda row, new, at: jax.lax.dynamic_update_slice(row, new, (at,)))
    traces = {name: along_path(values, accepted.path) for name, values in verified.trace.items()}
    traces[DEPTH] = _draft_depths(accepted.emitted.shape[1], accepted.num_accepted)
    if logprobs:
        traces[LOGPROB] = token_logprobs(along_path(verified.logits, accepted.path),
                                         accepted.emitted, sampling)

    def written(old: jax.Array, new: jax.Array) -> jax.Array:
        return jnp.where(active[:, None], write(old, new, s.num_tokens), old)

    return (written(s.tokens, accepted.emitted),
            {name: written(s.trace[name], new) for name, new in traces.items()})


def _draft_depths(width: int, num_accepted: jax.Array) -> jax.Array:
    """[B, width] the depth of each token a round emits: its accepted drafts 1..a, then 0 for
    the target's token after them."""
    positions = jnp.arange(width, dtype=jnp.int32)[None, :]
    return jnp.where(positions < num_accepted[:, None], positions + 1, 0)


def _pick(key: jax.Array, logits: jax.Array, sampling: SamplingParams | None) -> jax.Array:
    if sampling is None:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return sample(key, probabilities(logits, sampling))


def is_stop(tokens: jax.Array, eos_id: jax.Array) -> jax.Array:
    """Whether each token is one of the ids that end a row (a scalar id or a vector of them;
    -1 matches no token)."""
    return jnp.any(tokens[..., None] == jnp.atleast_1d(eos_id), axis=-1)


def _emitted_count(emitted: jax.Array, num_accepted: jax.Array, eos_id: jax.Array,
                   room: jax.Array) -> tuple[jax.Array, jax.Array]:
    """How many of this round's tokens a row keeps: the accepted drafts plus one, cut after the
    first EOS and at the remaining budget `room`; and whether an EOS was kept."""
    positions = jnp.arange(emitted.shape[1])[None, :]
    is_eos = is_stop(emitted, eos_id) & (positions <= num_accepted[:, None])
    first_eos = jnp.argmax(is_eos, axis=1)
    hit = jnp.any(is_eos, axis=1) & (first_eos < room)
    count = jnp.where(hit, first_eos + 1, num_accepted + 1)
    return jnp.minimum(count, room).astype(jnp.int32), hit
