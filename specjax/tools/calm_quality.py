"""What CALM's early exits cost in quality, per threshold: the losses Learn-then-Test bounds and
the bench's quality columns.

Two consistencies (CALM, §3), each a loss in [0, 1] per held-out prompt:
  textual  1 - ROUGE-L F1 between the early-exit greedy output and the full model's greedy
           output (token ids; no reference text needed). ROUGE-L's longest common subsequence
           tolerates the shift that follows one differing token, where a position-by-position
           comparison would count every later token as wrong.
  risk     the excess per-token log-loss (nats) of the reference continuation under the
           early exits' distributions over the full model's, teacher-forced
           (`forced.forced_losses`), clipped to [0, 1].
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from specjax.data import heldout_data, heldout_prompts
from specjax.decoding.drafters.calm import Calm
from specjax.decoding.engine import AUTOREGRESSIVE, Generator
from specjax.timing import progress_bar
from specjax.tokenizer import Tokenizer
from specjax.tools.forced import forced_losses

CONSISTENCIES = ("textual", "risk")


def rouge_l(candidate: Sequence[int], reference: Sequence[int]) -> float:
    """ROUGE-L F1: the longest common subsequence's harmonic mean of precision and recall (1 for
    two empty sequences)."""
    if not candidate or not reference:
        return float(len(candidate) == len(reference))
    a, b = np.asarray(candidate), np.asarray(reference)
    row = np.zeros(len(b) + 1, np.int64)
    for token in a:  # LCS row by row: L[i][j] = max(L[i-1][j], L[i][j-1], L[i-1][j-1] + match)
        diagonal = np.where(b == token, row[:-1] + 1, 0)
        row = np.maximum.accumulate(np.concatenate([[0], np.maximum(row[1:], diagonal)]))
    common = row[-1]
    if common == 0:
        return 0.0
    precision, recall = common / len(a), common / len(b)
    return float(2 * precision * recall / (precision + recall))


def heldout_continuations(meta: dict, tokenizer: Tokenizer, count: int, prompt_len: int,
                          new_tokens: int, **windows: int
                          ) -> tuple[list[list[int]], list[list[int]]]:
    """Prompts of `prompt_len` tokens from the held-out documents of a checkpoint's corpus and
    their next `new_tokens` tokens (`data.heldout_prompts` windows; `windows`: its
    skip_documents and per_document)."""
    found = heldout_prompts(heldout_data(meta), tokenizer, count, prompt_len + new_tokens,
                            **windows)
    return [w[:prompt_len] for w in found], [w[prompt_len:] for w in found]


@dataclasses.dataclass(frozen=True)
class Quality:
    """One threshold's quality on n prompts: per-prompt losses of each consistency ([n] in
    [0, 1]), the mean exit of the generated tokens (decoding) and of the reference tokens
    (teacher-forced), and the mean per-token log-loss of the reference text (nats)."""

    threshold: float
    losses: dict[str, np.ndarray]
    mean_exit: float
    forced_mean_exit: float
    log_loss: float

    @property
    def agreement(self) -> float:
        """Mean ROUGE-L F1 with the full model's greedy output."""
        return float(1 - self.losses["textual"].mean())


def measure_quality(generator: Generator, strategy: Calm, thresholds: Sequence[float],
                    prompts: Sequence[Sequence[int]], references: Sequence[Sequence[int]],
                    batch_size: int = 16) -> list[Quality]:
    """Each threshold's `Quality` on `prompts`, with `references` (equal lengths T) their
    held-out continuations; greedy outputs of T tokens. One compiled program per shape serves
    every threshold."""
    steps = len(references[0])
    if any(len(r) != steps for r in references) or len(references) != len(prompts):
        raise ValueError("every prompt needs a reference continuation of one common length")
    batches = [slice(i, i + batch_size) for i in range(0, len(prompts), batch_size)]

    def decode(calm: Calm | None) -> tuple[list[list[int]], list[list[int]]]:
        tokens, exits = [], []
        for batch in batches:
            out = generator.generate(prompts[batch], max_new_tokens=steps,
                                     strategy=AUTOREGRESSIVE if calm is None else calm)
            tokens += out.tokens
            exits += [t.get("exit", [])[1:] for t in out.trace]
        return tokens, exits

    def forced(calm: Calm) -> tuple[np.ndarray, np.ndarray]:
        calm, params = generator.with_weights(calm, None)
        calm.validate(generator.cfg)
        losses, exits = [], []
        for batch in batches:
            padded, lengths = generator.pad(prompts[batch])
            loss, exit_ = forced_losses(generator.params, params, padded, lengths,
                                        np.asarray(references[batch], np.int32),
                                        cfg=generator.cfg, early_exit=calm.early_exit,
                                        cache_len=generator.cache_len(padded.shape[1], steps, 0))
            losses.append(np.asarray(loss))
            exits.append(np.asarray(exit_)[:, 1:])
        return np.concatenate(losses), np.concatenate(exits)

    full_tokens, _ = decode(None)
    full_loss, _ = forced(dataclasses.replace(strategy, threshold=1.0))
    results = []
    for threshold in progress_bar(thresholds, desc="CALM thresholds"):
        calm = dataclasses.replace(strategy, threshold=float(threshold))
        tokens, exits = decode(calm)
        loss, forced_exits = forced(calm)
        textual = np.asarray([1 - rouge_l(t, f) for t, f in zip(tokens, full_tokens,
                                                                 strict=True)])
        risk = np.clip((loss - full_loss).mean(axis=1), 0.0, 1.0)
        results.append(Quality(float(threshold), {"textual": textual, "risk": risk},
                               float(np.mean([e for row in exits for e in row])),
                               float(forced_exits.mean()), float(loss.mean())))
    return results
