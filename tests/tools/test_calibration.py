"""Learn then Test: the guarantee holds on synthetic risk curves with known truth, and choosing
without the correction (by empirical risk, or testing every λ on its own) breaks it."""

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from specjax.tools.learn_then_test import hoeffding_bentkus_pvalue, learn_then_test

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out

DELTA, EPSILON, N, TRIALS = 0.1, 0.05, 300, 1500
GRID = np.linspace(1.0, 0.0, 41)  # thresholds, safest first


def ramp(lam):
    """Risk rising smoothly as λ falls: 0 at λ = 1, 0.4 at λ = 0 (δ is crossed at λ = 0.5)."""
    return 0.4 * (1 - lam) ** 2


def plateau(lam):
    """Risk that climbs to just above δ and stays there: many null hypotheses in a row."""
    return np.minimum(ramp(lam), DELTA + 0.002)


CURVES = {  # name: (true risk, losses nested in λ as an early exit's are, or independent)
    "ramp, nested losses": (ramp, True),
    "plateau above delta, independent losses": (plateau, False),
}


def calibration_losses(rng, risk, nested):
    """One calibration set [len(GRID), N] in {0, 1}: example i loses at λ when its uniform
    draw is below risk(λ), one draw per example (nested) or per example and λ."""
    u = rng.random(N) if nested else rng.random((len(GRID), N))
    return (u < risk(GRID)[:, None]).astype(float)


def violation_frequency(choose, risk, nested, seed=0):
    rng = np.random.default_rng(seed)
    violations = 0
    for _ in range(TRIALS):
        lam = choose(calibration_losses(rng, risk, nested))
        violations += lam is not None and risk(np.asarray(lam)) > DELTA
    return violations / TRIALS


def naive(losses):
    """Without the correction: the most aggressive λ whose empirical risk is at most δ."""
    ok = np.nonzero(losses.mean(axis=1) <= DELTA)[0]
    return float(GRID[ok[-1]]) if ok.size else None


def each_tested_alone(losses):
    """Each λ tested at level ε on its own, the most aggressive rejection chosen."""
    ltt = learn_then_test(GRID, losses, DELTA, EPSILON)
    ok = [j for j, p in enumerate(ltt.p_values) if p <= EPSILON]
    return float(GRID[ok[-1]]) if ok else None


@pytest.mark.parametrize("curve", sorted(CURVES))
def test_the_chosen_threshold_keeps_its_risk_guarantee_and_uncorrected_choices_do_not(curve):
    """Over repeated calibrations the chosen λ's true risk exceeds δ at most ε of the time
    (within 3 binomial standard deviations). Catches a p-value that is too small (Bentkus
    without its factor e, Hoeffding's exponent doubled), picking the wrong end of the rejected
    run and testing on past the first non-rejection: each breaks the bound on one curve. The
    uncorrected choices — by empirical risk, or by a test at every λ — must break it too."""
    risk, nested = CURVES[curve]
    slack = 3 * math.sqrt(EPSILON * (1 - EPSILON) / TRIALS)
    ltt = violation_frequency(lambda losses: learn_then_test(GRID, losses, DELTA,
                                                             EPSILON).value, risk, nested)
    assert ltt <= EPSILON + slack
    uncorrected = naive if nested else each_tested_alone
    assert violation_frequency(uncorrected, risk, nested) > EPSILON + slack
    useful = learn_then_test(GRID, calibration_losses(np.random.default_rng(1), risk, nested),
                             DELTA, EPSILON)
    assert useful.value is not None and risk(np.asarray(useful.value)) > 0.05  # not trivial


def test_hoeffding_bentkus_p_values():
    """Catches the two bounds swapped or mis-scaled: p is the smaller of Hoeffding's and
    Bentkus', falls as the empirical risk falls, and is 1 at or above δ."""
    n, delta = 200, 0.1
    assert hoeffding_bentkus_pvalue(0.1, n, delta) == 1.0
    assert hoeffding_bentkus_pvalue(0.3, n, delta) == 1.0
    values = [hoeffding_bentkus_pvalue(r, n, delta) for r in (0.09, 0.07, 0.05, 0.02, 0.0)]
    assert all(a > b for a, b in itertools.pairwise(values))
    risk = 0.05
    hoeffding = math.exp(-n * (risk * math.log(risk / delta)
                               + (1 - risk) * math.log((1 - risk) / (1 - delta))))
    bentkus = math.e * stats.binom.cdf(math.ceil(n * risk), n, delta)
    assert hoeffding_bentkus_pvalue(risk, n, delta) == pytest.approx(min(hoeffding, bentkus))
    with pytest.raises(ValueError, match="losses must lie in"):
        learn_then_test([1.0], np.array([[1.5]]), delta, 0.05)
    assert learn_then_test([1.0, 0.5], np.ones((2, 10)), delta, 0.05).value is None
