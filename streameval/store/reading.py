"""Reading chunk data: every read goes through ``read_field``, which turns a damaged or missing
chunk into a StoreError naming the set, the rows and the chunk file; ``rows_fingerprint`` hashes
rows cheaply from the chunks' stored checksums."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import zarr
from zarr.abc.store import SuffixByteRequest
from zarr.core.buffer import default_buffer_prototype
from zarr.core.common import concurrent_map
from zarr.core.sync import sync

from ..core.errors import StoreError, one_line
from .identity import DAMAGED, checksum_failure, plain_store
from .layout import CHECKSUM_BYTES, FIELDS, FeatureSet, ID_FILL, Store
from .values import row_number


def _chunk_rows_range(arr: zarr.Array, index: int) -> tuple[int, int]:
    first = index * arr.chunks[0]
    return first, min(first + arr.chunks[0], arr.shape[0])


def _chunk_key(arr: zarr.Array, index: int) -> str:
    return arr.metadata.encode_chunk_key((index,) + (0,) * (arr.ndim - 1))


def _chunk_location(arr: zarr.Array, index: int) -> str:
    """The chunk's file (a local path, else the store's URL and the key)."""
    where = arr.store_path / _chunk_key(arr, index)
    store = plain_store(where.store)
    if isinstance(store, zarr.storage.LocalStore):
        return os.path.join(store.root, where.path)
    return f"{store}/{where.path}"


def _chunks_read(arr: zarr.Array, rows) -> list[int]:
    """Indices of the chunks holding ``rows`` (a slice or row numbers)."""
    step = arr.chunks[0]
    if isinstance(rows, slice):
        start, stop, _ = rows.indices(arr.shape[0])
        return list(range(start // step, -(-stop // step)))
    return [int(i) for i in np.unique(np.asarray(rows) // step)]


def _damaged(fs: FeatureSet, field: str, rows, exc: Exception) -> StoreError:
    """The error for a read that failed: find the chunk that fails to decode (this path only runs
    after a failure, so reading chunk by chunk costs nothing otherwise)."""
    arr = getattr(fs, field)
    for index in _chunks_read(arr, rows):
        first, stop = _chunk_rows_range(arr, index)
        try:
            arr[first:stop]
        except Exception as chunk_exc:
            reason, advice = _read_failure(arr, index, chunk_exc)
            return StoreError(f"{fs.name} rows {first}-{stop - 1}: the {field} chunk {_chunk_location(arr, index)} "
                              f"cannot be read ({reason}); {advice}")
    return StoreError(f"cannot read {fs.name} {field} from '{arr.store_path}' ({one_line(exc)})")


def _read_failure(arr: zarr.Array, index: int, exc: Exception) -> tuple[str, str]:
    """What is wrong with a chunk that failed to read, and what to do: a checksum that does not
    match (``identity.checksum_failure``), or what zarr said."""
    text = one_line(exc)
    if "checksum do not match" in text:
        return checksum_failure(arr, (arr.store_path / _chunk_key(arr, index)).path)
    return text, DAMAGED


def _filled(fs: FeatureSet, field: str, row: int) -> StoreError:
    """The error for a row read as the fill value: a missing chunk file (or a store this process
    cannot see at all), else a value that was written so."""
    arr = getattr(fs, field)
    index = row // arr.chunks[0]
    if not sync((arr.store_path / _chunk_key(arr, index)).exists()):
        if not sync((arr.store_path / "zarr.json").exists()):
            return StoreError(f"cannot read '{arr.store_path}' from this process (store missing or not reachable here)")
        first, stop = _chunk_rows_range(arr, index)
        return StoreError(f"{fs.name} rows {first}-{stop - 1}: chunk missing from the store ({field} read as the "
                          f"fill value; no file {_chunk_location(arr, index)}); "
                          "restore that file or recreate the store")
    if field == "features":
        return StoreError(f"{fs.name} features hold non-finite values (NaN or inf), first at row {row}")
    return StoreError(f"{fs.name} {field} row {row} holds {ID_FILL}, the value reserved to mark missing chunks")


def read_field(fs: FeatureSet, field: str, rows) -> np.ndarray:
    """Read ``rows`` (a slice, or an array of row numbers: only their chunks are read) of one array
    of a set, as stored.  Every read of chunk data goes through here: a chunk that fails to decode
    (checksum mismatch, truncated, unreadable file) or is missing (read as the fill value), and a
    non-finite feature, raise StoreError naming the set, the rows and the chunk file."""
    arr = getattr(fs, field)
    last = _last_row(rows, len(fs))
    if last >= len(fs):  # rows past the committed count belong to an unfinished append
        raise StoreError(f"{fs.name} row {last} is past the {len(fs):,} committed rows")
    try:
        values = arr.oindex[(rows,) + (slice(None),) * (arr.ndim - 1)] if isinstance(rows, slice) \
            else _read_listed(arr, np.asarray(rows, dtype=np.int64))
    except StoreError:  # a stacked set's piece, already named (store.stack)
        raise
    except Exception as exc:  # zarr, its codecs and the store raise many types for a damaged chunk
        raise _damaged(fs, field, rows, exc) from None
    filled = non_finite_rows(values) if field == "features" else values == ID_FILL
    if filled.any():
        raise _filled(fs, field, row_number(rows, int(np.flatnonzero(filled)[0])))
    return values


def non_finite_rows(values: np.ndarray) -> np.ndarray:
    """Whether each row holds a NaN or an infinity.  numpy tests float16 an element at a time
    (~1 ns each, as long as reading the chunk); its exponent bits all set say the same, vectorised."""
    if values.dtype == np.float16:
        exponent = np.uint16(0x7C00)
        return ((values.view(np.uint16) & exponent) == exponent).any(axis=1)
    return ~np.isfinite(values).all(axis=1)


def _read_listed(arr, rows: np.ndarray) -> np.ndarray:
    """``arr``'s rows listed (any order, repeats allowed), read a chunk at a time as the slice
    covering the rows wanted there: zarr's orthogonal indexing by row numbers costs about twice
    the chunk's decoding."""
    order = np.argsort(rows, kind="stable")
    ordered = rows[order]
    out = np.empty((rows.shape[0],) + tuple(arr.shape[1:]), dtype=arr.dtype)
    starts = np.flatnonzero(np.diff(ordered // arr.chunks[0], prepend=-1))
    for first, stop in zip(starts, np.append(starts[1:], rows.shape[0])):
        low, high = int(ordered[first]), int(ordered[stop - 1]) + 1
        out[order[first:stop]] = arr[low:high][ordered[first:stop] - low]
    return out


def _last_row(rows, n_rows: int) -> int:
    """The highest row number a selection (a slice or an array of rows) reads; -1 for none."""
    if isinstance(rows, slice):
        return (n_rows if rows.stop is None else rows.stop) - 1
    return int(np.max(rows, initial=-1))


def read_rows(fs: FeatureSet, rows, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read rows of a set (a slice, or an array of row numbers: only their chunks are read):
    features upcast to ``dtype`` and checked finite (none, 0 columns, in a distance store), ids as int64."""
    pids = np.asarray(read_field(fs, "pids", rows), dtype=np.int64)
    if fs.features is None:
        return np.zeros((pids.shape[0], 0), dtype=dtype), pids, np.asarray(read_field(fs, "camids", rows), np.int64)
    features = read_features(fs, rows, dtype)
    camids = np.asarray(read_field(fs, "camids", rows), dtype=np.int64)
    return features, pids, camids


def read_features(fs: FeatureSet, rows, dtype) -> np.ndarray:
    """``read_rows``' features alone: a pass that has the rows' ids already spares their reads
    (each a call into zarr, ~1 ms: as much as upcasting 4,096 rows of 256 features)."""
    return upcast(read_field(fs, "features", rows), dtype)


UPCAST_ROWS = 256  # rows converted at a time through float64 (a temporary of 2 MiB at D = 1,024)


def upcast(values: np.ndarray, dtype) -> np.ndarray:
    """``values`` as a C-contiguous array of ``dtype``.  float16 goes to float32 by the CPU's own
    conversion where it has one (``halfs``); else numpy's: float16 to float32 an element at a time,
    to float64 in a loop twice as fast (2.9 against 1.6 ms for 8,192 x 256 values), and both
    exact, so through float64, a few rows at a time."""
    if values.dtype != np.float16 or np.dtype(dtype) != np.float32:
        return np.ascontiguousarray(values, dtype=dtype)
    from . import halfs  # numba: only for a float16 store read in float32

    out = np.empty(values.shape, dtype=np.float32)
    if halfs.AVAILABLE:
        halfs.widen(np.ascontiguousarray(values).view(np.uint16).reshape(-1), out.reshape(-1))
        return out
    for first in range(0, values.shape[0], UPCAST_ROWS):
        out[first:first + UPCAST_ROWS] = values[first:first + UPCAST_ROWS].astype(np.float64)
    return out


def read_ids(fs: FeatureSet, start: int = 0, stop: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Read pids and camids of rows [start, stop) as int64 (no features)."""
    rows = slice(start, len(fs) if stop is None else stop)
    return (np.asarray(read_field(fs, "pids", rows), dtype=np.int64),
            np.asarray(read_field(fs, "camids", rows), dtype=np.int64))


def validate_values(store: Store) -> None:
    """Scan every chunk of both sets and raise StoreError on the first damaged or missing chunk,
    non-finite feature or reserved id."""
    for fs in (store.query, store.gallery):
        for start in range(0, len(fs), fs.chunk_rows):
            stop = min(start + fs.chunk_rows, len(fs))
            read_rows(fs, slice(start, stop), np.float32)
            if fs.reader is not None:
                fs.reader.validate(fs, start, stop)




def rows_fingerprint(fs: FeatureSet, rows: int) -> str:
    """A hash of rows [0, rows) of a set covering every chunk that holds them, cheaply.

    A chunk wholly below ``rows`` contributes its stored crc32c (the last bytes of the chunk file,
    one small ranged read: a rewritten value changes it); the chunk holding row ``rows`` - 1, when
    it is partial, contributes the values of its rows below ``rows`` (an append rewrites the rest
    of that chunk).  So appending rows leaves the fingerprint of the old rows as it was, and
    rewriting any of them changes it.  A missing chunk file raises StoreError.
    """
    if fs.reader is not None:  # a stack of sets (distance stores are never fingerprinted: they are not updated)
        return fs.reader.fingerprint(fs, rows)
    if not 0 <= rows <= len(fs):
        raise StoreError(f"cannot fingerprint {rows:,} {fs.name} rows: the set has {len(fs):,}")
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{rows} {fs.dim} {fs.features.dtype} {fs.chunk_rows}".encode())
    for field in FIELDS:  # feature stores only: distance stores are not updated
        arr = getattr(fs, field)
        whole = rows // arr.chunks[0]
        digest.update(field.encode())
        for checksum in _stored_checksums(fs, field, whole):
            digest.update(checksum)
        tail = slice(whole * arr.chunks[0], rows)
        if tail.stop > tail.start:
            digest.update(np.ascontiguousarray(read_field(fs, field, tail)).tobytes())
    return digest.hexdigest()


CHECKSUM_WINDOW = 1024  # chunks whose checksums are fetched at once: memory stays flat for any gallery


def _stored_checksums(fs: FeatureSet, field: str, n_chunks: int):
    """The crc32c of the first ``n_chunks`` chunks of one array, read as the last bytes of each file,
    in order; fetched CHECKSUM_WINDOW chunks at a time (concurrently within a window)."""
    arr = getattr(fs, field)
    prototype = default_buffer_prototype()
    limit = zarr.config.get("async.concurrency")

    async def last_bytes(index):
        return await (arr.store_path / _chunk_key(arr, index)).get(prototype, SuffixByteRequest(CHECKSUM_BYTES))

    for first in range(0, n_chunks, CHECKSUM_WINDOW):
        indices = range(first, min(first + CHECKSUM_WINDOW, n_chunks))
        try:
            buffers = sync(concurrent_map([(i,) for i in indices], last_bytes, limit))
        except Exception as exc:  # an unreadable file, a store error
            raise StoreError(f"cannot read the chunk checksums of {fs.name} {field} in '{arr.store_path}' "
                             f"({one_line(exc)})") from None
        for index, buffer in zip(indices, buffers):
            data = None if buffer is None else buffer.to_bytes()
            if data is None or len(data) != CHECKSUM_BYTES:
                first_row, stop = _chunk_rows_range(arr, index)
                state = "missing from the store" if data is None else "truncated"
                raise StoreError(f"{fs.name} rows {first_row}-{stop - 1}: chunk {state} ({field}: "
                                 f"{_chunk_location(arr, index)}); restore that file or recreate the store")
            yield data
