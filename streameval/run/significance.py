"""The samples a confidence interval or a paired test resamples (docs/significance.md): each
metric's per-query contributions, or its per-trial values, read from a result's JSON form.

A run without trials reports means over queries: CMC@k, mAP, mAP_trapezoid and mINP over the
queries its denominator counts (``per_query["counted"]``: Q+ under ``skip``, every query of the
trial under ``zero``, where a query without positives contributes 0), MREP over Q+ and MFR over
Q- (``per_query["rep_area"]`` / ``["fr_area"]``, NaN outside).  Each sample array's mean is the
reported value.  A run with trials (or sgs repeats) reports means over them: its samples are the
per-trial values, or (``pool_trials``, what ``compare`` pairs) where every trial counts the same
queries (sgs repeats, gallery trials) each query's contributions averaged over the trials: the
trials' mean of means is then the mean over queries of those averages, and the paired differences
carry the query-to-query variation that per-trial values (identical APs over sgs repeats) hide.
"""

from __future__ import annotations

import time

import numpy as np

from ..core.choices import check_range
from ..core.errors import OptionError

CLOSED_SET = {"mAP": "ap", "mAP_trapezoid": "ap_trapezoid", "mINP": "inp"}  # metric -> its per-query key
RANKS = (1, 5, 10)  # the CMC points the JSON reports
GOM = {"MREP": "rep_area", "MFR": "fr_area"}


def metric_samples(record: dict, pool_trials: bool = False) -> tuple[str, dict[str, np.ndarray]]:
    """(unit, samples) of a result ``record`` (``Result.to_dict(per_query=True)`` or its JSON):
    unit "query" (per-query contributions) or "trial" (per-trial values), and per metric a float64
    array whose mean is the reported value.  Metrics the run did not report (a rank past
    ``max_rank``, GOM turned off, a value undefined without Q+ or Q-) are left out; so is CMC@k of
    sgs mode ``expected``, whose curve is a mean of per-query expectations the JSON does not hold.
    ``pool_trials``: with trials, unit "query" (contributions averaged over the trials) where the
    per-query values are there and every trial counts the same queries.
    A protocol with two directions (regdb) is refused: pass one of ``record["directions"]``."""
    if record.get("directions"):
        names = ", ".join(record["directions"])
        raise OptionError(f"a result with two directions ({names}) has samples per direction: "
                          f"take one of its 'directions' sections")
    if record.get("trials"):
        pooled = _pooled_samples(record) if pool_trials and record.get("per_query") is not None else None
        return ("trial", _trial_samples(record["trials"]["per_trial"])) if pooled is None else ("query", pooled)
    if record.get("per_query") is None:
        raise OptionError("this result was written without --per-query; rerun with --per-query")
    return "query", _query_samples(record)


def _pooled_samples(record: dict) -> dict | None:
    """Each query's contributions averaged over the trials, or None where the trials count other
    queries (or other queries have GOM areas) from trial to trial."""
    per_query = {key: np.asarray(values, dtype=np.float64 if key.endswith("area") else None)
                 for key, values in record["per_query"].items()}
    if "counted" not in per_query:
        raise OptionError("this result's per-query values predate the 'counted' queries; rerun with --per-query")
    masks = [per_query["counted"], per_query["n_positives"] > 0,
             *(np.isnan(per_query[key]) for key in GOM.values() if key in per_query)]
    if any((mask != mask[:1]).any() for mask in masks):
        return None
    trials = [_query_samples({**record, "per_query": {key: values[t] for key, values in per_query.items()}})
              for t in range(len(per_query["counted"]))]
    return {name: np.mean([found[name] for found in trials], axis=0) for name in trials[0]}


def _trial_samples(per_trial: list) -> dict:
    """Each metric's values over the trials that define it (the headline means leave None out)."""
    rows = [{**{name: trial[name] for name in (*CLOSED_SET, *(f"rank{k}" for k in RANKS))},
             **{name: (trial["gom"] or {}).get(name) for name in GOM}} for trial in per_trial]
    out = {}
    for name in rows[0]:
        values = [row[name] for row in rows if row[name] is not None]
        if values:
            out[name] = np.asarray(values, dtype=np.float64)
    return out


