"""Feature variants: named query or gallery feature arrays over a set's rows (docs/variants.md), e.g.
the same images corrupted (CIL-ReID) and their features extracted again.

Layout, beside the clean set (docs/variants.md)::

    {set}/variants/{name}/                group, JSON attributes: trial, seed, setting, source, ...
        features         (rows, D)  the set's dtype and row chunks, NaN fill, crc32c (like {set}/features)
        corruption_type  (rows,)    int32, optional (-1 = clean), chunked like the rows
        severity         (rows,)    int32, optional (0 = clean)

``set`` is ``query`` or ``gallery``.  A variant shares the set's pids, camids, junk and paths (stored
once) and its committed rows: an append writes the new rows of every gallery variant before the
commit (``appended_variants``), so an interrupted append leaves every variant as it was.  ``clean``
names the set's own features and is never stored here.  A variant is written whole, features
marked complete last: an interrupted write is refused on reading, never read as partial rows.

Names: letters, digits, ``.``, ``_`` and ``-``, not starting with a dot, not ``clean``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from ..core.errors import OptionError, StoreError, one_line
from ..core.locking import writing
from .layout import SETS, FeatureSet, Store, check_safeguards, describe, open_array, open_store, refuse_links
from .paths import _group
from .values import check_features

CLEAN = "clean"
GROUP = "variants"
COLUMNS = ("corruption_type", "severity")
COLUMN_DTYPE = np.dtype(np.int32)
COLUMN_FILL = int(np.iinfo(np.int32).min)  # never a valid value: a missing chunk reads as it
COLUMN_MIN = {"corruption_type": -1, "severity": 0}  # -1 / 0: a clean row
COMPLETE_ATTR = "complete"  # on the features array, set once every row is written
NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
INPUT_PREFIX = "variant."  # an append input's arrays: variant.NAME, variant.NAME.corruption_type, ...
FILE_ARRAYS = ("features", *COLUMNS, "pids", "camids")  # what a variant .npz may hold


# ------------------------------------------------------------------------------------------ names


def check_name(name) -> str:
    """A variant name that can be stored (OptionError otherwise)."""
    if not isinstance(name, str) or not NAME.fullmatch(name) or name == CLEAN or name == "zarr.json":
        raise OptionError(f"variant name {name!r}: use letters, digits, '.', '_' and '-' (not starting with a dot); "
                          f"'{CLEAN}' names the set's own features")
    return name


def _check_set(set_name) -> None:
    if set_name not in SETS:
        raise OptionError(f"no set {set_name!r}: variants belong to {' or '.join(SETS)}")


# ------------------------------------------------------------------------------------------ reading


def variant_names(store: Store, set_name: str) -> list[str]:
    """``clean``, then the names of the set's stored variants, sorted."""
    _check_set(set_name)
    try:
        group = _group(getattr(store, set_name))[f"{set_name}/{GROUP}"]
    except KeyError:
        return [CLEAN]
    except Exception as exc:  # a damaged zarr.json
        raise StoreError(f"'{store.path}': cannot read the metadata of '{set_name}/{GROUP}': {one_line(exc)}") from None
    if not isinstance(group, zarr.Group):
        raise StoreError(f"'{store.path}': '{set_name}/{GROUP}' is an array, expected a group of variants")
    return [CLEAN, *sorted(name for name in group.group_keys() if NAME.fullmatch(name) and name != CLEAN)]


@dataclass(frozen=True)
class _Stored:
    """A stored variant: its rows as a FeatureSet, its group and its optional columns."""

    fs: FeatureSet
    group: zarr.Group
    columns: dict  # column name -> zarr.Array | None


