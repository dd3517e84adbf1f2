"""Host-side generation API: pads prompts, sizes the cache, calls the jitted loop, unpacks rows."""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from specjax import compilation_cache
from specjax.config import ModelConfig
from specjax.decoding import streaming
from specjax.decoding.drafter import Drafter, DraftWeights
from specjax.decoding.drafters.autoregressive import Autoregressive
from specjax.decoding.loop import DecodeOutput, generate_tokens
from specjax.decoding.sampling import SamplingParams
from specjax.decoding.stop_strings import StopStrings
from specjax.model import Params, check_window, unstack_layers
from specjax.sharding import batch_devices, place_batch, tree_shardings

PAD_MULTIPLE = 16  # caches are padded to multiples of this to reuse compilations
MIN_BUDGET = 64  # every max_new_tokens up to this runs one program (buffers of 64 tokens)
MIN_PROMPT_WIDTH = 32  # every prompt up to this runs one program (prefill of 32 positions)
MAX_STOP_IDS = 8  # the ids that can end a row (generation_config.json lists up to 3 today)
AUTOREGRESSIVE = Autoregressive()


@dataclasses.dataclass(frozen=True)
class RowStats:
    """One row's decoding statistics: rounds, nodes drafted, drafts committed, positions
    verified (the pending token and the nodes each pass ran), the drafter's own counters.
    tau = mean tokens committed per round."""

    rounds: int
    drafted: int
    accepted: int
    verified: int = 0
    extra: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def tau(self) -> float:
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def verified_per_round(self) -> float:
        return self.verified / self.rounds if self.rounds else 0.0

    def to_dict(self) -> dict:
        return {"rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
                "tau": self.tau, "acceptance_rate": self.acceptance_rate,
                "verified_per_round": self.verified_per_round, **self.extra}

    @classmethod
    def total(cls, rows: Sequence[RowStats]) -> RowStats:
        """The sums over rows."""
        return cls(sum(r.rounds for r in rows), sum(r.drafted for r in rows),
                   sum(r.accepted for r in rows), sum(r.verified for r in rows),
                   {name: sum(r.extra[name] for r in rows) for name in
                    (rows[0].extra if rows else {})})


def accepted_runs(depths: Sequence[int]) -> list[int]:
    """The drafts each round kept, from a row's "depth" trace: after the prefill's token (0) a
    round emits its accepted drafts (depths 1..a) and then the target's token (0); the last
    round may end early, cut by EOS or the token budget."""
    runs, run = [], 0
    for depth in depths[1:]:
        if depth == 0:
            runs.append(run)
        run = depth
    if run:
        runs.append(run)
    return runs


def acceptance_by_depth(runs: Sequence[int], depth: int | None = None) -> list[float]:
    """For d = 1..`depth` (default: the deepest run), the fraction of rounds whose accepted
    drafts reach depth d."""
    depth = max(runs, default=0) if depth is None else depth
    return [sum(run >= d for run in runs) / len(runs) if runs else 0.0
            for d in range(1, depth + 1)]


@dataclasses.dataclass(frozen=True)
class Generation:
    """Generated token ids per row (EOS included when it ended the row), per-row stats and the
    per-token traces of each row: "depth" (the draft depth each token was accepted at, 0 for
    the target's own tokens; `accepted_runs` turns it into rounds), and the verifier's (CALM:
    "exit" and "confidence", -1 for the first token, which the prefill's full pass produced)."""

    tokens: list[list[int]]
    stats: list[RowStats]
    trace: list[dict[str, list]] = dataclasses.field(default_factory=list)

    @property
    def total(self) -> RowStats:
        return RowStats.total(self.stats)


