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
from streameval.tools.synth import synthesize

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
    (["--gom-bins", "10000000"], "'--gom-bins': must be a positive integer up to 100,000, got 10000000"),
    (["--max-rank", "1000000000"], "'--max-rank': must be a positive integer up to 100,000, got 1000000000"),
    (["--gom-b", str(2**64)], "'--gom-b': must be a positive integer up to 9,223,372,036,854,775,807"),
    (["--junk-pids", str(2**64)], "junk_pids must be an integer from -9,223,372,036,854,775,807 to"),
    (["--junk-pids", str(-2**63)], "is reserved"),
    (["--gom-norm", "fixed:-1e308:1e308"], "finite span"),
    (["--gom-norm", "fixed:0:inf"], "finite LO < HI"),
    (["--memory-budget", "10"], "too small to plan"),
    (["--n-workers", "2"], "use with --cluster local"),
    (["--threads-per-worker", "2", "--memory-limit", "1GiB"], "use with --cluster local"),
    # values that ran silently for minutes (issue 24): refused by their declared range (choices.RANGES)
    (["--query-block", str(2**63)], "'--query-block': must be a positive integer up to 9,223,372,036,854,775,807 "
                                    "(rows are 64-bit indices), got 9223372036854775808"),
    (["--gallery-chunk", str(2**64)], "'--gallery-chunk': must be a positive integer up to 9,223,372,036,854,775,807"),
    (["--verification", "--tail-budget", "1B"], "'--tail-budget': must be an integer from 32 to "),
    (["--connect-timeout", "nan"], "'--connect-timeout': must be a number from 0.1 to 86400 seconds (a day), got nan"),
    (["--connect-timeout", "inf"], "'--connect-timeout': must be a number from 0.1 to 86400 seconds (a day), got inf"),
    (["--memory-budget", "10000000TiB"], "'--memory-budget': must be a positive integer up to 9,223,372,036,854,775,807 "
                                         "bytes"),
    (["--seed", str(2**63), "--trials", "2"], "'--seed': must be an integer from -9,223,372,036,854,775,808 to"),
    (["--cluster", "local", "--n-workers", "100000"], "--n-workers 100,000 needs about "),
    (["--cluster", "local", "--memory-limit", "-1"], "cannot read a memory size from '-1'"),
])
def test_bad_option_values_are_refused_at_once(store, args, says):
    started = time.perf_counter()
    result = cli("eval", store, *args, code=2)
    assert says in one_error_line(result), result.stderr
    assert "%" not in result.stderr  # refused before any progress was drawn
    assert time.perf_counter() - started < 10


@pytest.mark.parametrize("args, says", [
    (["synth", "{tmp}/v.zarr", "--variants", "cil-upstream", "--variant-trials", "1000000000"],
     "'--variant-trials': must be a positive integer up to 1,000"),
    (["synth", "{tmp}/v.zarr", "--noise", "nan"], "'--noise': must be a finite number >= 0, got nan"),
    (["synth", "{tmp}/v.zarr", "--junk", "nan"], "'--junk': must be a number from 0 to 1, got nan"),
    (["synth", "{tmp}/v.zarr", "--chunk-rows", str(2**63)], "'--chunk-rows': must be a positive integer up to"),
    (["suite", "{store}", "cil-upstream", "--trials", "1000000000"], "'--trials': must be a positive integer up to 1,000"),
    (["suite", "{store}", "cil-factorial", "--headline-setting", "nope"],
     "headline_setting (--headline-setting) must be a setting suite 'cil-factorial' evaluates: clean, query, gallery, "
     "both; got 'nope'"),
])
def test_other_commands_refuse_absurd_values_at_once(store, tmp_path, args, says):
    started = time.perf_counter()
    result = cli(*[a.format(store=store, tmp=tmp_path) for a in args], code=2)
    assert says in one_error_line(result), result.stderr
    assert not (tmp_path / "v.zarr").exists() and time.perf_counter() - started < 10


def test_a_memory_limit_no_worker_can_start_in_is_a_cluster_error(store):
    """Dask would restart the worker until a connection closed ("Stream is closed", exit 3, its logs
    on stderr); refused before the cluster starts, as the cluster problem it is."""
    pytest.importorskip("distributed")
    started = time.perf_counter()
    result = cli("eval", store, "-q", "--cluster", "local", "--memory-limit", "1MiB", code=4)
    line = one_error_line(result)
    assert result.stderr == line + "\n", result.stderr
    assert line.startswith("error: --memory-limit 1.0 MiB is less than a Dask worker needs to run: at least "), line
    assert time.perf_counter() - started < 10


def test_every_numeric_option_of_every_command_has_a_declared_range():
    """One mechanism: no command reads a number with click's own int / float types (whose ranges let
    nan, inf and 2^63 through); each uses choices.RANGES, sizes through the byte parser."""
    import click

    from streameval.cli import Bounded, _bytes, main

    unranged = [f"{name} {param.opts[0]}" for name, command in main.commands.items() for param in command.params
                if isinstance(param.type, (click.types.IntParamType, click.types.FloatParamType))
                and not isinstance(param.type, Bounded)]
    assert unranged == []
    sizes = sorted({param.opts[0] for command in main.commands.values() for param in command.params
                    if param.callback is _bytes})
    assert sizes == ["--memory-budget", "--memory-limit", "--tail-budget"]


