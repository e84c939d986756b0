"""The store's layout: schema constants, FeatureSet / Store, and opening a store with every
structural check metadata allows (see the package docstring)."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec

from ..core.choices import INT64_MIN, METRICS
from ..core.errors import StoreError, StoreWarning, one_line
from ..core.locking import reading
from .identity import UPGRADING_ATTR, bound_group


SCHEMA_VERSION = 3  # 3: chunk checksums bound to the chunk's place (store.identity); 2 is still read
LEGACY_SCHEMA = 2  # crc32c checksums of the bytes alone: read as before, upgraded by 'validate --upgrade'
COMMITTED_ATTR = "committed_gallery_rows"
UID_ATTR = "store_uid"  # random, made when a store is created: a rewritten store gets a new one
CAMERAS_ATTR = "cameras"  # false: the input had no camera ids, every row is camera 0 (protocols without cameras only)
SETS = ("query", "gallery")
FIELDS = ("features", "pids", "camids")
FEATURE_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))  # float64: query expansion's
DISTANCE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
DISTANCE_KINDS = ("distance", "similarity")  # a distance store's values (``store.distances``)
DEFAULT_CHUNK_ROWS = 8192
ID_FILL = INT64_MIN  # the ids' fill value: reserved, never a valid id
CHECKSUM_BYTES = 4  # crc32c, appended to every encoded chunk
RECREATE = "recreate it with 'streameval convert' (from the .npz) or 'streameval synth'"


@dataclass(frozen=True)
class FeatureSet:
    """The arrays describing one set (query or gallery): features and ids, or in a distance store
    (``store.distances``) ids and the queries' distances to the set's rows (features None)."""

    name: str
    features: zarr.Array | None
    pids: zarr.Array
    camids: zarr.Array
    rows: int  # committed rows: the arrays may hold an uncommitted tail left by an interrupted append
    distances: zarr.Array | None = None  # distance stores: (queries, rows)
    period: int = 0  # a stack of variants (``stack.stack_sets``): row i stands for row i % period
    # how a set other than stored features is read, checked and fingerprinted, given by its kind's
    # module (``distances.Distances``, ``stack.Stack``); None: stored features
    reader: object = None

    def __len__(self) -> int:
        return self.rows

    @property
    def dim(self) -> int:
        """Feature dimension; 0 in a distance store."""
        return 0 if self.features is None else self.features.shape[1]

    @property
    def chunk_rows(self) -> int:
        return self.pids.chunks[0]

    @property
    def values(self) -> zarr.Array | None:
        """The array of the set's values: features, or a distance store's distances (None for a
        distance store's queries without query x query distances)."""
        return self.features if self.features is not None else self.distances

    @property
    def value_bytes(self) -> int:
        """Bytes of one row's values: its features, or its column of stored distances."""
        values = self.values
        return 0 if values is None else values.dtype.itemsize * (self.dim or values.shape[0])

    @property
    def fields(self) -> tuple:
        """The arrays of the set, each with one entry (or column) per row."""
        return FIELDS if self.features is not None else ("pids", "camids")


@dataclass(frozen=True)
class Store:
    """An opened, structurally valid feature store."""

    path: str
    query: FeatureSet
    gallery: FeatureSet
    default_metric: str
    uid: str | None = None
    kind: str = "features"  # or a distance store's "distance" / "similarity"
    cameras: bool = True  # False: converted from an input without camera ids (every camid is 0)
    # a local store's reader lock (``locking.reading``), held while the Store lives: never replaced under it
    reader_lock: object = field(default=None, repr=False, compare=False)

    @property
    def dim(self) -> int:
        return self.query.dim

    @property
    def holds_distances(self) -> bool:
        return self.kind != "features"


def is_local_path(target) -> bool:
    """A local path (URLs such as s3://bucket/x.zarr are opened through fsspec instead)."""
    return isinstance(target, (str, os.PathLike)) and "://" not in os.fspath(target)


def describe(target) -> str:
    return os.fspath(target) if isinstance(target, (str, os.PathLike)) else repr(target)


def refuse_links(target) -> None:
    """Before writing into the local store at ``target``: nothing inside it is a symbolic link.  A
    write follows a link to what it points at (another store's array, a folder elsewhere), so no
    command writes into a store holding one; reading it is fine.  (The store's own path may be a
    link: that is the store the user named.)"""
    if not is_local_path(target):
        return
    root = os.path.realpath(target)
    for folder, dirs, files in os.walk(root):  # os.walk lists a linked folder but does not enter it
        for name in dirs + files:
            entry = os.path.join(folder, name)
            if os.path.islink(entry):
                raise StoreError(f"'{os.fspath(target)}': {os.path.relpath(entry, root)} is a symbolic link (to "
                                 f"'{os.readlink(entry)}'), and streameval writes nothing through a link out of a "
                                 "store; put a copy in its place (cp -rL) to write to this store")




def open_store(target, mode: str = "r", storage_options: dict | None = None, _writing: bool = False) -> Store:
    """Open a store (a path, an fsspec URL with ``storage_options``, or a zarr store object) and
    check its structure.

    Raises StoreError naming the first problem found.  (``_writing``: a store being filled by
    ``create_store`` + ``write_rows``, whose gallery rows are not committed yet.)
    """
    path = describe(target)
    lock = reading(path) if is_local_path(target) else None  # None where there is no store: open_group says so
    group = open_group(target, mode, storage_options)
    attrs = group.attrs.asdict()
    committed = None if _writing else _committed_rows(attrs, path)
    kind = _content_kind(attrs, path)
    query, gallery = OPENERS[kind](group, path, committed, kind)
    default_metric = attrs.get("default_metric", "euclidean") if kind == "features" else kind
    if kind == "features" and default_metric not in METRICS:
        raise StoreError(f"'{path}': default_metric {default_metric!r} is not one of {', '.join(METRICS)}")
    return Store(path=path, query=query, gallery=gallery, default_metric=default_metric, uid=attrs.get(UID_ATTR),
                 kind=kind, cameras=attrs.get(CAMERAS_ATTR) is not False, reader_lock=lock)


def _open_feature_sets(group: zarr.Group, path: str, committed: int | None, kind: str) -> tuple:
    """(query, gallery) FeatureSets of a feature store, every structural fact checked."""
    query = _open_set(group, path, "query", None)
    gallery = _open_set(group, path, "gallery", committed)
    if query.dim != gallery.dim:
        raise StoreError(
            f"'{path}': query features have dimension {query.dim} but gallery features have {gallery.dim}"
        )
    for fs in (query, gallery):
        check_safeguards(fs, path)
    return query, gallery


# a store's kind (``_content_kind``) -> what opens its sets: (group, path, committed rows, kind) ->
# (query, gallery); the kinds of other modules register there (``distances``)
OPENERS = {"features": _open_feature_sets}


def open_group(target, mode: str = "r", storage_options: dict | None = None) -> zarr.Group:
    """The store's zarr group, without the structure checks of ``open_store``: zarr's own API on a
    store whose chunks carry their identity (schema 3) must go through this group (plain
    ``zarr.open_group`` reads every chunk checksum there as a mismatch, and writes chunks that
    fail in their place)."""
    group, attrs = plain_group(target, mode, storage_options)
    return _identity_bound(group, attrs, describe(target), mode)


def plain_group(target, mode: str = "r", storage_options: dict | None = None) -> tuple[zarr.Group, dict]:
    """The store's zarr group on its zarr store as it is (chunk checksums as stored), and its
    attributes; StoreError when there is no zarr group."""
    path = describe(target)
    if is_local_path(target) and not os.path.exists(path):
        raise StoreError(f"no feature store at '{path}' (create one with 'streameval synth' or 'streameval convert')")
    try:
        group = zarr.open_group(target, mode=mode, storage_options=storage_options or None)
        return group, group.attrs.asdict()
    except Exception as exc:  # zarr raises several types for "not a group"
        raise StoreError(f"'{path}' is not a zarr v3 group: {one_line(exc)}") from None


def _identity_bound(group: zarr.Group, attrs: dict, path: str, mode: str) -> zarr.Group:
    """The store's group, on a ChunkIdentityStore when its chunks carry their identity (schema 3);
    a schema 2 store is read as it is, with a warning saying how to upgrade it."""
    schema = attrs.get("streameval_schema")
    if schema == 1:
        raise StoreError(f"'{path}' was written by an older streameval (store schema 1: no chunk checksums, "
                         f"missing chunks read as zeros); {RECREATE}")
    if schema not in (LEGACY_SCHEMA, SCHEMA_VERSION):
        raise StoreError(f"'{path}' is not a streameval store of schema {LEGACY_SCHEMA} or {SCHEMA_VERSION} "
                         f"(attribute streameval_schema={schema!r})")
    if attrs.get(UPGRADING_ATTR):
        raise StoreError(f"'{path}': the upgrade of its chunks to their identity was interrupted; finish it with "
                         f"'streameval validate --upgrade {path}'")
    if schema == LEGACY_SCHEMA:
        warn_once(f"'{path}' is a store of schema {LEGACY_SCHEMA}: its chunk checksums do not say which chunk they "
                  f"are (moved or swapped chunk files go unnoticed); upgrade it in place with "
                  f"'streameval validate --upgrade {path}'")
        return group
    uid = attrs.get(UID_ATTR)
    if not isinstance(uid, str) or not uid:
        raise StoreError(f"'{path}': attribute {UID_ATTR} is {uid!r}, not a store id (the store's metadata is "
                         f"damaged); {RECREATE}")
    return bound_group(group, uid, mode)


_warned: set = set()


def warn_once(message: str) -> None:
    """A StoreWarning, once per process for each message (stores are opened many times a command)."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, StoreWarning, stacklevel=3)


def _content_kind(attrs: dict, path: str) -> str:
    """"features", or a distance store's kind."""
    content = attrs.get("content", "features")
    if content == "features":
        return content
    kind = attrs.get("kind")
    if content != "distances" or kind not in DISTANCE_KINDS:
        raise StoreError(f"'{path}': attributes content={content!r}, kind={kind!r} name no store streameval reads "
                         f"(content 'features', or 'distances' of kind {' or '.join(DISTANCE_KINDS)})")
    return kind


def _committed_rows(attrs: dict, path: str) -> int:
    """The committed gallery row count (its range is checked against the arrays in ``_open_set``)."""
    value = attrs.get(COMMITTED_ATTR)
    if isinstance(value, bool) or not isinstance(value, int):
        raise StoreError(f"'{path}': attribute {COMMITTED_ATTR} is {value!r}, not a row count "
                         f"(the store's metadata is damaged); {RECREATE}")
    return value


def open_array(group: zarr.Group, path: str, key: str, required: bool = True) -> zarr.Array | None:
    """The array at ``key`` (None when absent and not ``required``)."""
    try:
        arr = group[key]
    except KeyError as missing:
        # zarr raises it from a future that holds it: its traceback's frames (and their callers',
        # an opened Store with its reader lock among them) would live in that cycle until a collection
        missing.__traceback__ = None
        if not required:
            return None
        raise StoreError(f"'{path}' has no '{key}' array") from None
    except Exception as exc:  # a damaged zarr.json
        raise StoreError(f"'{path}': cannot read the metadata of '{key}': {one_line(exc)}") from None
    if not isinstance(arr, zarr.Array):
        raise StoreError(f"'{path}': '{key}' is a group, expected an array")
    return arr


def _open_set(group: zarr.Group, path: str, name: str, committed: int | None) -> FeatureSet:
    arrays = {field: open_array(group, path, f"{name}/{field}") for field in FIELDS}
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
        raise StoreError(f"{where}/features has dtype {feats.dtype}; expected float16, float32 or float64")
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


def check_safeguards(fs: FeatureSet, path: str) -> None:
    """Checksums and fill values that make a damaged or missing chunk fail loudly (module docstring)."""
    fields = fs.fields + (("distances",) if fs.distances is not None else ())
    for field in fields:
        arr = getattr(fs, field)
        codecs = getattr(arr.metadata, "codecs", ())
        if not codecs or not isinstance(codecs[-1], Crc32cCodec):
            raise StoreError(f"'{path}' {fs.name}/{field} is stored without crc32c chunk checksums; {RECREATE}")
        fill = arr.fill_value
        values = field in ("features", "distances")
        if not (np.isnan(fill) if values else fill == ID_FILL):
            expected = "NaN" if values else f"{ID_FILL}"
            raise StoreError(f"'{path}' {fs.name}/{field} has fill value {fill}, expected {expected} (so that a "
                             f"missing chunk cannot read as data); {RECREATE}")
