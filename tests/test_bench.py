"""scripts/bench.py's own machinery, on small inputs: the problems (--noise), how deep a problem's
last positives rank, passes over the GEMM, cold and warm processes, and --against's alternation of
the sides, its check of both sides' numbers and its refusals.  (The timings themselves are not
tested: the bench is run by hand.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

import streameval
from reference import distance_matrix, query_ranks
from streameval.tools.synth import NOISE_HARD

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import bench  # noqa: E402
import bench_against  # noqa: E402
import bench_device  # noqa: E402


def test_noise_names_the_problems():
    assert bench.parse_noises("easy,hard,2.5,easy") == [1.0, NOISE_HARD, 2.5]
    for bad in ("medium", "-1", "inf", "nan"):
        with pytest.raises(ValueError, match="--noise"):
            bench.parse_noises(bad)
    assert bench.noise_label(1.0) == "easy (noise 1)"
    assert bench.noise_label(NOISE_HARD) == f"hard (noise {NOISE_HARD:g})"


def test_the_default_run_has_an_easy_and_a_hard_problem():
    assert bench.parse_args([]).noises == [1.0, NOISE_HARD]
    assert bench.parse_args(["--scaling"]).noises == [1.0]
    assert bench.parse_args(["--noise", "3"]).noises == [3.0]


def test_a_problem_store_is_named_after_its_noise():
    args = bench.parse_args(["--size", "10x20x4"])
    easy = bench.store_name(bench.store_params(args, args.sizes[0]))
    hard = bench.store_name(bench.store_params(args, args.sizes[0], NOISE_HARD))
    assert "noise" not in easy  # the stores of before keep their names
    assert hard == easy.replace(".zarr", f"_noise{NOISE_HARD:g}.zarr")


def test_last_positive_ranks_against_brute_force():
    """Median, 90th percentile and deepest of the valid queries' last positive ranks, as sorting
    every query's full row finds them."""
    rng = np.random.default_rng(5)
    arrays = {"qf": rng.standard_normal((12, 3), dtype=np.float32), "q_pids": rng.integers(1, 5, 12),
              "q_camids": rng.integers(0, 2, 12), "gf": rng.standard_normal((60, 3), dtype=np.float32),
              "g_pids": rng.integers(-1, 6, 60), "g_camids": rng.integers(0, 2, 60)}
    arrays["q_pids"][0] = 9  # a query without a positive: not counted
    result = streameval.evaluate(arrays, no_gom=True)
    dist = distance_matrix(arrays["qf"], arrays["gf"], "euclidean")
    last = [ranks[-1] for q in range(12)
            if (ranks := query_ranks(dist[q], arrays["q_pids"][q], arrays["q_camids"][q], arrays["g_pids"],
                                     arrays["g_camids"], "market", (-1,)))]
    got = bench.last_positive_ranks(result.per_query)
    assert got["median"] == pytest.approx(np.median(last))
    assert got["p90"] == pytest.approx(np.percentile(last, 90))
    assert got["max"] == pytest.approx(max(last))
    assert bench.last_positive_ranks({"n_positives": np.zeros(3, int), "inp": np.full(3, np.nan)}) is None


def test_passes_over_gemm():
    run = {"phases": {"setup": 0.2, "passes": 1.3, "metrics": 0.1}}
    floor = {"detail": {"read+upcast": 0.4, "gemm": 1.0, "norms+combine": 0.1}}
    assert bench.passes_over_gemm(run, floor) == pytest.approx(1.3)
    assert bench.passes_over_gemm({"phases": None}, floor) is None  # a revision before phases
    assert bench.passes_over_gemm(run, None) is None


