"""The feature store: a zarr v3 group holding query and gallery features.

Layout (schema version 2)::

    STORE.zarr/                       group attrs: streameval_schema = 2,
                                                   default_metric = "euclidean",
                                                   committed_gallery_rows, store_uid
        query/features   (Nq, D)  float16 | float32, chunked (rows, D): never split along D
        query/pids       (Nq,)    int64   person ids (-1 junk, 0 distractor by convention)
        query/camids     (Nq,)    int64   camera ids
        gallery/features (Ng, D)  as above
        gallery/pids     (Ng,)    int64
        gallery/camids   (Ng,)    int64

The three arrays of a set are chunked by the same number of rows so one chunk of each describes the
same images. Feature values are not compressed (float features do not compress); ids are (zstd).

Damage cannot read as data (what schema 2 adds to schema 1):

* Every chunk ends with a crc32c checksum (zarr's ``crc32c`` codec, the last bytes-to-bytes codec of
  every array): a chunk file overwritten, truncated or garbled fails to decode instead of reading
  as other numbers.
* Fill values no valid row can hold: zarr answers an array's fill value for a chunk whose file is
  missing, so features fill with NaN (refused as a value) and ids with ``ID_FILL`` = INT64_MIN, a
  reserved id: writers refuse it, readers report it as a missing chunk.
* ``committed_gallery_rows``: readers see only the gallery rows written completely (appends write
  the data first, this count last).

Every read of chunk data goes through ``read_field``, which turns a damaged or missing chunk into a
:class:`~streameval.errors.StoreError` naming the set, the rows and the chunk file.

``open_store`` checks everything that metadata alone can tell (arrays present, dtypes, shapes,
chunking, checksums and fill values) and raises StoreError with a readable message. Values (finite
features, ids) are checked as chunks are read (``read_rows``), so a full scan is never an extra pass
over a large gallery; ``validate_values`` does that scan on demand.

Values are checked before they are written (``check_batch``): finite features whose rows keep their
precision in the stored dtype, ids that fit int64 and are not the reserved fill value.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import uuid
from dataclasses import dataclass

import numpy as np
import zarr
from zarr.abc.store import SuffixByteRequest
from zarr.codecs import Crc32cCodec, ZstdCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.common import concurrent_map
from zarr.core.sync import sync

from .errors import StoreError, one_line

SCHEMA_VERSION = 2
COMMITTED_ATTR = "committed_gallery_rows"
UID_ATTR = "store_uid"  # random, made when a store is created: a rewritten store gets a new one
SETS = ("query", "gallery")
FIELDS = ("features", "pids", "camids")
FEATURE_DTYPES = (np.dtype(np.float16), np.dtype(np.float32))
METRICS = ("euclidean", "sqeuclidean", "cosine")
DEFAULT_CHUNK_ROWS = 8192
ID_FILL = int(np.iinfo(np.int64).min)  # the ids' fill value: reserved, never a valid id
ID_MAX = int(np.iinfo(np.int64).max)
CHECKSUM_BYTES = 4  # crc32c, appended to every encoded chunk
RECREATE = "recreate it with 'streameval convert' (from the .npz) or 'streameval synth'"


@dataclass(frozen=True)
class FeatureSet:
    """The three arrays describing one set (query or gallery)."""

    name: str
    features: zarr.Array
    pids: zarr.Array
    camids: zarr.Array
    rows: int  # committed rows: the arrays may hold an uncommitted tail left by an interrupted append

    def __len__(self) -> int:
        return self.rows

    @property
    def dim(self) -> int:
        return self.features.shape[1]

    @property
    def chunk_rows(self) -> int:
        return self.features.chunks[0]


@dataclass(frozen=True)
class Store:
    """An opened, structurally valid feature store."""

    path: str
    query: FeatureSet
    gallery: FeatureSet
    default_metric: str
    uid: str | None = None

    @property
    def dim(self) -> int:
        return self.query.dim


def is_local_path(target) -> bool:
    """A local path (URLs such as s3://bucket/x.zarr are opened through fsspec instead)."""
    return isinstance(target, (str, os.PathLike)) and "://" not in os.fspath(target)


def _describe(target) -> str:
    return os.fspath(target) if isinstance(target, (str, os.PathLike)) else repr(target)


# ------------------------------------------------------------------------------------------------ opening


def open_store(target, mode: str = "r", storage_options: dict | None = None, _writing: bool = False) -> Store:
    """Open a store (a path, an fsspec URL with ``storage_options``, or a zarr store object) and
    check its structure.

    Raises StoreError naming the first problem found.  (``_writing``: a store being filled by
    ``create_store`` + ``write_rows``, whose gallery rows are not committed yet.)
    """
    path = _describe(target)
    if is_local_path(target) and not os.path.exists(path):
        raise StoreError(f"no feature store at '{path}' (create one with 'streameval synth' or 'streameval convert')")
    try:
        group = zarr.open_group(target, mode=mode, storage_options=storage_options or None)
        attrs = dict(group.attrs)
    except Exception as exc:  # zarr raises several types for "not a group"
        raise StoreError(f"'{path}' is not a zarr v3 group: {one_line(exc)}") from None
    schema = attrs.get("streameval_schema")
    if schema == 1:
        raise StoreError(f"'{path}' was written by an older streameval (store schema 1: no chunk checksums, "
                         f"missing chunks read as zeros); {RECREATE}")
    if schema != SCHEMA_VERSION:
        raise StoreError(
            f"'{path}' is not a streameval store of schema {SCHEMA_VERSION} (attribute streameval_schema={schema!r})"
        )
    committed = None if _writing else _committed_rows(attrs, path)
    query = _open_set(group, path, "query", None)
    gallery = _open_set(group, path, "gallery", committed)
    if query.dim != gallery.dim:
        raise StoreError(
            f"'{path}': query features have dimension {query.dim} but gallery features have {gallery.dim}"
        )
    for fs in (query, gallery):
        _check_safeguards(fs, path)
    default_metric = attrs.get("default_metric", "euclidean")
    if default_metric not in METRICS:
        raise StoreError(f"'{path}': default_metric {default_metric!r} is not one of {', '.join(METRICS)}")
    return Store(path=path, query=query, gallery=gallery, default_metric=default_metric, uid=attrs.get(UID_ATTR))


def _committed_rows(attrs: dict, path: str) -> int:
    """The committed gallery row count (its range is checked against the arrays in ``_open_set``)."""
    value = attrs.get(COMMITTED_ATTR)
    if isinstance(value, bool) or not isinstance(value, int):
        raise StoreError(f"'{path}': attribute {COMMITTED_ATTR} is {value!r}, not a row count "
                         f"(the store's metadata is damaged); {RECREATE}")
    return value


def _open_set(group: zarr.Group, path: str, name: str, committed: int | None) -> FeatureSet:
    arrays = {}
    for field in FIELDS:
        key = f"{name}/{field}"
        try:
            arrays[field] = group[key]
        except KeyError:
            raise StoreError(f"'{path}' has no '{key}' array") from None
        except Exception as exc:  # a damaged zarr.json
            raise StoreError(f"'{path}': cannot read the metadata of '{key}': {one_line(exc)}") from None
        if not isinstance(arrays[field], zarr.Array):
            raise StoreError(f"'{path}': '{key}' is a group, expected an array")
    rows = arrays["features"].shape[0] if committed is None else committed
    fs = FeatureSet(name=name, rows=rows, **arrays)
    _check_set_structure(fs, path, exact=committed is None)
    return fs


def _check_set_structure(fs: FeatureSet, path: str, exact: bool) -> None:
    """``exact``: all three arrays have exactly ``rows`` rows; otherwise at least ``rows`` (the
    gallery of an appendable store, which may carry an uncommitted tail)."""
    where = f"'{path}' {fs.name}"
    feats = fs.features
    if feats.ndim != 2:
        raise StoreError(f"{where}/features must be 2-D (rows x dim), got shape {feats.shape}")
    if feats.dtype not in FEATURE_DTYPES:
        raise StoreError(f"{where}/features has dtype {feats.dtype}; expected float16 or float32")
    if feats.chunks[1] != feats.shape[1]:
        raise StoreError(
            f"{where}/features is chunked {feats.chunks}, splitting the feature axis; "
            f"rechunk to (rows, {feats.shape[1]})"
        )
    for field in ("pids", "camids"):
        dtype = getattr(fs, field).dtype
        if dtype != np.dtype(np.int64):
            raise StoreError(f"{where}/{field} has dtype {dtype}; expected int64")
    if fs.rows < 0:
        raise StoreError(f"'{path}': attribute {COMMITTED_ATTR} is {fs.rows}, a negative row count "
                         f"(the store's metadata is damaged); {RECREATE}")
    if not exact and feats.shape[0] < fs.rows:
        raise StoreError(f"{where}: {fs.rows} rows are committed but features hold only {feats.shape[0]}")
    for field in ("pids", "camids"):
        arr = getattr(fs, field)
        if arr.ndim != 1 or (arr.shape[0] != feats.shape[0] if exact else arr.shape[0] < fs.rows):
            raise StoreError(
                f"{where}: {field} has shape {arr.shape} but features have {feats.shape[0]} rows; "
                "features, pids and camids must have one entry per image"
            )
    if fs.rows == 0:
        raise StoreError(f"{where} set is empty" + ("" if exact else " (no committed rows: was writing interrupted?)"))


def _check_safeguards(fs: FeatureSet, path: str) -> None:
    """Checksums and fill values that make a damaged or missing chunk fail loudly (module docstring)."""
    for field in FIELDS:
        arr = getattr(fs, field)
        codecs = getattr(arr.metadata, "codecs", ())
        if not codecs or not isinstance(codecs[-1], Crc32cCodec):
            raise StoreError(f"'{path}' {fs.name}/{field} is stored without crc32c chunk checksums; {RECREATE}")
        fill = arr.fill_value
        if not (np.isnan(fill) if field == "features" else fill == ID_FILL):
            expected = "NaN" if field == "features" else f"{ID_FILL}"
            raise StoreError(f"'{path}' {fs.name}/{field} has fill value {fill}, expected {expected} (so that a "
                             f"missing chunk cannot read as data); {RECREATE}")


# ------------------------------------------------------------------------------------------ checking rows


def check_batch(features, pids, camids, where: str, dim: int | None = None, dtype=None, first_row: int = 0):
    """Validate an in-memory batch of rows and return it as (features in ``dtype``, int64 pids,
    int64 camids); ``dtype``: the stored feature dtype (default: keep the features' own).

    Features must be floating point, finite and representable in ``dtype`` (``check_features``); ids
    integers that fit int64, other than the reserved ``ID_FILL``; all three the same length.
    ``where`` names the batch in messages and ``first_row`` is the number of its first row.
    """
    features = np.asarray(features)
    pids = np.asarray(pids)
    camids = np.asarray(camids)
    if features.ndim != 2:
        raise StoreError(f"{where} features must be 2-D (rows x dim), got shape {features.shape}")
    if features.dtype.kind != "f":
        raise StoreError(f"{where} features have dtype {features.dtype}; expected floating point")
    for label, ids in (("pids", pids), ("camids", camids)):
        if ids.ndim != 1 or ids.shape[0] != features.shape[0]:
            raise StoreError(
                f"{where} {label} has shape {ids.shape} but features have {features.shape[0]} rows"
            )
        check_ids(ids, f"{where} {label}", first_row)
    if features.shape[0] == 0:
        raise StoreError(f"{where} set is empty")
    if features.shape[1] == 0 or (dim is not None and features.shape[1] != dim):
        raise StoreError(f"{where} features have dimension {features.shape[1]}, expected {dim or 'at least 1'}")
    dtype = features.dtype if dtype is None else np.dtype(dtype)
    check_features(features, dtype, where, first_row)
    return features.astype(dtype, copy=False), pids.astype(np.int64, copy=False), camids.astype(np.int64, copy=False)


def check_features(features: np.ndarray, dtype: np.dtype, where: str, first_row: int = 0) -> None:
    """Refuse rows that are not finite or would not survive the cast to the stored ``dtype``: a value
    beyond its largest (it would become inf), or a nonzero row whose largest magnitude is below its
    smallest normal (the whole row would become zeros or keep only a few significant bits).

    Single values below the smallest normal in a row of normal scale are accepted: their rounding
    error is below the one of the row's largest value, as for any rounding to ``dtype``.
    """
    finite = np.isfinite(features).all(axis=1)
    if not finite.all():
        raise StoreError(f"{where} features hold non-finite values (NaN or inf), "
                         f"first at row {first_row + int(np.flatnonzero(~finite)[0])}")
    info = np.finfo(dtype)
    tiny, huge = np.float64(info.tiny), np.float64(info.max)  # compared in float64, whatever the rows' dtype
    scale = np.maximum(features.max(axis=1), -features.min(axis=1))  # largest magnitude per row
    outside = (scale > huge) | ((scale > 0) & (scale < tiny))
    if not outside.any():
        return
    local = int(np.flatnonzero(outside)[0])
    row, largest = first_row + local, float(scale[local])
    representable = f"{dtype} represents magnitudes from {float(tiny):.4g} to {float(huge):.4g}"
    if largest > huge:
        fix = "store the features as float32" if dtype == np.float16 else "rescale the features"
        raise StoreError(f"{where} features row {row} holds values too large for {dtype} (largest magnitude "
                         f"{largest:.4g}; {representable}); {fix}")
    raise StoreError(f"{where} features row {row} is too small for {dtype}: its largest magnitude {largest:.4g} "
                     f"would be stored as zero or with few significant bits ({representable}); rescale the features")


def check_ids(ids: np.ndarray, where: str, first_row: int = 0) -> None:
    """Integer ids that keep their value as int64 (checked on the source dtype, before the cast:
    uint64 ids from 2**63 would wrap to negative ones), other than the reserved ``ID_FILL``."""
    if ids.dtype.kind not in "iu":
        raise StoreError(f"{where} have dtype {ids.dtype}; expected integers")
    if ids.dtype.itemsize < 8 or ids.size == 0:
        return  # every smaller integer type fits, above the reserved value
    bad = ids > ID_MAX if ids.dtype.kind == "u" else ids == ID_FILL
    if bad.any():
        local = int(np.flatnonzero(bad)[0])
        why = "does not fit int64" if ids.dtype.kind == "u" else "is reserved to mark missing chunks"
        raise StoreError(f"{where} row {first_row + local} holds {int(ids[local])}, which {why}; "
                         f"ids must lie in [{ID_FILL + 1}, {ID_MAX}]")


def row_number(rows, i: int) -> int:
    """The set's row number of the i-th row read by ``rows`` (a first row, a slice or an array)."""
    if isinstance(rows, slice):
        return (rows.start or 0) + i
    return int(rows[i]) if np.ndim(rows) else rows + i


def _feature_dtype(dtype) -> np.dtype:
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        dtype = None
    if dtype not in FEATURE_DTYPES:
        raise StoreError(f"feature dtype must be float16 or float32, got {dtype}")
    return dtype


# ------------------------------------------------------------------------------------------------ writing


def refuse_existing(target, overwrite: bool) -> None:
    """Never replace what is at a path unasked."""
    if is_local_path(target) and os.path.lexists(target) and not overwrite:
        raise StoreError(f"'{os.fspath(target)}' already exists; pass --overwrite (overwrite=True) to replace it")


def _remove(path) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.remove(path)


@contextlib.contextmanager
def new_store(target, overwrite: bool):
    """Around creating and filling a store at ``target`` (``create_store`` ... ``commit_gallery``).

    With ``overwrite``, what is at ``target`` is deleted first (so the new store never needs the room
    of both).  If anything fails while writing, the partial store is removed; an OSError (no space
    left, read-only file system, permission denied) becomes a StoreError naming the path.
    """
    path = _describe(target)
    refuse_existing(target, overwrite)
    replaced = is_local_path(target) and os.path.lexists(target)
    if replaced:
        try:
            _remove(target)
        except OSError as exc:
            raise StoreError(f"cannot replace '{path}': {exc.strerror or exc} (it may be partly deleted)") from None
    try:
        yield
    except BaseException as exc:
        partial = is_local_path(target) and os.path.lexists(target)
        if partial:
            with contextlib.suppress(OSError):
                _remove(target)
        if isinstance(exc, OSError):
            notes = ["the old store had been deleted first (--overwrite)"] if replaced else []
            if partial:
                notes.append("the partial store could not be removed" if os.path.lexists(target)
                             else "the partial store was removed")
            raise StoreError("; ".join([f"cannot write '{path}': {exc.strerror or exc}", *notes])) from None
        raise


def create_store(
    target,
    n_query: int,
    n_gallery: int,
    dim: int,
    dtype: str = "float32",
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    default_metric: str = "euclidean",
    overwrite: bool = False,
) -> Store:
    """Create an empty store of the given shape, to be filled with ``write_rows`` (inside
    ``new_store``, which cleans up after a failure).

    ``target`` is a path or a zarr store object.  Refuses to touch an existing path unless
    ``overwrite`` is set.
    """
    dtype = _feature_dtype(dtype)
    if default_metric not in METRICS:
        raise StoreError(f"default metric must be one of {', '.join(METRICS)}, got {default_metric!r}")
    if min(n_query, n_gallery) <= 0 or dim <= 0:
        raise StoreError(f"cannot create a store with {n_query} queries, {n_gallery} gallery rows, dim {dim}")
    refuse_existing(target, overwrite)
    group = zarr.open_group(target, mode="w")
    group.attrs.update({"streameval_schema": SCHEMA_VERSION, "default_metric": default_metric, COMMITTED_ATTR: 0,
                        UID_ATTR: uuid.uuid4().hex})
    for name, rows in (("query", n_query), ("gallery", n_gallery)):
        chunk = max(1, min(chunk_rows, rows))
        group.create_array(f"{name}/features", shape=(rows, dim), dtype=dtype, chunks=(chunk, dim),
                           compressors=[Crc32cCodec()], fill_value=np.nan)
        for field in ("pids", "camids"):
            group.create_array(f"{name}/{field}", shape=(rows,), dtype=np.int64, chunks=(chunk,),
                               compressors=[ZstdCodec(level=0, checksum=False), Crc32cCodec()], fill_value=ID_FILL)
    return open_store(target, mode="r+", _writing=True)


def estimated_bytes(n_query: int, n_gallery: int, dim: int, dtype, chunk_rows: int, block: int = 4096) -> int:
    """Disk space a store of this shape takes, at most: every chunk file written in full (the last one
    padded), ids uncompressed, each file and feature chunk directory rounded up to a ``block``."""
    def blocks(nbytes):
        return -(-nbytes // block) * block

    total = 16 * block  # zarr.json files and group directories
    for rows in (n_query, n_gallery):
        chunk = max(1, min(chunk_rows, rows))
        per_chunk = (blocks(chunk * dim * np.dtype(dtype).itemsize + CHECKSUM_BYTES) + block
                     + 2 * blocks(chunk * 8 + 64 + CHECKSUM_BYTES))
        total += -(-rows // chunk) * per_chunk
    return total


def commit_gallery(target) -> Store:
    """Mark every gallery row written, the last step of creating or appending to a store: readers
    see only committed rows, so an interrupted write never reads as a longer gallery."""
    group = zarr.open_group(target, mode="r+")
    group.attrs[COMMITTED_ATTR] = group["gallery/features"].shape[0]
    return open_store(target)


def write_rows(fs: FeatureSet, start: int, features, pids, camids) -> None:
    """Write a batch of rows at ``start``, checked first (``check_batch``) and cast to the store dtype."""
    columns = check_batch(features, pids, camids, fs.name, fs.dim, fs.features.dtype, start)
    for field, values in zip(FIELDS, columns):
        arr = getattr(fs, field)
        try:
            arr[start:start + len(values)] = values
        except OSError:
            raise  # no space, read-only...: reported with the store's path by new_store / append_batches
        except Exception as exc:  # a partial chunk is read back to be merged: it may be damaged
            raise StoreError(f"{fs.name} rows {start}-{start + len(values) - 1}: cannot update the {field} chunks "
                             f"of '{arr.store_path}' ({one_line(exc)}); the store is damaged: {RECREATE}") from None


def write_store(
    target,
    query_features,
    query_pids,
    query_camids,
    gallery_features,
    gallery_pids,
    gallery_camids,
    dtype: str | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    default_metric: str = "euclidean",
    overwrite: bool = False,
) -> Store:
    """Write in-memory arrays as a new store (validated before anything touches the disk)."""
    if dtype is None:
        dtype = "float16" if np.asarray(query_features).dtype == np.float16 else "float32"
    dtype = _feature_dtype(dtype)
    q = check_batch(query_features, query_pids, query_camids, "query", dtype=dtype)
    g = check_batch(gallery_features, gallery_pids, gallery_camids, "gallery", dtype=dtype)
    if q[0].shape[1] != g[0].shape[1]:
        raise StoreError(
            f"query features have dimension {q[0].shape[1]} but gallery features have {g[0].shape[1]}"
        )
    with new_store(target, overwrite):
        store = create_store(target, len(q[1]), len(g[1]), q[0].shape[1], dtype, chunk_rows, default_metric)
        for fs, rows in ((store.query, q), (store.gallery, g)):
            for start in range(0, len(rows[1]), fs.chunk_rows):
                stop = start + fs.chunk_rows
                write_rows(fs, start, rows[0][start:stop], rows[1][start:stop], rows[2][start:stop])
        return commit_gallery(target)


def append_gallery(target, features, pids, camids) -> Store:
    """Append rows to the gallery of an existing store and return the reopened store (see
    ``append_batches``)."""
    fs = open_store(target).gallery
    features, pids, camids = check_batch(features, pids, camids, "appended gallery", fs.dim, fs.features.dtype)
    step = fs.chunk_rows
    batches = ((first, features[first:first + step], pids[first:first + step], camids[first:first + step])
               for first in range(0, features.shape[0], step))
    return append_batches(target, features.shape[0], batches)


def append_batches(target, n_rows: int, batches) -> Store:
    """Append ``n_rows`` gallery rows given as ``(offset, features, pids, camids)`` batches.

    Data first, the committed row count last: interrupted anywhere, the store still reads as it was
    (a half-written tail past the committed rows is ignored, and dropped by the next append).  An
    OSError (no space left...) becomes a StoreError saying so, after dropping the tail written so far.
    """
    fs = open_store(target, mode="r+").gallery
    start = len(fs)
    try:
        for arr in (fs.features, fs.pids, fs.camids):
            arr.resize((start + n_rows,) + arr.shape[1:])
        for offset, features, pids, camids in batches:
            write_rows(fs, start + offset, features, pids, camids)
        return commit_gallery(target)
    except OSError as exc:
        with contextlib.suppress(Exception):  # free the space the uncommitted rows took, if the disk lets us
            for arr in (fs.features, fs.pids, fs.camids):
                arr.resize((start,) + arr.shape[1:])
        raise StoreError(f"cannot write '{_describe(target)}': {exc.strerror or exc}; the store is unchanged "
                         f"(none of the {n_rows:,} rows were appended; it still has {start:,} gallery rows)") from None


# ------------------------------------------------------------------------------------------------ reading


def _chunk_rows_range(arr: zarr.Array, index: int) -> tuple[int, int]:
    first = index * arr.chunks[0]
    return first, min(first + arr.chunks[0], arr.shape[0])


def _chunk_key(arr: zarr.Array, index: int) -> str:
    return arr.metadata.encode_chunk_key((index,) + (0,) * (arr.ndim - 1))


def _chunk_location(arr: zarr.Array, index: int) -> str:
    """The chunk's file (a local path, else the store's URL and the key)."""
    where = arr.store_path / _chunk_key(arr, index)
    if isinstance(where.store, zarr.storage.LocalStore):
        return os.path.join(where.store.root, where.path)
    return str(where)


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
            return StoreError(f"{fs.name} rows {first}-{stop - 1}: the {field} chunk {_chunk_location(arr, index)} "
                              f"cannot be read ({_read_failure(chunk_exc)}); the store is damaged: restore that file "
                              "or recreate the store")
    return StoreError(f"cannot read {fs.name} {field} from '{arr.store_path}' ({_read_failure(exc)})")


def _read_failure(exc: Exception) -> str:
    text = one_line(exc)
    return "its crc32c checksum does not match its bytes" if "checksum do not match" in text else text


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
    try:
        values = arr.oindex[(rows,) + (slice(None),) * (arr.ndim - 1)]
    except Exception as exc:  # zarr, its codecs and the store raise many types for a damaged chunk
        raise _damaged(fs, field, rows, exc) from None
    filled = ~np.isfinite(values).all(axis=1) if field == "features" else values == ID_FILL
    if filled.any():
        raise _filled(fs, field, row_number(rows, int(np.flatnonzero(filled)[0])))
    return values


def read_rows(fs: FeatureSet, rows, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read rows of a set (a slice, or an array of row numbers: only their chunks are read):
    features upcast to ``dtype`` and checked finite, ids as int64."""
    features = np.ascontiguousarray(read_field(fs, "features", rows), dtype=dtype)
    pids = np.asarray(read_field(fs, "pids", rows), dtype=np.int64)
    camids = np.asarray(read_field(fs, "camids", rows), dtype=np.int64)
    return features, pids, camids


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
            read_rows(fs, slice(start, min(start + fs.chunk_rows, len(fs))), fs.features.dtype)


# ------------------------------------------------------------------------------------------- fingerprint


def rows_fingerprint(fs: FeatureSet, rows: int) -> str:
    """A hash of rows [0, rows) of a set covering every chunk that holds them, cheaply.

    A chunk wholly below ``rows`` contributes its stored crc32c (the last bytes of the chunk file,
    one small ranged read: a rewritten value changes it); the chunk holding row ``rows`` - 1, when
    it is partial, contributes the values of its rows below ``rows`` (an append rewrites the rest
    of that chunk).  So appending rows leaves the fingerprint of the old rows as it was, and
    rewriting any of them changes it.  A missing chunk file raises StoreError.
    """
    if not 0 <= rows <= len(fs):
        raise StoreError(f"cannot fingerprint {rows:,} {fs.name} rows: the set has {len(fs):,}")
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{rows} {fs.dim} {fs.features.dtype} {fs.chunk_rows}".encode())
    for field in FIELDS:
        arr = getattr(fs, field)
        whole = rows // arr.chunks[0]
        digest.update(field.encode())
        for checksum in _stored_checksums(fs, field, whole):
            digest.update(checksum)
        tail = slice(whole * arr.chunks[0], rows)
        if tail.stop > tail.start:
            digest.update(np.ascontiguousarray(read_field(fs, field, tail)).tobytes())
    return digest.hexdigest()


def _stored_checksums(fs: FeatureSet, field: str, n_chunks: int) -> list[bytes]:
    """The crc32c of the first ``n_chunks`` chunks of one array, read as the last bytes of each file."""
    arr = getattr(fs, field)
    prototype = default_buffer_prototype()

    async def last_bytes(index):
        return await (arr.store_path / _chunk_key(arr, index)).get(prototype, SuffixByteRequest(CHECKSUM_BYTES))

    try:
        limit = zarr.config.get("async.concurrency")
        buffers = sync(concurrent_map([(i,) for i in range(n_chunks)], last_bytes, limit))
    except Exception as exc:  # an unreadable file, a store error
        raise StoreError(f"cannot read the chunk checksums of {fs.name} {field} in '{arr.store_path}' "
                         f"({one_line(exc)})") from None
    checksums = []
    for index, buffer in enumerate(buffers):
        data = None if buffer is None else buffer.to_bytes()
        if data is None or len(data) != CHECKSUM_BYTES:
            first, stop = _chunk_rows_range(arr, index)
            state = "missing from the store" if data is None else "truncated"
            raise StoreError(f"{fs.name} rows {first}-{stop - 1}: chunk {state} ({field}: "
                             f"{_chunk_location(arr, index)}); restore that file or recreate the store")
        checksums.append(data)
    return checksums
