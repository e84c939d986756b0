"""From the reduced state to the reported numbers, trial by trial (docs/protocols.md).

Every trial (T = 1 without trials) is restricted from the superset state (``slots.restrict``) and
gets every metric of a single evaluation: closed-set values under the denominator policy, the CMC
of the protocol's flavour (plus the first-hit curve when that is another), GOM with the trial's own
normalisation.  Single-gallery-shot repeats are reported the same way, one entry per repeat.
With more than one entry the headline values are their means and ``trials`` holds each entry and
the spread (``spread.spread``: mean, sample std, sem, min, max).
"""

from __future__ import annotations

import numpy as np

from . import metrics as closed_set
from ..gom import finalise as gom
from ...core.spread import STATS, spread
from ..dedup.statistic import dedup_ranks
from ..gom.statistic import clipping
from ..sgs.statistic import expected_cmc
from .slots import restrict

SCALARS = ("n_queries", "n_valid_queries", "n_open_queries", "rank1", "rank5", "rank10", "mAP", "mAP_trapezoid",
           "mINP")
CURVES = ("cmc", "cmc_first_hit")
GOM_VALUES = ("mRP", "mVP", "mReP", "mFR", "mReP_max", "tau_max", "mVP_max", "MREP", "MFR", "tau_nz", "dmin", "dmax")


def entries(state, settings, q_bits: np.ndarray, q_cam: np.ndarray, meta, norms: tuple) -> tuple[list, dict]:
    """(one dict per reported trial or repeat, extras): each entry holds the metrics of a single
    evaluation and ``per_query``; extras hold ``cmc_sgs_expected`` when it is computed."""
    protocol = settings.protocol
    out, extras = [], {}
    for t in range(settings.n_trials):
        in_trial = ((q_bits >> np.uint64(t)) & np.uint64(1)).astype(bool)
        positives, slots = restrict(state.positives, state.stats.arrays["slots/counts"], t)
        per_query = closed_set.query_values(positives, slots)
        valid = in_trial & (per_query["n_positives"] > 0)
        counted_mask = valid if protocol.denominator == "skip" else in_trial
        per_query["counted"] = counted_mask  # the queries the closed-set means divide by (run/significance.py)
        counted = int(counted_mask.sum())
        base = {"n_queries": int(in_trial.sum()), "n_valid_queries": int(valid.sum()),
                "n_open_queries": int((in_trial & ~valid).sum())}
        first_hit = closed_set.closed_set(per_query, valid, counted, settings.max_rank)
        base["gom"] = _gom(state, settings, positives, slots, t, in_trial, per_query, norms[t])
        if protocol.cmc == "first-hit":
            out.append(_entry(base, first_hit, per_query))
        elif protocol.cmc == "identity-dedup":
            rho = dedup_ranks(state.stats.arrays["dedup/held"], t)
            per_query["rho"] = np.where(valid, rho, -1)
            flavour = closed_set.closed_set(per_query, valid, counted, settings.max_rank, rho)
            out.append(_entry(base, flavour, per_query, first_hit["cmc"]))
        else:
            out += _sgs_entries(state, settings, base, first_hit, per_query, valid, counted, q_cam, meta, extras)
    return out, extras


def _entry(base: dict, closed: dict, per_query: dict, first_hit_cmc=None) -> dict:
    """``first_hit_cmc``: the first-hit curve when the flavour is another (None otherwise)."""
    return {**base, **closed, "per_query": per_query, "cmc_first_hit": first_hit_cmc}


def _sgs_entries(state, settings, base, first_hit, per_query, valid, counted, q_cam, meta, extras) -> list:
    """One entry per sampled repeat (mode sampled / both), or the expected curve's (expected);
    AP and INP are those of the full kept list in every entry."""
    sgs = settings.protocol.sgs
    if sgs.mode in ("expected", "both"):
        curves = np.zeros((valid.shape[0], settings.max_rank))
        ident = meta.identities
        n_identity = ident.counts[ident.camera_class(q_cam)]
        expected_cmc(state.positives.offsets, state.stats.arrays["sgs_expected/counts"], n_identity,
                     settings.max_rank, curves)
        expected = curves[valid].sum(axis=0) / counted if valid.any() else None
        if sgs.mode == "expected":
            return [_entry(base, {**first_hit, "cmc": expected}, per_query, first_hit["cmc"])]
        extras["cmc_sgs_expected"] = expected
    counts = state.stats.arrays["sgs_sampled/counts"]
    out = []
    for r in range(sgs.repeats):
        rho = 1 + counts[:, r]
        sampled = dict(first_hit, cmc=closed_set.cmc_curve(rho[valid], settings.max_rank, counted) if valid.any() else None)
        out.append(_entry(base, sampled, {**per_query, "rho": np.where(valid, rho, -1)}, first_hit["cmc"]))
    return out


def _gom(state, settings, positives, slots, t, in_trial, per_query, norm):
    if settings.gom is None:
        return None
    arrays = state.stats.arrays
    curves = gom.query_curves(positives, slots, arrays["gom/hist"][:, t, :], state.positives.junk[:, t], settings.gom,
                              norm)
    dist_range = state.dist_range[t] if state.dist_range is not None else None
    summary = gom.summarize({name: c[in_trial] for name, c in curves.items()}, per_query["n_positives"][in_trial],
                            settings.gom, dist_range)
    per_query.update(gom.query_areas(curves, in_trial, per_query["n_positives"], settings.gom))
    if settings.gom.norm == "fixed":
        summary["clipped"] = clipping(state, settings.gom.lo, settings.gom.hi)
    return summary


def headline(found: list, max_rank: int, ddof: int) -> tuple[dict, dict | None]:
    """(the headline values, the trials block or None): a single entry as it is, several as means."""
    values = [_values(entry, max_rank) for entry in found]
    if len(found) == 1:
        return values[0], None
    stats = {name: spread([v[name] for v in values], ddof) for name in SCALARS + CURVES}
    gom_stats = None
    if values[0]["gom"] is not None:
        gom_stats = {name: spread([v["gom"][name] for v in values], ddof) for name in GOM_VALUES}
    mean = {name: stats[name]["mean"] for name in stats}
    if gom_stats is not None:
        mean["gom"] = {**values[0]["gom"], **{name: gom_stats[name]["mean"] for name in GOM_VALUES}}
    else:
        mean["gom"] = None
    block = {"T": len(found), "std_ddof": ddof, "per_trial": values}
    for stat in STATS:
        block[stat] = {name: stats[name][stat] for name in stats}
        if gom_stats is not None:
            block[stat]["gom"] = {name: gom_stats[name][stat] for name in GOM_VALUES}
    return mean, block


def _values(entry: dict, max_rank: int) -> dict:
    """An entry's JSON-ready values (no per-query arrays)."""
    def curve(c):
        return None if c is None else [float(v) for v in c]

    cmc = entry["cmc"]
    return {**{name: entry[name] for name in ("n_queries", "n_valid_queries", "n_open_queries", "mAP",
                                                  "mAP_trapezoid", "mINP")},
            "cmc": curve(cmc), "cmc_first_hit": curve(entry["cmc_first_hit"]),
            **{f"rank{k}": (None if cmc is None or k > max_rank else float(cmc[k - 1])) for k in (1, 5, 10)},
            "gom": entry["gom"]}

