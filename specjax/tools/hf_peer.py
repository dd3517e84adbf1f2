"""Peer benchmark: Hugging Face transformers' greedy `generate()` and its equivalents of specjax's
strategies (`Drafter.hf_options`: LayerSkip's `assistant_early_exit`, prompt lookup) on the
same weights, exported from a specjax workdir, timed like specjax's strategies (warm-up,
interleaved repeats, median per prompt).

Needs the optional `hf` extra (torch, transformers); only `infer/bench.py --compare_hf` imports
it. EOS is disabled rather than suppressed, so every run generates exactly max_new_tokens with
unmodified logits and the greedy outputs can be compared token for token.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
from collections.abc import Mapping, Sequence

from specjax.convert.hf import export_checkpoint
from specjax.decoding.drafter import Drafter
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.timing import time_interleaved


@dataclasses.dataclass(frozen=True)
class PeerResult:
    """One HF variant's time and output, and the label of the specjax strategy it stands for."""

    name: str
    specjax: str
    seconds: float
    generated: list[list[int]]

    @property
    def tokens_per_second(self) -> float:
        return sum(len(g) for g in self.generated) / self.seconds


def hf_peer_benchmark(workdir: str, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                      strategies: Mapping[str, Drafter], repeats: int = 3) -> list[PeerResult]:
    """Times, batch 1, fp32, CPU: HF greedy decoding (for `ar`) and, for every strategy with an
    HF equivalent, HF with its options (`hf_options`: the same policy for a selfspec chain; for
    `ngram` the same sizes, while HF copies after the earliest match); for a selfspec chain
    also HF's own early-exit policy at its exit (a draft length adapted each round, at most
    20, stopping at a draft confidence below 0.4)."""
    import torch
    import transformers

    with tempfile.TemporaryDirectory() as exported:
        export_checkpoint(workdir, exported)
        model = transformers.AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32)
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    variants = {"hf greedy": ("ar", {})}
    for label, strategy in strategies.items():
        options = strategy.hf_options()
        if options is None:
            continue
        if isinstance(strategy, SelfSpeculative):  # once per exit, beside its first chain
            variants.setdefault(f"hf assistant_early_exit={strategy.exit_layer} (HF's policy)",
                                (label, {"assistant_early_exit": strategy.exit_layer}))
        variants[f"hf {label}"] = (label, options)

    def run(options, prompt):
        with torch.no_grad():
            out = model.generate(torch.tensor([list(prompt)]), max_new_tokens=max_new_tokens,
                                 do_sample=False, **options)
        return out[0, len(prompt):].tolist()

    for _, options in variants.values():
        run(options, prompts[0])
    calls = {name: lambda index, options=options: run(options, prompts[index])
             for name, (_, options) in variants.items()}
    times, generated = time_interleaved(calls, len(prompts), repeats)
    return [PeerResult(name, label, sum(statistics.median(t) for t in times[name]),
                       generated[name]) for name, (label, _) in variants.items()]
