"""Paired tests of two runs over the same units (docs/significance.md#comparing-runs): the delta of
their means, its bootstrap interval, and the p-values of the paired t-test, the Wilcoxon
signed-rank test and a seeded paired randomization (sign-flip) test; Holm's correction of a family
of p-values.  numpy, and scipy's tests imported when called, so any layer can use them."""

from __future__ import annotations

import math
import warnings

import numpy as np

from .choices import PAIRED_TESTS
from .resampling import INDEX_BUDGET, bootstrap_interval

# |sum(s * d)| counts as at least as extreme as |sum(d)| within this relative distance: a sign
# vector giving the same sum in another order of additions must not lose the tie to rounding
TIE_TOLERANCE = 1e-12


def paired_tests(baseline, other, level: float = 0.95, resamples: int = 10_000, seed: int = 0) -> dict:
    """``other`` against ``baseline``, both (n,) over the same units in the same order:
    ``delta`` = mean(other - baseline), ``ci`` = the percentile bootstrap interval of that mean
    (``resampling.bootstrap_interval`` of the differences), and ``p``: two-sided p-values of
    scipy.stats.ttest_rel and scipy.stats.wilcoxon (their defaults) and of ``randomization_p``.

    When every difference is zero the runs agree on every unit and every p is 1.0 (scipy's t-test
    gives NaN there, its Wilcoxon 1.0 with a warning).  A p-value that is undefined (the t-test of
    one unit) is NaN."""
    from scipy.stats import ttest_rel, wilcoxon

    other, baseline = np.asarray(other, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    differences = other - baseline
    if not differences.any():
        p = dict.fromkeys(PAIRED_TESTS, 1.0)
    else:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)  # scipy's precision notes on near-constant differences
            p = {"t": float(ttest_rel(other, baseline).pvalue), "wilcoxon": float(wilcoxon(other, baseline).pvalue),
                 "randomization": randomization_p(differences, resamples, seed)}
    lo, hi = bootstrap_interval(differences, level, resamples, seed)
    return {"delta": float(differences.mean()), "ci": [float(lo), float(hi)], "p": p}


def randomization_p(differences, resamples: int = 10_000, seed: int = 0) -> float:
    """The paired randomization (sign-flip) test, two-sided: under the null hypothesis each
    difference is as likely negated, so p = (1 + #{r : |sum(s_r * d)| >= |sum(d)|}) / (1 + R)
    over R sign vectors s_r drawn uniformly (``np.random.default_rng(seed)``, one draw of n signs
    per resample, in order: the p-value depends on the seed, never on how many vectors are held in
    memory at once).  The observed signs count as one resample (the +1 of numerator and
    denominator), so p is never 0 and the test is exact at any R (Phipson & Smyth 2010)."""
    d = np.asarray(differences, dtype=np.float64)
    n = d.shape[0]
    observed = abs(float(d.sum()))
    threshold = observed - TIE_TOLERANCE * observed
    rng = np.random.default_rng(seed)
    batch = max(1, INDEX_BUDGET // (8 * max(n, 1)))
    extreme = 0
    for start in range(0, resamples, batch):
        rows = min(batch, resamples - start)
        signs = np.empty((rows, n))
        for row in range(rows):
            signs[row] = 2.0 * rng.integers(0, 2, size=n) - 1.0
        extreme += int(np.count_nonzero(np.abs((signs * d).sum(axis=1)) >= threshold))
    return (1 + extreme) / (1 + resamples)


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjustment of a family of p-values: sorted ascending p_(1) <= ... <= p_(m),
    p_(i) becomes max over j <= i of min(1, (m - j + 1) * p_(j)), returned in the input order.  NaN
    (an undefined p) stays NaN and is not counted in m."""
    p = np.asarray(pvalues, dtype=np.float64)
    adjusted = np.full(p.shape, math.nan)
    defined = np.flatnonzero(~np.isnan(p))
    order = defined[np.argsort(p[defined], kind="stable")]
    m = order.size
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted[order] = np.maximum.accumulate(scaled)
    return adjusted
