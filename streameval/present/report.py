"""Human-readable summaries: the terminal table, and tables to paste into a paper or a README
(Markdown, CSV, LaTeX) built from the result JSON.

Light on purpose (no numpy): ``aggregate`` prints through it without loading the engine.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.errors import OptionError
from ..features import REGISTRY, TARGETED

if TYPE_CHECKING:
    from ..run.result import Result
    from ..store import Store

DEFAULT_RANKS = (1, 5, 10, 20)  # and max_rank: the CMC points shown unless --ranks chooses
GOM_HEADLINE = ("MREP", "mReP_max", "MFR")  # the GOM values a pasted table carries (as aggregate's summary)


def _pct(value) -> str:
    return "n/a" if value is None else f"{100 * value:6.2f}%"


def shown_ranks(max_rank: int, ranks=None) -> list[int]:
    """The CMC ranks a summary shows, ascending: ``ranks`` (OptionError past ``max_rank``: the curve
    stops there), by default 1, 5, 10, 20 and ``max_rank``, those up to ``max_rank``."""
    if ranks is None:
        return sorted({k for k in DEFAULT_RANKS if k <= max_rank} | {max_rank})
    if max(ranks) > max_rank:
        raise OptionError(f"--ranks {max(ranks)} is past the CMC's last rank, {max_rank} (--max-rank); "
                          f"evaluate with --max-rank {max(ranks)} or more")
    return sorted(set(ranks))


def formatted(result: Result, label: str, ranks=None, fmt: str = "table") -> str:
    """What eval / update print: the terminal table, or a table to paste (``fmt``)."""
    if fmt == "table":
        return summary(result, label, ranks)
    return paste(rows_of(result.to_dict(), label), shown_ranks(result.max_rank, ranks), fmt)


def summary(result: Result, label: str = "", ranks=None) -> str:
    """A short table: counts, CMC ranks (``ranks``, or :func:`shown_ranks`' default), mAP (both
    conventions), mINP, and how the run went."""
    run = result.run
    ranks = shown_ranks(result.max_rank, ranks)
    lines = [
        f"streameval {label}".rstrip(),
        f"  queries {_count(result.n_queries)} ({_count(result.n_valid_queries)} with positives, "
        f"{_count(result.n_open_queries)} open-set)   gallery {result.n_gallery:,}",
        f"  metric {result.metric}   protocol {result.protocol}   precision {result.options.get('precision')}"
        + (f"   CMC {result.cmc_flavour}" if result.cmc_flavour != "first-hit" else ""),
    ]
    lines += [f"  warning: {warning}" for warning in result.warnings]  # next to the counts they explain
    if result.n_valid_queries == 0:
        lines.append("  no query has a positive in the gallery: closed-set metrics are undefined")
    else:
        lines += [
            "  " + "  ".join(f"{'R' + str(k):>7}" for k in ranks),
            "  " + "  ".join(f"{_pct(result.rank(k)):>7}" for k in ranks),
            f"  mAP {_pct(result.mAP)}   mAP (trapezoid) {_pct(result.mAP_trapezoid)}   mINP {_pct(result.mINP)}",
        ]
    if result.trials is not None:
        lines.append(_trial_line(result.trials, ranks))
    if result.ci is not None:
        lines += _ci_lines(result)
    for feature in REGISTRY:
        if feature.result_field and getattr(result, feature.result_field) is not None:
            lines += feature.summary_lines(getattr(result, feature.result_field))
    if result.directions:
        lines += [f"  direction {name}: rank-1 {_pct(d['rank1'])}   mAP {_pct(d['mAP'])}   mINP {_pct(d['mINP'])}"
                  for name, d in result.directions.items()]
    if run.get("update"):
        lines.append(_update_line(run["update"], result.n_queries))
    if run:
        lines += [
            f"  {run['pairs_per_s'] / 1e6:,.1f} M pairs/s   read {run['bytes_read'] / 2**20:,.1f} MiB   blocks "
            f"{run['query_block']:,} x {run['gallery_chunk']:,}   {run['workers']} workers on {run['scheduler']}",
            phases_line(run["phases"]),
        ]
    return "\n".join(lines)


def _count(value) -> str:
    """A count, or a mean count over trials: whole as an int (a float 301.0 printed as 301), else
    with one decimal."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,.1f}"


