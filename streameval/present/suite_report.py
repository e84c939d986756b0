"""A suite result (docs/suites.md#the-result-json) as people read it: the table shaped like the CIL-ReID
paper's (one row per setting, "mean (std)" x 100), every evaluation in upstream's column order, the
per-corruption breakdown, and the lines the command prints.

Every function takes the suite result dict as ``streameval suite --json`` writes it (``{"suite":
..., "run": ...}``) or its ``"suite"`` part.  Formats: ``table`` (terminal, aligned), and through
:func:`streameval.present.report.render` ``markdown`` and ``latex``; ``csv`` is for programs: the fractions
of the JSON at full precision (a std in its own column, null an empty cell), not percent text.

Light (no numpy), like :mod:`streameval.present.report`.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import Callable

from ..core.errors import OptionError
from .report import Column, Row, latex_escape, render
from ..suite.plan import SETTINGS

UPSTREAM_COLUMNS = ("mINP", "mAP", "R1", "R5", "R10")  # CIL-ReID's tables, in its order
FORMATS = ("table", "markdown", "csv", "latex")
HEADLINE_MARK = " (headline)"


@dataclass(frozen=True)
class _PaperColumn(Column):
    """A metric as the paper prints it: "42.31 (0.52)", mean (std) in one cell; no std, no brackets."""

    def cell(self, row: Row) -> tuple[str | None, None]:
        value, std = super().cell(row)
        return (value if value is None or std is None else f"{value} ({std})"), None


@dataclass(frozen=True)
class _TextColumn(Column):
    """A column of words or counts (trial, variant names, T): printed as they are, escaped for the
    format (LaTeX: variant names may hold "_")."""

    percent: bool = False
    escape: Callable[[str], str] = str

    def _text(self, value) -> str | None:
        return None if value is None else self.escape(str(value))


def setting_order(names) -> list[str]:
    """``names`` in the order clean, query, gallery, both, then the others as they come."""
    names = list(dict.fromkeys(names))
    return [s for s in SETTINGS if s in names] + [s for s in names if s not in SETTINGS]


# ------------------------------------------------------------------------------------ tables


def suite_table(suite: dict, fmt: str = "table", columns=None) -> str:
    """One row per setting (clean, query, gallery, both, then others; the headline setting marked),
    T, and each metric of ``columns`` (default: upstream's mINP, mAP, R1, R5, R10, those the suite
    has) as mean (std) x 100; a setting of one trial (clean) without std."""
    _check_format(fmt)
    suite = _inner(suite)
    metrics = _metrics(suite, columns)
    settings = suite["settings"]
    names = setting_order(settings)
    headline = suite["headline_setting"]
    if fmt == "csv":
        header = ["setting", "headline", "T", *(f"{m}{part}" for m in metrics for part in ("", " std"))]
        return _csv([header, *([name, int(name == headline), settings[name]["T"],
                                *(settings[name][stat][m] for m in metrics for stat in ("mean", "std"))]
                               for name in names)])
    rows = [Row(name + (HEADLINE_MARK if name == headline else ""),
                {**settings[name]["mean"], "T": settings[name]["T"]}, settings[name]["std"]) for name in names]
    table = _render(rows, [_TextColumn("T", ("T",)), *(_metric_column(m) for m in metrics)], fmt, "Setting")
    if fmt != "table":
        return table
    spread = any(settings[name]["T"] > 1 for name in names)
    caption = f"mean (std over trials, ddof {suite['std_ddof']}), x 100" if spread else "x 100"
    return f"  {caption}\n{table}"


def per_evaluation_table(suite: dict, fmt: str = "table", columns=None) -> str:
    """Every evaluation in upstream's column order: setting, trial, query variant, gallery variant,
    then the metrics of ``columns`` (default mINP, mAP, R1, R5, R10) x 100."""
    _check_format(fmt)
    suite = _inner(suite)
    metrics = _metrics(suite, columns)
    evaluations = suite["evaluations"]
    if fmt == "csv":
        header = ["setting", "trial", "query_variant", "gallery_variant", "name", *metrics]
        return _csv([header, *([e["setting"], e["trial"], e["query_variant"], e["gallery_variant"], e["name"],
                                *(e["values"][m] for m in metrics)] for e in evaluations)])
    escape = latex_escape if fmt == "latex" else str
    text = [_TextColumn(header, (key,), escape=escape) for header, key in
            (("Trial", "trial"), ("Query variant", "query_variant"), ("Gallery variant", "gallery_variant"))]
    rows = [Row(e["setting"], {**e["values"], "trial": "-" if e["trial"] is None else e["trial"],
                               "query_variant": e["query_variant"], "gallery_variant": e["gallery_variant"]})
            for e in evaluations]
    return _render(rows, text + [_metric_column(m) for m in metrics], fmt, "Setting")


def breakdown_table(suite: dict, fmt: str = "table", columns=None) -> str:
    """The per-corruption breakdown (docs/suites.md#per-corruption-breakdown): per side (query) and grouping (by
    type, ...) one row per corruption with its query count n and the metrics of ``columns`` x 100.
    OptionError when the suite result has none."""
    _check_format(fmt)
    suite = _inner(suite)
    if not suite.get("breakdown"):
        raise OptionError("the suite result has no per-corruption breakdown (its query variants carry no "
                          "corruption_type)")
    groups = [(side, grouping, {_corruption(key, found.get("corruption_names")): entry
                                for key, entry in entries.items()})
              for side, found in suite["breakdown"].items()
              for grouping, entries in found.items() if grouping.startswith("by_")]  # by_type, by_type_severity
    present = {key for _, _, entries in groups for entry in entries.values() for key in entry}
    metrics = [m for m in _metrics(suite, columns) if m in present]
    if fmt == "csv":
        header = ["side", "by", "corruption", "n", *metrics]
        return _csv([header, *([side, _by(grouping), key, entry["n"], *(entry.get(m) for m in metrics)]
                               for side, grouping, entries in groups for key, entry in entries.items())])
    escape = latex_escape if fmt == "latex" else str
    rows = [Row(side, {**entry, "by": _by(grouping), "corruption": key})
            for side, grouping, entries in groups for key, entry in entries.items()]
    cols = [_TextColumn(header, (key,), escape=escape) for header, key in (("By", "by"), ("Corruption", "corruption"),
                                                                            ("n", "n"))]
    return _render(rows, cols + [_metric_column(m) for m in metrics], fmt, "Side")


def _corruption(key: str, names: dict | None) -> str:
    """A breakdown key ("3", or "3/2" by type and severity) with its type by name when the variants
    name their types (``corruption_names``): "fog", "fog/2"."""
    code, *severity = key.split("/")
    return "/".join([(names or {}).get(code, code), *severity])


def _by(grouping: str) -> str:
    """``by_type`` -> ``type``, ``by_type_severity`` -> ``type, severity``."""
    return grouping.removeprefix("by_").replace("_", ", ")


def summary_lines(suite: dict) -> list[str]:
    """What ``streameval suite`` prints: the plan (and its note), the evaluations and gallery passes,
    and the headline setting's upstream metrics as mean (std) x 100."""
    suite = _inner(suite)
    execution = suite["execution"]
    lines = [
        title(suite),
        f"  {execution['evaluations']} evaluations over {execution['gallery_variants']} gallery variants: "
        f"{execution['gallery_passes']} gallery passes, {execution['gemms']} GEMMs",
    ]
    headline, name = suite["headline"], suite["headline_setting"]
    if headline is None:
        return lines + [f"  the headline setting '{name}' has no evaluation in this suite"]
    spread = Row("", headline["mean"], headline["std"])
    values = "   ".join(f"{m} {_metric_column(m).cell(spread)[0] or 'n/a'}" for m in _metrics(suite, None))
    trials = suite["settings"][name]["T"]
    spread_over = f"mean (std) over {trials} trials, " if trials > 1 else ""
    return lines + [f"  {name}{HEADLINE_MARK}: {values}   ({spread_over}x 100)"]


