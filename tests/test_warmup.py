"""A first run: numba compiles the kernels it calls once (seconds), into its on-disk cache.

* A run compiles in a phase of its own before its passes, "compiling kernels", by rehearsing its
  evaluation on a tiny problem: the passes compile nothing and book no compiling; the bar says so.
* ``streameval warmup`` compiles into the cache, and says what it compiled; an evaluation in a new
  process then loads every kernel from there.
* The cache goes where it can be written.

The cold checks run in fresh processes on one fresh cache folder: ``warmup --no-gom`` compiles,
the same options then load everything, and an option it did not warm (--open-set) compiles its
kernel in the rehearsal.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import importlib

import streameval
from streameval.engine import kernels, tiny
from streameval.core import progress
from streameval.run import warmup
from streameval.core.progress import COMPILING, Bar, Reporter
from streameval.protocols import resolve

pipeline = importlib.import_module("streameval.run.session")  # the module of the rehearsal


def fresh_process(args: list, cache: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL, env={**os.environ, "NUMBA_CACHE_DIR": str(cache)})
    assert proc.returncode == 0, proc.stderr
    return proc


EVALUATION = """
    import json, sys
    from numba.core import event
    import streameval
    import importlib
    from streameval.present import report
    from streameval.run import warmup

    pipeline = importlib.import_module("streameval.run.session")
    rehearsing, compiled_outside = [False], []
    rehearse = pipeline.rehearse

    def traced(*args):
        rehearsing[0] = True
        try:
            return rehearse(*args)
        finally:
            rehearsing[0] = False

    class Outside(event.Listener):  # numba compiles (cache misses) anywhere but in the rehearsal
        def on_start(self, ev):
            if not rehearsing[0]:
                compiled_outside.append(ev.data["dispatcher"].py_func.__name__)

        def on_end(self, ev):
            pass

    pipeline.rehearse = traced
    event.register("numba:compile", Outside())
    result = streameval.evaluate(sys.argv[1], **json.loads(sys.argv[2]))
    counts = warmup._cache_counts().values()
    print(json.dumps({"phases": result.run["phases"], "summary": report.summary(result).splitlines()[-1],
                      "compiled": sum(c for c, _ in counts), "loaded": sum(h for _, h in counts),
                      "compiled_outside": compiled_outside}))
