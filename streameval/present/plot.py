"""``streameval plot``: the curves of one or more result JSONs, overlaid, for people who would rather look.

One panel per kind of data, left out when no result has it, one colour per result on every panel:

* CMC, in percent against the rank, the y axis from just below the lowest point plotted, never
  above 100%; with trials (or an aggregate of runs) a band of +- 1 std around the mean curve;
* DIR against FPIR (open-set identification, ``open_set``): one line per rank point, the FPIR targets
  on a log axis, the closed-set limit (accept everything: the CMC over Q+) marked at FPIR 1;
* ROC (TAR against FAR, log FAR axis) and DET (FNMR = 1 - TAR against FAR, log-log) of pair-level
  verification, from the histogram-resolution curves of ``verification``, the exact TAR at each
  requested FAR marked and the line drawn through it;
* GOM mReP against tau (queries with positives), tau_max marked; a single result also shows the mRP
  and mVP it is made of;
* GOM mFR against tau (open-set queries);
* rank-1 and mAP of every trial (results with trials).

A suite result (``streameval suite --json``, docs/suites.md#the-result-json) is drawn as a figure of its
own (:func:`suite_figure`): mAP, mINP and R1 per setting, the mean with +- 1 std error bars and each
trial as a dot, several suites side by side within each setting.  Suites and eval results do not mix.

Reading a file checks what will be drawn (:func:`curves`), so a foreign or hand-edited JSON is one
error line naming it; matplotlib is imported only to draw (:func:`figure`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from ..core.errors import OptionError, StoreError, one_line
from ..core.extras import require_extra
from ..core.outputs import replace_file
from .suite_report import setting_order, title

IMAGE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg", ".eps", ".tif", ".tiff")
GOM_CURVES = ("mReP", "mRP", "mVP", "mFR")
GOM_VALUES = ("mReP_max", "tau_max", "MREP", "MFR", "tau_nz")
MARKS_LISTED = 4  # requested FAR points written into the ROC legend; more would make it wider than the panel
RANK_STYLES = (("-", "o"), ("--", "s"), ("-.", "^"), (":", "v"), ("-", "D"), ("--", "P"))  # DIR: (line, marker) per rank
SUITE_PANELS = ("mAP", "mINP", "R1")  # a suite's metrics drawn, one panel each, those it has


# --------------------------------------------------------------------------------- arguments


def arguments(files, out: str | None, labels: str | None) -> tuple[list[str], str, list[str]]:
    """(result files, image, legend labels) from the command line: the image is ``out`` (--out) or,
    without it, the last of ``files`` (``streameval plot RESULT.json OUT.png``); an image suffix
    tells the image from the results, so neither form is ambiguous."""
    files = [os.fspath(f) for f in files]
    if out is None:
        if len(files) < 2 or not _is_image(files[-1]):
            raise OptionError(f"no image to write: the last FILE ('{files[-1]}') must be one "
                              f"({', '.join(IMAGE_SUFFIXES)}), or give --out OUT.png")
        files, out = files[:-1], files[-1]
    elif not _is_image(out):
        raise OptionError(f"--out '{out}' is not an image: end it in one of {', '.join(IMAGE_SUFFIXES)}")
    for path in files:
        if _is_image(path):
            raise OptionError(f"'{path}' is an image, not a result JSON: name one image, with --out or last")
        if not os.path.isfile(path):
            raise OptionError(f"no result file '{path}'")
    return files, out, _labels(files, labels)


def _is_image(path: str) -> bool:
    return os.path.splitext(os.fspath(path))[1].lower() in IMAGE_SUFFIXES


def _labels(files: list[str], labels: str | None) -> list[str]:
    """``--labels A,B`` split, one per file; by default the file names without their suffix (the
    paths, when two names are the same)."""
    if labels is None:
        stems = [os.path.splitext(os.path.basename(path))[0] for path in files]
        return stems if len(set(stems)) == len(stems) else files
    names = [name.strip() for name in labels.split(",")]
    if len(names) != len(files):
        raise OptionError(f"--labels has {len(names)} labels for {len(files)} results; give one per result, in order")
    if not all(names) or len(set(names)) != len(names):
        raise OptionError("--labels must be non-empty and different: they tell the results apart in the legends")
    return names


# ---------------------------------------------------------------------------------- reading


@dataclass
class Curves:
    """What is drawn of one result; percent for the closed-set values, 0-1 for GOM."""

    label: str
    metric: str
    protocol: str
    cmc_flavour: str
    cmc: np.ndarray | None  # CMC@1..max_rank, %
    cmc_std: np.ndarray | None  # over trials or runs, %
    spread_over: str | None  # "trials" | "runs"
    mAP: float | None  # %
    tau: np.ndarray | None
    gom: dict  # the GOM curves present (mReP, mRP, mVP, mFR), GOM_VALUES and normalisation; {} without GOM
    per_trial: dict | None  # rank1, mAP (%), one value per trial
    open_set: dict | None  # fpir (targets > 0, ascending), dir {rank: %, NaN for null}, limit {rank: %}, note, trials
    verification: dict | None  # far, tar (curve points), marks (requested FAR, exact TAR) rows, auc


@dataclass
class SuiteBars:
    """What is drawn of one suite result: per setting (in :func:`setting_order`) and metric of
    SUITE_PANELS the suite has, in percent, NaN for null: the mean, the std (null with one trial)
    and each trial's value."""

    label: str
    title: str  # plan (note), protocol, trials, ddof: suite.report.title
    headline: str
    settings: list[str]
    mean: dict  # metric -> array over settings
    std: dict  # metric -> array over settings
    per_trial: dict  # metric -> [array over the setting's trials, per setting]


