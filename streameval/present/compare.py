"""Comparing runs (docs/significance.md#comparing-runs): ``streameval compare A.json B.json ...`` and
:func:`compare`.

Every run is compared with the first (the baseline), metric by metric, on the paired samples of
``run.significance.metric_samples`` (per-query contributions, or per-trial values): the delta of
the means, its bootstrap interval and three p-values (``core.paired``), Holm-corrected over the
compared runs of each metric.  Runs whose numbers were decided by different settings are refused
as ``aggregate`` refuses them (one check: ``aggregate.check_compatible``), and so are runs over
other queries or another gallery: pairs must be the same units.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from ..core.choices import PAIRED_TESTS, PASTE_FORMATS, check_range
from ..core.errors import OptionError
from .aggregate import ResultFileError, Run, check_compatible, read_result, run_labels
from .report import Column, Row, render

CORRECTIONS = ("holm", "none")
COUNTS = ("n_queries", "n_valid_queries", "n_open_queries", "n_gallery")  # the same queries and gallery
PER_QUERY_IDENTITY = ("counted", "n_positives")  # per query: which queries count, their positives in the gallery
HEADERS = {"rank1": "Rank-1", "rank5": "Rank-5", "rank10": "Rank-10"}  # as the result tables name them
FRACTIONS = ("MREP", "MFR")  # 0-1 with 4 decimals in tables; the others in percent (report's convention)
TEST_NAMES = {"t": "paired t-test", "wilcoxon": "Wilcoxon signed-rank test", "randomization": "paired randomization test"}


@dataclass
class Comparison:
    """What :func:`compare` found: ``metrics[name]`` holds ``unit``, ``n``, ``values`` (each run's
    mean) and ``runs`` (per compared run: ``delta``, ``ci``, ``p``, ``p_corrected``)."""

    labels: list
    files: list
    unit: str
    metrics: dict
    level: float
    resamples: int
    seed: int
    correction: str
    warnings: list = field(default_factory=list)

    @property
    def baseline(self) -> str:
        return self.labels[0]

    def to_dict(self) -> dict:
        """JSON-ready (NaN, an undefined p-value, as null)."""
        return _json_ready({
            "baseline": self.baseline,
            "runs": [{"label": label, "file": file} for label, file in zip(self.labels, self.files)],
            "unit": self.unit, "level": self.level, "resamples": self.resamples, "seed": self.seed,
            "correction": self.correction, "metrics": self.metrics,
            **({"warnings": list(self.warnings)} if self.warnings else {}),
        })

    def table(self, format: str = "markdown", test: str = "randomization", alpha: float = 0.05) -> str:
        """Rows = runs, columns = metrics, each cell the run's value; a compared run's value is
        marked (``*``; LaTeX ``$^{*}$``) where the ``test``'s corrected p-value is below
        ``alpha``, and a legend line says so.  CSV keeps numbers in cells: each metric's column is
        followed by that p-value's."""
        if format not in PASTE_FORMATS:
            raise OptionError(f"format must be one of {', '.join(PASTE_FORMATS)}, got {format!r}")
        if test not in PAIRED_TESTS:
            raise OptionError(f"test must be one of {', '.join(PAIRED_TESTS)}, got {test!r}")
        alpha = check_range(alpha, "alpha")
        key = "p_corrected" if self.correction != "none" else "p"
        rows = [Row(self.baseline + " (baseline)", {name: {"value": found["values"][self.baseline], "p": None,
                                                           "marked": False} for name, found in self.metrics.items()})]
        for label in self.labels[1:]:
            cells = {}
            for name, found in self.metrics.items():
                p = found["runs"][label][key][test]
                cells[name] = {"value": found["values"][label], "p": p, "marked": p == p and p < alpha}
            rows.append(Row(label, cells))
        mark = "$^{*}$" if format == "latex" else "*"
        cols = []
        for name in self.metrics:
            cols.append(_Value(HEADERS.get(name, name), (name, "value"), name not in FRACTIONS,
                               "" if format == "csv" else mark))
            if format == "csv":
                cols.append(_PValue(f"{HEADERS.get(name, name)} p ({test}{'; Holm' if key == 'p_corrected' else ''})",
                                    (name, "p"), False))
        return render(rows, cols, format) + self._legend(format, test, alpha)

    def _legend(self, format: str, test: str, alpha: float) -> str:
        corrected = (f", Holm-corrected over the {len(self.labels) - 1} compared runs of each metric"
                     if self.correction == "holm" and len(self.labels) > 2 else "")  # one run: Holm changes nothing
        text = (f"* {TEST_NAMES[test]} p < {alpha:g} against {self.baseline}{corrected}; paired over "
                f"{'queries' if self.unit == 'query' else 'trials'}")
        return {"markdown": "\n\n" + text.replace("*", "\\*", 1), "latex": "\n% " + text, "csv": ""}[format]


