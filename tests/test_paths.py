"""Image paths in a store (``query/paths``, ``gallery/paths``): round trips, what is refused, damage,
appends that must bring the new rows' paths, and ``synth --images``."""

from __future__ import annotations

import os

import numpy as np
import pytest
import zarr
from matplotlib import image as mpimage

import streameval
from streameval import OptionError, StoreError, append_gallery, open_store, write_store
from streameval.store import open_group, read_ids, read_rows
from streameval.store.paths import read_paths, write_paths
from streameval.tools import synth
from streameval.tools.synth import GROUP_SIZE, IMAGE_HEIGHT, IMAGE_WIDTH

from cli_checks import cli, one_error_line

CHUNK = 4


def make_store(path, n_query=6, n_gallery=10, seed=0):
    rng = np.random.default_rng(seed)
    return write_store(path, rng.standard_normal((n_query, 3), dtype=np.float32), rng.integers(1, 4, n_query),
                       rng.integers(0, 2, n_query), rng.standard_normal((n_gallery, 3), dtype=np.float32),
                       rng.integers(1, 4, n_gallery), rng.integers(0, 2, n_gallery), chunk_rows=CHUNK)


def names(prefix, n, start=0):
    return [f"{prefix}/ü {i:03d}.png" for i in range(start, start + n)]


@pytest.fixture
def store(tmp_path):
    make_store(tmp_path / "s.zarr")
    write_paths(tmp_path / "s.zarr", "query", names("q", 6))
    write_paths(tmp_path / "s.zarr", "gallery", names("g", 10))
    return tmp_path / "s.zarr"


def test_paths_round_trip_by_slice_and_by_rows_in_the_order_asked(store):
    opened = open_store(store)
    assert read_paths(opened, "gallery", slice(None)) == names("g", 10)
    assert read_paths(opened, "gallery", slice(3, 9)) == names("g", 10)[3:9]  # across chunk boundaries
    assert read_paths(opened, "gallery", np.array([9, 0, 4, 4])) == [names("g", 10)[i] for i in (9, 0, 4, 4)]
    assert read_paths(opened, "query", [5]) == ["q/ü 005.png"]
    arr = open_group(str(store), mode="r")["gallery/paths"]
    assert arr.chunks == (CHUNK,) and arr.dtype.kind == "T"  # chunked like the rows, variable-length strings


def test_a_store_without_paths_answers_none_and_paths_change_no_number(tmp_path, store):
    bare = make_store(tmp_path / "bare.zarr")
    assert read_paths(bare, "query", slice(None)) is None
    streameval.validate_values(open_store(store))
    assert (streameval.evaluate(str(store), no_gom=True).to_dict()["cmc"]
            == streameval.evaluate(str(tmp_path / "bare.zarr"), no_gom=True).to_dict()["cmc"])


@pytest.mark.parametrize("paths, says", [
    (names("g", 9), "9 paths for 10 rows"),
    (names("g", 9) + [""], "row 9 has ''"),
    (names("g", 9) + [None], "row 9 has None"),
    (["a\nb"] + names("g", 9), "row 0 holds a NUL or line break"),
])
def test_bad_paths_are_refused_before_anything_is_written(tmp_path, paths, says):
    make_store(tmp_path / "s.zarr")
    with pytest.raises(StoreError, match=says):
        write_paths(tmp_path / "s.zarr", "gallery", paths)
    assert read_paths(open_store(tmp_path / "s.zarr"), "gallery", slice(None)) is None


def test_existing_paths_are_replaced_only_when_asked(store):
    with pytest.raises(StoreError, match="already has gallery/paths"):
        write_paths(store, "gallery", names("new", 10))
    with pytest.raises(OptionError, match="no set 'people'"):
        write_paths(store, "people", names("new", 10))
    write_paths(open_store(store), "gallery", names("new", 10), overwrite=True)
    assert read_paths(open_store(store), "gallery", slice(None)) == names("new", 10)


