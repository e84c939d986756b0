"""The per-query table (docs/options.md#per-query-table): ``--per-query-out FILE.csv|FILE.parquet``
and ``Result.to_pandas()`` hold, row for row, the result's per-query arrays and the store's ids (and
image paths); trials and regdb's directions add a column; the output is checked before any work."""

from __future__ import annotations

import csv
import os
import sys

import numpy as np
import pytest

import streameval
from streameval.store import open_store, read_ids
from streameval.store.paths import write_paths

from cli_checks import cli, one_error_line

VALUES = ("ap", "ap_trapezoid", "inp", "first_hit_rank", "n_positives")
FLOATS = ("ap", "ap_trapezoid", "inp")


def make_store(path, n_query=7, n_gallery=12, seed=0, paths=True):
    rng = np.random.default_rng(seed)
    streameval.write_store(path, rng.standard_normal((n_query, 4), dtype=np.float32), rng.integers(1, 4, n_query),
                           rng.integers(0, 2, n_query), rng.standard_normal((n_gallery, 4), dtype=np.float32),
                           rng.integers(1, 4, n_gallery), rng.integers(0, 2, n_gallery), chunk_rows=4)
    if paths:
        write_paths(path, "query", [f"q/img {i}.png" for i in range(n_query)])
        write_paths(path, "gallery", [f"g/img {i}.png" for i in range(n_gallery)])
    return path


def read_csv(path) -> tuple[list, dict]:
    """(the header, {column: list of cells as str}) of a CSV file, read without pandas."""
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    return rows[0], {name: [row[i] for row in rows[1:]] for i, name in enumerate(rows[0])}


def as_numbers(cells: list, name: str) -> np.ndarray:
    """A CSV column as numbers: empty cells (AP of a query without positives) are NaN."""
    if name in FLOATS:
        assert not {c.lower() for c in cells} & {"nan", "inf", "-inf"}  # a missing value is an empty cell
        return np.array([float(c) if c else np.nan for c in cells])
    return np.array([int(c) for c in cells], dtype=np.int64)


def assert_same(cells: list, expected: np.ndarray, name: str) -> None:
    got = as_numbers(cells, name)
    assert got.dtype == (np.float64 if name in FLOATS else np.int64)
    np.testing.assert_array_equal(got, expected)  # exact; NaN where NaN


def test_csv_rows_are_the_results_per_query_arrays_and_the_stores_ids_and_paths(tmp_path):
    store = make_store(tmp_path / "s.zarr")
    cli("eval", store, "--no-gom", "-q", "--per-query-out", tmp_path / "q.csv")
    header, table = read_csv(tmp_path / "q.csv")
    assert header == ["query", "pid", "camid", "path", *VALUES]
    result = streameval.evaluate(str(store), no_gom=True)
    pids, camids = read_ids(open_store(store).query)
    assert table["query"] == [str(i) for i in range(7)]
    assert_same(table["pid"], pids, "pid")
    assert_same(table["camid"], camids, "camid")
    assert table["path"] == [f"q/img {i}.png" for i in range(7)]
    for name in VALUES:
        assert_same(table[name], result.per_query[name], name)
    assert np.isnan(result.per_query["ap"]).any()  # the fixture has queries without positives: empty cells


def test_a_store_without_paths_has_no_path_column(tmp_path):
    store = make_store(tmp_path / "s.zarr", paths=False)
    cli("eval", store, "--no-gom", "-q", "--per-query-out", tmp_path / "q.csv")
    assert read_csv(tmp_path / "q.csv")[0] == ["query", "pid", "camid", *VALUES]


def test_with_trials_one_row_per_trial_and_query_with_its_membership(tmp_path):
    """vehicleid: each trial draws one image per vehicle as gallery, the other images are its queries."""
    store = make_store(tmp_path / "s.zarr", n_query=12, n_gallery=5)
    cli("eval", store, "--no-gom", "-q", "--protocol", "vehicleid", "--trials", 3, "--per-query-out", tmp_path / "q.csv")
    header, table = read_csv(tmp_path / "q.csv")
    assert header == ["trial", "query", "pid", "camid", "path", "in_trial", *VALUES]
    result = streameval.evaluate(str(store), protocol="vehicleid", trials=3, no_gom=True)
    assert table["trial"] == [str(t) for t in range(3) for _ in range(12)]
    assert table["query"] == [str(q) for _ in range(3) for q in range(12)]
    assert_same(table["pid"], np.tile(read_ids(open_store(store).query)[0], 3), "pid")
    for name in VALUES:
        assert_same(table[name], result.per_query[name].reshape(-1), name)
    assert set(table["in_trial"]) == {"true", "false"}
    members = np.array([cell == "true" for cell in table["in_trial"]]).reshape(3, 12)
    assert [int(row.sum()) for row in members] == [trial["n_queries"] for trial in result.trials["per_trial"]]
    assert (result.per_query["n_positives"][members] == 1).all()  # a trial's query: its vehicle's one drawn image
    assert len({row.tobytes() for row in members}) > 1  # the draws differ


