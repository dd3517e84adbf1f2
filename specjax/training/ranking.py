"""How well a score ranks positives above negatives (the heads' evaluations)."""

from __future__ import annotations

import numpy as np


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Probability that a random positive scores above a random negative, with soft labels (a
    label a in [0, 1] is a weight a positive and 1 - a negative: SpecDec++'s acceptance
    probabilities); ties count half."""
    order = np.argsort(scores, kind="stable")
    scores, positive = scores[order], labels[order].astype(np.float64)
    negative = 1.0 - positive
    _, starts, counts = np.unique(scores, return_index=True, return_counts=True)
    ends = starts + counts
    cum_negative = np.concatenate([[0.0], np.cumsum(negative)])
    below = cum_negative[starts]                 # rejected drafts scoring lower, per tie group
    tied = cum_negative[ends] - cum_negative[starts]
    group_positive = np.add.reduceat(positive, starts)
    pairs = positive.sum() * negative.sum()
    return float(np.sum(group_positive * (below + tied / 2)) / pairs) if pairs else 0.5
