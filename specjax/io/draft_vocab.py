"""A workdir's ranking of token ids for drafting over part of the vocabulary
(`decoding.draft_vocab`), kept beside its checkpoints in `draft_vocab.json`.

The ranking is the ids by how often they occur in some text (the workdir's training data, or a
given file), most frequent first, ties by id; a drafter with `draft_vocab` = N drafts over the
first N. `infer/draft_vocab.py` makes it and records N as the workdir's decoding default; an
imported EAGLE-3 head with a reduced vocabulary records its own ids (`within` its base's
ranking) and their number.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from specjax.outputs import staged

FILE = "draft_vocab.json"


def rank_ids(token_rows: Iterable[Iterable[int]], vocab_size: int, size: int) -> np.ndarray:
    """The `size` most frequent ids of `token_rows`, most frequent first, ties (and ids never
    seen, which follow every seen one) by ascending id."""
    counts = np.zeros(vocab_size, np.int64)
    for row in token_rows:
        counts += np.bincount(np.asarray(list(row), np.int64), minlength=vocab_size)[:vocab_size]
    return np.lexsort((np.arange(vocab_size), -counts))[:size]


def within(ranking: np.ndarray | None, ids: np.ndarray) -> np.ndarray:
    """`ids` ranked as `ranking` ranks them, those it lacks (all of them when there is none)
    after them by ascending id: a head that drafts only its own ids (EAGLE-3's d2t) drafts
    over the most frequent of them."""
    ranked = np.zeros(0, np.int64) if ranking is None else ranking[np.isin(ranking, ids)]
    return np.concatenate([ranked, np.setdiff1d(ids, ranked)]).astype(np.int64)


def write_ranking(workdir: str, ids: np.ndarray, source: dict[str, Any]) -> str:
    """Records the ranking (and where it came from) in one atomic rename; returns the path."""
    path = os.path.join(workdir, FILE)
    with staged(path) as partial, open(partial, "w", encoding="utf-8") as f:
        json.dump({"ids": [int(i) for i in ids], "source": source}, f)
    return path


def read_ranking(workdir: str, vocab_size: int) -> np.ndarray | None:
    """The workdir's ranking (None when it has none); a one-line error naming the file when it
    is unreadable or names ids outside the vocabulary or twice."""
    path = os.path.join(workdir, FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            ids = np.asarray(json.load(f)["ids"], np.int64)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is unreadable ({error}); make it again with "
                         "infer/draft_vocab.py or delete it") from None
    if ids.ndim != 1 or len(ids) == 0 or ids.min() < 0 or ids.max() >= vocab_size \
            or len(np.unique(ids)) != len(ids):
        raise ValueError(f"{path}: the ranking must list distinct ids in [0, {vocab_size}); "
                         "make it again with infer/draft_vocab.py or delete it")
    return ids
