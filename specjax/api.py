"""The API for notebooks and scripts: train or load a workdir, generate text, benchmark settings.

    import specjax
    model = specjax.load("runs/tiny")  # or specjax.train("tiny_code", "runs/tiny"),
                                       # or specjax.import_hf("llama_dir", "runs/llama")
    print(model.generate("def main(", max_new_tokens=64).text)
    model.generate(["import os", "class A:"], strategy="ar", temperature=0.8, seed=1)
    model.benchmark({"K=4": dict(num_draft=4), "tree": dict(tree="2,2,1")})
    for piece in model.stream("def main("): print(piece, end="")
    specjax.strategies()  # ['ar', 'calm', 'calmdraft', 'draft', ...]

Everything below is the same machinery as `infer/generate.py` and `bench/bench.py`: the
checkpoint's decoding defaults, overridable per call, one compiled program per shape.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from specjax import keywords
from specjax.chat import check_messages
from specjax.cli.decoding import (
    auto_tree_prompts,
    decoding_defaults,
    decoding_mode,
    decoding_options,
    default_choice,
    resolve_auto_tree,
    workdir_heldout_prompts,
)
from specjax.config import ModelConfig, load_config_file, require_count, require_kind
from specjax.data import heldout_data, heldout_prompts
from specjax.decoding.drafter import Drafter
from specjax.decoding.engine import (
    AUTOREGRESSIVE,
    Generator,
    RowStats,
    accepted_runs,
)
from specjax.decoding.engine import acceptance_by_depth as _by_depth
from specjax.decoding.loop import LOGPROB
from specjax.decoding.registry import STRATEGIES, DecodingConfig, make_strategy
from specjax.decoding.sampling import SamplingParams, sampling_or_greedy
from specjax.decoding.stop_strings import StopStrings, stop_list
from specjax.io.calibrated_defaults import write_calibrated
from specjax.loading import LoadedModel, load_model
from specjax.outputs import check_writable
from specjax.prompt_sets import (
    PromptInput,
    encode_prompts,
    load_prompt_set,
    prompt_text,
    token_ids,
)
from specjax.tokenizer import Tokenizer, workdir_tokenizer
from specjax.tools.bench import run_benchmark
from specjax.tools.exit_report import DraftExitReport, model_exit_report, on_workload
from specjax.tools.exit_workload import ForcedPlays
from specjax.tools.tree_search import TreePlan
from specjax.tools.tune import (
    EXITS,
    NUM_DRAFTS,
    TREE,
    Candidate,
    Tuning,
    candidates,
    played_speedup,
    tunable,
    tune,
)

PromptsArg = str | Sequence[int] | Sequence[str | Sequence[int]] | None
STOP_STRINGS_KEPT = 8  # stop-string automata a model keeps built (one per set of stops)
TUNE_REPORT_WINDOWS = 4  # held-out windows the tuner's exit report evaluates (one batch)
DECODING_OPTIONS = tuple(field.name for field in dataclasses.fields(DecodingConfig))
EXIT_REPORT_OPTIONS = tuple(name for name, p in inspect.signature(model_exit_report).parameters
                            .items() if p.kind is p.KEYWORD_ONLY and name != "sampling")


@dataclasses.dataclass(frozen=True)
class Completion:
    """One prompt's generated text and token ids, its decoding statistics (tau,
    acceptance_rate...) and its per-token traces: "depth" (the draft depth each token was
    accepted at; 0: the target's own token), with `logprobs=True` "logprob" (`logprobs`) and,
    for strategy calm, "exit" and "confidence" (-1 for the first token)."""

    prompt: str
    text: str
    stats: RowStats
    trace: dict[str, list] = dataclasses.field(default_factory=dict)
    tokens: list[int] = dataclasses.field(default_factory=list)

    @property
    def logprobs(self) -> list[float] | None:
        """Each token's log-probability under the distribution the target verified it with
        (`generate(logprobs=True)`; None without): the model's log-softmax when greedy, the
        sampling distribution's (after temperature, top-k and top-p) when sampled, as
        transformers' `compute_transition_scores(..., normalize_logits=True)` reads its
        `output_scores`."""
        return self.trace.get(LOGPROB)

    @property
    def accepted_runs(self) -> list[int]:
        """The drafts each decoding round kept."""
        return accepted_runs(self.trace["depth"])

    def acceptance_by_depth(self, depth: int | None = None) -> list[float]:
        """For d = 1..depth, the fraction of rounds whose accepted drafts reach depth d."""
        return acceptance_by_depth([self], depth)

    @staticmethod
    def total(completions: Sequence[Completion]) -> RowStats:
        """The statistics summed over completions (tau over all their rounds)."""
        return RowStats.total([c.stats for c in completions])


def text_pieces(tokenizer: Tokenizer, rounds: Iterable[list[int]]) -> Iterator[str]:
    """The text that each round of tokens adds; a character whose bytes straddle rounds waits
    for its last one (decoded alone, its first bytes would show as a replacement character
    that the finished text does not hold)."""
    tokens: list[int] = []
    shown = ""
    for new in rounds:
        tokens += new
        text = tokenizer.decode(tokens)
        if not text.endswith("\ufffd") and len(text) > len(shown):
            yield text[len(shown):]
            shown = text
    text = tokenizer.decode(tokens)
    if len(text) > len(shown):
        yield text[len(shown):]


def acceptance_by_depth(completions: Completion | Sequence[Completion],
                        depth: int | None = None) -> list[float]:
    """Over every round of `completions`, the fraction whose accepted drafts reach depth d, for
    d = 1..depth (default: the deepest any reached)."""
    if isinstance(completions, Completion):
        completions = [completions]
    return _by_depth([run for c in completions for run in c.accepted_runs], depth)


@dataclasses.dataclass(frozen=True)
class _Call:
    """One `generate` or `stream` call, resolved (`LanguageModel._call`)."""

    encoded: list[np.ndarray]
    texts: list[str]  # what each Completion shows as its prompt
    single: bool
    max_new_tokens: int
    sampling: SamplingParams | None
    strategy: Drafter
    stop: StopStrings | None


class LanguageModel:
    """A workdir's model with its tokenizer and decoding defaults, ready to generate."""

    def __init__(self, loaded: LoadedModel):
        self.workdir = loaded.workdir
        self.config: ModelConfig = loaded.cfg
        self.meta: dict[str, Any] = loaded.meta
        self.step = loaded.meta.get("step")
        self.tokenizer: Tokenizer = workdir_tokenizer(loaded.meta, loaded.workdir)
        self.decoding_defaults: DecodingConfig = decoding_defaults(loaded.meta)
        self.generator: Generator = loaded.generator()
        self._loaded = loaded
        self._stops: dict[tuple[str, ...], StopStrings] = {}

    def strategy(self, name: str, sampling: SamplingParams | None = None,
                 prompts: Sequence[Sequence[int]] = (), **options: Any) -> Drafter:
        """The strategy `name` with the checkpoint's decoding defaults, `options` overriding
        them (exit_layer=, num_draft=, tree=...). `tree="auto"` or "auto:N" is resolved into
        the Sequoia tree measured for `sampling` (`plan_tree`), on held-out text or `prompts`."""
        return self._built(name, self.decoding_defaults, sampling, prompts, options)

    def default_strategy(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                         **options: Any) -> Drafter:
        """The strategy `generate` decodes with when none is named, in this sampling mode:
        the one `tune` stored for it (greedy or sampled), else selfspec, with `options`
        overriding its defaults."""
        sampling = sampling_or_greedy(temperature, top_k, top_p)
        name, defaults = default_choice(self.meta, self.config, sampling,
                                        self._loaded.draft_weights)
        return self._built(name, defaults, sampling, (), options)

    def _built(self, name: str, defaults: DecodingConfig, sampling: SamplingParams | None,
               prompts: Sequence[Sequence[int]], options: Mapping[str, Any]) -> Drafter:
        options = dict(options)
        keywords.strategy_names(options)  # benchmark's and tune's settings take HF's names too
        chosen = decoding_options(defaults, self.config, options, [name], prefix="")
        chosen, _ = self._resolve_tree(chosen, name, sampling, prompts)
        return make_strategy(name, self._loaded.at_head_exit(name, chosen, options))

    def _drafter(self, strategy: str | Drafter | None, sampling: SamplingParams | None,
                 encoded: Sequence[Sequence[int]], options: Mapping[str, Any]) -> Drafter:
        """`generate`'s and `stream`'s strategy: a name built with `options`, the workdir's
        default (`default_choice`) when None, or a `Drafter` as given (options then have
        nothing to apply to)."""
        if strategy is None:
            name, defaults = default_choice(self.meta, self.config, sampling,
                                            self._loaded.draft_weights)
            return self._built(name, defaults, sampling, encoded, options)
        if isinstance(strategy, str):
            return self.strategy(strategy, sampling, encoded, **options)
        if not hasattr(strategy, "with_weights"):  # a Protocol: no isinstance
            raise ValueError("strategy must be a name from strategies() or a Drafter, not "
                             f"{type(strategy).__name__}")
        if options:
            raise ValueError(f"options {sorted(options)} apply to a strategy name, not to a "
                             "Drafter (build it with them instead)")
        return strategy

    def plan_tree(self, tree: str = "auto", *, temperature: float = 0.0, top_k: int = 0,
                  top_p: float = 1.0, **options: Any) -> TreePlan:
        """The Sequoia tree `tree` ("auto", or "auto:N" for N nodes) picks for `selfspec` at
        the options' exit in this sampling mode: measured acceptance and costs, its expected
        tau and speed-up; cached in the workdir's tree_plans.json like the command line's."""
        chosen = decoding_options(self.decoding_defaults, self.config,
                                  {**options, "tree": tree}, ["selfspec"], prefix="")
        _, plan = self._resolve_tree(chosen, "selfspec",
                                     sampling_or_greedy(temperature, top_k, top_p), ())
        if plan is None:
            raise ValueError(f"tree={tree!r}: plan_tree takes 'auto' or 'auto:N'")
        return plan

    def _resolve_tree(self, options: DecodingConfig, name: str,
                      sampling: SamplingParams | None, prompts: Sequence[Sequence[int]]
                      ) -> tuple[DecodingConfig, TreePlan | None]:
        return resolve_auto_tree(
            options, self.generator,
            lambda: auto_tree_prompts(self.meta, self.tokenizer, list(prompts)), sampling,
            workdir=self.workdir, step=self.step, strategies=[name])

    @keywords.checked(DECODING_OPTIONS, keywords.HF_SAME, keywords.HF_REFUSED)
    def generate(self, prompts: PromptsArg = None, *,
                 messages: Sequence[Mapping[str, Any]] | Sequence[Sequence[Mapping[str, Any]]]
                 | None = None, chat: bool = False, max_new_tokens: int | None = None,
                 strategy: str | Drafter | None = None, temperature: float | None = None,
                 top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                 stop: str | Sequence[str] | None = None, logprobs: bool = False,
                 **options: Any) -> Completion | list[Completion]:
        """Completes one prompt (returns a `Completion`) or several (a list, decoded as one
        batch), stopping at the ids that end a generation (generation_config.json's EOS ids).

        A prompt is a text, encoded as the model's tokenizer encodes it (transformers'
        `tokenizer(prompt)`: its BOS only where it adds one), or a list of token ids, taken as
        they are. `messages`, instead: a conversation ([{"role": "user", "content": ...},
        ...]) or a list of them, rendered with the model's chat template as
        `apply_chat_template(..., add_generation_prompt=True)` renders it; `chat=True` makes
        each prompt a user's first message.

        Greedy at temperature 0 (the default; the same text whatever the strategy);
        otherwise sampled, with exactly the model's distribution. `max_new_tokens` defaults to
        128. `stop`: strings that end a row after the token completing one, as transformers'
        `stop_strings` ends it (checked on the device over each round's tokens).
        `logprobs=True` fills `Completion.logprobs`. `strategy` is a name from `strategies()`
        built from the checkpoint's decoding defaults with `options` (exit_layer=, num_draft=,
        tree=..., tree="auto") overriding them, or a `Drafter`; left out, the one `tune`
        stored for this mode (greedy or sampled) with its options, else selfspec
        (`default_strategy`). Hugging Face's `max_length`, `do_sample` and
        `num_assistant_tokens` mean what they mean there.
        """
        call = self._call(prompts, messages, chat, max_new_tokens, strategy, temperature, top_k,
                          top_p, seed, stop, options)
        out = self.generator.generate(
            call.encoded, max_new_tokens=call.max_new_tokens, strategy=call.strategy,
            sampling=call.sampling, seed=seed, eos_id=self.tokenizer.stop_ids, stop=call.stop,
            logprobs=logprobs)
        completions = [Completion(prompt, self.tokenizer.decode(tokens), stats, trace, tokens)
                       for prompt, tokens, stats, trace in zip(call.texts, out.tokens,
                                                               out.stats, out.trace,
                                                               strict=True)]
        return completions[0] if call.single else completions

    @keywords.checked(DECODING_OPTIONS, keywords.HF_SAME, keywords.HF_REFUSED)
    def stream(self, prompt: str | Sequence[int] | None = None, *,
               messages: Sequence[Mapping[str, Any]] | None = None, chat: bool = False,
               max_new_tokens: int | None = None, strategy: str | Drafter | None = None,
               temperature: float | None = None, top_k: int = 0, top_p: float = 1.0,
               seed: int = 0, stop: str | Sequence[str] | None = None,
               **options: Any) -> Iterator[str]:
        """`generate` for one prompt (or one conversation, `messages`), yielding its text as
        each decoding round commits tokens (a round's accepted drafts and the target's token
        arrive together); joined, the pieces are `generate(prompt).text`. A character whose
        bytes straddle two rounds waits for its last byte."""
        if prompt is not None and not isinstance(prompt, str) and token_ids(prompt) is None:
            raise ValueError(f"stream takes one prompt (a string or token ids), not "
                             f"{type(prompt).__name__}")
        call = self._call(prompt, messages, chat, max_new_tokens, strategy, temperature, top_k,
                          top_p, seed, stop, options)
        if not call.single:
            raise ValueError("stream takes one prompt or conversation, not a list of them")
        rounds = self.generator.stream(call.encoded, max_new_tokens=call.max_new_tokens,
                                       strategy=call.strategy, sampling=call.sampling,
                                       seed=seed, eos_id=self.tokenizer.stop_ids,
                                       stop=call.stop)
        yield from text_pieces(self.tokenizer, (rows[0] for rows in rounds))

    def _call(self, prompts: Any, messages: Any, chat: bool, max_new_tokens: int | None,
              strategy: str | Drafter | None, temperature: float | None, top_k: int, top_p: float,
              seed: int, stop: str | Sequence[str] | None, options: dict[str, Any]) -> _Call:
        """`generate`'s and `stream`'s arguments checked and resolved: prompts encoded,
        Hugging Face's names mapped (`keywords.from_hf`), the strategy built, stop strings
        ready for these prompts."""
        require_kind("seed", seed, int)
        inputs, single = _prompt_inputs(prompts, messages)
        encoded = encode_prompts(self.tokenizer, inputs, chat=chat)
        options = dict(options)
        temperature, max_new_tokens = keywords.from_hf(options, temperature, max_new_tokens,
                                                       max(len(ids) for ids in encoded))
        _require_counts(max_new_tokens=max_new_tokens)
        sampling = sampling_or_greedy(temperature, top_k, top_p)
        drafter = self._drafter(strategy, sampling, encoded, options)
        self._loaded.warn_long_prompts([len(ids) for ids in encoded])
        stops = None if stop is None else self._stop_strings(stop)
        texts = [prompt_text(p, self.tokenizer) for p in inputs]
        return _Call(encoded, texts, single, max_new_tokens, sampling, drafter, stops)

    def _stop_strings(self, stop: str | Sequence[str]) -> StopStrings:
        """`stop`'s automaton over this tokenizer, built once per stop strings (SmolLM2: 0.6 s
        a build, against seconds of decoding) for the last `STOP_STRINGS_KEPT` of them."""
        key = stop_list(stop)
        if key not in self._stops:
            if len(self._stops) == STOP_STRINGS_KEPT:
                del self._stops[next(iter(self._stops))]
            self._stops[key] = StopStrings(key, self.tokenizer.token_bytes())
        return self._stops[key]

    @keywords.checked()
    def benchmark(self, settings: Mapping[str, Mapping[str, Any]],
                  prompts: Sequence[str] | None = None, *, prompt_set: str | None = None,
                  max_new_tokens: int = 128,
                  temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                  repeats: int = 3, num_prompts: int = 8, prompt_len: int = 128,
                  seeds: int = 1) -> list[dict[str, Any]]:
        """Times `ar` and each labelled setting ({label: {"strategy": name (default
        selfspec), option: value...}}) on the same prompts, batch 1, in this process after a
        warm-up (`bench/bench.py`'s machinery) on `prompts`, or the first `num_prompts` of
        `prompt_set` ("humaneval", "chat": `prompt_sets`), by default `num_prompts` held-out
        windows of `prompt_len` tokens. One dict per setting, `ar` first: name,
        tokens_per_second, speedup over ar, tau, acceptance_rate, compile_seconds,
        identical_to_ar (greedy; None when sampling)."""
        _check_settings(settings)
        _require_counts(max_new_tokens=max_new_tokens, repeats=repeats, num_prompts=num_prompts,
                        prompt_len=prompt_len, seeds=seeds)
        sampling = sampling_or_greedy(temperature, top_k, top_p)
        encoded = self._timed_prompts(prompts, prompt_set, num_prompts, prompt_len)
        strategies: dict[str, Drafter] = {"ar": AUTOREGRESSIVE}
        for label, options in settings.items():
            if label in strategies:
                raise ValueError(f"setting {label!r}: the label is taken (ar is the baseline)")
            options = dict(options)
            strategies[label] = self.strategy(options.pop("strategy", "selfspec"), sampling,
                                              encoded, **options)
        results = run_benchmark(self.generator, strategies, encoded,
                                max_new_tokens=max_new_tokens, repeats=repeats,
                                sampling=sampling, seeds=seeds)
        return [{"name": r.name, "tokens_per_second": r.tokens_per_second,
                 "speedup": r.speedup, "tau": r.stats.tau,
                 "acceptance_rate": r.stats.acceptance_rate,
                 "compile_seconds": r.compile_seconds,
                 "identical_to_ar": r.identical_to_baseline} for r in results]

    def _timed_prompts(self, prompts: Sequence[str] | None, prompt_set: str | None,
                       num_prompts: int, prompt_len: int) -> list[Any]:
        """`benchmark`'s and `tune`'s prompts, encoded: `prompts`, the first `num_prompts` of
        `prompt_set`, or `num_prompts` held-out windows of `prompt_len` tokens."""
        if prompts is not None and prompt_set:
            raise ValueError("give prompts or a prompt_set, not both")
        encoded = (encode_prompts(self.tokenizer, _prompt_inputs(prompts, None)[0])
                   if prompts is not None else
                   encode_prompts(self.tokenizer, load_prompt_set(prompt_set, self.tokenizer,
                                                                  num_prompts))
                   if prompt_set else
                   workdir_heldout_prompts(self.meta, self.tokenizer, num_prompts, prompt_len))
        if encoded is None:
            raise ValueError(f"{self.workdir} names no training data to take held-out prompts "
                             "from: pass prompts")
        return encoded

    @keywords.checked()
    def tune(self, prompts: Sequence[str] | None = None, *, prompt_set: str | None = None,
             num_prompts: int = 4, prompt_len: int = 128, max_new_tokens: int = 64,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             budget_s: float = 600.0, strategies: Sequence[str] | None = None, exits: int = 2,
             num_draft: Sequence[int] = NUM_DRAFTS, trees: Sequence[str] = (TREE,),
             confirm: int = 3, write: bool = True,
             progress: Callable[[str], None] = lambda line: None) -> Tuning:
        """Finds the fastest drafter for this model on these prompts (`tools.tune`: every
        strategy it can run, or `strategies`; selfspec at the `exits` best exits of the exit
        report; chains of each of `num_draft`, each of `trees`; the `confirm` best kinds
        confirmed with the benchmark's interleaved timing) within `budget_s` seconds, and with
        `write` stores the winner as the workdir's default for this mode (greedy at
        temperature 0, else sampled): `generate` without a strategy then decodes with it.
        Prompts as `benchmark` takes them; `progress` receives a line per step."""
        _require_counts(num_prompts=num_prompts, prompt_len=prompt_len,
                        max_new_tokens=max_new_tokens, exits=exits, confirm=confirm)
        if isinstance(num_draft, (str, int)) or not num_draft:
            raise ValueError(f"num_draft={num_draft!r} must be a non-empty list of counts")
        _require_counts(**{f"num_draft[{i}]": k for i, k in enumerate(num_draft)})
        trees = [decoding_options(self.decoding_defaults, self.config, {"tree": tree},
                                  prefix="trees: ").tree for tree in trees]
        if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or budget_s <= 0:
            raise ValueError(f"budget_s={budget_s!r} must be a number of seconds > 0")
        sampling = sampling_or_greedy(temperature, top_k, top_p)
        runnable = tunable(self._loaded.draft_weights)
        _check_tunable(runnable if strategies is None else strategies, runnable)
        names = runnable if strategies is None else list(strategies)
        if write:
            check_writable(self.workdir, f"the tuned default into {self.workdir} (write=False "
                           "only reports it)")
        encoded = self._timed_prompts(prompts, prompt_set, num_prompts, prompt_len)
        started = time.perf_counter()
        report = None
        if EXITS in names and self.config.num_layers > 1:
            progress("exit report: ranking the exits ...")
            kangaroo = self._loaded.draft_weights.get("kangaroo") if "kangaroo" in names else None
            report = self._tune_report(encoded, num_draft, max_new_tokens, progress, sampling,
                                       adapter=None if kangaroo is None else kangaroo.params)
        found = candidates(names, self.decoding_defaults, report, exits=exits,
                           num_draft=num_draft, trees=trees)
        tuning = tune(
            self.generator, lambda c: self._tunable_drafter(c, sampling, encoded), found,
            encoded, max_new_tokens=max_new_tokens, budget_s=budget_s, started=started,
            sampling=sampling,
            played=None if report is None else functools.partial(
                played_speedup, report, self.config,
                forced=ForcedPlays(self.generator, self._loaded.params)),
            confirm=confirm, progress=progress)
        if write:
            mode = decoding_mode(sampling)
            choice = {"strategy": tuning.winner.strategy, "options": dict(tuning.winner.options)}
            write_calibrated(self.workdir, int(self.step), {}, {f"tuned_{mode}": {
                **tuning.to_dict(), "temperature": temperature, "top_k": top_k,
                "top_p": top_p}}, tuned={mode: choice})
            self.meta.setdefault("tuned", {})[mode] = choice
            progress(f"stored {tuning.winner.label} as the {mode} default of {self.workdir}")
        return tuning

    def _tunable_drafter(self, candidate: Candidate, sampling: SamplingParams | None,
                         encoded: Sequence[Any]) -> Drafter:
        """A tuner candidate's drafter, bound to its weights once to check them: a candidate
        they cannot serve (K=6 from 4 Medusa heads) is refused (a ValueError) before its probe
        instead of ending the search."""
        drafter = self.strategy(candidate.strategy, sampling, encoded, **candidate.options)
        self.generator.with_weights(drafter, None)
        return drafter

    def _tune_report(self, encoded: Sequence[Any], num_draft: Sequence[int],
                     max_new_tokens: int, progress: Callable[[str], None],
                     sampling: SamplingParams | None,
                     adapter: Any = None) -> DraftExitReport:
        """The exit report ranking `tune`'s exits on its own prompts (the workload, which alone
        makes its predictions): its held-out metrics, which only the table shows, on one batch
        of windows of the workdir's documents, or for an import (no data recorded) of the
        prompts themselves (the default 32,768 tokens would pass through every exit's head:
        49,152-way on SmolLM2); its costs include a Kangaroo `adapter`'s block, when given,
        which the tuner prices Kangaroo's rounds with."""
        texts = seq_len = None
        if not self.meta.get("config", {}).get("data"):
            texts = [self.tokenizer.decode(list(ids)) for ids in encoded]
            seq_len = max(1, min(len(ids) for ids in encoded) - 1)
        seq_len = seq_len or heldout_data(self.meta).seq_len
        return self._workload_report(encoded, max_new_tokens, progress, texts, sampling,
                                     seq_len=seq_len, max_tokens=TUNE_REPORT_WINDOWS * seq_len,
                                     batch_size=TUNE_REPORT_WINDOWS, num_draft=num_draft,
                                     adapter=adapter)

    def _workload_report(self, encoded: Sequence[Any] | None, max_new_tokens: int,
                         progress: Callable[[str], None], texts: Sequence[str] | None,
                         sampling: SamplingParams | None = None,
                         **options: Any) -> DraftExitReport:
        """`model_exit_report` with the drafts' vocabulary, then on the `encoded` prompts'
        continuations (`exit_report.on_workload`) unless None, greedy or drawn with
        `sampling`, which also times its pieces and loop (a sampled tuning's rounds)."""
        report = model_exit_report(self._loaded.params, self.config, self.tokenizer, self.meta,
                                   texts, draft_vocab=self.decoding_defaults.draft_vocab,
                                   sampling=sampling, **options)
        if encoded is None:
            return report
        return on_workload(
            report, self._loaded.params, self.config, self.generator,
            lambda e, k: self.strategy(EXITS, sampling, encoded, exit_layer=e, num_draft=k),
            encoded, max_new_tokens=max_new_tokens,
            draft_ids=self.generator.draft_ids(self.decoding_defaults),  # reads its draft_vocab
            sampling=sampling, progress=progress)

    @keywords.checked(EXIT_REPORT_OPTIONS)
    def exit_report(self, texts: Sequence[str] | None = None, *, workload: bool = True,
                    prompts: Sequence[str] | None = None, prompt_set: str | None = None,
                    num_prompts: int = 8, prompt_len: int = 128, max_new_tokens: int = 128,
                    temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                    progress: Callable[[str], None] = lambda line: None,
                    **options: Any) -> DraftExitReport:
        """Per exit, held-out loss, top-1 accuracy and agreement with the last layer, and the
        predicted tau and speed-up of drafting K tokens from it. `texts`: held-out documents
        (default: the validation documents of the workdir's data); `options`:
        `exit_report.model_exit_report`'s (seq_len=, max_tokens=, num_draft=, costs=...).
        With `workload`, the predictions are the benchmark's on prompts as `benchmark` takes
        them (an import's default: held-out windows of the embedded corpus), from the model's
        continuations of them and the real decode loop (`exit_report.on_workload`), greedy at
        temperature 0, else sampled (its continuations, acceptance and timed rounds);
        without, greedy estimates from the held-out text and the pieces alone. The same
        report as `infer/exit_report.py`."""
        if isinstance(texts, str):
            raise ValueError("texts must be a list of documents, not one string")
        _require_counts(**{name: options[name] for name in _EXIT_REPORT_COUNTS
                           if options.get(name) is not None})
        encoded = None
        if workload:
            _require_counts(num_prompts=num_prompts, prompt_len=prompt_len,
                            max_new_tokens=max_new_tokens)
            # held-out windows of the run's data, else (an import) of the embedded corpus
            encoded = (self._timed_prompts(prompts, prompt_set, num_prompts, prompt_len)
                       if prompts is not None or prompt_set else
                       heldout_prompts(heldout_data(self.meta), self.tokenizer, num_prompts,
                                       prompt_len))
        elif prompts is not None or prompt_set:
            raise ValueError("prompts and prompt_set are the workload's: they need "
                             "workload=True")
        sampling = sampling_or_greedy(temperature, top_k, top_p)
        if sampling is not None and not workload:
            raise ValueError("a sampled report plays the model's sampled continuations of the "
                             "workload: it needs workload=True")
        return self._workload_report(encoded, max_new_tokens, progress, texts, sampling,
                                     **options)


_EXIT_REPORT_COUNTS = ("seq_len", "max_tokens", "batch_size", "context", "repeats")


def _require_counts(**counts: Any) -> None:
    """`config.require_count` for each keyword, in order: the first that is not an int >= 1
    is a one-line error (`max_new_tokens="8"`), as the command line's counts are."""
    for name, value in counts.items():
        require_count(name, value)


def _check_tunable(names: Any, runnable: Sequence[str]) -> None:
    """`tune`'s strategies: a non-empty list of names it can run here (`runnable`)."""
    if isinstance(names, str) or not names:
        raise ValueError(f"strategies must be a non-empty list of names from {runnable}, not "
                         f"{names!r}")
    wrong = [name for name in names if name not in runnable]
    if wrong:
        raise ValueError(f"strategy {wrong[0]!r} cannot be tuned here; choose from {runnable} "
                         "(a trained drafter's strategy needs its workdir loaded)")


def _check_settings(settings: Any) -> None:
    """`benchmark`'s settings must map labels to option dicts; a one-line error naming what
    is not one."""
    if not isinstance(settings, Mapping):
        got = type(settings).__name__
    else:
        got = next((f"{type(options).__name__} for {label!r}"
                    for label, options in settings.items() if not isinstance(options, Mapping)),
                   None)
    if got:
        raise ValueError("settings must map labels to option dicts, e.g. {'K=4': "
                         f"{{'num_draft': 4}}}}; got {got}")


def _require_path(name: str, value: Any) -> None:
    """A one-line error when a path argument is not a path (`train(None, ...)`)."""
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{name} must be a path (a string), not {type(value).__name__}")


def _prompt_inputs(prompts: Any, messages: Any) -> tuple[list[PromptInput], bool]:
    """`generate`'s prompts as a list, and whether one was given alone: a string or token ids
    (a tuple in the list), a list of them, one conversation or a list of conversations."""
    if (prompts is None) == (messages is None):
        raise ValueError("give prompts or messages (a conversation, or a list of them), not "
                         "both and not neither")
    if messages is not None:
        single = bool(messages) and isinstance(messages[0], Mapping)
        conversations = [messages] if single else list(messages)
        if not conversations:
            raise ValueError("messages is an empty list")
        return [check_messages(c) for c in conversations], single
    single = isinstance(prompts, str) or token_ids(prompts) is not None
    given = ([prompts] if single else
             list(prompts) if isinstance(prompts, (list, tuple, np.ndarray)) else [])
    items = [p if isinstance(p, str) else token_ids(p) for p in given]
    wrong = [p for p, item in zip(given, items, strict=True) if item is None]
    if not items or wrong:
        raise ValueError("prompts must be a string, a list of token ids or a non-empty list of "
                         f"them, not {type(prompts).__name__}"
                         + (f" holding a {type(wrong[0]).__name__}" if wrong else ""))
    return items, single


def load(workdir: str, step: int | None = None,
         draft_workdir: str | Sequence[str] | None = None) -> LanguageModel:
    """The model of a training or import workdir: its latest checkpoint (or `step`), falling
    back to the newest readable one; `draft_workdir`, one or several workdirs of drafters for
    it: a model (strategy "draft") or heads trained on it ("kangaroo", "specdec")."""
    _require_path("workdir", workdir)
    if step is not None:
        require_kind("step", step, int)
    return LanguageModel(load_model(workdir, step, draft_workdir))


def bench(workdir: str, settings: Mapping[str, Mapping[str, Any]],
          **options: Any) -> list[dict[str, Any]]:
    """`load(workdir).benchmark(settings, **options)`: `ar` and each labelled setting timed on
    held-out prompts, one row each."""
    return load(workdir).benchmark(settings, **options)


def import_hf(hf_dir: str | None = None, workdir: str | None = None, *, gguf: str | None = None,
              dtype: str | None = None, tokenizer: str | None = None) -> LanguageModel:
    """Imports a Hugging Face checkpoint (Llama, Mistral, Qwen2, Mamba-2, Bamba: config.json
    and safetensors) or a Llama-family GGUF file into a new workdir, as `tools/convert.py`
    does, and loads it; its tokenizer comes along, with its conventions and chat template
    (`tokenizer="bytes"`: specjax's byte tokenizer instead). `hf_dir`: a local folder, or a
    Hub id ("HuggingFaceTB/SmolLM2-135M") downloaded or found in the Hugging Face cache."""
    from specjax.convert.hf import import_checkpoint
    from specjax.convert.hub import checkpoint_folder

    if (hf_dir is None) == (gguf is None) or workdir is None:
        raise ValueError("import_hf takes a Hugging Face folder or Hub id, or gguf=FILE, and a "
                         "workdir")
    for name, path in (("hf_dir", hf_dir), ("gguf", gguf), ("workdir", workdir)):
        if path is not None:
            _require_path(name, path)
    import_checkpoint(gguf or checkpoint_folder(hf_dir), workdir, dtype=dtype,
                      tokenizer=tokenizer)
    return load(workdir)


def train(config: str | Mapping[str, Any], workdir: str,
          overrides: Mapping[str, Any] | None = None) -> LanguageModel:
    """Trains the run `config` describes in `workdir` (or resumes it; a finished run is only
    loaded) and returns its model. `config`: a shipped config's name or a config file, as
    `train/train.py` takes it ("tiny_code:smoke", "my_config.py:variant"), or its sections as
    a dict; `overrides`: dotted fields ({"train.total_steps": 50}), which must exist in the
    config, as on the command line."""
    from specjax.training.trainer import train_and_evaluate  # training stays out of `load`

    _require_path("workdir", workdir)
    if not isinstance(overrides, (Mapping, type(None))):
        raise ValueError("overrides must be a dict of dotted fields ({'train.total_steps': 50}), "
                         f"not {type(overrides).__name__}")
    sections = read_config(config)
    for field, value in (overrides or {}).items():
        *path, leaf = field.split(".")
        section = sections
        for key in path:  # a dict config may leave sections to their defaults; a file may not
            if not isinstance(config, str) and isinstance(section, dict):
                section = section.setdefault(key, {})
            else:
                section = section.get(key) if isinstance(section, dict) else None
        if not isinstance(section, dict) or (isinstance(config, str) and leaf not in section):
            raise ValueError(f"override {field!r}: no such config field")
        section[leaf] = value
    result = train_and_evaluate(sections, workdir, explicit=tuple(overrides or ()))
    if result.interrupted:
        raise KeyboardInterrupt(f"training interrupted at step {result.step}; the checkpoint "
                                f"is saved in {workdir}: call train again to resume")
    return load(workdir)


def read_config(config: str | Mapping[str, Any]) -> dict[str, Any]:
    """A config's sections as a fresh dict: a shipped config's or a config file's
    `get_config(variant)` ("tiny_code:smoke", as `train/train.py` takes it) or a copy of a
    dict."""
    if isinstance(config, str):
        config = load_config_file(config)
    if hasattr(config, "to_dict"):  # an ml_collections.ConfigDict
        return config.to_dict()
    if not isinstance(config, Mapping):
        raise ValueError("config must be a shipped config or a config file ('tiny_code:smoke') "
                         f"or a dict of sections, not {type(config).__name__}")
    return copy.deepcopy(dict(config))


def strategies() -> list[str]:
    """The decoding strategies `generate(strategy=...)` and the command-line tools accept."""
    return sorted(STRATEGIES)
