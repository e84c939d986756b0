"""Creating, filling and appending to stores: a failure never leaves a partial store (new stores
are removed, appends stay uncommitted) and an OSError is one StoreError line."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
import warnings

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from ..core.errors import StoreError, StoreWarning, one_line
from ..core.locking import replacing, writing
from ..core.outputs import refuse_foreign
from .layout import (CAMERAS_ATTR, CHECKSUM_BYTES, COMMITTED_ATTR, DEFAULT_CHUNK_ROWS, FEATURE_DTYPES, FIELDS, ID_FILL,
                     RECREATE, SCHEMA_VERSION, UID_ATTR, FeatureSet, Store, describe, is_local_path, open_store, plain_group, refuse_links)
from .identity import UPGRADING_ATTR, bound_group, upgrade
from .paths import appended_paths, write_path_rows
from .values import check_batch, check_metric, feature_dtype
from .variants import appended_variants


def refuse_existing(target, overwrite: bool) -> None:
    """Never replace what is at a path unasked, nor, even asked, what streameval did not write."""
    if not (is_local_path(target) and os.path.lexists(target)):
        return
    if not overwrite:
        raise StoreError(f"'{os.fspath(target)}' already exists; pass --overwrite (overwrite=True) to replace it")
    refuse_foreign(target, "streameval_schema", "store")


def _remove(path) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.remove(path)


@contextlib.contextmanager
def new_store(target, overwrite: bool):
    """Around creating and filling a store at ``target`` (``create_store`` ... ``commit_gallery``).

    With ``overwrite``, the store at ``target`` is deleted first (so the new store never needs the room
    of both), and only a store (``refuse_existing``).  The store's writer lock is held throughout
    (``locking.writing``, creating: readers wait), and a store being read is not replaced.  If
    anything fails while writing, the partial store is removed; an OSError (no space left, read-only
    file system, permission denied) becomes a StoreError naming the path.
    """
    path = describe(target)
    refuse_existing(target, overwrite)
    with writing(target, creating=True):
        refuse_existing(target, overwrite)  # again under the lock: another writer may have made it meanwhile
        replaced = is_local_path(target) and os.path.lexists(target)
        if replaced:
            _replace(target, path)
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


def _replace(target, path: str) -> None:
    """Delete the store at ``target`` for a new one, once nobody reads it (``locking.replacing``)."""
    try:
        with replacing(target) if os.path.isdir(target) and not os.path.islink(target) else contextlib.nullcontext():
            _remove(target)
    except OSError as exc:
        raise StoreError(f"cannot replace '{path}': {exc.strerror or exc} (it may be partly deleted)") from None


def create_store(
    target,
    n_query: int,
    n_gallery: int,
    dim: int,
    dtype: str = "float32",
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    default_metric: str = "euclidean",
    overwrite: bool = False,
    cameras: bool = True,
) -> Store:
    """Create an empty store of the given shape, to be filled with ``write_rows`` (inside
    ``new_store``, which cleans up after a failure).

    ``target`` is a path or a zarr store object.  Refuses to touch an existing path unless
    ``overwrite`` is set.  ``cameras=False``: the input has no camera ids (the rows are written
    with camera 0, and protocols that use cameras refuse the store).
    """
    dtype = feature_dtype(dtype, FEATURE_DTYPES)
    check_metric(default_metric)
    if dim <= 0:
        raise StoreError(f"cannot create a store with {n_query} queries, {n_gallery} gallery rows, dim {dim}")
    group = create_group(target, n_query, n_gallery, {"default_metric": default_metric, **camera_attrs(cameras)},
                         chunk_rows, overwrite)
    for name, rows in (("query", n_query), ("gallery", n_gallery)):
        group.create_array(f"{name}/features", shape=(rows, dim), dtype=dtype, chunks=(_chunk(chunk_rows, rows), dim),
                           compressors=[Crc32cCodec()], fill_value=np.nan)
    return open_store(target, mode="r+", _writing=True)


def camera_attrs(cameras: bool) -> dict:
    """The store attribute saying its camera ids are placeholders (none when they are real)."""
    return {} if cameras else {CAMERAS_ATTR: False}


def create_group(target, n_query: int, n_gallery: int, attrs: dict, chunk_rows: int = DEFAULT_CHUNK_ROWS,
                 overwrite: bool = False) -> zarr.Group:
    """A new store's group with its attributes and empty id arrays (feature and distance stores)."""
    if min(n_query, n_gallery) <= 0:
        raise StoreError(f"cannot create a store with {n_query} queries and {n_gallery} gallery rows")
    refuse_existing(target, overwrite)
    uid = uuid.uuid4().hex
    group = zarr.open_group(target, mode="w")
    group.attrs.update({"streameval_schema": SCHEMA_VERSION, COMMITTED_ATTR: 0, UID_ATTR: uid, **attrs})
    group = bound_group(group, uid, "r+")  # every chunk written carries its identity
    for name, rows in (("query", n_query), ("gallery", n_gallery)):
        for field in ("pids", "camids"):
            group.create_array(f"{name}/{field}", shape=(rows,), dtype=np.int64, chunks=(_chunk(chunk_rows, rows),),
                               compressors=[ZstdCodec(level=0, checksum=False), Crc32cCodec()], fill_value=ID_FILL)
    return group