def _open(store: Store, set_name: str, name: str) -> _Stored:
    """The stored variant ``name`` of a set, its structure checked against the clean set's."""
    names = variant_names(store, set_name)
    if name == CLEAN or name not in names:
        raise StoreError(f"'{store.path}' has no {set_name} variant {name!r}; its {set_name} variants: "
                         f"{', '.join(names)}")
    clean = getattr(store, set_name)
    key = f"{set_name}/{GROUP}/{name}"
    root = _group(clean)
    features = open_array(root, store.path, f"{key}/features")
    fs = FeatureSet(name=f"{set_name} variant '{name}'", features=features, pids=clean.pids, camids=clean.camids,
                    rows=clean.rows)
    where = f"'{store.path}' {fs.name}"
    exact = set_name == "query"  # the gallery's arrays may carry the uncommitted tail of an interrupted append
    expected = (clean.features.shape[0], clean.dim)
    shape_ok = features.ndim == 2 and features.shape[1] == clean.dim and (
        features.shape[0] == clean.rows if exact else features.shape[0] >= clean.rows)
    if not shape_ok:
        raise StoreError(f"{where}: features have shape {features.shape}, expected {expected} like "
                         f"{set_name}/features; {_REWRITE}")
    if features.dtype != clean.features.dtype or features.chunks != clean.features.chunks:
        raise StoreError(f"{where}: features are {features.dtype} in chunks {features.chunks}, expected "
                         f"{clean.features.dtype} in chunks {clean.features.chunks} like {set_name}/features; "
                         f"{_REWRITE}")
    if not features.attrs.get(COMPLETE_ATTR):
        raise StoreError(f"{where} was not written completely (interrupted?); {_REWRITE}")
    check_safeguards(fs, store.path)
    columns = {column: _open_column(root, store.path, f"{key}/{column}", fs, exact) for column in COLUMNS}
    return _Stored(fs, root[key], columns)


_REWRITE = "write it again (streameval variants STORE --add SET:NAME=FILE --overwrite; write_variant(overwrite=True))"


def _open_column(root: zarr.Group, path: str, key: str, fs: FeatureSet, exact: bool) -> zarr.Array | None:
    arr = open_array(root, path, key, required=False)
    if arr is None:
        return None
    rows_ok = arr.shape[0] == fs.rows if exact else arr.shape[0] >= fs.rows
    if arr.ndim != 1 or not rows_ok or arr.dtype != COLUMN_DTYPE or arr.chunks != (fs.chunk_rows,):
        raise StoreError(f"'{path}' {key}: shape {arr.shape}, {arr.dtype}, chunks {arr.chunks}; expected "
                         f"{fs.rows:,} int32 values in chunks of {fs.chunk_rows:,} rows; {_REWRITE}")
    codecs = getattr(arr.metadata, "codecs", ())
    if not codecs or not isinstance(codecs[-1], Crc32cCodec) or arr.fill_value != COLUMN_FILL:
        raise StoreError(f"'{path}' {key} is stored without crc32c checksums or with fill value {arr.fill_value} "
                         f"(expected {COLUMN_FILL}); {_REWRITE}")
    return arr


def variant_set(store: Store, set_name: str, name: str) -> FeatureSet:
    """The rows of one variant as a FeatureSet: ``clean`` is the set itself; any other shares the
    set's pids, camids and rows, its features are the variant's, and its name (``query variant
    'corrupt-t0'``) is what read errors name."""
    _check_set(set_name)
    if name == CLEAN:
        return getattr(store, set_name)
    return _open(store, set_name, name).fs


def variant_columns(store: Store, set_name: str, name: str) -> dict:
    """{"corruption_type": int64 array | None, "severity": ...} over the committed rows (``clean``:
    both None)."""
    _check_set(set_name)
    if name == CLEAN:
        return dict.fromkeys(COLUMNS)
    stored = _open(store, set_name, name)
    return {column: None if arr is None else _read_column(arr, stored.fs, column)
            for column, arr in stored.columns.items()}


def _read_column(arr: zarr.Array, fs: FeatureSet, column: str) -> np.ndarray:
    try:
        values = arr[:fs.rows]
    except Exception as exc:  # zarr, its codecs and the store raise many types for a damaged chunk
        raise StoreError(f"cannot read the {column} of the {fs.name} ({_failure(exc)}); the store is damaged: "
                         f"{_REWRITE}") from None
    missing = values == COLUMN_FILL
    if missing.any():
        row = int(np.flatnonzero(missing)[0])
        raise StoreError(f"{fs.name} {column}: row {row} reads as the fill value, its chunk "
                         f"({row // arr.chunks[0]}) is missing; {_REWRITE}")
    return values.astype(np.int64)