def test_a_missing_or_damaged_chunk_and_an_unfinished_write_are_refused(store):
    chunk = store / "gallery" / "paths" / "c" / "1"
    original = chunk.read_bytes()
    chunk.unlink()
    with pytest.raises(StoreError, match=r"row 4 reads empty, its chunk \(1\) is missing"):
        read_paths(open_store(store), "gallery", slice(None))
    assert read_paths(open_store(store), "gallery", [0, 9]) == ["g/ü 000.png", "g/ü 009.png"]  # chunk 1 not read
    chunk.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
    with pytest.raises(StoreError, match="cannot read gallery/paths"):
        read_paths(open_store(store), "gallery", [5])
    zarr.open_group(str(store), mode="r+")["query/paths"].attrs["complete"] = False
    with pytest.raises(StoreError, match="was not written completely"):
        read_paths(open_store(store), "query", [0])


def test_appends_bring_their_paths_or_are_refused(tmp_path, store):
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((5, 3), dtype=np.float32), rng.integers(1, 4, 5), rng.integers(0, 2, 5)
    with pytest.raises(OptionError, match="give the new rows' paths too"):
        append_gallery(store, *rows)
    with pytest.raises(StoreError, match="4 paths for 5 rows"):
        append_gallery(store, *rows, paths=names("n", 4))
    assert len(open_store(store).gallery) == 10  # nothing appended
    grown = append_gallery(store, *rows, paths=names("n", 5))
    assert len(grown.gallery) == 15
    assert read_paths(grown, "gallery", slice(None)) == names("g", 10) + names("n", 5)
    assert read_paths(grown, "gallery", [14, 10, 0]) == ["n/ü 004.png", "n/ü 000.png", "g/ü 000.png"]
    bare = make_store(tmp_path / "bare.zarr")
    with pytest.raises(OptionError, match="has no gallery image paths"):
        append_gallery(tmp_path / "bare.zarr", *rows, paths=names("n", 5))
    assert len(open_store(tmp_path / "bare.zarr").gallery) == len(bare.gallery)


def test_an_unfinished_appends_paths_are_not_read_and_the_next_append_replaces_them(store):
    tail = open_group(str(store), mode="r+")["gallery/paths"]
    tail.resize((13,))
    tail[10:13] = np.array(["t/0.png", "t/1.png", "t/2.png"], dtype=np.dtypes.StringDType())
    assert read_paths(open_store(store), "gallery", slice(None)) == names("g", 10)
    with pytest.raises(StoreError, match="rows outside 0-9"):
        read_paths(open_store(store), "gallery", [10])
    rng = np.random.default_rng(3)
    grown = append_gallery(store, rng.standard_normal((2, 3), dtype=np.float32), [1, 2], [0, 1], paths=["a", "b"])
    assert read_paths(grown, "gallery", slice(8, None)) == names("g", 10)[8:] + ["a", "b"]


def test_gallery_rows_without_paths_are_reported(store):
    open_group(str(store), mode="r+")["gallery/paths"].resize((9,))
    with pytest.raises(StoreError, match="has 9 entries for 10 gallery rows"):
        read_paths(open_store(store), "gallery", [0])


def test_cli_append_takes_a_paths_file_and_refuses_to_lose_them(tmp_path, store):
    rng = np.random.default_rng(2)
    np.savez(tmp_path / "today.npz", gf=rng.standard_normal((3, 3), dtype=np.float32), g_pids=[1, 2, 3],
             g_camids=[0, 1, 0])
    refused = cli("append", store, tmp_path / "today.npz", code=2)
    assert "--paths FILE" in one_error_line(refused)
    (tmp_path / "today.txt").write_bytes("new/a.png\r\nnew/b.png\r\nnew/c ü.png\r\n".encode())  # Windows lines
    cli("append", store, tmp_path / "today.npz", "--paths", tmp_path / "today.txt")
    assert read_paths(open_store(store), "gallery", slice(10, None)) == ["new/a.png", "new/b.png", "new/c ü.png"]