def load(path: str, label: str) -> Curves | SuiteBars:
    """The curves of the result JSON at ``path``, or the bars of a suite result (StoreError, naming
    it, when it is neither)."""
    try:
        with open(path, encoding="utf-8") as fh:
            result = json.load(fh)
        return suite_bars(result, label) if isinstance(result, dict) and "suite" in result else curves(result, label)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise StoreError(f"'{path}' is not a streameval result JSON ({one_line(exc)})") from None


def curves(result: dict, label: str) -> Curves:
    """``result`` (a result or aggregate JSON) as :class:`Curves`; ValueError, KeyError or TypeError
    when a value is not what streameval writes.  A regdb result of both directions is drawn by its
    headline, the first direction (the label says which)."""
    if result.get("directions"):
        label += f" ({next(iter(result['directions']))})"
    cmc = _array(result["cmc"], result["max_rank"], 100)
    trials, aggregate = result.get("trials"), result.get("aggregate")
    spread = trials or aggregate
    gom = result["gom"]
    tau = None if gom is None else _array(gom["tau"], gom["bins"] + 1)
    gom_found = {} if gom is None else {
        **{name: _array(gom[name], len(tau)) for name in GOM_CURVES if gom[name] is not None},
        **{name: _number(gom[name]) for name in GOM_VALUES}, "normalisation": str(gom["normalisation"])}
    protocol = result["protocol"]
    return Curves(
        label=label, metric=str(result["metric"]), cmc_flavour=str(result.get("cmc_flavour", "first-hit")),
        protocol=str(protocol["name"] if isinstance(protocol, dict) else protocol),
        cmc=cmc, cmc_std=None if spread is None or cmc is None else _array(spread["std"]["cmc"], len(cmc), 100),
        spread_over=None if spread is None else ("trials" if trials else "runs"),
        mAP=None if result["mAP"] is None else 100 * _number(result["mAP"]), tau=tau, gom=gom_found,
        per_trial=None if not trials else {name: _array([t[name] for t in trials["per_trial"]],
                                                        len(trials["per_trial"]), 100, gaps=True)
                                           for name in ("rank1", "mAP")},
        open_set=_open_set(result.get("open_set")), verification=_verification(result.get("verification")),
    )


