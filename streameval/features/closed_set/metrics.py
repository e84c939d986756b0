"""Closed-set metrics from per-query slot counts (docs/metrics.md#4-closed-set-metrics-cmc-ap-inp).

Closed-set metrics average over Q+ (queries with at least one positive; under the ``zero``
denominator policy, docs/protocols.md#8-the-denominator-skip-or-zero, the sums are divided by all the trial's queries instead):

* ``cmc[k-1]`` (CMC@k) = |{q in Q+ : r_1(q) <= k}| / |Q+|, k = 1..max_rank (r_1: the rank of the
  protocol's CMC flavour: first hit, identity-dedup rho, or sgs)
* ``mAP``            = mean over Q+ of AP(q) = (1/n) sum_j j / r_j
* ``mAP_trapezoid``  = mean over Q+ of (1/n) sum_j ((j-1)/(r_j-1) + j/r_j) / 2
* ``mINP``           = mean over Q+ of n / r_n

With Q+ empty every closed-set value is None (and the report says so).  ``trials.py`` computes
them per trial (or sgs repeat) and their spread.
"""

from __future__ import annotations

import numpy as np

from ...engine import kernels


def query_values(positives, slots: np.ndarray) -> dict:
    """Per-query first-hit rank, AP (both conventions), INP and number of positives, from the slot
    counts of one trial (``statistics.slots.restrict``); queries without positives get rank -1 and NaN."""
    n = positives.n_queries
    out = {"first_hit_rank": np.empty(n, dtype=np.int64), "ap": np.empty(n), "ap_trapezoid": np.empty(n),
           "inp": np.empty(n)}
    kernels.rank_summaries(positives.offsets, slots, out["first_hit_rank"], out["ap"], out["ap_trapezoid"], out["inp"])
    out["n_positives"] = positives.counts
    return out


def cmc_curve(ranks: np.ndarray, max_rank: int, denominator: int) -> np.ndarray:
    """CMC@k for k = 1..max_rank: the share of ``denominator`` queries whose rank (of the valid
    queries' ``ranks``) is at most k."""
    hits = np.bincount(np.minimum(ranks, max_rank + 1) - 1, minlength=max_rank + 1)[:max_rank]
    return np.cumsum(hits) / denominator


def closed_set(per_query: dict, valid: np.ndarray, n_counted: int, max_rank: int, ranks: np.ndarray | None = None) -> dict:
    """Closed-set aggregates over ``valid`` queries, divided by ``n_counted`` (|Q+| under the skip
    policy, all the trial's queries under zero); ``ranks``: the CMC flavour's rank per query
    (default: the first-hit rank).  None everywhere when Q+ is empty."""
    if not valid.any():
        return {"cmc": None, "mAP": None, "mAP_trapezoid": None, "mINP": None}
    ranks = per_query["first_hit_rank"] if ranks is None else ranks
    return {
        "cmc": cmc_curve(ranks[valid], max_rank, n_counted),
        "mAP": float(per_query["ap"][valid].sum() / n_counted),
        "mAP_trapezoid": float(per_query["ap_trapezoid"][valid].sum() / n_counted),
        "mINP": float(per_query["inp"][valid].sum() / n_counted),
    }
