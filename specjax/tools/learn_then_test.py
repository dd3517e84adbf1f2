"""Learn then Test (Angelopoulos et al. 2021), the calibration CALM uses: choose a threshold λ
from a grid so that, with probability at least 1 − ε over the calibration set, the chosen λ's
risk (an expected loss in [0, 1]) is at most δ.

Each grid point λ_j is a hypothesis H_j: risk(λ_j) > δ, tested with a Hoeffding–Bentkus
p-value of its empirical risk on n calibration examples. Fixed-sequence testing walks the grid
from the safest λ (the first) and rejects H_j while p_j ≤ ε, stopping at the first it cannot
reject; every rejected λ is certified together (family-wise error ≤ ε without a multiplicity
correction, because the order is fixed in advance), and the last of them, the most aggressive,
is chosen. Choosing the most aggressive λ whose empirical risk is ≤ δ instead — no test —
exceeds δ about half the time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy import stats


def hoeffding_bentkus_pvalue(risk: float, n: int, delta: float) -> float:
    """p-value of H: true risk > `delta`, given the mean `risk` of n losses in [0, 1]: the
    smaller of Hoeffding's exp(-n h(min(risk, delta), delta)) (h the Bernoulli relative entropy)
    and Bentkus' e · P(Binomial(n, delta) <= ceil(n risk))."""
    if not 0 < delta < 1:
        raise ValueError(f"delta={delta} must lie in (0, 1)")
    if n < 1:
        raise ValueError(f"n={n}: no calibration examples")
    a = min(risk, delta)
    hoeffding = math.exp(-n * _bernoulli_kl(a, delta))
    bentkus = math.e * stats.binom.cdf(math.ceil(n * risk - 1e-9), n, delta)
    return float(min(1.0, hoeffding, bentkus))


def _bernoulli_kl(a: float, b: float) -> float:
    """KL(Bernoulli(a) || Bernoulli(b)), with 0 log 0 = 0."""
    terms = [(a, b), (1 - a, 1 - b)]
    return sum(x * math.log(x / y) for x, y in terms if x > 0)


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The outcome of `learn_then_test`: `index` of the chosen grid point (None: no λ could be
    certified, so none is safe at this δ and ε), its `value`, and every grid point's empirical
    risk and p-value."""

    index: int | None
    value: float | None
    risks: tuple[float, ...]
    p_values: tuple[float, ...]


def check_risk_levels(delta: float, epsilon: float, prefix: str = "") -> None:
    """The risk `delta` and error `epsilon` must each lie in (0, 1) (`prefix`: "--" names them
    as flags); checked before any work by the calibrating entry point."""
    for name, value in (("delta", delta), ("epsilon", epsilon)):
        if not 0 < value < 1:
            raise ValueError(f"{prefix}{name}={value:g} must lie in (0, 1)")


def learn_then_test(grid: Sequence[float], losses: np.ndarray, delta: float,
                    epsilon: float) -> Calibration:
    """The most aggressive λ of `grid` (ordered from safest to most aggressive, e.g. CALM's
    thresholds descending) certified by fixed-sequence testing. `losses` [len(grid), n] holds
    each calibration example's loss in [0, 1] at each grid point."""
    losses = np.asarray(losses, np.float64)
    if losses.ndim != 2 or losses.shape[0] != len(grid):
        raise ValueError(f"losses must be [len(grid)={len(grid)}, n], got {losses.shape}")
    if losses.size and (losses.min() < 0 or losses.max() > 1):
        raise ValueError("losses must lie in [0, 1] (Hoeffding–Bentkus bounds bounded losses)")
    check_risk_levels(delta, epsilon)
    n = losses.shape[1]
    risks = losses.mean(axis=1)
    p_values = [hoeffding_bentkus_pvalue(float(r), n, delta) for r in risks]
    index = None
    for j, p in enumerate(p_values):
        if p > epsilon:
            break
        index = j
    return Calibration(index, None if index is None else float(grid[index]),
                       tuple(float(r) for r in risks), tuple(p_values))
