"""``streameval plot`` (issues 12 and 13): one or more results overlaid, one line per result on each
panel, every axis labelled, the CMC axis starting where the data is, panels without data left out;
DIR against FPIR (one line per rank, log FPIR axis, the closed-set limit at FPIR 1), ROC (log FAR)
and DET (log-log) with the requested FAR points marked.

The figure is checked through the function that builds it (its axes, labels, lines and the values
they draw, against the result JSONs), and the command through the PNG it writes.  The open-set and
verification sections of the unit tests are written by hand in the result schema
(docs/options.md#the-json-result) from the worked vectors docs/open-set.md#worked-example-v7; docs/verification.md#worked-example-v6."""

from __future__ import annotations

import json

import numpy as np
import pytest

from streameval.present.plot import curves, figure
from streameval.tools.synth import synthesize

from cli_checks import cli, one_error_line

pytest.importorskip("matplotlib")

SMALL = dict(n_query=40, n_gallery=400, dim=8, n_ids=10, n_cams=3, junk_frac=0.1, open_query_frac=0.2)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Result files of one store: full (GOM, open-set queries), --no-gom, trials (vehicleid: every
    query has positives, so no mFR), and an aggregate of two runs."""
    folder = tmp_path_factory.mktemp("plot")
    store = folder / "s.zarr"
    synthesize(store, seed=3, **SMALL)
    files = {name: folder / f"{name}.json" for name in ("full", "nogom", "trials", "again", "agg")}
    cli("eval", store, "-q", "--gom-bins", "20", "--json", files["full"])
    cli("eval", store, "-q", "--no-gom", "--max-rank", "30", "--json", files["nogom"])
    cli("eval", store, "-q", "--gom-bins", "20", "--protocol", "vehicleid", "--json", files["trials"])
    other = folder / "t.zarr"
    synthesize(other, seed=4, **SMALL)
    cli("eval", other, "-q", "--gom-bins", "20", "--json", files["again"])
    cli("aggregate", files["full"], files["again"], "--json", files["agg"])
    return files


def loaded(results, *names):
    return [curves(json.loads(results[name].read_text()), name) for name in names]


TITLES = {"cmc": "CMC", "mReP": "GOM, queries with positives", "mFR": "GOM, open-set queries", "trials": "Each trial",
          "dir": "DIR vs FPIR", "roc": "ROC", "det": "DET"}


def assert_panels(fig, *kinds) -> None:
    assert len(fig.axes) == len(kinds)
    for ax, kind in zip(fig.axes, kinds):
        assert ax.get_title().startswith(TITLES[kind]), (ax.get_title(), kind)


def assert_labelled(ax) -> None:
    assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
    assert ax.get_legend() is not None


# ------------------------------------------------------------------------------------ figure


def test_one_result_draws_cmc_and_both_gom_panels(results):
    result = json.loads(results["full"].read_text())
    fig = figure(loaded(results, "full"))
    assert_panels(fig, "cmc", "mReP", "mFR")
    cmc_ax, rep_ax, fr_ax = fig.axes
    for ax in fig.axes:
        assert_labelled(ax)
    assert cmc_ax.get_xlabel() == "rank k" and "(%)" in cmc_ax.get_ylabel()
    assert "tau" in rep_ax.get_xlabel() and "tau" in fr_ax.get_xlabel()
    (line,) = cmc_ax.get_lines()
    np.testing.assert_array_equal(line.get_xdata(), np.arange(1, 51))
    np.testing.assert_allclose(line.get_ydata(), 100 * np.asarray(result["cmc"]), rtol=0, atol=1e-12)
    assert [line.get_label().split(":")[0] for line in rep_ax.get_lines()] == ["full", "mRP", "mVP"]
    np.testing.assert_allclose(rep_ax.get_lines()[0].get_ydata(), result["gom"]["mReP"], atol=1e-15)
    (fr_line,) = fr_ax.get_lines()
    np.testing.assert_allclose(fr_line.get_ydata(), result["gom"]["mFR"], atol=1e-15)
    assert "MFR" in fr_line.get_label()


def test_the_cmc_axis_starts_just_below_the_lowest_point(results):
    result = json.loads(results["full"].read_text())
    cmc_ax = figure(loaded(results, "full")).axes[0]
    low, high = cmc_ax.get_ylim()
    lowest, highest = 100 * min(result["cmc"]), 100 * max(result["cmc"])
    assert lowest > 20  # the data starts far from 0 ...
    assert lowest - 0.1 * (highest - lowest) - 1 <= low < lowest  # ... and so does the axis
    assert highest < high <= max(highest + 0.1 * (highest - lowest), highest + 1) or highest == high == 100
    assert cmc_ax.get_xlim()[0] < 1 < cmc_ax.get_xlim()[0] + 2


def test_the_cmc_axis_stops_at_100_percent(results):
    """A CMC reaching 100% and a std band above it: the axis ends at 100, not past it."""
    result = json.loads(results["trials"].read_text())
    result["trials"]["std"]["cmc"][-1] = 0.05  # the band's top: 105%
    for name in ("full", "trials"):
        drawn = json.loads(results[name].read_text()) if name == "full" else result
        assert 100 * max(drawn["cmc"]) == 100.0  # the curve itself reaches 100%
        cmc_ax = figure([curves(drawn, name)]).axes[0]
        assert cmc_ax.get_ylim()[1] == 100.0
    (band,) = cmc_ax.collections
    assert band.get_paths()[0].vertices[:, 1].max() == pytest.approx(105)  # drawn, and cut by the axis


def test_overlay_draws_one_line_per_result_in_one_colour_on_every_panel(results):
    fig = figure(loaded(results, "full", "nogom", "trials"))
    assert_panels(fig, "cmc", "mReP", "mFR", "trials")
    cmc_ax, rep_ax, fr_ax, trial_ax = fig.axes
    cmc_lines = cmc_ax.get_lines()
    assert [line.get_label().split(":")[0] for line in cmc_lines] == ["full", "nogom", "trials"]
    assert [line.get_label().split(":")[0] for line in rep_ax.get_lines()] == ["full", "trials"]  # nogom has no GOM
    assert [line.get_label().split(":")[0] for line in fr_ax.get_lines()] == ["full"]  # vehicleid: no open-set query
    assert [line.get_label() for line in trial_ax.get_lines()] == ["trials: rank-1", "trials: mAP"]
    colour = {line.get_label().split(":")[0]: line.get_color() for line in cmc_lines}
    assert len(set(colour.values())) == 3
    for ax in (rep_ax, fr_ax, trial_ax):
        assert all(line.get_color() == colour[line.get_label().split(":")[0]] for line in ax.get_lines())
    legend = [text.get_text() for text in cmc_ax.get_legend().get_texts()]
    assert [text.split(":")[0] for text in legend] == ["full", "nogom", "trials"]
    for ax in fig.axes:
        assert_labelled(ax)
    assert trial_ax.get_xlabel() == "trial" and "(%)" in trial_ax.get_ylabel()


def test_trials_draw_a_std_band_and_each_trial(results):
    result = json.loads(results["trials"].read_text())
    fig = figure(loaded(results, "trials"))
    assert_panels(fig, "cmc", "mReP", "trials")  # no open-set query: no mFR panel
    cmc_ax, _, trial_ax = fig.axes
    assert "std over trials" in cmc_ax.get_title()
    (band,) = cmc_ax.collections
    lower = band.get_paths()[0].vertices[:, 1].min()
    mean, std = np.asarray(result["trials"]["mean"]["cmc"]), np.asarray(result["trials"]["std"]["cmc"])
    assert lower == pytest.approx(100 * (mean - std).min())
    assert cmc_ax.get_ylim()[0] < lower  # the axis covers the band too
    rank1, m_ap = trial_ax.get_lines()
    per_trial = result["trials"]["per_trial"]
    np.testing.assert_allclose(rank1.get_ydata(), [100 * t["rank1"] for t in per_trial], atol=1e-12)
    np.testing.assert_allclose(m_ap.get_ydata(), [100 * t["mAP"] for t in per_trial], atol=1e-12)
    np.testing.assert_array_equal(rank1.get_xdata(), np.arange(1, len(per_trial) + 1))


def test_an_aggregate_draws_its_mean_with_the_spread_over_runs(results):
    agg = json.loads(results["agg"].read_text())
    cmc_ax = figure(loaded(results, "agg")).axes[0]
    assert "std over runs" in cmc_ax.get_title()
    np.testing.assert_allclose(cmc_ax.get_lines()[0].get_ydata(), 100 * np.asarray(agg["cmc"]), atol=1e-12)
    assert len(cmc_ax.collections) == 1


def test_without_gom_only_the_cmc_panel_is_drawn(results):
    fig = figure(loaded(results, "nogom"))
    assert_panels(fig, "cmc")
    assert fig.axes[0].get_title() == "CMC"
    assert len(fig.axes[0].get_lines()) == 1 and not fig.axes[0].collections


# ---------------------------------------------------------------------------------- command


def test_plot_several_results_with_labels_writes_a_png(results, tmp_path):
    out = tmp_path / "cmp.png"
    done = cli("plot", results["full"], results["trials"], "--labels", "base,vehicle", "--out", out)
    assert done.stdout.strip() == f"wrote {out}"
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    import matplotlib.image

    height, width = matplotlib.image.imread(out).shape[:2]
    assert width > 3 * height  # four panels side by side


def test_the_first_form_result_then_image_still_works(results, tmp_path):
    out = tmp_path / "curves.svg"
    cli("plot", results["nogom"], out)
    assert out.read_text().lstrip().startswith("<?xml")


@pytest.mark.parametrize("args, words", [
    (["{full}"], "no image to write"),
    (["{full}", "{nogom}"], "no image to write"),
    (["{full}", "--out", "{tmp}/x.txt"], "is not an image"),
    (["{full}", "{tmp}/y.png", "--out", "{tmp}/x.png"], "is an image, not a result JSON"),
    (["{full}", "{nogom}", "--labels", "a", "--out", "{tmp}/x.png"], "1 labels for 2 results"),
    (["{full}", "{nogom}", "--labels", "a,a", "--out", "{tmp}/x.png"], "must be non-empty and different"),
    (["{tmp}/missing.json", "{tmp}/x.png"], "no result file"),
])
def test_command_line_mistakes_are_one_line_and_exit_2(results, tmp_path, args, words):
    names = {name: str(path) for name, path in results.items()}
    done = cli("plot", *(a.format(tmp=tmp_path, **names) for a in args), code=2)
    assert words in one_error_line(done)
    assert not list(tmp_path.glob("*.png"))


def test_an_existing_image_is_kept_without_overwrite(results, tmp_path):
    out = tmp_path / "kept.png"
    out.write_bytes(b"mine")
    assert "exists; pass --overwrite" in one_error_line(cli("plot", results["full"], out, code=2))
    assert out.read_bytes() == b"mine"
    cli("plot", results["full"], out, "--overwrite")
    assert out.read_bytes()[:8] == PNG_SIGNATURE


def test_a_foreign_or_edited_json_is_refused_naming_it(results, tmp_path):
    edited = json.loads(results["full"].read_text())
    edited["cmc"] = edited["cmc"][:-1]  # one point short of max_rank
    bad = tmp_path / "edited.json"
    bad.write_text(json.dumps(edited))
    line = one_error_line(cli("plot", results["full"], bad, tmp_path / "x.png", code=3))
    assert f"'{bad}' is not a streameval result JSON" in line and "49" in line
    assert not (tmp_path / "x.png").exists()


def test_a_store_without_positives_draws_only_the_open_set_panel(tmp_path):
    store = tmp_path / "open.zarr"
    synthesize(store, seed=5, **dict(SMALL, open_query_frac=1.0))
    gom, closed = tmp_path / "gom.json", tmp_path / "closed.json"
    cli("eval", store, "-q", "--gom-bins", "20", "--json", gom)
    cli("eval", store, "-q", "--no-gom", "--json", closed)
    result = json.loads(gom.read_text())
    assert result["cmc"] is None and result["gom"]["mReP"] is None  # no query has a positive
    assert_panels(figure([curves(result, "open")]), "mFR")
    line = one_error_line(cli("plot", closed, tmp_path / "x.png", code=3))
    assert "nothing to plot" in line and not (tmp_path / "x.png").exists()


# --------------------------------------------------------------- open set and verification

V7_POINTS = [  # docs/open-set.md#worked-example-v7 (non-mated .30 .50 .50 .80; mated (d+, r+) (.20, 1) (.40, 1) (.50, 2) (.90, 1)),
    # in the order a user might give the targets; FPIR 0 (as 0.1: k = 0) has no place on the log axis
    (0.5, 2, 0.5, "d <= threshold", 0.75, {"1": 0.5, "2": 0.75}),
    (0.0, 0, 0.25, "d < threshold", 0.0, {"1": 0.25, "2": 0.25}),
    (0.1, 0, 0.25, "d < threshold", 0.0, {"1": 0.25, "2": 0.25}),
    (0.125, 1, 0.3, "d <= threshold", 0.25, {"1": 0.25, "2": 0.25}),
    (0.25, 1, 0.3, "d <= threshold", 0.25, {"1": 0.25, "2": 0.25}),
    (1.0, 4, None, "all", 1.0, {"1": 0.75, "2": 1.0}),
]
V7_DRAWN = [0.1, 0.125, 0.25, 0.5, 1.0]  # the targets on the axis, ascending


def open_set_section(points=V7_POINTS, limit=None, note=None) -> dict:
    return {"fpir_targets": [p[0] for p in points], "ranks": [1, 2], "rounding": "round", "n_mated": 4,
            "n_non_mated": 4 if points else 0,
            "points": [{"fpir": x, "k": k, "threshold": t, "accept": accept, "achieved_fpir": achieved, "dir": d}
                       for x, k, t, accept, achieved, d in points],
            "closed_set_limit": limit or {"1": 0.75, "2": 1.0}, "note": note}


V6_POSITIVES = np.array([0.2, 0.5, 0.4])  # docs/verification.md#worked-example-v6, queries A and B together
V6_NEGATIVES = np.array([0.1, 0.3, 0.5, 0.7, 0.3, 0.6, 0.8, 0.9])
V6_POINTS = [  # (far, k, threshold, tar, achieved far)
    (0.0, 0, 0.1, 0.0, 0.0), (0.125, 1, 0.3, 1 / 3, 0.125), (0.2, 1, 0.3, 1 / 3, 0.125),
    (0.25, 2, 0.3, 1 / 3, 0.125), (0.375, 3, 0.5, 2 / 3, 0.375), (0.5, 4, 0.6, 1.0, 0.5), (1.0, 8, None, 1.0, 1.0)]


def verification_section(points=V6_POINTS, positives=V6_POSITIVES, negatives=V6_NEGATIVES, auc=11 / 16) -> dict:
    """The ROC curve here: TAR(t), FAR(t) counting d <= t at every distinct distance and 0, 1 (a
    histogram of fine enough bins gives the same points)."""
    thresholds = np.unique(np.concatenate([[0.0, 1.0], positives, negatives]))
    return {"label_convention": "label 1 = same identity; scores are distances, accept d < threshold",
            "far_targets": [p[0] for p in points], "n_pos": len(positives), "n_neg": len(negatives),
            "method": "tail",
            "points": [{"far": x, "k": k, "threshold": t, "accept": "all" if t is None else "d < threshold",
                        "tar": tar, "achieved_far": achieved} for x, k, t, tar, achieved in points],
            "auc": auc,
            "curves": {"bits": 16, "threshold": thresholds.tolist(),
                       "tar": [float((positives <= t).mean()) for t in thresholds],
                       "far": [float((negatives <= t).mean()) for t in thresholds]}}


def with_sections(results, name, open_set=None, verification=None) -> dict:
    result = json.loads(results[name].read_text())
    result["open_set"], result["verification"] = open_set, verification
    return result


def axis(fig, kind):
    (ax,) = [ax for ax in fig.axes if ax.get_title().startswith(TITLES[kind])]
    return ax


def test_dir_is_drawn_against_the_fpir_targets_one_line_per_rank(results):
    fig = figure([curves(with_sections(results, "full", open_set_section()), "full")])
    assert_panels(fig, "cmc", "dir", "mReP", "mFR")
    ax = axis(fig, "dir")
    assert_labelled(ax)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "linear"
    assert ax.get_title() == "DIR vs FPIR, open-set identification"
    assert "FPIR" in ax.get_xlabel() and ax.get_ylabel() == "DIR (%)"
    rank1, rank2 = ax.get_lines()
    assert (rank1.get_label(), rank2.get_label()) == ("full: rank 1", "full: rank 2")
    assert rank1.get_color() == rank2.get_color() == fig.axes[0].get_lines()[0].get_color()  # the run's colour
    assert rank1.get_linestyle() != rank2.get_linestyle()
    for line in (rank1, rank2):
        np.testing.assert_array_equal(line.get_xdata(), V7_DRAWN)
    np.testing.assert_allclose(rank1.get_ydata(), [25, 25, 25, 50, 75], atol=1e-12)
    np.testing.assert_allclose(rank2.get_ydata(), [25, 25, 25, 75, 100], atol=1e-12)
    (limit,) = ax.collections  # the closed-set limit: one mark per rank at FPIR 1
    np.testing.assert_allclose(limit.get_offsets(), [[1, 75], [1, 100]], atol=1e-12)
    assert "closed-set limit" in limit.get_label()
    low, high = ax.get_ylim()
    assert low < 25 and high > 100


def test_with_trials_the_dir_panel_draws_the_means_and_says_so(results):
    """With trials the headline points are the means over them (k and thresholds null), the
    trials' own sections are in per_trial."""
    means = open_set_section()
    for point in means["points"]:
        point.update(k=None, threshold=None, accept=None)
    means.update(T=2, std_ddof=1, per_trial=[open_set_section(), open_set_section()])
    ax = axis(figure([curves(with_sections(results, "trials", means), "trials")]), "dir")
    assert ax.get_title() == "DIR vs FPIR, open-set identification (trials: means)"
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), [25, 25, 25, 50, 75], atol=1e-12)


