"""Sharp edges of the command line and the API (issue 10): outputs checked before any work, results
never lost, option values that used to crash or run forever, Result.rank and repr, start-up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import streameval
from streameval.synth import synthesize

from cli_checks import cli, one_error_line
from signal_checks import assert_stopped_in_one_line, stopped_run

SMALL = dict(n_query=30, n_gallery=300, dim=8, n_ids=10, n_cams=3, junk_frac=0.1, open_query_frac=0.1, seed=3)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("edges") / "s.zarr"
    synthesize(path, **SMALL)
    return str(path)


# ------------------------------------------------------------------------------ outputs checked first


@pytest.mark.parametrize("command", [
    ["eval", "{store}", "--json", "{missing}/r.json"],
    ["eval", "{store}", "--state", "{missing}/state"],
    ["synth", "{missing}/new.zarr", "--queries", "5", "--gallery", "20", "--dim", "4"],
    ["plot", "{result}", "{missing}/curves.png"],
])
def test_a_missing_output_folder_is_refused_before_any_work(store, tmp_path, command):
    result_json = tmp_path / "given.json"
    result_json.write_text("{}")
    missing = tmp_path / "no" / "such"
    args = [a.format(store=store, missing=missing, result=result_json) for a in command]
    started = time.perf_counter()
    result = cli(*args, code=2)
    line = one_error_line(result)
    assert "does not exist" in line and "create it first" in line
    assert "%" not in result.stderr  # refused before any progress was drawn
    assert not (tmp_path / "no").exists()  # nothing created on the way
    assert time.perf_counter() - started < 5


def test_convert_into_a_missing_folder_is_refused(tmp_path):
    np.savez(tmp_path / "f.npz", qf=np.ones((2, 3), np.float32), q_pids=[1, 2], q_camids=[0, 1],
             gf=np.ones((4, 3), np.float32), g_pids=[1, 2, 1, 2], g_camids=[1, 0, 0, 1])
    line = one_error_line(cli("convert", tmp_path / "f.npz", tmp_path / "x" / "out.zarr", code=2))
    assert "does not exist" in line and not (tmp_path / "x").exists()


def test_json_onto_a_directory_is_refused_even_with_overwrite(store, tmp_path):
    (tmp_path / "d").mkdir()
    line = one_error_line(cli("eval", store, "--json", tmp_path / "d", "--overwrite", code=2))
    assert "is a directory" in line


def test_an_existing_json_is_kept_without_overwrite(store, tmp_path):
    out = tmp_path / "r.json"
    out.write_text("mine")
    assert "exists; pass --overwrite" in one_error_line(cli("eval", store, "--json", out, code=2))
    assert out.read_text() == "mine"


def test_a_json_that_cannot_be_written_goes_to_a_named_fallback(store, tmp_path):
    """/dev/full answers every write with ENOSPC: the evaluation is not lost."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    result = cli("eval", store, "--json", "/dev/full", "--overwrite", code=3)
    line = one_error_line(result)
    assert "No space left on device" in line
    fallback = line.split("saved to '")[1].split("'")[0]
    try:
        saved = json.loads(open(fallback).read())
    finally:
        os.unlink(fallback)
    assert saved["mAP"] == streameval.evaluate(store).mAP
    assert "mAP" in result.stdout  # the summary is still printed


def test_a_failed_json_write_leaves_the_previous_file_whole(store, tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    out.write_text('{"previous": true}')
    real_fsync = os.fsync

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    result = cli("eval", store, "--no-gom", "-q", "--json", out, "--overwrite", code=3)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert json.loads(out.read_text()) == {"previous": True}
    fallback = one_error_line(result).split("saved to '")[1].split("'")[0]
    assert json.loads(open(fallback).read())["n_queries"] == SMALL["n_query"]
    os.unlink(fallback)
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".streameval-")]  # no temporary left


# ------------------------------------------------------------------------------------ option values


@pytest.mark.parametrize("args, says", [
    (["--gom-bins", "10000000"], "gom_bins must be between 1 and"),
    (["--max-rank", "1000000000"], "max_rank must be between 1 and"),
    (["--gom-b", str(2**64)], "gom_b must be between 1 and"),
    (["--junk-pids", str(2**64)], "junk_pids must be at most"),
    (["--junk-pids", str(-2**63)], "is reserved"),
    (["--gom-norm", "fixed:-1e308:1e308"], "finite span"),
    (["--gom-norm", "fixed:0:inf"], "finite LO < HI"),
    (["--memory-budget", "10"], "too small to plan"),
    (["--n-workers", "2"], "use with --cluster local"),
    (["--threads-per-worker", "2", "--memory-limit", "1GiB"], "use with --cluster local"),
])
def test_bad_option_values_are_refused_at_once(store, args, says):
    started = time.perf_counter()
    line = one_error_line(cli("eval", store, "-q", *args, code=2))
    assert says in line, line
    assert time.perf_counter() - started < 10


