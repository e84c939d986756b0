"""The device path (``--device``, engine/device.py): its GEMMs run in torch, here on the CPU
(``torch:cpu``, the same code a GPU runs), and its numbers equal the CPU path's and the brute-force
reference's, for every statistic, protocol and chunking.  A GPU's own checks (strict float32
products, the speed) need one: ``scripts/bench.py --device cuda``, ``scripts/gpu_check.sh``."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streameval
from streameval.engine import graph, sources
from streameval.engine.device import DeviceError, check_strict, parse_device
from streameval.core.errors import OptionError

from result_checks import comparable
from test_engine_vs_reference import SETTINGS, check_all_chunkings, chunkings, integer_problems

DEVICE = "torch:cpu"


def test_device_names_parse_to_the_cpu_path_or_a_torch_device():
    assert parse_device(None) is None and parse_device("cpu") is None
    for name in ("cuda", "cuda:0", "cuda:3", "torch:cpu"):
        assert parse_device(name) == name
    for bad in ("gpu", "cuda:", "cuda:-1", "cuda:01", "cuda:x", "torch:cuda", "CUDA"):
        with pytest.raises(OptionError, match="device must be"):
            parse_device(bad)


def tf32(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32's 10 stored significand bits (to nearest), as a tensor core reads them."""
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + (1 << 12)) >> 13) << 13
    return rounded.astype(np.uint32).view(np.float32)


def test_the_probe_product_refuses_a_gemm_that_rounds_its_inputs_to_tf32():
    check_strict(np.matmul, "cuda")  # float32 products pass
    with pytest.raises(DeviceError, match="TF32"):
        check_strict(lambda a, b: np.matmul(tf32(a), tf32(b)), "cuda")


@settings(max_examples=25, **SETTINGS)
@given(st.data())
def test_integer_features_on_the_device_match_the_reference(data):
    """Every metric and precision, protocols, junk sets, chunkings: ties (integer features) decided
    as on the CPU path, by (distance, gallery index)."""
    pytest.importorskip("torch")
    problem, options = data.draw(integer_problems())
    plans = data.draw(chunkings(len(problem["q_pids"]), len(problem["g_pids"])))
    check_all_chunkings(problem, problem, dict(options, device=DEVICE), plans)


@settings(max_examples=25, **SETTINGS)
@given(st.data())
def test_the_devices_screen_of_integer_features_matches_the_reference(data):
    """Ranking alone (``no_gom``): the device screens each block for the rows within the queries'
    reach and copies back only those; galleries of up to 200 rows, so blocks hold whole 64-column
    words of the screen and the columns after them.  Ties decided by (distance, gallery index)."""
    pytest.importorskip("torch")
    problem, options = data.draw(integer_problems(max_ng=200))
    plans = data.draw(chunkings(len(problem["q_pids"]), len(problem["g_pids"])))
    check_all_chunkings(problem, problem, dict(options, device=DEVICE, no_gom=True), plans)


