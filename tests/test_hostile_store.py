"""Hostile input to the feature store (issue 10): every damaged or unrepresentable input is refused
with one clear error, never a traceback, never a silently wrong number.

Stores are real zarr stores written here and then damaged on disk with plain file operations; the
CLI runs in-process (CliRunner) or as a real process.  Full disks are real: a small tmpfs mounted
for the test (skipped when this process may not mount).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from streameval import OptionError, StoreError, append_gallery, evaluate, open_store, validate_values
from streameval.tools import convert as convert_mod
from streameval.tools import synth as synth_mod
from streameval.cli import main
from streameval.tools.convert import convert_npz
from streameval.store.identity import ChunkIdentityStore
from streameval.store import COMMITTED_ATTR, ID_FILL, open_group, read_rows, reading, rows_fingerprint

from test_store import DIM, make_data, write

CHUNK = 16  # rows per chunk: the 12 queries fit one chunk, the 80 gallery rows five


def store(tmp_path, name="s.zarr", **kwargs) -> Path:
    path = tmp_path / name
    write(path, chunk_rows=CHUNK, **kwargs)
    return path


def chunk_file(path: Path, key: str, index: int) -> Path:
    """The file of chunk ``index`` (along the rows) of array ``key``, in zarr v3's default layout."""
    file = path / key / "c" / str(index)
    return file / "0" if key.endswith("features") else file


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_one_error(result, code: int, pattern: str = "") -> str:
    """Exit ``code``, stderr exactly one ``error:`` line matching ``pattern``, no traceback."""
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert pattern in lines[0], lines[0]
    assert "Traceback" not in result.output
    return lines[0]


def run(*args, timeout=120) -> subprocess.CompletedProcess:
    """``python -m streameval.cli ARGS`` in a real process."""
    return subprocess.run([sys.executable, "-m", "streameval.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONWARNINGS": "ignore"})


def assert_process_error(proc, code: int, pattern: str = "") -> str:
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert pattern in lines[0], lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
    return lines[0]


def contents(path) -> dict:
    fs = {name: getattr(open_store(path), name) for name in ("query", "gallery")}
    return {f"{name}/{field}": getattr(s, field)[:len(s)]
            for name, s in fs.items() for field in ("features", "pids", "camids")}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


# ------------------------------------------------------------------------------- 1. missing chunks


MISSING = {  # array, chunk index -> the rows it holds
    "query features": ("query/features", 0, "query rows 0-11"),
    "gallery features": ("gallery/features", 2, "gallery rows 32-47"),
    "gallery pids": ("gallery/pids", 4, "gallery rows 64-79"),
    "gallery camids": ("gallery/camids", 1, "gallery rows 16-31"),
    "query pids": ("query/pids", 0, "query rows 0-11"),
}


@pytest.mark.parametrize("case", list(MISSING))
def test_a_missing_chunk_is_refused_not_read_as_zeros(tmp_path, case):
    key, index, rows = MISSING[case]
    path = store(tmp_path)
    evaluate(path)  # fine before the damage
    chunk_file(path, key, index).unlink()
    field = key.split("/")[1]
    message = f"{rows}: chunk missing from the store ({field} read as the fill value"
    with pytest.raises(StoreError, match="chunk missing from the store") as err:
        validate_values(open_store(path))
    assert message in str(err.value)
    with pytest.raises(StoreError, match="chunk missing"):
        evaluate(path)
    assert_one_error(cli("validate", path), 3, message)
    assert_one_error(cli("eval", path, "--quiet", "--workers", "1"), 3, "chunk missing from the store")


def test_a_missing_chunk_is_refused_by_a_real_process(tmp_path):
    path = store(tmp_path)
    chunk_file(path, "gallery/pids", 1).unlink()
    proc = run("eval", path, "--quiet", "--workers", "1")
    assert_process_error(proc, 3, "gallery rows 16-31: chunk missing from the store (pids read as the fill value")


