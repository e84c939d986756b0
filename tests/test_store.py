"""The feature store: round trips, appends, overwrite refusal, and every validation error.

Each malformed store is built by writing a valid one and then breaking it with zarr directly (or on
disk).  Every problem must surface as a StoreError naming it, from the API; and from the CLI
(``validate`` and ``eval``) as exit code 3 with one ``error: ...`` line on stderr and no traceback.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

import streameval
from streameval import OptionError, StoreError, append_gallery, evaluate, open_store, validate_values, write_store
from streameval.cli import main
from streameval.store import open_group

from signal_checks import ctrl_c_at_pause, paused_script

DIM = 8


# --------------------------------------------------------------------------------------------- helpers


def make_data(n_query=12, n_gallery=80, dim=DIM, n_ids=5, n_cams=3, seed=0) -> dict:
    """A small clustered problem: every query has positives in other cameras (with high probability)."""
    rng = np.random.default_rng(seed)
    centres = 3 * rng.standard_normal((n_ids + 1, dim))
    qp = rng.integers(1, n_ids + 1, n_query)
    gp = rng.integers(1, n_ids + 1, n_gallery)
    return {
        "query_features": (centres[qp] + rng.standard_normal((n_query, dim))).astype(np.float32),
        "query_pids": qp,
        "query_camids": rng.integers(0, n_cams, n_query),
        "gallery_features": (centres[gp] + rng.standard_normal((n_gallery, dim))).astype(np.float32),
        "gallery_pids": gp,
        "gallery_camids": rng.integers(0, n_cams, n_gallery),
    }


def write(path, data=None, **kwargs):
    data = make_data() if data is None else data
    return write_store(
        path, data["query_features"], data["query_pids"], data["query_camids"],
        data["gallery_features"], data["gallery_pids"], data["gallery_camids"], **kwargs,
    )


def replace_array(path, key: str, data: np.ndarray, chunks=None) -> None:
    """Swap one array of a store for another (any dtype, shape or chunking)."""
    group = zarr.open_group(str(path), mode="r+")
    del group[key]
    if chunks is None:
        chunks = (max(1, data.shape[0]),) + data.shape[1:]
    group.create_array(key, shape=data.shape, dtype=data.dtype, chunks=chunks)
    if data.size:
        group[key][...] = data


def corrupt_value(path, key: str, row: int, value: float) -> None:
    open_group(path, mode="r+")[key][row, 1] = value  # behind the writers' checks, through the store's chunk identity


# -------------------------------------------------------------------- the catalogue of broken stores
# each builder makes a broken store under tmp_path and returns its path; BROKEN maps a case name to
# (builder, regex the message must match)


def _missing(tmp):
    return tmp / "nowhere.zarr"


def _plain_dir(tmp):
    (tmp / "empty.zarr").mkdir()
    return tmp / "empty.zarr"


def _plain_file(tmp):
    (tmp / "file.zarr").write_text("not a store\n")
    return tmp / "file.zarr"


def _foreign_group(tmp):
    zarr.open_group(str(tmp / "foreign.zarr"), mode="w").create_array("x", shape=(3,), dtype="f4")
    return tmp / "foreign.zarr"


def _wrong_schema(tmp):
    path = tmp / "s.zarr"
    write(path)
    zarr.open_group(str(path), mode="r+").attrs["streameval_schema"] = 99
    return path


def _missing_array(key):
    def build(tmp):
        path = tmp / "s.zarr"
        write(path)
        shutil.rmtree(path / key)
        return path
    return build


def _replaced(key, make):
    """Replace ``key`` with ``make(data)`` where data are the arrays the store was written from."""
    def build(tmp):
        path = tmp / "s.zarr"
        data = make_data()
        write(path, data)
        replace_array(path, key, make(data))
        return path
    return build


def _dim_mismatch(tmp):
    path = tmp / "s.zarr"
    data = make_data()
    write(path, data)
    replace_array(path, "gallery/features", data["gallery_features"][:, : DIM - 2])
    return path


def _empty_gallery(tmp):
    path = tmp / "s.zarr"
    write(path)
    replace_array(path, "gallery/features", np.zeros((0, DIM), np.float32), chunks=(1, DIM))
    replace_array(path, "gallery/pids", np.zeros(0, np.int64), chunks=(1,))
    replace_array(path, "gallery/camids", np.zeros(0, np.int64), chunks=(1,))
    zarr.open_group(path, mode="r+").attrs["committed_gallery_rows"] = 0
    return path


def _committed_beyond_data(tmp):
    path = tmp / "s.zarr"
    write(path)
    zarr.open_group(path, mode="r+").attrs["committed_gallery_rows"] = 10**6
    return path


def _split_feature_axis(tmp):
    path = tmp / "s.zarr"
    data = make_data()
    write(path, data)
    replace_array(path, "gallery/features", data["gallery_features"], chunks=(16, DIM // 2))
    return path


def _bad_default_metric(tmp):
    path = tmp / "s.zarr"
    write(path)
    zarr.open_group(str(path), mode="r+").attrs["default_metric"] = "hamming"
    return path


BROKEN = {
    "missing path": (_missing, r"no feature store at"),
    "empty directory": (_plain_dir, r"is not a zarr v3 group"),
    "regular file": (_plain_file, r"is not a zarr v3 group"),
    "zarr group of another tool": (_foreign_group, r"is not a streameval store"),
    "wrong schema version": (_wrong_schema, r"is not a streameval store of schema 2"),
    **{
        f"missing {key}": (_missing_array(key), rf"has no '{key}' array")
        for key in ("query/features", "query/pids", "query/camids",
                    "gallery/features", "gallery/pids", "gallery/camids")
    },
    "gallery pids too short": (
        _replaced("gallery/pids", lambda d: d["gallery_pids"][:-1]), r"gallery: pids has shape .*one entry per image"),
    "query camids too long": (
        _replaced("query/camids", lambda d: np.concatenate([d["query_camids"], [0, 1]])), r"query: camids has shape"),
    "query vs gallery dimension": (_dim_mismatch, r"query features have dimension 8 but gallery features have 6"),
    "integer features": (
        _replaced("gallery/features", lambda d: d["gallery_features"].astype(np.int32)),
        r"dtype int32; expected float16, float32 or float64"),
    "1-D features": (_replaced("query/features", lambda d: d["query_features"][:, 0]), r"must be 2-D"),
    "int32 pids": (_replaced("gallery/pids", lambda d: d["gallery_pids"].astype(np.int32)), r"pids has dtype int32; expected int64"),
    "float camids": (
        _replaced("query/camids", lambda d: d["query_camids"].astype(np.float32)), r"camids has dtype float32; expected int64"),
    "empty gallery": (_empty_gallery, r"gallery set is empty"),
    "more rows committed than written": (_committed_beyond_data, r"1000000 rows are committed but features hold only"),
    "feature axis split across chunks": (_split_feature_axis, r"splitting the feature axis"),
    "unknown default metric": (_bad_default_metric, r"default_metric 'hamming' is not one of"),
}


def _nan_in_gallery(tmp):
    path = tmp / "s.zarr"
    write(path, chunk_rows=16)
    corrupt_value(path, "gallery/features", 37, np.nan)
    return path


def _inf_in_query(tmp):
    path = tmp / "s.zarr"
    write(path, dtype="float16")
    corrupt_value(path, "query/features", 5, np.inf)
    return path


# structurally valid, values corrupted after writing: only a value scan (validate, eval) sees them
CORRUPTED = {
    "NaN written into gallery features": (_nan_in_gallery, r"gallery features hold non-finite values .* first at row 37"),
    "inf written into float16 query features": (_inf_in_query, r"query features hold non-finite values .* first at row 5"),
}


# ------------------------------------------------------------------------------------------ API errors


@pytest.mark.parametrize("case", list(BROKEN))
def test_open_store_names_the_problem(tmp_path, case):
    build, message = BROKEN[case]
    path = build(tmp_path)
    with pytest.raises(StoreError, match=message):
        open_store(path)
    with pytest.raises(StoreError, match=message):
        evaluate(path)


@pytest.mark.parametrize("case", list(CORRUPTED))
def test_values_corrupted_after_writing_are_caught(tmp_path, case):
    build, message = CORRUPTED[case]
    store = open_store(build(tmp_path))  # the structure is fine
    with pytest.raises(StoreError, match=message):
        validate_values(store)
    with pytest.raises(StoreError, match=message):
        evaluate(store)


def _with(key, value):
    data = make_data()
    data[key] = value(data[key]) if callable(value) else value
    return data


def _nan_at(row):
    def put(x):
        x = x.copy()
        x[row, 2] = np.nan
        return x
    return put


WRITE_ERRORS = {
    "NaN in gallery": (_with("gallery_features", _nan_at(7)), {}, r"gallery features hold non-finite values .* row 7"),
    "inf in query": (_with("query_features", lambda x: np.where(np.arange(len(x))[:, None] == 3, np.inf, x)), {},
                     r"query features hold non-finite values .* row 3"),
    "float16 overflow": (_with("gallery_features", lambda x: x * 1e5), {"dtype": "float16"}, r"too large for float16"),
    "integer features": (_with("query_features", lambda x: x.astype(np.int64)), {}, r"expected floating point"),
    "float pids": (_with("gallery_pids", lambda x: x.astype(np.float64)), {}, r"gallery pids have dtype float64; expected integers"),
    "float camids": (_with("query_camids", lambda x: x.astype(np.float32)), {}, r"query camids have dtype float32"),
    "pids length": (_with("gallery_pids", lambda x: x[:-3]), {}, r"gallery pids has shape \(77,\) but features have 80 rows"),
    "camids length": (_with("query_camids", lambda x: x[1:]), {}, r"query camids has shape"),
    "dimension mismatch": (_with("gallery_features", lambda x: x[:, :5]), {}, r"dimension 8 but gallery features have 5"),
    "empty query set": (
        {**make_data(), "query_features": np.zeros((0, DIM), np.float32), "query_pids": np.zeros(0, np.int64),
         "query_camids": np.zeros(0, np.int64)}, {}, r"query set is empty"),
    "1-D features": (_with("gallery_features", lambda x: x[:, 0]), {}, r"must be 2-D"),
}


@pytest.mark.parametrize("case", list(WRITE_ERRORS))
def test_write_store_refuses_bad_input_without_touching_disk(tmp_path, case):
    data, kwargs, message = WRITE_ERRORS[case]
    with pytest.raises(StoreError, match=message):
        write(tmp_path / "s.zarr", data, **kwargs)
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize("kwargs, message", [({"dtype": "float64"}, r"dtype must be float16 or float32"),
                                             ({"default_metric": "hamming"}, r"default metric must be one of")])
def test_write_store_refuses_bad_options_without_touching_disk(tmp_path, kwargs, message):
    """An unsupported dtype or metric is an option error (exit 2), as in synth and convert."""
    with pytest.raises(OptionError, match=message):
        write(tmp_path / "s.zarr", make_data(), **kwargs)
    assert not (tmp_path / "s.zarr").exists()


def test_evaluate_on_in_memory_arrays_reports_bad_values():
    data = _with("gallery_features", _nan_at(11))
    with pytest.raises(StoreError, match="non-finite"):
        evaluate(data)


# ----------------------------------------------------------------------------- round trip and append


@pytest.mark.parametrize("chunk_rows", [16, 1000])
def test_round_trip(tmp_path, chunk_rows):
    data = make_data(seed=3)
    write(tmp_path / "s.zarr", data, chunk_rows=chunk_rows, default_metric="cosine")
    store = open_store(tmp_path / "s.zarr")
    assert store.default_metric == "cosine"
    assert store.dim == DIM
    assert (len(store.query), len(store.gallery)) == (12, 80)
    assert store.gallery.chunk_rows == min(chunk_rows, 80)
    assert store.gallery.features.chunks == (min(chunk_rows, 80), DIM)
    for name in ("query", "gallery"):
        fs = getattr(store, name)
        assert fs.features.dtype == np.float32
        np.testing.assert_array_equal(fs.features[:], data[f"{name}_features"])
        assert fs.pids.dtype == np.int64
        np.testing.assert_array_equal(fs.pids[:], data[f"{name}_pids"])
        np.testing.assert_array_equal(fs.camids[:], data[f"{name}_camids"])
    validate_values(store)


def test_round_trip_float16_and_float64_input(tmp_path):
    data = make_data(seed=4)
    data64 = {k: (v.astype(np.float64) if v.dtype.kind == "f" else v.astype(np.int32)) for k, v in data.items()}
    s32 = write(tmp_path / "a.zarr", data64)  # float64 input is stored as float32 by default
    assert s32.gallery.features.dtype == np.float32
    np.testing.assert_array_equal(s32.gallery.features[:], data["gallery_features"])
    assert s32.gallery.pids.dtype == np.int64
    s16 = write(tmp_path / "b.zarr", data, dtype="float16")
    assert s16.query.features.dtype == np.float16
    np.testing.assert_array_equal(s16.query.features[:], data["query_features"].astype(np.float16))
    half = {k: (v.astype(np.float16) if v.dtype.kind == "f" else v) for k, v in data.items()}
    assert write(tmp_path / "c.zarr", half).gallery.features.dtype == np.float16  # float16 input stays


def test_write_store_into_a_zarr_store_object():
    store = write(zarr.storage.MemoryStore())
    assert len(store.gallery) == 80
    assert evaluate(store).n_queries == 12


def test_append_gallery_rows_are_seen_by_evaluation(tmp_path):
    data = make_data(seed=5, n_gallery=60)
    # query 0 gets an identity of its own: open-set until its positive is appended
    data["query_pids"][0] = 99
    path = tmp_path / "s.zarr"
    write(path, data, chunk_rows=16)
    before = evaluate(path)
    assert before.per_query["n_positives"][0] == 0
    q_cam = data["query_camids"][0]
    extra_features = np.stack([data["query_features"][0] + 0.01, data["gallery_features"][0]])
    extra_pids = np.array([99, data["gallery_pids"][0]])
    extra_camids = np.array([(q_cam + 1) % 3, 2])
    store = append_gallery(path, extra_features, extra_pids, extra_camids)
    assert len(store.gallery) == 62
    np.testing.assert_array_equal(store.gallery.features[60:], extra_features.astype(np.float32))
    np.testing.assert_array_equal(store.gallery.pids[60:], extra_pids)
    np.testing.assert_array_equal(store.gallery.camids[60:], extra_camids)
    np.testing.assert_array_equal(store.gallery.features[:60], data["gallery_features"])  # untouched
    after = evaluate(path)
    assert after.n_gallery == 62
    assert after.n_valid_queries == before.n_valid_queries + 1
    assert after.per_query["n_positives"][0] == 1
    assert after.per_query["first_hit_rank"][0] == 1  # its near-duplicate is nearest
    validate_values(open_store(path))


def test_append_gallery_validates_rows(tmp_path):
    path = tmp_path / "s.zarr"
    write(path)
    with pytest.raises(StoreError, match="dimension 5, expected 8"):
        append_gallery(path, np.zeros((2, 5), np.float32), [1, 2], [0, 0])
    with pytest.raises(StoreError, match="non-finite"):
        append_gallery(path, np.full((2, DIM), np.nan, np.float32), [1, 2], [0, 0])
    with pytest.raises(StoreError, match="pids have dtype float64"):
        append_gallery(path, np.zeros((2, DIM), np.float32), [1.0, 2.0], [0, 0])
    with pytest.raises(StoreError, match="no feature store"):
        append_gallery(tmp_path / "nowhere.zarr", np.zeros((2, DIM), np.float32), [1, 2], [0, 0])
    assert len(open_store(path).gallery) == 80  # nothing appended by the failed calls


def test_refuses_to_overwrite_an_existing_path(tmp_path):
    path = tmp_path / "s.zarr"
    write(path, make_data(seed=1))
    with pytest.raises(StoreError, match="already exists; pass --overwrite"):
        write(path, make_data(seed=2, n_gallery=30))
    assert len(open_store(path).gallery) == 80
    other = tmp_path / "notes.txt"
    other.write_text("keep me\n")
    with pytest.raises(StoreError, match="already exists"):
        write(other)
    assert other.read_text() == "keep me\n"
    store = write(path, make_data(seed=2, n_gallery=30), overwrite=True)
    assert len(store.gallery) == 30
    assert len(open_store(path).gallery) == 30


# ---------------------------------------------------------------------------------------- CLI errors


def _assert_clean_error(result, message):
    assert result.exit_code == 3, (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit), result.exception
    progress = re.compile(r"streameval: \d+% ")  # eval's progress lines come before the error
    lines = [line for line in result.stderr.strip().splitlines() if not progress.match(line)]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert re.search(message, lines[0]), lines[0]
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", ["validate", "eval"])
@pytest.mark.parametrize("case", list(BROKEN) + list(CORRUPTED))
def test_cli_reports_store_errors_in_one_line(tmp_path, case, command):
    build, message = {**BROKEN, **CORRUPTED}[case]
    result = CliRunner().invoke(main, [command, str(build(tmp_path))])
    _assert_clean_error(result, message)
    assert result.stdout == ""


def test_cli_validate_accepts_a_good_store(tmp_path):
    write(tmp_path / "s.zarr")
    result = CliRunner().invoke(main, ["validate", str(tmp_path / "s.zarr")])
    assert result.exit_code == 0, result.output
    assert "ok: structure and values are valid" in result.stdout


def _console_script() -> list[str]:
    script = Path(sys.executable).with_name("streameval")
    return [str(script)] if script.exists() else [sys.executable, "-m", "streameval.cli"]


@pytest.mark.parametrize("argv", [
    pytest.param(["validate"], id="streameval-validate"),
    pytest.param(["eval", "--workers", "1", "--quiet"], id="python-m-eval"),
])
def test_real_process_exits_3_with_one_line(tmp_path, argv):
    path = _nan_in_gallery(tmp_path)
    prefix = _console_script() if argv[0] == "validate" else [sys.executable, "-m", "streameval.cli"]
    proc = subprocess.run(
        prefix + [argv[0], str(path)] + argv[1:], capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith("error: gallery features hold non-finite values"), proc.stderr
    assert "Traceback" not in proc.stderr


def test_package_exports():
    for name in ("open_store", "write_store", "append_gallery", "validate_values", "create_store", "StoreError"):
        assert hasattr(streameval, name)


def test_interrupted_append_leaves_the_store_as_it_was(tmp_path):
    """Data first, committed count last: a Ctrl-C (a real SIGINT) before the commit never lengthens
    the store."""
    path = tmp_path / "s.zarr"
    write(path)
    before = evaluate(path, no_gom=True).to_dict(per_query=True)
    n = len(open_store(path).gallery)
    rng = np.random.default_rng(5)
    extra = rng.standard_normal((7, DIM)).astype(np.float32)
    np.save(tmp_path / "extra.npy", extra)
    append = "streameval.append_gallery(sys.argv[1], np.load(sys.argv[2]), np.full(7, 999), np.zeros(7, np.int64))"
    ctrl_c_at_pause(paused_script("streameval.store.writing", "commit_gallery", append), path, tmp_path / "extra.npy")
    store = open_store(path)
    assert len(store.gallery) == n and store.gallery.features.shape[0] == n + 7  # uncommitted tail
    after = evaluate(path, no_gom=True).to_dict(per_query=True)
    before.pop("run"), after.pop("run")
    assert after == before
    # the next append replaces the uncommitted tail
    store = append_gallery(path, extra[:3], np.full(3, 5), np.zeros(3, np.int64))
    assert len(store.gallery) == n + 3 and store.gallery.features.shape[0] == n + 3
    np.testing.assert_array_equal(store.gallery.pids[n:n + 3], [5, 5, 5])


@pytest.mark.parametrize("row_length", [1, 7, 256])
@pytest.mark.parametrize("widened", [True, False])
def test_float16_features_upcast_to_the_float32_numpy_gives(row_length, widened, monkeypatch):
    """Every finite float16 value and both infinities (subnormals, -0.0 and the largest included), in
    rows of several lengths whose count crosses the conversion's row slices: bit for bit numpy's own
    float16 -> float32 conversion, by the CPU's (``halfs``, where it has F16C) and through float64
    (numpy's faster loop, where it has not); float64 as asked."""
    from streameval.store import halfs
    from streameval.store.reading import upcast

    if widened and not halfs.AVAILABLE:
        pytest.skip("this CPU has no float16 conversion instruction (F16C)")
    monkeypatch.setattr(halfs, "AVAILABLE", widened)

    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    values = every[~np.isnan(every)]
    values = values[:values.size - values.size % row_length].reshape(-1, row_length)
    converted = upcast(values, np.float32)
    assert converted.dtype == np.float32 and converted.flags.c_contiguous
    np.testing.assert_array_equal(converted.view(np.uint32), values.astype(np.float32).view(np.uint32))
    np.testing.assert_array_equal(upcast(values, np.float64), values.astype(np.float64))


UPCAST_ON_A_TARGET = """
import numpy as np
from streameval.store import halfs
from streameval.store.reading import upcast
every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
values = every[~np.isnan(every)][:63488].reshape(-1, 16)
same = np.array_equal(upcast(values, np.float32).view(np.uint32), values.astype(np.float32).view(np.uint32))
print(halfs.AVAILABLE, same)
"""


@pytest.mark.parametrize("target, widened", [({"NUMBA_CPU_NAME": "generic"}, "False"),
                                             ({"NUMBA_CPU_NAME": "generic", "NUMBA_CPU_FEATURES": "+f16c"}, "True")])
def test_float16_upcast_follows_the_cpu_numba_compiles_for(target, widened, tmp_path):
    """numba compiling for a named CPU (NUMBA_CPU_NAME=generic, as for a cache shared between
    machines) targets only the features NUMBA_CPU_FEATURES lists: without F16C the widening kernel
    would call a helper numba does not link (the process crashed), so numpy's path converts; with
    it listed, the kernel does.  Bit for bit numpy's conversion either way, in a fresh process and
    numba cache."""
    env = {**os.environ, **target, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    done = subprocess.run([sys.executable, "-c", UPCAST_ON_A_TARGET], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [widened, "True"]
