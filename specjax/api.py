"""The API for notebooks and scripts: load a workdir, generate text, list the strategies.

    import specjax
    model = specjax.load("runs/tiny")
    print(model.generate("def main(", max_new_tokens=64).text)
    model.generate(["import os", "class A:"], strategy="ar", temperature=0.8, seed=1)
    specjax.strategies()  # ['ar', 'selfspec', 'skip']

Everything below is the same machinery as `infer/generate.py`: the checkpoint's decoding
defaults, overridable per call, one compiled program per shape.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from specjax.config import DecodingConfig, ModelConfig
from specjax.decoding.cli import decoding_defaults, decoding_options
from specjax.decoding.drafter import Drafter
from specjax.decoding.engine import RowStats
from specjax.decoding.registry import STRATEGIES, make_strategy
from specjax.decoding.sampling import sampling_or_greedy
from specjax.exit_report import DraftExitReport, model_exit_report
from specjax.loading import LoadedModel, load_model
from specjax.tokenizer import Tokenizer, get_tokenizer


@dataclasses.dataclass(frozen=True)
class Completion:
    """One prompt's generated text, its decoding statistics (tau, acceptance_rate...) and its
    per-token trace (strategy calm: {"exit": [...], "confidence": [...]}, -1 for the first
    token; empty otherwise)."""

    prompt: str
    text: str
    stats: RowStats
    trace: dict[str, list] = dataclasses.field(default_factory=dict)


class LanguageModel:
    """A workdir's model with its tokenizer and decoding defaults, ready to generate."""

    def __init__(self, loaded: LoadedModel):
        self.config: ModelConfig = loaded.cfg
        self.step = loaded.meta.get("step")
        self.tokenizer: Tokenizer = get_tokenizer(loaded.meta.get("tokenizer", "bytes"),
                                                  loaded.workdir)
        self.decoding_defaults: DecodingConfig = decoding_defaults(loaded.meta)
        self._loaded = loaded
        self._generator = loaded.generator()

    def generate(self, prompts: str | Sequence[str], *, max_new_tokens: int = 128,
                 strategy: str | Drafter = "selfspec", temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                 **options: Any) -> Completion | list[Completion]:
        """Completes one prompt (returns a `Completion`) or several (a list, decoded as one
        batch), stopping at the tokenizer's end-of-sequence id.

        Greedy at temperature 0 (the same text whatever the strategy); otherwise sampled, with
        exactly the model's distribution. `strategy` is a name from `strategies()` built from
        the checkpoint's decoding defaults with `options` (exit_layer=, num_draft=, tree=...)
        overriding them, or a `Drafter`.
        """
        texts = ([prompts] if isinstance(prompts, str) else
                 list(prompts) if isinstance(prompts, (list, tuple)) else [])
        if not texts or not all(isinstance(text, str) for text in texts):
            raise ValueError(f"prompts must be a string or a non-empty list of strings, not "
                             f"{type(prompts).__name__}"
                             + (f" of {type(texts[0]).__name__}" if texts and not isinstance(
                                 prompts, (bytes, str)) else ""))
        sampling = sampling_or_greedy(temperature, top_k, top_p)
        if isinstance(strategy, str):
            strategy = make_strategy(strategy, decoding_options(
                self.decoding_defaults, self.config, options, [strategy]))
        elif options:
            raise ValueError(f"options {sorted(options)} apply to a strategy name, not to a "
                             "Drafter (build it with them instead)")
        encoded = [self.tokenizer.encode(text, add_bos=True) for text in texts]
        self._loaded.warn_long_prompts([len(ids) for ids in encoded])
        out = self._generator.generate(
            encoded,
            max_new_tokens=max_new_tokens, strategy=strategy, sampling=sampling, seed=seed,
            eos_id=self.tokenizer.eos_id)
        completions = [Completion(text, self.tokenizer.decode(tokens), stats, trace)
                       for text, tokens, stats, trace in zip(texts, out.tokens, out.stats,
                                                             out.trace, strict=True)]
        return completions[0] if isinstance(prompts, str) else completions

    def exit_report(self, texts: Sequence[str] | None = None, **options: Any) -> DraftExitReport:
        """Per exit, held-out loss, top-1 accuracy and agreement with the last layer, and the
        predicted tau and speed-up of drafting K tokens from it (estimates; infer/bench.py
        measures). `texts`: held-out documents (default: the validation documents of the
        workdir's data); `options`: `exit_report.model_exit_report`'s (seq_len=, max_tokens=,
        num_drafts=, costs=...). The same report as `infer/exits.py`."""
        return model_exit_report(self._loaded.params, self.config, self.tokenizer,
                                 self._loaded.meta, texts, **options)


def load(workdir: str, step: int | None = None,
         draft_workdir: str | Sequence[str] | None = None) -> LanguageModel:
    """The model of a training or import workdir: its latest checkpoint (or `step`), falling
    back to the newest readable one; `draft_workdir`, one or several workdirs of drafters for
    it: a model (strategy "draft") or heads trained on it ("kangaroo", "specdec")."""
    return LanguageModel(load_model(workdir, step, draft_workdir))


def strategies() -> list[str]:
    """The decoding strategies `generate(strategy=...)` and the command-line tools accept."""
    return sorted(STRATEGIES)