def test_cold_then_warm_in_rounds_of_every_side(tmp_path):
    """Each round: every side cold, with an empty NUMBA_CACHE_DIR of its own, then every side warm
    with what its cold run left there; the folders are removed afterwards."""
    log = tmp_path / "log"
    script = ("import os, sys; cache = os.environ['NUMBA_CACHE_DIR']; "
              "open(sys.argv[2], 'a').write(f'{sys.argv[1]} {cache} {sorted(os.listdir(cache))}\\n'); "
              "open(os.path.join(cache, 'kernel'), 'w').close()")
    commands = {side: [sys.executable, "-c", script, side, str(log)] for side in ("HEAD", "REV")}
    out = bench.cold_and_warm_times(commands, 2, str(tmp_path))
    lines = [line.split(" ", 2) for line in log.read_text().splitlines()]
    assert [(side, seen) for side, _, seen in lines] == [
        ("HEAD", "[]"), ("REV", "[]"), ("HEAD", "['kernel']"), ("REV", "['kernel']")] * 2
    caches = [cache for _, cache, _ in lines]
    assert caches[0] == caches[2] and caches[1] == caches[3] and len(set(caches)) == 4
    assert not any(os.path.exists(cache) for cache in caches)
    for side in commands:
        for phase in ("cold", "warm"):
            assert len(out[side][phase]["times_s"]) == 2
            assert out[side][phase]["time_s"] == min(out[side][phase]["times_s"])


def test_against_alternates_the_sides_and_keeps_each_best(monkeypatch):
    calls = []
    times = iter([3.0, 2.0, 1.0, 4.0, 5.0])

    def child(args, method, store, python=sys.executable, repeat=None):
        calls.append((method, python, store, repeat))
        return {"time_s": next(times), "metrics": {}}

    monkeypatch.setattr(bench, "run_child", child)
    args = Namespace(methods=["se-closed", "floor"], repeat=2)
    sides = {"HEAD": ("head-python", "head.zarr"), "REV": ("rev-python", "rev.zarr")}
    results = bench_against.run_against(args, sides)
    assert calls == [("se-closed", "head-python", "head.zarr", 1), ("se-closed", "rev-python", "rev.zarr", 1),
                     ("se-closed", "head-python", "head.zarr", 1), ("se-closed", "rev-python", "rev.zarr", 1),
                     ("floor", sys.executable, "head.zarr", None)]
    assert results["se-closed"]["HEAD"]["time_s"] == 1.0 and results["se-closed"]["HEAD"]["times_s"] == [3.0, 1.0]
    assert results["se-closed"]["REV"]["time_s"] == 2.0 and results["se-closed"]["REV"]["times_s"] == [2.0, 4.0]
    assert list(results["floor"]) == ["HEAD"]  # the floor on the working tree only


def metrics(mAP, rank1=0.9, mINP=0.4, n_valid=10):
    return {"mAP": mAP, "rank1": rank1, "mINP": mINP, "n_valid_queries": n_valid}


def test_against_checks_both_sides_numbers(capsys):
    rev = bench_against.Revision("d00fc36" + "0" * 33, "subject", "folder", "python", "made", {})
    same = {"se-closed": {"HEAD": {"metrics": metrics(0.5)}, "REV": {"metrics": metrics(0.5)}}}
    [check] = bench_against.check_numbers(same, rev)
    assert check["same"] and check["agree"]
    assert "se-closed SAME" in capsys.readouterr().out
    differ = {"streameval": {"HEAD": {"metrics": metrics(0.5)}, "REV": {"metrics": metrics(0.51)}},
              "se-fixed": {"HEAD": {"metrics": metrics(0.5)}, "REV": {"metrics": metrics(0.5, n_valid=9)}}}
    checks = bench_against.check_numbers(differ, rev)
    assert [c["agree"] for c in checks] == [False, False]
    out, err = capsys.readouterr()
    assert "streameval DIFFER, se-fixed DIFFER" in out
    assert "!!! HEAD and REV d00fc36 DIFFER on the same rows, streameval: mAP 0.500000 vs 0.510000" in err
    assert "valid queries 10 vs 9" in err


def run_bench(*args, cwd=None):
    return subprocess.run([sys.executable, str(SCRIPTS / "bench.py"), *args], capture_output=True, text=True, cwd=cwd)


def test_against_refuses_a_revision_that_is_no_commit():
    result = run_bench("--against", "no-such-revision")
    assert result.returncode == 2
    assert "--against: 'no-such-revision' is not a commit of this repository" in result.stderr