def suite_bars(result: dict, label: str) -> SuiteBars:
    """``result`` (a suite result, COMMON section 3 / docs/suites.md#the-result-json) as :class:`SuiteBars`;
    ValueError, KeyError or TypeError when a value is not what streameval writes."""
    suite = result["suite"]
    settings = suite["settings"]
    names = setting_order(settings)
    metrics = [m for m in SUITE_PANELS if m in suite["metrics"]]

    def over_settings(stat: str, metric: str) -> np.ndarray:
        return _array([settings[name][stat][metric] for name in names], len(names), 100, gaps=True)

    return SuiteBars(
        label=label, title=title(suite), headline=str(suite["headline_setting"]), settings=names,
        mean={m: over_settings("mean", m) for m in metrics}, std={m: over_settings("std", m) for m in metrics},
        per_trial={m: [_array(settings[name]["per_trial"][m], settings[name]["T"], 100, gaps=True) for name in names]
                   for m in metrics},
    )


def _open_set(section: dict | None) -> dict | None:
    """DIR per rank at the FPIR targets of ``section`` (the result's ``open_set``), in percent.  A
    target of 0 has no place on a log axis and is left out; a null DIR (no mated query) is a gap."""
    if section is None:
        return None
    ranks = sorted(int(rank) for rank in section["ranks"])
    points = sorted((p for p in section["points"] if _number(p["fpir"]) > 0), key=lambda p: p["fpir"])
    limit = section["closed_set_limit"] or {}
    return {"fpir": _array([p["fpir"] for p in points], len(points)),
            "dir": {rank: _array([p["dir"][str(rank)] for p in points], len(points), 100, gaps=True)
                    for rank in ranks},
            "limit": {rank: 100 * _number(limit[str(rank)]) for rank in ranks
                      if limit.get(str(rank)) is not None},
            "note": None if section.get("note") is None else str(section["note"]),
            "trials": "T" in section}  # with trials the points are means over them


def _verification(section: dict | None) -> dict | None:
    """The ROC points of ``section`` (the result's ``verification``: curves at histogram resolution,
    null without pairs of both kinds) and the exact (requested FAR, TAR) points, FAR 0 left out."""
    if section is None:
        return None
    roc = section["curves"]
    n = 0 if roc is None else len(roc["far"])
    marks = [(_number(p["far"]), _number(p["tar"])) for p in section["points"]]
    return {"far": _array([] if roc is None else roc["far"], n), "tar": _array([] if roc is None else roc["tar"], n),
            "marks": np.array([(far, tar) for far, tar in marks if far > 0 and tar is not None]).reshape(-1, 2),
            "auc": _number(section.get("auc"))}


def _array(values, length: int, scale: float = 1, gaps: bool = False) -> np.ndarray | None:
    """A curve of ``length`` finite numbers, scaled; None stays None.  With ``gaps`` a null point
    (a trial without positives) is allowed and drawn as a gap."""
    if values is None:
        return None
    array = np.asarray(values, dtype=np.float64)  # null -> NaN
    if array.shape != (length,):
        raise ValueError(f"a curve of {array.shape} values where {length} were expected")
    if (np.isinf(array) if gaps else ~np.isfinite(array)).any():
        raise ValueError("a curve with " + ("infinite" if gaps else "null or non-finite") + " values")
    return scale * array


def _number(value) -> float | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise TypeError(f"{value!r} is not a number")
    return None if value is None else float(value)


# ---------------------------------------------------------------------------------- drawing


def require_matplotlib(purpose: str) -> None:
    """Before any work: matplotlib, which draws (the plot extra), is installed, else one OptionError."""
    require_extra("matplotlib", package="matplotlib", extra="plot", purpose=purpose, error=OptionError)


def plot_suite(result: dict, out: str, label: str | None = None) -> None:
    """Draw one suite result (the dict ``streameval suite --json`` writes) into the image ``out``;
    the legend names it ``label``, by default its plan."""
    save(suite_figure([suite_bars(result, label or str(result["suite"]["plan"]))]), out)


