"""Distance stores: a query x gallery distance (or similarity) matrix instead of features.

What re-ranking tools (k-reciprocal, query expansion) produce, and what every evaluator in the field
accepts, in an out-of-core form.  The engine evaluates it with the same protocols and statistics as
features, with the stored values as the distances (no GEMM: ``kernels.PRECOMPUTED``)::

    STORE.zarr/                  group attrs: streameval_schema = 3, content = "distances",
                                              kind = "distance" | "similarity", committed_gallery_rows, store_uid
        query/pids, query/camids      (Nq,)       int64, as in a feature store
        gallery/pids, gallery/camids  (Ng,)       int64
        gallery/distances             (Nq, Ng)    float32 | float64: row i = query i, column j = gallery row j
        query/distances               (Nq, Nq)    optional, the queries against each other: needed only by
                                                  protocols whose gallery includes the queries (mars)

Each ``<set>/distances`` array is chunked (query rows, the set's id chunk rows), so a gallery chunk of
the engine reads whole chunk columns.  A ``similarity`` store is read as distance = -similarity: the
larger the similarity, the earlier in the ranking, ties by gallery index as always.  Values are
checked finite before anything is written, and again as blocks are read (a damaged or missing chunk
is a StoreError, never a number: fill value NaN, crc32c checksums, as for features).

A distance store does not grow: ``append`` and ``update`` refuse it (appending gallery rows would
change re-ranked distances of the old rows too; docs/distances.md#what-applies).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec

from ..core.choices import check_range
from ..core.errors import StoreError, one_line
from .layout import (COMMITTED_ATTR, DISTANCE_DTYPES, DISTANCE_KINDS, OPENERS, RECREATE, FeatureSet, Store,
                     check_safeguards, open_array, open_store)
from .values import check_ids

CHUNK_BYTES = 8 << 20  # a distance chunk: about 8 MiB


def write_distance_store(out, distances, q_pids, q_camids, g_pids, g_camids, *, kind: str = "distance",
                         query_distances=None, chunk_rows: int | None = None, overwrite: bool = False,
                         cameras: bool = True) -> Store:
    """Write a distance store at ``out`` and return it opened.

    ``distances`` (Nq x Ng) and ``query_distances`` (Nq x Nq, optional) are any 2-D array-likes
    sliceable by rows and columns (numpy arrays, memory maps, h5py datasets): they are read a chunk
    at a time, twice (every value is checked before ``out`` is touched).  float16 values are stored
    as float32, float32 and float64 as given.  ``chunk_rows``: gallery rows per chunk column.
    ``cameras=False``: the camids are placeholders (the input had none), as ``create_store``'s.
    """
    from .writing import camera_attrs, create_group, new_store

    if kind not in DISTANCE_KINDS:
        raise StoreError(f"kind must be one of {', '.join(DISTANCE_KINDS)}, got {kind!r}")
    ids = {name: _ids(values, name) for name, values in
           (("query pids", q_pids), ("query camids", q_camids), ("gallery pids", g_pids), ("gallery camids", g_camids))}
    n_query, n_gallery = len(ids["query pids"]), len(ids["gallery pids"])
    if len(ids["query camids"]) != n_query or len(ids["gallery camids"]) != n_gallery:
        raise StoreError("pids and camids must have one entry per image (their lengths differ)")
    matrices = {"gallery": distances} if query_distances is None else {"gallery": distances, "query": query_distances}
    shapes = {"gallery": (n_query, n_gallery), "query": (n_query, n_query)}
    dtypes = {name: _stored_dtype(matrix, name, shapes[name]) for name, matrix in matrices.items()}
    set_chunk = _chunks(shapes["gallery"], dtypes["gallery"], chunk_rows)[1]  # both sets' id chunk rows
    steps = {name: _chunks(shapes[name], dtypes[name], set_chunk) for name in matrices}
    for name, matrix in matrices.items():
        for rows, cols in _blocks(shapes[name], steps[name]):
            _checked(matrix, rows, cols, name, dtypes[name])
    with new_store(out, overwrite):
        group = create_group(out, n_query, n_gallery, {"content": "distances", "kind": kind, **camera_attrs(cameras)},
                             set_chunk)
        group["query/pids"][:], group["query/camids"][:] = ids["query pids"], ids["query camids"]
        group["gallery/pids"][:], group["gallery/camids"][:] = ids["gallery pids"], ids["gallery camids"]
        for name, matrix in matrices.items():
            arr = group.create_array(f"{name}/distances", shape=shapes[name], dtype=dtypes[name],
                                     chunks=steps[name], compressors=[Crc32cCodec()], fill_value=np.nan)
            for rows, cols in _blocks(shapes[name], steps[name]):
                arr[rows, cols] = _checked(matrix, rows, cols, name, dtypes[name])
        group.attrs[COMMITTED_ATTR] = n_gallery
    return open_store(out)


def _ids(values, where: str) -> np.ndarray:
    ids = np.asarray(values)
    if ids.ndim != 1:
        raise StoreError(f"{where} must be 1-D, got shape {ids.shape}")
    check_ids(ids, where)
    return ids.astype(np.int64)


def _stored_dtype(matrix, name: str, shape: tuple) -> np.dtype:
    if getattr(matrix, "ndim", None) != 2 or tuple(matrix.shape) != shape:
        what = "gallery distances (queries x gallery)" if name == "gallery" else "query distances (queries x queries)"
        raise StoreError(f"the {what} must have shape {shape}, got {tuple(getattr(matrix, 'shape', ()))}")
    dtype = np.dtype(matrix.dtype)
    if dtype.kind != "f":
        raise StoreError(f"{name} distances have dtype {dtype}; distances must be floating point")
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def _chunks(shape: tuple, dtype: np.dtype, chunk_rows: int | None) -> tuple:
    """(query rows, set rows) per chunk: ``chunk_rows`` set rows, and query rows for ~CHUNK_BYTES."""
    if chunk_rows is not None:
        check_range(chunk_rows, "chunk_rows")
    cols = max(1, min(shape[1], chunk_rows or 8192))
    return max(1, min(shape[0], CHUNK_BYTES // (cols * dtype.itemsize))), cols


def _blocks(shape: tuple, steps: tuple):
    for a in range(0, shape[0], steps[0]):
        for b in range(0, shape[1], steps[1]):
            yield slice(a, min(a + steps[0], shape[0])), slice(b, min(b + steps[1], shape[1]))


def _checked(matrix, rows: slice, cols: slice, name: str, dtype: np.dtype) -> np.ndarray:
    block = np.asarray(matrix[rows, cols]).astype(dtype, copy=False)
    bad = ~np.isfinite(block)
    if bad.any():
        i, j = (int(x[0]) for x in np.nonzero(bad))
        raise StoreError(f"{name} distances hold a non-finite value at query {rows.start + i}, "
                         f"{name} row {cols.start + j}: {block[i, j]}")
    return block


def open_distance_sets(group: zarr.Group, path: str, committed: int | None, kind: str) -> tuple:
    """(query, gallery) FeatureSets of a distance store, every structural fact checked."""
    sets = {}
    for name in ("query", "gallery"):
        pids, camids = (open_array(group, path, f"{name}/{field}") for field in ("pids", "camids"))
        for arr in (pids, camids):
            if arr.ndim != 1 or arr.dtype != np.dtype(np.int64) or arr.shape != pids.shape:
                raise StoreError(f"'{path}' {name}: pids and camids must be 1-D int64 arrays of one length, got "
                                 f"{pids.dtype}{pids.shape} and {camids.dtype}{camids.shape}")
        if pids.shape[0] == 0:
            raise StoreError(f"'{path}' {name} set is empty")
        sets[name] = (pids, camids, open_array(group, path, f"{name}/distances", required=name == "gallery"))
    n_query = sets["query"][0].shape[0]
    result = []
    for name, (pids, camids, distances) in sets.items():
        rows = pids.shape[0]
        if name == "gallery" and committed not in (None, rows):
            raise StoreError(f"'{path}': attribute {COMMITTED_ATTR} is {committed!r} but the gallery has {rows} rows; "
                             f"{RECREATE}")
        if distances is not None:
            _check_matrix(distances, path, name, (n_query, rows), pids.chunks[0])
        fs = FeatureSet(name=name, features=None, pids=pids, camids=camids, rows=rows, distances=distances,
                        reader=Distances(kind == "similarity"))
        check_safeguards(fs, path)
        result.append(fs)
    return tuple(result)


def _check_matrix(arr: zarr.Array, path: str, name: str, shape: tuple, set_chunk: int) -> None:
    where = f"'{path}' {name}/distances"
    if arr.shape != shape:
        raise StoreError(f"{where} has shape {arr.shape}, expected {shape} (queries x {name} rows)")
    if arr.dtype not in DISTANCE_DTYPES:
        raise StoreError(f"{where} has dtype {arr.dtype}; expected float32 or float64")
    if arr.chunks[1] != min(set_chunk, shape[1]):
        raise StoreError(f"{where} is chunked {arr.chunks}: its columns must be chunked as the {name} ids "
                         f"({set_chunk} rows); {RECREATE}")


@dataclass(frozen=True)
class Distances:
    """How a distance store's set is read (``FeatureSet.reader``): its stored distances to the queries."""

    similarity: bool  # a similarity store: its values are negated into distances

    def read(self, fs: FeatureSet, query_rows, start: int, stop: int) -> np.ndarray:
        """float64 distances of ``query_rows`` (a slice or row numbers) to the set's rows [start, stop),
        checked finite; a similarity store's values negated."""
        arr = fs.distances
        try:
            block = arr.oindex[query_rows, start:stop]
        except Exception as exc:  # zarr, its codecs and the store raise many types for a damaged chunk
            raise StoreError(f"{fs.name} rows {start}-{stop - 1}: cannot read their distances in "
                             f"'{arr.store_path}' ({one_line(exc)}); restore the file or recreate the store") from None
        block = np.asarray(block, dtype=np.float64)
        if not np.isfinite(block).all():
            raise StoreError(f"{fs.name} rows {start}-{stop - 1}: distances missing or not finite "
                             f"(a missing chunk file reads as NaN) in '{arr.store_path}'")
        return -block if self.similarity else block

    def validate(self, fs: FeatureSet, start: int, stop: int) -> None:
        """Read every stored distance to the set's rows [start, stop), a chunk at a time (``validate_values``)."""
        if fs.distances is None:  # the queries of a store without query x query distances
            return
        step = fs.distances.chunks[0]
        for first in range(0, fs.distances.shape[0], step):
            self.read(fs, slice(first, first + step), start, stop)


OPENERS.update(dict.fromkeys(DISTANCE_KINDS, open_distance_sets))
