"""Saved per-query state: what ``streameval eval --state`` writes and ``streameval update`` extends.

A state directory holds versions; a small pointer file names the live one::

    STATE/
      CURRENT                  the live version's name (vNNNNNN.zarr), one line, replaced atomically (os.replace)
      v000002.zarr/            zarr v3 group, never modified once CURRENT names it
        attrs  streameval_state = 2; covers (what the counts were taken over, below);
               options (evaluate's keyword arguments); dist_range ([dmin, dmax] of minmax GOM);
               checksums (below)
        positives/offsets (Nq + 1), positives/dist, positives/gidx, positives/junk (Nq)
        ranks/neg_slots, ranks/neg_hist (Nq, GOM bins + 2), ranks/clipped, ranks/pair_range (Nq, 2 with
        fixed GOM normalisation, else Nq x 0)

``covers``: the query set's fingerprint (a hash of its features as stored, pids and camids), the
gallery rows counted, the store's uid (new whenever a store is created) with a fingerprint of every
chunk holding those rows (``store.rows_fingerprint``: a gallery edited in place is noticed), and the
options the counts depend on (``Settings.state_key``).

Nothing read back is trusted.  ``checksums`` holds a blake2b hash of every array's content and of
the canonical JSON of covers, options and dist_range, taken before writing; every chunk carries
zarr's crc32c besides.  Loading follows CURRENT only to a real version directory of this state (a
name vNNNNNN.zarr, never a link), checks the structure (``check_structure``: types, lengths,
offsets - what must hold before a kernel indexes with it), then the checksums: a deleted chunk
(zarr would read zeros), a garbled chunk or an edited attribute is refused as damaged, never turned
into other numbers than a full evaluation gives.

Writing makes the next version in full beside the live one, syncs it, then swaps CURRENT and
removes older versions: interrupted anywhere (a crash, Ctrl-C), CURRENT names a complete version.
A write that fails (a full disk) removes its partial version and leaves the live one as it was.
A directory holding only streameval's leftovers - version directories and CURRENT.tmp, no CURRENT -
is an *unfinished* state (a first write that never completed): it holds nothing anyone wrote, and
the next ``eval --state`` replaces it without ``--overwrite``.  A directory holding anything else
is somebody else's and is never written to.  States are local directories (the swap needs a local
file system).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import stat
from dataclasses import dataclass

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from .errors import OptionError, StoreError, one_line
from .gom import DistanceRange
from .outputs import check_directory
from .state import Positives, QueryState, RankState
from .store import Store, rows_fingerprint

STATE_SCHEMA = 2  # 2: checksums, crc32c chunks, rows_fingerprint
POINTER = "CURRENT"
PENDING_POINTER = POINTER + ".tmp"
VERSION_NAME = re.compile(r"v[0-9]{6}\.zarr")
CHUNK_ELEMENTS = 1 << 20
ARRAYS = {  # name: (dtype, dimensions)
    "positives/offsets": (np.dtype(np.int64), 1), "positives/dist": (np.dtype(np.float64), 1),
    "positives/gidx": (np.dtype(np.int64), 1), "positives/junk": (np.dtype(np.int64), 1),
    "ranks/neg_slots": (np.dtype(np.int64), 1), "ranks/neg_hist": (np.dtype(np.int64), 2),
    "ranks/clipped": (np.dtype(np.int64), 2), "ranks/pair_range": (np.dtype(np.float64), 2),  # RankState.arrays
}
SIGNED_ATTRIBUTES = ("covers", "options", "dist_range")  # every attribute but the schema number and the checksums


class StateError(StoreError):
    """A saved state is missing, unreadable, damaged, or does not match the store or the options."""


@dataclass(frozen=True)
class SavedState:
    path: str
    version: str
    covers: dict
    options: dict
    query_state: QueryState


def _local_path(path) -> str:
    path = os.fspath(path)
    if "://" in path:
        raise OptionError(f"a state must be a local directory (its updates are atomic renames), got '{path}'")
    return path


def _damaged(path: str, problem: str) -> StateError:
    return StateError(f"the state at '{path}' is damaged ({problem}); run a full 'streameval eval --state'")


# ------------------------------------------------------------------------------- the state directory


def _is_own(path: str, name: str) -> bool:
    """Whether entry ``name`` of a state directory is one streameval makes there (versions are
    real directories, never links; the pointers are regular files)."""
    mode = os.lstat(os.path.join(path, name)).st_mode
    if name in (POINTER, PENDING_POINTER):
        return stat.S_ISREG(mode)
    return VERSION_NAME.fullmatch(name) is not None and stat.S_ISDIR(mode)


def _contents(path: str) -> str:
    """'empty' (absent or empty), 'unfinished' (streameval's leftovers, no CURRENT), 'state'
    (CURRENT and streameval's files only) or 'foreign' (anything else)."""
    if not os.path.lexists(path):
        return "empty"
    if not os.path.isdir(path):
        return "foreign"
    names = os.listdir(path)
    if not all(_is_own(path, name) for name in names):
        return "foreign"
    if POINTER in names:
        return "state"
    return "unfinished" if names else "empty"


def _live_version(path: str) -> str | None:
    """The live version's name; None when there is no CURRENT; StateError when CURRENT does not
    name a version directory of this state."""
    pointer = os.path.join(path, POINTER)
    if not os.path.lexists(pointer):
        return None
    if not os.path.isfile(pointer) or os.path.islink(pointer):
        raise _damaged(path, f"{POINTER} is not a regular file")
    try:
        with open(pointer, "rb") as fh:
            name = fh.read(64).decode("ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:  # binary garbage, an unreadable file
        raise _damaged(path, f"{POINTER} cannot be read as a version name ({type(exc).__name__})") from None
    if not VERSION_NAME.fullmatch(name):
        raise _damaged(path, f"{POINTER} holds {name!r:.60}, not a version name vNNNNNN.zarr")
    version = os.path.join(path, name)
    if os.path.islink(version) or not os.path.isdir(version):
        raise _damaged(path, f"{POINTER} names {name}, which is not a version directory (versions are never links)")
    return name


def check_writable(path, overwrite: bool) -> None:
    """Refuse to write a state where something else lives, or over a state without ``overwrite``
    (asked at a terminal, as for every output).  Absent, empty and unfinished states may be written."""
    path = _local_path(path)
    try:
        contents = _contents(path)
    except OSError as exc:
        raise StateError(f"cannot use '{path}' as a state: {exc.strerror or exc}") from None
    if contents == "foreign":
        raise StateError(f"'{path}' exists and is not a streameval state; choose another --state path")
    if contents == "state":
        check_directory(path, overwrite, "state")


# ------------------------------------------------------------------------------------------ fingerprints


def coverage(store: Store, settings, gallery_rows: int, query_hash: str | None = None) -> dict:
    """What a state over gallery rows [0, gallery_rows) of ``store`` with ``settings`` covers."""
    return {
        "query_fingerprint": query_hash or rows_fingerprint(store.query, len(store.query)),
        "n_queries": len(store.query),
        "gallery_rows": gallery_rows,
        "store_uid": store.uid,
        "rows_fingerprint": rows_fingerprint(store.gallery, gallery_rows),
        "settings": settings.state_key(),
    }


def _checksums(attributes: dict, arrays: dict) -> dict:
    """blake2b of each array (dtype, shape, bytes) and of each of ``SIGNED_ATTRIBUTES`` (canonical JSON)."""
    sums = {}
    for key, data in arrays.items():
        digest = hashlib.blake2b(f"{data.dtype.str} {data.shape}".encode(), digest_size=16)
        digest.update(np.ascontiguousarray(data).data)
        sums[key] = digest.hexdigest()
    for key in SIGNED_ATTRIBUTES:
        canonical = json.dumps(attributes.get(key), sort_keys=True, separators=(",", ":"))
        sums[key] = hashlib.blake2b(canonical.encode(), digest_size=16).hexdigest()
    return sums


# ----------------------------------------------------------------------------------------- structure


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _gom_setting(value) -> bool:
    return value is None or (isinstance(value, dict) and isinstance(value.get("norm"), str)
                             and _integer(value.get("bins")) and value["bins"] >= 1)


_TEXT = (lambda v: isinstance(v, str), "a string")
_COUNT = (lambda v: _integer(v) and v >= 1, "a positive integer")
_ATTRIBUTE_FIELDS = {  # attribute: {key: (test, what it must be)}, keys exactly these
    "covers": {
        "query_fingerprint": _TEXT, "n_queries": _COUNT, "gallery_rows": _COUNT,
        "store_uid": (lambda v: v is None or isinstance(v, str), "a string or null"), "rows_fingerprint": _TEXT,
        "settings": (lambda v: isinstance(v, dict) and _gom_setting(v.get("gom")),
                     "a mapping whose gom is null or has a norm and bins"),
    },
    "options": {
        "metric": _TEXT, "protocol": _TEXT, "precision": _TEXT, "gom_norm": _TEXT, "gom_vp": _TEXT,
        "junk_pids": (lambda v: isinstance(v, list) and all(map(_integer, v)), "a list of integers"),
        "max_rank": _COUNT, "gom_bins": _COUNT, "gom_b": _COUNT, "no_gom": (lambda v: isinstance(v, bool), "true or false"),
    },
    "checksums": {key: _TEXT for key in (*ARRAYS, *SIGNED_ATTRIBUTES)},
}


def check_structure(attrs: dict, arrays: dict) -> str | None:
    """The first structural problem of a version read back (its attributes and arrays), or None.

    What the numbers and the kernels rely on: attribute types, array dtypes, CSR offsets from 0,
    never decreasing, up to the length of the per-positive arrays, one junk count and histogram row
    per query, gallery rows in range, counts never negative.
    """
    return _attribute_problem(attrs) or _array_problem(attrs, arrays)


def _attribute_problem(attrs: dict) -> str | None:
    for name, fields in _ATTRIBUTE_FIELDS.items():
        record = attrs.get(name)
        if not isinstance(record, dict):
            return f"attribute {name} is {record!r:.60}, not a mapping"
        if set(record) != set(fields):
            return f"attribute {name} has keys {sorted(record)}, expected {sorted(fields)}"
        for key, (test, kind) in fields.items():
            if not test(record[key]):
                return f"attribute {name}.{key} is {record[key]!r:.60}, expected {kind}"
    if "dist_range" not in attrs:
        return "attribute dist_range is missing"
    gom, dist_range = attrs["covers"]["settings"]["gom"], attrs["dist_range"]
    if gom is None or gom["norm"] != "minmax":
        return None if dist_range is None else f"attribute dist_range is {dist_range!r:.60}, expected null (no minmax)"
    if not (isinstance(dist_range, list) and len(dist_range) == 2 and all(map(_finite, dist_range))
            and dist_range[0] <= dist_range[1]):
        return f"attribute dist_range is {dist_range!r:.60}, expected [min, max] of the minmax normalisation"
    return None


def _array_problem(attrs: dict, arrays: dict) -> str | None:
    for key, (dtype, ndim) in ARRAYS.items():
        if arrays[key].dtype != dtype or arrays[key].ndim != ndim:
            return f"{key} is {arrays[key].ndim}-D {arrays[key].dtype}, expected {ndim}-D {dtype}"
    covers, gom = attrs["covers"], attrs["covers"]["settings"]["gom"]
    n = covers["n_queries"]
    offsets, dist, gidx, junk, slots, hist, clipped, pair_range = (arrays[key] for key in ARRAYS)
    if offsets.shape != (n + 1,) or offsets[0] != 0 or (np.diff(offsets) < 0).any():
        return f"positives/offsets must be n_queries + 1 = {n + 1} entries from 0, never decreasing"
    lengths = {key: arrays[key].shape[0] for key in ("positives/dist", "positives/gidx", "ranks/neg_slots")}
    if set(lengths.values()) != {offsets[-1]}:
        return f"positives/offsets ends at {offsets[-1]} but the per-positive arrays hold {lengths}"
    width = 0 if gom is None else gom["bins"] + 2
    if junk.shape != (n,) or hist.shape != (n, width):
        return f"positives/junk {junk.shape} and ranks/neg_hist {hist.shape} must be ({n},) and ({n}, {width})"
    if not np.isfinite(dist).all():
        return "positives/dist holds non-finite distances"
    if ((gidx < 0) | (gidx >= covers["gallery_rows"])).any():
        return f"positives/gidx holds gallery rows outside [0, {covers['gallery_rows']})"
    clip_width = 2 if gom is not None and gom["norm"] == "fixed" else 0
    if clipped.shape != (n, clip_width) or pair_range.shape != (n, clip_width) or np.isnan(pair_range).any():
        return (f"ranks/clipped {clipped.shape} and ranks/pair_range {pair_range.shape} must be ({n}, {clip_width}), "
                "without NaN")
    if (junk < 0).any() or (slots < 0).any() or (hist < 0).any() or (clipped < 0).any():
        return "negative counts in positives/junk or ranks"
    return None


# ---------------------------------------------------------------------------------------- write / read


def _write_array(path: str, data: np.ndarray) -> None:
    """``data`` as a zarr array at ``path``, a chunk at a time (see ``_write_version``)."""
    step = max(1, min(CHUNK_ELEMENTS // max(1, int(np.prod(data.shape[1:]))), data.shape[0]))
    arr = zarr.create_array(path, shape=data.shape, dtype=data.dtype, chunks=(step,) + data.shape[1:],
                            compressors=(ZstdCodec(), Crc32cCodec()))
    for start in range(0, data.shape[0], step):
        arr[start:start + step] = data[start:start + step]


def _read_array(arr: zarr.Array) -> np.ndarray:
    """The whole array, one chunk of rows at a time: a chunk that fails its crc32c then leaves no
    sibling reads pending (asyncio would complain about them on stderr at exit)."""
    out = np.empty(arr.shape, arr.dtype)
    step = arr.chunks[0]
    for start in range(0, arr.shape[0], step):
        out[start:start + step] = arr[start:start + step]
    return out


def _sync_tree(path: str) -> None:
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _sync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_versions(path: str, keep: str | None) -> None:
    """Remove every version but ``keep``, and a pending pointer: leftovers of writes that never
    became live, or versions a newer one replaced."""
    for name in os.listdir(path):
        entry = os.path.join(path, name)
        if name == PENDING_POINTER and os.path.isfile(entry):
            os.remove(entry)
        elif name != keep and VERSION_NAME.fullmatch(name) and os.path.isdir(entry) and not os.path.islink(entry):
            shutil.rmtree(entry, ignore_errors=True)


def _write_version(target: str, attrs: dict, arrays: dict) -> None:
    """The version's group, subgroups and arrays, one file written at a time: each node is created
    as the root of its own path, because zarr writes a node's parents' metadata concurrently with
    its own, and when a full disk fails several of those writes, asyncio reports the ones nobody
    awaited on stderr (the CLI promises one line)."""
    group = zarr.open_group(target, mode="w")
    for subgroup in sorted({key.split("/")[0] for key in arrays}):
        zarr.open_group(os.path.join(target, subgroup), mode="w")
    for key, data in arrays.items():
        _write_array(os.path.join(target, key), data)
    group.attrs.update(attrs)
    _sync_tree(target)


def _make_live(path: str, name: str) -> None:
    pointer = os.path.join(path, PENDING_POINTER)
    with open(pointer, "w") as fh:
        fh.write(name + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(pointer, os.path.join(path, POINTER))  # the commit point


def save_state(path, store: Store, settings, state: QueryState, query_hash: str | None = None) -> str:
    """Write ``state`` as the new live version of the state at ``path``; return the version's name.

    StateError when the file system refuses (a full disk): the partial version is removed and the
    live one, if any, stays as it was.
    """
    path = _local_path(path)
    try:
        live = _live_version(path)
    except StateError:  # a damaged state that evaluate(overwrite_state=True) was allowed to replace
        live = None
    name = f"v{int(live[1:7]) % 999_999 + 1 if live else 1:06d}.zarr"  # wraps to v000001 after v999999
    arrays = {key: np.ascontiguousarray(data) for key, data in zip(ARRAYS, (
        state.positives.offsets, state.positives.dist, state.positives.gidx, state.positives.junk,
        *state.ranks.arrays))}
    attrs = {
        "covers": coverage(store, settings, state.gallery_rows, query_hash),
        "options": settings.to_options(),
        "dist_range": None if state.dist_range is None else [state.dist_range.lo, state.dist_range.hi],
    }
    attrs.update(streameval_state=STATE_SCHEMA, checksums=_checksums(attrs, arrays))
    try:
        os.makedirs(path, exist_ok=True)
        _remove_versions(path, keep=live)  # room first: leftovers of interrupted writes
        _write_version(os.path.join(path, name), attrs, arrays)
        _make_live(path, name)
    except BaseException as exc:
        if os.path.isdir(path):
            _remove_versions(path, keep=live)
        if isinstance(exc, OSError):
            kept = "the previous state is kept" if live else "no state was saved"
            raise StateError(f"cannot save the state at '{path}': {exc.strerror or exc}; {kept}") from None
        raise
    _sync_dir(path)
    _remove_versions(path, keep=name)
    return name


def _read_version(path: str, name: str) -> tuple[dict, dict]:
    """The attributes and arrays of version ``name``, as stored (StateError when unreadable)."""
    try:
        group = zarr.open_group(os.path.join(path, name), mode="r")
        attrs = dict(group.attrs)
    except Exception as exc:  # zarr raises several types for missing or malformed metadata
        raise _damaged(path, f"{name} is not a readable zarr group: {one_line(exc)}") from None
    arrays = {}
    for key in ARRAYS:
        try:
            arr = group[key]
            if not isinstance(arr, zarr.Array):
                raise TypeError("a group, not an array")
            arrays[key] = _read_array(arr)
        except KeyError:
            raise _damaged(path, f"{key} is missing") from None
        except Exception as exc:  # a chunk failing its crc32c, undecodable bytes, bad metadata
            raise _damaged(path, f"{key} cannot be read: {one_line(exc)}") from None
    return attrs, arrays


def _checksum_problem(attrs: dict, arrays: dict) -> str | None:
    recorded = attrs["checksums"]
    for key, value in _checksums(attrs, arrays).items():
        if recorded[key] != value:
            return f"{'attribute' if key in SIGNED_ATTRIBUTES else 'array'} {key} does not match its checksum"
    return None


def load_state(path) -> SavedState:
    """Open the live version of the state at ``path``, checked (StateError when there is none, or
    it is damaged)."""
    path = _local_path(path)
    if not os.path.lexists(path):
        raise StateError(f"no state at '{path}' (make one with 'streameval eval STORE --state {path}')")
    name = _live_version(path)
    if name is None and _contents(path) == "unfinished":
        raise StateError(f"the state at '{path}' was never completed (its first save was interrupted); "
                         f"make it again with 'streameval eval STORE --state {path}'")
    if name is None:
        raise StateError(f"'{path}' is not a streameval state (no {POINTER} naming a version)")
    attrs, arrays = _read_version(path, name)
    schema = attrs.get("streameval_state")
    if schema != STATE_SCHEMA:
        raise StateError(f"'{path}' holds a state of another schema ({schema!r:.20}, expected {STATE_SCHEMA}); "
                         "make a new one with a full 'streameval eval --state'")
    problem = check_structure(attrs, arrays) or _checksum_problem(attrs, arrays)
    if problem:
        raise _damaged(path, problem)
    covers, dist_range = attrs["covers"], attrs["dist_range"]
    offsets, dist, gidx, junk = (arrays[key] for key in ARRAYS if key.startswith("positives/"))
    ranks = RankState(*(arrays[key] for key in ARRAYS if key.startswith("ranks/")))
    query_state = QueryState(Positives(offsets, dist, gidx, junk), ranks,
                             None if dist_range is None else DistanceRange(*dist_range), covers["gallery_rows"])
    return SavedState(path, name, covers, attrs["options"], query_state)


def check_matches(saved: SavedState, store: Store, settings) -> str:
    """Refuse a state that was not taken over this store's queries, its gallery's first rows and
    these options; return the query fingerprint."""
    covers = saved.covers
    where = f"the state at '{saved.path}'"
    if settings.state_key() != covers["settings"]:
        diff = {k: (covers["settings"].get(k), v) for k, v in settings.state_key().items() if covers["settings"].get(k) != v}
        named = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in diff.items())
        raise StateError(f"{where} was made with other options ({named}); run a full 'streameval eval --state'")
    query_hash = rows_fingerprint(store.query, len(store.query))
    if query_hash != covers["query_fingerprint"]:
        raise StateError(f"{where} was made for other queries than those of '{store.path}'")
    rows = covers["gallery_rows"]
    if len(store.gallery) < rows:
        raise StateError(f"{where} covers {rows:,} gallery rows but '{store.path}' has {len(store.gallery):,}: "
                         "the gallery shrank or was rewritten; run a full 'streameval eval --state'")
    if covers["store_uid"] != store.uid or covers["rows_fingerprint"] != rows_fingerprint(store.gallery, rows):
        raise StateError(f"the gallery of '{store.path}' was rewritten since {where} was made (its first {rows:,} "
                         "rows differ); run a full 'streameval eval --state'")
    return query_hash