def title(suite: dict) -> str:
    """"suite PLAN (NOTE): protocol P, T trials, std ddof D": what was run, for a heading or a
    figure; T is the most trials of any setting (a suite file may give fewer than its ``trials``)."""
    suite = _inner(suite)
    note = f" ({suite['note']})" if suite.get("note") else ""
    trials = max(setting["T"] for setting in suite["settings"].values())
    return (f"suite {suite['plan']}{note}: protocol {suite['protocol']}, {trials} trial{'s' * (trials > 1)}, "
            f"std ddof {suite['std_ddof']}")


# ---------------------------------------------------------------------------------- helpers


def _inner(suite: dict) -> dict:
    return suite["suite"] if "suite" in suite else suite


def _metrics(suite: dict, columns) -> list[str]:
    """The metric columns: ``columns`` (each one the suite has: OptionError naming them otherwise),
    or upstream's that it has."""
    if columns is None:
        return [m for m in UPSTREAM_COLUMNS if m in suite["metrics"]]
    unknown = [m for m in columns if m not in suite["metrics"]]
    if unknown:
        raise OptionError(f"no metric {', '.join(repr(m) for m in unknown)} in the suite result; it has "
                          f"{', '.join(suite['metrics'])}")
    return list(columns)


def _metric_column(metric: str) -> _PaperColumn:
    """Closed-set metrics x 100 with 2 decimals; GOM values (``gom.*``) 0-1 with 4, as eval's tables
    print them."""
    return _PaperColumn(metric, (metric,), not metric.startswith("gom."))


def _render(rows: list[Row], cols: list[Column], fmt: str, first: str) -> str:
    if fmt == "table":
        return "\n".join(_aligned(rows, cols, first))
    return render(rows, cols, fmt, first)


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise OptionError(f"unknown table format '{fmt}': one of {', '.join(FORMATS)}")


def _aligned(rows: list[Row], cols: list[Column], first: str) -> list[str]:
    """The terminal table: labels and words left, counts right, a metric's means right-aligned with
    their "(std)" after them, so means line up under each other whether or not a row has a std."""
    texts = []
    for c in cols:
        cells = [Column.cell(c, row) for row in rows]  # (value, std) apart, to align the values
        values = [value or "n/a" for value, _ in cells]
        if isinstance(c, _TextColumn):
            width = max(len(c.header), *map(len, values))
            counts = all(v == "-" or v.isdigit() for v in values)
            texts.append([(c.header.rjust if counts else c.header.ljust)(width),
                          *((v.rjust if counts else v.ljust)(width) for v in values)])
            continue
        mean_width = max(map(len, values), default=0)
        column = [v.rjust(mean_width) + ("" if std is None else f" ({std})") for v, (_, std) in zip(values, cells)]
        width = max(len(c.header), *map(len, column))
        texts.append([c.header.ljust(width), *(v.ljust(width) for v in column)])
    labels = [first, *(row.label for row in rows)]
    label_width = max(map(len, labels))
    return [("  " + "   ".join([label.ljust(label_width), *(t[i] for t in texts)])).rstrip()
            for i, label in enumerate(labels)]


def _csv(lines: list[list]) -> str:
    """Numbers as Python writes them (floats round-trip exactly), None an empty cell."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(lines)
    return buffer.getvalue().rstrip("\n")
