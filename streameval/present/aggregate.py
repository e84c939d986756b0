"""Aggregating split-level runs (docs/protocols.md#9-split-level-protocols-streameval-aggregate): ``streameval aggregate RUN.json ...``.

Protocols with one model per split (RegDB, classic CUHK03, iLIDS-VID, PRID2011) publish the mean of
separate evaluations.  This module reads their result JSONs, refuses runs whose numbers were decided
by different options (naming each field and the runs), and reports for every scalar and every curve
point the unweighted mean, std (ddof = 1), sem, min, max and count over the runs (docs/protocols.md#reporting-trials).

Settings are compared as a whole: every key of a result's ``options`` dict takes part, so options
added to results later are compared without a change here.  A null value (a run without open-set
queries has no MFR) is left out of that metric's statistics, and its count says so.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass


from .. import __version__
from ..core.choices import FRACTION, RESULT_SCHEMA, Bounds
from ..core.errors import OptionError, StreamevalError, one_line
from ..features import TARGETED
from ..core.spread import STATS, spread

STD_DDOF = 1
SETTINGS = ("metric", "protocol", "max_rank")  # top-level keys that decide the numbers
COUNTS = ("n_queries", "n_valid_queries", "n_open_queries", "n_gallery")
SCALARS = COUNTS + ("rank1", "rank5", "rank10", "mAP", "mAP_trapezoid", "mINP")
GOM_SETTINGS = ("normalisation", "bins", "B", "vp")
GOM_SCALARS = ("mReP_max", "tau_max", "mVP_max", "MREP", "MFR", "tau_nz")
GOM_CURVES = ("mRP", "mVP", "mReP", "mFR")
PER_RUN = ("n_queries", "n_valid_queries", "mAP", "rank1", "mINP")
TARGETS = {feature.name: feature for feature in TARGETED}  # sections of values at targets
NESTED = ("gom", *TARGETS)  # sections whose statistics nest under their name
COUNT = Bounds(0.0, math.inf, integer=False)  # an aggregate's counts are means: not always whole
# every other value averaged is a rate or a normalised threshold: CMC, AP, INP, GOM, TAR, FAR, DIR, AUC


class ResultFileError(StreamevalError):
    """A run file is not a streameval result, or the runs cannot be aggregated."""

    exit_code = 3


@dataclass
class Run:
    label: str
    path: str
    result: dict

    @property
    def store(self) -> str:
        """The evaluated store when the result records it, else the result's file name."""
        return self.result.get("store") or self.result["run"].get("store") or os.path.basename(self.path)


# ------------------------------------------------------------------------------------- reading


def load_runs(paths, labels=()) -> list[Run]:
    """The result JSONs at ``paths``, labelled by ``labels`` (default: the file names' stems)."""
    labels = run_labels(list(paths), list(labels))
    return [Run(label, os.fspath(path), read_result(path)) for label, path in zip(labels, paths)]


def run_labels(paths: list, labels: list) -> list[str]:
    """``labels`` checked (one per run, all different), or the names of ``paths`` without .json
    (the whole paths where two names are the same)."""
    if labels:
        if len(labels) != len(paths):
            raise OptionError(f"got {len(labels)} --label for {len(paths)} runs; give one per run, in order")
        if len(set(labels)) != len(labels):
            raise OptionError("two runs have the same --label; labels name the runs and must differ")
        return labels
    stems = [os.path.splitext(os.path.basename(os.fspath(p)))[0] for p in paths]
    return stems if len(set(stems)) == len(stems) else [os.fspath(p) for p in paths]  # same name, other folders


def read_result(path) -> dict:
    def refuse(why: str):
        return ResultFileError(f"'{os.fspath(path)}' is not a streameval result JSON ({why}); "
                               "use the files written by 'streameval eval --json'")

    try:
        with open(path, encoding="utf-8") as fh:
            result = json.load(fh)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise refuse(one_line(exc)) from None
    if not isinstance(result, dict):
        raise refuse(f"a JSON {type(result).__name__}, not an object")
    missing = [key for key in SETTINGS + SCALARS + ("cmc", "options", "gom", "run") if key not in result]
    if missing:
        raise refuse("no " + ", ".join(missing))
    if not isinstance(result["options"], dict) or not isinstance(result["run"], dict):
        raise refuse("options and run must be objects")
    gom = result["gom"]
    if gom is not None and (not isinstance(gom, dict) or any(k not in gom for k in GOM_SETTINGS + GOM_SCALARS + GOM_CURVES)):
        raise refuse("gom is not a GOM record")
    return result


# ------------------------------------------------------------------------------- compatibility