class Generator:
    """Holds a model's decoding parameters and generates with any strategy (a `Drafter`).

    Compiled programs are cached per (strategy, `bucket` of the longest prompt, `bucket` of
    max_new_tokens, `batch_bucket` of the prompts, greedy or sampling); temperature, top-k,
    top-p, seed, EOS and a budget, prompt length or batch size within the same bucket never
    recompile (padding rows are done from the start). A
    drafter with weights of its own (`needs_weights`) drafts with `draft_weights[name]`, or
    with the `draft_params` of a call. On a `mesh`, weights (the drafters' too) are laid out by
    `sharding.RULES` and the prompts' rows (their bucket a multiple of data x fsdp) split over them;
    the caches are laid out by `sharding.CACHE_AXES`, and jit places everything else.
    `draft_vocab` ranks token ids for drafting over part of the vocabulary (most frequent
    first, `io.draft_vocab`): a strategy with `draft_vocab` = N drafts over its first N.
    `min_prompt_width`: the narrowest prompt bucket; below the default, short prompts compile
    more programs but prefill fewer padding positions (thousands of rows of a few tokens).
    """

    def __init__(self, params: Params, cfg: ModelConfig, *, max_cache_len: int = 8192,
                 draft_weights: Mapping[str, DraftWeights] | None = None,
                 mesh: Mesh | None = None, draft_vocab: Sequence[int] | None = None,
                 min_prompt_width: int = MIN_PROMPT_WIDTH):
        compilation_cache.enable()
        self.cfg = cfg
        self.max_cache_len = max_cache_len
        self.min_prompt_width = min_prompt_width
        self.mesh = mesh
        self.draft_vocab = None if draft_vocab is None else np.asarray(draft_vocab, np.int64)
        self.draft_weights = {name: dataclasses.replace(w, params=self._place(w.params))
                              for name, w in (draft_weights or {}).items()}
        layers = params.get("layers")
        self.params = self._place(params if isinstance(layers, (tuple, list))
                                  else unstack_layers(params, cfg))

    def _on_mesh(self) -> contextlib.AbstractContextManager:
        """The mesh the loop's caches are laid out on (`sharding.constrain_cache`), if any."""
        return contextlib.nullcontext() if self.mesh is None else jax.set_mesh(self.mesh)

    def _place(self, tree: Any) -> Any:
        return tree if self.mesh is None else jax.device_put(tree,
                                                             tree_shardings(self.mesh, tree))

    def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                 strategy: Drafter = AUTOREGRESSIVE, sampling: SamplingParams | None = None,
                 seed: int = 0, eos_id: int | Sequence[int] | None = None,
                 draft_params: Any = None, stop: StopStrings | None = None,
                 logprobs: bool = False) -> Generation:
        """Decodes every prompt; greedy when `sampling` is None. A row ends after a token
        that completes one of the `stop` strings; `logprobs` traces each token's
        log-probability under the target ("logprob")."""
        return self.unpack(self.run(prompts, max_new_tokens=max_new_tokens, strategy=strategy,
                                    sampling=sampling, seed=seed, eos_id=eos_id,
                                    draft_params=draft_params, stop=stop, logprobs=logprobs))

    def stream(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
               strategy: Drafter = AUTOREGRESSIVE, sampling: SamplingParams | None = None,
               seed: int = 0, eos_id: int | Sequence[int] | None = None,
               draft_params: Any = None,
               stop: StopStrings | None = None) -> Iterator[list[list[int]]]:
        """Like `generate`, but yields each row's new tokens as the loop commits them: the
        prefill's token, then one list per row after every round ([] for a row already done).
        Joined, they are `generate`'s tokens. The loop runs in a thread and hands each round to
        the host (`streaming`); one device only, one stream at a time."""
        if self.mesh is not None:
            raise ValueError("streaming runs on one device; decode on a mesh with generate")
        args, static = self._inputs(prompts, max_new_tokens, strategy, sampling, seed, eos_id,
                                    draft_params, stop)
        rounds: queue.Queue = queue.Queue()
        failed: list[BaseException] = []

        def decode() -> None:
            try:
                with streaming.receiving(lambda tokens, counts: rounds.put((tokens, counts))):
                    jax.block_until_ready(generate_tokens(*args, **static, stream=True))
            except BaseException as error:  # re-raised in the caller's thread
                failed.append(error)
            finally:
                rounds.put(None)

        thread = threading.Thread(target=decode, daemon=True)
        thread.start()
        while (item := rounds.get()) is not None:
            tokens, counts = item
            yield [row[:count].tolist() for row, count in zip(tokens[:len(prompts)],
                                                               counts[:len(prompts)], strict=True)]
        thread.join()
        if failed:
            raise failed[0]

    def run(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
            strategy: Drafter = AUTOREGRESSIVE, sampling: SamplingParams | None = None,
            seed: int = 0, eos_id: int | Sequence[int] | None = None,
            draft_params: Any = None, stop: StopStrings | None = None,
            logprobs: bool = False) -> DecodeOutput:
        """Like `generate` but returns the raw device output (for benchmarks: no host copy)."""
        args, static = self._inputs(prompts, max_new_tokens, strategy, sampling, seed, eos_id,
                                    draft_params, stop)
        with self._on_mesh():
            return real_rows(generate_tokens(*args, **static, logprobs=logprobs), len(prompts))

    def compile(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                strategy: Drafter = AUTOREGRESSIVE, sampling: SamplingParams | None = None,
                draft_params: Any = None) -> Callable[..., DecodeOutput]:
        """`run` compiled ahead of time for prompts padded like these. The returned
        `decode(prompts, seed=0, eos_id=None, max_new_tokens=None)` keeps that one program
        whatever happens to jit caches later, so a benchmark can hold programs traced under
        different settings (the CPU kernel on or off) in one process; it generates up to
        `max_new_tokens` (the budget is traced: fewer, such as the benchmark's one-token
        prefill call, run the same program)."""
        args, static = self._inputs(prompts, max_new_tokens, strategy, sampling, 0, None,
                                    draft_params)
        with self._on_mesh():
            program = generate_tokens.lower(*args, **static).compile()
        compiled_budget = max_new_tokens

        def decode(batch: Sequence[Sequence[int]], seed: int = 0,
                   eos_id: int | Sequence[int] | None = None,
                   max_new_tokens: int | None = None) -> DecodeOutput:
            budget = compiled_budget if max_new_tokens is None else max_new_tokens
            if not 1 <= budget <= compiled_budget:
                raise ValueError(f"max_new_tokens={budget}: this program generates 1 to "
                                 f"{compiled_budget} tokens")
            return real_rows(program(*self._inputs(batch, compiled_budget, strategy, sampling,
                                                   seed, eos_id, draft_params,
                                                   budget=budget)[0]), len(batch))
        return decode

    def _inputs(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, strategy: Drafter,
                sampling: SamplingParams | None, seed: int, eos_id: int | Sequence[int] | None,
                draft_params: Any, stop: StopStrings | None = None, budget: int | None = None
                ) -> tuple[tuple, dict[str, Any]]:
        """`generate_tokens`' array arguments and static options, checked, for
        `max_new_tokens` (`budget`, at most that, is the traced count generated: default all).
        Stop strings' automaton is padded to a `bucket` of states: similar stop strings share
        a program."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
        strategy, draft_params = self.with_weights(strategy, draft_params)
        strategy.validate(self.cfg)
        check_window(self.cfg, 1 + strategy.shape.num_nodes)
        rows = self.bucket_rows(prompts)
        padded, lengths = self.pad(rows)
        capacity = budget_bucket(max_new_tokens)  # traced: budgets in a bucket share
        if padded.shape[1] + capacity + strategy.shape.num_nodes > self.max_cache_len:
            capacity = max_new_tokens  # the bucket does not fit where the budget itself may
        cache_len = self.cache_len(padded.shape[1], capacity, strategy.shape.num_nodes)
        args = (self.params, {} if draft_params is None else draft_params, padded, lengths,
                jax.random.PRNGKey(seed), sampling, stop_ids(eos_id), self.draft_ids(strategy),
                jnp.int32(max_new_tokens if budget is None else budget),
                None if stop is None else stop.table(rows, self.cfg.vocab_size,
                                                     bucket(stop.num_states)),
                jnp.int32(len(prompts)))
        return args, dict(cfg=self.cfg, drafter=strategy, max_new_tokens=capacity,
                          cache_len=cache_len)

    def draft_ids(self, strategy: Drafter) -> jax.Array | None:
        """The ascending ids `strategy` drafts over: the first `draft_vocab` of the ranking
        (None: the whole vocabulary)."""
        size = getattr(strategy, "draft_vocab", 0)
        if not size:
            return None
        if self.draft_vocab is None:
            raise ValueError(f"draft_vocab={size} needs a ranking of the vocabulary: make one "
                             "with infer/draft_vocab.py --workdir <the model's workdir>")
        if size > len(self.draft_vocab):
            raise ValueError(f"draft_vocab={size} exceeds the {len(self.draft_vocab)} ids "
                             "ranked: rank more with infer/draft_vocab.py --size")
        return jnp.asarray(np.sort(self.draft_vocab[:size]), jnp.int32)

    def with_weights(self, strategy: Drafter, draft_params: Any) -> tuple[Drafter, Any]:
        """`strategy` bound to the weights it drafts with (`draft_weights[name]`, checked by its
        `bind`) and their params, with the strategy's traced settings when it has some
        (`runtime_params`: CALM's thresholds); given `draft_params` are used as they are; a
        clear error when a drafter that needs weights has none."""
        if draft_params is not None:
            return strategy, draft_params
        return strategy.with_weights(self.draft_weights)

    def bucket_rows(self, prompts: Sequence[Sequence[int]]) -> list[Sequence[int]]:
        """The prompts, then one-token padding rows up to the `batch_bucket` of their count (a
        multiple of a mesh's data x fsdp devices, so that the rows split over them)."""
        multiple = 1 if self.mesh is None else batch_devices(self.mesh)
        count = batch_bucket(len(prompts), multiple) if len(prompts) else 0
        return [*prompts, *[[0]] * (count - len(prompts))]

    def pad(self, prompts: Sequence[Sequence[int]]) -> tuple[jax.Array, jax.Array]:
        """Right-pads prompts to the `bucket` of the longest (at least `min_prompt_width`);
        returns (tokens, lengths)."""
        if len(prompts) == 0:
            raise ValueError("no prompts given")
        rows = [np.asarray(p, dtype=np.int64).reshape(-1) for p in prompts]
        for i, row in enumerate(rows):
            if len(row) == 0:
                raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
            if row.min() < 0 or row.max() >= self.cfg.vocab_size:
                raise ValueError(f"prompt {i} has token ids outside [0, {self.cfg.vocab_size})")
        width = bucket(max(len(r) for r in rows), self.min_prompt_width)
        padded = np.zeros((len(rows), width), np.int32)
        for i, row in enumerate(rows):
            padded[i, :len(row)] = row
        lengths = np.asarray([len(r) for r in rows], np.int32)
        if self.mesh is None:
            return jnp.asarray(padded), jnp.asarray(lengths)
        return place_batch(padded, self.mesh), place_batch(lengths, self.mesh)

    def cache_len(self, prompt_width: int, max_new_tokens: int, num_nodes: int) -> int:
        """Cache slots needed: the prompt, every new token and one round's drafted nodes."""
        needed = prompt_width + max_new_tokens + num_nodes
        if needed > self.max_cache_len:
            raise ValueError(
                f"prompt length {prompt_width} (padded) + max_new_tokens {max_new_tokens} + "
                f"drafted nodes {num_nodes} = {needed} exceeds the cache limit max_cache_len="
                f"{self.max_cache_len}; shorten the prompt or generate fewer tokens")
        return _round_up(needed, PAD_MULTIPLE)

    @staticmethod
    def unpack(output: DecodeOutput) -> Generation:
        tokens, counts, stats, trace = jax.device_get((output.tokens, output.num_tokens,
                                                       output.stats, output.trace))
        # Whole arrays to lists at once, then rows cut from them: a call per row and field
        # took 70 ms of a 2,000-row call.
        counts = counts.tolist()
        columns = {name: values.tolist() for name, values in trace.items()}
        extra = {name: values.astype(np.int64).tolist() for name, values in stats.extra.items()}
        rounds, drafted, accepted, verified = (values.astype(np.int64).tolist() for values in (
            stats.rounds, stats.drafted, stats.accepted, stats.verified))
        return Generation(
            tokens=[row[:count] for row, count in zip(tokens.tolist(), counts, strict=True)],
            stats=[RowStats(rounds[i], drafted[i], accepted[i], verified[i],
                            {name: values[i] for name, values in extra.items()})
                   for i in range(len(counts))],
            trace=[{name: values[i][:count] for name, values in columns.items()}
                   for i, count in enumerate(counts)])


def bucket(size: int, smallest: int = 16) -> int:
    """The static size a prompt width or a stop automaton compiles at: the smallest of
    `smallest` (a power of two), then 1.5x and 2x it, and so on (16, 24, 32, 48, 64, 96, ...)
    that holds `size`. Sizes in one bucket share a program; a padded slot costs at most half
    a slot more work."""
    step = smallest
    while True:
        for candidate in (step, step * 3 // 2):
            if size <= candidate:
                return candidate
        step *= 2


def budget_bucket(size: int) -> int:
    """The output buffer a `max_new_tokens` compiles at: `MIN_BUDGET`, then powers of two.
    Coarser than prompt widths: a padded budget costs buffer and cache slots, not a padded
    prefill's compute, so budgets from 1 to 256 run 3 programs rather than 5."""
    return max(MIN_BUDGET, 1 << (size - 1).bit_length())


def batch_bucket(size: int, multiple: int = 1) -> int:
    """The batch size `size` prompts compile at: 1, 2, 4, 8, then multiples of 8, rounded up
    to a multiple of `multiple`. Batch sizes in one bucket share a program; each padding row
    adds its share of every round's batched work (on CPU, where small batches are bound by
    reading the weights, little)."""
    rows = 1 << (size - 1).bit_length() if size <= 8 else _round_up(size, 8)
    return _round_up(rows, multiple)


def real_rows(output: DecodeOutput, count: int) -> DecodeOutput:
    """The first `count` rows of the loop's output: a padded batch's real rows."""
    if output.num_tokens.shape[0] == count:
        return output
    return jax.tree.map(lambda rows: rows[:count], output)


def stop_ids(eos_id: int | Sequence[int] | None) -> jax.Array:
    """The loop's EOS argument: the ids that end a row, padded with -1 to `MAX_STOP_IDS` so
    that any set of them runs the same program."""
    ids = [] if eos_id is None else [eos_id] if isinstance(eos_id, (int, np.integer)) else list(
        eos_id)
    if len(ids) > MAX_STOP_IDS:
        raise ValueError(f"{len(ids)} EOS ids given; at most {MAX_STOP_IDS} end a row")
    return jnp.asarray(ids + [-1] * (MAX_STOP_IDS - len(ids)), jnp.int32)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
