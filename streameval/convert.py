"""``convert_npz``: an .npz of query/gallery features and ids -> a feature store; ``append_npz``: an
.npz of gallery rows -> appended to a store.

The .npz holds six arrays, under their long or short names (``evaluate.ARRAY_NAMES``)::

    query_features   | qf          gallery_features | gf
    query_pids       | q_pids      gallery_pids     | g_pids
    query_camids     | q_camids    gallery_camids   | g_camids

``numpy.load`` reads a whole .npz member into memory (``mmap_mode`` does not apply to archives), so
members are streamed instead: each is opened in the zip (stored or deflated alike), its .npy header
parsed, and its rows read a store chunk at a time.  Memory stays bounded by a chunk, except for a
2-D member saved in Fortran order, which has to be read whole.

Everything is checked before the output is touched: the arrays' presence, shapes and dtypes from
the .npy headers, then every value in one streaming pass (``store.check_batch``: finite features that
survive the cast to the stored dtype, ids that fit int64).  Only then is the store created and
written, in a second pass; if that fails (no space left...), the partial store is removed
(``store.new_store``).
"""

from __future__ import annotations

import os
import zipfile
import zlib

import numpy as np
from numpy.lib import format as npy_format

from . import plan
from .errors import OptionError, StoreError
from .evaluate import ARRAY_NAMES, pick_array
from .store import (Store, append_batches, check_batch, check_metric, commit_gallery, create_store, feature_dtype,
                    new_store, open_store, refuse_existing, write_rows)

_READ_ERRORS = (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError)


class _Member:
    """One .npy member of the archive: header facts, and its rows read in order."""

    def __init__(self, zf: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, src: str):
        self.zf, self.info, self.name, self.src = zf, info, name, src
        try:
            with zf.open(info) as fh:
                self.shape, self.fortran, self.dtype = _read_header(fh)
        except _READ_ERRORS as exc:
            raise self._error(exc) from None
        self._whole = None

    def _error(self, exc: Exception) -> StoreError:
        return StoreError(f"cannot read '{self.name}' from '{self.src}': {exc}")

    @property
    def row_items(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64))

    def chunks(self, step: int):
        """Yield consecutive blocks of ``step`` rows (the last one shorter)."""
        try:
            yield from self._chunks(step)
        except _READ_ERRORS as exc:
            raise self._error(exc) from None

    def _chunks(self, step: int):
        n = self.shape[0]
        if self.fortran and len(self.shape) > 1:
            if self._whole is None:
                with self.zf.open(self.info) as fh:
                    self._whole = npy_format.read_array(fh, allow_pickle=False)
            for start in range(0, n, step):
                yield self._whole[start:start + step]
            return
        with self.zf.open(self.info) as fh:
            _read_header(fh)
            row_bytes = self.row_items * self.dtype.itemsize
            for start in range(0, n, step):
                rows = min(step, n - start)
                data = _read_exact(fh, rows * row_bytes)
                yield np.frombuffer(data, dtype=self.dtype).reshape((rows,) + tuple(self.shape[1:]))


def _read_header(fh):
    version = npy_format.read_magic(fh)
    if version == (1, 0):
        return npy_format.read_array_header_1_0(fh)
    if version == (2, 0):
        return npy_format.read_array_header_2_0(fh)
    return npy_format._read_array_header(fh, version)  # 3.0: utf-8 header, same fields


def _read_exact(fh, nbytes: int) -> bytes:
    parts, remaining = [], nbytes
    while remaining:
        data = fh.read(remaining)
        if not data:
            raise EOFError("the data ends before the size its header declares")
        parts.append(data)
        remaining -= len(data)
    return b"".join(parts) if len(parts) != 1 else parts[0]


def _open_members(zf: zipfile.ZipFile, src: str, sets=("query", "gallery")) -> dict:
    """The arrays of ``sets`` by their long names (missing ones named in the error, with what is there)."""
    available = {info.filename[:-4]: info for info in zf.infolist() if info.filename.endswith(".npy")}
    members = {}
    for long_name in (name for name in ARRAY_NAMES if name.split("_")[0] in sets):
        try:
            info = pick_array(available, long_name)
        except OptionError as exc:
            holds = ", ".join(sorted(available)) or "no .npy arrays"
            raise StoreError(f"'{src}': {exc}; it holds: {holds}") from None
        members[long_name] = _Member(zf, info, info.filename[:-4], src)
    return members


def _check_headers(members: dict, src: str, sets=("query", "gallery")) -> int:
    """Shapes and dtypes of the arrays of ``sets``; returns the feature dimension."""
    for set_name in sets:
        feats = members[f"{set_name}_features"]
        if len(feats.shape) != 2:
            raise StoreError(f"'{src}': '{feats.name}' must be 2-D (rows x dim), got shape {feats.shape}")
        if feats.dtype.kind != "f":
            raise StoreError(f"'{src}': '{feats.name}' has dtype {feats.dtype}; features must be floating point")
        if feats.shape[0] == 0 or feats.shape[1] == 0:
            raise StoreError(f"'{src}': '{feats.name}' is empty (shape {feats.shape})")
        for field in ("pids", "camids"):
            ids = members[f"{set_name}_{field}"]
            if len(ids.shape) != 1:
                raise StoreError(f"'{src}': '{ids.name}' must be 1-D, got shape {ids.shape}")
            if ids.dtype.kind not in "iu":
                raise StoreError(f"'{src}': '{ids.name}' has dtype {ids.dtype}; ids must be integers")
            if ids.shape[0] != feats.shape[0]:
                raise StoreError(
                    f"'{src}': '{ids.name}' has {ids.shape[0]} entries but '{feats.name}' has {feats.shape[0]} rows; "
                    "features, pids and camids must have one entry per image"
                )
    dims = {set_name: members[f"{set_name}_features"].shape[1] for set_name in sets}
    if len(set(dims.values())) > 1:
        raise StoreError(
            f"'{src}': query features have dimension {dims['query']} but gallery features have {dims['gallery']}"
        )
    return int(dims[sets[0]])