def test_the_memory_budget_error_names_a_minimum_that_works(store):
    line = one_error_line(cli("eval", store, "-q", "--no-gom", "--memory-budget", "10", code=2))
    minimum = line.split("at least ")[1].split(" (")[0]
    value, unit = minimum.split()
    budget = f"{int(float(value) * {'KiB': 1 << 10, 'MiB': 1 << 20, 'GiB': 1 << 30}[unit]) + 1024}"
    cli("eval", store, "-q", "--no-gom", "--memory-budget", budget)


def test_gom_state_larger_than_the_budget_is_refused_with_the_bins_that_fit(store):
    line = one_error_line(cli("eval", store, "-q", "--gom-bins", "50000", "--memory-budget", "20MiB", code=2))
    assert "use at most" in line and "--gom-bins 50000" in line


def test_the_bins_a_refusal_names_fit_the_budget_and_one_more_does_not(store):
    line = one_error_line(cli("eval", store, "-q", "--gom-bins", "50000", "--memory-budget", "20MiB", code=2))
    fits = int(line.split("use at most ")[1].split(" bins")[0].replace(",", ""))
    cli("eval", store, "-q", "--gom-bins", fits, "--memory-budget", "20MiB")
    one_error_line(cli("eval", store, "-q", "--gom-bins", fits + 1, "--memory-budget", "20MiB", code=2))


def test_tasks_given_past_the_budget_are_refused_before_work(store):
    """--query-block and --gallery-chunk given: their tasks count in --memory-budget as planned ones do."""
    line = one_error_line(cli("eval", store, "-q", "--no-gom", "--query-block", "30", "--gallery-chunk", "300",
                              "--memory-budget", "20kB", code=2))
    assert "more than the memory budget of 19.5 KiB" in line and "2 task(s) of 30 queries x 300 gallery rows" in line
    assert line.endswith("give a smaller --query-block / --gallery-chunk or raise --memory-budget")


