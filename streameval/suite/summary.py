"""A suite's report section (docs/suites.md#the-result-json, #per-corruption-breakdown): each evaluation's headline values, per setting
the per-trial values with their spread (``spread.spread``: mean, std with ``std_ddof``, sem, min, max), the headline setting, and the
query-side breakdown by corruption type."""

from __future__ import annotations

import numpy as np

from ..core.spread import spread
from .plan import SETTINGS, Suite

RANKS = (1, 5, 10)  # upstream's columns: mINP, mAP, R1, R5, R10
GOM_SUMMARIES = ("mReP_max", "MREP", "MFR")  # the scalar summaries (mReP, mFR are curves over tau)
BREAKDOWN_METRICS = ("mINP", "mAP", "R1")


def values_of(result) -> dict:
    """An evaluation's headline numbers: mINP, mAP (both AP flavours), CMC at upstream's ranks
    (those within max_rank) and the GOM summaries when GOM was computed."""
    values = {"mINP": result.mINP, "mAP": result.mAP, "mAP_trapezoid": result.mAP_trapezoid}
    values.update({f"R{k}": result.rank(k) for k in RANKS if k <= result.max_rank})
    if result.gom is not None:
        values.update({f"gom.{name}": result.gom.get(name) for name in GOM_SUMMARIES})
    return {name: None if value is None else float(value) for name, value in values.items()}


def setting_summaries(suite: Suite, values: list[dict], names: list[str]) -> dict:
    """Per setting (report order): T, per-trial values and their spread, metric by metric."""
    order = [s for s in SETTINGS if any(ev.setting == s for ev in suite.evaluations)]
    order += sorted({ev.setting for ev in suite.evaluations} - set(order))
    out = {}
    for setting in order:
        members = sorted((ev.trial if ev.trial is not None else -1, i) for i, ev in enumerate(suite.evaluations)
                         if ev.setting == setting)
        per_trial = {name: [values[i][name] for _, i in members] for name in names}
        spreads = {name: spread(per_trial[name], suite.std_ddof) for name in names}
        out[setting] = {"T": len(members), "trials": [t if t >= 0 else None for t, _ in members],
                        "per_trial": per_trial,
                        **{stat: {name: spreads[name][stat] for name in names}
                           for stat in ("mean", "std", "sem", "min", "max")}}
    return out


def query_breakdown(suite: Suite, results: list, columns: dict) -> dict | None:
    """Query side (4.4): the metrics over the valid queries of each corruption type (and of each
    type and severity, when recorded), pooled over the ``query`` setting's evaluations; None
    without recorded types (or with protocol trials, whose per-query values are per trial).
    ``columns``: query variant -> its ``variant_columns``."""
    picked = [(ev, r) for ev, r in zip(suite.evaluations, results)
              if ev.setting == "query" and columns.get(ev.query, {}).get("corruption_type") is not None
              and np.ndim(r.per_query["ap"]) == 1]
    if not picked:
        return None
    pooled = {key: [] for key in ("type", "severity", "ap", "inp", "rank")}
    for ev, r in picked:
        valid = r.per_query["n_positives"] > 0
        severity = columns[ev.query].get("severity")
        pooled["type"].append(np.asarray(columns[ev.query]["corruption_type"])[valid])
        pooled["severity"].append(np.full(int(valid.sum()), -1) if severity is None else np.asarray(severity)[valid])
        pooled["ap"].append(r.per_query["ap"][valid])
        pooled["inp"].append(r.per_query["inp"][valid])
        pooled["rank"].append(r.per_query["first_hit_rank"][valid])
    kind, severity, ap, inp, rank = (np.concatenate(pooled[key]) for key in ("type", "severity", "ap", "inp", "rank"))

    def metrics_of(at: np.ndarray) -> dict:
        return {"n": int(at.sum()), "mINP": float(inp[at].mean()), "mAP": float(ap[at].mean()),
                "R1": float((rank[at] <= 1).mean())}

    out = {"by_type": {str(int(c)): metrics_of(kind == c) for c in np.unique(kind)}}
    if (severity >= 0).all():
        pairs = np.unique(np.stack([kind, severity], axis=1), axis=0)
        out["by_type_severity"] = {f"{c}/{v}": metrics_of((kind == c) & (severity == v)) for c, v in pairs}
    names = _corruption_names([columns[ev.query] for ev, _ in picked], np.unique(kind))
    return {"query": {**out, "corruption_names": names, "evaluations": [ev.name for ev, _ in picked]}}


def _corruption_names(columns: list[dict], types: np.ndarray) -> dict | None:
    """{type code: its name} for the pooled ``types`` when every pooled variant names its types alike
    (attribute ``corruption_names``, a type its index); None otherwise: the codes are all there is."""
    lists = {tuple(c["corruption_names"]) if c.get("corruption_names") is not None else None for c in columns}
    names = lists.pop() if len(lists) == 1 else None
    if names is None or any(not 0 <= c < len(names) for c in types):
        return None
    return {str(int(c)): names[c] for c in types}


def suite_section(suite: Suite, results: list, execution: dict, columns: dict, per_query: bool = False) -> dict:
    """The JSON ``suite`` section (docs/suites.md#the-result-json; docs/suites.md)."""
    values = [values_of(r) for r in results]
    names = list(values[0])
    settings = setting_summaries(suite, values, names)
    headline = settings.get(suite.headline_setting)
    protocol = results[0].protocol_record or {"name": results[0].protocol}
    return {
        "plan": suite.plan, "note": suite.note, "protocol": protocol.get("name"), "trials": suite.trials,
        "std_ddof": suite.std_ddof, "headline_setting": suite.headline_setting, "metrics": names,
        "evaluations": [{**ev.record(), "values": v, "result": r.to_dict(per_query=per_query)}
                        for ev, v, r in zip(suite.evaluations, values, results)],
        "settings": settings,
        "headline": None if headline is None else {"setting": suite.headline_setting, "mean": headline["mean"],
                                                   "std": headline["std"]},
        "breakdown": query_breakdown(suite, results, columns),
        "execution": execution,
    }