def _trial_line(trials: dict, ranks: list[int]) -> str:
    """The headline values are means over the trials: say so, with their spread."""
    mean, std = trials["mean"], trials["std"]
    values = [(f"R{k}", _at(mean, ("cmc", k - 1)), _at(std, ("cmc", k - 1))) for k in ranks]
    values += [(name, mean[name], std[name]) for name in ("mAP", "mINP")]
    return (f"  means over {trials['T']} trials (std ddof {trials['std_ddof']}): "
            + "   ".join(_mean_pm_std(name, m, s) for name, m, s in values))


CI_SHOWN = (("rank1", "R1"), ("rank5", "R5"), ("rank10", "R10"), ("mAP", "mAP"), ("mAP_trapezoid", "mAP (trapezoid)"),
            ("mINP", "mINP"), ("MREP", "MREP"), ("MFR", "MFR"))  # (metric, label), in the summary's order
GOM_CI = ("MREP", "MFR")  # on GOM's 0-1 scale, the others in percent


def _ci_lines(result: Result) -> list[str]:
    """How the intervals were made, then each metric with one as value +- half its width (the
    percentile interval need not be symmetric: the JSON holds both ends)."""
    ci = result.ci
    how = ci["method"] + (f", {ci['resamples']:,} resamples, seed {ci['seed']}" if ci["unit"] == "query" else "")
    values = {**{f"rank{k}": result.rank(k) for k in (1, 5, 10) if k <= result.max_rank},
              "mAP": result.mAP, "mAP_trapezoid": result.mAP_trapezoid, "mINP": result.mINP, **(result.gom or {})}
    parts = []
    for name, label in CI_SHOWN:
        value, width = values.get(name), half_width(ci, name)
        if value is not None and width is not None:
            parts.append(f"{label} {value:.4f} +- {width:.4f}" if name in GOM_CI
                         else f"{label} {_pct(value).strip()} +- {100 * width:.2f}")
    return [f"  {100 * ci['level']:g}% confidence intervals, {how}:", "    " + "   ".join(parts)]


def half_width(ci: dict, name: str) -> float | None:
    """(hi - lo) / 2 of metric ``name``'s interval in a ``ci`` section; None without one."""
    lo, hi = ci["intervals"].get(name) or (None, None)
    return None if lo is None or hi is None else (hi - lo) / 2


def half_widths(ci: dict) -> dict:
    """The half widths keyed as a result's values (CMC points by position, GOM values under
    ``gom``), so a table's columns find them as they find a std."""
    ranks = {int(name[len("rank"):]) - 1: half_width(ci, name) for name in ci["intervals"] if name.startswith("rank")}
    return {**{name: half_width(ci, name) for name in ("mAP", "mAP_trapezoid", "mINP")}, "cmc": ranks,
            "gom": {name: half_width(ci, name) for name in GOM_CI}}


def _mean_pm_std(name: str, mean, std, std_unit: str = "") -> str:
    if mean is None:
        return f"{name} n/a"
    return f"{name} {_pct(mean).strip()}" + ("" if std is None else f" +- {100 * std:.2f}{std_unit}")


def _at(record, path: tuple):
    """``record[path[0]][path[1]]...``, None where a level is missing or null (a curve of a run
    without positives, the GOM block of a run without GOM)."""
    for key in path:
        if record is None:
            return None
        record = record.get(key) if isinstance(record, dict) else record[key]
    return record


PHASE_NOTES = {"passes": "passes (the bar)"}


def phases_line(phases: dict) -> str:
    """The line "20.52 s = 0.41 s setup + 19.80 s passes (the bar) + ...": every part printed as the
    bar prints its time, and the total as the sum of the parts printed, so the line adds up exactly."""
    hundredths = [int(round(float(f"{seconds:.2f}") * 100)) for seconds in phases.values()]
    parts = " + ".join(f"{h / 100:.2f} s {PHASE_NOTES.get(name, name)}" for name, h in zip(phases, hundredths))
    return f"  {sum(hundredths) / 100:.2f} s = {parts}"


def _update_line(update: dict, n_queries: int) -> str:
    """What an incremental update scored, and why it re-scored old rows."""
    if update["rows_added"] == 0:
        return f"  update: no gallery rows added since the state ({update['rows_before']:,} rows); nothing scored"
    line = f"  update: +{update['rows_added']:,} gallery rows (had {update['rows_before']:,}); "
    if update["range_moved"]:
        before, after = update["range_before"], update["range_after"]
        return line + (f"the minmax range moved from [{before[0]:.6g}, {before[1]:.6g}] to [{after[0]:.6g}, "
                       f"{after[1]:.6g}], moving every GOM threshold: all {n_queries:,} queries re-scored over the old rows")
    if update["queries_rescored"]:
        return line + f"{update['queries_rescored']:,} queries with new positives re-scored over the old rows"
    return line + "no new positives: only the new rows scored"