def test_the_memory_account_counts_every_declared_field_in_each_state_the_graph_holds(store):
    """Tasks, then every Field (dtype x shape per row): a query-axis field for every query (the
    finished blocks) and for two query blocks per worker (a chain's state and its task's copy); a
    global field once per query block and twice per worker."""
    from streameval.core.errors import OptionError
    from streameval.engine.plan import Plan
    from streameval.run.session import check_memory
    from streameval.engine.statistic import Field, Statistic

    class Held(Statistic):
        name = "held"
        fields = {"rows": Field("query", np.int64, (3,)), "pool": Field("global", np.float64, (5, 4))}

    class Asked:  # the settings, as far as the account reads them
        statistics = staticmethod(lambda meta, dim: (Held(),))

    opened = streameval.open_store(store)  # 30 queries: 3 blocks of 10
    plan = Plan(query_block=10, gallery_chunk=100, workers=2, task_bytes=1000)
    needed = 2 * 1000 + 8 * 3 * (30 + 2 * 2 * 10) + 8 * 5 * 4 * (3 + 2 * 2)
    check_memory(opened, Asked, plan, needed, None)
    with pytest.raises(OptionError, match=r"the held statistic \(rows, pool\): raise --memory-budget$"):
        check_memory(opened, Asked, plan, needed - 1, None)


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
    code = ("import streameval, streameval.run.incremental, streameval.run.evaluation; "
            "assert callable(streameval.evaluate) and callable(streameval.update); "
            "from streameval import evaluate, Result, write_store; print(evaluate.__module__, Result.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["streameval.run.evaluation", "Result"]


@pytest.fixture(scope="module")
def long_store(tmp_path_factory):
    """A store whose passes last long enough (seconds here, a second on a fast machine) to be stopped
    while they run, whatever moment the test picks."""
    path = tmp_path_factory.mktemp("long") / "s.zarr"
    synthesize(path, n_query=2000, n_gallery=50000, dim=32, n_ids=400, n_cams=4, seed=3)
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
    for prefix, n in (("q", 2000), ("g", 50000)):
        np.save(folder / f"{prefix}f.npy", rng.standard_normal((n, 32)).astype(np.float32))
        np.save(folder / f"{prefix}_pids.npy", rng.integers(0, 400, n))
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


FINALISER_INTERRUPTED = """
import os, signal, sys, time
from streameval.core import locking
release = locking.Reading.release
def slow_release(self):  # a reader lock released by the garbage collector: a Ctrl-C lands in __del__
    if self.fd >= 0 and not getattr(locking, "sent", False):
        locking.sent = True
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
    release(self)
locking.Reading.release = slow_release
from streameval.entry import main
sys.argv = ["streameval", *sys.argv[1:]]
main()
"""


def test_a_ctrl_c_swallowed_by_a_finaliser_still_stops_the_run_in_one_line(store):
    """Python ignores an exception raised in ``__del__``: the signal is recorded, and the command
    ends as stopped (exit 130, one line, no "Exception ignored" traceback) instead of exit 0."""
    proc = subprocess.run([sys.executable, "-c", FINALISER_INTERRUPTED, "eval", str(store)],
                          capture_output=True, text=True, timeout=120)
    assert "Exception ignored" not in proc.stderr
    assert_stopped_in_one_line(proc.returncode, proc.stderr, [signal.SIGINT])


# ---------------------------------------------------------------------------------------- sizes


@pytest.mark.parametrize("text, size", [
    ("4096", 4096), (4096, 4096), ("4GB", 4 * 10**9), ("4gb", 4 * 10**9), ("4GiB", 4 << 30), ("1.5kB", 1500),
    ("1.5KiB", 1536), ("512MB", 512 * 10**6), ("512MiB", 512 << 20), ("2TB", 2 * 10**12), ("2TiB", 2 << 40),
    (" 7 B ", 7), ("12345678901234567", 12345678901234567),
])
def test_one_size_parser_decimal_and_binary_units_as_dask(text, size):
    from streameval.engine.plan import parse_bytes

    assert parse_bytes(text) == size


@pytest.mark.parametrize("text", ["4g", "2G", "4gigs", "-1", "1e9", "GB", ""])
def test_sizes_without_a_clear_unit_are_refused(text):
    from streameval.core.errors import OptionError
    from streameval.engine.plan import parse_bytes

    with pytest.raises(OptionError, match="powers of 1000"):
        parse_bytes(text)


def test_every_size_option_reads_the_same_units(store, monkeypatch):
    """--memory-budget and --tail-budget reach the plan, --memory-limit reaches Dask, in bytes."""
    import importlib

    import distributed

    from streameval.engine.plan import default_memory_budget, physical_memory

    engine = importlib.import_module("streameval.run.session")  # the module that plans the run and checks its memory

    seen = {}
    planned, checked = engine.make_plan, engine.check_memory
    monkeypatch.setattr(engine, "make_plan", lambda *args: seen.setdefault("budget", args[7]) and planned(*args))
    monkeypatch.setattr(engine, "check_memory", lambda store, settings, *args: seen.setdefault(
        "tail", settings.verification.tail_budget) and checked(store, settings, *args))
    for budget, tail in (("4GB", "3kB"), ("4GiB", "3KiB")):
        seen.clear()
        cli("eval", store, "-q", "--no-gom", "--verification", "--memory-budget", budget, "--tail-budget", tail)
        assert seen == {"budget": 4 * (10**9 if budget == "4GB" else 1 << 30),
                        "tail": 3 * (1000 if tail == "3kB" else 1024)}

    seen.clear()  # none given: the default of the run's workers (2 GiB on 4, this machine holding 8 GiB or more)
    cli("eval", store, "-q", "--no-gom", "--verification", "--workers", "4")
    assert seen["budget"] == default_memory_budget(4) and (physical_memory() < 8 << 30 or seen["budget"] == 2 << 30)

    def refused_cluster(**options):
        seen["memory_limit"] = options["memory_limit"]
        raise RuntimeError("no cluster in this test")

    monkeypatch.setattr(distributed, "LocalCluster", refused_cluster)
    for limit, size in (("4GB", 4 * 10**9), ("4GiB", 4 << 30)):
        line = one_error_line(cli("eval", store, "-q", "--cluster", "local", "--memory-limit", limit, code=4))
        assert "no cluster in this test" in line and seen["memory_limit"] == size
    line = one_error_line(cli("eval", store, "-q", "--cluster", "local", "--memory-limit", "4g", code=2))
    assert "cannot read a memory size from '4g'" in line


# ------------------------------------------------------------------------------ blocks and this machine


def test_a_query_block_past_the_queries_plans_the_gallery_chunk_of_all_queries():
    """--query-block 2^62 on 500 queries is a block of 500: the gallery chunk is sized for those
    (it was sized for 2^62 queries: 256-row chunks, a pass many times slower)."""
    from streameval.engine.plan import make_plan

    shape = dict(n_query=500, n_gallery=20_000, dim=64, itemsize=4, stored_itemsize=4, store_chunk_rows=2048,
                 workers=2)
    huge, exact = make_plan(**shape, query_block=2**62), make_plan(**shape, query_block=500)
    assert huge == exact and huge.gallery_chunk > 256


def test_a_task_larger_than_this_machine_is_refused_before_work():
    from streameval.core.errors import OptionError
    from streameval.engine.plan import format_bytes, make_plan, physical_memory

    memory = physical_memory()
    rows = int((memory // 4) ** 0.5) + 1  # rows x rows float32 dot products: more than the memory
    with pytest.raises(OptionError) as refused:
        make_plan(rows, rows, 8, 4, 4, 1024, 1, query_block=rows, gallery_chunk=rows)
    assert str(refused.value).startswith(f"a task of {rows:,} queries x {rows:,} gallery rows needs about ")
    assert f"more than this machine's memory ({format_bytes(memory)})" in str(refused.value)
