"""How a metric varies over trials or runs (docs/protocols.md#reporting-trials): mean, sample std, sem, min,
max and count of each scalar or curve point, nulls left out."""

from __future__ import annotations

import math

import numpy as np

STATS = ("mean", "std", "sem", "min", "max", "count")


def spread(values: list, ddof: int = 1) -> dict:
    """The statistics of ``values`` (numbers, or equal-length lists: one statistic per point);
    None values are left out and ``count`` says how many were used.  std (ddof 1 by default: the
    Bessel-corrected sample standard deviation; ddof 0 reproduces numpy's default) and sem (the
    sample std over sqrt(count)) are None with fewer than two values.  Identical values have a std
    and sem of exactly 0 (numpy's leave a rounding residue, such as 1e-17), and counts (every value
    an int) keep whole statistics as ints."""
    values = [v for v in values if v is not None]
    if not values:
        return {"mean": None, "std": None, "sem": None, "min": None, "max": None, "count": 0}
    counts = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values)
    x = np.asarray(values, dtype=np.float64)  # (count,) or (count, points)
    count = x.shape[0]
    lo, hi = x.min(axis=0), x.max(axis=0)
    stats = {"mean": _json(x.mean(axis=0), counts), "std": None, "sem": None, "min": _json(lo, counts),
             "max": _json(hi, counts), "count": count}
    if count < 2:  # one value: no spread to estimate
        return stats
    constant = lo == hi  # the mean's rounding would otherwise leave a residue as their std

    def std(of_ddof):
        return np.where(constant, 0.0, x.std(axis=0, ddof=of_ddof))

    # sem is s / sqrt(T) whatever ddof the std is reported with
    return {**stats, "std": _json(std(ddof)), "sem": _json(std(1) / math.sqrt(count))}


def _json(value, counts: bool = False):
    """A statistic as JSON: a list per point, a float, or an int for a whole statistic of counts."""
    if value.ndim:
        return value.tolist()
    return int(value) if counts and float(value).is_integer() else float(value)