def _failure(exc: Exception) -> str:
    text = one_line(exc)
    return "a crc32c checksum does not match its bytes" if "checksum do not match" in text else text


def variant_attrs(store: Store, set_name: str, name: str) -> dict:
    """The variant's JSON attributes (``clean``: {})."""
    _check_set(set_name)
    return {} if name == CLEAN else dict(_open(store, set_name, name).group.attrs)


# ------------------------------------------------------------------------------------------ rows to write


class VariantRows:
    """A variant's rows to write: ``features`` and optional per-row ``corruption_type`` and
    ``severity`` (and, from a file, the ``pids`` and ``camids`` they must match), each an array of the
    ``streameval.io`` interface (shape, dtype, ``blocks(step)``).  ``where`` names them in messages."""

    def __init__(self, where: str, arrays: dict):
        self.where, self.arrays = where, arrays

    @classmethod
    def of(cls, where: str, value) -> VariantRows:
        """From in-memory values: a features array, or {"features": ..., "corruption_type": ...,
        "severity": ...}."""
        from ..io.arrays import MemoryArray

        value = value if isinstance(value, dict) else {"features": value}
        unknown = sorted(set(value) - {"features", *COLUMNS})
        if unknown or "features" not in value:
            raise OptionError(f"{where}: expected features or a dict of features and optionally "
                              f"{' and '.join(COLUMNS)}, got keys {', '.join(map(str, value)) or 'none'}")
        return cls(where, {key: MemoryArray(f"{where} {key}", _rows(values))
                           for key, values in value.items() if values is not None})

    @property
    def columns(self) -> tuple:
        return tuple(column for column in COLUMNS if column in self.arrays)

    def check(self, rows: int, dim: int, dtype, step: int, ids=None) -> None:
        """Refuse rows that are not ``rows`` x ``dim`` finite features representable in ``dtype``,
        with valid columns, and (``ids(step)``: the clean rows' (pids, camids) blocks) ids other than
        the clean rows' — one streaming pass."""
        features = self.arrays["features"]
        if len(features.shape) != 2 or features.dtype.kind != "f":
            raise StoreError(f"{self.where}: features must be a 2-D floating-point array (rows x dim), got "
                             f"{features.dtype} of shape {features.shape}")
        if tuple(features.shape) != (rows, dim):
            raise StoreError(f"{self.where}: features have shape {tuple(features.shape)}, expected ({rows}, {dim}): "
                             "one row per row of the clean set, of its dimension")
        for key, arr in self.arrays.items():
            if key != "features" and (len(arr.shape) != 1 or arr.shape[0] != rows or arr.dtype.kind not in "iu"):
                raise StoreError(f"{self.where}: {key} must hold {rows:,} integers (one per row), got "
                                 f"{arr.dtype} of shape {tuple(arr.shape)}")
        given_ids = [key for key in ("pids", "camids") if key in self.arrays]
        clean_ids = ids(step) if ids is not None and given_ids else None
        start = 0
        for block in self.blocks(step, with_ids=bool(given_ids)):  # as given: the cast comes after the check
            check_features(block["features"], np.dtype(dtype), self.where, start)
            for column in self.columns:
                check_column(block[column], column, self.where, start)
            if clean_ids is not None:
                self._check_ids(block, dict(zip(("pids", "camids"), next(clean_ids))), start)
            start += block["features"].shape[0]

    def _check_ids(self, block: dict, clean: dict, start: int) -> None:
        for key in ("pids", "camids"):
            if key in block and not np.array_equal(block[key], clean[key]):
                row = start + int(np.flatnonzero(np.asarray(block[key]) != clean[key])[0])
                raise StoreError(f"{self.where}: {key} differ from the clean set's, first at row {row} "
                                 f"({block[key][row - start]} vs {clean[key][row - start]}); a variant holds the "
                                 "clean set's rows in the same order (docs/variants.md#layout)")

    def blocks(self, step: int, dtype=None, with_ids: bool = False):
        """{"features": rows, column: values, ...} per block of ``step`` rows, features cast to
        ``dtype`` (after ``check``), columns as int32."""
        keys = ["features", *self.columns, *([key for key in ("pids", "camids") if key in self.arrays]
                                             if with_ids else [])]
        for parts in zip(*(self.arrays[key].blocks(step) for key in keys)):
            block = dict(zip(keys, parts))
            if dtype is not None:
                block["features"] = block["features"].astype(dtype, copy=False)
            for column in self.columns:
                block[column] = np.asarray(block[column]).astype(COLUMN_DTYPE, copy=False)
            yield block


