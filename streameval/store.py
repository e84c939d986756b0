"""The feature store: a zarr v3 group holding query and gallery features.

Layout (schema version 1)::

    STORE.zarr/                       group attrs: streameval_schema = 1,
                                                   default_metric = "euclidean"
        query/features   (Nq, D)  float16 | float32, chunked (rows, D): never split along D
        query/pids       (Nq,)    int64   person ids (-1 junk, 0 distractor by convention)
        query/camids     (Nq,)    integer camera ids
        gallery/features (Ng, D)  as above
        gallery/pids     (Ng,)    int64
        gallery/camids   (Ng,)    integer

The three arrays of a set are chunked by the same number of rows so one chunk of each describes the
same images. Feature values are not compressed (float features do not compress); ids are.

``open_store`` checks everything that metadata alone can tell (arrays present, dtypes, shapes,
chunking) and raises :class:`~streameval.errors.StoreError` with a readable message. Values
(non-finite features) are checked as chunks are read (``read_rows``), so a full scan is never an
extra pass over a large gallery; ``validate_values`` does that scan on demand.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

import numpy as np
import zarr
from zarr.core.sync import sync

from .errors import StoreError

SCHEMA_VERSION = 1
COMMITTED_ATTR = "committed_gallery_rows"
UID_ATTR = "store_uid"  # random, made when a store is created: a rewritten store gets a new one
SETS = ("query", "gallery")
FIELDS = ("features", "pids", "camids")
FEATURE_DTYPES = (np.dtype(np.float16), np.dtype(np.float32))
METRICS = ("euclidean", "sqeuclidean", "cosine")
DEFAULT_CHUNK_ROWS = 8192


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
    uid: str | None = None  # None for stores written before uids existed

    @property
    def dim(self) -> int:
        return self.query.dim


def _is_path(target) -> bool:
    """A local path (URLs such as s3://bucket/x.zarr are opened through fsspec instead)."""
    return isinstance(target, (str, os.PathLike)) and "://" not in os.fspath(target)


def open_store(target, mode: str = "r", storage_options: dict | None = None, _writing: bool = False) -> Store:
    """Open a store (a path, an fsspec URL with ``storage_options``, or a zarr store object) and
    check its structure.

    Raises StoreError naming the first problem found.  (``_writing``: a store being filled by
    ``create_store`` + ``write_rows``, whose gallery rows are not committed yet.)
    """
    path = os.fspath(target) if isinstance(target, (str, os.PathLike)) else repr(target)
    if _is_path(target) and not os.path.exists(path):
        raise StoreError(f"no feature store at '{path}' (create one with 'streameval synth' or 'streameval convert')")
    try:
        group = zarr.open_group(target, mode=mode, storage_options=storage_options or None)
    except Exception as exc:  # zarr raises several types for "not a group"
        raise StoreError(f"'{path}' is not a zarr v3 group: {exc}") from None
    schema = group.attrs.get("streameval_schema")
    if schema != SCHEMA_VERSION:
        raise StoreError(
            f"'{path}' is not a streameval store of schema {SCHEMA_VERSION} (attribute streameval_schema={schema!r})"
        )
    committed = None if _writing else group.attrs.get(COMMITTED_ATTR)
    query = _open_set(group, path, "query", None)
    gallery = _open_set(group, path, "gallery", committed)
    if query.dim != gallery.dim:
        raise StoreError(
            f"'{path}': query features have dimension {query.dim} but gallery features have {gallery.dim}"
        )
    default_metric = group.attrs.get("default_metric", "euclidean")
    if default_metric not in METRICS:
        raise StoreError(f"'{path}': default_metric {default_metric!r} is not one of {', '.join(METRICS)}")
    return Store(path=path, query=query, gallery=gallery, default_metric=default_metric, uid=group.attrs.get(UID_ATTR))


def _open_set(group: zarr.Group, path: str, name: str, committed: int | None) -> FeatureSet:
    arrays = {}
    for field in FIELDS:
        key = f"{name}/{field}"
        try:
            arrays[field] = group[key]
        except KeyError:
            raise StoreError(f"'{path}' has no '{key}' array") from None
        if not isinstance(arrays[field], zarr.Array):
            raise StoreError(f"'{path}': '{key}' is a group, expected an array")
    rows = arrays["features"].shape[0] if committed is None else int(committed)
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
    if fs.pids.dtype != np.dtype(np.int64):
        raise StoreError(f"{where}/pids has dtype {fs.pids.dtype}; expected int64")
    if fs.camids.dtype.kind not in "iu":
        raise StoreError(f"{where}/camids has dtype {fs.camids.dtype}; expected an integer type")
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


def check_batch(features, pids, camids, where: str, dim: int | None = None):
    """Validate an in-memory batch of rows and return it as (float array, int64, int64).

    Features must be floating point and finite; ids integer; all three the same length.
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
        if ids.dtype.kind not in "iu":
            raise StoreError(f"{where} {label} have dtype {ids.dtype}; expected integers")
    if features.shape[0] == 0:
        raise StoreError(f"{where} set is empty")
    if dim is not None and features.shape[1] != dim:
        raise StoreError(f"{where} features have dimension {features.shape[1]}, expected {dim}")
    _check_finite(features, where, 0)
    return features, pids.astype(np.int64, copy=False), camids.astype(np.int64, copy=False)


def row_number(rows, i: int) -> int:
    """The set's row number of the i-th row read by ``rows`` (a first row, a slice or an array)."""
    if isinstance(rows, slice):
        return (rows.start or 0) + i
    return int(rows[i]) if np.ndim(rows) else rows + i


def _check_finite(features: np.ndarray, where: str, rows) -> None:
    """``rows``: the first row's number, or the selection read (for the message)."""
    finite_rows = np.isfinite(features).all(axis=1)
    if not finite_rows.all():
        bad = row_number(rows, int(np.flatnonzero(~finite_rows)[0]))
        raise StoreError(f"{where} features hold non-finite values (NaN or inf), first at row {bad}")


def _feature_dtype(dtype) -> np.dtype:
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        dtype = None
    if dtype not in FEATURE_DTYPES:
        raise StoreError(f"feature dtype must be float16 or float32, got {dtype}")
    return dtype


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
    """Create an empty store of the given shape, to be filled with ``write_rows``.

    ``target`` is a path or a zarr store object.  Refuses to touch an existing path unless
    ``overwrite`` is set.
    """
    dtype = _feature_dtype(dtype)
    if default_metric not in METRICS:
        raise StoreError(f"default metric must be one of {', '.join(METRICS)}, got {default_metric!r}")
    if min(n_query, n_gallery) <= 0 or dim <= 0:
        raise StoreError(f"cannot create a store with {n_query} queries, {n_gallery} gallery rows, dim {dim}")
    if _is_path(target) and os.path.exists(target) and not overwrite:
        raise StoreError(f"'{os.fspath(target)}' already exists; pass --overwrite (overwrite=True) to replace it")
    group = zarr.open_group(target, mode="w")
    group.attrs.update({"streameval_schema": SCHEMA_VERSION, "default_metric": default_metric, COMMITTED_ATTR: 0,
                        UID_ATTR: uuid.uuid4().hex})
    for name, rows in (("query", n_query), ("gallery", n_gallery)):
        chunk = max(1, min(chunk_rows, rows))
        group.create_array(f"{name}/features", shape=(rows, dim), dtype=dtype, chunks=(chunk, dim), compressors=None)
        group.create_array(f"{name}/pids", shape=(rows,), dtype=np.int64, chunks=(chunk,))
        group.create_array(f"{name}/camids", shape=(rows,), dtype=np.int64, chunks=(chunk,))
    return open_store(target, mode="r+", _writing=True)


def commit_gallery(target) -> Store:
    """Mark every gallery row written, the last step of creating or appending to a store: readers
    see only committed rows, so an interrupted write never reads as a longer gallery."""
    group = zarr.open_group(target, mode="r+")
    group.attrs[COMMITTED_ATTR] = group["gallery/features"].shape[0]
    return open_store(target)


def write_rows(fs: FeatureSet, start: int, features, pids, camids) -> None:
    """Write a validated batch of rows at ``start`` (features cast to the store dtype)."""
    features, pids, camids = check_batch(features, pids, camids, f"{fs.name} rows {start}+", fs.dim)
    stop = start + features.shape[0]
    with np.errstate(over="ignore"):  # overflow to inf is reported just below
        stored = features.astype(fs.features.dtype, copy=False)
    _check_finite(stored, f"{fs.name} (after casting to {fs.features.dtype})", start)
    fs.features[start:stop] = stored
    fs.pids[start:stop] = pids
    fs.camids[start:stop] = camids


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
    q = check_batch(query_features, query_pids, query_camids, "query")
    g = check_batch(gallery_features, gallery_pids, gallery_camids, "gallery")
    if q[0].shape[1] != g[0].shape[1]:
        raise StoreError(
            f"query features have dimension {q[0].shape[1]} but gallery features have {g[0].shape[1]}"
        )
    if dtype is None:
        dtype = "float16" if q[0].dtype == np.float16 else "float32"
    dtype = _feature_dtype(dtype)
    for name, rows in (("query", q), ("gallery", g)):  # refuse values the store dtype cannot hold, before writing
        with np.errstate(over="ignore"):
            _check_finite(rows[0].astype(dtype, copy=False), f"{name} (after casting to {dtype})", 0)
    store = create_store(
        target, len(q[1]), len(g[1]), q[0].shape[1], dtype, chunk_rows, default_metric, overwrite
    )
    for fs, rows in ((store.query, q), (store.gallery, g)):
        for start in range(0, len(rows[1]), fs.chunk_rows):
            stop = start + fs.chunk_rows
            write_rows(fs, start, rows[0][start:stop], rows[1][start:stop], rows[2][start:stop])
    return commit_gallery(target)


def append_gallery(target, features, pids, camids) -> Store:
    """Append rows to the gallery of an existing store and return the reopened store (see
    ``append_batches``)."""
    fs = open_store(target).gallery
    features, pids, camids = check_batch(features, pids, camids, "appended gallery", fs.dim)
    step = fs.chunk_rows
    batches = ((first, features[first:first + step], pids[first:first + step], camids[first:first + step])
               for first in range(0, features.shape[0], step))
    return append_batches(target, features.shape[0], batches)


def append_batches(target, n_rows: int, batches) -> Store:
    """Append ``n_rows`` gallery rows given as ``(offset, features, pids, camids)`` batches.

    Data first, the committed row count last: interrupted anywhere, the store still reads as it was
    (a half-written tail past the committed rows is ignored, and dropped by the next append).
    """
    fs = open_store(target, mode="r+").gallery
    start = len(fs)
    for arr in (fs.features, fs.pids, fs.camids):
        arr.resize((start + n_rows,) + arr.shape[1:])
    for offset, features, pids, camids in batches:
        write_rows(fs, start + offset, features, pids, camids)
    return commit_gallery(target)


def _require_present(arr: zarr.Array) -> None:
    """zarr answers the fill value for chunks it cannot find, so a process that cannot see the store
    (another machine, another working directory) would read zeros.  Check the array is there."""
    where = arr.store_path
    if not sync(where.store.exists(f"{where.path}/zarr.json")):
        raise StoreError(f"cannot read '{where}' from this process (store missing or not reachable here)")


def read_rows(fs: FeatureSet, rows, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read rows of a set (a slice, or an array of row numbers: only their chunks are read):
    features upcast to ``dtype`` and checked finite, ids as int64."""
    _require_present(fs.features)
    features = np.ascontiguousarray(fs.features.oindex[rows, :], dtype=dtype)
    _check_finite(features, fs.name, rows)
    pids = np.asarray(fs.pids.oindex[rows], dtype=np.int64)
    camids = np.asarray(fs.camids.oindex[rows], dtype=np.int64)
    return features, pids, camids


def read_ids(fs: FeatureSet, start: int = 0, stop: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Read pids and camids of rows [start, stop) as int64 (no features)."""
    stop = len(fs) if stop is None else stop
    _require_present(fs.pids)
    return (
        np.asarray(fs.pids[start:stop], dtype=np.int64),
        np.asarray(fs.camids[start:stop], dtype=np.int64),
    )


def validate_values(store: Store) -> None:
    """Scan every chunk of both sets and raise StoreError on the first non-finite feature."""
    for fs in (store.query, store.gallery):
        for start in range(0, len(fs), fs.chunk_rows):
            read_rows(fs, slice(start, min(start + fs.chunk_rows, len(fs))), fs.features.dtype)
