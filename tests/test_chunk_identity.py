"""Chunk identity (issue 24, item 2): a chunk file is valid only in its own place.

A chunk's checksum covers which chunk it is (the array, the chunk index, the store's uid), so a
chunk file moved, swapped, or copied from another store of the same layout is an error wherever
chunks are read (``eval``, ``validate``), while a whole-store copy stays a valid store.  Stores of
schema 2 (checksums of the bytes alone) still read, with one warning saying how to upgrade them,
and ``validate --upgrade`` binds their chunks in place.

Real zarr stores, real file moves and copies; the CLI in-process (CliRunner) or as a real process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from streameval import StoreError, append_gallery, evaluate, open_store, validate_values
from streameval.store import ID_FILL, read_rows, rows_fingerprint
from streameval.store.paths import read_paths, write_paths

from test_hostile_store import CHUNK, assert_one_error, chunk_file, cli, store
from test_store import make_data, write

SWAPPED = "gallery/features"


def swap(a, b) -> None:
    """Swap two files with plain renames, as `mv a x; mv b a; mv x b` would."""
    spare = a.with_name(a.name + ".spare")
    os.rename(a, spare)
    os.rename(b, a)
    os.rename(spare, b)


def numbers(path) -> dict:
    result = evaluate(path, max_rank=5)
    return {"mAP": result.mAP, "cmc": [float(v) for v in result.cmc]}


def eval_json(path, tmp_path, *args) -> tuple:
    """``streameval eval --no-gom --json`` in-process: the result and the CLI's stderr lines."""
    out = tmp_path / f"r{len(list(tmp_path.glob('r*.json')))}.json"
    result = cli("eval", path, "--quiet", "--no-gom", "--json", out, *args)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    return {"mAP": data["mAP"], "cmc": data["cmc"]}, result.stderr.splitlines()


# -------------------------------------------------------------------------- moved and foreign chunks


def test_swapped_feature_chunks_fail_eval_and_validate(tmp_path):
    path = store(tmp_path)
    evaluate(path)  # fine before the swap
    swap(chunk_file(path, SWAPPED, 0), chunk_file(path, SWAPPED, 1))
    expected = "gallery rows 0-15: the features chunk"
    with pytest.raises(StoreError) as err:
        validate_values(open_store(path))
    assert expected in str(err.value) and str(chunk_file(path, SWAPPED, 0)) in str(err.value)
    assert "it holds the chunk gallery/features/c/1/0 of this store (chunk files moved or swapped)" in str(err.value)
    with pytest.raises(StoreError, match="does not match its place"):
        evaluate(path)
    assert_one_error(cli("validate", path), 3, expected)
    line = assert_one_error(cli("eval", path, "--quiet", "--workers", "1"), 3, expected)
    assert "gallery/features/c/1/0" in line


def test_a_chunk_moved_to_another_index_fails_where_it_is_read(tmp_path):
    """One array's chunk copied over another index of the same array: rows read by number (only
    that chunk) fail too, not only full scans."""
    path = store(tmp_path)
    shutil.copyfile(chunk_file(path, "gallery/camids", 4), chunk_file(path, "gallery/camids", 2))
    fs = open_store(path).gallery
    read_rows(fs, np.array([0, 70]), np.float32)  # chunks 0 and 4: in their places
    with pytest.raises(StoreError, match="gallery rows 32-47: the camids chunk"):
        read_rows(fs, np.array([0, 40]), np.float32)
    with pytest.raises(StoreError, match=r"gallery rows 32-47: the camids chunk .* it holds the chunk "
                                         r"gallery/camids/c/4 of this store"):
        validate_values(open_store(path))


