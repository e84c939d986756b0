"""``streameval aggregate``: split-level runs combined (docs/protocols.md#9-split-level-protocols-streameval-aggregate, #reporting-trials).

Runs are real evaluations of small synthetic stores written as result JSONs; where a vector needs
given values (V5) or a foreign file, a real result is edited."""

from __future__ import annotations

import csv
import io
import json
import math

import numpy as np
import pytest

import streameval
from streameval.present.aggregate import COUNTS, GOM_CURVES, GOM_SCALARS, SCALARS
from streameval.tools.synth import synthesize

from cli_checks import cli, one_error_line

SMALL = dict(n_query=20, n_gallery=160, dim=8, n_ids=8, n_cams=3, junk_frac=0.1)
FAST = dict(max_rank=10, gom_bins=20)
OPEN_FRACTIONS = (0.25, 0.25, 0.0)  # the third store has no open-set query: its MFR is null


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    folder = tmp_path_factory.mktemp("splits")
    paths = []
    for seed, open_fraction in enumerate(OPEN_FRACTIONS, start=1):
        path = folder / f"split{seed}.zarr"
        synthesize(path, seed=seed, open_query_frac=open_fraction, **SMALL)
        paths.append(str(path))
    return paths


@pytest.fixture(scope="module")
def results(stores):
    """The three splits' results as written by ``streameval eval --json``."""
    return [json.loads(json.dumps(streameval.evaluate(store, **FAST).to_dict())) for store in stores]


def write(folder, name, result) -> str:
    path = folder / f"{name}.json"
    path.write_text(json.dumps(result))
    return str(path)


def write_all(folder, results, names=("split1", "split2", "split3")) -> list[str]:
    return [write(folder, name, result) for name, result in zip(names, results)]


def aggregate(tmp_path, *files, code=0):
    out = tmp_path / "agg.json"
    result = cli("aggregate", *files, "--json", out, "--overwrite", code=code)
    return result, (json.loads(out.read_text()) if code == 0 else None)


# ------------------------------------------------------------------------------------------ values


def test_v5_three_runs_with_map_50_60_70(results, tmp_path):
    """docs/protocols.md#v5-trial-statistics: mAP 0.50, 0.60, 0.70 -> mean 0.60, std (ddof 1) 0.10, sem 0.0577."""
    edited = [dict(result, mAP=value) for result, value in zip(results, (0.50, 0.60, 0.70))]
    run, out = aggregate(tmp_path, *write_all(tmp_path, edited))
    agg = out["aggregate"]
    assert out["mAP"] == pytest.approx(0.60, abs=1e-15)
    assert agg["std"]["mAP"] == pytest.approx(0.10, abs=1e-15)
    assert agg["sem"]["mAP"] == pytest.approx(0.10 / math.sqrt(3), abs=1e-15) == pytest.approx(0.0577, abs=1e-4)
    assert (agg["min"]["mAP"], agg["max"]["mAP"], agg["count"]["mAP"]) == (0.50, 0.70, 3)
    assert (agg["n_runs"], agg["std_ddof"]) == (3, 1)
    assert [row["mAP"] for row in agg["per_run"]] == [0.50, 0.60, 0.70]
    assert "mAP 60.00% +- 10.00%" in run.stdout
    assert [line.split()[0] for line in run.stdout.splitlines()[2:5]] == ["split1", "split2", "split3"]


def test_one_run_has_no_std(results, tmp_path):
    """V5: one trial (here one run): std and sem are null."""
    _, out = aggregate(tmp_path, write(tmp_path, "only", dict(results[0], mAP=0.5)))
    agg = out["aggregate"]
    assert (out["mAP"], agg["count"]["mAP"], agg["std"]["mAP"], agg["sem"]["mAP"]) == (0.5, 1, None, None)


def values_of(results, path):
    values = []
    for result in results:
        for key in path:
            result = result[key]
        values.append(result)
    return [v for v in values if v is not None]


def pick(stats, path):
    for key in path:
        stats = stats[key]
    return stats


METRIC_PATHS = [(name,) for name in SCALARS + ("cmc",)] + [("gom", name) for name in GOM_CURVES + GOM_SCALARS]


