"""The kNN cache (``--knn-cache DIR``, ``features.rerank.cache``): the kNN pass's lists saved once and
reused for any k up to the saved one; a request for more columns or another metric runs the pass
again; appended rows, another store and a damaged entry are refused (exit 3), never used; two
processes saving the same entry leave a whole one; a save that fails leaves the lists computed.

The lists saved are a brute-force float64 kNN over real stores (the cache keeps whatever the pass
gives; the brute force makes the lists round-tripped meaningful), and ``compute`` counts its calls:
a hit never runs the pass.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

from streameval.core.errors import OptionError, StoreWarning
from streameval.engine.neighbours import Neighbours
from streameval.features.rerank.cache import CacheError, cached_neighbours
from streameval.store import append_gallery, open_store, write_store

from test_hostile_state import fill, small_disk  # noqa: F401 (a fixture: a 4 MiB tmpfs)

NQ, NG, DIM = 6, 20, 4


def make_store(path, seed: int = 0, ng: int = NG):
    rng = np.random.default_rng(seed)
    values = np.array([-2, -1, 1, 2], np.float32)  # no zero row (cosine); few values: exact ties, settled by row
    qf, gf = rng.choice(values, (NQ, DIM)), rng.choice(values, (ng, DIM))
    gf[1] = qf[0]  # an exact duplicate across the sets
    pids = lambda n: rng.integers(1, 4, n)  # noqa: E731
    return write_store(path, qf, pids(NQ), rng.integers(0, 2, NQ), gf, pids(ng), rng.integers(0, 2, ng),
                       chunk_rows=8)


def brute_neighbours(store, k: int, metric: str) -> Neighbours:
    """Every U row's top k by (canonical distance, row), in float64, self at 0, and its farthest."""
    u = np.concatenate([store.query.features[:], store.gallery.features[:]]).astype(np.float64)
    dot, sq = u @ u.T, (u * u).sum(1)
    if metric == "cosine":
        d = 1 - dot / np.sqrt(np.outer(sq, sq))
    else:
        d = np.maximum(sq[:, None] + sq[None, :] - 2 * dot, 0.0)
    np.fill_diagonal(d, 0.0)
    index = np.argsort(d, axis=1, kind="stable")[:, :k]  # stable: equal distances by row
    return Neighbours(index.astype(np.int64), np.take_along_axis(d, index, 1), d.max(1), metric, refined=3)


class Pass:
    """``compute`` for the cache: the brute-force lists, counting how often it runs."""

    def __init__(self, store, k: int, metric: str = "cosine"):
        self.store, self.k, self.metric, self.calls = store, k, metric, 0

    def __call__(self) -> Neighbours:
        self.calls += 1
        return brute_neighbours(self.store, self.k, self.metric)


def lookup(directory, store, k: int, metric: str = "cosine"):
    """(lists, from the cache, pass runs) of one request."""
    compute = Pass(store, k, metric)
    neighbours, hit = cached_neighbours(directory, store, metric, np.float32, k, compute)
    return neighbours, hit, compute.calls


def assert_same(got: Neighbours, want: Neighbours) -> None:
    assert got.index.dtype == np.int64 and got.dist.dtype == np.float64 and got.farthest.dtype == np.float64
    np.testing.assert_array_equal(got.index, want.index)
    np.testing.assert_array_equal(got.dist, want.dist)
    np.testing.assert_array_equal(got.farthest, want.farthest)
    assert (got.metric, got.refined, got.k) == (want.metric, want.refined, want.k)


@pytest.fixture
def store(tmp_path):
    return make_store(tmp_path / "s.zarr")


# ---------------------------------------------------------------------------------------------- reuse


def test_saved_lists_are_reused_without_the_pass(tmp_path, store):
    cache = tmp_path / "cache"
    first, hit, calls = lookup(cache, store, 5)
    assert (hit, calls) == (False, 1)
    assert_same(first, brute_neighbours(store, 5, "cosine"))
    assert sorted(os.listdir(cache)) == ["knn-cosine.npz"]  # no temporary file, no lock left
    again, hit, calls = lookup(cache, store, 5)
    assert (hit, calls) == (True, 0)
    assert_same(again, first)
    _, hit, calls = lookup(cache, open_store(store.path), 5)  # another opening of the same store
    assert (hit, calls) == (True, 0)


