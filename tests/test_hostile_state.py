"""Hostile saved states (issue 10): what a fuzz of saved states found, each case refused or recovered.

Every bad state ends as exactly one ``error:`` line and exit 3 from the command line - never a
traceback, never numbers other than a full evaluation's - and nothing committed is lost:

1. an unfinished state (a first ``eval --state`` killed or out of space) is replaced by the next
   ``eval --state``; a directory holding anything else is still refused;
2. a deleted or garbled chunk, or an edited attribute, fails its checksum;
3. a malformed state (CURRENT, attribute types, options that make no updatable settings, array
   shapes other than the statistics' fields say, unsorted positives, forged dedup lists) fails the
   structural check;
4. a gallery edited in place behind streameval's back is noticed (every chunk is fingerprinted);
5. a full disk while saving leaves the previous state live.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

import streameval
from streameval.cli import main
from streameval.run.statestore import POINTER, load_state
from streameval.store import open_group
from streameval.features.dedup.statistic import EMPTY

from test_incremental import comparable, make_store, random_rows

STREAMEVAL = os.path.join(os.path.dirname(sys.executable), "streameval")


def command(*args, process: bool = False) -> tuple[int, str]:
    """Exit code and standard error of ``streameval ARGS``, in a real process or in this one."""
    args = [str(a) for a in args]
    if process:
        done = subprocess.run([STREAMEVAL, *args], capture_output=True, text=True, timeout=120)
        return done.returncode, done.stderr
    result = CliRunner().invoke(main, args)
    return result.exit_code, result.stderr


def assert_refused(*args, match: str, process: bool = False) -> str:
    """The command ends with exit 3 and exactly one ``error:`` line matching ``match``."""
    code, stderr = command(*args, "-q", process=process)
    assert code == 3, stderr
    assert stderr.startswith("error: ") and stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert re.search(match, stderr), stderr
    return stderr


def version_dir(state) -> Path:
    return Path(state) / (Path(state) / POINTER).read_text().strip()


def chunk_files(state, key: str) -> list[Path]:
    return sorted(p for p in (version_dir(state) / key / "c").rglob("*") if p.is_file())


def edit_attributes(state, edit) -> None:
    """Edit the live version's attributes in its zarr.json, as a hand or a fuzzer would."""
    meta = version_dir(state) / "zarr.json"
    document = json.loads(meta.read_text())
    edit(document["attributes"])
    meta.write_text(json.dumps(document))


def rewrite_array(state, key: str, data) -> None:
    zarr.open_group(version_dir(state), mode="r+").create_array(key, data=np.asarray(data), overwrite=True)


def assert_same_state(a, b) -> None:
    assert (a.version, a.covers, a.options) == (b.version, b.covers, b.options)
    for name in a.query_state.positives.__dataclass_fields__:
        np.testing.assert_array_equal(getattr(a.query_state.positives, name), getattr(b.query_state.positives, name))
    assert sorted(a.query_state.stats.arrays) == sorted(b.query_state.stats.arrays)
    for key, data in a.query_state.stats.arrays.items():
        np.testing.assert_array_equal(data, b.query_state.stats.arrays[key])
    assert a.query_state.dist_range == b.query_state.dist_range


def save_and_append(tmp_path, **options):
    """A store with a saved state, then 30 rows appended (some positives): ``update`` has work to do."""
    store, rng, query = make_store(tmp_path)
    state = tmp_path / "state"
    streameval.evaluate(store, state=state, **options)
    streameval.append_gallery(store, *random_rows(rng, 30, np.r_[np.zeros(25, int), query[1][:5]]))
    return store, state


@pytest.fixture
def saved(tmp_path):
    return save_and_append(tmp_path)


@pytest.fixture
def saved_dedup(tmp_path):
    """The same with an identity-dedup CMC: lists of up to max_rank = 4 identities per query."""
    return save_and_append(tmp_path, cmc="identity-dedup", max_rank=4)