def plot_results(paths: list[str], out: str, labels: list[str]) -> None:
    """Read every result, then draw them into the image ``out`` (its suffix picks the format):
    suite results as :func:`suite_figure`, eval and aggregate results as :func:`figure`."""
    runs = [load(path, label) for path, label in zip(paths, labels)]
    suites = [path for path, run in zip(paths, runs) if isinstance(run, SuiteBars)]
    if suites and len(suites) < len(runs):
        other = next(path for path in paths if path not in suites)
        raise OptionError(f"'{suites[0]}' is a suite result and '{other}' is not: plot suite results together, "
                          "eval results together")
    save((suite_figure if suites else figure)(runs), out)


def save(fig, out: str, dpi: int = 110) -> None:
    """The figure as the image ``out`` (its suffix picks the format), written as every output is
    (``outputs.replace_file``: a link at ``out`` is replaced, not written through)."""
    replace_file(out, lambda tmp: fig.savefig(tmp, dpi=dpi))


def figure(runs: list[Curves]):
    """The matplotlib Figure of ``runs``: the panels some run has data for, side by side."""
    panels = [draw for has_data, draw in PANELS if any(has_data(run) for run in runs)]
    if not panels:
        raise StoreError("nothing to plot: no result has a CMC (no query with positives), DIR@FPIR, ROC, "
                         "GOM curves or trials")
    fig, axes = _grid(len(panels))
    for ax, draw in zip(axes, panels):
        draw(ax, runs)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    shared = {(run.metric, run.protocol) for run in runs}
    if len(shared) == 1:
        metric, protocol = shared.pop()
        fig.suptitle(f"{metric} distance, protocol {protocol}", fontsize=10)
    return fig


def suite_figure(runs: list[SuiteBars]):
    """The matplotlib Figure of suite results: one panel per metric of SUITE_PANELS some run has a
    value of, the settings along x, the runs side by side within each setting."""
    metrics = [m for m in SUITE_PANELS if any(m in run.mean and np.isfinite(run.mean[m]).any() for run in runs)]
    if not metrics:
        raise StoreError(f"nothing to plot: no suite result has a value of {', '.join(SUITE_PANELS)} "
                         "(no query with positives)")
    settings = setting_order(name for run in runs for name in run.settings)
    fig, axes = _grid(len(metrics))
    for ax, metric in zip(axes, metrics):
        _suite_panel(ax, runs, metric, settings)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(loc="best", fontsize=8)
    titles = list(dict.fromkeys(run.title for run in runs))
    fig.suptitle(titles[0] if len(titles) == 1 else "; ".join(f"{run.label}: {run.title}" for run in runs),
                 fontsize=10)
    return fig


def _suite_panel(ax, runs: list[SuiteBars], metric: str, settings: list[str]) -> None:
    """Per run, the mean of each setting with +- 1 std error bars (none with one trial) and each
    trial as a small dot just right of its bar (on it, the bar would hide it), shifted so the runs
    stand side by side within a setting."""
    width = 0.7 / len(runs)
    values = []
    for i, run in enumerate(runs):
        if metric not in run.mean:
            continue
        x = np.array([settings.index(name) for name in run.settings]) + (i - (len(runs) - 1) / 2) * width
        mean, std = run.mean[metric], run.std[metric]
        ax.errorbar(x, mean, yerr=std, fmt="o", color=_colour(i), capsize=4, label=f"{run.label}: mean +- 1 std")
        trials = run.per_trial[metric]
        ax.scatter(np.repeat(x + width / 6, [len(t) for t in trials]), np.concatenate(trials), s=10, color=_colour(i),
                   alpha=0.5, linewidths=0, zorder=3, label=f"{run.label}: each trial")
        values += [mean - std, mean + std, mean, *trials]
    ax.set_ylim(*_limits(values, 100))
    ax.set_xlim(-0.5, len(settings) - 0.5)
    headlines = {run.headline for run in runs}
    ax.set_xticks(range(len(settings)), [name + ("\n(headline)" if name in headlines else "") for name in settings])
    ax.set(xlabel="setting", ylabel=f"{metric} (%)", title=f"{metric} per setting: mean +- 1 std over trials")