def test_the_reserved_id_written_behind_streamevals_back_is_refused(tmp_path):
    path = store(tmp_path)
    open_group(path, mode="r+")["gallery/pids"][20] = ID_FILL  # its chunk file is there
    assert_one_error(cli("validate", path), 3,
                     f"gallery pids row 20 holds {ID_FILL}, the value reserved to mark missing chunks")


@pytest.mark.parametrize("node, message", [
    ("zarr.json", "is not a zarr v3 group: JSONDecodeError"),
    ("gallery/features/zarr.json", "cannot read the metadata of 'gallery/features': JSONDecodeError"),
    ("query/camids/zarr.json", "cannot read the metadata of 'query/camids': JSONDecodeError"),
])
def test_damaged_metadata_is_refused(tmp_path, node, message):
    path = store(tmp_path)
    file = path / node
    file.write_bytes(file.read_bytes()[:40])  # cut mid-document
    assert_one_error(cli("validate", path), 3, message)


def test_a_store_of_schema_1_is_refused_with_how_to_recreate_it(tmp_path):
    path = store(tmp_path)
    zarr.open_group(str(path), mode="r+").attrs["streameval_schema"] = 1
    line = assert_one_error(cli("validate", path), 3, "written by an older streameval (store schema 1")
    assert "no chunk checksums" in line
    assert "'streameval convert'" in line and "'streameval synth'" in line


@pytest.mark.parametrize("damage, message", [
    ("no checksum", "gallery/pids is stored without crc32c chunk checksums"),
    ("zero fill", "gallery/pids has fill value 0, expected -9223372036854775808"),
])
def test_a_schema_2_store_without_the_safeguards_is_refused(tmp_path, damage, message):
    """An array rewritten by another tool with zarr's defaults: missing chunks would read as zeros."""
    path = store(tmp_path)
    group = open_group(path, mode="r+")
    pids = group["gallery/pids"][:]
    del group["gallery/pids"]
    if damage == "no checksum":
        group.create_array("gallery/pids", shape=pids.shape, dtype=np.int64, chunks=(CHUNK,), fill_value=ID_FILL)
    else:
        group.create_array("gallery/pids", shape=pids.shape, dtype=np.int64, chunks=(CHUNK,),
                           compressors=[zarr.codecs.Crc32cCodec()])
    group["gallery/pids"][:] = pids
    with pytest.raises(StoreError, match=message):
        open_store(path)
    assert_one_error(cli("eval", path, "--quiet"), 3, message)


# ------------------------------------------------------------------------------------ 2. checksums


