"""Rendering a suite result (issue 14, docs/suites.md#the-result-json): the table shaped like the CIL-ReID
paper's (one row per setting in the order clean, query, gallery, both; mINP, mAP, R1, R5, R10 as
"mean (std)" x 100; clean once without std; the headline setting marked), every evaluation in
upstream's column order, the per-corruption breakdown (docs/suites.md#per-corruption-breakdown), the command's summary lines,
and the suite plot.

The suite results are written by hand in the schema the suite engine writes (COMMON section 3),
their summaries computed with numpy from per-trial values that hold V8: the three `both` trials'
mAP 0.30, 0.28, 0.26 have mean 0.28 and std (ddof 1) 0.02, printed "28.00 (2.00)"; the breakdown
is V8's (type 0: AP 0.5 and 0.7 -> 0.6, type 3: 0.2).  Every table is read back as its reader
would and every cell compared with the dict."""

from __future__ import annotations

import csv
import io
import json
import re

import numpy as np
import pytest

from streameval.core.errors import OptionError
from streameval.present.suite_report import breakdown_table, per_evaluation_table, suite_table, summary_lines, title
from streameval.tools.synth import synthesize

from cli_checks import cli, one_error_line

METRICS = ["mINP", "mAP", "mAP_trapezoid", "R1", "R5", "R10", "gom.MREP"]
UPSTREAM = ["mINP", "mAP", "R1", "R5", "R10"]
SETTINGS = ["clean", "query", "gallery", "both"]
V8_BOTH_MAP = [0.30, 0.28, 0.26]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def evaluation_values(setting: str, trial: int | None, scale: float = 1.0) -> dict:
    """Distinct values per (setting, trial, metric), in [0, 1]; the `both` mAPs are V8's."""
    base = {"clean": 0.62, "query": 0.41, "gallery": 0.47, "both": 0.33}[setting]
    t = 0 if trial is None else trial
    values = {m: scale * (base + 0.013 * j + 0.031 * t * (j % 3 - 1) + 0.007 * t) for j, m in enumerate(METRICS)}
    if setting == "both":
        values["mAP"] = scale * V8_BOTH_MAP[t]
    return values


def summaries(per_trial: dict, ddof: int) -> dict:
    n = len(next(iter(per_trial.values())))
    spread = n > 1
    return {"T": n, "per_trial": per_trial,
            "mean": {m: float(np.mean(v)) for m, v in per_trial.items()},
            "std": {m: float(np.std(v, ddof=ddof)) if spread else None for m, v in per_trial.items()},
            "sem": {m: float(np.std(v, ddof=ddof) / np.sqrt(n)) if spread else None for m, v in per_trial.items()},
            "min": {m: min(v) for m, v in per_trial.items()}, "max": {m: max(v) for m, v in per_trial.items()}}


def suite_result(trials: int = 3, scale: float = 1.0, ddof: int = 1, breakdown: bool = True,
                 variant: str = "corrupt") -> dict:
    """A complete cil-factorial suite result: clean once, query, gallery and both per trial."""
    evaluations = [{"name": "clean", "setting": "clean", "trial": None, "query_variant": "clean",
                    "gallery_variant": "clean", "values": evaluation_values("clean", None, scale), "result": {}}]
    for setting in SETTINGS[1:]:
        for t in range(trials):
            corrupt = f"{variant}-t{t}"
            evaluations.append({
                "name": f"{setting}-t{t}", "setting": setting, "trial": t,
                "query_variant": "clean" if setting == "gallery" else corrupt,
                "gallery_variant": "clean" if setting == "query" else corrupt,
                "values": evaluation_values(setting, t, scale), "result": {}})
    settings = {s: summaries({m: [e["values"][m] for e in evaluations if e["setting"] == s] for m in METRICS}, ddof)
                for s in SETTINGS}
    return {"suite": {
        "plan": "cil-factorial", "note": "factorial, not upstream-equivalent", "protocol": "market",
        "trials": trials, "std_ddof": ddof, "headline_setting": "both", "metrics": METRICS,
        "evaluations": evaluations, "settings": settings,
        "headline": {"setting": "both", "mean": settings["both"]["mean"], "std": settings["both"]["std"]},
        "breakdown": {"query": {"by_type": {"0": {"n": 2, "mINP": 0.45, "mAP": 0.6, "R1": 1.0},
                                            "3": {"n": 1, "mINP": 0.1, "mAP": 0.2, "R1": 0.0}}}} if breakdown else None,
        "execution": {"evaluations": 1 + 3 * trials, "gallery_variants": 1 + trials, "gallery_passes": 1 + trials,
                      "gemms": 1 + 3 * trials}},
        "run": {"seconds": 1.0}}


