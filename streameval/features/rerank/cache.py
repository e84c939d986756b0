"""The kNN cache (``--knn-cache DIR``): the kNN pass's lists kept on disk, so that a sweep over
re-ranking's k1, k2, lambda and flavours of one base distance pays the U x U pass once.

A cache directory serves **one store**, and holds one entry per base metric::

    DIR/
      knn-cosine.npz        the lists of the cosine distance (index, dist, farthest, header)
      knn-sqeuclidean.npz   those of the squared Euclidean distance
      knn-*.npz.lock        a writer's lock (``core.locking``), only while one saves

What the lists depend on, and so what an entry records and is matched by (its *covers*): the
features and ids of the query set and of the gallery, as their row counts and their fingerprints
(``store.rows_fingerprint``: the stored crc32c of every chunk, a few bytes read per chunk, never the
features themselves), and the base metric.  Not the store's path (a copy of the store is the same
store; the path is kept for messages), and not the working dtype of the pass: the lists are exact
(settled in float64), so a float32 and a float64 pass give the same lists.  The dtype is kept as a
record of how the entry was made, with ``refined`` (the pairs that pass settled exactly), which a
hit reports as its pass counted them.  An entry's header (JSON, a member of the .npz) holds all of
this and the metric it is filed under, checked against its file name.

Reuse: an entry of k' columns serves any k <= k' (the first k of a top-k' list, ascending by
(distance, row), are the top k).  A request for more columns than the entry holds, or for a metric
without an entry, is a miss: the pass runs and its lists replace the entry (or become a new one).

Refused, never silently used (:class:`CacheError`, exit 3), and checked before the pass runs:

* **appended rows**: an entry over a gallery whose first rows are this store's but which has fewer
  rows than the store now has.  Appended rows change every neighbour list and every row maximum, so
  no part of the entry is valid; the message says to remove DIR or pass another (a sweep that
  appends between runs wants a fresh cache, and the old lists are not deleted behind its back).
* **another store**: an entry over other features or ids (another store, or this one rewritten).  A
  cache directory is tied to the store it was made for: pointing a sweep of one store at the cache
  of another is a mistake of paths, and replacing that cache would throw away a pass someone paid
  for.  The message names the store the entry was made from.
* **a damaged entry**: unreadable, truncated, of another schema, or failing its checksums (blake2b
  of every array and of the header, as states keep them; the zip's CRC-32 of every member besides).

Writing: the entry is written in full to a new file beside its name, synced, and renamed onto it
(``os.replace``), so a reader sees the old entry or the new one, whole, never a mix; a crash leaves
at most a ``.streameval-*`` temporary file.  The rename is made under the entry's writer lock
(``core.locking.writing``), after looking again at what is there: two processes that computed the
same entry both leave a whole one, and one with more columns is never replaced by one with fewer.
The lock is held for that look and the rename only, never while the pass runs or the file is written.
A save that fails (a full disk, another writer holding the lock past ``core.locking.WAIT``) is a
warning (``StoreWarning``): the lists just computed are used all the same, only not kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import warnings

import numpy as np

from ...core.errors import OptionError, StoreError, StoreWarning, one_line
from ...core.locking import writing
from ...core.outputs import check_folder, create_beside
from ...engine.neighbours import Neighbours
from ...store import rows_fingerprint

SCHEMA = 1
ENTRY = re.compile(r"knn-([A-Za-z0-9_]+)\.npz")
ARRAYS = {"index": np.int64, "dist": np.float64, "farthest": np.float64}  # name -> dtype, as saved
HEADER = "header"  # the member holding the header, as UTF-8 JSON bytes


class CacheError(StoreError):
    """A kNN cache entry is damaged, or was made over other rows than the store now holds."""


# ----------------------------------------------------------------------------------------- the API


def cached_neighbours(directory, store, metric: str, dtype, k: int, compute) -> tuple[Neighbours, bool]:
    """Each U row's top-k of ``metric`` over ``store`` (U = its queries, then its gallery): from the
    cache at ``directory`` when an entry there holds k columns or more (then True), else from
    ``compute()`` (the kNN pass, returning k columns; then saved, and False).  ``dtype``: the pass's
    working dtype, recorded with the entry.  CacheError when the directory's entries were made over
    other rows (see the module docstring), before anything is computed."""
    directory = os.fspath(directory)
    path = _entry_path(directory, metric)
    _check_directory(directory)
    covers = _covers(store)
    headers = {entry: _header(entry) for entry in _entries(directory)}  # each checked against its name
    for entry, header in headers.items():
        _check_covers(entry, header, store, covers, directory)
    if path in headers and headers[path]["k"] >= k:
        return _load(path, k), True
    neighbours = compute()
    _save(path, metric, store, covers, neighbours, np.dtype(dtype).name)
    return neighbours, False


# ------------------------------------------------------------------------------------ what is covered


def _covers(store) -> dict:
    """What the lists of ``store`` depend on besides the metric: both sets' rows and fingerprints."""
    return {"n_queries": len(store.query), "query_fingerprint": rows_fingerprint(store.query, len(store.query)),
            "gallery_rows": len(store.gallery),
            "gallery_fingerprint": rows_fingerprint(store.gallery, len(store.gallery))}