def test_roc_and_det_draw_the_curve_and_mark_the_requested_far_points(results):
    fig = figure([curves(with_sections(results, "nogom", verification=verification_section()), "model")])
    assert_panels(fig, "cmc", "roc", "det")
    roc, det = axis(fig, "roc"), axis(fig, "det")
    for ax in (roc, det):
        assert_labelled(ax)
        assert "FAR" in ax.get_xlabel() and ax.get_xscale() == "log"
    assert roc.get_yscale() == "linear" and "TAR" in roc.get_ylabel()
    assert det.get_yscale() == "log" and "FNMR" in det.get_ylabel()

    section = verification_section()
    exact = [(far, tar) for far, _, _, tar, _ in V6_POINTS]
    far, tar = np.array(section["curves"]["far"] + [x for x, _ in exact]), \
        np.array(section["curves"]["tar"] + [y for _, y in exact])
    order = np.lexsort((tar, far))  # the curve's points and the exact ones, in FAR order
    far, tar = far[order], tar[order]
    (roc_line,) = roc.get_lines()
    assert roc_line.get_label() == "model: AUC 0.6875"  # 11/16
    np.testing.assert_array_equal(roc_line.get_xdata(), far[far > 0])  # FAR 0 lies off the log axis
    np.testing.assert_array_equal(roc_line.get_ydata(), tar[far > 0])
    (det_line,) = det.get_lines()
    shown = (far > 0) & (tar < 1)  # so does FNMR 0
    assert shown.sum() < (far > 0).sum()
    np.testing.assert_array_equal(det_line.get_xdata(), far[shown])
    np.testing.assert_allclose(det_line.get_ydata(), 1 - tar[shown], atol=1e-15)

    (roc_marks,) = roc.collections  # the exact TAR at every requested FAR but 0
    np.testing.assert_allclose(roc_marks.get_offsets(), [[0.125, 1 / 3], [0.2, 1 / 3], [0.25, 1 / 3],
                                                         [0.375, 2 / 3], [0.5, 1], [1, 1]], atol=1e-15)
    assert roc_marks.get_label() == "model: TAR at 6 requested FARs"  # too many to list in the legend
    (det_marks,) = det.collections  # TAR 1 is FNMR 0: off the axis
    np.testing.assert_allclose(det_marks.get_offsets(), [[0.125, 2 / 3], [0.2, 2 / 3], [0.25, 2 / 3],
                                                         [0.375, 1 / 3]], atol=1e-15)