def test_the_memory_budget_error_names_a_minimum_that_works(store):
    line = one_error_line(cli("eval", store, "-q", "--no-gom", "--memory-budget", "10", code=2))
    minimum = line.split("at least ")[1].split(" (")[0]
    value, unit = minimum.split()
    budget = f"{int(float(value) * {'KiB': 1 << 10, 'MiB': 1 << 20, 'GiB': 1 << 30}[unit]) + 1024}"
    cli("eval", store, "-q", "--no-gom", "--memory-budget", budget)


def test_gom_state_larger_than_the_budget_is_refused_with_the_bins_that_fit(store):
    line = one_error_line(cli("eval", store, "-q", "--gom-bins", "50000", "--memory-budget", "20MiB", code=2))
    assert "use at most" in line and "--gom-bins 50000" in line


# ---------------------------------------------------------------------------------------- API edges


@pytest.fixture(scope="module")
def result(store):
    return streameval.evaluate(store, max_rank=20)


def test_rank_takes_integers_from_1_to_max_rank(result):
    assert result.rank(1) == float(result.cmc[0]) and result.rank(20) == float(result.cmc[19])
    assert result.rank(np.int64(5)) == float(result.cmc[4])
    for bad in (0, -1, 21, 2.5, "1", True, None):
        with pytest.raises(ValueError, match="integer k from 1 to max_rank=20"):
            result.rank(bad)


def test_repr_is_one_short_line(result):
    text = repr(result)
    assert "\n" not in text and len(text) < 250
    assert text.startswith("Result(30 queries x 300 gallery, euclidean, market: rank-1 ")
    assert f"mAP {100 * result.mAP:.2f}%" in text


def test_json_rank_keys_past_max_rank_are_null(store):
    got = json.loads(cli("eval", store, "-q", "--max-rank", "3", "--json", "-").stdout)
    assert got["rank1"] is not None and got["rank5"] is None and got["rank10"] is None and len(got["cmc"]) == 3


def test_summary_prints_only_ranks_that_exist(store):
    out = cli("eval", store, "--no-gom", "--max-rank", "3").stdout
    header = next(line for line in out.splitlines() if line.strip().startswith("R1"))
    assert header.split() == ["R1", "R3"]


# -------------------------------------------------------------------------------- start-up, Ctrl-C