def _query_samples(record: dict) -> dict:
    per_query = record["per_query"]
    if "counted" not in per_query:
        raise OptionError("this result's per-query values predate the 'counted' queries; rerun with --per-query")
    counted = np.asarray(per_query["counted"], dtype=bool)
    valid = counted & (np.asarray(per_query["n_positives"]) > 0)
    out = {}
    if valid.any():  # else every closed-set value is None
        for name, key in CLOSED_SET.items():
            out[name] = np.where(valid, np.asarray(per_query[key], dtype=np.float64), 0.0)[counted]
        rank = _cmc_rank(record, per_query)
        for k in RANKS if rank is not None else ():
            if record.get(f"rank{k}") is not None:
                out[f"rank{k}"] = (valid & (rank <= k)).astype(np.float64)[counted]
    for name, key in GOM.items():
        if key in per_query and (record.get("gom") or {}).get(name) is not None:
            area = np.asarray(per_query[key], dtype=np.float64)
            out[name] = area[~np.isnan(area)]
    return out


def _cmc_rank(record: dict, per_query: dict) -> np.ndarray | None:
    """The rank the reported CMC reads per query: the first hit, or ``rho`` of identity-dedup and
    sgs sampled; None for sgs expected (no per-query rank)."""
    if record.get("cmc_flavour", "first-hit") == "first-hit":
        return np.asarray(per_query["first_hit_rank"])
    return np.asarray(per_query["rho"]) if "rho" in per_query else None


METHODS = {"query": "bootstrap over queries (percentile)", "trial": "t over trials"}


def check_intervals(level, resamples, seed) -> tuple | None:
    """(level, resamples, seed) checked against their ranges (``choices.RANGES``), None when no
    interval is asked for (``level`` None)."""
    if level is None:
        return None
    return check_range(level, "ci"), check_range(resamples, "ci_resamples"), check_range(seed, "ci_seed")


def intervals(record: dict, level: float, resamples: int, seed: int) -> dict:
    """The ``ci`` section of a result ``record`` (as ``metric_samples``'): how the intervals were
    made and each metric's [lo, hi], the percentile bootstrap over queries or the t-interval
    over trials (``core.resampling``).  The CI options never change another number."""
    from ..core.resampling import bootstrap_interval, t_interval

    unit, samples = metric_samples(record)
    if unit == "query":
        found = {}
        # the draws depend on n and the seed only: the metrics over as many queries share one bootstrap
        for n in {len(values): None for values in samples.values()}:
            same = [name for name, values in samples.items() if len(values) == n]
            lo_hi = bootstrap_interval(np.stack([samples[name] for name in same], axis=1), level, resamples, seed)
            found.update({name: lo_hi[:, k] for k, name in enumerate(same)})
        found = {name: found[name] for name in samples}
    else:
        found = {name: t_interval(values, level) for name, values in samples.items()}
    return {"level": level, "method": METHODS[unit], "resamples": resamples if unit == "query" else None,
            "seed": seed if unit == "query" else None, "unit": unit,
            "intervals": {name: [_number(lo), _number(hi)] for name, (lo, hi) in found.items()}}


def add_intervals(result, level: float, resamples: int, seed: int) -> None:
    """Set ``result.ci`` (and each direction's ``ci`` for a protocol with two: the result's values
    are its first direction's), timed as the run's phase "confidence intervals"."""
    started = time.perf_counter()
    if result.directions:
        for one in result.directions.values():
            one["ci"] = intervals(one, level, resamples, seed)
        result.ci = next(iter(result.directions.values()))["ci"]
    else:  # the per-query arrays as they are, not their JSON lists
        result.ci = intervals({**result.to_dict(), "per_query": result.per_query}, level, resamples, seed)
    result.add_phase("confidence intervals", time.perf_counter() - started)


def _number(value) -> float | None:
    """JSON-ready: NaN (an interval undefined with one trial) becomes None."""
    return None if value != value else float(value)