def test_statistics_equal_numpy_over_the_runs(results, tmp_path):
    """Every scalar and curve point: numpy's mean, std (ddof 1), std / sqrt(count), min and max of
    the per-run values; each run counts once whatever its number of queries."""
    _, out = aggregate(tmp_path, *write_all(tmp_path, results))
    agg = out["aggregate"]
    for path in METRIC_PATHS:
        x = np.asarray(values_of(results, path), dtype=np.float64)
        count = x.shape[0]
        assert pick(agg["count"], path) == count, path
        std = x.std(axis=0, ddof=1)
        for stat, want in (("mean", x.mean(axis=0)), ("std", std), ("sem", std / np.sqrt(count)),
                           ("min", x.min(axis=0)), ("max", x.max(axis=0))):
            np.testing.assert_allclose(pick(agg[stat], path), want, rtol=1e-13, atol=1e-15, err_msg=f"{stat} {path}")
        headline = out[path[0]] if len(path) == 1 else out["gom"][path[1]]
        assert headline == pick(agg["mean"], path)
    assert isinstance(out["cmc"], list) and len(out["cmc"]) == FAST["max_rank"]
    assert out["rank1"] == out["cmc"][0]  # every run has queries with positives
    assert out["n_queries"] == SMALL["n_query"] and set(COUNTS) <= set(out)
    assert (out["metric"], out["protocol"]["name"], out["max_rank"], out["options"]) == (
        "euclidean", "market", FAST["max_rank"], results[0]["options"])
    assert (out["gom"]["bins"], out["gom"]["tau"], out["result_schema"]) == (20, results[0]["gom"]["tau"], 1)
    assert [(row["label"], row["store"], row["n_queries"], row["rank1"], row["mINP"]) for row in agg["per_run"]] == [
        (f"split{i}", f"split{i}.json", r["n_queries"], r["rank1"], r["mINP"]) for i, r in enumerate(results, 1)]


def test_nulls_are_left_out_and_counted(results, tmp_path):
    """The third split has no open-set query: its MFR, tau_nz and mFR are null and left out."""
    assert [r["n_open_queries"] > 0 for r in results] == [True, True, False]
    _, out = aggregate(tmp_path, *write_all(tmp_path, results))
    agg = out["aggregate"]
    for name in ("MFR", "tau_nz", "mFR"):
        assert agg["count"]["gom"][name] == 2
    two = [results[0]["gom"]["MFR"], results[1]["gom"]["MFR"]]
    assert out["gom"]["MFR"] == pytest.approx(np.mean(two), rel=1e-15)
    assert agg["std"]["gom"]["MFR"] == pytest.approx(np.std(two, ddof=1), rel=1e-13)
    assert agg["count"]["gom"]["MREP"] == 3


def test_a_metric_null_in_every_run_stays_null(results, tmp_path):
    without_open = [dict(r, gom=dict(r["gom"], MFR=None)) for r in results]
    _, out = aggregate(tmp_path, *write_all(tmp_path, without_open))
    agg = out["aggregate"]
    assert (out["gom"]["MFR"], agg["std"]["gom"]["MFR"], agg["count"]["gom"]["MFR"]) == (None, None, 0)


def test_labels_name_the_runs(results, tmp_path):
    files = write_all(tmp_path, results)
    run, out = aggregate(tmp_path, *files, "--label", "a", "--label", "b", "--label", "c")
    assert [row["label"] for row in out["aggregate"]["per_run"]] == ["a", "b", "c"]
    line = one_error_line(cli("aggregate", *files, "--label", "a", "--json", tmp_path / "x.json", code=2))
    assert "1 --label for 3 runs" in line and not (tmp_path / "x.json").exists()


# ---------------------------------------------------------------------------------- compatibility


def test_a_cosine_run_next_to_euclidean_runs_is_refused(stores, results, tmp_path):
    """docs/protocols.md#9-split-level-protocols-streameval-aggregate: the refusal names `metric` and the run."""
    cosine = json.loads(json.dumps(streameval.evaluate(stores[2], metric="cosine", **FAST).to_dict()))
    files = write_all(tmp_path, [results[0], results[1], cosine], names=("r1", "r2", "cos"))
    line = one_error_line(aggregate(tmp_path, *files, code=3)[0])
    assert "metric" in line and '"cosine" in cos' in line and '"euclidean" in r1, r2' in line
    assert not (tmp_path / "agg.json").exists()


@pytest.mark.parametrize("options, field", [
    (dict(junk_pids=(-1, 0)), "protocol.junk_pids"),
    (dict(trials=2), "protocol.trials"),
    (dict(gom_bins=10), "gom.bins"),
    (dict(no_gom=True), "gom"),
    (dict(precision="float64"), "precision"),
])
def test_a_run_with_other_numbers_deciding_options_is_refused(stores, results, tmp_path, options, field):
    other = json.loads(json.dumps(streameval.evaluate(stores[2], **{**FAST, **options}).to_dict()))
    files = write_all(tmp_path, [results[0], results[1], other])
    line = one_error_line(aggregate(tmp_path, *files, code=3)[0])
    assert f" {field} (" in line and "in split3" in line and "metric" not in line