def test_importing_streameval_loads_no_heavy_library():
    code = ("import sys, streameval, streameval.cli; "
            "print(sorted(m for m in ('numba', 'zarr', 'dask', 'matplotlib', 'distributed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_public_names_load_on_first_use_and_stay_functions():
    code = ("import streameval, streameval.incremental, streameval.evaluate; "
            "assert callable(streameval.evaluate) and callable(streameval.update); "
            "from streameval import evaluate, Result, write_store; print(evaluate.__module__, Result.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["streameval.evaluate", "Result"]


@pytest.fixture(scope="module")
def long_store(tmp_path_factory):
    """A store whose passes last long enough (about a second here) to be stopped while they run."""
    path = tmp_path_factory.mktemp("long") / "s.zarr"
    synthesize(path, n_query=1000, n_gallery=10000, dim=32, n_ids=200, n_cams=4, seed=3)
    return str(path)


@pytest.mark.parametrize("moment", [0.15, 0.4, "% positives"])
def test_ctrl_c_at_any_moment_stops_the_run_in_one_line(long_store, moment):
    """SIGINT while the command line loads, while the engine imports and while it evaluates (the
    first progress line of the passes seen): the run stops there, it did not finish first.  (Earlier,
    while the interpreter itself starts, Python answers before any of streameval's code runs.)"""
    assert_stopped_in_one_line(*stopped_run(["eval", long_store], moment), [signal.SIGINT])


@pytest.fixture(scope="module")
def npy_folder(tmp_path_factory):
    """The long store's size as a folder of .npy files: eval converts it to a temporary store."""
    folder = tmp_path_factory.mktemp("npy") / "features"
    folder.mkdir()
    rng = np.random.default_rng(4)
    for prefix, n in (("q", 1000), ("g", 10000)):
        np.save(folder / f"{prefix}f.npy", rng.standard_normal((n, 32)).astype(np.float32))
        np.save(folder / f"{prefix}_pids.npy", rng.integers(0, 200, n))
        np.save(folder / f"{prefix}_camids.npy", rng.integers(0, 4, n))
    return folder


CONVERTED = "is not a store: converted it to a temporary store"


@pytest.mark.parametrize("signals, moment", [
    ([signal.SIGINT], 0.3),  # loading, or converting
    ([signal.SIGINT], CONVERTED),  # the temporary store just written, the kernels being loaded
    ([signal.SIGINT, signal.SIGINT], "% positives"),  # Ctrl-C twice: the second lands during the clean-up
    ([signal.SIGTERM], CONVERTED),
    ([signal.SIGTERM], "% positives"),
])
def test_a_stopped_eval_of_a_file_leaves_no_temporary_store(npy_folder, tmp_path, signals, moment):
    code, err = stopped_run(["eval", npy_folder], moment, signals, tmpdir=tmp_path)
    assert_stopped_in_one_line(code, err, signals)
    if moment != 0.3:
        assert CONVERTED in err  # there was a temporary store to remove
    assert list(tmp_path.iterdir()) == []


REMOVAL_PAUSED = """
import os, shutil, sys, time
real, paused = shutil.rmtree, []
def rmtree(path, *args, **kwargs):  # the temporary store's removal pauses once: a signal lands there
    if os.path.basename(path).startswith("streameval-") and not paused:
        paused.append(path)
        print("paused", file=sys.stderr, flush=True)
        time.sleep(60)
    return real(path, *args, **kwargs)
shutil.rmtree = rmtree
from streameval.entry import main
sys.argv = ["streameval", *sys.argv[1:]]
main()
"""


def test_ctrl_c_while_the_temporary_store_is_removed_waits_for_the_removal(npy_folder, tmp_path):
    """The evaluation over (its results printed), a Ctrl-C during the clean-up: the store is still
    removed, and the run then says it was interrupted."""
    proc = subprocess.Popen([sys.executable, "-c", REMOVAL_PAUSED, "eval", str(npy_folder)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TMPDIR=str(tmp_path)))
    seen = []
    for line in proc.stderr:  # until the process ends
        if line == "paused\n":
            proc.send_signal(signal.SIGINT)
        else:
            seen.append(line)
    out, err = proc.communicate(timeout=60)
    err = "".join(seen) + err
    assert "mAP" in out  # the evaluation was over
    assert_stopped_in_one_line(proc.returncode, err, [signal.SIGINT])
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------- sizes


@pytest.mark.parametrize("text, size", [
    ("4096", 4096), (4096, 4096), ("4GB", 4 * 10**9), ("4gb", 4 * 10**9), ("4GiB", 4 << 30), ("1.5kB", 1500),
    ("1.5KiB", 1536), ("512MB", 512 * 10**6), ("512MiB", 512 << 20), ("2TB", 2 * 10**12), ("2TiB", 2 << 40),
    (" 7 B ", 7), ("12345678901234567", 12345678901234567),
])
def test_one_size_parser_decimal_and_binary_units_as_dask(text, size):
    from streameval.plan import parse_bytes

    assert parse_bytes(text) == size


@pytest.mark.parametrize("text", ["4g", "2G", "4gigs", "-1", "1e9", "GB", ""])
def test_sizes_without_a_clear_unit_are_refused(text):
    from streameval.errors import OptionError
    from streameval.plan import parse_bytes

    with pytest.raises(OptionError, match="powers of 1000"):
        parse_bytes(text)


def test_every_size_option_reads_the_same_units(store, monkeypatch):
    """--memory-budget and --tail-budget reach the plan, --memory-limit reaches Dask, in bytes."""
    import importlib

    import distributed

    from streameval import verification

    engine = importlib.import_module("streameval.evaluate")  # the module: the package exports the function

    seen = {}
    planned, checked = engine.make_plan, verification.check_memory
    monkeypatch.setattr(engine, "make_plan", lambda *args: seen.setdefault("budget", args[7]) and planned(*args))
    monkeypatch.setattr(verification, "check_memory",
                        lambda spec, *args: seen.setdefault("tail", spec.tail_budget) and checked(spec, *args))
    for budget, tail in (("4GB", "3kB"), ("4GiB", "3KiB")):
        seen.clear()
        cli("eval", store, "-q", "--no-gom", "--verification", "--memory-budget", budget, "--tail-budget", tail)
        assert seen == {"budget": 4 * (10**9 if budget == "4GB" else 1 << 30),
                        "tail": 3 * (1000 if tail == "3kB" else 1024)}

    def refused_cluster(**options):
        seen["memory_limit"] = options["memory_limit"]
        raise RuntimeError("no cluster in this test")

    monkeypatch.setattr(distributed, "LocalCluster", refused_cluster)
    for limit, size in (("4GB", 4 * 10**9), ("4GiB", 4 << 30)):
        line = one_error_line(cli("eval", store, "-q", "--cluster", "local", "--memory-limit", limit, code=4))
        assert "no cluster in this test" in line and seen["memory_limit"] == size
    line = one_error_line(cli("eval", store, "-q", "--cluster", "local", "--memory-limit", "4g", code=2))
    assert "cannot read a memory size from '4g'" in line