def check_column(values, column: str, where: str, first_row: int = 0) -> None:
    """Integers in [-1 (corruption_type) or 0 (severity), int32's largest]."""
    values = np.asarray(values)
    if values.dtype.kind not in "iu":
        raise StoreError(f"{where}: {column} has dtype {values.dtype}; expected integers")
    low, high = COLUMN_MIN[column], int(np.iinfo(COLUMN_DTYPE).max)
    bad = (values < low) | (values > high)
    if bad.any():
        local = int(np.flatnonzero(bad)[0])
        raise StoreError(f"{where}: {column} row {first_row + local} holds {int(values[local])}, outside "
                         f"[{low}, {high}] ({'-1' if low else '0'} marks a clean row)")


def check_attrs(attrs) -> dict:
    """JSON-serialisable attributes (OptionError otherwise)."""
    attrs = {} if attrs is None else attrs
    try:
        if not isinstance(attrs, dict):
            raise TypeError(f"a {type(attrs).__name__}")
        json.dumps(attrs, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise OptionError(f"variant attributes must be a dict of JSON values: {exc}") from None
    return dict(attrs)


# ------------------------------------------------------------------------------------------ writing


def writable(target):
    """``target`` for ``open_store(..., mode="r+")``: an opened Store becomes its zarr store, writable."""
    return target.query.pids.store_path.store.with_read_only(False) if isinstance(target, Store) else target


def write_variant(target, set_name: str, name: str, features, *, corruption_type=None, severity=None, attrs=None,
                  overwrite: bool = False) -> Store:
    """Add the variant ``name`` of a set (``query`` or ``gallery``) to the store at ``target`` (a
    path, a zarr store object or an opened Store), or with ``overwrite`` replace it; returns the
    store reopened.

    ``features``: one row per committed row of the set (a numpy array, a memory map, anything
    sliceable by rows), of the set's dimension; finite and representable in the stored dtype, to
    which it is cast.  ``corruption_type`` / ``severity``: optional integers, one per row (-1 / 0:
    clean).  ``attrs``: JSON attributes (trial, seed, setting, source, ...).  Everything is checked
    before the store is touched (StoreError naming the variant and the first bad row; OptionError for
    a bad name or set).
    """
    where = f"{set_name} variant '{name}'"
    rows = VariantRows.of(where, {"features": features, "corruption_type": corruption_type, "severity": severity})
    return add_variants(target, [(set_name, name, rows, attrs)], overwrite=overwrite)


def _rows(features):
    """Features as an array whose row slices are read lazily (memory maps, zarr and h5py arrays
    stay out of memory)."""
    return features if hasattr(features, "shape") and hasattr(features, "__getitem__") else np.asarray(features)


def add_variants(target, variants, *, overwrite: bool = False) -> Store:
    """Add ``variants``, [(set name, variant name, VariantRows, attributes or None)], to the store
    at ``target``: all checked first (names, not present unless ``overwrite``, rows and values, ids
    when given), then written one by one, all under the store's writer lock (``locking.writing``)."""
    where = target.path if isinstance(target, Store) else target
    with writing(where):
        refuse_links(where)
        return _add_locked(writable(target), variants, overwrite)


def _add_locked(target, variants, overwrite: bool) -> Store:
    store = open_store(target, mode="r+")
    _refuse_distances(store)
    seen = set()
    for set_name, name, rows, attrs in variants:
        check_attrs(attrs)
        _check_set(set_name)
        check_name(name)
        if (set_name, name) in seen:
            raise OptionError(f"{set_name} variant '{name}' is given twice")
        seen.add((set_name, name))
        _refuse_existing(store, set_name, name, overwrite)
        fs = getattr(store, set_name)
        rows.check(len(fs), fs.dim, fs.features.dtype, fs.chunk_rows, ids=lambda step, fs=fs: _stored_ids(fs, step))
    for set_name, name, rows, attrs in variants:
        fs = getattr(store, set_name)
        store = write_variant_blocks(target, set_name, name, rows.blocks(fs.chunk_rows, fs.features.dtype),
                                     columns=rows.columns, attrs=attrs, overwrite=overwrite)
    return store


def _stored_ids(fs: FeatureSet, step: int):
    from .reading import read_ids

    for start in range(0, len(fs), step):
        yield read_ids(fs, start, min(start + step, len(fs)))


def _refuse_distances(store: Store) -> None:
    if store.holds_distances:
        raise StoreError(f"'{store.path}' holds precomputed {store.kind}s: variants are feature arrays, "
                         "stored beside a feature store's features")


def _refuse_existing(store: Store, set_name: str, name: str, overwrite: bool) -> None:
    if not overwrite and name in variant_names(store, set_name):
        raise StoreError(f"'{store.path}' already has the {set_name} variant '{name}'; pass --overwrite "
                         "(overwrite=True) to replace it")


def write_variant_blocks(target, set_name: str, name: str, blocks, *, columns=(), attrs=None,
                         overwrite: bool = False) -> Store:
    """Write a variant from ``blocks``, {"features": rows, column: values} for consecutive rows
    (a store chunk each, for speed), each checked as it is written; the row count must be the set's.

    With ``overwrite`` an existing variant is deleted first.  If anything fails, the partial
    variant is removed; an OSError becomes a StoreError naming the store.
    """
    _check_set(set_name)
    check_name(name)
    attrs = check_attrs(attrs)
    target = writable(target)
    store = open_store(target, mode="r+")
    _refuse_distances(store)
    _refuse_existing(store, set_name, name, overwrite)
    fs = getattr(store, set_name)
    where = f"{set_name} variant '{name}'"
    root = _group(fs)
    key = f"{set_name}/{GROUP}/{name}"
    try:
        if key in root:
            del root[key]
        group = root.create_group(key, attributes=attrs)
        features = group.create_array("features", shape=(len(fs), fs.dim), dtype=fs.features.dtype,
                                      chunks=(fs.chunk_rows, fs.dim), compressors=[Crc32cCodec()], fill_value=np.nan)
        arrays = {column: create_column(group, column, len(fs), fs.chunk_rows) for column in columns}
        written = 0
        for block in blocks:
            n = block["features"].shape[0]
            if written + n > len(fs):
                raise StoreError(f"{where}: more than the set's {len(fs):,} rows given")
            check_features(block["features"], fs.features.dtype, where, written)
            features[written:written + n] = block["features"]
            for column, arr in arrays.items():
                check_column(block[column], column, where, written)
                arr[written:written + n] = block[column]
            written += n
        if written != len(fs):
            raise StoreError(f"{where}: {written:,} rows given for the set's {len(fs):,}")
        features.attrs[COMPLETE_ATTR] = True
    except BaseException as exc:
        with contextlib.suppress(Exception):
            del root[key]
        if isinstance(exc, OSError):
            raise StoreError(f"cannot write the {where} into '{describe(target)}': {exc.strerror or exc} "
                             "(the partial variant was removed)") from None
        raise
    return open_store(target)


def create_column(group: zarr.Group, column: str, rows: int, chunk_rows: int) -> zarr.Array:
    return group.create_array(column, shape=(rows,), dtype=COLUMN_DTYPE, chunks=(chunk_rows,), fill_value=COLUMN_FILL,
                              compressors=[ZstdCodec(level=0, checksum=False), Crc32cCodec()])


# ------------------------------------------------------------------------------------------ appends


class _Append:
    """One gallery variant's share of an append: the arrays to grow and the rows to write."""

    def __init__(self, stored: _Stored, rows: VariantRows):
        self.stored, self.rows = stored, rows
        self.arrays = (stored.fs.features, *(arr for arr in stored.columns.values() if arr is not None))

    def write(self, start: int) -> None:
        """Write the checked rows at gallery row ``start``, a store chunk at a time."""
        fs = self.stored.fs
        offset = start
        for block in self.rows.blocks(fs.chunk_rows, fs.features.dtype):
            n = block["features"].shape[0]
            fs.features[offset:offset + n] = block["features"]
            for column in self.rows.columns:
                self.stored.columns[column][offset:offset + n] = block[column]
            offset += n


def appended_variants(store: Store, variants, n_rows: int) -> list[_Append]:
    """For an append of ``n_rows`` gallery rows to ``store`` (opened for writing): every stored
    gallery variant's new rows, checked (names, columns, values) before anything is written.

    ``variants``: {name: features | {"features", "corruption_type", "severity"} | VariantRows}, or
    None; it must name every stored gallery variant and no other (StoreError naming them)."""
    names = variant_names(store, "gallery")[1:]
    given = dict(variants or {})
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise StoreError(f"'{store.path}' has no gallery variant {', '.join(repr(n) for n in unknown)} to append to; "
                         f"its gallery variants: {', '.join([CLEAN, *names])} (add one with write_variant or "
                         "'streameval variants STORE --add gallery:NAME=FILE')")
    missing = [name for name in names if name not in given]
    if missing:
        raise StoreError(f"'{store.path}' has the gallery variants {', '.join(names)}: every one needs the appended "
                         f"rows, and those of {', '.join(repr(n) for n in missing)} are missing "
                         f"(append_gallery(..., variants={{name: features}}); 'streameval append': arrays "
                         f"{INPUT_PREFIX}NAME in the input, docs/variants.md)")
    appends = []
    for name in names:
        stored = _open(store, "gallery", name)
        rows = given[name]
        if not isinstance(rows, VariantRows):
            rows = VariantRows.of(f"appended gallery variant '{name}'", rows)
        for column, arr in stored.columns.items():
            if (arr is None) != (column not in rows.arrays):
                why = ("the stored variant has one per row" if arr is not None
                       else "the stored variant has none, so they would be lost")
                raise StoreError(f"{rows.where}: {column} {'missing' if arr is not None else 'given'}: {why}")
        fs = store.gallery
        rows.check(n_rows, fs.dim, fs.features.dtype, fs.chunk_rows)
        appends.append(_Append(stored, rows))
    return appends


def input_variants(arrays: dict, where: str) -> dict:
    """{name: VariantRows} from an append input's arrays named ``variant.NAME`` (features),
    ``variant.NAME.corruption_type`` and ``variant.NAME.severity``; the other arrays are ignored."""
    found = {}
    for key, arr in arrays.items():
        if not key.startswith(INPUT_PREFIX):
            continue
        name, part = key[len(INPUT_PREFIX):], "features"
        for column in COLUMNS:
            if name.endswith(f".{column}"):
                name, part = name[:-len(column) - 1], column
        if not NAME.fullmatch(name) or name == CLEAN:
            raise StoreError(f"'{where}': '{key}' names no variant ({INPUT_PREFIX}NAME[.corruption_type|.severity], "
                             "NAME of letters, digits, '.', '_', '-')")
        found.setdefault(name, {})[part] = arr
    for name, parts in found.items():
        if "features" not in parts:
            raise StoreError(f"'{where}': {', '.join(f'{INPUT_PREFIX}{name}.{c}' for c in parts)} given without "
                             f"the features '{INPUT_PREFIX}{name}'")
    return {name: VariantRows(f"'{where}': appended gallery variant '{name}'", parts) for name, parts in found.items()}


# ------------------------------------------------------------------------------------------ files


def parse_spec(text: str) -> tuple[str, str, str]:
    """``SET:NAME=FILE`` (``variants --add``) -> (set, name, file); OptionError otherwise."""
    head, sep, path = text.partition("=")
    set_name, colon, head = head.partition(":")
    if not colon or set_name not in SETS:
        raise OptionError(f"expected SET:NAME=FILE with SET query or gallery, got {text!r}")
    if not sep or not path:
        raise OptionError(f"expected NAME=FILE, got {text!r}")
    return set_name, check_name(head), path


@contextlib.contextmanager
def variant_files(specs):
    """The VariantRows of variant files, [(set, name, path)]: a .npy file of features, or a .npz
    holding ``features`` and optionally ``corruption_type``, ``severity``, ``pids``, ``camids``
    (streamed; open while the context lasts)."""
    from ..io import open_source

    with contextlib.ExitStack() as stack:
        opened = []
        for set_name, name, path in specs:
            ext = os.path.splitext(os.fspath(path))[1].lower()
            where = f"{set_name} variant '{name}' ('{os.fspath(path)}')"
            if ext not in (".npy", ".npz"):
                raise StoreError(f"{where}: a variant file is a .npy file of features or a .npz of features and "
                                 f"optionally {', '.join(FILE_ARRAYS[1:])}")
            source = stack.enter_context(open_source(os.fspath(path)))
            arrays = dict(source.arrays)
            if ext == ".npy":
                arrays = {"features": next(iter(arrays.values()))}
            unknown = sorted(set(arrays) - set(FILE_ARRAYS))
            if unknown or "features" not in arrays:
                raise StoreError(f"{where}: expected the arrays features and optionally {', '.join(FILE_ARRAYS[1:])}; "
                                 f"it holds {source.listing()}")
            opened.append((set_name, name, VariantRows(where, arrays)))
        yield opened


def add_variant_files(target, specs, *, overwrite: bool = False) -> Store:
    """Add variants from files, [(set, name, path)], to the store at ``target`` (``variant_files``;
    all checked, ids included, before anything is written); each records its file in its attributes."""
    with variant_files(specs) as variants:
        return add_variants(target, [(set_name, name, rows, file_attrs(path))
                                     for (set_name, name, rows), (_, _, path) in zip(variants, specs)],
                            overwrite=overwrite)


def file_attrs(path) -> dict:
    """The attributes of a variant read from a file: where it came from."""
    return {"source": "file", "file": os.fspath(path)}


def describe_variants(store: Store) -> str:
    """Each set's variants, a line each: name, rows, which columns, attributes (``variants`` command)."""
    lines = [f"{store.path}:"]
    for set_name in SETS:
        names = variant_names(store, set_name)
        lines.append(f"{set_name}: {len(names)} variant{'s' if len(names) > 1 else ''}")
        width = max(map(len, names))
        for name in names:
            if name == CLEAN:
                lines.append(f"  {name:<{width}}  {len(getattr(store, set_name)):,} rows (the set's own features)")
                continue
            stored = _open(store, set_name, name)
            columns = [column for column, arr in stored.columns.items() if arr is not None]
            facts = [f"{len(stored.fs):,} rows", " and ".join(columns) if columns else "no corruption columns",
                     json.dumps(dict(stored.group.attrs))]
            lines.append(f"  {name:<{width}}  " + ", ".join(facts))
    return "\n".join(lines)


def validate_variants(store: Store) -> None:
    """Read every chunk of every variant (features, corruption_type, severity): StoreError on the
    first damaged or missing chunk or non-finite feature, naming the variant (``validate``)."""
    from .reading import read_field

    for set_name in SETS:
        for name in variant_names(store, set_name)[1:]:
            fs = variant_set(store, set_name, name)
            for start in range(0, len(fs), fs.chunk_rows):
                read_field(fs, "features", slice(start, min(start + fs.chunk_rows, len(fs))))
            variant_columns(store, set_name, name)