def test_an_option_added_later_is_compared_without_a_change(results, tmp_path):
    """Every key of ``options`` takes part, including nested records (named by dotted path)."""
    later = [dict(r, options=dict(r["options"], protocol_record={"seed": seed})) for r, seed in zip(results, (0, 0, 1))]
    line = one_error_line(aggregate(tmp_path, *write_all(tmp_path, later), code=3)[0])
    assert "protocol_record.seed (0 in split1, split2; 1 in split3)" in line


def test_stores_sizes_and_execution_may_differ(results, tmp_path):
    assert len({r["n_valid_queries"] for r in results}) > 1 or len({r["n_open_queries"] for r in results}) > 1
    executed = [dict(r, run=dict(r["run"], workers=w, query_block=b)) for r, w, b in zip(results, (1, 2, 4), (5, 7, 20))]
    aggregate(tmp_path, *write_all(tmp_path, executed))


def test_other_streameval_versions_give_a_warning(results, tmp_path):
    older = [dict(results[0], streameval_version="0.0.9"), results[1], results[2]]
    run, out = aggregate(tmp_path, *write_all(tmp_path, older))
    warnings = [line for line in run.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "0.0.9" in warnings[0] and streameval.__version__ in warnings[0]
    assert out["streameval_version"] == streameval.__version__


def test_another_result_schema_is_refused(results, tmp_path):
    files = write_all(tmp_path, [results[0], results[1], dict(results[2], result_schema=2)])
    line = one_error_line(aggregate(tmp_path, *files, code=3)[0])
    assert "result_schema" in line and "2 in split3" in line


@pytest.mark.parametrize("text, says", [
    ("not json at all", "JSONDecodeError"),
    ("[1, 2]", "a JSON list"),
    ('{"mAP": 0.5}', "no metric"),
])
def test_a_file_that_is_not_a_result_is_refused(results, tmp_path, text, says):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    line = one_error_line(aggregate(tmp_path, write(tmp_path, "good", results[0]), bad, code=3)[0])
    assert "bad.json' is not a streameval result JSON" in line and says in line


def test_a_value_that_is_not_a_number_is_refused(results, tmp_path):
    files = write_all(tmp_path, [results[0], results[1], dict(results[2], mAP="high")])
    assert "mAP must be a finite number" in one_error_line(aggregate(tmp_path, *files, code=3)[0])


def tampered(result: dict, path: tuple, value) -> dict:
    """A deep copy of ``result`` with the value at ``path`` replaced."""
    copy = json.loads(json.dumps(result))
    inner = copy
    for key in path[:-1]:
        inner = inner[key]
    inner[path[-1]] = value
    return copy


@pytest.mark.parametrize("path, value, says", [
    (("mAP",), 7.5, "mAP must be a number from 0 to 1, got 7.5"),
    (("n_valid_queries",), -5, "n_valid_queries must be a finite number >= 0, got -5"),
    (("rank1",), -0.25, "rank1 must be a number from 0 to 1, got -0.25"),
    (("cmc", 3), 1.5, "cmc must be a number from 0 to 1, got 1.5"),
    (("gom", "MREP"), 2.0, "gom.MREP must be a number from 0 to 1, got 2.0"),
])
def test_a_value_outside_its_domain_is_refused_naming_file_and_field(results, tmp_path, path, value, says):
    """A tampered result is not averaged into an impossible mean: one line naming the file and field."""
    files = write_all(tmp_path, [results[0], results[1], tampered(results[2], path, value)])
    line = one_error_line(aggregate(tmp_path, *files, code=3)[0])
    assert line.startswith(f"error: '{files[2]}': ") and says in line, line
    assert not (tmp_path / "agg.json").exists()


# ------------------------------------------------------------------------------------------ outputs


def test_a_missing_output_folder_is_refused_before_reading(tmp_path):
    """Exit 2 for the output although the input is not a result (which would be exit 3)."""
    bad = tmp_path / "bad.json"
    bad.write_text("not a result")
    line = one_error_line(cli("aggregate", bad, "--json", tmp_path / "no" / "agg.json", code=2))
    assert "does not exist" in line and not (tmp_path / "no").exists()


def test_an_existing_output_is_kept_without_overwrite(results, tmp_path):
    out = tmp_path / "agg.json"
    out.write_text("mine")
    file = write(tmp_path, "r", results[0])
    assert "pass --overwrite" in one_error_line(cli("aggregate", file, "--json", out, code=2))
    assert out.read_text() == "mine"


def test_json_on_stdout_keeps_the_table_on_stderr(results, tmp_path):
    run = cli("aggregate", *write_all(tmp_path, results), "--json", "-")
    assert json.loads(run.stdout)["aggregate"]["n_runs"] == 3
    assert "mean +- std" in run.stderr


def test_without_json_the_table_alone_is_printed_and_nothing_written(results, tmp_path):
    files = write_all(tmp_path, results)
    before = sorted(tmp_path.iterdir())
    alone = cli("aggregate", *files)
    _, out = aggregate(tmp_path, *files)
    assert alone.stdout.splitlines()[2:5] == [
        f"  {label:<6}  {r['n_queries']:>9,}  {100 * r['rank1']:6.2f}%  {100 * r['mAP']:6.2f}%  {100 * r['mINP']:6.2f}%"
        for label, r in zip(("split1", "split2", "split3"), results)]
    assert f"mAP {100 * out['mAP']:.2f}% +- {100 * out['aggregate']['std']['mAP']:.2f}%" in alone.stdout
    assert sorted(tmp_path.iterdir()) == sorted(before + [tmp_path / "agg.json"])  # the --json run's file only
    pasted = cli("aggregate", *files, "--format", "markdown").stdout
    assert pasted.splitlines()[-1].startswith("| mean ± std (3 runs) | ")


# ---------------------------------------------------------------------- open-set and verification


def test_tar_and_dir_are_averaged_per_target_over_the_runs(stores, tmp_path):
    """With --open-set --verification every run has TAR at each FAR and DIR at each FPIR and rank:
    the aggregate's points are their means, its statistics (named as the pasted columns) their
    spread, the third split's null DIR (no open-set query) left out of the count; the pasted
    table's mean row shows both."""
    options = dict(FAST, open_set=True, verification=True, dir_ranks="1,5")
    runs = [json.loads(json.dumps(streameval.evaluate(store, **options).to_dict())) for store in stores[::-1]]
    files = write_all(tmp_path, runs)  # the first run has no open-set query, hence no DIR point
    run, out = aggregate(tmp_path, *files)
    agg = out["aggregate"]
    for i, point in enumerate(out["verification"]["points"]):
        tars = [r["verification"]["points"][i]["tar"] for r in runs]
        name = f"TAR@FAR={point['far']:g}"
        assert point["tar"] == pytest.approx(np.mean(tars), abs=1e-15) == agg["mean"]["verification"][name]
        assert agg["std"]["verification"][name] == pytest.approx(np.std(tars, ddof=1), abs=1e-15)
        assert name in run.stdout
    for i, point in enumerate(out["open_set"]["points"]):
        dirs = [r["open_set"]["points"][i]["dir"]["1"] if r["open_set"]["points"] else None for r in runs]
        found = [d for d in dirs if d is not None]
        name = f"DIR-R1@FPIR={point['fpir']:g}"
        assert point["dir"]["1"] == pytest.approx(np.mean(found), abs=1e-15)
        assert agg["count"]["open_set"][name] == len(found) == 2
    table = cli("aggregate", *files, "--json", tmp_path / "again.json", "--overwrite", "--format", "csv").stdout
    header, *rows = list(csv.reader(io.StringIO(table)))
    mean_row = dict(zip(header, rows[-1]))
    name = f"TAR@FAR={out['verification']['points'][-1]['far']:g}"
    assert mean_row[f"{name} (%)"] == f"{100 * agg['mean']['verification'][name]:.2f}"
    assert mean_row[f"{name} std (%)"] == f"{100 * agg['std']['verification'][name]:.2f}"


def test_a_run_missing_a_target_is_one_error_line(stores, tmp_path):
    options = dict(FAST, verification=True)
    runs = [json.loads(json.dumps(streameval.evaluate(store, **options).to_dict())) for store in stores[:2]]
    runs[1]["verification"]["points"] = runs[1]["verification"]["points"][:1]
    run, _ = aggregate(tmp_path, *write_all(tmp_path, runs, ("split1", "split2")), code=3)
    assert one_error_line(run).endswith("verification.points.1.tar is missing")
