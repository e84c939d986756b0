"""Output people paste (issue 12): ``--ranks`` chooses the CMC points printed, ``--format
table|markdown|csv|latex`` the layout of the summary of eval, update and aggregate.

Every table is read back as its reader would (the csv module, Markdown rows, LaTeX structure) and
every number in it is checked against the result JSON the same command wrote: closed-set values in
percent with 2 decimals, GOM values with 4, a std beside its mean."""

from __future__ import annotations

import csv
import io
import json
import re

import numpy as np
import pytest

from streameval.present.report import latex_escape
from streameval.tools.synth import synthesize

from cli_checks import cli, one_error_line

SMALL = dict(n_query=40, n_gallery=400, dim=8, n_ids=10, n_cams=3, junk_frac=0.1, open_query_frac=0.2)
FAST = ("--gom-bins", "20")
GOM_COLUMNS = ("MREP", "mReP_max", "MFR")


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    paths = []
    for seed in (3, 4):
        path = folder / f"split_{seed}.zarr"
        synthesize(path, seed=seed, **SMALL)
        paths.append(str(path))
    return paths


@pytest.fixture()
def store(stores):
    return stores[0]


def evaluated(store, tmp_path, *args, command=("eval",)):
    """(what the command printed, the result JSON it wrote)."""
    out = tmp_path / "result.json"
    done = cli(*command, store, "--json", out, "--overwrite", *args)
    return done, json.loads(out.read_text())


def printed_table(done) -> list[str]:
    """The summary on stdout (progress lines go to stderr)."""
    return done.stdout.strip().splitlines()


# ---------------------------------------------------------------------------------- --ranks


def test_ranks_choose_the_printed_points_and_the_json_keeps_the_whole_curve(store, tmp_path):
    done, result = evaluated(store, tmp_path, "--no-gom", "--ranks", "10,1,5")
    header = next(line for line in printed_table(done) if line.strip().startswith("R1"))
    values = printed_table(done)[printed_table(done).index(header) + 1]
    assert header.split() == ["R1", "R5", "R10"]  # ascending, whatever the order given
    assert values.split() == [f"{100 * result['cmc'][k - 1]:.2f}%" for k in (1, 5, 10)]
    assert result["max_rank"] == 50 and len(result["cmc"]) == 50


def test_default_ranks_never_pass_max_rank(store, tmp_path):
    done, _ = evaluated(store, tmp_path, "--no-gom", "--max-rank", "7")
    header = next(line for line in printed_table(done) if line.strip().startswith("R1"))
    assert header.split() == ["R1", "R5", "R7"]
    _, csv_rows = csv_table(evaluated(store, tmp_path, "--no-gom", "--max-rank", "3", "--format", "csv")[0])
    assert [name for name in csv_rows[0] if name.startswith("Rank")] == ["Rank-1 (%)", "Rank-3 (%)"]


def test_ranks_past_the_default_max_rank_extend_the_curve(store, tmp_path):
    done, result = evaluated(store, tmp_path, "--no-gom", "--ranks", "1,60")
    assert result["max_rank"] == 60 and len(result["cmc"]) == 60
    header = next(line for line in printed_table(done) if line.strip().startswith("R1"))
    assert header.split() == ["R1", "R60"]


def test_ranks_past_an_explicit_max_rank_are_refused_before_any_work(store, tmp_path):
    out = tmp_path / "r.json"
    done = cli("eval", store, "--max-rank", "3", "--ranks", "1,5", "--json", out, code=2)
    line = one_error_line(done)
    assert "--ranks 5 is past --max-rank 3" in line and "raise --max-rank to 5" in line
    assert "%" not in done.stderr.replace(line, "")  # no progress: refused before the evaluation
    assert not out.exists()


@pytest.mark.parametrize("ranks", ["0", "1,-5", "a,b", ",", "100001"])
def test_bad_ranks_are_one_line_and_exit_2(store, ranks):
    line = one_error_line(cli("eval", store, "-q", "--ranks", ranks, code=2))
    assert "--ranks" in line


def test_trials_line_follows_the_ranks(store, tmp_path):
    done, result = evaluated(store, tmp_path, "--protocol", "vehicleid", "--no-gom", "--ranks", "1,3")
    line = next(line for line in printed_table(done) if "means over" in line)
    mean, std = result["trials"]["mean"], result["trials"]["std"]
    assert f"R1 {100 * mean['cmc'][0]:.2f}% +- {100 * std['cmc'][0]:.2f}" in line
    assert f"R3 {100 * mean['cmc'][2]:.2f}% +- {100 * std['cmc'][2]:.2f}" in line
    assert "R5" not in line and "rank5" not in line