def test_against_refuses_a_workdir_git_would_show(tmp_path, capsys):
    repo = bench_against.repository()
    with pytest.raises(SystemExit) as stop:
        bench_against.check_outside_checkout(os.path.join(repo, "docs"), repo)
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith("error: --workdir ")
    bench_against.check_outside_checkout(os.path.join(repo, "out"), repo)  # ignored by .gitignore
    bench_against.check_outside_checkout(str(tmp_path), repo)


def test_transcribed_rows_are_the_same_rows(tmp_path):
    """REV's copy of a store (here written by this tree's write_store, as an old revision's would
    be by its own): every array equal, the same dtype and chunk rows."""
    from streameval.tools.synth import synthesize

    source = synthesize(tmp_path / "s.zarr", n_query=30, n_gallery=250, dim=8, n_ids=6, n_cams=3, chunk_rows=64,
                        junk_frac=0.1)
    dump = tmp_path / "rows"
    dump.mkdir()
    bench_against.dump_rows(str(tmp_path / "s.zarr"), str(dump))
    assert json.loads((dump / "meta.json").read_text()) == {"dtype": "float32", "chunk_rows": 64}
    bench_against.transcribe_child(Namespace(_store=str(dump), _out=str(tmp_path / "copy.zarr")))
    copy = streameval.open_store(tmp_path / "copy.zarr")
    assert copy.gallery.chunk_rows == 64
    for set_name in ("query", "gallery"):
        for field in ("features", "pids", "camids"):
            a, b = getattr(getattr(source, set_name), field), getattr(getattr(copy, set_name), field)
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a[:], b[:])


def test_against_table(capsys):
    """A row per method and per process, cold and warm: each side's best and median, HEAD/REV, the
    scoring passes over the floor's GEMM where a side has phases, and the processes' runs."""
    def child(times, passes=None):
        return {"time_s": min(times), "times_s": times, "metrics": metrics(0.5), "warmup": "warmed",
                "phases": passes and {"setup": 0.1, "passes": passes}}

    def process(times):
        return {"time_s": min(times), "times_s": times}

    results = {
        "se-closed": {"HEAD": child([2.0, 1.0, 3.0], passes=0.9), "REV": child([4.0, 2.0, 5.0])},
        "floor": {"HEAD": dict(child([0.8, 0.9, 0.7]), detail={"gemm": 0.6})},
        "process": {name: {side: {"cold": process([9.0, 8.0, 7.0]), "warm": process([3.0, 2.0, 1.0])}
                           for side in ("HEAD", "REV")} for name in ("cli-closed", "cli")},
    }
    rev = bench_against.Revision("d00fc36" + "0" * 33, "subject", "folder", "python", "made", {})
    args = bench.parse_args(["--size", "10x20x4", "--repeat", "3"])
    record = bench_against.report_against((10, 20, 4, 2), 1.0, {"HEAD": ("h.zarr", "made"), "REV": ("r.zarr", "made")},
                                          results, args, rev)
    out = capsys.readouterr().out
    rows = {line.split()[0] + (" " + line.split()[1] if line.startswith("cli") else ""): line.split()
            for line in out.splitlines() if line.startswith(("se-closed ", "floor ", "cli"))}
    assert rows["se-closed"][1:] == ["1.000", "2.000", "2.000", "4.000", "0.50x", "1.50", "-"]
    assert rows["floor"][1:] == ["0.700", "0.800", "-", "-", "-", "-", "-"]
    assert rows["cli-closed cold"][2:] == ["7.000", "8.000", "7.000", "8.000", "1.00x", "-", "-"]
    assert rows["cli warm"][2:] == ["1.000", "2.000", "1.000", "2.000", "1.00x", "-", "-"]
    assert "  cli warm runs (s): HEAD 3.000 2.000 1.000; REV 3.000 2.000 1.000" in out
    assert [row["method"] for row in record["rows"]] == ["se-closed", "floor", "cli-closed cold", "cli-closed warm",
                                                        "cli cold", "cli warm"]
    assert record["rows"][0]["passes_over_gemm"] == {"HEAD": pytest.approx(1.5), "REV": None}