def test_the_roc_and_det_lines_pass_through_the_exact_points_printed_beside_them(results):
    """A coarse histogram curve (points at FAR 0.01 and 0.5) and exact TARs between its points, off
    the straight segment joining them: each exact point is a point of the drawn line."""
    points = [(0.05, 5, 0.4, 0.3, 0.05), (0.1, 10, 0.45, 0.35, 0.1), (0.2, 20, 0.5, 0.8, 0.2)]
    section = verification_section(points)
    section["curves"] = {"bits": 16, "threshold": [0.3, 0.6, 1.0], "tar": [0.2, 0.9, 1.0], "far": [0.01, 0.5, 1.0]}
    fig = figure([curves(with_sections(results, "nogom", verification=section), "model")])
    (roc_line,), (det_line,) = axis(fig, "roc").get_lines(), axis(fig, "det").get_lines()
    roc_points = set(zip(roc_line.get_xdata(), roc_line.get_ydata()))
    det_points = set(zip(det_line.get_xdata(), det_line.get_ydata()))
    for far, _, _, tar, _ in points:
        assert (far, tar) in roc_points
        assert (far, 1 - tar) in det_points
    for line in (roc_line, det_line):
        assert (np.diff(line.get_xdata()) >= 0).all()  # drawn in FAR order