def check_compatible(runs: list[Run]) -> list[str]:
    """Refuse runs of another result schema or whose numbers were decided by different options;
    return the warnings (different streameval versions)."""
    schemas = _grouped(runs, lambda r: r.get("result_schema", 1))  # results from before the key: schema 1
    if list(schemas) != [json.dumps(RESULT_SCHEMA)]:
        raise ResultFileError(f"result_schema differs from the {RESULT_SCHEMA} this streameval {__version__} reads: "
                              f"{_describe(schemas)}; aggregate results written by one streameval")
    settings = [_settings(run.result) for run in runs]
    names = sorted({name for fields in settings for name in fields}, key=_setting_order)
    differing = []
    for name in names:
        groups = _grouped_values(runs, [fields.get(name, "(absent)") for fields in settings])
        if len(groups) > 1:
            differing.append(f"{name} ({_describe(groups)})")
    if differing:
        raise ResultFileError("the runs differ in options that decide the numbers: " + "; ".join(differing))
    versions = _grouped(runs, lambda r: r.get("streameval_version", "unknown"))
    if len(versions) > 1:
        return [f"the runs were written by different streameval versions ({_describe(versions)}); "
                "the numbers are comparable only if the metrics did not change between them"]
    return []


def _settings(result: dict) -> dict:
    """Every field that decides a run's numbers, by the name the refusal prints."""
    fields = {name: result[name] for name in SETTINGS if name != "protocol"}
    protocol = result["protocol"]  # a record (a name in results before protocols were records)
    fields.update(_flattened(protocol, "protocol.") if isinstance(protocol, dict) else {"protocol": protocol})
    fields.update(_flattened(result["options"]))
    gom = result["gom"]
    fields["gom"] = "off" if gom is None else "on"
    if gom is not None:
        fields.update({f"gom.{name}": gom[name] for name in GOM_SETTINGS})
    return fields


