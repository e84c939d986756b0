"""One writer at a time per store and per state, and no store replaced under its reader
(``streameval.core.locking``), with real processes of the real command line started together; and
--overwrite replaces only a store streameval wrote.

A row's features carry its ids (feature 0 is its pid, feature 1 its camera), so a store whose
features and ids came from two different appends is seen at once.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import streameval
from streameval.core.errors import OptionError
from streameval.core.locking import lock_path
from streameval.store import open_store
from streameval.store.variants import variant_set

from cli_checks import cli, one_error_line

DIM = 4
ROWS = 6000  # per append: enough chunk writes that two unlocked appends overlap
CHUNK = 100


def command(*args, wait: float | None = None) -> subprocess.Popen:
    """``python -m streameval.cli ARGS`` started as a real process."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if wait is not None:
        env["STREAMEVAL_LOCK_WAIT"] = str(wait)
    return subprocess.Popen([sys.executable, "-m", "streameval.cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env)


def together(*commands) -> list[subprocess.CompletedProcess]:
    """Start every command at once, then wait for all of them."""
    started = [command(*args) for args in commands]
    done = []
    for process in started:
        out, err = process.communicate(timeout=240)
        done.append(subprocess.CompletedProcess(process.args, process.returncode, out, err))
    return done


def rows(first_pid: int, n: int) -> tuple:
    """n rows whose features hold their own ids: feature 0 the pid, feature 1 the camera (pids
    below 2^24, exact in float32)."""
    pids = np.arange(first_pid, first_pid + n, dtype=np.int64)
    camids = pids % 7
    features = np.random.default_rng(first_pid).standard_normal((n, DIM)).astype(np.float32)
    features[:, 0], features[:, 1] = pids, camids
    return features, pids, camids


def make_store(path, n_gallery: int = 200):
    qf, qp, qc = rows(1, 20)
    gf, gp, gc = rows(1, n_gallery)
    return streameval.write_store(path, qf, qp, qc, gf, gp, gc, chunk_rows=CHUNK)


def append_file(path, first_pid: int, n: int = ROWS):
    gf, gp, gc = rows(first_pid, n)
    np.savez(path, gf=gf, g_pids=gp, g_camids=gc)
    return path


def gallery(path) -> tuple:
    store = open_store(path)
    g = store.gallery
    return g.features[:len(g)], g.pids[:len(g)], g.camids[:len(g)]


def assert_refused_by_lock(proc, path) -> None:
    """Exit 3 and one line naming the holder: its pid, host and command."""
    assert proc.returncode == 3, proc.stderr
    line = proc.stderr.strip()
    assert line.count("\n") == 0 and line.startswith(f"error: '{path}' is being written by pid "), proc.stderr
    assert f"on host {socket.gethostname()}, '" in line and "streameval" in line, line


def assert_appends_landed(path, outcomes, first_pids, existing: np.ndarray, n: int = ROWS) -> np.ndarray:
    """Every append landed whole or was refused by the lock; the store holds exactly the rows it
    held (pids ``existing``) and the ``n`` rows of each append that landed, each row's features
    paired with its ids.  Returns the pids it holds now."""
    landed = []
    for proc, first in zip(outcomes, first_pids):
        if proc.returncode == 0:
            landed.append(first)
        else:
            assert_refused_by_lock(proc, path)
    assert landed, [p.stderr for p in outcomes]
    features, pids, camids = gallery(path)
    assert len(pids) == len(existing) + n * len(landed)
    np.testing.assert_array_equal(features[:, 0], pids)  # every row's features are its own
    np.testing.assert_array_equal(features[:, 1], camids)
    np.testing.assert_array_equal(pids[:len(existing)], existing)
    expected = np.concatenate([existing] + [np.arange(f, f + n) for f in landed])
    np.testing.assert_array_equal(np.sort(pids), np.sort(expected))
    for first in landed:  # each append's rows in one run, in order
        at = np.flatnonzero(pids == first)[0]
        np.testing.assert_array_equal(pids[at:at + n], np.arange(first, first + n))
    return pids


def test_two_appends_at_once_both_land_or_one_is_refused(tmp_path):
    path = tmp_path / "s.zarr"
    make_store(path)
    files = [append_file(tmp_path / f"a{i}.npz", 100_000 * i) for i in (1, 2)]
    outcomes = together(*(["append", path, f] for f in files))
    assert_appends_landed(path, outcomes, [100_000, 200_000], np.arange(1, 201))
    assert not os.path.exists(lock_path(path))  # released: the lock file goes with its holder


@pytest.mark.slow
def test_twenty_rounds_of_two_concurrent_appends(tmp_path):
    """The issue's acceptance: 20 rounds, each checked; small data (about a second a round)."""
    path = tmp_path / "s.zarr"
    make_store(path)
    pids = np.arange(1, 201)
    for round_ in range(20):
        firsts = [100_000 + 10_000 * (2 * round_ + i) for i in (0, 1)]  # exact in float32
        files = [append_file(tmp_path / f"r{round_}-{i}.npz", first, 500) for i, first in enumerate(firsts)]
        outcomes = together(*(["append", path, f] for f in files))
        pids = assert_appends_landed(path, outcomes, firsts, pids, 500)


def variant_file(path, features) -> str:
    np.save(path, features)
    return path


def test_two_variant_writes_at_once_never_mix(tmp_path):
    """Two `variants --add --overwrite` of one name: the variant is all of one file's rows (the other
    refused or replaced whole), never chunks of both; two different names both land."""
    path = tmp_path / "s.zarr"
    make_store(path, n_gallery=ROWS)
    first = variant_file(tmp_path / "v1.npy", np.full((ROWS, DIM), 1, np.float32))
    second = variant_file(tmp_path / "v2.npy", np.full((ROWS, DIM), 2, np.float32))
    outcomes = together(["variants", path, "--add", f"gallery:v={first}", "--overwrite"],
                        ["variants", path, "--add", f"gallery:v={second}", "--overwrite"])
    for proc in outcomes:
        if proc.returncode:
            assert_refused_by_lock(proc, path)
    fs = variant_set(open_store(path), "gallery", "v")
    values = np.unique(fs.features[:len(fs)])
    assert values.tolist() in ([1.0], [2.0]), values
    outcomes = together(["variants", path, "--add", f"gallery:w1={first}"],
                        ["variants", path, "--add", f"gallery:w2={second}"])
    landed = [name for name, proc in zip(("w1", "w2"), outcomes) if proc.returncode == 0]
    for proc in outcomes:
        if proc.returncode:
            assert_refused_by_lock(proc, path)
    for name, value in zip(("w1", "w2"), (1.0, 2.0)):
        if name in landed:
            fs = variant_set(open_store(path), "gallery", name)
            assert np.unique(fs.features[:len(fs)]).tolist() == [value]


@pytest.mark.slow
def test_two_updates_of_one_state_at_once(tmp_path):
    """Two updates of one state are one after the other: the first scores the appended rows, the
    second (waiting for it) finds nothing left to add, or is refused by the lock; the state left is
    whole and equals a full evaluation.  (About 10 s: two processes start the engine.)"""
    path, state = tmp_path / "s.zarr", tmp_path / "s.state"
    make_store(path)
    options = ["--no-gom", "--protocol", "none", "--workers", "1", "--quiet"]
    cli("eval", path, "--state", state, *options)
    streameval.append_gallery(path, *rows(500_000, 300))
    outputs = [tmp_path / f"u{i}.json" for i in (1, 2)]
    outcomes = together(*(["update", path, "--state", state, "--json", out, *options] for out in outputs))
    added = []
    for proc, out in zip(outcomes, outputs):
        if proc.returncode:
            assert_refused_by_lock(proc, state)
        else:
            added.append(json.loads(out.read_text())["run"]["update"]["rows_added"])
    assert sorted(added) in ([300], [0, 300]), added  # never both: the second read the first's state
    full = streameval.evaluate(str(path), protocol="none", no_gom=True, workers=1).to_dict()
    updated = streameval.update(str(path), str(state), workers=1).to_dict()
    for key in ("n_gallery", "mAP", "mINP", "cmc"):
        assert updated[key] == full[key]
    assert updated["run"]["update"]["rows_added"] == 0  # the state already covered every row


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def write_lock(target, pid: int, host: str | None = None, command: str = "streameval append old.npz") -> str:
    where = lock_path(target)
    with open(where, "w") as fh:
        json.dump({"pid": pid, "host": host or socket.gethostname(), "command": command,
                   "since": "2026-01-01 00:00:00 UTC", "creating": False}, fh)
    return where


def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    path = tmp_path / "s.zarr"
    make_store(path)
    pid = dead_pid()
    where = write_lock(path, pid)
    proc = command("append", path, append_file(tmp_path / "a.npz", 100_000))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert err.strip() == (f"note: took over the lock of '{path}' left by pid {pid} on host {socket.gethostname()}, "
                           "'streameval append old.npz', since 2026-01-01 00:00:00 UTC, which is no longer running")
    assert len(gallery(path)[1]) == 200 + ROWS
    assert not os.path.exists(where)


def test_a_held_lock_refuses_in_one_line_naming_the_holder(tmp_path):
    """A writer holding the lock (a real process): a second writer waits, then is refused naming it;
    the store is untouched."""
    path = tmp_path / "s.zarr"
    make_store(path)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom streameval.core.locking import writing\n"
                               "with writing(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(60)\n",
                               str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        started = time.monotonic()
        proc = command("append", path, append_file(tmp_path / "a.npz", 100_000), wait=0.5)
        out, err = proc.communicate(timeout=120)
        assert time.monotonic() - started >= 0.5
    finally:
        holder.kill()
        holder.wait()
    assert_refused_by_lock(subprocess.CompletedProcess(proc.args, proc.returncode, out, err), path)
    assert f"pid {holder.pid} on host" in err
    assert len(gallery(path)[1]) == 200


@pytest.mark.parametrize("who", ["running here", "on another host"])
def test_a_lock_file_naming_a_live_or_remote_writer_is_held(tmp_path, who):
    """A lock file nobody flocks but naming a process that may still write (on a file system whose
    flock does not reach us) is respected, and the message says how to clear it."""
    path = tmp_path / "s.zarr"
    make_store(path)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        host = None if who == "running here" else "elsewhere.example"
        where = write_lock(path, sleeper.pid, host)
        proc = command("append", path, append_file(tmp_path / "a.npz", 100_000), wait=0.2)
        out, err = proc.communicate(timeout=120)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert proc.returncode == 3 and err.count("\n") == 1, err
    assert err.startswith(f"error: '{path}' is being written by pid {sleeper.pid} on host "), err
    assert f"remove '{where}'" in err
    assert len(gallery(path)[1]) == 200


READER = """import sys, time
from streameval.store import open_store
store = open_store(sys.argv[1])
print('reading', flush=True)
time.sleep(60)
"""


def test_a_store_being_read_is_not_replaced(tmp_path):
    """convert --overwrite onto a store another process reads is refused; the reader's store stays whole."""
    path = tmp_path / "s.zarr"
    make_store(path)
    gf, gp, gc = rows(900_000, 50)
    np.savez(tmp_path / "new.npz", qf=gf[:5], q_pids=gp[:5], q_camids=gc[:5], gf=gf, g_pids=gp, g_camids=gc)
    reader = subprocess.Popen([sys.executable, "-c", READER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline() == "reading\n"
        proc = command("convert", tmp_path / "new.npz", path, "--overwrite", wait=0.3)
        out, err = proc.communicate(timeout=120)
    finally:
        reader.kill()
        reader.wait()
    assert proc.returncode == 3 and err.count("\n") == 1, err
    assert err.startswith(f"error: '{path}' is being read by another process"), err
    assert len(gallery(path)[1]) == 200  # untouched
    cli("convert", tmp_path / "new.npz", path, "--overwrite")  # nobody reads it now
    assert len(gallery(path)[1]) == 50


def test_a_store_being_created_is_not_read(tmp_path):
    """A reader of a store that another process is creating (convert, synth) waits, then is refused
    naming it, rather than reading half a store."""
    path = tmp_path / "s.zarr"
    make_store(path)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom streameval.core.locking import writing\n"
                               "with writing(sys.argv[1], creating=True):\n    print('held', flush=True)\n"
                               "    time.sleep(60)\n", str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        proc = command("validate", path, wait=0.3)
        out, err = proc.communicate(timeout=120)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 3 and err.count("\n") == 1, err
    assert err.startswith(f"error: '{path}' is being created or replaced by pid {holder.pid} on host "), err
    cli("validate", path)  # its holder gone, the store reads


# --------------------------------------------------------------------------- --overwrite: only a store


def test_overwrite_never_deletes_a_folder_that_is_not_a_store(tmp_path):
    np.savez(tmp_path / "f.npz", qf=rows(1, 5)[0], q_pids=rows(1, 5)[1], q_camids=rows(1, 5)[2],
             gf=rows(1, 20)[0], g_pids=rows(1, 20)[1], g_camids=rows(1, 20)[2])
    mydir = tmp_path / "mydir"
    mydir.mkdir()
    (mydir / "thesis.tex").write_text("\\chapter{One}\n")
    (mydir / "figures").mkdir()
    for args in (["convert", tmp_path / "f.npz", mydir, "--overwrite"],
                 ["synth", mydir, "--queries", 5, "--gallery", 20, "--dim", 4, "--overwrite", "-q"],
                 ["eval", tmp_path / "f.npz", "--convert-to", mydir, "--overwrite", "-q"]):
        line = one_error_line(cli(*args, code=2))
        assert line == (f"error: '{mydir}' is not a streameval store (it holds figures, thesis.tex); --overwrite "
                        "replaces only a store streameval wrote: choose another path, or move that away yourself")
    assert (mydir / "thesis.tex").read_text() == "\\chapter{One}\n" and (mydir / "figures").is_dir()
    with pytest.raises(OptionError, match="is not a streameval store"):
        streameval.write_store(mydir, *rows(1, 5), *rows(1, 20), overwrite=True)
    assert sorted(os.listdir(mydir)) == ["figures", "thesis.tex"]
    store = tmp_path / "s.zarr"  # a store streameval wrote is replaced
    cli("convert", tmp_path / "f.npz", store)
    cli("convert", tmp_path / "f.npz", store, "--overwrite")
    assert len(gallery(store)[1]) == 20


def test_overwrite_never_deletes_a_folder_that_is_not_ranked_lists(tmp_path):
    store, mine = tmp_path / "s.zarr", tmp_path / "mine.zarr"
    make_store(store)
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    args = ["eval", store, "--no-gom", "--workers", 1, "-q", "--ranked-list", 3, "--ranked-out", mine, "--overwrite"]
    line = one_error_line(cli(*args, code=2))
    assert line == (f"error: '{mine}' is not a streameval ranked-lists group (it holds notes.txt); --overwrite "
                    "replaces only a ranked-lists group streameval wrote: choose another path, or move that away "
                    "yourself")
    assert os.listdir(mine) == ["notes.txt"]
    os.remove(mine / "notes.txt")
    cli(*args)  # an empty folder, then the lists streameval wrote there, are replaced
    cli(*args)
    assert "zarr.json" in os.listdir(mine)