def test_a_copy_of_the_store_is_the_same_store(tmp_path, store):
    cache = tmp_path / "cache"
    lookup(cache, store, 4)
    shutil.copytree(store.path, tmp_path / "copy.zarr")
    _, hit, calls = lookup(cache, open_store(tmp_path / "copy.zarr"), 4)
    assert (hit, calls) == (True, 0)


def test_fewer_columns_are_the_first_of_the_saved_lists(tmp_path, store):
    cache = tmp_path / "cache"
    lookup(cache, store, 6)
    for k in (1, 3, 6):
        got, hit, calls = lookup(cache, store, k)
        assert (hit, calls) == (True, 0)
        assert_same(got, brute_neighbours(store, k, "cosine"))
        assert got.index.flags.c_contiguous and got.dist.flags.c_contiguous


def test_more_columns_run_the_pass_and_replace_the_entry(tmp_path, store):
    cache = tmp_path / "cache"
    lookup(cache, store, 3)
    got, hit, calls = lookup(cache, store, 7)
    assert (hit, calls) == (False, 1)
    assert_same(got, brute_neighbours(store, 7, "cosine"))
    for k in (7, 3):
        got, hit, calls = lookup(cache, store, k)
        assert (hit, calls) == (True, 0)
        assert_same(got, brute_neighbours(store, k, "cosine"))
    assert sorted(os.listdir(cache)) == ["knn-cosine.npz"]


def test_another_metric_is_a_miss_kept_beside(tmp_path, store):
    cache = tmp_path / "cache"
    lookup(cache, store, 4, "cosine")
    got, hit, calls = lookup(cache, store, 4, "sqeuclidean")
    assert (hit, calls) == (False, 1)
    assert sorted(os.listdir(cache)) == ["knn-cosine.npz", "knn-sqeuclidean.npz"]
    for metric in ("cosine", "sqeuclidean"):
        got, hit, calls = lookup(cache, store, 4, metric)
        assert (hit, calls) == (True, 0)
        assert_same(got, brute_neighbours(store, 4, metric))


# -------------------------------------------------------------------------------------------- refused


def test_an_appended_store_is_refused(tmp_path, store):
    cache = tmp_path / "cache"
    lookup(cache, store, 4)
    saved = (cache / "knn-cosine.npz").read_bytes()
    rng = np.random.default_rng(5)
    grown = append_gallery(store.path, rng.choice(np.float32([-1, 1]), (5, DIM)), np.full(5, 1), np.zeros(5, int))
    compute = Pass(grown, 4)
    message = (f"the kNN cache '{cache}' holds lists of {NQ + NG} rows, but '{grown.path}' now has {NQ + NG + 5} "
               "(gallery rows were appended since): appended rows change every neighbour list and row maximum, so the "
               f"cached lists cannot be reused; remove '{cache}' or pass another --knn-cache directory")
    for k in (2, 4, 8):  # whatever is asked: fewer columns, as many, more
        with pytest.raises(CacheError, match=re.escape(message)) as refused:
            cached_neighbours(cache, grown, "cosine", np.float32, k, compute)
        assert refused.value.exit_code == 3
    with pytest.raises(CacheError, match="appended"):  # another metric's entry too: the directory is stale
        cached_neighbours(cache, grown, "sqeuclidean", np.float32, 4, Pass(grown, 4, "sqeuclidean"))
    assert compute.calls == 0 and (cache / "knn-cosine.npz").read_bytes() == saved


def test_another_store_is_refused_and_its_lists_kept(tmp_path, store):
    cache = tmp_path / "cache"
    lookup(cache, store, 4)
    saved = (cache / "knn-cosine.npz").read_bytes()
    for other in (make_store(tmp_path / "other.zarr", seed=1),  # other features, as many rows
                  make_store(tmp_path / "more.zarr", seed=0, ng=NG + 3)):  # not the first rows of this store
        for metric in ("cosine", "sqeuclidean"):
            compute = Pass(other, 4, metric)
            with pytest.raises(CacheError, match=re.escape(
                    f"the kNN cache '{cache}' holds lists of another store ('knn-cosine.npz' was made from "
                    f"'{store.path}', {NQ} queries + {NG} gallery rows), not of '{other.path}'")) as refused:
                cached_neighbours(cache, other, metric, np.float32, 4, compute)
            assert "a cache directory serves one store: pass another --knn-cache directory" in str(refused.value)
            assert compute.calls == 0
    assert sorted(os.listdir(cache)) == ["knn-cosine.npz"] and (cache / "knn-cosine.npz").read_bytes() == saved