def test_overlay_of_open_set_and_verification_results_keeps_one_colour_per_result(results):
    other_points = [(x, k, t, a, f, {r: v / 2 for r, v in d.items()}) for x, k, t, a, f, d in V7_POINTS]
    runs = [curves(with_sections(results, "full", open_set_section(), verification_section()), "a"),
            curves(with_sections(results, "nogom"), "b"),  # neither section: a line on the CMC panel only
            curves(with_sections(results, "again", open_set_section(other_points),
                                 verification_section([V6_POINTS[i] for i in (0, 1, 4, 5)], auc=None)), "c")]
    fig = figure(runs)
    assert_panels(fig, "cmc", "dir", "roc", "det", "mReP", "mFR")
    assert len({round(ax.get_position().y0, 2) for ax in fig.axes}) == 2  # more than 4 panels: two rows of 3
    colour = {line.get_label(): line.get_color() for line in fig.axes[0].get_lines()}
    colour = {label.split(":")[0]: c for label, c in colour.items()}
    dir_ax, roc, det = axis(fig, "dir"), axis(fig, "roc"), axis(fig, "det")
    assert [line.get_label() for line in dir_ax.get_lines()] == ["a: rank 1", "a: rank 2", "c: rank 1", "c: rank 2"]
    assert [line.get_label() for line in roc.get_lines()] == ["a: AUC 0.6875", "c"]  # c: no --auc
    assert roc.collections[1].get_label() == "c: TAR@FAR 0.125: 0.3333, 0.375: 0.6667, 0.5: 1.0000"
    assert [line.get_label() for line in det.get_lines()] == ["a", "c"]
    for ax in (dir_ax, roc, det):
        assert all(line.get_color() == colour[line.get_label().split(":")[0]] for line in ax.get_lines())
        assert len(ax.collections) == 2  # one set of marks per result that has the section
    a_rank1, _, c_rank1, _ = dir_ax.get_lines()
    np.testing.assert_allclose(c_rank1.get_ydata(), np.asarray(a_rank1.get_ydata()) / 2, atol=1e-12)
    assert a_rank1.get_linestyle() == c_rank1.get_linestyle()  # a rank looks the same in every result