def identities(seed: int, nq: int = 40, ng: int = 500, dim: int = 24, ids: int = 15) -> dict:
    """Continuous float32 features around identity centres (the device's GEMM sums in another order
    than numpy's: its dot products differ in the last bits), junk (-1) and distractors (0) in the
    gallery, two identities only queries have (open-set queries), cameras 1-6."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(ids + 1, dim))
    q_pids, g_pids = rng.integers(1, ids + 3, nq), rng.integers(-1, ids + 1, ng)

    def features(pids):
        return (centres[np.clip(pids, 0, ids)] + 0.8 * rng.normal(size=(pids.size, dim))).astype(np.float32)

    return dict(qf=features(q_pids), q_pids=q_pids, q_camids=rng.integers(1, 7, nq), gf=features(g_pids),
                g_pids=g_pids, g_camids=rng.integers(1, 7, ng))


# every statistic the scoring pass counts: slots (CMC, AP, INP), GOM (minmax: the range pass; fixed),
# sgs and trials, dedup (mars), open-set, verification (its pilot and refinement passes), ranked
# lists, and re-ranking's kNN pass and query expansion (GEMMs on the device too)
RUNS = {
    "market, GOM minmax": dict(),
    "GOM fixed, cosine": dict(metric="cosine", gom_norm="fixed:0:2"),
    "float64 GEMMs": dict(precision="float64", metric="euclidean"),
    "cuhk03-sgs": dict(protocol="cuhk03-sgs", no_gom=True),
    "sysu-all trials": dict(protocol="sysu-all", no_gom=True),
    "vehicleid": dict(protocol="vehicleid", no_gom=True),
    "mars dedup": dict(protocol="mars", no_gom=True),
    "regdb two directions": dict(protocol="regdb", no_gom=True),
    "open-set and verification": dict(open_set=True, verification=True, no_gom=True),
    "ranked lists": dict(ranked_list=5, no_gom=True),
    "re-ranking": dict(rerank="matlab", no_gom=True),
    "query expansion": dict(qe="aqe", no_gom=True),
}


@pytest.mark.parametrize("run", RUNS)
def test_every_statistic_on_the_device_gives_the_cpu_paths_numbers(run):
    pytest.importorskip("torch")
    data, options = identities(seed=len(run)), RUNS[run]
    # (the kNN pass's settled pairs depend on the chunks; its blocks follow the query block, and
    # blocks of 7 of its 540 rows made a graph of ~3,000 tasks: 18 s an evaluation)
    for chunks in (dict(), dict(query_block=13, gallery_chunk=61)):
        cpu = streameval.evaluate(data, **chunks, **options)
        on_device = streameval.evaluate(data, device=DEVICE, **chunks, **options)
        assert comparable(on_device) == comparable(cpu)
        assert (cpu.run["device"], on_device.run["device"]) == ("cpu", DEVICE)


@pytest.mark.parametrize("run", [run for run, options in RUNS.items() if options.get("no_gom") and
                                 not {"open_set", "ranked_list", "rerank"} & options.keys()])
def test_the_device_copies_back_the_pairs_within_reach_only(run, monkeypatch):
    """Where every statistic reads only the rows within its reach (ranking, sgs, trials, dedup), the
    device's screen copies back far fewer dot products than pairs, and the numbers are the CPU
    path's.  (Chunks of 100 and 300 rows: whole words of the screen and columns after them.)"""
    pytest.importorskip("torch")
    copied = []
    spread = sources.spread_hits
    monkeypatch.setattr(sources, "spread_hits", lambda words, values, dots: (copied.append((values.size, dots.size)),
                                                                             spread(words, values, dots)))
    data, options = identities(seed=len(run)), RUNS[run]
    for chunk in (100, 300):
        copied.clear()
        on_device = streameval.evaluate(data, device=DEVICE, gallery_chunk=chunk, **options)
        assert comparable(on_device) == comparable(streameval.evaluate(data, gallery_chunk=chunk, **options))
        values, pairs = np.sum(copied, axis=0)
        assert 0 < values < pairs / 2


@pytest.mark.parametrize("run", RUNS)
def test_a_gpus_calls_of_several_sub_blocks_give_the_cpu_paths_numbers(run, monkeypatch):
    """A GPU's call covers many query sub-blocks (``DeviceSource.call_rows``): here sub-blocks of 8
    query rows in calls of 20 rows, so a call holds whole sub-blocks and a part of one, and the
    last call is shorter (and, in query blocks of 13, a call shorter than its rows allow)."""
    pytest.importorskip("torch")
    monkeypatch.setattr(graph, "QUERY_SUB_BLOCK", 8)
    monkeypatch.setattr(sources.DeviceSource, "call_rows", lambda self, n_cols: 20)
    data, options = identities(seed=len(run)), RUNS[run]
    for chunks in (dict(), dict(query_block=13, gallery_chunk=61)):
        on_device = streameval.evaluate(data, device=DEVICE, **chunks, **options)
        assert comparable(on_device) == comparable(streameval.evaluate(data, **chunks, **options))


def test_a_gpus_call_covers_whole_sub_blocks_up_to_its_pairs():
    """On a GPU a call covers as many 512-query sub-blocks as DEVICE_CALL_PAIRS (8,388,608) allow,
    one at least; torch:cpu's is one sub-block, whose temporaries stay in cache."""
    gpu = sources.block_source("euclidean", 256, np.float32, "cuda:0")  # made, not opened: no GPU needed
    assert [gpu.call_rows(n) for n in (256, 512, 4096, 16384, 1 << 15)] == [32768, 16384, 2048, 512, 512]
    assert sources.block_source("euclidean", 256, np.float32, DEVICE).call_rows(256) == 512