def rewrite(entry, **edits) -> None:
    """Save the entry again with members replaced (``None``: left out), the header as it was unless given."""
    with np.load(entry) as members:
        content = {key: members[key] for key in members.files}
    for key, value in edits.items():
        if value is None:
            content.pop(key)
        else:
            content[key] = value
    with open(entry, "wb") as fh:
        np.savez(fh, **content)


def edited_header(entry, **fields) -> np.ndarray:
    with np.load(entry) as members:
        header = json.loads(members["header"].tobytes())
    header.update(fields)
    return np.frombuffer(json.dumps(header).encode(), np.uint8)


def flip_a_byte_of_dist(entry) -> None:
    data = bytearray(entry.read_bytes())
    with np.load(entry) as members:
        at = data.index(members["dist"].tobytes()[:64]) + 40
    data[at] ^= 0x10
    entry.write_bytes(bytes(data))


DAMAGE = {
    "a flipped byte": (flip_a_byte_of_dist, r"cannot be read: BadZipFile: Bad CRC-32"),
    "truncated": (lambda entry: os.truncate(entry, entry.stat().st_size // 2), r"cannot be read: "),
    "not a zip": (lambda entry: entry.write_text("hello"), r"cannot be read: "),
    "an array edited": (lambda entry: rewrite(entry, dist=np.load(entry)["dist"] + 1e-12),
                        r"array dist does not match its checksum"),
    "the header edited": (lambda entry: rewrite(entry, header=edited_header(entry, refined=0)),
                          r"the header does not match its checksum"),
    "an array missing": (lambda entry: rewrite(entry, farthest=None), r"member 'farthest' is missing"),
    "fewer rows": (lambda entry: rewrite(entry, index=np.load(entry)["index"][:-1]),
                   r"index is int64 \(25, 4\), expected int64 \(26, 4\)"),
    "another schema": (lambda entry: rewrite(entry, header=edited_header(entry, streameval_knn=2)),
                       r"schema 2, expected 1"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_entry_is_refused(tmp_path, store, damage):
    cache = tmp_path / "cache"
    entry = cache / "knn-cosine.npz"
    lookup(cache, store, 4)
    spoil, problem = DAMAGE[damage]
    spoil(entry)
    spoilt = entry.read_bytes()
    compute = Pass(store, 3)
    damaged = rf"^the kNN cache entry '{re.escape(str(entry))}' is damaged \({problem}"
    with pytest.raises(CacheError, match=damaged) as refused:
        cached_neighbours(cache, store, "cosine", np.float32, 3, compute)
    assert str(refused.value).endswith("; remove it (the lists are computed again) or pass another --knn-cache "
                                       "directory")
    assert "\n" not in str(refused.value)
    assert compute.calls == 0 and entry.read_bytes() == spoilt  # never used, never replaced behind the user's back
    entry.unlink()
    _, hit, calls = lookup(cache, store, 3)  # removed, as the message says: computed again
    assert (hit, calls) == (False, 1)


def test_an_entry_renamed_to_another_metric_is_refused(tmp_path, store):
    cache = tmp_path / "cache"
    lookup(cache, store, 4, "sqeuclidean")
    os.rename(cache / "knn-sqeuclidean.npz", cache / "knn-cosine.npz")
    compute = Pass(store, 4)
    with pytest.raises(CacheError, match=re.escape(
            "is damaged (it holds the lists of metric 'sqeuclidean', not of 'cosine')")):
        cached_neighbours(cache, store, "cosine", np.float32, 4, compute)
    assert compute.calls == 0


def test_a_cache_path_that_cannot_be_a_directory_is_refused_before_the_pass(tmp_path, store):
    compute = Pass(store, 3)
    (tmp_path / "file").write_text("mine")
    with pytest.raises(OptionError, match="is a file, not a directory"):
        cached_neighbours(tmp_path / "file", store, "cosine", np.float32, 3, compute)
    with pytest.raises(OptionError, match="does not exist"):
        cached_neighbours(tmp_path / "no" / "cache", store, "cosine", np.float32, 3, compute)
    assert compute.calls == 0 and (tmp_path / "file").read_text() == "mine"


def test_other_files_in_the_directory_are_left_alone(tmp_path, store):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "notes.txt").write_text("mine")
    lookup(cache, store, 3)
    assert sorted(os.listdir(cache)) == ["knn-cosine.npz", "notes.txt"] and (cache / "notes.txt").read_text() == "mine"


# ------------------------------------------------------------------------------------------- writers


WRITER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from streameval.engine.neighbours import Neighbours
    from streameval.features.rerank.cache import cached_neighbours
    from streameval.store import open_store
    store_path, cache, lists, started, wait_for = sys.argv[1:]
    def compute():  # the lists the parent computed, once wait_for exists
        open(started, "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(wait_for) and time.monotonic() < deadline:
            time.sleep(0.01)
        with np.load(lists) as saved:
            return Neighbours(saved["index"], saved["dist"], saved["farthest"], "cosine", 3)
    k = np.load(lists)["index"].shape[1]
    neighbours, hit = cached_neighbours(cache, open_store(store_path), "cosine", np.float32, k, compute)
    print(hit, neighbours.k)
""")


def writers(tmp_path, store, cache, ks, waits) -> list[str]:
    """Two real processes asking ``cache`` for k = ``ks``; each one's pass starts, then waits for
    the path ``waits`` names (``started i``: once process i's pass has started; ``entry``: once
    the entry exists) and saves; what each printed."""
    started = [tmp_path / f"started-{cache.name}-{i}" for i in range(2)]
    paths = {"started 0": started[0], "started 1": started[1], "entry": cache / "knn-cosine.npz"}
    processes = []
    for i, (k, wait) in enumerate(zip(ks, waits)):
        lists = tmp_path / f"lists-{k}.npz"
        want = brute_neighbours(store, k, "cosine")
        np.savez(lists, index=want.index, dist=want.dist, farthest=want.farthest)
        processes.append(subprocess.Popen([sys.executable, "-c", WRITER, store.path, str(cache), str(lists),
                                           str(started[i]), str(paths[wait])],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [process.communicate(timeout=120) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    assert all(err == "" for _, err in outputs), outputs  # no warning: both saves went through
    assert sorted(os.listdir(cache)) == ["knn-cosine.npz"]  # no temporary file, no lock left
    return [out.strip() for out, _ in outputs]


def test_two_processes_saving_the_same_entry_leave_a_whole_one(tmp_path, store):
    cache = tmp_path / "same"
    # both looked (a miss) before either saves: both save, one after the other under the lock
    assert writers(tmp_path, store, cache, (5, 5), ("started 1", "started 0")) == ["False 5", "False 5"]
    got, hit, calls = lookup(cache, store, 5)
    assert (hit, calls) == (True, 0)
    assert_same(got, brute_neighbours(store, 5, "cosine"))


def test_fewer_columns_saved_later_never_replace_more(tmp_path, store):
    cache = tmp_path / "more"
    # process 1 (k = 3) looked before process 0 (k = 6) saved, and saves after it: the 6 columns stay
    assert writers(tmp_path, store, cache, (6, 3), ("started 1", "entry")) == ["False 6", "False 3"]
    for k in (6, 3):
        got, hit, calls = lookup(cache, store, k)
        assert (hit, calls) == (True, 0)
        assert_same(got, brute_neighbours(store, k, "cosine"))


def test_a_save_that_fails_warns_and_keeps_the_lists(tmp_path, small_disk):  # noqa: F811
    store = make_store(tmp_path / "s.zarr")
    cache = small_disk / "cache"
    cache.mkdir()
    filler = fill(small_disk, leave=512)  # smaller than an entry
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, hit, calls = lookup(cache, store, 4)
    assert (hit, calls) == (False, 1)
    assert_same(got, brute_neighbours(store, 4, "cosine"))
    assert [(w.category, str(w.message)) for w in caught] == [
        (StoreWarning, f"the kNN lists were not saved in the cache '{cache}': No space left on device")]
    assert os.listdir(cache) == []  # no partial entry, no temporary file
    filler.unlink()
    _, hit, calls = lookup(cache, store, 4)
    assert (hit, calls) == (False, 1)