def test_counts_of_trials_print_as_integers_and_their_std_is_zero(store, tmp_path):
    """vehicleid: every query of every trial has positives, so each trial counts 0 open-set queries:
    their mean is the integer 0, printed "0", not "0.0", and the std of identical values is exactly
    0; the queries (not in the trial's gallery) vary, so their mean has one decimal."""
    done, result = evaluated(store, tmp_path, "--protocol", "vehicleid", "--no-gom")
    per_trial = result["trials"]["per_trial"]
    assert {trial["n_open_queries"] for trial in per_trial} == {0}
    assert result["n_open_queries"] == 0 and isinstance(result["n_open_queries"], int)
    assert result["trials"]["std"]["n_open_queries"] == 0 and result["trials"]["sem"]["n_open_queries"] == 0
    mean = np.mean([trial["n_queries"] for trial in per_trial])
    assert not mean.is_integer() and result["n_queries"] == mean
    line = next(line for line in printed_table(done) if line.strip().startswith("queries"))
    assert line.split()[:6] == ["queries", f"{mean:.1f}", "(" + f"{mean:.1f}", "with", "positives,", "0"]


def test_a_mean_count_that_is_not_whole_has_one_decimal():
    from streameval.present.report import _count

    assert [_count(v) for v in (301, 301.0, 1234.0, 300.5, 1234.25)] == ["301", "301", "1,234", "300.5", "1,234.2"]


# ------------------------------------------------------------------------------------- CSV


def csv_table(done) -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(io.StringIO(done.stdout)))
    assert len({len(row) for row in rows}) == 1, rows  # rectangular
    return rows[0], rows


def assert_number(cell: str, value, percent: bool) -> None:
    """A cell holds ``value`` as the table promises: percent with 2 decimals, or 4 decimals (GOM)."""
    if value is None:
        assert cell == ""
        return
    shown = 100 * value if percent else value
    assert cell == f"{shown:.{2 if percent else 4}f}"
    assert abs(float(cell) - shown) <= (0.005 if percent else 0.00005) + 1e-12


def check_csv_row(header: list[str], row: list[str], values: dict, std: dict | None) -> None:
    """Every column of ``row`` against the JSON values (and their std, in the column after each)."""
    for name, cell in zip(header[1:], row[1:]):
        is_std = " std" in name
        base = name.split(" ")[0]
        source = std if is_std else values
        if source is None:  # a single evaluation has no spread: its std cells are empty
            value = None
        elif base.startswith("Rank-"):
            value = source["cmc"][int(base[len("Rank-"):]) - 1]
        elif base in GOM_COLUMNS:
            value = source["gom"][base]
        else:
            value = source[base]
        assert_number(cell, value, percent=name.endswith("(%)"))


def test_csv_holds_every_number_of_the_json(store, tmp_path):
    done, result = evaluated(store, tmp_path, "--format", "csv", "--ranks", "1,5,10", *FAST)
    header, rows = csv_table(done)
    assert header == ["Run", "Rank-1 (%)", "Rank-5 (%)", "Rank-10 (%)", "mAP (%)", "mINP (%)", "mAP_trapezoid (%)",
                      *GOM_COLUMNS]
    assert len(rows) == 2 and rows[1][0] == store
    assert result["gom"]["MFR"] is not None  # the store has open-set queries: every cell is a number
    check_csv_row(header, rows[1], result, None)
    assert all(cell for cell in rows[1])


def test_csv_of_trials_puts_each_std_beside_its_mean(store, tmp_path):
    done, result = evaluated(store, tmp_path, "--protocol", "vehicleid", "--format", "csv", "--ranks", "1,5", *FAST)
    header, rows = csv_table(done)
    assert header[1:5] == ["Rank-1 (%)", "Rank-1 std (%)", "Rank-5 (%)", "Rank-5 std (%)"]
    assert header[-2:] == ["MFR", "MFR std"]
    assert rows[1][0] == f"{store} (mean ± std, {result['trials']['T']} trials)"
    check_csv_row(header, rows[1], result, result["trials"]["std"])
    assert rows[1][header.index("MFR")] == ""  # vehicleid queries all have positives: MFR is null


def test_tar_and_dir_at_their_targets_are_columns_holding_the_json_values(store, tmp_path):
    """With verification and open-set, a column per FAR target (TAR) and per FPIR target (DIR at
    the first rank), each cell the JSON point of that target, in percent."""
    done, result = evaluated(store, tmp_path, "--open-set", "--verification", "--far", "0.001,0.01",
                             "--format", "csv", *FAST)
    header, rows = csv_table(done)
    extra = header[header.index("MFR") + 1:]
    assert extra == ["TAR@FAR=0.001 (%)", "TAR@FAR=0.01 (%)", "DIR-R1@FPIR=0.001 (%)", "DIR-R1@FPIR=0.01 (%)",
                     "DIR-R1@FPIR=0.1 (%)"]
    row = dict(zip(header, rows[1]))
    for point in result["verification"]["points"]:
        assert_number(row[f"TAR@FAR={point['far']:g} (%)"], point["tar"], percent=True)
    assert len(result["open_set"]["points"]) == 3 and result["open_set"]["n_non_mated"] > 0
    for point in result["open_set"]["points"]:
        assert_number(row[f"DIR-R1@FPIR={point['fpir']:g} (%)"], point["dir"]["1"], percent=True)