def _grid(count: int):
    """A Figure and its ``count`` panels (Axes), side by side; more than 4 in two rows."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    columns = count if count <= 4 else -(-count // 2)
    rows = -(-count // columns)
    fig = Figure(figsize=(5.4 * columns, 4.6 * rows), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    for ax in axes[count:]:
        fig.delaxes(ax)  # the second row's empty places
    return fig, axes[:count]


def _colour(i: int) -> str:
    return f"C{i % 10}"  # one per run, the same on every panel


def _cmc_panel(ax, runs: list[Curves]) -> None:
    from matplotlib.ticker import MaxNLocator

    values = []
    for i, run in enumerate(runs):
        if run.cmc is None:
            continue
        ranks = np.arange(1, len(run.cmc) + 1)
        ax.plot(ranks, run.cmc, color=_colour(i), marker="." if len(ranks) <= 60 else None,
                label=f"{run.label}: rank-1 {run.cmc[0]:.2f}%, mAP {_fmt(run.mAP, '.2f')}%")
        low = high = run.cmc
        if run.cmc_std is not None:
            low, high = run.cmc - run.cmc_std, run.cmc + run.cmc_std
            ax.fill_between(ranks, low, high, color=_colour(i), alpha=0.15, linewidth=0)
        values += [low, high]
    low, high = _limits(values, 100)
    ax.set_ylim(low, min(high, 100.0))  # no CMC passes 100%, nor should its axis (a std band may)
    last = max(len(run.cmc) for run in runs if run.cmc is not None)
    ax.set_xlim(1 - 0.02 * last, last * 1.02)  # from rank 1, with room for its marker
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    flavours = sorted({run.cmc_flavour for run in runs if run.cmc is not None} - {"first-hit"})
    spreads = sorted({run.spread_over for run in runs if run.cmc_std is not None})
    title = "CMC" + (f" ({', '.join(flavours)})" if flavours else "")
    if spreads:
        title += f", band: +-1 std over {' / '.join(spreads)}"
    ax.set(xlabel="rank k", ylabel="CMC@k (%)", title=title)


def _dir_panel(ax, runs: list[Curves]) -> None:
    """DIR against the FPIR target, one line per (run, rank); the closed-set limit marked at FPIR 1."""
    values = []
    ranks = sorted({rank for run in runs if run.open_set for rank in run.open_set["dir"]})
    for i, run in enumerate(runs):
        found = run.open_set
        if found is None:
            continue
        for rank, dir_values in found["dir"].items():
            line, marker = RANK_STYLES[ranks.index(rank) % len(RANK_STYLES)]  # a rank looks the same in every run
            if np.isfinite(dir_values).any():
                ax.plot(found["fpir"], dir_values, line, marker=marker, color=_colour(i), markersize=4,
                        label=f"{run.label}: rank {rank}")
                values.append(dir_values)
        if found["limit"]:
            limits = np.array(list(found["limit"].values()))
            note = f" ({found['note']})" if found["note"] else ""
            ax.scatter(np.ones(len(limits)), limits, color=_colour(i), marker="*", s=60, zorder=3,
                       label=f"{run.label}: closed-set limit (accept all), ranks {', '.join(map(str, found['limit']))}"
                             f"{note}")
            values.append(limits)
    ax.set_xscale("log")
    ax.set_ylim(*_limits(values, 100))
    means = any(run.open_set and run.open_set["trials"] for run in runs)
    ax.set(xlabel="FPIR target (non-mated queries accepted, log)", ylabel="DIR (%)",
           title="DIR vs FPIR, open-set identification" + (" (trials: means)" if means else ""))


def _roc_panel(ax, runs: list[Curves]) -> None:
    """TAR against FAR (log), the exact TAR at each requested FAR marked."""
    values = []
    for i, run in enumerate(runs):
        found = run.verification
        if found is None:
            continue
        far, tar = _roc_points(found)
        if len(far):
            auc = "" if found["auc"] is None else f": AUC {found['auc']:.4f}"
            ax.plot(far, tar, color=_colour(i), label=run.label + auc)
            values.append(tar)
        marks = found["marks"]
        if len(marks):
            ax.scatter(marks[:, 0], marks[:, 1], color=_colour(i), zorder=3, s=25, label=f"{run.label}: " + (
                "TAR@FAR " + ", ".join(f"{far:g}: {tar:.4f}" for far, tar in marks) if len(marks) <= MARKS_LISTED
                else f"TAR at {len(marks)} requested FARs"))  # (the JSON has them all)
            values.append(marks[:, 1])
    ax.set_xscale("log")
    ax.set_ylim(*_limits(values, 1))
    ax.set(xlabel="FAR (impostor pairs accepted, log)", ylabel="TAR (genuine pairs accepted, 0-1)",
           title="ROC, pair-level verification")


def _det_panel(ax, runs: list[Curves]) -> None:
    """FNMR = 1 - TAR against FAR, both log; the requested FARs marked.  Points with FAR 0 or FNMR 0
    lie off the axes."""
    for i, run in enumerate(runs):
        found = run.verification
        if found is None:
            continue
        far, fnmr = _det_points(*_through_marks(found))
        if len(far):
            ax.plot(far, fnmr, color=_colour(i), label=run.label)
        far, fnmr = _det_points(*found["marks"].T)
        if len(far):
            ax.scatter(far, fnmr, color=_colour(i), zorder=3, s=25, label=f"{run.label}: at the requested FARs")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set(xlabel="FAR (impostor pairs accepted, log)", ylabel="FNMR = 1 - TAR (genuine pairs rejected, log)",
           title="DET, pair-level verification")


def _through_marks(found: dict) -> tuple[np.ndarray, np.ndarray]:
    """The curve's points and the exact (requested FAR, TAR) points together, in FAR order (then
    TAR's): the line drawn passes through the marks printed beside it.  Between two histogram
    points a straight line is not the ROC; at a requested FAR the exact TAR is."""
    far = np.concatenate([found["far"], found["marks"][:, 0]])
    tar = np.concatenate([found["tar"], found["marks"][:, 1]])
    order = np.lexsort((tar, far))
    return far[order], tar[order]


def _roc_points(found: dict) -> tuple[np.ndarray, np.ndarray]:
    """(FAR, TAR) of the ROC curve (``_through_marks``) that a log FAR axis can show: FAR 0 lies off it."""
    far, tar = _through_marks(found)
    return far[far > 0], tar[far > 0]


def _det_points(far: np.ndarray, tar: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(FAR, FNMR = 1 - TAR) that log-log axes can show: FAR 0 and FNMR 0 lie off them."""
    keep = (far > 0) & (tar < 1)
    return far[keep], 1 - tar[keep]