def _check_covers(path: str, header: dict, store, covers: dict, directory: str) -> None:
    """Refuse an entry made over other rows than ``store`` holds: appended rows, or another store."""
    made = header["covers"]
    if made == covers:
        return
    rows, now = made["n_queries"] + made["gallery_rows"], covers["n_queries"] + covers["gallery_rows"]
    if _appended(made, store, covers):
        raise CacheError(
            f"the kNN cache '{directory}' holds lists of {rows:,} rows, but '{store.path}' now has {now:,} (gallery "
            f"rows were appended since): appended rows change every neighbour list and row maximum, so the cached "
            f"lists cannot be reused; remove '{directory}' or pass another --knn-cache directory")
    raise CacheError(
        f"the kNN cache '{directory}' holds lists of another store ('{os.path.basename(path)}' was made from "
        f"'{header['store']}', {made['n_queries']:,} queries + {made['gallery_rows']:,} gallery rows), not of "
        f"'{store.path}' ({covers['n_queries']:,} + {covers['gallery_rows']:,}; its features or ids differ); a cache "
        f"directory serves one store: pass another --knn-cache directory, or remove '{directory}'")


def _appended(made: dict, store, covers: dict) -> bool:
    """Whether the entry covers the same queries and the first rows of a gallery that has grown."""
    rows = made["gallery_rows"]
    return (made["n_queries"] == covers["n_queries"] and made["query_fingerprint"] == covers["query_fingerprint"]
            and rows < covers["gallery_rows"] and made["gallery_fingerprint"] == rows_fingerprint(store.gallery, rows))


# -------------------------------------------------------------------------------------------- entries


def _entry_path(directory: str, metric: str) -> str:
    name = f"knn-{metric}.npz"
    if not ENTRY.fullmatch(name):
        raise OptionError(f"a kNN cache keeps metrics named by letters, digits and '_', not {metric!r:.40}")
    return os.path.join(directory, name)


def _check_directory(directory: str) -> None:
    """Before the pass: the cache directory exists and is writable, or can be made (its folder does)."""
    if "://" in directory:
        raise OptionError(f"a kNN cache must be a local directory (its entries are replaced by renames), "
                          f"got '{directory}'")
    if not os.path.lexists(directory):
        check_folder(directory, "kNN cache")
    elif not os.path.isdir(directory):
        raise OptionError(f"the kNN cache '{directory}' is a file, not a directory; pass a directory")
    elif not os.access(directory, os.W_OK | os.X_OK):
        raise OptionError(f"cannot write the kNN cache '{directory}': the directory is not writable")


def _entries(directory: str) -> list[str]:
    """The paths of the entries in ``directory`` (none when it does not exist yet)."""
    if not os.path.isdir(directory):
        return []
    return [os.path.join(directory, name) for name in sorted(os.listdir(directory)) if ENTRY.fullmatch(name)]


def _damaged(path: str, problem: str) -> CacheError:
    return CacheError(f"the kNN cache entry '{path}' is damaged ({problem}); remove it (the lists are computed "
                      "again) or pass another --knn-cache directory")


def _checksums(header: dict, arrays: dict) -> dict:
    """blake2b of each array (dtype, shape, bytes) and of the header's canonical JSON (its
    checksums left out)."""
    sums = {}
    for key, data in arrays.items():
        digest = hashlib.blake2b(f"{data.dtype.str} {data.shape}".encode(), digest_size=16)
        digest.update(np.ascontiguousarray(data).data)
        sums[key] = digest.hexdigest()
    signed = {key: value for key, value in header.items() if key != "checksums"}
    canonical = json.dumps(signed, sort_keys=True, separators=(",", ":"))
    sums[HEADER] = hashlib.blake2b(canonical.encode(), digest_size=16).hexdigest()
    return sums


def _read(path: str, keys) -> dict:
    """The members ``keys`` of the entry at ``path``, as saved (CacheError when it cannot be read:
    truncated, not a zip, a member missing or failing its CRC-32)."""
    try:
        with np.load(path, allow_pickle=False) as members:
            missing = [key for key in keys if key not in members.files]
            if not missing:
                return {key: members[key] for key in keys}
    except Exception as exc:  # zipfile, numpy's format reader and the file system raise several types
        raise _damaged(path, f"cannot be read: {one_line(exc)}") from None
    raise _damaged(path, f"member {missing[0]!r} is missing")


