"""How a metric varies over trials or runs (PROTOCOLS.md section 1.7): mean, sample std, sem, min,
max and count of each scalar or curve point, nulls left out."""

from __future__ import annotations

import math

import numpy as np

STATS = ("mean", "std", "sem", "min", "max", "count")


def spread(values: list, ddof: int = 1) -> dict:
    """The statistics of ``values`` (numbers, or equal-length lists: one statistic per point);
    None values are left out and ``count`` says how many were used.  std (ddof 1 by default: the
    Bessel-corrected sample standard deviation; ddof 0 reproduces numpy's default) and sem (the
    sample std over sqrt(count)) are None with fewer than two values."""
    values = [v for v in values if v is not None]
    if not values:
        return {"mean": None, "std": None, "sem": None, "min": None, "max": None, "count": 0}
    x = np.asarray(values, dtype=np.float64)  # (count,) or (count, points)
    count = x.shape[0]
    if count < 2:  # one value: no spread to estimate
        return {"mean": _json(x.mean(axis=0)), "std": None, "sem": None, "min": _json(x.min(axis=0)),
                "max": _json(x.max(axis=0)), "count": count}
    sample_std = x.std(axis=0, ddof=1)  # sem is s / sqrt(T) whatever ddof the std is reported with
    return {"mean": _json(x.mean(axis=0)), "std": _json(x.std(axis=0, ddof=ddof)),
            "sem": _json(sample_std / math.sqrt(count)),
            "min": _json(x.min(axis=0)), "max": _json(x.max(axis=0)), "count": count}


def _json(value):
    if value is None:
        return None
    return value.tolist() if value.ndim else float(value)