def test_without_non_mated_queries_or_pairs_the_panels_are_left_out(results):
    """No non-mated query: no DIR@FPIR, only the closed-set limit (the CMC panel shows it);
    no impostor pair: no curve and no TAR."""
    open_set = open_set_section(points=[], note="no non-mated query: DIR@FPIR undefined; closed-set limit only")
    verification = {**verification_section(points=[(1e-3, 0, None, None, 0.0)], auc=None), "n_neg": 0, "curves": None}
    fig = figure([curves(with_sections(results, "nogom", open_set, verification), "closed")])
    assert_panels(fig, "cmc")


def test_with_a_dir_panel_the_closed_set_limit_of_a_result_without_non_mated_queries_is_marked(results):
    note = "no non-mated query: DIR@FPIR undefined; closed-set limit only"
    runs = [curves(with_sections(results, "full", open_set_section()), "open"),
            curves(with_sections(results, "nogom", open_set_section(points=[], note=note)), "closed")]
    ax = axis(figure(runs), "dir")
    assert [line.get_label() for line in ax.get_lines()] == ["open: rank 1", "open: rank 2"]
    _, closed = ax.collections
    assert note in closed.get_label() and closed.get_label().startswith("closed: closed-set limit")
    np.testing.assert_allclose(closed.get_offsets(), [[1, 75], [1, 100]], atol=1e-12)