def _header(path: str, raw: np.ndarray | None = None) -> dict:
    """The header of the entry at ``path`` (``raw``: its member, already read), checked for the
    keys and types the cache relies on."""
    raw = _read(path, [HEADER])[HEADER] if raw is None else raw
    try:
        header = json.loads(raw.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _damaged(path, "its header is not JSON") from None
    if not isinstance(header, dict) or header.get("streameval_knn") != SCHEMA:
        schema = header.get("streameval_knn") if isinstance(header, dict) else None
        raise _damaged(path, f"schema {schema!r:.20}, expected {SCHEMA}")
    problem = _header_problem(header) or _name_problem(path, header["key"])
    if problem:
        raise _damaged(path, problem)
    return header


def _header_problem(header: dict) -> str | None:
    covers = header.get("covers")
    counts = ("n_queries", "gallery_rows")
    if not (isinstance(covers, dict) and all(_count(covers.get(key)) for key in counts)
            and all(isinstance(covers.get(key), str) for key in ("query_fingerprint", "gallery_fingerprint"))):
        return "its header's covers are not row counts and fingerprints"
    if not (_count(header.get("k")) and _count(header.get("refined"), least=0)):
        return "its header's k or refined is not a count"
    if not all(isinstance(header.get(key), str) for key in ("key", "metric", "dtype", "store")):
        return "its header's key, metric, dtype or store is not a string"
    checksums = header.get("checksums")
    if not isinstance(checksums, dict) or set(checksums) != {*ARRAYS, HEADER}:
        return "its header's checksums do not name every array"
    return None


def _name_problem(path: str, key: str) -> str | None:
    """An entry holds the lists of the metric its name says (a file renamed would serve another's)."""
    filed = ENTRY.fullmatch(os.path.basename(path)).group(1)
    return None if key == filed else f"it holds the lists of metric {key!r:.40}, not of {filed!r}"


def _count(value, least: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _load(path: str, k: int) -> Neighbours:
    """The first k columns of the entry at ``path``, checked: the arrays' dtypes and shapes, U rows
    in range, and every checksum."""
    arrays = _read(path, [HEADER, *ARRAYS])  # one open file: the header and arrays of one entry, however replaced
    header = _header(path, arrays.pop(HEADER))
    problem = _array_problem(header, arrays) or _checksum_problem(header, arrays)
    if problem:
        raise _damaged(path, problem)
    columns = slice(0, k)
    return Neighbours(np.ascontiguousarray(arrays["index"][:, columns]),
                      np.ascontiguousarray(arrays["dist"][:, columns]), arrays["farthest"], header["metric"],
                      header["refined"])


def _array_problem(header: dict, arrays: dict) -> str | None:
    covers = header["covers"]
    n = covers["n_queries"] + covers["gallery_rows"]
    shapes = {"index": (n, header["k"]), "dist": (n, header["k"]), "farthest": (n,)}
    for key, dtype in ARRAYS.items():
        data = arrays[key]
        if data.dtype != dtype or data.shape != shapes[key]:
            return f"{key} is {data.dtype} {data.shape}, expected {np.dtype(dtype)} {shapes[key]}"
    index = arrays["index"]
    if ((index < 0) | (index >= n)).any():
        return f"index holds rows outside [0, {n:,})"
    return None


def _checksum_problem(header: dict, arrays: dict) -> str | None:
    for key, value in _checksums(header, arrays).items():
        if header["checksums"][key] != value:
            return f"{'the header' if key == HEADER else 'array ' + key} does not match its checksum"
    return None


# --------------------------------------------------------------------------------------------- saving


def _save(path: str, key: str, store, covers: dict, neighbours: Neighbours, dtype: str) -> None:
    """Write ``neighbours`` as the entry at ``path`` (see the module docstring: written beside,
    renamed under the lock unless what another process saved meanwhile serves as many columns)."""
    arrays = {"index": np.ascontiguousarray(neighbours.index, np.int64),
              "dist": np.ascontiguousarray(neighbours.dist, np.float64),
              "farthest": np.ascontiguousarray(neighbours.farthest, np.float64)}
    header = {"streameval_knn": SCHEMA, "key": key, "metric": neighbours.metric, "k": neighbours.k,
              "refined": int(neighbours.refined), "dtype": dtype, "store": store.path, "covers": covers}
    header["checksums"] = _checksums(header, arrays)
    directory = os.path.dirname(path)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory)  # its folder was checked before the pass (_check_directory)
        _write_beside(path, header, arrays, lambda: _serves(path, store, covers, neighbours.k, directory))
    except (OSError, StoreError) as exc:  # a full disk, a writer holding the lock too long: the lists stand
        reason = exc.strerror or str(exc) if isinstance(exc, OSError) else str(exc)
        warnings.warn(f"the kNN lists were not saved in the cache '{directory}': {reason}", StoreWarning, stacklevel=3)


def _write_beside(path: str, header: dict, arrays: dict, kept) -> None:
    """The entry written in full to a new file beside ``path``, synced, then renamed onto ``path``
    under its writer lock unless ``kept()`` says what is there serves (a rename is atomic: readers
    see one whole entry; the lock is held for the look and the rename only)."""
    tmp = create_beside(path, ".npz")
    try:
        with open(tmp, "wb") as fh:
            np.savez(fh, **{HEADER: np.frombuffer(json.dumps(header).encode(), np.uint8)}, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        with writing(path):
            if not kept():
                os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _serves(path: str, store, covers: dict, k: int, directory: str) -> bool:
    """Whether the entry at ``path`` (saved by another process since this one looked) holds k
    columns or more of these rows; CacheError when it covers other rows."""
    if not os.path.exists(path):
        return False
    header = _header(path)
    _check_covers(path, header, store, covers, directory)
    return header["k"] >= k