def test_a_pids_chunk_copied_from_another_store_of_the_same_layout_fails(tmp_path):
    path = store(tmp_path)
    other = tmp_path / "other.zarr"
    write(other, make_data(seed=5), chunk_rows=CHUNK)  # same shapes and chunking, other ids
    assert chunk_file(path, "gallery/pids", 2).read_bytes() != chunk_file(other, "gallery/pids", 2).read_bytes()
    shutil.copyfile(chunk_file(other, "gallery/pids", 2), chunk_file(path, "gallery/pids", 2))
    expected = "gallery rows 32-47: the pids chunk"
    with pytest.raises(StoreError, match="that file comes from another store"):
        evaluate(path)
    line = assert_one_error(cli("validate", path), 3, expected)
    assert str(chunk_file(path, "gallery/pids", 2)) in line
    assert_one_error(cli("eval", path, "--quiet", "--workers", "1"), 3, expected)


def test_every_array_is_checked_by_the_one_read_path_image_paths_too(tmp_path):
    """Not only features and ids: the check sits under every array of the store (here the image
    paths, read by their own reader)."""
    path = store(tmp_path)
    write_paths(path, "gallery", [f"g/{i:03d}.png" for i in range(80)])
    assert read_paths(open_store(path), "gallery", [20]) == ["g/020.png"]
    swap(path / "gallery" / "paths" / "c" / "0", path / "gallery" / "paths" / "c" / "1")
    with pytest.raises(StoreError, match="cannot read gallery/paths"):
        read_paths(open_store(path), "gallery", [20])


def test_a_whole_store_copy_is_still_a_valid_store(tmp_path):
    path = store(tmp_path)
    copy = tmp_path / "copy.zarr"
    shutil.copytree(path, copy)  # cp -r: the same uid, every chunk at its own key
    assert cli("validate", copy).exit_code == 0
    assert numbers(copy) == numbers(path)
    extra = make_data(n_gallery=20, seed=3)
    append_gallery(copy, extra["gallery_features"], extra["gallery_pids"], extra["gallery_camids"])
    validate_values(open_store(copy))
    assert len(open_store(copy).gallery) == 100
    swap(chunk_file(copy, "gallery/pids", 0), chunk_file(copy, "gallery/pids", 1))  # the copy's chunks are bound too
    assert_one_error(cli("validate", copy), 3, "gallery rows 0-15: the pids chunk")


def test_appended_chunks_carry_their_identity(tmp_path):
    """An append writes its chunks (and rewrites the partial last one) bound to their places."""
    path = store(tmp_path)
    extra = make_data(n_gallery=40, seed=3)
    append_gallery(path, extra["gallery_features"], extra["gallery_pids"], extra["gallery_camids"])
    fs = open_store(path).gallery
    np.testing.assert_array_equal(fs.pids[80:120], extra["gallery_pids"])
    validate_values(open_store(path))
    swap(chunk_file(path, "gallery/pids", 5), chunk_file(path, "gallery/pids", 6))  # both written by the append
    assert_one_error(cli("validate", path), 3, "gallery rows 80-95: the pids chunk")


# --------------------------------------------------------------------------------- stores of schema 2


def legacy_store(path, data: dict) -> None:
    """A store as streameval wrote it before chunk identity (schema 2): the same arrays, codecs and
    fill values, checksums of the bytes alone (written with zarr's own API)."""
    group = zarr.open_group(str(path), mode="w")
    group.attrs.update({"streameval_schema": 2, "committed_gallery_rows": len(data["gallery_pids"]),
                        "store_uid": uuid.uuid4().hex, "default_metric": "euclidean"})
    for name in ("query", "gallery"):
        features = data[f"{name}_features"]
        rows = min(CHUNK, features.shape[0])
        group.create_array(f"{name}/features", shape=features.shape, dtype=features.dtype,
                           chunks=(rows, features.shape[1]), compressors=[Crc32cCodec()], fill_value=np.nan)
        group[f"{name}/features"][:] = features
        for field in ("pids", "camids"):
            group.create_array(f"{name}/{field}", shape=(features.shape[0],), dtype=np.int64, chunks=(rows,),
                               compressors=[ZstdCodec(level=0, checksum=False), Crc32cCodec()], fill_value=ID_FILL)
            group[f"{name}/{field}"][:] = data[f"{name}_{field}"]