def test_rerank_mode_runs_msmt17_shapes_in_float16():
    args = bench.parse_args(["--rerank"])
    assert args.rerank == "matlab" and args.dtype == "float16" and args.noises == [1.0]
    assert args.methods == ["rerank", "uu-floor", "dense"]
    assert args.sizes == [(11659, 82161, 2048, 3060), (11659, 82161, 256, 3060)]
    quick = bench.parse_args(["--rerank", "fastreid", "--rerank-scale", "0.02", "--dtype", "float32"])
    assert quick.rerank == "fastreid" and quick.dtype == "float32"
    assert quick.sizes == [(233, 1643, 2048, 61), (233, 1643, 256, 61)]
    assert bench.parse_args(["--rerank", "--size", "10x20x4"]).sizes == [(10, 20, 4, 2)]
    assert bench.parse_args([]).dtype == "float32"  # the other modes keep theirs


@pytest.mark.parametrize("argv, message", [
    (["--rerank", "cuhk"], "--rerank: unknown flavour 'cuhk'"),
    (["--rerank", "--rerank-scale", "0"], "--rerank-scale must be in (0, 1]"),
    (["--rerank", "--protocols"], "separate modes"),
    (["--rerank", "--methods", "floor"], "--methods: unknown floor"),
])
def test_rerank_mode_refuses(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.parse_args(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_dense_reference_size_fits_three_float32_matrices():
    import bench_rerank

    n = bench_rerank.dense_rows(11659, 82161, 100 * 2**30)
    share = bench_rerank.DENSE_MEMORY_SHARE * 100 * 2**30
    assert 3 * 4 * n ** 2 <= share < 3 * 4 * (n + 1) ** 2
    assert bench_rerank.dense_rows(10, 20, 2**40) == 30  # never more than U
    nq, ng = bench_rerank.dense_split(n, 11659, 82161)
    assert nq + ng == n and abs(nq / n - 11659 / 93820) < 1e-4
    assert bench_rerank.dense_split(3, 1, 1000) == (1, 2)


def test_u_rows_are_queries_then_gallery(tmp_path):
    import bench_rerank
    from streameval.tools.synth import synthesize

    store = synthesize(tmp_path / "s.zarr", n_query=30, n_gallery=100, dim=4, n_ids=6, n_cams=2, chunk_rows=16)
    u = np.concatenate([store.query.features[:], store.gallery.features[:]])
    rows = bench_rerank.u_rows(store)
    for a, b in ((0, 10), (25, 40), (30, 31), (100, 130), (0, 130)):
        np.testing.assert_array_equal(rows(a, b), u[a:b])


def test_device_mode_methods():
    args = bench.parse_args(["--device", "cuda:1", "--size", "10x20x4"])
    assert args.device == "cuda:1" and args.noises == [1.0]
    assert args.methods == ["device-closed", "device", "cli-device-closed", "cli-device", "cpu-closed", "cpu",
                            "gemm-floor", "read-floor"]
    skip = bench.parse_args(["--device", "torch:cpu", "--skip-cpu", "--methods", "device-all,cpu-all,read-floor"])
    assert skip.methods == ["device-all", "read-floor"]


def test_device_mode_gives_every_child_the_precision_and_the_memory_budget():
    """Both paths evaluate with the same options but the device: the same numbers, the same plan."""
    args = bench.parse_args(["--device", "torch:cpu", "--precision", "float64", "--memory-budget", "16GiB"])
    shared = ["--precision", "float64", "--memory-budget", "16GiB"]
    assert bench_device.child_options(args, True) == ["--device", "torch:cpu", *shared]
    assert bench_device.child_options(args, False) == shared
    child = bench.parse_args(["--_run", "se-closed", "--_store", "s.zarr", "--_out", "o.json", *shared])
    assert child.memory_budget == "16GiB"


@pytest.mark.parametrize("argv, message", [
    (["--device", "gpu0"], "--device: device must be cpu, cuda or cuda:N"),
    (["--device", "cpu"], "--device: the CPU path is the default"),
    (["--skip-cpu"], "--skip-cpu, --precision, --memory-budget and --breakdown go with --device"),
    (["--memory-budget", "16GiB"], "--skip-cpu, --precision, --memory-budget and --breakdown go with --device"),
    (["--breakdown"], "--skip-cpu, --precision, --memory-budget and --breakdown go with --device"),
    (["--device", "cuda", "--protocols"], "--device is a separate mode"),
    (["--device", "cuda", "--methods", "floor"], "--methods: unknown floor"),
])
def test_device_mode_refuses(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.parse_args(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_device_mode_says_each_method_as_it_ends(capsys):
    """A check stopped by a lease's end keeps what finished: a line a method, at once."""
    ran = {"time_s": 1.5, "warmup": "numba JIT warmed (2.0 s, not timed)", "plan": {"query_block": 10, "gallery_chunk": 20,
                                                                                   "workers": 2}}
    assert bench_device.progress("device-closed", ran) is ran
    bench_device.progress("cpu-closed", {"error": "child exited with 1"})
    assert capsys.readouterr().out.splitlines() == [
        "done    : device-closed: 1.500 s; numba JIT warmed (2.0 s, not timed); plan query_block=10 gallery_chunk=20 workers=2",
        "done    : cpu-closed: child exited with 1"]


def test_breakdown_times_each_part_in_thread_seconds_and_puts_the_functions_back():
    """Two threads each 20 ms in the statistics' limits: 40 thread-ms of "limits", nothing else."""
    import threading
    import time

    from streameval.engine import graph, sources
    from streameval.engine.statistic import StatState

    class Slow:  # a statistic whose limits take 20 ms
        def limits(self, blk):
            time.sleep(0.02)

    originals = (graph.load_rows, graph._limits, sources.spread_hits, StatState.copy, sources.DeviceSource.fill)
    with bench_device.Breakdown() as timers:
        threads = [threading.Thread(target=graph._limits, args=((Slow(),), None)) for _ in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
    parts = timers.parts()
    assert set(parts) == {"limits"} and 0.04 <= parts["limits"] < 0.5
    assert (graph.load_rows, graph._limits, sources.spread_hits, StatState.copy, sources.DeviceSource.fill) == originals


def test_device_numbers_are_checked_against_the_cpu_path(capsys):
    import bench_device

    def run(digest, mAP=0.5):
        return {"numbers_sha256": digest, "metrics": metrics(mAP)}

    [check] = bench_device.check_device_numbers({"device-closed": run("a"), "cpu-closed": run("a"), "device": run("b")})
    assert check["same"] and check["agree"]  # device has no CPU run to compare with
    assert "device-closed vs cpu-closed SAME" in capsys.readouterr().out
    checks = bench_device.check_device_numbers({"device-closed": run("a"), "cpu-closed": run("a"),
                                                "device": run("b", 0.5), "cpu": run("c", 0.75)})
    assert [c["same"] for c in checks] == [True, False]
    out, err = capsys.readouterr()
    assert "device-closed vs cpu-closed SAME, device vs cpu DIFFERENT" in out
    assert "!!! the device and the CPU path gave DIFFERENT numbers on the same rows, device vs cpu: mAP 0.500000000 vs " \
           "0.750000000" in err


@pytest.mark.slow
def test_device_mode_runs_torch_cpu_end_to_end(tmp_path):
    """The device path's code on the CPU (torch:cpu) against the CPU path, and both floors, over the
    device run's plan: SAME numbers, exit 0."""
    pytest.importorskip("torch")
    out = tmp_path / "bench.json"
    result = run_bench("--device", "torch:cpu", "--size", "60x1500x16", "--dtype", "float16", "--methods",
                       "device-closed,cpu-closed,gemm-floor,read-floor", "--workdir", str(tmp_path), "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "numbers device vs CPU path (every number of the result, per query too): device-closed vs cpu-closed SAME" \
           in result.stdout
    [problem] = json.loads(out.read_text())["sizes"]
    assert [check["same"] for check in problem["numbers"]] == [True]
    rows = {row["method"]: row for row in problem["rows"]}
    assert rows["gemm-floor"]["plan"] == rows["device-closed"]["plan"] == rows["read-floor"]["plan"]
    assert problem["floor_s"] == max(rows["gemm-floor"]["time_s"], rows["read-floor"]["time_s"]) > 0
    assert set(rows["gemm-floor"]["detail"]) == {"upload+gemm", "gemm resident", "dots copied back (not in the floor)"}