def test_no_gom_means_no_gom_columns(store, tmp_path):
    done, _ = evaluated(store, tmp_path, "--no-gom", "--format", "csv")
    header, _ = csv_table(done)
    assert not set(GOM_COLUMNS) & set(header)
    assert header[-3:] == ["mAP (%)", "mINP (%)", "mAP_trapezoid (%)"]


def test_update_prints_the_same_table_as_eval(stores, tmp_path):
    """update --format csv after an append equals eval of the grown store, number for number."""
    store = tmp_path / "grow.zarr"
    synthesize(store, seed=5, **SMALL)
    cli("eval", store, "-q", "--no-gom", "--state", tmp_path / "state")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "new.npz", gf=rng.standard_normal((30, 8)).astype(np.float32),
             g_pids=rng.integers(1, 11, 30), g_camids=rng.integers(0, 3, 30))
    cli("append", store, tmp_path / "new.npz")
    updated, result = evaluated(str(store), tmp_path, "--state", tmp_path / "state", "--format", "csv",
                                "--ranks", "1,5", command=("update",))
    header, rows = csv_table(updated)
    check_csv_row(header, rows[1], result, None)
    full = cli("eval", store, "-q", "--no-gom", "--format", "csv", "--ranks", "1,5")
    assert full.stdout == ""  # -q prints no table
    again, _ = evaluated(str(store), tmp_path, "--no-gom", "--format", "csv", "--ranks", "1,5")
    assert again.stdout == updated.stdout


def test_update_ranks_past_the_states_max_rank_are_refused_and_the_json_kept(tmp_path):
    store = tmp_path / "s.zarr"
    synthesize(store, seed=6, **SMALL)
    cli("eval", store, "-q", "--no-gom", "--max-rank", "5", "--state", tmp_path / "state")
    out = tmp_path / "u.json"
    done = cli("update", store, "--state", tmp_path / "state", "--ranks", "1,8", "--json", out, code=2)
    assert "--ranks 8 is past the CMC's last rank, 5" in one_error_line(done)
    assert len(json.loads(out.read_text())["cmc"]) == 5  # the result is written before the summary


# -------------------------------------------------------------------------------- Markdown


def markdown_rows(text: str) -> list[list[str]]:
    rows = []
    for line in text.strip().splitlines():
        assert line.startswith("| ") and line.endswith(" |"), line
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line[1:-1])])
    return rows


def test_markdown_rows_have_the_header_columns_and_the_json_numbers(store, tmp_path):
    done, result = evaluated(store, tmp_path, "--format", "markdown", "--ranks", "1,5", *FAST)
    header, rule, row = markdown_rows(done.stdout)
    assert header == ["Run", "Rank-1 (%)", "Rank-5 (%)", "mAP (%)", "mINP (%)", "mAP_trapezoid (%)", *GOM_COLUMNS]
    assert rule == [":--"] + ["--:"] * (len(header) - 1)  # numbers right-aligned
    assert len(row) == len(header)
    check_csv_row(header, row, result, None)


def test_markdown_of_trials_reads_mean_plus_minus_std(store, tmp_path):
    done, result = evaluated(store, tmp_path, "--protocol", "vehicleid", "--no-gom", "--format", "markdown",
                             "--ranks", "1")
    header, _, row = markdown_rows(done.stdout)
    assert len(row) == len(header) == 5
    mean, std = result["trials"]["mean"], result["trials"]["std"]
    assert row[1] == f"{100 * mean['cmc'][0]:.2f} ± {100 * std['cmc'][0]:.2f}"
    assert row[2] == f"{100 * mean['mAP']:.2f} ± {100 * std['mAP']:.2f}"


def test_a_result_of_both_directions_is_a_row_per_direction(store, tmp_path):
    done, result = evaluated(store, tmp_path, "--protocol", "regdb", "--no-gom", "--format", "markdown",
                             "--ranks", "1")
    header, _, *rows = markdown_rows(done.stdout)
    assert [row[0] for row in rows] == [f"{store} v2t", f"{store} t2v"]
    for row, name in zip(rows, ("v2t", "t2v")):
        check_csv_row(header, row, result["directions"][name], None)


def test_json_on_stdout_moves_the_pasted_table_to_stderr(store):
    done = cli("eval", store, "--no-gom", "--json", "-", "--format", "markdown")
    assert json.loads(done.stdout)["mAP"] is not None
    assert "| Run | Rank-1 (%)" in done.stderr