def test_a_real_open_set_and_verification_result_is_drawn_as_its_json_says(results, tmp_path):
    store, out, image = results["full"].parent / "s.zarr", tmp_path / "ov.json", tmp_path / "ov.png"
    cli("eval", store, "-q", "--no-gom", "--open-set", "--fpir", "0.1,0.5,1", "--dir-ranks", "1,5",
        "--verification", "--far", "1e-3,1e-2,0.1", "--auc", "--json", out)
    result = json.loads(out.read_text())
    open_set, verification = result["open_set"], result["verification"]
    assert open_set["n_non_mated"] > 0 and verification["n_neg"] > 0
    fig = figure([curves(result, "real")])
    assert_panels(fig, "cmc", "dir", "roc", "det")
    dir_ax, roc, det = fig.axes[1:]

    targets = [p["fpir"] for p in open_set["points"]]
    assert targets == [0.1, 0.5, 1.0]
    for line, rank in zip(dir_ax.get_lines(), ("1", "5"), strict=True):
        assert line.get_label() == f"real: rank {rank}"
        np.testing.assert_array_equal(line.get_xdata(), targets)
        np.testing.assert_allclose(line.get_ydata(), [100 * p["dir"][rank] for p in open_set["points"]], atol=1e-12)
    (limit,) = dir_ax.collections  # accepting everything: the CMC at those ranks, and the line's end at FPIR 1
    cmc_at = [100 * result["cmc"][0], 100 * result["cmc"][4]]
    np.testing.assert_allclose(limit.get_offsets(), [[1, cmc_at[0]], [1, cmc_at[1]]], atol=1e-12)
    np.testing.assert_allclose([line.get_ydata()[-1] for line in dir_ax.get_lines()], cmc_at, atol=1e-12)

    far, tar = (np.asarray(verification["curves"][name] + [p[name] for p in verification["points"]])
                for name in ("far", "tar"))
    order = np.lexsort((tar, far))  # the histogram curve's points and the exact ones, in FAR order
    far, tar = far[order], tar[order]
    assert (np.diff(tar) >= 0).all()  # the exact points sit on the curve: it still only rises
    (roc_line,) = roc.get_lines()
    assert roc_line.get_label() == f"real: AUC {verification['auc']:.4f}"
    np.testing.assert_array_equal(roc_line.get_xdata(), far[far > 0])
    np.testing.assert_array_equal(roc_line.get_ydata(), tar[far > 0])
    (roc_marks,) = roc.collections
    np.testing.assert_array_equal(roc_marks.get_offsets(), [[p["far"], p["tar"]] for p in verification["points"]])
    (det_line,) = det.get_lines()
    shown = (far > 0) & (tar < 1)
    np.testing.assert_array_equal(det_line.get_xdata(), far[shown])
    np.testing.assert_allclose(det_line.get_ydata(), 1 - tar[shown], atol=1e-15)

    cli("plot", out, image)
    assert image.read_bytes()[:8] == PNG_SIGNATURE


def test_a_malformed_open_set_or_verification_section_is_refused_naming_the_file(results, tmp_path):
    broken = open_set_section()
    del broken["points"][0]["dir"]["2"]  # a rank without its DIR
    short = verification_section()
    short["curves"]["tar"].pop()  # one TAR short of the FAR points
    for name, result in (("dir", with_sections(results, "full", broken)),
                         ("roc", with_sections(results, "full", verification=short))):
        bad = tmp_path / f"{name}.json"
        bad.write_text(json.dumps(result))
        line = one_error_line(cli("plot", bad, tmp_path / "x.png", code=3))
        assert f"'{bad}' is not a streameval result JSON" in line
    assert not (tmp_path / "x.png").exists()