def _rep_panel(ax, runs: list[Curves]) -> None:
    """mReP per run (with its mRP and mVP when there is one run), tau_max marked."""
    alone = len(runs) == 1
    drawn = ["mReP", "mRP", "mVP"] if alone else ["mReP"]
    values = []
    for i, run in enumerate(runs):
        if "mReP" not in run.gom:
            continue
        g = run.gom
        ax.plot(run.tau, g["mReP"], color=_colour(i), label=f"{run.label}: mReP, max {_fmt(g['mReP_max'])} at tau "
                f"{_fmt(g['tau_max'], '.2f')}, MREP {_fmt(g['MREP'])}")
        for name, style in zip(drawn[1:], (":", "--")):
            ax.plot(run.tau, g[name], style, color=_colour(i), label=name)
        if g["tau_max"] is not None and g["mReP_max"] is not None:
            _mark_tau_max(ax, g["tau_max"], g["mReP_max"], _colour(i), annotate=alone)
        values += [g[name] for name in drawn]
    ax.set_ylim(*_limits(values, 1))
    ax.set(xlabel="tau (normalised distance threshold, 0-1)", ylabel=", ".join(drawn) + " (0-1)",
           title="GOM, queries with positives" + _normalisations(runs))


def _mark_tau_max(ax, tau_max: float, rep_max: float, colour: str, annotate: bool) -> None:
    """A dot at the curve's maximum (a collection, not a line: lines are curves), with its values
    written beside it when the panel is not crowded."""
    ax.scatter([tau_max], [rep_max], color=colour, zorder=3, s=25)
    if annotate:
        ax.annotate(f"tau_max = {tau_max:.2f}\nmReP_max = {rep_max:.4f}", (tau_max, rep_max),
                    textcoords="offset points", xytext=(10, -28), fontsize=8,
                    bbox={"boxstyle": "round", "fc": "white", "ec": "grey", "alpha": 0.9})