# ------------------------------------------------------------------------------------ synth --images


def test_synth_images_are_pngs_of_each_row_with_paths_relative_to_the_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli("synth", "people.zarr", "--queries", 7, "--gallery", 40, "--dim", 8, "--ids", 8, "--cams", 3,
        "--junk", 0.2, "--distractors", 0.2, "--chunk-rows", 16, "--images", "pics", "-q")
    cli("synth", "plain.zarr", "--queries", 7, "--gallery", 40, "--dim", 8, "--ids", 8, "--cams", 3,
        "--junk", 0.2, "--distractors", 0.2, "--chunk-rows", 16, "-q")
    store, plain = open_store("people.zarr"), open_store("plain.zarr")
    for set_name in ("query", "gallery"):  # the images add paths and change nothing else
        fs, bare = getattr(store, set_name), getattr(plain, set_name)
        for ours, theirs in zip(read_rows(fs, slice(None), np.float32), read_rows(bare, slice(None), np.float32)):
            np.testing.assert_array_equal(ours, theirs)
        paths = read_paths(store, set_name, slice(None))
        assert paths == [os.path.join("pics", set_name, f"{row:06d}.png") for row in range(len(fs))]
    pids, camids = read_ids(store.gallery)
    images = [mpimage.imread(tmp_path / path) for path in read_paths(store, "gallery", slice(None))]
    assert all(image.shape == (IMAGE_HEIGHT, IMAGE_WIDTH, 3) for image in images)
    background = {camid: {tuple(image[0, 0]) for image, c in zip(images, camids) if c == camid} for camid in set(camids)}
    assert all(len(colours) == 1 for colours in background.values())  # one background per camera
    assert len({colours.pop() for colours in background.values()}) == len(background)
    top = {tuple(image[25, IMAGE_WIDTH // 2]) for image, pid in zip(images, pids) if pid == -1}
    assert len(top) <= 1 and all(len(set(colour)) == 1 for colour in top)  # junk wears grey
    groups = {}
    for image, pid in zip(images, pids):
        if pid > 0:  # look-alikes (one appearance group) dress alike: one top colour per group
            groups.setdefault((pid - 1) // GROUP_SIZE, set()).add(tuple(image[25, IMAGE_WIDTH // 2]))
    assert all(len(colours) == 1 for colours in groups.values()) and len(groups) > 1


def test_a_synth_that_fails_midway_leaves_neither_store_nor_images(tmp_path, monkeypatch):
    written = []

    def full_disk(image):
        if len(written) == 30:
            raise OSError(28, "No space left on device")
        written.append(image)
        return b"png"

    monkeypatch.setattr(synth, "png_bytes", full_disk)
    with pytest.raises(StoreError, match="No space left on device"):
        synth.synthesize(tmp_path / "s.zarr", n_query=5, n_gallery=60, dim=4, n_ids=3, n_cams=2, chunk_rows=16,
                         images=tmp_path / "pics")
    assert len(written) == 30 and os.listdir(tmp_path) == []


def test_synth_images_are_refused_where_they_would_clobber(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pics").mkdir()
    assert "already exists" in one_error_line(cli("synth", "a.zarr", "--queries", 2, "--gallery", 5, "--dim", 2,
                                                  "--images", "pics", "-q", code=2))
    assert not (tmp_path / "a.zarr").exists()
    assert "must not contain one another" in one_error_line(
        cli("synth", "pics/a.zarr", "--queries", 2, "--gallery", 5, "--dim", 2, "--images", "pics", "--overwrite", "-q",
            code=2))
    assert os.listdir("pics") == []
    assert "does not exist" in one_error_line(
        cli("synth", "a.zarr", "--queries", 2, "--gallery", 5, "--dim", 2, "--images", "no/pics", "-q", code=2))
