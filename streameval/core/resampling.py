"""Confidence intervals of a mean (docs/significance.md#confidence-intervals): the seeded
percentile bootstrap over queries and the t-interval over trials.  Pure numpy (scipy's t quantile
imported when asked for), so any layer can use them."""

from __future__ import annotations

import math

import numpy as np

INDEX_BUDGET = 32 << 20  # bytes of resampled indices held at a time (one batch of resamples)


def bootstrap_interval(samples, level: float = 0.95, resamples: int = 10_000, seed: int = 0) -> np.ndarray:
    """The percentile bootstrap interval of the mean of ``samples``: shape (n,) -> [lo, hi], or
    (n, m) (m metrics of the same n units) -> (2, m), every metric resampled with the same units.

    Resample b draws n indices with ``np.random.default_rng(seed)``, one ``integers(0, n, n)`` call
    per resample in order, so the intervals depend on the seed only, never on how many resamples
    are held at once (batches of at most ``INDEX_BUDGET`` bytes of indices); each resample's mean
    is a row sum (numpy's pairwise sum) over n, and lo, hi are the (1 -+ level) / 2 quantiles
    (numpy's linear interpolation) of the ``resamples`` means.  n = 1 gives [x, x]; n = 0 NaNs."""
    values = np.asarray(samples, dtype=np.float64)
    one_metric = values.ndim == 1
    values = values.reshape(values.shape[0], 1 if one_metric else values.shape[1]).T.copy()  # (m, n): each metric's values contiguous
    n = values.shape[1]
    if n == 0:
        lo_hi = np.full((2, values.shape[0]), np.nan)
        return lo_hi[:, 0] if one_metric else lo_hi
    rng = np.random.default_rng(seed)
    means = np.empty((resamples, values.shape[0]))
    batch = max(1, INDEX_BUDGET // (8 * n))
    for start in range(0, resamples, batch):
        stop = min(start + batch, resamples)
        index = np.empty((stop - start, n), dtype=np.int64)
        for row in range(stop - start):
            index[row] = rng.integers(0, n, size=n)
        for k, metric in enumerate(values):
            means[start:stop, k] = metric[index].sum(axis=1) / n
    tail = (1.0 - level) / 2
    lo_hi = np.quantile(means, [tail, 1.0 - tail], axis=0)
    return lo_hi[:, 0] if one_metric else lo_hi


def t_interval(values, level: float = 0.95) -> tuple[float, float]:
    """mean -+ t_{(1 + level) / 2, n - 1} * s / sqrt(n) over ``values`` (one per trial; s the sample
    std, ddof 1); (nan, nan) with fewer than two values, where it is undefined."""
    from scipy.stats import t

    x = np.asarray(values, dtype=np.float64)
    n = x.shape[0]
    if n < 2:
        return math.nan, math.nan
    mean = float(x.mean())
    half = float(t.ppf((1.0 + level) / 2, n - 1)) * float(x.std(ddof=1)) / math.sqrt(n)
    return mean - half, mean + half