"""


def evaluate_in_fresh_process(store: str, cache: Path, **options) -> dict:
    return json.loads(fresh_process(["-c", textwrap.dedent(EVALUATION), store, json.dumps(options)], cache).stdout)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("warmup") / "s.zarr"
    nq, ng, dim = 20, 200, 8
    streameval.write_store(path, rng.standard_normal((nq, dim), dtype=np.float32), rng.integers(1, 6, nq),
                           rng.integers(0, 3, nq), rng.standard_normal((ng, dim), dtype=np.float32),
                           rng.integers(-1, 8, ng), rng.integers(0, 3, ng))
    return str(path)


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    """(fresh numba cache folder, what ``streameval warmup --no-gom`` printed there): the one cold compile."""
    cache = tmp_path_factory.mktemp("numba-cache")
    return cache, fresh_process(["-m", "streameval.cli", "warmup", "--no-gom"], cache).stdout


def test_warmup_compiles_into_the_cache_and_says_what(warmed):
    cache, out = warmed
    lines = out.splitlines()
    assert re.fullmatch(rf"numba cache: {re.escape(str(cache))}/numba-[0-9a-f]{{16}}", lines[0])
    compiled = re.fullmatch(r"  --no-gom: compiled (\d+), loaded (\d+) from the cache, in \d+\.\d\d s: (.+)", lines[1])
    assert compiled, lines
    assert int(compiled.group(1)) >= 5 and {"update_slots", "rank_summaries"} <= set(compiled.group(3).split(", "))
    assert lines[2].startswith("warmed up in ") and len(lines) == 3
    assert any((cache / lines[0].rsplit("/", 1)[1]).iterdir())  # numba's index and data files


def test_an_evaluation_after_warmup_loads_every_kernel_from_the_cache(warmed, store_path):
    cache, _ = warmed
    run = evaluate_in_fresh_process(store_path, cache, no_gom=True, metric="cosine")  # the metric does not matter
    # row_terms, pair_distances, update_slots (slotted_negatives within it), rank_summaries
    assert run["compiled"] == 0 and run["loaded"] >= 4 and run["compiled_outside"] == []
    assert run["phases"]["compiling kernels"] < 10  # loading: milliseconds each (a loaded machine: generous)


def test_a_first_run_compiles_in_its_own_phase_before_the_passes(warmed, store_path):
    cache, _ = warmed
    run = evaluate_in_fresh_process(store_path, cache, no_gom=True, open_set=True)  # warmup left out --open-set
    assert run["compiled"] >= 1  # the open-set statistic's kernel, compiled now ...
    assert run["compiled_outside"] == []  # ... in the rehearsal: the passes and the metrics compile nothing
    phases = run["phases"]
    assert list(phases)[:3] == ["setup", "compiling kernels", "passes"]
    assert phases["compiling kernels"] > phases["passes"]  # a compile takes seconds, these passes milliseconds
    assert re.search(r"s setup \+ \d+\.\d\d s compiling kernels \+ \d+\.\d\d s passes \(the bar\)", run["summary"])


def test_the_bar_says_compiling_before_the_passes_and_while_numba_compiles_during_them():
    out = io.StringIO()
    bar = Bar(Reporter("streameval", out))
    with bar.compiling():
        pass
    bar.total = {"scoring": 10}
    bar.start(bar.clock())  # the passes: the log starts again at 0%, no rate measured yet
    assert out.getvalue().splitlines() == [f"streameval: 0% {COMPILING}, 0.0 s",
                                           "streameval: 0% scoring, 0.0 s, eta estimating"]

    import numba

    @numba.njit
    def never_called_before(x):
        return x + 1

    seen = []
    bar.reporter.show = lambda percent, passes, elapsed, eta: seen.append(passes)
    with progress.compile_watch(bar):
        never_called_before(1)
    assert COMPILING in seen and bar.compiles == 0 and bar.under_way() == "scoring"


@pytest.mark.parametrize("name", ["market", "sysu-all", "regdb"])
def test_the_tiny_problem_has_every_kind_of_row_the_protocol_knows(name):
    protocol = resolve(name)
    store = tiny.tiny_store(protocol, dtype=np.float16, dim=5)
    q_pid, q_cam = (np.asarray(store.query.pids), np.asarray(store.query.camids))
    g_pid, g_cam = (np.asarray(store.gallery.pids), np.asarray(store.gallery.camids))
    assert store.query.features.dtype == np.float16 and store.dim == 5
    assert set(q_cam) <= set(protocol.query_cameras or q_cam) and set(g_cam) <= set(protocol.gallery_cameras or g_cam)
    for pid in range(1, tiny.TINY_IDENTITIES + 1):  # seen from every camera, both sides
        assert set(q_cam[q_pid == pid]) == set(q_cam) and set(g_cam[g_pid == pid]) == set(g_cam)
    assert tiny.OPEN_PID in q_pid and tiny.OPEN_PID not in g_pid  # an open-set query
    assert tiny.DISTRACTOR_PID in g_pid and tiny.DISTRACTOR_PID not in q_pid
    assert set(protocol.junk_pids) <= set(g_pid)
    assert len(store.gallery) > tiny.TINY_CHUNK  # two chunks: two chains, merged


def test_a_distance_store_rehearses_on_a_distance_store_of_its_kind():
    store = tiny.tiny_store(resolve("market"), kind="similarity", dtype=np.float32, query_distances=True)
    assert store.kind == "similarity" and store.gallery.distances.dtype == np.float32
    assert store.query.distances.shape == (len(store.query),) * 2


def test_numba_caches_in_the_package_else_in_the_users_cache_folder(tmp_path, monkeypatch):
    package = tmp_path / "site-packages" / "streameval"
    package.mkdir(parents=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert kernels._cache_root(package, "") == package / "__pycache__"
    assert kernels._cache_root(package, str(tmp_path / "mine")) == tmp_path / "mine"  # NUMBA_CACHE_DIR wins
    writable = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: writable(path, mode) and "site-packages" not in str(path))
    assert kernels._cache_root(package, "") == tmp_path / "cache" / "streameval"  # a read-only install
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    assert kernels._cache_root(package, "") is None  # numba's own choice


def test_what_numba_compiles_during_the_passes_is_booked_as_compiling_not_as_passes():
    import numba
    from dask import delayed

    from streameval.run.session import Runner
    from streameval.engine.plan import Plan
    from streameval.core.progress import Phases

    @numba.njit
    def first_call(x):  # what a route the rehearsal did not take would compile
        return x * 2

    runner = Runner(None, Plan(query_block=1, gallery_chunk=1, workers=1), Phases(), None)
    assert runner.compute(delayed(first_call)(21)) == 42
    runner.close(completed=True)
    phases = runner.phases.seconds
    assert list(phases) == ["setup", "passes", COMPILING] and phases[COMPILING] > 0
    assert phases[COMPILING] > phases["passes"]  # the compile took longer than the call


def test_a_run_whose_rehearsal_cannot_run_evaluates_all_the_same(store_path, monkeypatch):
    expected = streameval.evaluate(store_path, no_gom=True)

    def fails(*args, **kwargs):
        raise RuntimeError("no tiny problem here")

    monkeypatch.setattr(tiny, "tiny_store", fails)
    monkeypatch.setattr(pipeline, "_rehearsed", set())
    assert pipeline.rehearse(streameval.open_store(store_path), None) is False
    result = streameval.evaluate(store_path, no_gom=True)
    assert result.mAP == expected.mAP and np.array_equal(result.cmc, expected.cmc)
    assert list(result.run["phases"])[:3] == ["setup", COMPILING, "passes"]