UPGRADE_HINT = "upgrade it in place with 'streameval validate --upgrade"


def test_a_schema_2_store_reads_as_before_with_the_upgrade_hint_and_upgrades(tmp_path):
    data = make_data()
    old, new = tmp_path / "old.zarr", tmp_path / "new.zarr"
    legacy_store(old, data)
    write(new, data, chunk_rows=CHUNK)
    expected, stderr = eval_json(new, tmp_path)
    assert stderr == []
    got, stderr = eval_json(old, tmp_path)
    assert got == expected  # read as before: the same numbers
    assert len(stderr) == 1 and stderr[0].startswith("warning: ") and UPGRADE_HINT in stderr[0], stderr
    assert "schema 2" in stderr[0]
    fingerprint = rows_fingerprint(open_store(old).gallery, 72)

    result = cli("validate", "--upgrade", old)
    assert result.exit_code == 0, result.output
    assert "bound 18 chunks to their place" in result.stderr and "warning" not in result.stderr
    assert zarr.open_group(str(old), mode="r").attrs["streameval_schema"] == 3
    got, stderr = eval_json(old, tmp_path)
    assert (got, stderr) == (expected, [])
    assert rows_fingerprint(open_store(old).gallery, 72) == fingerprint  # saved states stay valid
    again = cli("validate", "--upgrade", old)
    assert again.exit_code == 0 and "of schema 3 already" in again.stderr

    swap(chunk_file(old, SWAPPED, 0), chunk_file(old, SWAPPED, 3))  # now caught
    assert_one_error(cli("eval", old, "--quiet", "--workers", "1"), 3, "gallery rows 0-15: the features chunk")


def test_a_damaged_chunk_stops_the_upgrade_and_keeps_it_refused_until_rerun(tmp_path):
    data = make_data()
    old = tmp_path / "old.zarr"
    legacy_store(old, data)
    file = chunk_file(old, "gallery/pids", 3)
    intact = file.read_bytes()
    file.write_bytes(intact[:-1] + bytes([intact[-1] ^ 1]))  # the checksum's last byte
    assert_one_error(cli("validate", "--upgrade", old), 3, "the chunk gallery/pids/c/3 fails its crc32c checksum")
    assert_one_error(cli("eval", old, "--quiet"), 3, "the upgrade of its chunks to their identity was interrupted")
    file.write_bytes(intact)  # restored
    result = cli("validate", "--upgrade", old)
    assert result.exit_code == 0, result.output
    assert "bound 5 chunks to their place (13 were already)" in result.stderr
    assert numbers(old) == numbers(_written(tmp_path, data))


def _written(tmp_path, data):
    path = tmp_path / "reference.zarr"
    write(path, data, chunk_rows=CHUNK)
    return path


@pytest.mark.slow
def test_an_upgrade_killed_midway_is_refused_then_finished_by_a_rerun(tmp_path):
    """A real process, killed (SIGKILL) while it rebinds the chunks of a store of many chunks."""
    data = make_data(n_gallery=3000)
    old = tmp_path / "old.zarr"
    legacy_store(old, data)
    attrs = old / "zarr.json"
    proc = subprocess.Popen([sys.executable, "-m", "streameval.cli", "validate", "--upgrade", str(old)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while "chunk_identity_upgrade" not in attrs.read_text() and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    marked = json.loads(attrs.read_text())["attributes"]
    assert marked.get("chunk_identity_upgrade") is True and marked["streameval_schema"] == 2, marked
    assert_one_error(cli("validate", old), 3, "the upgrade of its chunks to their identity was interrupted")
    result = cli("validate", "--upgrade", old)
    assert result.exit_code == 0, result.output
    features, pids, camids = read_rows(open_store(old).gallery, slice(None), np.float32)
    for name, values in (("features", features), ("pids", pids), ("camids", camids)):
        np.testing.assert_array_equal(values, data[f"gallery_{name}"], err_msg=name)