def _fr_panel(ax, runs: list[Curves]) -> None:
    values = []
    for i, run in enumerate(runs):
        if "mFR" not in run.gom:
            continue
        ax.plot(run.tau, run.gom["mFR"], color=_colour(i),
                label=f"{run.label}: MFR {_fmt(run.gom['MFR'])}, tau_nz {_fmt(run.gom['tau_nz'], '.2f')}")
        values.append(run.gom["mFR"])
    ax.set_ylim(*_limits(values, 1))
    ax.set(xlabel="tau (normalised distance threshold, 0-1)", ylabel="mFR (0-1)",
           title="GOM, open-set queries" + _normalisations(runs))


def _trials_panel(ax, runs: list[Curves]) -> None:
    from matplotlib.ticker import MaxNLocator

    values = []
    for i, run in enumerate(runs):
        if run.per_trial is None:
            continue
        trials = np.arange(1, len(run.per_trial["rank1"]) + 1)
        for name, style in (("rank1", "o-"), ("mAP", "s--")):
            ax.plot(trials, run.per_trial[name], style, color=_colour(i), markersize=4,
                    label=f"{run.label}: {'rank-1' if name == 'rank1' else name}")
            values.append(run.per_trial[name])
    ax.set_ylim(*_limits(values, 100))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="trial", ylabel="rank-1 and mAP (%)", title="Each trial (rank-1 solid, mAP dashed)")


PANELS = (  # (has data, draw)
    (lambda run: run.cmc is not None, _cmc_panel),
    (lambda run: run.open_set is not None and any(np.isfinite(v).any() for v in run.open_set["dir"].values()),
     _dir_panel),
    (lambda run: run.verification is not None and len(_roc_points(run.verification)[0]) > 0, _roc_panel),
    (lambda run: run.verification is not None and len(_det_points(*_through_marks(run.verification))[0]) > 0,
     _det_panel),
    (lambda run: "mReP" in run.gom, _rep_panel),
    (lambda run: "mFR" in run.gom, _fr_panel),
    (lambda run: run.per_trial is not None and not np.isnan(run.per_trial["rank1"]).all(), _trials_panel),
)


def _limits(curves: list[np.ndarray], top: float) -> tuple[float, float]:
    """The y range of the points drawn (gaps aside): from a little below the lowest to a little
    above the highest (never below 0), so the differences between the curves fill the panel
    instead of a range from 0.  ``top``: the scale's maximum (100 for percent, 1 for GOM)."""
    points = np.concatenate(curves)
    points = points[~np.isnan(points)]
    low, high = points.min(), points.max()
    pad = max(0.05 * (high - low), 0.01 * top)
    return max(0.0, low - pad), high + pad


def _normalisations(runs: list[Curves]) -> str:
    """The GOM normalisation in a title, when the runs share one."""
    found = {run.gom["normalisation"] for run in runs if run.gom}
    return f" ({found.pop()})" if len(found) == 1 else ""


def _fmt(value, fmt: str = ".4f") -> str:
    return "n/a" if value is None else format(value, fmt)
