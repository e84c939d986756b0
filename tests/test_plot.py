"""``streameval plot`` (issue 12): one or more results overlaid, one line per result on each panel,
every axis labelled, the CMC axis starting where the data is, panels without data left out.

The figure is checked through the function that builds it (its axes, labels, lines and the values
they draw, against the result JSONs), and the command through the PNG it writes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from streameval.plot import curves, figure
from streameval.synth import synthesize

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


TITLES = {"cmc": "CMC", "mReP": "GOM, queries with positives", "mFR": "GOM, open-set queries", "trials": "Each trial"}


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
    assert highest < high <= max(highest + 0.1 * (highest - lowest), highest + 1)
    assert cmc_ax.get_xlim()[0] < 1 < cmc_ax.get_xlim()[0] + 2


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