def _garbage(file: Path) -> None:
    file.write_bytes(np.random.default_rng(0).bytes(file.stat().st_size))


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def _flip_middle_byte(file: Path) -> None:  # inside the zstd frame of an ids chunk
    raw = bytearray(file.read_bytes())
    raw[len(raw) // 2] ^= 0x5A
    file.write_bytes(bytes(raw))


def _empty(file: Path) -> None:
    file.write_bytes(b"")


DAMAGED = {
    "garbage of the same size in a feature chunk": ("gallery/features", 2, _garbage, "gallery rows 32-47"),
    "truncated feature chunk": ("query/features", 0, _truncate, "query rows 0-11"),
    "zstd-garbled pids chunk": ("gallery/pids", 3, _flip_middle_byte, "gallery rows 48-63"),
    "empty camids chunk": ("gallery/camids", 4, _empty, "gallery rows 64-79"),
}


@pytest.mark.parametrize("case", list(DAMAGED))
def test_a_damaged_chunk_is_refused(tmp_path, case):
    key, index, damage, rows = DAMAGED[case]
    path = store(tmp_path)
    damage(chunk_file(path, key, index))
    field = key.split("/")[1]
    message = f"{rows}: the {field} chunk"
    with pytest.raises(StoreError) as err:
        validate_values(open_store(path))
    assert message in str(err.value)
    assert "cannot be read (its crc32c checksum does not match its bytes)" in str(err.value)
    assert str(chunk_file(path, key, index)) in str(err.value)  # the file to restore
    with pytest.raises(StoreError, match="cannot be read"):
        evaluate(path)
    assert_one_error(cli("validate", path), 3, message)
    assert_one_error(cli("eval", path, "--quiet", "--workers", "1"), 3, message)


def test_a_damaged_chunk_read_by_row_numbers_names_its_rows(tmp_path):
    """Reads of scattered rows (oindex) report the damaged chunk among those read."""
    path = store(tmp_path)
    _garbage(chunk_file(path, "gallery/features", 3))
    fs = open_store(path).gallery
    read_rows(fs, np.array([1, 20, 70]), np.float32)  # chunks 0, 1, 4: fine
    with pytest.raises(StoreError, match="gallery rows 48-63: the features chunk"):
        read_rows(fs, np.array([1, 50, 70]), np.float32)


# ------------------------------------------------------------------------------ 3. rows_fingerprint


def test_rows_fingerprint_notices_a_rewrite_in_any_chunk(tmp_path):
    path = store(tmp_path)
    rows = 72  # chunks 0-3 wholly inside, chunk 4 (rows 64-79) partly
    before = rows_fingerprint(open_store(path).gallery, rows)
    assert rows_fingerprint(open_store(path).gallery, rows) == before  # deterministic
    arrays = open_group(path, mode="r+")
    for key, row in [("gallery/pids", 3), ("gallery/camids", 40), ("gallery/features", 55), ("gallery/pids", 70),
                     ("gallery/features", 64)]:
        old = arrays[key][row]
        arrays[key][row] = old + 1  # behind streameval's back
        assert rows_fingerprint(open_store(path).gallery, rows) != before, (key, row)
        arrays[key][row] = old
        assert rows_fingerprint(open_store(path).gallery, rows) == before, (key, row)
    arrays["gallery/pids"][75] = 999  # a row past ``rows`` is not covered
    assert rows_fingerprint(open_store(path).gallery, rows) == before


def test_rows_fingerprint_is_kept_by_appends(tmp_path):
    data = make_data(n_gallery=75)  # the last chunk (rows 64-74) is partial: the append rewrites it
    path = tmp_path / "s.zarr"
    write(path, data, chunk_rows=CHUNK)
    old = {rows: rows_fingerprint(open_store(path).gallery, rows) for rows in (75, 64, 70, 1)}
    extra = make_data(n_gallery=40, seed=9)
    append_gallery(path, extra["gallery_features"], extra["gallery_pids"], extra["gallery_camids"])
    fs = open_store(path).gallery
    assert len(fs) == 115
    assert {rows: rows_fingerprint(fs, rows) for rows in old} == old
    assert rows_fingerprint(fs, 115) != old[75]


def test_rows_fingerprint_reads_one_checksum_per_whole_chunk(tmp_path, monkeypatch):
    path = tmp_path / "big.zarr"
    write(path, make_data(n_gallery=2000), chunk_rows=CHUNK)
    fs = open_store(path).gallery
    requests = []
    real_get = ChunkIdentityStore.get  # every chunk read of the store goes through it

    async def counting_get(self, key, prototype=None, byte_range=None):
        buffer = await real_get(self, key, prototype, byte_range)
        requests.append((key, byte_range, 0 if buffer is None else len(buffer)))
        return buffer

    monkeypatch.setattr(ChunkIdentityStore, "get", counting_get)
    rows = 1990  # 124 whole chunks, then rows 1984-1989 of the last one
    rows_fingerprint(fs, rows)
    chunk_reads = [r for r in requests if "/c/" in r[0]]
    ranged = [r for r in chunk_reads if r[1] is not None]
    whole = [r for r in chunk_reads if r[1] is None]
    assert len(ranged) == 3 * 124 and all(size == 4 for _, _, size in ranged)
    assert sorted(key for key, _, _ in whole) == ["gallery/camids/c/124", "gallery/features/c/124/0",
                                                  "gallery/pids/c/124"]
    total = sum(size for _, _, size in chunk_reads)
    assert total < 3 * 124 * 4 + 3 * CHUNK * DIM * 4  # checksums, plus the partial chunk's values
    requests.clear()
    rows_fingerprint(fs, 1984)  # whole chunks only: no chunk is read in full
    assert all(r[1] is not None for r in requests if "/c/" in r[0])


def test_rows_fingerprint_is_the_same_whatever_the_checksum_window(tmp_path, monkeypatch):
    """Checksums are fetched a window of chunks at a time (memory flat for any gallery)."""
    path = store(tmp_path)
    fs = open_store(path).gallery
    whole = rows_fingerprint(fs, 72)
    monkeypatch.setattr(reading, "CHECKSUM_WINDOW", 2)
    assert rows_fingerprint(fs, 72) == whole
    chunk_file(path, "gallery/pids", 3).unlink()  # found in a later window too
    with pytest.raises(StoreError, match=r"gallery rows 48-63: chunk missing from the store \(pids"):
        rows_fingerprint(fs, 72)


def test_reads_past_the_committed_rows_are_refused(tmp_path):
    """Rows past the committed count belong to an unfinished append: never read as data."""
    fs = open_store(store(tmp_path)).gallery
    for rows in (slice(0, len(fs) + 1), np.array([0, len(fs)])):
        with pytest.raises(StoreError, match=f"past the {len(fs):,} committed rows"):
            read_rows(fs, rows, np.float32)


def test_rows_fingerprint_refuses_a_missing_chunk(tmp_path):
    path = store(tmp_path)
    chunk_file(path, "gallery/camids", 2).unlink()
    with pytest.raises(StoreError, match=r"gallery rows 32-47: chunk missing from the store \(camids"):
        rows_fingerprint(open_store(path).gallery, 80)
    with pytest.raises(StoreError, match="cannot fingerprint 81 gallery rows"):
        rows_fingerprint(open_store(path).gallery, 81)


# ----------------------------------------------------------------------- 4. committed rows attribute


@pytest.mark.parametrize("value, message", [
    (-5, "committed_gallery_rows is -5, a negative row count"),
    ("80", "committed_gallery_rows is '80', not a row count"),
    (80.0, "committed_gallery_rows is 80.0, not a row count"),
    ([80], "committed_gallery_rows is [80], not a row count"),
    (True, "committed_gallery_rows is True, not a row count"),
    (None, "committed_gallery_rows is None, not a row count"),
    (10**6, "1000000 rows are committed but features hold only 80"),
])
def test_a_damaged_committed_row_count_is_refused(tmp_path, value, message):
    path = store(tmp_path)
    attrs = zarr.open_group(str(path), mode="r+").attrs
    if value is None:
        del attrs[COMMITTED_ATTR]
    else:
        attrs[COMMITTED_ATTR] = value
    with pytest.raises(StoreError, match="committed"):
        open_store(path)
    assert_one_error(cli("validate", path), 3, message)


# --------------------------------------------------------------------- 5. values the dtype cannot hold


def tiny_row(data: dict, key: str, row: int, value: float) -> dict:
    data = {k: v.copy() for k, v in data.items()}
    data[key] = data[key].astype(np.float64)
    data[key][row] = value
    return data


def test_write_store_refuses_a_row_that_underflows(tmp_path):
    data = tiny_row(make_data(), "gallery_features", 7, 1e-300)
    with pytest.raises(StoreError, match=r"gallery features row 7 is too small for float32: its largest "
                                         r"magnitude 1e-300 would be stored as zero .*float32 represents "
                                         r"magnitudes from 1.175e-38"):
        write(tmp_path / "s.zarr", data)
    assert not (tmp_path / "s.zarr").exists()
    half = tiny_row(make_data(), "query_features", 2, 1e-6)  # below float16's smallest normal, 6.1e-5
    with pytest.raises(StoreError, match="query features row 2 is too small for float16"):
        write(tmp_path / "s.zarr", half, dtype="float16")


def test_a_single_tiny_value_in_a_row_of_normal_scale_is_rounding(tmp_path):
    """Its error is below the one of the row's largest value: accepted, like any rounding."""
    data = make_data()
    data["gallery_features"] = data["gallery_features"].astype(np.float64)
    data["gallery_features"][7, 3] = 1e-300
    fs = write(tmp_path / "s.zarr", data).gallery
    assert fs.features[7, 3] == 0
    np.testing.assert_array_equal(fs.features[7], data["gallery_features"][7].astype(np.float32))


def npz(path: Path, data: dict) -> Path:
    np.savez(path, **data)
    return path


def test_convert_refuses_underflow_and_ids_that_do_not_fit(tmp_path):
    src = npz(tmp_path / "tiny.npz", tiny_row(make_data(), "gallery_features", 30, -3e-41))
    assert_one_error(cli("convert", src, tmp_path / "a.zarr"), 3,
                     "tiny.npz': gallery features row 30 is too small for float32")
    big = make_data()
    big["gallery_pids"] = big["gallery_pids"].astype(np.uint64)
    big["gallery_pids"][41] = 2**63  # would wrap to -2**63
    src = npz(tmp_path / "big.npz", big)
    assert_one_error(cli("convert", src, tmp_path / "b.zarr"), 3,
                     f"gallery pids row 41 holds {2**63}, which does not fit int64")
    reserved = make_data()
    reserved["query_camids"][5] = ID_FILL
    src = npz(tmp_path / "reserved.npz", reserved)
    assert_one_error(cli("convert", src, tmp_path / "c.zarr"), 3,
                     f"query camids row 5 holds {ID_FILL}, which is reserved to mark missing chunks")
    for name in ("a", "b", "c"):
        assert not (tmp_path / f"{name}.zarr").exists()
    fits = make_data()
    fits["gallery_pids"] = fits["gallery_pids"].astype(np.uint64)
    fits["gallery_pids"][41] = 2**63 - 1  # the largest id that fits
    store = convert_npz(npz(tmp_path / "fits.npz", fits), tmp_path / "d.zarr")
    assert store.gallery.pids[41] == 2**63 - 1


def test_writes_and_appends_refuse_ids_that_do_not_fit(tmp_path):
    data = make_data()
    data["gallery_pids"] = data["gallery_pids"].astype(np.uint64)
    data["gallery_pids"][3] = 2**64 - 1  # was stored as the junk id -1
    with pytest.raises(StoreError, match=f"gallery pids row 3 holds {2**64 - 1}, which does not fit int64"):
        write(tmp_path / "s.zarr", data)
    path = store(tmp_path)
    before = contents(path)
    features = np.ones((3, DIM), np.float32)
    with pytest.raises(StoreError, match=f"appended gallery pids row 1 holds {ID_FILL}, which is reserved"):
        append_gallery(path, features, np.array([1, ID_FILL, 2]), np.zeros(3, np.int64))
    with pytest.raises(StoreError, match="appended gallery features row 2 is too small for float32"):
        append_gallery(path, np.vstack([features[:2], np.full((1, DIM), 1e-40)]), [1, 2, 3], [0, 0, 0])
    src = npz(tmp_path / "add.npz", {"gf": np.ones((3, DIM)), "g_pids": np.array([1, 2, 2**63], np.uint64),
                                     "g_camids": np.zeros(3, np.int64)})
    assert_one_error(cli("append", path, src), 3, "gallery pids row 2 holds 9223372036854775808")
    assert_same(contents(path), before)


# ------------------------------------------------------------------------------------ 6. full disks


@pytest.fixture
def small_disk(tmp_path):
    """``small_disk(size)``: a directory on a tmpfs of ``size`` bytes (a real full disk when filled),
    unmounted afterwards."""
    mounted = []

    def mount(size: int) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs to fill a real disk (needs root): {proc.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path, leave: int = 0) -> Path:
    """Fill ``disk`` up to ``leave`` free bytes with a file (kept, to check it is never removed)."""
    filler = disk / "filler.bin"
    with open(filler, "wb") as fh:
        try:
            while shutil.disk_usage(disk).free > leave:
                fh.write(b"\xab" * min(1 << 16, max(4096, shutil.disk_usage(disk).free - leave)))
                fh.flush()
        except OSError:
            pass
    return filler


def big_npz(path: Path, n_gallery=2000, dim=256) -> Path:
    """About 2 MB of float32 features once stored: more than the 1 MiB disks below."""
    rng = np.random.default_rng(1)
    return npz(path, {"qf": rng.standard_normal((100, dim)), "q_pids": rng.integers(1, 9, 100),
                      "q_camids": rng.integers(0, 3, 100), "gf": rng.standard_normal((n_gallery, dim)),
                      "g_pids": rng.integers(1, 9, n_gallery), "g_camids": rng.integers(0, 3, n_gallery)})


def test_convert_onto_a_full_disk(tmp_path, small_disk):
    disk = small_disk(1 << 20)
    filler = fill(disk)
    size = filler.stat().st_size
    out = disk / "out.zarr"
    proc = run("convert", big_npz(tmp_path / "in.npz"), out)
    line = assert_process_error(proc, 3, f"cannot write '{out}': No space left on device")
    assert "the partial store was removed" in line
    assert proc.stdout == ""
    assert not out.exists()
    assert filler.stat().st_size == size


def test_convert_runs_out_of_space_in_a_later_chunk(tmp_path, small_disk, monkeypatch):
    disk = small_disk(1 << 20)
    written = []
    real_write_rows = convert_mod.write_rows

    def spy(fs, start, *columns):
        real_write_rows(fs, start, *columns)
        written.append((fs.name, start))

    monkeypatch.setattr(convert_mod, "write_rows", spy)
    out = disk / "out.zarr"
    result = cli("convert", big_npz(tmp_path / "in.npz"), out, "--chunk-rows", "100")
    assert_one_error(result, 3, f"cannot write '{out}': No space left on device")
    assert ("query", 0) in written and ("gallery", 100) in written  # several chunks fitted first
    assert len(written) < 21
    assert not out.exists() and os.listdir(disk) == []


def test_convert_overwrite_that_runs_out_of_space_says_the_old_store_is_gone(tmp_path, small_disk):
    disk = small_disk(1 << 20)
    out = disk / "out.zarr"
    write(out, chunk_rows=CHUNK)  # a small store that fits
    result = cli("convert", big_npz(tmp_path / "in.npz"), out, "--overwrite")
    line = assert_one_error(result, 3, f"cannot write '{out}': No space left on device")
    assert "the old store had been deleted first (--overwrite)" in line
    assert not out.exists()


def test_convert_overwrite_refuses_an_output_that_holds_the_input(tmp_path):
    """--overwrite deletes the old output before writing: never when the input lives inside it."""
    out = store(tmp_path)
    src = big_npz(out / "in.npz", n_gallery=50, dim=4)
    before = src.read_bytes()
    assert_one_error(cli("convert", src, out, "--overwrite"), 3, f"the input '{src}' is inside the output '{out}'")
    assert src.read_bytes() == before
    validate_values(open_store(out))


def test_synth_runs_out_of_space_in_a_later_chunk(small_disk, monkeypatch):
    """As when another process fills the disk while synth writes (its plan check passed)."""
    disk = small_disk(1 << 20)
    monkeypatch.setattr(synth_mod, "check_room", lambda *args: None)
    out = disk / "s.zarr"
    result = cli("synth", out, "--queries", "100", "--gallery", "2000", "--dim", "256", "--ids", "10",
                 "--chunk-rows", "100", "--quiet")
    assert_one_error(result, 3, f"cannot write '{out}': No space left on device")
    assert not out.exists() and os.listdir(disk) == []


def byte_counts(line: str) -> tuple[int, int]:
    """(needed, free) from "the store needs about X (N bytes) but ... has Y (M bytes) free"."""
    return tuple(int(part.split("(")[1].split(" bytes")[0].replace(",", "")) for part in line.split(" but "))


def test_synth_refuses_a_store_larger_than_the_disk_before_writing(small_disk):
    disk = small_disk(1 << 20)
    out = disk / "s.zarr"
    proc = run("synth", out, "--queries", "100", "--gallery", "2000", "--dim", "256", "--ids", "10", "--quiet")
    line = assert_process_error(proc, 2, "the store needs about ")
    need, free = byte_counts(line)
    assert need > 2000 * 256 * 4 and 0 < free <= 1 << 20
    assert f"the file system of '{disk}'" in line
    assert not out.exists()


def test_synth_refuses_absurd_sizes_before_writing(tmp_path):
    out = tmp_path / "s.zarr"
    line = assert_one_error(cli("synth", out, "--queries", "1000000000000", "--quiet"), 2, "the store needs about ")
    need, free = byte_counts(line)
    assert need >= 10**12 * 2048 * 4 > free  # queries x dims x float32, at least
    assert_one_error(cli("synth", out, "--queries", "10", "--gallery", "50", "--ids", str(10**12), "--quiet"), 2,
                     "synth needs about ")
    with pytest.raises(OptionError, match=r"1,000,000,000,000 identity centres .* more than half the physical memory"):
        synth_mod.synthesize(out, n_query=10, n_gallery=50, dim=2048, n_ids=10**12, n_cams=2)
    assert not out.exists()


def test_a_read_only_file_system(tmp_path, small_disk):
    disk = small_disk(1 << 20)
    path = disk / "s.zarr"
    write(path, chunk_rows=CHUNK)
    before = contents(path)
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    src = npz(tmp_path / "add.npz", {"gf": np.ones((5, DIM)), "g_pids": np.arange(1, 6),
                                     "g_camids": np.zeros(5, np.int64)})
    line = assert_one_error(cli("append", path, src), 3, f"cannot write '{path}': Read-only file system")
    assert "the store is unchanged" in line
    assert_same(contents(path), before)
    # (the CLI refuses an unwritable folder before any work; the API finds out while writing)
    with pytest.raises(StoreError, match=r"cannot write '.*new.zarr': Read-only file system$"):  # nothing to remove
        convert_npz(big_npz(tmp_path / "in.npz"), disk / "new.zarr")
    with pytest.raises(StoreError, match=r"cannot write '.*new.zarr': Read-only file system$"):
        synth_mod.synthesize(disk / "new.zarr", n_query=5, n_gallery=20, dim=4, n_ids=2, n_cams=2)
    with pytest.raises(StoreError, match=r"cannot replace '.*s.zarr': Read-only file system"):
        synth_mod.synthesize(path, n_query=5, n_gallery=20, dim=4, n_ids=2, n_cams=2, overwrite=True)
    assert_same(contents(path), before)


def test_append_that_runs_out_of_space_leaves_the_store_as_it_was(tmp_path, small_disk):
    disk = small_disk(1 << 20)
    path = disk / "s.zarr"
    write(path, chunk_rows=CHUNK)
    before, result_before = contents(path), evaluate(path, no_gom=True).mAP
    src = big_npz(tmp_path / "add.npz", n_gallery=3000, dim=DIM)  # 188 chunks x 3 files: more than the disk
    free = shutil.disk_usage(disk).free
    line = assert_one_error(cli("append", path, src), 3, f"cannot write '{path}': No space left on device")
    assert "the store is unchanged (none of the 3,000 rows were appended; it still has 80 gallery rows)" in line
    assert len(open_store(path).gallery) == 80
    assert open_store(path).gallery.features.shape[0] == 80  # the partial tail was dropped again
    assert shutil.disk_usage(disk).free >= free - 3 * 4096  # and its space freed
    assert_same(contents(path), before)
    validate_values(open_store(path))
    assert evaluate(path, no_gom=True).mAP == result_before
    # the disk already full: the first write fails
    fill(disk)
    assert_one_error(cli("append", path, src), 3, "No space left on device")
    assert_same(contents(path), before)
    # room again: the next append replaces the uncommitted tail
    (disk / "filler.bin").unlink()
    small = npz(tmp_path / "small.npz", {"gf": np.ones((5, DIM)), "g_pids": np.arange(1, 6),
                                         "g_camids": np.zeros(5, np.int64)})
    result = cli("append", path, small)
    assert result.exit_code == 0, result.output
    after = contents(path)
    assert len(after["gallery/pids"]) == 85
    np.testing.assert_array_equal(after["gallery/pids"][80:], np.arange(1, 6))
    np.testing.assert_array_equal(after["gallery/features"][:80], before["gallery/features"])