def test_each_worker_thread_calls_a_gpu_on_a_stream_of_its_own(monkeypatch):
    """``device.thread_stream``: on a GPU, a thread's calls run on its own CUDA stream, the same for
    all its calls, another thread's another (so a thread's waits are for its own work, not for what
    the others queued on the shared default stream); torch:cpu's is no stream. The GPU's torch is
    stood in for by what ``thread_stream`` asks of it (``torch.cuda.Stream`` and ``torch.cuda.stream``);
    on a GPU, ``scripts/gpu_check.sh`` runs the real ones to the CPU path's numbers."""
    import threading
    from types import SimpleNamespace

    from streameval.engine import device, scratch

    made, entered = [], []

    class Stream:
        def __init__(self, device):
            self.device = device
            made.append(self)

    class Entered:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            entered.append((threading.get_ident(), self.stream))

        def __exit__(self, *exc):
            return False

    gpu = object()
    torch = SimpleNamespace(cuda=SimpleNamespace(Stream=Stream, stream=Entered))
    monkeypatch.setattr(device, "torch_module", lambda: torch)
    monkeypatch.setattr(device, "opened", lambda name: gpu)
    try:
        def calls():
            for _ in range(3):
                with device.thread_stream("cuda:0"):
                    pass

        calls()
        other = threading.Thread(target=calls)
        other.start()
        other.join()
        assert len(made) == 2 and all(stream.device is gpu for stream in made)
        by_thread = {}
        for thread, stream in entered:
            by_thread.setdefault(thread, set()).add(stream)
        assert sorted(map(len, by_thread.values())) == [1, 1] and len(set().union(*by_thread.values())) == 2
        with device.thread_stream(DEVICE):
            assert len(entered) == 6  # torch:cpu: no stream entered
    finally:
        scratch.release()


def run_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streameval.cli", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("device") / "store.zarr"
    data = identities(seed=0)
    streameval.write_store(str(path), data["qf"], data["q_pids"], data["q_camids"], data["gf"], data["g_pids"],
                           data["g_camids"])
    return str(path)


def test_a_gpu_asked_for_where_there_is_none_is_one_error_line(store):
    """Exit 4 (the environment): torch's CPU build sees no GPU, or torch is not installed (the gpu extra)."""
    for device in ("cuda", "cuda:1"):
        done = run_cli("eval", store, "--device", device)
        assert done.returncode == 4, done.stderr
        assert done.stdout == "" and done.stderr.count("\n") == 1 and done.stderr.startswith("error: ")
        assert "--device" in done.stderr


def test_workers_without_a_gpu_are_one_error_line_before_any_work(store):
    pytest.importorskip("distributed")
    done = run_cli("eval", store, "--device", "cuda", "--cluster", "local", "--n-workers", "2", "-q")
    assert done.returncode == 4 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: 2 Dask worker(s) cannot run the GEMMs, e.g. tcp://")


def test_a_device_that_is_no_device_is_refused_before_any_work(store):
    done = run_cli("eval", store, "--device", "gpu0")
    assert done.returncode == 2 and done.stderr.startswith("error: device must be")
    assert done.stderr.count("\n") == 1


def test_the_cli_on_the_device_prints_the_cpu_paths_summary(store):
    pytest.importorskip("torch")
    cpu = run_cli("eval", store, "--no-gom", "--format", "csv")
    on_device = run_cli("eval", store, "--no-gom", "--format", "csv", "--device", DEVICE)
    assert cpu.returncode == on_device.returncode == 0, on_device.stderr
    assert on_device.stdout == cpu.stdout and "mAP" in cpu.stdout


def test_one_worker_per_gpu_on_a_local_cluster(store):
    """``--cluster local --n-workers G --device cuda``: worker n takes GPU n mod G (``worker_gpu``),
    and a cluster's workers run the device path to the threaded CPU path's numbers."""
    pytest.importorskip("torch")
    distributed = pytest.importorskip("distributed")
    from streameval.engine.device import worker_gpu

    cpu = comparable(streameval.evaluate(store))
    on_cluster = streameval.evaluate(store, device=DEVICE, cluster="local", n_workers=2, threads_per_worker=1)
    assert comparable(on_cluster) == cpu and on_cluster.run["device"] == DEVICE
    with distributed.LocalCluster(n_workers=3, threads_per_worker=1, processes=False) as cluster, \
            distributed.Client(cluster) as client:
        picked = {worker.name: client.submit(worker_gpu, 2, workers=[worker.address], pure=False).result()
                  for worker in cluster.workers.values()}
    assert picked == {0: 0, 1: 1, 2: 0}
    assert worker_gpu(2) == 0  # not a worker: the threaded scheduler's process


def test_an_update_on_the_device_equals_a_full_evaluation(tmp_path):
    """``update`` scores the appended rows (and the queries they give positives) on the device."""
    pytest.importorskip("torch")
    data, more = identities(seed=3), identities(seed=4, nq=1, ng=80)
    path, state = str(tmp_path / "store.zarr"), str(tmp_path / "state")
    streameval.write_store(path, data["qf"], data["q_pids"], data["q_camids"], data["gf"], data["g_pids"],
                           data["g_camids"], chunk_rows=64)
    streameval.evaluate(path, state=state, device=DEVICE)
    streameval.append_gallery(path, more["gf"], more["g_pids"], more["g_camids"])
    updated = streameval.update(path, state, device=DEVICE, gallery_chunk=50)
    assert updated.run["update"]["rows_added"] == 80
    whole = streameval.evaluate(path)
    assert comparable(updated) == comparable(whole)
