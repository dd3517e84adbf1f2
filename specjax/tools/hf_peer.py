"""Peer benchmark: Hugging Face transformers' greedy `generate()` and its equivalents of specjax's
strategies (`Drafter.hf_options`: LayerSkip's `assistant_early_exit`, prompt lookup, assisted
generation with the same draft model) on the same weights, exported from specjax workdirs,
timed like specjax's strategies (warm-up, interleaved repeats, median per prompt).

Needs the optional `hf` extra (torch, transformers); only `bench/bench.py --compare_hf` imports
it. EOS is disabled rather than suppressed, so every run generates exactly max_new_tokens with
unmodified logits and the greedy outputs can be compared token for token. transformers'
assisted decoding can be far slower than plain decoding (a shallow exit that rarely agrees),
so each variant's warm-up on the first prompt projects its timed runs, and a variant whose
projection exceeds the budget is reported as skipped rather than run for an hour.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence

from specjax.convert.hf import export_checkpoint
from specjax.decoding.drafter import Drafter
from specjax.decoding.drafters.draft_model import ASSISTANT
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.timing import time_interleaved


@dataclasses.dataclass(frozen=True)
class PeerResult:
    """One HF variant's time and output, and the label of the specjax strategy it stands for;
    `skipped`: why it was not timed (its projected time past the budget)."""

    name: str
    specjax: str
    seconds: float
    generated: list[list[int]]
    skipped: str | None = None

    @property
    def tokens_per_second(self) -> float | None:
        if self.skipped:
            return None
        return sum(len(g) for g in self.generated) / self.seconds


def hf_peer_benchmark(workdir: str, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                      strategies: Mapping[str, Drafter], repeats: int = 3,
                      draft_workdir: str | None = None, budget_seconds: float = 900.0,
                      progress: Callable[[str], None] | None = None) -> list[PeerResult]:
    """Times, batch 1, fp32, CPU: HF greedy decoding (for `ar`) and, for every strategy with an
    HF equivalent, HF with its options (`hf_options`: the same policy for a selfspec chain; for
    `ngram` the same sizes, while HF copies after the earliest match; for `draft` assisted
    generation with `draft_workdir`'s model); for a selfspec chain also HF's own early-exit
    policy at its exit (a draft length adapted each round, at most 20, stopping at a draft
    confidence below 0.4). A variant whose warm-up projects more than `budget_seconds` for its
    timed runs is skipped. `progress` gets a line per variant warmed and per repeat."""
    import torch
    import transformers

    progress = progress or (lambda line: None)
    model = _exported(workdir, transformers, torch)
    assistant = None
    variants = {"hf greedy": ("ar", {})}
    for label, strategy in strategies.items():
        options = strategy.hf_options()
        if options is None:
            continue
        if options.get("assistant_model") == ASSISTANT:
            if draft_workdir is None:
                continue
            assistant = assistant or _exported(draft_workdir, transformers, torch)
            options = {**options, "assistant_model": assistant}
        if isinstance(strategy, SelfSpeculative):  # once per exit, beside its first chain
            variants.setdefault(f"hf assistant_early_exit={strategy.exit_layer} (HF's policy)",
                                (label, {"assistant_early_exit": strategy.exit_layer}))
        variants[f"hf {label}"] = (label, options)

    def run(options, prompt):
        with torch.no_grad():
            out = model.generate(torch.tensor([list(prompt)]), max_new_tokens=max_new_tokens,
                                 do_sample=False, **options)
        return out[0, len(prompt):].tolist()

    skipped = {}
    for name, (_, options) in variants.items():
        progress(f"hf: warming up {name}")
        seconds = _timed(run, options, prompts[0])
        projected = seconds * len(prompts) * repeats
        if projected > budget_seconds:
            skipped[name] = (f"one prompt took {seconds:.0f} s: {len(prompts)} prompts x "
                             f"{repeats} repeats would take about {projected / 60:.0f} min, "
                             f"past the {budget_seconds / 60:.0f} min budget")
            progress(f"hf: skipping {name} ({skipped[name]})")
    timed = {name: value for name, value in variants.items() if name not in skipped}
    calls = {name: lambda index, options=options: run(options, prompts[index])
             for name, (_, options) in timed.items()}
    started = time.perf_counter()
    times, generated = time_interleaved(
        calls, len(prompts), repeats,
        lambda done: progress(f"hf: timed repeat {done}/{repeats} of {', '.join(calls)} "
                              f"({time.perf_counter() - started:.0f} s)"))
    return [PeerResult(name, label, 0.0, [], skipped[name]) if name in skipped else
            PeerResult(name, label, sum(statistics.median(t) for t in times[name]),
                       generated[name]) for name, (label, _) in variants.items()]


def _exported(workdir: str, transformers, torch):
    """The workdir's model as transformers loads it (exported to a temporary folder), fp32,
    with EOS disabled."""
    with tempfile.TemporaryDirectory() as exported:
        export_checkpoint(workdir, exported)
        model = transformers.AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32)
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _timed(run, options, prompt) -> float:
    started = time.perf_counter()
    run(options, prompt)
    return time.perf_counter() - started