def store_summary(store: Store) -> str:
    g = store.gallery
    if store.holds_distances:
        both = " (and queries x queries)" if store.query.distances is not None else ""
        return (f"{store.path}: {len(store.query):,} queries x {len(g):,} gallery rows of precomputed {store.kind}s"
                f"{both}, {g.distances.dtype}, chunks of {g.distances.chunks[0]:,} x {g.distances.chunks[1]:,}")
    return (
        f"{store.path}: {len(store.query):,} queries, {len(g):,} gallery rows, dim {store.dim}, "
        f"{g.features.dtype}, {g.chunk_rows:,} rows per chunk, default metric {store.default_metric}"
    )


# --------------------------------------------------------------------------- tables to paste


@dataclass(frozen=True)
class Row:
    """One line of a pasted table: a result JSON's values (or an aggregate's means) and, when they
    are means over trials or runs, their std (the same keys)."""

    label: str
    values: dict
    std: dict | None = None
    spread: str = "std"  # what ``std`` holds: "std", or "ci" (half widths of confidence intervals)


@dataclass(frozen=True)
class Column:
    name: str
    path: tuple  # keys into a Row's values and std
    percent: bool  # closed-set values: percent with 2 decimals (the ReID convention); GOM: 0-1, 4 decimals

    @property
    def header(self) -> str:
        return f"{self.name} (%)" if self.percent else self.name

    def cell(self, row: Row) -> tuple[str | None, str | None]:
        """(the value, its std) as printed; None where null."""
        return self._text(_at(row.values, self.path)), self._text(_at(row.std, self.path))

    def _text(self, value) -> str | None:
        if value is None:
            return None
        return f"{100 * value:.2f}" if self.percent else f"{value:.4f}"


@dataclass(frozen=True)
class TargetColumn(Column):
    """A value at one target of a section's points (TAR at a FAR, DIR at an FPIR): ``path`` is the
    section, then the keys inside its point.  The point is found by its target, not its position,
    so a row that asked for other targets shows none.  The std is an aggregate's (its statistics
    are named as the columns); a run's trials keep theirs in the JSON section."""

    target_key: str = ""
    target: float = 0.0

    def cell(self, row: Row) -> tuple[str | None, str | None]:
        section, *inner = self.path
        points = _at(row.values, (section, "points")) or []
        point = next((p for p in points if p[self.target_key] == self.target), None)
        return self._text(_at(point, tuple(inner))), self._text(_at(row.std, (section, self.name)))


def target_columns(rows: list[Row]) -> list[Column]:
    """TAR at each FAR target (verification) and the first rank's DIR at each FPIR target (open-set),
    as the first row holding each section asked for them."""
    cols = []
    for feature in TARGETED:
        points = next((found for row in rows if (found := _at(row.values, (feature.name, "points")))), [])
        for point in points:
            inner, label = feature.headline(point)
            cols.append(TargetColumn(f"{label}@{feature.target.upper()}={point[feature.target]:g}",
                                     (feature.name, *inner), True, feature.target, point[feature.target]))
    return cols


def rows_of(result: dict, label: str) -> list[Row]:
    """A result JSON's rows: one, or one per direction (regdb both ways); the values of a result
    with trials are their means, with the std over the trials."""
    if result.get("directions"):
        return [row for name, one in result["directions"].items() for row in rows_of(one, f"{label} {name}")]
    trials, ci = result.get("trials"), result.get("ci")
    if ci:  # asked for (--ci): the interval's half width instead of the trials' std
        level = f"{100 * ci['level']:g}% CI"
        words = f"mean ± {level}, {trials['T']} trials" if trials else f"± {level}"
        return [Row(f"{label} ({words})", result, half_widths(ci), "ci")]
    if trials:
        return [Row(f"{label} (mean ± std, {trials['T']} trials)", result, trials["std"])]
    return [Row(label, result)]


def aggregate_rows(out: dict, runs) -> list[Row]:
    """Every run's rows, then the mean ± std over the runs (``runs``: ``aggregate.Run``)."""
    rows = [row for run in runs for row in rows_of(run.result, run.label)]
    agg = out["aggregate"]
    runs_word = "run" if agg["n_runs"] == 1 else "runs"
    return rows + [Row(f"mean ± std ({agg['n_runs']} {runs_word})", out, agg["std"])]