@dataclass(frozen=True)
class _Value(Column):
    """A run's value, marked when significant."""

    mark: str = "*"

    def cell(self, row: Row):
        value, _ = super().cell(row)
        return (value + self.mark if value is not None and row.values[self.path[0]]["marked"] else value), None


@dataclass(frozen=True)
class _PValue(Column):
    """A p-value as a number (3 significant digits); empty for the baseline."""

    def cell(self, row: Row):
        p = row.values[self.path[0]]["p"]
        return (None if p is None or p != p else f"{p:.3g}"), None


def compare(results, metrics=None, seed: int = 0, level: float = 0.95, resamples: int = 10_000,
            correction: str = "holm", labels=None) -> Comparison:
    """Compare each of ``results`` (Result objects or paths of result JSON files written with
    ``--per-query``, mixed) with the first, per metric (``metrics``: names such as "mAP",
    "rank1"; default every metric the baseline has samples of): delta = mean(run - baseline) over
    the paired samples, its percentile bootstrap interval at ``level`` (``resamples`` resamples
    drawn from ``seed``), and the p-values of the paired t, Wilcoxon and randomization tests
    (``core.paired.paired_tests``), each corrected by Holm's method over the compared runs of the
    metric (``correction="none"``: not corrected).  ``labels`` name the runs (default: the file
    names, "run N" for a Result)."""
    level, resamples, seed = check_range(level, "level"), check_range(resamples, "ci_resamples"), \
        check_range(seed, "ci_seed")
    if correction not in CORRECTIONS:
        raise OptionError(f"correction must be one of {', '.join(CORRECTIONS)}, got {correction!r}")
    if isinstance(results, (str, os.PathLike)) or hasattr(results, "to_dict"):
        raise OptionError("compare takes a list of runs (Result objects or paths), the baseline first; got one run")
    runs = _runs(list(results), labels)
    warnings = check_compatible(runs)
    _check_same_units(runs)
    unit, samples = _samples(runs)
    names = _metric_names(samples[0], metrics)
    tested = _paired(runs, samples, names, level, resamples, seed)
    found = {name: _metric_section(runs, samples, name, tested, unit, correction) for name in names}
    return Comparison([run.label for run in runs], [run.path or None for run in runs], unit, found, level,
                      resamples, seed, correction, warnings)


def _runs(items: list, labels) -> list[Run]:
    """Each item as a Run: a JSON file read (and checked as ``aggregate`` reads it), a Result as
    its dict with the per-query values."""
    if len(items) < 2:
        raise OptionError(f"compare needs two runs or more (a baseline and the runs compared with it), got {len(items)}")
    names = []
    for i, item in enumerate(items, 1):
        if isinstance(item, (str, os.PathLike)):
            names.append(os.fspath(item))
        elif hasattr(item, "to_dict"):
            names.append(f"run {i}")
        else:
            raise OptionError(f"compare takes Result objects or paths of result JSON files, got {type(item).__name__}")
    labels = run_labels(names, list(labels or ()))
    return [Run(label, os.fspath(item), read_result(item)) if isinstance(item, (str, os.PathLike))
            else Run(label, "", item.to_dict(per_query=True)) for label, item in zip(labels, items)]