def test_regdb_gives_each_directions_rows_with_its_queries_ids_and_paths(tmp_path):
    store = make_store(tmp_path / "s.zarr")
    cli("eval", store, "--no-gom", "-q", "--protocol", "regdb", "--per-query-out", tmp_path / "q.csv")
    header, table = read_csv(tmp_path / "q.csv")
    assert header == ["direction", "query", "pid", "camid", "path", *VALUES]
    assert table["direction"] == ["v2t"] * 7 + ["t2v"] * 12
    opened = open_store(store)
    # t2v: the stored gallery queries the stored queries
    for direction, rows, fs, prefix in (("v2t", slice(0, 7), opened.query, "q"), ("t2v", slice(7, 19), opened.gallery, "g")):
        alone = streameval.evaluate(str(store), protocol="regdb", direction=direction, no_gom=True)
        pids, camids = read_ids(fs)
        assert_same(table["pid"][rows], pids, "pid")
        assert_same(table["camid"][rows], camids, "camid")
        assert table["path"][rows] == [f"{prefix}/img {i}.png" for i in range(len(fs))]
        for name in VALUES:
            assert_same(table[name][rows], alone.per_query[name], name)


def test_update_writes_the_table_of_the_updated_result(tmp_path):
    store = make_store(tmp_path / "s.zarr", paths=False)
    cli("eval", store, "--no-gom", "-q", "--state", tmp_path / "state")
    rng = np.random.default_rng(3)
    streameval.append_gallery(store, rng.standard_normal((5, 4), dtype=np.float32), rng.integers(1, 4, 5),
                              rng.integers(0, 2, 5))
    cli("update", store, "--state", tmp_path / "state", "-q", "--per-query-out", tmp_path / "q.csv")
    table = read_csv(tmp_path / "q.csv")[1]
    full = streameval.evaluate(str(store), no_gom=True)
    for name in VALUES:
        assert_same(table[name], full.per_query[name], name)


def test_an_existing_file_is_refused_without_overwrite_before_any_work(tmp_path):
    store = make_store(tmp_path / "s.zarr")
    (tmp_path / "q.csv").write_text("mine\n")
    refused = cli("eval", store, "--no-gom", "--per-query-out", tmp_path / "q.csv", code=2)
    assert "exists; pass --overwrite" in one_error_line(refused)
    assert refused.stderr.splitlines() == [one_error_line(refused)]  # no progress line: nothing was evaluated
    assert (tmp_path / "q.csv").read_text() == "mine\n"
    cli("eval", store, "--no-gom", "-q", "--per-query-out", tmp_path / "q.csv", "--overwrite")
    assert read_csv(tmp_path / "q.csv")[0][0] == "query"


@pytest.mark.parametrize("name, message", [
    ("missing/q.csv", "does not exist"),
    ("q.txt", "a local .csv or .parquet file"),
])
def test_a_missing_folder_or_another_format_is_refused_before_any_work(tmp_path, name, message):
    store = make_store(tmp_path / "s.zarr", paths=False)
    refused = cli("eval", store, "--no-gom", "--per-query-out", tmp_path / name, code=2)
    assert message in one_error_line(refused)
    assert refused.stderr.splitlines() == [one_error_line(refused)]
    assert not os.path.exists(tmp_path / name)


def test_parquet_and_to_pandas_hold_the_same_table_as_the_csv(tmp_path):
    pandas = pytest.importorskip("pandas", reason="the 'pandas' extra is not installed")
    pytest.importorskip("pyarrow", reason="Parquet needs pyarrow (the 'pandas' extra)")
    store = make_store(tmp_path / "s.zarr", n_query=9, n_gallery=20)
    for suffix in ("csv", "parquet"):
        cli("eval", store, "--no-gom", "-q", "--trials", 2, "--per-query-out", tmp_path / f"q.{suffix}")
    frame = streameval.evaluate(str(store), no_gom=True, trials=2).to_pandas()
    assert list(frame.columns) == ["trial", "query", "pid", "camid", "path", "in_trial", *VALUES]
    pandas.testing.assert_frame_equal(pandas.read_parquet(tmp_path / "q.parquet"), frame)
    pandas.testing.assert_frame_equal(pandas.read_csv(tmp_path / "q.csv"), frame)


def hint(purpose: str, package: str) -> str:
    return (f"{purpose} needs {package}, which is not installed: pip install {package} (the 'pandas' extra; "
            "in the streameval clone: .venv/bin/pip install -e '.[pandas]')")


def hide(monkeypatch, *modules) -> None:
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)  # import fails, as where it is not installed


def test_parquet_without_pyarrow_is_refused_before_any_work(tmp_path, monkeypatch):
    store = make_store(tmp_path / "s.zarr", paths=False)
    hide(monkeypatch, "pyarrow", "fastparquet")
    refused = cli("eval", store, "--no-gom", "--per-query-out", tmp_path / "q.parquet", code=2)
    assert refused.stderr.splitlines() == ["error: " + hint("--per-query-out FILE.parquet", "pyarrow")]
    hide(monkeypatch, "pandas")
    refused = cli("eval", store, "--no-gom", "--per-query-out", tmp_path / "q.parquet", code=2)
    assert refused.stderr.splitlines() == ["error: " + hint("--per-query-out FILE.parquet", "pandas")]
    assert not (tmp_path / "q.parquet").exists()


def test_without_pandas_the_csv_is_written_and_to_pandas_says_what_to_install(tmp_path, monkeypatch):
    store = make_store(tmp_path / "s.zarr", paths=False)
    hide(monkeypatch, "pandas", "pyarrow")
    cli("eval", store, "-q", "--no-gom", "--per-query-out", tmp_path / "q.csv")
    assert read_csv(tmp_path / "q.csv")[0] == ["query", "pid", "camid", *VALUES]
    result = streameval.evaluate(str(store), no_gom=True)
    with pytest.raises(streameval.StreamevalError) as refused:
        result.to_pandas()
    assert str(refused.value) == hint("Result.to_pandas()", "pandas")
