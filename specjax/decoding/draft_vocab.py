"""Drafting over part of the vocabulary (FR-Spec, Zhao et al. 2025): which drafters may, and
the option that says how many ids.

A drafter whose draft logits come from a vocabulary head (selfspec, skip, kangaroo, specdec,
calmdraft through the target's shared head; eagle, mtp and medusa through theirs) drafts over
the N most frequent ids of a ranking (`specjax.io.draft_vocab`, made by `infer/draft_vocab.py`)
when its `draft_vocab` is N: a smaller head (`heads.vocab_subset`), whose draft distribution q
is zero outside the N ids. Verification keeps the full head, so greedy output is the target's and
sampled output keeps the target's law (acceptance reads that q). 0 drafts over the whole
vocabulary.
"""

from __future__ import annotations

import dataclasses

from specjax.config import ModelConfig
from specjax.decoding.options import option


def _within_vocabulary(value: int, cfg: ModelConfig) -> str | None:
    return (None if 0 <= value <= cfg.vocab_size
            else f"must lie in [0, vocab_size = {cfg.vocab_size}] (0: the whole vocabulary)")


@dataclasses.dataclass(frozen=True)
class VocabOptions:
    """How many ids a drafter with a vocabulary head drafts over."""

    draft_vocab: int = option(
        0, "Drafters with a vocabulary head (selfspec, skip, kangaroo, specdec, calmdraft, "
           "eagle, mtp, medusa): "
           "draft over the N most frequent ids of the workdir's ranking (infer/draft_vocab.py), "
           "a smaller head; verification keeps the full one, so the output is unchanged. 0: the "
           "whole vocabulary.", _within_vocabulary)


@dataclasses.dataclass(frozen=True)
class VocabHead:
    """A drafter that drafts through a vocabulary head: `draft_vocab` ids (0: all), set by the
    registry from `VocabOptions`."""

    draft_vocab: int = dataclasses.field(default=0, kw_only=True)

    def vocab_label(self) -> str:
        """A report label's suffix when drafting over part of the vocabulary (" vocab N")."""
        return f" vocab {self.draft_vocab}" if self.draft_vocab else ""