def _flattened(options: dict, prefix: str = "") -> dict:
    """Nested records (a protocol record later) as dotted names, so a refusal names the inner field."""
    out = {}
    for key, value in options.items():
        if isinstance(value, dict):
            out.update(_flattened(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def _setting_order(name: str):
    head = name.split(".")[0]
    return (SETTINGS.index(head) if head in SETTINGS else len(SETTINGS), name.startswith("gom"), name)


def _grouped(runs: list[Run], value_of) -> dict:
    return _grouped_values(runs, [value_of(run.result) for run in runs])


def _grouped_values(runs: list[Run], values: list) -> dict:
    """JSON text of each distinct value -> labels of the runs that have it, in run order."""
    groups: dict = {}
    for run, value in zip(runs, values):
        groups.setdefault(json.dumps(value, sort_keys=True), []).append(run.label)
    return groups


def _describe(groups: dict) -> str:
    return "; ".join(f"{value} in {', '.join(labels)}" for value, labels in groups.items())


# ---------------------------------------------------------------------------------- statistics


def aggregate(runs: list[Run]) -> dict:
    """The single-result JSON with every value the mean over the runs, plus ``aggregate``; call
    :func:`check_compatible` first."""
    first = runs[0].result
    stats = {name: _statistics(runs, (name,)) for name in SCALARS + ("cmc",)}
    gom = None
    if first["gom"] is not None:
        gom_stats = {name: _statistics(runs, ("gom", name)) for name in GOM_CURVES + GOM_SCALARS}
        stats["gom"] = gom_stats
        gom = {**{name: first["gom"][name] for name in ("tau",) + GOM_SETTINGS},
               "dmin": None, "dmax": None,  # each run's own distance range: no common value
               **{name: gom_stats[name]["mean"] for name in GOM_CURVES + GOM_SCALARS}}
    out = {"result_schema": RESULT_SCHEMA, "streameval_version": __version__}
    out.update({name: stats[name]["mean"] for name in COUNTS})
    out.update({name: first[name] for name in SETTINGS})
    out.update({name: stats[name]["mean"] for name in ("cmc",) + SCALARS[len(COUNTS):]})
    out.update(gom=gom, options=first["options"], run={})
    for section in TARGETS:
        if first.get(section) is not None:
            out[section], stats[section] = _target_section(runs, section)
    out["aggregate"] = {
        "n_runs": len(runs),
        "std_ddof": STD_DDOF,
        "per_run": [{"label": run.label, "file": run.path, "store": run.store,
                     **{name: run.result[name] for name in PER_RUN}} for run in runs],
        **{stat: _by_stat(stats, stat) for stat in STATS},
    }
    return out


def _target_section(runs: list[Run], section: str) -> tuple[dict, dict]:
    """(the section with every value the mean over the runs, their statistics by name: "TAR@FAR=0.001",
    "DIR-R1@FPIR=0.01", "auc", ...).  The runs asked for the same targets (their options agree), so
    points match by position.  No curves: each run's ROC has its own thresholds."""
    feature = TARGETS[section]
    points, stats = [], {}
    template = next((found for run in runs if (found := _points(run, section))), [])  # a run without may lead
    for i, point in enumerate(template):
        mean = {feature.target: point[feature.target]}
        for path, label in feature.point_values(point):
            found = _point_statistics(runs, section, i, path)
            stats[f"{label}@{feature.target.upper()}={point[feature.target]:g}"] = found
            inner = mean
            for step in path[:-1]:
                inner = inner.setdefault(step, {})
            inner[path[-1]] = found["mean"]
        points.append(mean)
    made, more = feature.aggregate(runs[0].result[section], points, lambda path: _statistics(runs, (section, *path)))
    return made, {**stats, **more}


def _point_statistics(runs: list[Run], section: str, i: int, path: tuple) -> dict:
    """``_statistics`` of a value of point i; a run without points (open-set without a non-mated
    query: no target can be met) is left out, as a null value is."""
    return spread([_value(run, (section, "points", i, *path)) if _points(run, section) else None for run in runs],
                  STD_DDOF)


def _points(run: Run, section: str) -> list:
    points = run.result[section].get("points") if isinstance(run.result.get(section), dict) else None
    if not isinstance(points, list):
        raise ResultFileError(f"'{run.path}': {section}.points is missing")
    return points


def _by_stat(stats: dict, stat: str) -> dict:
    """{metric: {stat: v}} -> {metric: v}, the GOM, verification and open-set metrics nested under
    their section's name."""
    return {name: _by_stat(value, stat) if name in NESTED else value[stat] for name, value in stats.items()}


def _statistics(runs: list[Run], path: tuple) -> dict:
    """mean, std, sem, min, max, count of one metric over the runs where it is not null; a curve
    gives a list per statistic (one value per point) and one count."""
    return spread([_value(run, path) for run in runs], STD_DDOF)


def _value(run: Run, path: tuple):
    """A metric of one run: None, a finite number or a list of them (checked, so a hand-edited or
    foreign file is refused instead of averaged)."""
    name = ".".join(map(str, path))
    value = run.result
    try:
        for key in path:
            value = value[key]
    except (KeyError, IndexError, TypeError):
        raise ResultFileError(f"'{run.path}': {name} is missing") from None
    numbers = value if isinstance(value, list) else [value]
    if value is not None and not all(_is_number(v) for v in numbers):
        raise ResultFileError(f"'{run.path}': {name} must be a finite number, a list of them or null")
    domain = COUNT if path[0] in COUNTS else FRACTION
    refusal = next(filter(None, map(domain.refusal, numbers)), None) if value is not None else None
    if refusal:  # a tampered or foreign file: averaging it would print an impossible number
        raise ResultFileError(f"'{run.path}': {name} {refusal}")
    if isinstance(value, list):
        expected = _curve_length(run.result, path)
        if len(value) != expected:
            raise ResultFileError(f"'{run.path}': {name} has {len(value)} points, expected {expected}")
    return value


def _curve_length(result: dict, path: tuple) -> int:
    return result["max_rank"] if path == ("cmc",) else result["gom"]["bins"] + 1


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# ------------------------------------------------------------------------------------ terminal


def summary(out: dict) -> str:
    """The per-run table and the mean +- std line, plain text that pastes into a report."""
    agg = out["aggregate"]
    width = max(len("run"), *(len(row["label"]) for row in agg["per_run"]))
    protocol = out["protocol"]["name"] if isinstance(out["protocol"], dict) else out["protocol"]
    lines = [f"streameval aggregate: {agg['n_runs']} runs, {out['metric']}, protocol {protocol}, "
             f"std with ddof {agg['std_ddof']}",
             f"  {'run':<{width}}  {'queries':>9}  {'rank-1':>7}  {'mAP':>7}  {'mINP':>7}"]
    lines += [f"  {row['label']:<{width}}  {row['n_queries']:>9,}  {_pct(row['rank1'])}  {_pct(row['mAP'])}  "
              f"{_pct(row['mINP'])}" for row in agg["per_run"]]
    closed = [("rank-1", "rank1"), ("mAP", "mAP"), ("mINP", "mINP")]
    lines.append("  mean +- std: " + "   ".join(_mean_std(agg, label, (key,), _pct) for label, key in closed))
    if out["gom"] is not None:
        lines.append("  GOM mean +- std: " + "   ".join(
            _mean_std(agg, key, ("gom", key), lambda v: "   n/a" if v is None else f"{v:.4f}")
            for key in ("MREP", "mReP_max", "MFR")))
    for section, feature in TARGETS.items():  # the values a pasted table shows per target
        points = (out.get(section) or {}).get("points")
        shown = f"{feature.headline(points[0])[1]}@" if points else None
        named = [name for name in agg["mean"].get(section, {}) if shown and name.startswith(shown)]
        if named:
            lines.append(f"  {section.replace('_', '-')} mean +- std: " + "   ".join(
                _mean_std(agg, name, (section, name), _pct) for name in named))
    return "\n".join(lines)


def _pct(value) -> str:
    return "    n/a" if value is None else f"{100 * value:6.2f}%"


def _mean_std(agg: dict, label: str, path: tuple, fmt) -> str:
    def pick(stat):
        value = agg[stat]
        for key in path:
            value = value[key]
        return value

    text = f"{label} {fmt(pick('mean')).strip()}"
    if pick("std") is not None:
        text += f" +- {fmt(pick('std')).strip()}"
    count = pick("count")
    return text + (f" ({count} of {agg['n_runs']} runs)" if count != agg["n_runs"] else "")