def _batches(members: dict, set_name: str, step: int):
    """(start, features, pids, camids) per block of ``step`` rows of one set."""
    streams = (members[f"{set_name}_{field}"].chunks(step) for field in ("features", "pids", "camids"))
    start = 0
    for feats, pids, camids in zip(*streams):
        yield start, feats, pids, camids
        start += feats.shape[0]


def _check_values(members: dict, set_name: str, step: int, dim: int, dtype: np.dtype, src: str) -> None:
    """Every row as ``store.check_batch`` checks it before writing (finite features representable in
    the stored dtype, ids that fit int64), a block at a time."""
    for start, feats, pids, camids in _batches(members, set_name, step):
        check_batch(feats, pids, camids, f"'{src}': {set_name}", dim, dtype, start)


def convert_npz(
    input_npz,
    out,
    *,
    dtype: str | None = None,
    chunk_rows: int | None = None,
    default_metric: str = "euclidean",
    overwrite: bool = False,
) -> Store:
    """Convert an .npz of features and ids into a store at ``out`` and return it opened.

    The stored dtype is ``dtype`` if given (float16 or float32), else float16 when the input
    features are float16 and float32 otherwise (float64 inputs are stored as float32).  Raises
    StoreError, before touching ``out``, when an array is missing or malformed or a value is not
    finite; refuses to replace an existing ``out`` unless ``overwrite``.
    """
    src = os.fspath(input_npz)
    check_metric(default_metric)
    if dtype is not None:
        dtype = feature_dtype(dtype)
    if chunk_rows is not None and chunk_rows < 1:
        raise OptionError(f"chunk_rows must be a positive integer, got {chunk_rows!r}")
    if not os.path.isfile(src):
        raise StoreError(f"no input file at '{src}'")
    if isinstance(out, (str, os.PathLike)) and os.path.exists(out):
        if os.path.samefile(out, src):
            raise StoreError(f"the output '{os.fspath(out)}' is the input file")
        real_out = os.path.realpath(out)
        if os.path.commonpath([real_out, os.path.realpath(src)]) == real_out:
            raise StoreError(
                f"the input '{src}' is inside the output '{os.fspath(out)}', which --overwrite would delete"
            )
    refuse_existing(out, overwrite)
    with _open_archive(src) as zf:
        return _convert(zf, src, out, dtype, chunk_rows, default_metric, overwrite)


def append_npz(input_npz, store_target) -> Store:
    """Append the gallery rows of an .npz (``gallery_features``, ``gallery_pids``,
    ``gallery_camids`` or ``gf``, ``g_pids``, ``g_camids``) to an existing store, streamed a store
    chunk at a time.  Everything is checked before the store is touched; the rows become visible
    only once all are written (``store.append_batches``)."""
    src = os.fspath(input_npz)
    if not os.path.isfile(src):
        raise StoreError(f"no input file at '{src}'")
    store = open_store(store_target)
    with _open_archive(src) as zf:
        members = _open_members(zf, src, sets=("gallery",))
        dim = _check_headers(members, src, sets=("gallery",))
        if dim != store.dim:
            raise StoreError(f"'{src}': gallery features have dimension {dim} but the store's have {store.dim}")
        step = store.gallery.chunk_rows
        _check_values(members, "gallery", step, dim, store.gallery.features.dtype, src)
        return append_batches(store_target, members["gallery_features"].shape[0], _batches(members, "gallery", step))


def _open_archive(src: str) -> zipfile.ZipFile:
    if not zipfile.is_zipfile(src):
        raise StoreError(f"'{src}' is not an .npz archive (a zip of .npy arrays, as numpy.savez writes)")
    try:
        return zipfile.ZipFile(src)
    except _READ_ERRORS as exc:
        raise StoreError(f"cannot read '{src}': {exc}") from None


def _convert(zf, src, out, dtype, chunk_rows, default_metric, overwrite) -> Store:
    members = _open_members(zf, src)
    dim = _check_headers(members, src)
    if dtype is None:
        half = all(members[f"{s}_features"].dtype == np.float16 for s in ("query", "gallery"))
        dtype = np.dtype(np.float16 if half else np.float32)
    if chunk_rows is None:
        chunk_rows = plan.default_chunk_rows(dim, dtype.itemsize)
    for set_name in ("query", "gallery"):
        _check_values(members, set_name, chunk_rows, dim, dtype, src)
    n_query, n_gallery = (members[f"{s}_features"].shape[0] for s in ("query", "gallery"))
    with new_store(out, overwrite):
        store = create_store(out, n_query, n_gallery, dim, dtype.name, chunk_rows, default_metric)
        for fs in (store.query, store.gallery):
            for start, feats, pids, camids in _batches(members, fs.name, fs.chunk_rows):
                write_rows(fs, start, feats, pids, camids)
        return commit_gallery(out)