def _check_same_units(runs: list[Run]) -> None:
    """The runs scored the same queries against the same gallery: the counts, and per query which
    are counted and how many positives each has (ids the JSON does not hold; these are their trace)."""
    first = runs[0]
    for run in runs[1:]:
        for name in COUNTS:
            if run.result[name] != first.result[name]:
                raise ResultFileError(f"the runs do not score the same queries and gallery: {name} is "
                                      f"{first.result[name]} in {first.label} and {run.result[name]} in {run.label}")
        for name in PER_QUERY_IDENTITY:
            mine, theirs = (run.result.get("per_query") or {}).get(name), (first.result.get("per_query") or {}).get(name)
            if mine is not None and theirs is not None and mine != theirs:
                where = [i for i, (a, b) in enumerate(zip(theirs, mine)) if a != b]
                raise ResultFileError(f"the runs do not score the same queries: per_query.{name} differs between "
                                      f"{first.label} and {run.label} at {len(where)} queries (first: query {where[0]})")


def _samples(runs: list[Run]) -> tuple[str, list[dict]]:
    """(the unit, each run's samples by metric); a run without per-query values is named."""
    from ..run.significance import metric_samples

    def of(run, pool_trials):
        try:
            return metric_samples(run.result, pool_trials=pool_trials)
        except OptionError as exc:
            where = f"'{run.path}'" if run.path else run.label
            raise OptionError(f"{where}: {exc}") from None

    # with trials, pairs of queries where every run has them per query (the same settings and rows
    # count the same queries in each), else pairs of trials
    found = [of(run, True) for run in runs]
    if len({unit for unit, _ in found}) > 1:
        found = [of(run, False) for run in runs]
    return found[0][0], [samples for _, samples in found]


def _metric_names(baseline: dict, metrics) -> list[str]:
    if metrics is None:
        return list(baseline)
    metrics = [m.strip() for m in metrics.split(",")] if isinstance(metrics, str) else list(metrics)
    unknown = [m for m in metrics if m not in baseline]
    if unknown or not metrics:
        raise OptionError(f"metrics {', '.join(map(repr, unknown)) or '(none)'}: the baseline has values of "
                          f"{', '.join(baseline)}")
    return list(dict.fromkeys(metrics))


def _paired(runs: list[Run], samples: list, names: list, level, resamples, seed) -> dict:
    """(metric, label) -> ``paired_tests`` of that run against the baseline.  The pairs over as
    many units are tested in one call: they share the resamples' draws (as each call of the same
    seed would draw them), drawn once."""
    import numpy as np

    from ..core.paired import paired_tests

    groups: dict = {}
    for name in names:
        base = samples[0][name]
        for run, found in zip(runs[1:], samples[1:]):
            values = found.get(name)
            if values is None or len(values) != len(base):
                raise ResultFileError(f"{name} has {len(base)} samples in {runs[0].label} and "
                                      f"{'none' if values is None else len(values)} in {run.label}: they cannot be paired")
            groups.setdefault(len(base), []).append(((name, run.label), base, values))
    tested = {}
    for pairs in groups.values():
        keys, bases, others = zip(*pairs)
        tested.update(zip(keys, paired_tests(np.stack(bases, axis=1), np.stack(others, axis=1), level, resamples,
                                             seed)))
    return tested


def _metric_section(runs: list[Run], samples: list, name: str, tested: dict, unit: str, correction: str) -> dict:
    """One metric's part of the comparison: n, each run's value, each compared run's tests, with
    Holm's correction over the compared runs (one family per test)."""
    from ..core.paired import holm

    compared = {run.label: tested[name, run.label] for run in runs[1:]}
    if correction == "holm":
        adjusted = {test: holm([one["p"][test] for one in compared.values()]) for test in PAIRED_TESTS}
        for i, one in enumerate(compared.values()):
            one["p_corrected"] = {test: float(adjusted[test][i]) for test in PAIRED_TESTS}
    return {"n": int(len(samples[0][name])), "unit": unit,
            "values": {run.label: float(found[name].mean()) for run, found in zip(runs, samples)}, "runs": compared}


def _json_ready(value):
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_ready(v) for v in value]
    return None if isinstance(value, float) and math.isnan(value) else value