def _chunk(chunk_rows: int, rows: int) -> int:
    return max(1, min(chunk_rows, rows))


def estimated_bytes(n_query: int, n_gallery: int, dim: int, dtype, chunk_rows: int, block: int = 4096) -> int:
    """Disk space a store of this shape takes, at most: every chunk file written in full (the last one
    padded), ids uncompressed, each file and feature chunk directory rounded up to a ``block``."""
    def blocks(nbytes):
        return -(-nbytes // block) * block

    total = 16 * block  # zarr.json files and group directories
    for rows in (n_query, n_gallery):
        chunk = _chunk(chunk_rows, rows)
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
    dtype = feature_dtype(array_dtype(np.asarray(query_features).dtype) if dtype is None else dtype)
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


def array_dtype(dtype) -> np.dtype:
    """The dtype a store written from arrays of ``dtype`` keeps: float16 stays float16, any other is float32."""
    return np.dtype(np.float16 if np.dtype(dtype) == np.float16 else np.float32)


def appendable(target) -> Store:
    """The store at ``target``, opened, if gallery rows can be appended to it."""
    store = open_store(target)
    if store.holds_distances:
        raise StoreError(f"'{store.path}' holds precomputed {store.kind}s, which do not grow: appended gallery rows "
                         "would change the old rows' re-ranked distances too; write a new distance store")
    return store


def append_gallery(target, features, pids, camids, paths=None, variants=None) -> Store:
    """Append rows to the gallery of an existing store and return the reopened store (see
    ``append_batches``; ``paths``: the new rows' image paths, for a store holding gallery paths;
    ``variants``: the new rows of every gallery variant, {name: features} or {name: {"features",
    "corruption_type", "severity"}}, required when the store has any)."""
    fs = appendable(target).gallery
    features, pids, camids = check_batch(features, pids, camids, "appended gallery", fs.dim, fs.features.dtype)
    step = fs.chunk_rows
    batches = ((first, features[first:first + step], pids[first:first + step], camids[first:first + step])
               for first in range(0, features.shape[0], step))
    return append_batches(target, features.shape[0], batches, paths, variants)


def append_batches(target, n_rows: int, batches, paths=None, variants=None) -> Store:
    """Append ``n_rows`` gallery rows given as ``(offset, features, pids, camids)`` batches, and
    their image ``paths`` when the store holds gallery paths (``paths.appended_paths``), and the
    new rows of every gallery variant (``variants.appended_variants``: all checked first).

    Data first, the committed row count last: interrupted anywhere, the store still reads as it was
    (a half-written tail past the committed rows is ignored, and dropped by the next append).  An
    OSError (no space left...) becomes a StoreError saying so, after dropping the tail written so far.
    All under the store's writer lock (``locking.writing``): a concurrent writer waits or is refused.
    """
    with writing(target):  # the committed count read here is the one the rows go after
        return _append_locked(target, n_rows, batches, paths, variants)


def _append_locked(target, n_rows: int, batches, paths, variants) -> Store:
    appendable(target)
    refuse_links(target)
    store = open_store(target, mode="r+")
    fs = store.gallery
    start = len(fs)
    paths_array, paths = appended_paths(fs, describe(target), paths, n_rows)
    variant_rows = appended_variants(store, variants, n_rows)
    arrays = (fs.features, fs.pids, fs.camids) + (() if paths_array is None else (paths_array,))
    arrays += tuple(arr for variant in variant_rows for arr in variant.arrays)
    try:
        for arr in arrays:
            arr.resize((start + n_rows,) + arr.shape[1:])
        for offset, features, pids, camids in batches:
            write_rows(fs, start + offset, features, pids, camids)
        if paths_array is not None:
            write_path_rows(paths_array, start, paths)
        for variant in variant_rows:
            variant.write(start)
        return commit_gallery(target)
    except OSError as exc:
        with contextlib.suppress(Exception):  # free the space the uncommitted rows took, if the disk lets us
            for arr in arrays:
                arr.resize((start,) + arr.shape[1:])
        raise StoreError(f"cannot write '{describe(target)}': {exc.strerror or exc}; the store is unchanged "
                         f"(none of the {n_rows:,} rows were appended; it still has {start:,} gallery rows)") from None


def upgrade_store(target, say=None) -> Store:
    """Give the chunks of a store of schema 2 their identity, in place (``identity.upgrade``: each
    chunk file replaced atomically, an interrupted upgrade finished by running it again); a store
    of schema 3 is left as it is.  Returns the store reopened."""
    path = describe(target)
    with writing(target):  # it rewrites every chunk: no other writer meanwhile
        group, attrs = plain_group(target, "r+")
        if attrs.get(UPGRADING_ATTR) or attrs.get("streameval_schema") != SCHEMA_VERSION:
            if not attrs.get(UPGRADING_ATTR):
                with warnings.catch_warnings():  # the warning that says to run this
                    warnings.simplefilter("ignore", StoreWarning)
                    open_store(target)  # refuses what is not a structurally valid store of schema 2
            upgrade(group, attrs.get(UID_ATTR), path, say)
        elif say:
            say(f"'{path}' is of schema {SCHEMA_VERSION} already: its chunks carry their identity")
    return open_store(target)
