"""Peer benchmark: Hugging Face transformers' greedy `generate()` and its LayerSkip integration
(`assistant_early_exit`) on the same weights, exported from a specjax workdir, timed like
specjax's strategies (warm-up, interleaved repeats, median per prompt).

Needs the optional `hf` extra (torch, transformers); only `infer/bench.py --compare_hf` imports
it. EOS is disabled rather than suppressed, so every run generates exactly max_new_tokens with
unmodified logits and the greedy outputs can be compared token for token.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
from collections.abc import Sequence

from specjax.convert.hf import export_checkpoint
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.tools.timing import time_interleaved


@dataclasses.dataclass(frozen=True)
class PeerResult:
    name: str
    seconds: float
    generated: list[list[int]]

    @property
    def tokens_per_second(self) -> float:
        return sum(len(g) for g in self.generated) / self.seconds


def hf_peer_benchmark(workdir: str, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                      strategy: SelfSpeculative, repeats: int = 3) -> list[PeerResult]:
    """Times, batch 1, fp32, CPU: HF greedy decoding; HF early-exit self-speculation at the
    strategy's exit layer with HF's defaults (a draft length adapted each round, at most 20,
    stopping at a draft confidence below 0.4); and the same with the strategy's own policy
    (`SelfSpeculative.hf_options`: at most K drafts, the same confidence stop)."""
    import torch
    import transformers

    with tempfile.TemporaryDirectory() as exported:
        export_checkpoint(workdir, exported)
        model = transformers.AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32)
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    exit_layer, same_policy = strategy.exit_layer, strategy.hf_options()
    variants = {
        "hf greedy": {},
        f"hf assistant_early_exit={exit_layer}": {"assistant_early_exit": exit_layer},
        f"hf assistant_early_exit={exit_layer} K={same_policy['num_assistant_tokens']} "
        f"eta={same_policy['assistant_confidence_threshold']:g}": same_policy,
    }

    def run(options, prompt):
        with torch.no_grad():
            out = model.generate(torch.tensor([list(prompt)]), max_new_tokens=max_new_tokens,
                                 do_sample=False, **options)
        return out[0, len(prompt):].tolist()

    for options in variants.values():
        run(options, prompts[0])
    calls = {name: lambda index, options=options: run(options, prompts[index])
             for name, options in variants.items()}
    times, generated = time_interleaved(calls, len(prompts), repeats)
    return [PeerResult(name, sum(statistics.median(t) for t in times[name]), generated[name])
            for name in variants]