@pytest.fixture()
def suite():
    return suite_result()


def paper_cell(summary: dict, metric: str) -> str:
    """What the paper prints: "mean (std)" x 100, 2 decimals; no std, no brackets."""
    mean, std = summary["mean"][metric], summary["std"][metric]
    return f"{100 * mean:.2f}" + ("" if std is None else f" ({100 * std:.2f})")


def parsed_csv(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def number(cell: str):
    return None if cell == "" else float(cell)


def markdown_rows(text: str) -> list[list[str]]:
    lines = text.splitlines()
    assert all(line.startswith("| ") and line.endswith(" |") for line in lines)
    rows = [[cell.strip() for cell in line[2:-2].split(" | ")] for line in lines]
    assert len({len(row) for row in rows}) == 1  # every line has every column
    assert all(cell in (":--", "--:") for cell in rows[1])
    return [rows[0], *rows[2:]]


def latex_rows(text: str) -> list[list[str]]:
    lines = text.splitlines()
    spec = re.fullmatch(r"\\begin\{tabular\}\{(l r*)\}".replace(" ", ""), lines[0])
    assert spec and lines[1] == lines[3] == lines[-2] == r"\hline" and lines[-1] == r"\end{tabular}"
    body = [lines[2], *lines[4:-2]]
    assert all(line.endswith(r" \\") for line in body)
    rows = [line[:-3].split(" & ") for line in body]
    assert {len(row) for row in rows} == {len(spec.group(1))}  # one cell per declared column
    return rows


def terminal_rows(text: str) -> list[list[str]]:
    """The aligned table read back: columns are at least two spaces apart, cells have single spaces."""
    lines = text.splitlines()
    return [re.split(r"\s{2,}", line.strip()) for line in lines]


# --------------------------------------------------------------------------- the paper's table


def test_v8_both_prints_28_00_with_std_2_00_and_is_the_headline(suite):
    both = suite["suite"]["settings"]["both"]
    assert both["mean"]["mAP"] == pytest.approx(0.28) and both["std"]["mAP"] == pytest.approx(0.02)
    rows = terminal_rows(suite_table(suite))
    header, body = rows[1], rows[2:]
    assert rows[0] == ["mean (std over trials, ddof 1), x 100"]
    assert header == ["Setting", "T", "mINP (%)", "mAP (%)", "R1 (%)", "R5 (%)", "R10 (%)"]
    assert [row[0] for row in body] == ["clean", "query", "gallery", "both (headline)"]
    assert body[-1][header.index("mAP (%)")] == "28.00 (2.00)"


def test_the_terminal_table_holds_every_setting_once_clean_without_std(suite):
    settings = suite["suite"]["settings"]
    text = suite_table(suite)
    rows = terminal_rows(text)[2:]
    for row, name in zip(rows, SETTINGS):
        assert row[1] == str(settings[name]["T"])
        assert row[2:] == [paper_cell(settings[name], m) for m in UPSTREAM]
    assert "(" not in " ".join(rows[0][1:])  # clean: one evaluation, no std
    header, *lines = text.splitlines()[1:]
    for name in ("mINP (%)", "R1 (%)"):  # means right-aligned under their header, std after them
        column = header.index(name)
        ends = {column + re.match(r" *\d+\.\d\d", line[column:]).end() for line in lines}
        assert len(ends) == 1


def test_the_csv_is_every_mean_and_std_at_full_precision(suite):
    settings = suite["suite"]["settings"]
    rows = parsed_csv(suite_table(suite, "csv"))
    assert list(rows[0]) == ["setting", "headline", "T", *(f"{m}{part}" for m in UPSTREAM for part in ("", " std"))]
    assert [row["setting"] for row in rows] == SETTINGS
    for row in rows:
        summary = settings[row["setting"]]
        assert row["headline"] == ("1" if row["setting"] == "both" else "0")
        assert int(row["T"]) == summary["T"]
        for m in UPSTREAM:
            assert number(row[m]) == summary["mean"][m]  # exactly: the float round-trips
            assert number(row[f"{m} std"]) == summary["std"][m]
    assert rows[0]["mAP std"] == ""  # clean: null std is an empty cell


def test_markdown_is_well_formed_and_marks_the_headline(suite):
    settings = suite["suite"]["settings"]
    header, *body = markdown_rows(suite_table(suite, "markdown"))
    assert header == ["Setting", "T", "mINP (%)", "mAP (%)", "R1 (%)", "R5 (%)", "R10 (%)"]
    assert [row[0] for row in body] == ["clean", "query", "gallery", "both (headline)"]
    for row, name in zip(body, SETTINGS):
        assert row[1:] == [str(settings[name]["T"]), *(paper_cell(settings[name], m) for m in UPSTREAM)]
    assert body[-1][3] == "28.00 (2.00)"


def test_latex_is_a_bare_tabular_escaped_with_the_headline_marked(suite):
    settings = suite["suite"]["settings"]
    header, *body = latex_rows(suite_table(suite, "latex"))
    assert header == ["Setting", "T", r"mINP (\%)", r"mAP (\%)", r"R1 (\%)", r"R5 (\%)", r"R10 (\%)"]
    assert [row[0] for row in body] == ["clean", "query", "gallery", "both (headline)"]
    for row, name in zip(body, SETTINGS):
        assert row[2:] == [paper_cell(settings[name], m) for m in UPSTREAM]


def test_other_settings_follow_the_paper_order_and_the_headline_can_be_another(suite):
    inner = suite["suite"]
    inner["settings"] = {"mine": inner["settings"]["both"], **{s: inner["settings"][s] for s in reversed(SETTINGS)}}
    inner["headline_setting"] = "query"
    inner["headline"] = {"setting": "query", "mean": inner["settings"]["query"]["mean"],
                         "std": inner["settings"]["query"]["std"]}
    body = markdown_rows(suite_table(suite, "markdown"))[1:]
    assert [row[0] for row in body] == ["clean", "query (headline)", "gallery", "both", "mine"]
    assert [row["setting"] for row in parsed_csv(suite_table(inner, "csv"))] == ["clean", "query", "gallery", "both",
                                                                                  "mine"]  # the inner dict works too


def test_columns_choose_the_metrics_and_unknown_ones_or_formats_are_refused(suite):
    settings = suite["suite"]["settings"]
    header, *body = markdown_rows(suite_table(suite, "markdown", columns=["mAP_trapezoid", "R1"]))
    assert header == ["Setting", "T", "mAP_trapezoid (%)", "R1 (%)"]
    assert body[2][2] == paper_cell(settings["gallery"], "mAP_trapezoid")
    with pytest.raises(OptionError, match="no metric 'R50' in the suite result; it has mINP, mAP"):
        suite_table(suite, columns=["mAP", "R50"])
    with pytest.raises(OptionError, match="unknown table format 'html'"):
        suite_table(suite, "html")


def test_gom_values_print_as_fractions_with_4_decimals(suite):
    settings = suite["suite"]["settings"]
    header, *body = markdown_rows(suite_table(suite, "markdown", columns=["mAP", "gom.MREP"]))
    assert header == ["Setting", "T", "mAP (%)", "gom.MREP"]
    mean, std = settings["query"]["mean"]["gom.MREP"], settings["query"]["std"]["gom.MREP"]
    assert body[1][3] == f"{mean:.4f} ({std:.4f})"


def test_one_trial_prints_no_std_anywhere():
    one = suite_result(trials=1, breakdown=False)
    settings = one["suite"]["settings"]
    assert settings["both"]["std"]["mAP"] is None
    text = suite_table(one)
    assert "(" not in text.replace("(%)", "").replace("(headline)", "") and "std" not in text
    rows = terminal_rows(text)[2:]
    assert rows[-1][0] == "both (headline)" and rows[-1][3] == f"{100 * settings['both']['mean']['mAP']:.2f}"
    assert all(row["mAP std"] == "" for row in parsed_csv(suite_table(one, "csv")))
    body = markdown_rows(suite_table(one, "markdown"))[1:]
    assert body[-1][3] == "30.00"
    assert summary_lines(one)[-1].endswith("   (x 100)")


# --------------------------------------------------------------------------- every evaluation


def test_every_evaluation_in_upstream_column_order(suite):
    evaluations = suite["suite"]["evaluations"]
    header, *body = markdown_rows(per_evaluation_table(suite, "markdown"))
    assert header == ["Setting", "Trial", "Query variant", "Gallery variant",
                      "mINP (%)", "mAP (%)", "R1 (%)", "R5 (%)", "R10 (%)"]
    assert len(body) == 10
    for row, e in zip(body, evaluations):
        assert row[:4] == [e["setting"], "-" if e["trial"] is None else str(e["trial"]), e["query_variant"],
                           e["gallery_variant"]]
        assert row[4:] == [f"{100 * e['values'][m]:.2f}" for m in UPSTREAM]
    assert [row[5] for row in body if row[0] == "both"] == ["30.00", "28.00", "26.00"]
    assert terminal_rows(per_evaluation_table(suite))[1:] == body


def test_the_evaluations_csv_has_every_value_exactly(suite):
    evaluations = suite["suite"]["evaluations"]
    rows = parsed_csv(per_evaluation_table(suite, "csv"))
    assert list(rows[0]) == ["setting", "trial", "query_variant", "gallery_variant", "name", *UPSTREAM]
    assert len(rows) == len(evaluations)
    for row, e in zip(rows, evaluations):
        assert [row[k] for k in ("setting", "query_variant", "gallery_variant", "name")] == [
            e["setting"], e["query_variant"], e["gallery_variant"], e["name"]]
        assert row["trial"] == ("" if e["trial"] is None else str(e["trial"]))
        assert [number(row[m]) for m in UPSTREAM] == [e["values"][m] for m in UPSTREAM]


def test_latex_escapes_variant_names():
    suite = suite_result(variant="noise_sev")
    header, *body = latex_rows(per_evaluation_table(suite, "latex"))
    assert header[:4] == ["Setting", "Trial", "Query variant", "Gallery variant"]
    assert body[-1][:4] == ["both", "2", r"noise\_sev-t2", r"noise\_sev-t2"]
    assert body[1][3] == "clean"


# --------------------------------------------------------------------------- breakdown, summary


def test_the_query_side_breakdown_prints_v8_per_type(suite):
    rows = terminal_rows(breakdown_table(suite))
    assert rows[0] == ["Side", "By", "Corruption", "n", "mINP (%)", "mAP (%)", "R1 (%)"]
    assert rows[1:] == [["query", "type", "0", "2", "45.00", "60.00", "100.00"],
                        ["query", "type", "3", "1", "10.00", "20.00", "0.00"]]
    parsed = parsed_csv(breakdown_table(suite, "csv"))
    assert [(r["side"], r["by"], r["corruption"], int(r["n"]), float(r["mAP"])) for r in parsed] == [
        ("query", "type", "0", 2, 0.6), ("query", "type", "3", 1, 0.2)]
    assert markdown_rows(breakdown_table(suite, "markdown"))[1] == rows[1]
    assert latex_rows(breakdown_table(suite, "latex"))[2][5] == "20.00"


def test_the_breakdown_names_each_corruption_as_its_variants_do(suite):
    """Variants naming their types (attribute corruption_names) show the names, not the codes."""
    query = suite["suite"]["breakdown"]["query"]
    query["corruption_names"] = {"0": "gaussian_noise", "3": "shift"}
    query["by_type_severity"] = {"3/2": {"n": 1, "mINP": 0.1, "mAP": 0.2, "R1": 0.0}}
    rows = terminal_rows(breakdown_table(suite))
    assert [row[:4] for row in rows[1:]] == [["query", "type", "gaussian_noise", "2"], ["query", "type", "shift", "1"],
                                             ["query", "type, severity", "shift/2", "1"]]
    assert [r["corruption"] for r in parsed_csv(breakdown_table(suite, "csv"))] == ["gaussian_noise", "shift",
                                                                                    "shift/2"]
    assert [row[2] for row in markdown_rows(breakdown_table(suite, "markdown"))[1:]] == ["gaussian_noise", "shift",
                                                                                         "shift/2"]
    assert latex_rows(breakdown_table(suite, "latex"))[1][2] == r"gaussian\_noise"


def test_the_suite_command_names_the_corruptions_of_synthetic_variants(tmp_path):
    from streameval.tools.synth import CORRUPTIONS

    names = list(CORRUPTIONS)  # a type is its index
    store, out = tmp_path / "v.zarr", tmp_path / "suite.json"
    cli("synth", store, "--queries", "30", "--gallery", "100", "--dim", "8", "--ids", "8", "--cams", "3",
        "--variants", "cil-factorial", "--variant-trials", "1")
    done = cli("suite", store, "cil-factorial", "--trials", "1", "--json", out, "--format", "csv")
    query = json.loads(out.read_text())["suite"]["breakdown"]["query"]
    assert query["corruption_names"] == {code: names[int(code)] for code in query["by_type"]}
    printed = parsed_csv(done.stdout.split("\n\n")[-1])
    assert [row["corruption"] for row in printed] == [names[int(code)] for code in query["by_type"]]


def test_a_suite_without_breakdown_says_so():
    with pytest.raises(OptionError, match="no per-corruption breakdown"):
        breakdown_table(suite_result(breakdown=False))


def test_a_headline_setting_without_evaluations_is_said_not_printed(suite):
    suite["suite"].update(headline_setting="mine", headline=None)
    lines = summary_lines(suite)
    assert lines[-1] == "  the headline setting 'mine' has no evaluation in this suite"
    assert "(headline)" not in suite_table(suite)


def test_summary_lines_give_the_plan_its_note_the_passes_and_the_headline(suite):
    plan, passes, headline = summary_lines(suite)
    assert plan == ("suite cil-factorial (factorial, not upstream-equivalent): protocol market, 3 trials, "
                    "std ddof 1")
    assert title(suite) == plan
    assert passes == "  10 evaluations over 4 gallery variants: 4 gallery passes, 10 GEMMs"
    both = suite["suite"]["settings"]["both"]
    assert headline.startswith("  both (headline): mINP " + paper_cell(both, "mINP") + "   mAP 28.00 (2.00)   R1 ")
    assert headline.endswith("   (mean (std) over 3 trials, x 100)")


# --------------------------------------------------------------------------- the plot


def suite_files(tmp_path) -> tuple:
    a, b = tmp_path / "model_a.json", tmp_path / "model_b.json"
    a.write_text(json.dumps(suite_result()))
    b.write_text(json.dumps(suite_result(scale=0.8)))
    return a, b


def test_the_suite_figure_draws_mean_std_and_each_trial_per_setting(suite):
    pytest.importorskip("matplotlib")
    from streameval.present.plot import suite_bars, suite_figure

    fig = suite_figure([suite_bars(suite, "a")])
    settings = suite["suite"]["settings"]
    assert [ax.get_title().split(" ")[0] for ax in fig.axes] == ["mAP", "mINP", "R1"]
    assert fig.get_suptitle() == ("suite cil-factorial (factorial, not upstream-equivalent): protocol market, "
                                  "3 trials, std ddof 1")
    for ax, metric in zip(fig.axes, ["mAP", "mINP", "R1"]):
        assert ax.get_xlabel() == "setting" and ax.get_ylabel() == f"{metric} (%)"
        assert [t.get_text() for t in ax.get_xticklabels()] == ["clean", "query", "gallery", "both\n(headline)"]
        (bars,) = ax.containers
        marker, _, (vertical,) = bars.lines
        np.testing.assert_array_equal(marker.get_xdata(), [0, 1, 2, 3])
        np.testing.assert_allclose(marker.get_ydata(), [100 * settings[s]["mean"][metric] for s in SETTINGS],
                                   rtol=0, atol=1e-12)
        clean, *segments = vertical.get_segments()  # one per setting
        assert len(clean) == 0  # clean has no std: no bar
        for segment, name in zip(segments, SETTINGS[1:], strict=True):
            mean, std = 100 * settings[name]["mean"][metric], 100 * settings[name]["std"][metric]
            np.testing.assert_allclose(sorted(segment[:, 1]), [mean - std, mean + std], rtol=0, atol=1e-9)
        (dots,) = ax.collections[1:]  # the error bar's own collection first, then the trials
        points = dots.get_offsets()
        shift = points[0, 0]  # just right of the bar, not on it
        assert 0 < shift < 0.2
        np.testing.assert_allclose(points[:, 0], np.array([0] + [1] * 3 + [2] * 3 + [3] * 3) + shift,
                                   rtol=0, atol=1e-12)
        np.testing.assert_allclose(points[:, 1], [100 * v for s in SETTINGS for v in settings[s]["per_trial"][metric]],
                                   rtol=0, atol=1e-12)
        assert ax.get_legend() is not None
    assert fig.axes[0].containers[0].lines[0].get_ydata()[3] == pytest.approx(28.0)


def test_two_suites_stand_side_by_side_in_their_own_colours(tmp_path):
    pytest.importorskip("matplotlib")
    from streameval.present.plot import load, suite_figure

    a, b = suite_files(tmp_path)
    fig = suite_figure([load(str(a), "a"), load(str(b), "b")])
    for ax in fig.axes:
        first, second = (bars.lines[0] for bars in ax.containers)
        assert (first.get_xdata() < second.get_xdata()).all()
        assert (second.get_xdata() - first.get_xdata() < 0.5).all()  # within the setting's place
        assert first.get_color() != second.get_color()
        np.testing.assert_allclose(second.get_ydata(), 0.8 * np.asarray(first.get_ydata()), rtol=1e-12)
        labels = [text.get_text() for text in ax.get_legend().get_texts()]
        assert {label.split(":")[0] for label in labels} == {"a", "b"}


def test_plot_writes_a_png_of_one_figure_for_a_suite_and_an_overlay(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    import matplotlib.image  # noqa: F401

    a, b = suite_files(tmp_path)
    out, both = tmp_path / "suite.png", tmp_path / "models.png"
    assert cli("plot", a, "--out", out).stdout.strip() == f"wrote {out}"
    cli("plot", a, b, "--labels", "resnet,vit", "--out", both)
    for image in (out, both):
        assert image.read_bytes()[:8] == PNG_SIGNATURE
        pixels = matplotlib.image.imread(image)
        assert pixels.shape[:2] == (round(4.6 * 110), round(3 * 5.4 * 110))  # three panels side by side
        drawn = (pixels[..., :3] < 0.9).any(axis=-1).mean()
        assert 0.01 < drawn < 0.5  # neither blank nor a filled block
        assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 50
    assert not np.array_equal(matplotlib.image.imread(out), matplotlib.image.imread(both))


def test_a_suite_and_an_eval_result_are_not_drawn_together(tmp_path):
    pytest.importorskip("matplotlib")
    a, _ = suite_files(tmp_path)
    store, result = tmp_path / "s.zarr", tmp_path / "eval.json"
    synthesize(store, seed=3, n_query=20, n_gallery=100, dim=4, n_ids=5, n_cams=2)
    cli("eval", store, "-q", "--no-gom", "--json", result)
    line = one_error_line(cli("plot", a, result, "--out", tmp_path / "x.png", code=2))
    assert f"'{a}' is a suite result and '{result}' is not" in line
    assert not (tmp_path / "x.png").exists()


def test_a_malformed_suite_result_is_refused_naming_it(tmp_path):
    pytest.importorskip("matplotlib")
    edited = suite_result()
    edited["suite"]["settings"]["both"]["per_trial"]["mAP"] = [0.3, 0.28]  # one trial short of T
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(edited))
    line = one_error_line(cli("plot", bad, "--out", tmp_path / "x.png", code=3))
    assert f"'{bad}' is not a streameval result JSON" in line
    assert not (tmp_path / "x.png").exists()


def test_one_trial_draws_no_error_bars(tmp_path):
    pytest.importorskip("matplotlib")
    from streameval.present.plot import suite_bars, suite_figure

    fig = suite_figure([suite_bars(suite_result(trials=1, breakdown=False), "one")])
    for ax in fig.axes:
        (bars,) = ax.containers
        assert all(len(segment) == 0 for segment in bars.lines[2][0].get_segments())
        assert len(ax.collections[-1].get_offsets()) == 4  # one dot per setting


# --------------------------------------------------------------------------- the command


def test_the_suite_command_prints_the_tables_its_json_holds_and_plots_it(tmp_path):
    """A real suite on a synthetic store with cil-factorial variants: the CSV printed is the JSON's
    settings, the --plot image and 'streameval plot' of the JSON are the suite figure."""
    pytest.importorskip("matplotlib")
    import matplotlib.image

    store, out, image, again = tmp_path / "v.zarr", tmp_path / "suite.json", tmp_path / "s.png", tmp_path / "p.png"
    cli("synth", store, "--queries", "30", "--gallery", "200", "--dim", "8", "--ids", "8", "--cams", "3",
        "--variants", "cil-factorial", "--variant-trials", "2")
    done = cli("suite", store, "cil-factorial", "--trials", "2", "--json", out, "--plot", image, "--format", "csv",
               "-q")
    suite = json.loads(out.read_text())
    assert done.stdout == ""  # --quiet: nothing printed
    done = cli("suite", store, "cil-factorial", "--trials", "2", "--format", "csv")
    rows = parsed_csv("\n".join(done.stdout.splitlines()[:1 + len(SETTINGS)]))  # the breakdown's CSV follows
    settings = suite["suite"]["settings"]
    assert [row["setting"] for row in rows] == SETTINGS
    for row in rows:
        for m in UPSTREAM:
            assert number(row[m]) == settings[row["setting"]]["mean"][m]
            assert number(row[f"{m} std"]) == settings[row["setting"]]["std"][m]
    assert "factorial, not upstream-equivalent" in done.stderr
    cli("plot", out, "--out", again)
    for png in (image, again):
        assert matplotlib.image.imread(png).shape[:2] == (round(4.6 * 110), round(3 * 5.4 * 110))