def columns(rows: list[Row], ranks: list[int]) -> list[Column]:
    """Rank-k for each k, mAP, mINP, mAP_trapezoid, the GOM headline values when a row has GOM, and
    TAR / DIR at their targets when a row has verification / open-set."""
    cols = [Column(f"Rank-{k}", ("cmc", k - 1), True) for k in ranks]
    cols += [Column(name, (name,), True) for name in ("mAP", "mINP", "mAP_trapezoid")]
    if any(row.values.get("gom") for row in rows):
        cols += [Column(name, ("gom", name), False) for name in GOM_HEADLINE]
    return cols + target_columns(rows)


def paste(rows: list[Row], ranks: list[int], fmt: str) -> str:
    """``rows`` as a Markdown, CSV or LaTeX table (``fmt``)."""
    return render(rows, columns(rows, ranks), fmt)


def render(rows: list[Row], cols: list[Column], fmt: str, first: str = "Run") -> str:
    """``rows`` under ``cols`` as a Markdown, CSV or LaTeX table (``fmt``); ``first`` heads the labels."""
    return {"markdown": _markdown, "csv": _csv, "latex": _latex}[fmt](rows, cols, first)


def _markdown(rows: list[Row], cols: list[Column], first: str) -> str:
    def line(cells):
        return "| " + " | ".join(cells) + " |"

    def cell(value, std):
        return "n/a" if value is None else value + ("" if std is None else f" ± {std}")

    lines = [line([first, *(c.header for c in cols)]), line([":--", *("--:" for _ in cols)])]
    lines += [line([row.label.replace("|", "\\|"), *(cell(*c.cell(row)) for c in cols)]) for row in rows]
    return "\n".join(lines)


def _csv(rows: list[Row], cols: list[Column], first: str) -> str:
    """Numbers stay numbers: a std gets its own column after its value (only when a row has one);
    null is an empty cell."""
    spread = any(row.std is not None for row in rows)
    kinds = {row.spread for row in rows if row.std is not None}
    word = {frozenset({"ci"}): "CI half width", frozenset({"ci", "std"}): "std or CI half width"}.get(frozenset(kinds),
                                                                                                      "std")
    header = [first]
    for c in cols:
        header += [c.header] + ([f"{c.name} {word}" + (" (%)" if c.percent else "")] if spread else [])
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        cells = [row.label]
        for c in cols:
            value, std = c.cell(row)
            cells += [value or ""] + ([std or ""] if spread else [])
        writer.writerow(cells)
    return buffer.getvalue().rstrip("\n")


def _latex(rows: list[Row], cols: list[Column], first: str) -> str:
    """A bare tabular (no package needed), text escaped; ± as $\\pm$."""
    def line(cells):
        return " & ".join(cells) + r" \\"

    def cell(value, std):
        return "n/a" if value is None else value + ("" if std is None else rf" $\pm$ {std}")

    lines = [r"\begin{tabular}{l" + "r" * len(cols) + "}", r"\hline",
             line([latex_escape(first), *(latex_escape(c.header) for c in cols)]), r"\hline"]
    lines += [line([latex_escape(row.label), *(cell(*c.cell(row)) for c in cols)]) for row in rows]
    return "\n".join(lines + [r"\hline", r"\end{tabular}"])


LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                 "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "±": r"$\pm$"}


def latex_escape(text: str) -> str:
    return "".join(LATEX_SPECIAL.get(ch, ch) for ch in text)


def aggregate_text(out: dict, runs, ranks=None, fmt: str = "table") -> str:
    """What aggregate prints: its per-run table (plus the mean ± std of the chosen ranks when
    ``ranks`` is given), or a table to paste with every run and the mean."""
    ranks_shown = shown_ranks(out["max_rank"], ranks)
    if fmt != "table":
        return paste(aggregate_rows(out, runs), ranks_shown, fmt)
    from .aggregate import summary

    text = summary(out)
    if ranks is None:
        return text
    agg = out["aggregate"]
    return text + "\n  CMC mean +- std: " + "   ".join(
        _mean_pm_std(f"R{k}", _at(agg["mean"], ("cmc", k - 1)), _at(agg["std"], ("cmc", k - 1)), "%")
        for k in ranks_shown)