# --------------------------------------------------------------------------- 1. unfinished states


KILLED_DURING_SAVE = textwrap.dedent("""
    import os, signal, sys
    import streameval, streameval.run.statestore
    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)
    streameval.run.statestore._sync_tree = die  # the version is written; CURRENT is not
    streameval.evaluate(sys.argv[1], state=sys.argv[2])
""")


def test_a_first_eval_killed_during_save_is_replaced_by_the_next(tmp_path):
    store, _, _ = make_store(tmp_path)
    state = tmp_path / "state"
    done = subprocess.run([sys.executable, "-c", KILLED_DURING_SAVE, store, state], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert os.listdir(state) == ["v000001.zarr"]  # unfinished: no CURRENT
    # the killed writer's lock is taken over, and says so, once
    code, stderr = command("update", store, "--state", state, "-q")
    note, error = stderr.splitlines()
    assert note.startswith(f"note: took over the lock of '{state}' left by pid ") and \
        note.endswith("which is no longer running"), stderr
    assert code == 3 and re.match(r"error: the state at .* was never completed .*; make it again", error), stderr
    assert_refused("update", store, "--state", state, match=r"the state at .* was never completed .*; make it again")
    code, stderr = command("eval", store, "--state", state, "-q", process=True)  # no --overwrite needed
    assert code == 0, stderr
    assert sorted(os.listdir(state)) == [POINTER, "v000001.zarr"]
    streameval.append_gallery(store, *random_rows(np.random.default_rng(1), 10, np.zeros(10, int)))
    assert comparable(streameval.update(store, state)) == comparable(streameval.evaluate(store))


@pytest.mark.parametrize("leftovers", [["v000001.zarr", "CURRENT.tmp"], ["v000003.zarr", "v000004.zarr"], ["CURRENT.tmp"]])
def test_any_unfinished_state_is_replaced_without_overwrite(tmp_path, leftovers):
    store, _, _ = make_store(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    for name in leftovers:  # as a write killed at another moment leaves them
        if name.endswith(".zarr"):
            zarr.open_group(state / name, mode="w").create_array("positives/offsets", shape=(3,), dtype=np.int64)
        else:
            (state / name).write_text("v000001.zarr\n")
    streameval.evaluate(store, state=state)
    assert sorted(os.listdir(state)) == [POINTER, "v000001.zarr"]
    assert load_state(state).covers["gallery_rows"] == 300


@pytest.mark.parametrize("intruder", ["notes.txt", "v1.zarr", "link"])
def test_a_directory_with_anything_else_is_still_refused(tmp_path, intruder):
    store, _, _ = make_store(tmp_path)
    state = tmp_path / "state"
    zarr.open_group(state / "v000001.zarr", mode="w")  # a leftover of ours...
    if intruder == "link":  # ... beside a version directory that is a link (versions never are)
        (tmp_path / "elsewhere").mkdir()
        (state / "v000002.zarr").symlink_to(tmp_path / "elsewhere")
    else:
        (state / intruder).write_text("keep me")  # ... beside something a user wrote
    before = sorted(os.listdir(state))
    for overwrite in ([], ["--overwrite"]):
        assert_refused("eval", store, "--state", state, *overwrite, match="exists and is not a streameval state")
    assert sorted(os.listdir(state)) == before
    assert (tmp_path / "elsewhere").is_dir() if intruder == "link" else (state / intruder).read_text() == "keep me"


# ------------------------------------------------------------------------------------- 2. checksums


@pytest.mark.parametrize("key", ["positives/offsets", "positives/dist", "positives/gidx", "positives/bits",
                                 "positives/junk", "stats/slots/counts", "stats/gom/hist"])
def test_a_deleted_chunk_is_refused(saved, key):
    store, state = saved
    chunk_files(state, key)[0].unlink()  # zarr would read zeros in its place
    assert_refused("update", store, "--state", state, match=rf"the state at .* is damaged \(.*{key}.*\); run a full")


def test_a_deleted_chunk_of_dedup_lists_is_refused(saved_dedup):
    store, state = saved_dedup
    chunk_files(state, "stats/dedup/held")[0].unlink()
    assert_refused("update", store, "--state", state, match=r"damaged \(stats/dedup/held lists a pid twice")


@pytest.mark.parametrize("key", ["positives/dist", "stats/gom/hist"])
@pytest.mark.parametrize("damage", ["garbage", "one bit"])
def test_a_garbled_chunk_fails_its_crc32c(saved, key, damage):
    store, state = saved
    chunk = chunk_files(state, key)[0]
    data = bytearray(chunk.read_bytes())
    if damage == "garbage":
        data = bytearray(np.random.default_rng(0).integers(0, 256, len(data), dtype=np.uint8).tobytes())
    else:  # the compressed payload only: it may still decompress, the crc32c catches it
        data[len(data) // 2] ^= 0x10
    chunk.write_bytes(bytes(data))
    # a real process: a failed chunk read must not leave asyncio complaining on stderr at exit
    assert_refused("update", store, "--state", state, match=rf"damaged \({key} cannot be read: .*checksum",
                   process=damage == "garbage")


def widen_range(attrs):
    attrs["dist_range"][0][1] += 1.0


def count_more_rows(attrs):  # update would then score only the last 20 of the 30 new rows
    attrs["covers"]["gallery_rows"] += 10


def shrink_b(attrs):  # a report option, taken from the state by update
    attrs["options"]["gom_b"] = 5


@pytest.mark.parametrize("edit, attribute", [(widen_range, "dist_range"), (count_more_rows, "covers"),
                                             (shrink_b, "options")])
def test_an_edited_attribute_fails_its_checksum(saved, edit, attribute):
    store, state = saved
    edit_attributes(state, edit)
    assert_refused("update", store, "--state", state,
                   match=rf"damaged \(attribute {attribute} does not match its checksum\); run a full 'streameval eval --state'")


# --------------------------------------------------------------------------------- 3. malformed states


def test_binary_garbage_in_current_is_refused(saved):
    store, state = saved
    (state / POINTER).write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    assert_refused("update", store, "--state", state, match=r"damaged \(CURRENT cannot be read as a version name")


@pytest.mark.parametrize("pointer", ["../elsewhere", "ABSOLUTE", ".", "", "v1.zarr", "v000001.zarr/../v000001.zarr",
                                     "v0000001.zarr", "v000001.zarr/"])
def test_current_naming_anything_but_a_version_is_refused(saved, tmp_path, pointer):
    store, state = saved
    shutil.copytree(version_dir(state), tmp_path / "elsewhere")  # a readable state outside the directory
    pointer = str(tmp_path / "elsewhere") if pointer == "ABSOLUTE" else pointer
    (state / POINTER).write_text(pointer + "\n")
    assert_refused("update", store, "--state", state, match=r"damaged \(CURRENT holds .*, not a version name")


def test_a_linked_version_directory_is_refused(saved, tmp_path):
    store, state = saved
    live = version_dir(state)
    shutil.move(live, tmp_path / "moved.zarr")
    live.symlink_to(tmp_path / "moved.zarr")
    assert_refused("update", store, "--state", state, match=r"damaged \(CURRENT names v000001.zarr, which is not a version "
                                                            r"directory \(versions are never links\)\)")
    assert_refused("eval", store, "--state", state, "--overwrite", match="not a streameval state")  # not ours to remove
    assert (tmp_path / "moved.zarr" / "zarr.json").exists()


@pytest.mark.parametrize("edit, problem", [
    (lambda a: a.update(covers=list(a["covers"])), r"attribute covers is \[.*, not a mapping"),
    (lambda a: a["covers"].update(gallery_rows="300"), r"attribute covers.gallery_rows is '300', expected a positive integer"),
    (lambda a: a["covers"].update(n_queries=True), r"attribute covers.n_queries is True, expected a positive integer"),
    (lambda a: a["covers"].update(settings="minmax"), r"attribute covers.settings is 'minmax', expected a mapping"),
    (lambda a: a["covers"]["settings"]["gom"].update(bins=-1), "attribute covers.settings does not match attribute options"),
    (lambda a: a["options"].update(gom_bins=50), r"attribute covers.settings does not match attribute options"),
    (lambda a: a["dist_range"].append([0.0, 2.0]), r"attribute dist_range is \[.*\], expected per trial \(1\) \[min, max"),
    (lambda a: a.update(dist_range=[[3.0, 1.0]]), r"attribute dist_range is \[\[3.0, 1.0\]\], expected per trial"),
    (lambda a: a.update(dist_range=[0.0, 3.0]), r"attribute dist_range is \[0.0, 3.0\], expected per trial"),  # schema 2's
    (lambda a: a.pop("dist_range"), r"attribute dist_range is missing"),
    (lambda a: a["options"].pop("gom_b"), r"attribute options has keys \[.*\], expected \[.*'gom_b'"),
    (lambda a: a["options"].update(colour="red"), r"attribute options has keys"),
    (lambda a: a["options"].update(metric=""), r"attribute options.metric is '', expected a non-empty string"),
    (lambda a: a["options"].update(protocol="market"), r"attribute options.protocol is 'market', expected a mapping"),
    (lambda a: a["options"]["protocol"].update(junk_pids="-1"),
     r"attribute options make no settings a state can hold \(OptionError: junk_pids must be a list, got '-1'\)"),
    (lambda a: a["options"]["protocol"].update(cmc="shortest"), r"attribute options make no settings .*cmc must be one of"),
    (lambda a: a["options"]["protocol"].update(trials={"count": 2}, draw_version=1),
     r"attribute options make no settings a state can hold \(OptionError: protocol 'market' keeps no state .*trials"),
    (lambda a: a.pop("checksums"), r"attribute checksums is None, not a mapping"),
    (lambda a: a["checksums"].pop("stats/slots/counts"),
     r"attribute checksums has keys \[.*\], expected \[.*'stats/slots/counts'"),
    (lambda a: a.update(streameval_state=1), r"holds a state of another schema \(1, expected 3\); make a new one"),
    (lambda a: a.update(streameval_state=2), r"holds a state of another schema \(2, expected 3\); make a new one"),
])
def test_attributes_of_the_wrong_type_are_refused(saved, edit, problem):
    store, state = saved
    edit_attributes(state, edit)
    assert_refused("update", store, "--state", state, match=problem)


def offsets(state):
    return zarr.open_group(version_dir(state), mode="r")["positives/offsets"][:]


def stored(state, key):
    return zarr.open_group(version_dir(state), mode="r")[key][:]


def n_positives(state) -> int:
    return int(offsets(state)[-1])


@pytest.mark.parametrize("key, change, problem", [
    ("positives/offsets", lambda s: offsets(s)[:-1], r"positives/offsets must be n_queries \+ 1 = 21 entries from 0"),
    ("positives/offsets", lambda s: offsets(s) + 1, "positives/offsets must be .* from 0"),
    ("positives/offsets", lambda s: np.r_[0, offsets(s)[-1] + 1, offsets(s)[2:]], "never decreasing"),
    ("positives/offsets", lambda s: np.r_[offsets(s)[:-1], offsets(s)[-1] + 1],
     "positives/offsets ends at .* but positives/dist holds"),
    ("positives/offsets", lambda s: offsets(s).astype(np.float64), "positives/offsets is 1-D float64, expected 1-D int64"),
    ("positives/gidx", lambda s: np.zeros(n_positives(s) + 1, np.int64), "positives/offsets ends at .* but positives/gidx"),
    ("positives/bits", lambda s: np.zeros(n_positives(s), np.int64), "positives/bits is 1-D int64, expected 1-D uint64"),
    ("positives/bits", lambda s: np.full(n_positives(s), 3, np.uint64), "positives/bits marks trials beyond the protocol's"),
    ("stats/slots/counts", lambda s: np.zeros((n_positives(s) - 1, 1), np.int64),
     "positives/offsets ends at .* but stats/slots/counts holds"),
    ("stats/slots/counts", lambda s: np.zeros(n_positives(s), np.int64), "stats/slots/counts is 1-D int64, expected 2-D"),
    ("stats/slots/counts", lambda s: np.zeros((n_positives(s), 2), np.int64),
     r"stats/slots/counts has shape \(\d+, 2\), expected \(\d+, 1\) \(a row per positive\)"),
    ("positives/junk", lambda s: np.zeros(20, np.int64), "positives/junk is 1-D int64, expected 2-D int64"),
    ("positives/junk", lambda s: np.zeros((19, 1), np.int64), r"positives/junk has shape \(19, 1\), expected \(20, 1\)"),
    ("stats/gom/hist", lambda s: np.zeros((20, 1, 101), np.int64),
     r"stats/gom/hist has shape \(20, 1, 101\), expected \(20, 1, 102\) \(a row per query\)"),
    ("stats/gom/hist", lambda s: np.zeros((20, 102), np.int64), "stats/gom/hist is 2-D int64, expected 3-D int64"),
    ("stats/gom/clipped", lambda s: np.zeros((20, 3), np.int64), r"stats/gom/clipped has shape \(20, 3\), expected \(20, 0"),
    ("positives/gidx", lambda s: np.full(n_positives(s), 300, np.int64), r"gallery rows outside \[0, 300\)"),
    ("positives/dist", lambda s: np.full(n_positives(s), np.nan), "non-finite distances"),
    ("positives/dist", lambda s: np.sort(stored(s, "positives/dist"))[::-1].copy(),
     r"not sorted by \(distance, gallery row\) within each query"),
    ("positives/junk", lambda s: np.full((20, 1), -1, np.int64), "positives/junk holds negative counts"),
    ("stats/slots/counts", lambda s: np.full((n_positives(s), 1), -1, np.int64), "stats/slots/counts holds negative"),
    ("stats/gom/hist", lambda s: -stored(s, "stats/gom/hist"), "stats/gom/hist holds negative counts"),
])
def test_arrays_of_the_wrong_shape_are_refused(saved, key, change, problem):
    store, state = saved
    rewrite_array(state, key, change(state))
    assert_refused("update", store, "--state", state, match=rf"damaged \(.*{problem}")


def held_with(state, edit):
    """The dedup lists, edited: ``edit(held)`` changes query 0's list of trial 0 in place."""
    held = stored(state, "stats/dedup/held")
    edit(held[0, 0])
    return held


@pytest.mark.parametrize("change, problem", [
    (lambda s: held_with(s, lambda row: row.__setitem__(slice(None), [5, EMPTY, 7, EMPTY])),
     "stats/dedup/held has a pid after a free place"),
    (lambda s: held_with(s, lambda row: row.__setitem__(slice(None), [5, 5, EMPTY, EMPTY])),
     "stats/dedup/held lists a pid twice for one query and trial"),
    (lambda s: np.full((20, 1, 5), EMPTY, np.int64), r"stats/dedup/held has shape \(20, 1, 5\), expected \(20, 1, 4\)"),
    (lambda s: np.full((20, 4), EMPTY, np.int64), "stats/dedup/held is 2-D int64, expected 3-D int64"),
])
def test_forged_dedup_lists_are_refused(saved_dedup, change, problem):
    store, state = saved_dedup
    rewrite_array(state, "stats/dedup/held", change(state))
    assert_refused("update", store, "--state", state, match=rf"damaged \({problem}")


def test_a_dedup_state_without_its_lists_is_refused(saved_dedup):
    store, state = saved_dedup
    shutil.rmtree(version_dir(state) / "stats" / "dedup")
    assert_refused("update", store, "--state", state, match=r"damaged \(stats/dedup/held is missing\)")


def test_a_missing_array_is_refused(saved):
    store, state = saved
    shutil.rmtree(version_dir(state) / "stats" / "slots" / "counts")
    assert_refused("update", store, "--state", state, match=r"damaged \(stats/slots/counts is missing\)")


# --------------------------------------------------------------------- 4. stores changed behind our back


@pytest.mark.parametrize("edit", ["relabel a pid", "rewrite a feature row"])
def test_a_gallery_edited_in_place_is_refused(saved, edit):
    store, state = saved
    gallery = open_group(store, mode="r+")["gallery"]
    if edit == "relabel a pid":  # row 100: in the middle of the second chunk, between the rows a sample would take
        gallery["pids"][100] = gallery["pids"][100] + 1
    else:
        gallery["features"][130] = gallery["features"][130] + 1
    assert_refused("update", store, "--state", state, match=r"the gallery of .* was rewritten since the state")


def test_appends_still_update_and_equal_a_full_evaluation(tmp_path):
    store, rng, query = make_store(tmp_path)  # 300 rows in chunks of 64: the last chunk is partial
    state = tmp_path / "state"
    streameval.evaluate(store, state=state)
    for n in (10, 50, 1):  # fills the partial chunk, crosses a chunk boundary, one row
        streameval.append_gallery(store, *random_rows(rng, n, rng.choice(np.r_[0, query[1]], n)))
        assert comparable(streameval.update(store, state)) == comparable(streameval.evaluate(store))


# ------------------------------------------------------------------------------------ 5. a full disk


@pytest.fixture
def small_disk(tmp_path):
    """A real file system that fills up: a 4 MiB tmpfs mounted for the test (needs root)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = shutil.which("mount")
    mounted = subprocess.run([mount, "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True,
                             text=True) if mount else None
    if mounted is None or mounted.returncode:
        pytest.skip("cannot mount a tmpfs to fill up (needs root and mount): "
                    + (mounted.stderr.strip() if mounted else "no mount command"))
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def fill(disk: Path, leave: int) -> Path:
    """Fill ``disk`` to the last byte, then free ``leave`` bytes: a write bigger than that fails."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(bytes(1 << 16))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    os.truncate(filler, filler.stat().st_size - leave)
    return filler


def test_a_full_disk_during_update_keeps_the_previous_state(tmp_path, small_disk):
    store, rng, query = make_store(tmp_path)
    state = small_disk / "state"
    streameval.evaluate(store, state=state)
    before, pointer = load_state(state), (state / POINTER).read_text()
    streameval.append_gallery(store, *random_rows(rng, 30, np.r_[np.zeros(25, int), query[1][:5]]))
    filler = fill(small_disk, leave=8 << 10)  # room for a file or two of the new version
    assert_refused("update", store, "--state", state, process=True,
                   match=re.escape(f"cannot save the state at '{state}': No space left on device; the previous state is kept"))
    assert (state / POINTER).read_text() == pointer and sorted(os.listdir(state)) == [POINTER, "v000001.zarr"]
    assert_same_state(load_state(state), before)
    filler.unlink()
    assert comparable(streameval.update(store, state)) == comparable(streameval.evaluate(store))


def test_a_full_disk_during_the_first_save_leaves_nothing_behind(tmp_path, small_disk):
    store, _, _ = make_store(tmp_path)
    state = small_disk / "state"
    filler = fill(small_disk, leave=8 << 10)
    assert_refused("eval", store, "--state", state, process=True,
                   match=re.escape(f"cannot save the state at '{state}': No space left on device; no state was saved"))
    assert not state.exists() or os.listdir(state) == []
    filler.unlink()
    code, stderr = command("eval", store, "--state", state, "-q")  # no --overwrite: nothing was there
    assert code == 0, stderr
    assert load_state(state).covers["gallery_rows"] == 300
