"""Optional image paths of a store's rows: ``query/paths`` and ``gallery/paths``.

One UTF-8 string per row (zarr 3 variable-length strings), chunked like the set's rows, compressed
and crc32c-checksummed like the ids.  Nothing that computes a metric reads them: they are what
``streameval show`` draws, so a store without them evaluates exactly as before.

* A path is a non-empty string without NUL or line breaks (one per line in ``--paths`` files and
  CSV outputs).  The fill value is ``""``: a missing chunk reads as empty strings, which no written
  path is, and is reported as missing.
* A relative path is relative to the folder holding the store, so a store and its images move
  together (``streameval show --image-root`` says otherwise for paths relative to a dataset root).
* ``write_paths`` writes a whole set and marks the array complete last: an interrupted write is
  refused on reading, never read as partial paths.
* Appended gallery rows get their paths in the same append (``store.append_batches``); paths past
  the committed rows belong to an unfinished append and are ignored, like the other arrays' tails.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from ..core.errors import OptionError, StoreError, one_line
from ..core.locking import writing
from .layout import SETS, FeatureSet, Store, describe, open_array, open_store, refuse_links
from .reading import _last_row

FIELD = "paths"
COMPLETE_ATTR = "complete"  # set once every row's path is written
FORBIDDEN = ("\0", "\n", "\r")


def write_paths(target, set_name: str, paths: Sequence[str], *, overwrite: bool = False) -> None:
    """Write the image path of every row of one set (``len(paths)`` == the set's rows) into the
    store at ``target`` (a path, a zarr store object or an opened Store).

    Existing paths are replaced only with ``overwrite``.  Raises StoreError for a wrong count or an
    invalid path (checked before anything is written), OptionError for an unknown set.
    """
    _check_set(set_name)
    where = target.path if isinstance(target, Store) else describe(target)
    local = where if isinstance(target, Store) else target  # a Store's path, a path, or a zarr store object
    with writing(local):
        refuse_links(local)
        if isinstance(target, Store):  # opened read-only: reopen its zarr store for writing
            target = target.query.pids.store_path.store.with_read_only(False)
        _write_locked(target, where, set_name, paths, overwrite)


def _write_locked(target, where: str, set_name: str, paths: Sequence[str], overwrite: bool) -> None:
    fs = getattr(open_store(target, mode="r+"), set_name)
    paths = check_paths(paths, f"{set_name} paths", len(fs))
    if f"{fs.name}/{FIELD}" in _group(fs) and not overwrite:
        raise StoreError(f"'{where}' already has {fs.name}/{FIELD}; pass overwrite=True to replace them")
    arr = create_paths(fs)
    write_path_rows(arr, 0, paths)
    complete_paths(arr)


def create_paths(fs: FeatureSet) -> zarr.Array:
    """An empty paths array for the rows of a set opened for writing, chunked like them (replacing
    any): fill it with ``write_path_rows``, then ``complete_paths``."""
    return _group(fs).create_array(f"{fs.name}/{FIELD}", shape=(len(fs),), dtype=str, chunks=(fs.chunk_rows,),
                                   fill_value="", compressors=[ZstdCodec(level=0, checksum=False), Crc32cCodec()],
                                   overwrite=True)


def complete_paths(arr: zarr.Array) -> None:
    """Mark every path written (last: an interrupted write is refused by readers)."""
    arr.attrs[COMPLETE_ATTR] = True


def check_paths(paths: Sequence[str], where: str, rows: int) -> list[str]:
    """``paths`` as a list of ``rows`` valid paths, or StoreError naming the first bad one."""
    paths = list(paths)
    if len(paths) != rows:
        raise StoreError(f"{where}: {len(paths):,} paths for {rows:,} rows; give one path per row")
    for row, path in enumerate(paths):
        if not isinstance(path, str) or not path:
            raise StoreError(f"{where}: row {row} has {path!r}, not a path (a non-empty string)")
        if any(char in path for char in FORBIDDEN):
            raise StoreError(f"{where}: row {row} holds a NUL or line break: {path!r}")
    return paths


def write_path_rows(arr: zarr.Array, start: int, paths: list[str]) -> None:
    """Write checked ``paths`` at row ``start``, a chunk at a time."""
    step = arr.chunks[0]
    for first in range(0, len(paths), step):
        batch = paths[first:first + step]
        arr[start + first:start + first + len(batch)] = np.array(batch, dtype=np.dtypes.StringDType())


def open_paths(group: zarr.Group, set_name: str, rows: int, where: str) -> zarr.Array | None:
    """The set's paths array (structure checked against ``rows``, the set's committed rows), or
    None when the store has none."""
    key = f"{set_name}/{FIELD}"
    arr = open_array(group, where, key, required=False)
    if arr is None:
        return None
    if arr.ndim != 1 or arr.dtype.kind not in "TUO":
        raise StoreError(f"'{where}': '{key}' is not a 1-D array of strings")
    if not arr.attrs.get(COMPLETE_ATTR):
        raise StoreError(f"'{where}': '{key}' was not written completely (interrupted?); write them again "
                         "(streameval.store.paths.write_paths with overwrite=True)")
    if arr.shape[0] < rows or (set_name == "query" and arr.shape[0] != rows):
        raise StoreError(f"'{where}': '{key}' has {arr.shape[0]:,} entries for {rows:,} {set_name} rows "
                         "(rows appended without paths?); write the paths of every row again")
    return arr


def appended_paths(fs: FeatureSet, where: str, paths, n_rows: int) -> tuple[zarr.Array | None, list[str] | None]:
    """For an append of ``n_rows`` gallery rows: the gallery paths array to grow with the others and
    the new rows' checked paths, or (None, None) for a store without gallery paths.  A store with
    paths refuses an append without them, and one without refuses them (they would be lost)."""
    arr = open_paths(_group(fs), "gallery", len(fs), where)
    if arr is None and paths is not None:
        raise OptionError(f"'{where}' has no gallery image paths, so the new rows' paths would be lost; "
                          "append without paths, or write the paths of every gallery row first (write_paths)")
    if arr is not None and paths is None:
        raise OptionError(f"'{where}' holds gallery image paths (gallery/paths): give the new rows' paths too "
                          "(streameval append --paths FILE; append_gallery(..., paths=...))")
    return arr, None if arr is None else check_paths(paths, "appended gallery paths", n_rows)


def read_paths(store: Store, set_name: str, rows) -> list[str] | None:
    """The image paths of ``rows`` (a slice, or an array of row numbers: only their chunks are
    read) of one set, in the order asked; None when the store has no paths for that set."""
    _check_set(set_name)
    fs = getattr(store, set_name)
    arr = open_paths(_group(fs), set_name, len(fs), store.path)
    if arr is None:
        return None
    # a slice is bounded by the committed rows: the array may hold an unfinished append's tail
    index = slice(*rows.indices(len(fs))) if isinstance(rows, slice) else np.asarray(rows, dtype=np.int64)
    first = index.start if isinstance(index, slice) else int(index.min(initial=0))
    if first < 0 or _last_row(index, len(fs)) >= len(fs):
        raise StoreError(f"{set_name} paths: rows outside 0-{len(fs) - 1} asked for")
    try:
        values = arr.oindex[index]
    except Exception as exc:  # zarr, its codecs and the store raise many types for a damaged chunk
        raise StoreError(f"cannot read {set_name}/{FIELD} of '{store.path}' ({one_line(exc)}); "
                         "the store is damaged: write the paths again") from None
    paths = [str(value) for value in values]
    if "" in paths:
        row = _row_of(index, paths.index(""))
        raise StoreError(f"{set_name}/{FIELD} of '{store.path}': row {row} reads empty, its chunk "
                         f"({row // arr.chunks[0]}) is missing; write the paths again")
    return paths


def read_paths_file(path: str) -> list[str]:
    """The paths in a text file, one per line (UTF-8, any line ending); checked where they are
    written."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
            return text.removesuffix("\n").split("\n") if text else []
    except (OSError, UnicodeDecodeError) as exc:
        raise StoreError(f"cannot read the paths file '{path}': {one_line(exc)}") from None


def _row_of(index, position: int) -> int:
    return index.start + position if isinstance(index, slice) else int(index[position])


def _check_set(set_name: str) -> None:
    if set_name not in SETS:
        raise OptionError(f"no set {set_name!r}: paths belong to {' or '.join(SETS)}")


def _group(fs: FeatureSet) -> zarr.Group:
    """The root group of the store holding ``fs`` (writable if the store was opened so)."""
    return zarr.open_group(fs.pids.store_path.store, mode="r" if fs.pids.store_path.store.read_only else "r+")
