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

# A sign vector's |sum(s * d)| counts as at least as extreme as |sum(d)| when it is within this
# fraction of sum(|d|) below it: the two sums are made in different orders of additions (a matrix
# product, a pairwise sum), whose rounding (below n * 2.2e-16 * sum(|d|)) must not break a tie;
# distinct sums of real data are never that close, and rank-k's integer sums differ by 2.
TIE_TOLERANCE = 1e-9


def paired_tests(baseline, other, level: float = 0.95, resamples: int = 10_000, seed: int = 0):
    """``other`` against ``baseline``, both (n,) over the same units in the same order:
    ``delta`` = mean(other - baseline), ``ci`` = the percentile bootstrap interval of that mean
    (``resampling.bootstrap_interval`` of the differences), and ``p``: two-sided p-values of
    scipy.stats.ttest_rel and scipy.stats.wilcoxon (their defaults) and of ``randomization_p``.
    Both (n, m): m pairs of columns over the same n units, a list of m such dicts, every pair
    tested with the same resamples (each as its own call would give, to the ties' tolerance).

    When every difference is zero the runs agree on every unit and every p is 1.0 (scipy's t-test
    gives NaN there, its Wilcoxon 1.0 with a warning).  A p-value that is undefined (the t-test of
    one unit) is NaN."""
    from scipy.stats import ttest_rel, wilcoxon

    other, baseline = np.asarray(other, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    single = other.ndim == 1
    other, baseline = other.reshape(other.shape[0], -1), baseline.reshape(baseline.shape[0], -1)
    differences = other - baseline
    lo_hi = bootstrap_interval(differences, level, resamples, seed)
    randomization = randomization_p(differences, resamples, seed)
    found = []
    for k in range(differences.shape[1]):
        if not differences[:, k].any():
            p = dict.fromkeys(PAIRED_TESTS, 1.0)
        else:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore", RuntimeWarning)  # scipy's precision notes on near-constant differences
                p = {"t": float(ttest_rel(other[:, k], baseline[:, k]).pvalue),
                     "wilcoxon": float(wilcoxon(other[:, k], baseline[:, k]).pvalue),
                     "randomization": float(randomization[k])}
        found.append({"delta": float(differences[:, k].mean()), "ci": [float(lo_hi[0, k]), float(lo_hi[1, k])],
                      "p": p})
    return found[0] if single else found


def randomization_p(differences, resamples: int = 10_000, seed: int = 0):
    """The paired randomization (sign-flip) test, two-sided: under the null hypothesis each
    difference is as likely negated, so p = (1 + #{r : |sum(s_r * d)| >= |sum(d)|}) / (1 + R)
    over R sign vectors s_r drawn uniformly (``np.random.default_rng(seed)``, one draw of n signs
    per resample, in order: the p-value depends on the seed, never on how many vectors are held in
    memory at once).  The observed signs count as one resample (the +1 of numerator and
    denominator), so p is never 0 and the test is exact at any R (Phipson & Smyth 2010).
    ``differences`` (n,) gives a float; (n, m) an array of m p-values, every column flipped by the
    same sign vectors."""
    d = np.asarray(differences, dtype=np.float64)
    columns = d.reshape(d.shape[0], -1)
    n = columns.shape[0]
    total = np.ascontiguousarray(columns.T).sum(axis=1)  # each column's own (pairwise) sum
    threshold = np.abs(total) - TIE_TOLERANCE * np.abs(columns).sum(axis=0)
    rng = np.random.default_rng(seed)
    batch = max(1, INDEX_BUDGET // (8 * max(n, 1)))
    extreme = np.zeros(columns.shape[1], dtype=np.int64)
    for start in range(0, resamples, batch):
        rows = min(batch, resamples - start)
        kept = np.empty((rows, n), dtype=np.int8)
        for row in range(rows):
            kept[row] = rng.integers(0, 2, size=n)
        # s = 2 * kept - 1, so sum(s * d) = 2 * (kept @ d) - sum(d): one matrix product for every column
        flipped = 2.0 * (kept.astype(np.float64) @ columns) - total
        extreme += np.count_nonzero(np.abs(flipped) >= threshold, axis=0)
    p = (1 + extreme) / (1 + resamples)
    return float(p[0]) if d.ndim == 1 else p


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