def test_clipping_warning_is_kept_with_a_pasted_table(store, tmp_path):
    done, result = evaluated(store, tmp_path, "--gom-norm", "fixed:0:1", "--format", "csv", *FAST)
    assert result["gom"]["clipped"]["above"] > 0
    assert "warning:" not in done.stdout  # the table stays pasteable
    assert any(line.startswith("warning:") and "clipped" in line for line in done.stderr.splitlines())


# ----------------------------------------------------------------------------------- LaTeX


def latex_cells(line: str) -> list[str]:
    assert line.endswith(r" \\"), line
    return [cell.strip() for cell in re.split(r"(?<!\\)&", line[:-3])]


def test_latex_is_a_tabular_with_one_cell_per_column(store, tmp_path):
    done, result = evaluated(store, tmp_path, "--format", "latex", "--ranks", "1,10", *FAST)
    lines = done.stdout.strip().splitlines()
    n_columns = 1 + 2 + 3 + len(GOM_COLUMNS)
    assert lines[0] == r"\begin{tabular}{l" + "r" * (n_columns - 1) + "}"
    assert lines[-1] == r"\end{tabular}" and lines[1] == lines[3] == lines[-2] == r"\hline"
    header, row = latex_cells(lines[2]), latex_cells(lines[4])
    assert header == ["Run", r"Rank-1 (\%)", r"Rank-10 (\%)", r"mAP (\%)", r"mINP (\%)", r"mAP\_trapezoid (\%)",
                      "MREP", r"mReP\_max", "MFR"]
    assert len(row) == n_columns and row[0] == store.replace("_", r"\_")
    plain = [name.replace("\\", "") for name in header]
    check_csv_row(plain, row, result, None)


def test_latex_escapes_what_tex_would_read_as_commands():
    assert latex_escape(r"a_b&c%d$e#f{g}h~i^j\k ±") == (
        r"a\_b\&c\%d\$e\#f\{g\}h\textasciitilde{}i\textasciicircum{}j\textbackslash{}k $\pm$")


# ------------------------------------------------------------------------------- aggregate


@pytest.fixture(scope="module")
def runs(stores, tmp_path_factory):
    folder = tmp_path_factory.mktemp("runs")
    files = []
    for i, store in enumerate(stores):
        files.append(folder / f"run{i}.json")
        cli("eval", store, "-q", "--json", files[-1], *FAST)
    return files


def test_aggregate_csv_has_every_run_and_the_mean(runs, tmp_path):
    out = tmp_path / "agg.json"
    done = cli("aggregate", *runs, "--label", "a_1", "--label", "b&2", "--json", out, "--format", "csv",
               "--ranks", "1,5")
    header, rows = csv_table(done)
    agg = json.loads(out.read_text())
    assert [row[0] for row in rows[1:]] == ["a_1", "b&2", "mean ± std (2 runs)"]
    assert header[1:3] == ["Rank-1 (%)", "Rank-1 std (%)"]
    for row, path in zip(rows[1:3], runs):
        check_csv_row(header, row, json.loads(path.read_text()), None)
        assert all(cell == "" for name, cell in zip(header, row) if " std" in name)  # one evaluation: no spread
    check_csv_row(header, rows[3], agg, agg["aggregate"]["std"])


def test_aggregate_latex_escapes_the_labels(runs, tmp_path):
    done = cli("aggregate", *runs, "--label", "a_1%", "--label", "b&2", "--json", tmp_path / "agg.json",
               "--format", "latex")
    lines = done.stdout.strip().splitlines()
    width = len(latex_cells(lines[2]))
    rows = [latex_cells(line) for line in lines[4:-2]]
    assert [row[0] for row in rows] == [r"a\_1\%", r"b\&2", r"mean $\pm$ std (2 runs)"]
    assert all(len(row) == width for row in rows)
    assert r" $\pm$ " in rows[2][1]


def test_aggregate_table_adds_the_chosen_ranks_and_refuses_ranks_past_the_runs(runs, tmp_path):
    out = tmp_path / "agg.json"
    done = cli("aggregate", *runs, "--json", out, "--ranks", "1,5")
    agg = json.loads(out.read_text())["aggregate"]
    line = done.stdout.strip().splitlines()[-1]
    assert line == (f"  CMC mean +- std: R1 {100 * agg['mean']['cmc'][0]:.2f}% +- {100 * agg['std']['cmc'][0]:.2f}%   "
                    f"R5 {100 * agg['mean']['cmc'][4]:.2f}% +- {100 * agg['std']['cmc'][4]:.2f}%")
    refused = cli("aggregate", *runs, "--json", tmp_path / "no.json", "--ranks", "1,51", code=2)
    assert "--ranks 51 is past the CMC's last rank, 50" in one_error_line(refused)
    assert not (tmp_path / "no.json").exists()  # refused before anything was written
