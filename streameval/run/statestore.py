"""Saved per-query state: what ``streameval eval --state`` writes and ``streameval update`` extends.

A state directory holds versions; a small pointer file names the live one::

    STATE/
      CURRENT                  the live version's name (vNNNNNN.zarr), one line, replaced atomically (os.replace)
      v000002.zarr/            zarr v3 group, never modified once CURRENT names it
        attrs  streameval_state = 3; covers (what the counts were taken over, below);
               options (evaluate's keyword arguments, ``Settings.to_options``: ``ranked`` only in a
               state that keeps ranked lists, stats/topk; ``open_set`` only in one that keeps
               the open-set queries' nearest rows, stats/nearest); dist_range (per trial,
               [dmin, dmax] of minmax GOM, null for a trial without pairs; null without minmax);
               checksums (below)
        positives/offsets (Nq + 1), positives/dist, positives/gidx, positives/bits (per positive),
        positives/junk (Nq, T)
        stats/<statistic>/<field>   every array of the statistics' state (``statistics.StatState``):
                                    which ones, and their shapes, follow from the options

``covers``: the query set's fingerprint (a hash of its features as stored, pids and camids), the
gallery rows counted, the store's uid (new whenever a store is created) with a fingerprint of every
chunk holding those rows (``store.rows_fingerprint``: a gallery edited in place is noticed), and the
options the counts depend on (``Settings.state_key``).

Only protocols whose counts over old rows stay valid when rows are appended are saved
(``check_updatable``): no trials, no single-gallery-shot draws, no query copies in the gallery, not
the t2v direction (one trial: T = 1).

Nothing read back is trusted.  ``checksums`` holds a blake2b hash of every array's content and of
the canonical JSON of covers, options and dist_range, taken before writing; every chunk carries
zarr's crc32c besides.  Loading follows CURRENT only to a real version directory of this state (a
name vNNNNNN.zarr, never a link), checks the structure (``saved_settings``: attribute types and
the settings the options make; ``_array_problem``: every array's dtype and shape from the
statistics' fields, offsets, gallery rows - what must hold before a kernel indexes with it), then
the checksums: a deleted chunk (zarr would read zeros), a garbled chunk or an edited attribute is
refused as damaged, never turned into other numbers than a full evaluation gives.

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

from ..core.errors import OptionError, StoreError, one_line
from .settings import Settings
from ..engine.ranges import DistanceRange
from ..engine.metadata import Metadata
from ..core.outputs import check_directory
from ..engine.state import Positives, QueryState
from ..engine.statistic import Field, StatState
from ..features.dedup.statistic import EMPTY
from ..features.ranked.statistic import list_problem
from ..features.verification.kernels import entries_problem
from ..store import Store, rows_fingerprint

STATE_SCHEMA = 3  # 2: checksums, crc32c chunks, rows_fingerprint; 3: protocol records, trial bits, statistics
POINTER = "CURRENT"
PENDING_POINTER = POINTER + ".tmp"
VERSION_NAME = re.compile(r"v[0-9]{6}\.zarr")
CHUNK_ELEMENTS = 1 << 20
OFFSETS = "positives/offsets"  # n_queries + 1 entries; every other array is laid out by ``array_layout``
STATS = "stats/"  # prefix of the statistics' arrays: stats/<statistic>/<field>
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


# ------------------------------------------------------------------------------------ what is saved


def check_updatable(settings: Settings) -> None:
    """Refuse (OptionError) a protocol whose counts over the saved rows would change when gallery
    rows are appended: a state of it could never be updated, so none is kept."""
    protocol = settings.protocol
    reasons = []
    if protocol.trials is not None:
        reasons.append("its trials are drawn from the whole gallery, so appended rows would change every trial's "
                       "draw (trials=0, --trials 0, evaluates without trials)")
    if protocol.cmc == "sgs":
        reasons.append("its single-gallery-shot CMC draws one row per identity among all gallery rows, which "
                       "appended rows would change")
    if protocol.gallery_includes_queries:
        reasons.append("its gallery includes the queries' copies as the rows after the stored gallery, where "
                       "appended rows would go")
    if "t2v" in protocol.directions:
        reasons.append("direction t2v takes the store's gallery as the queries, which appends change")
    if settings.rerank is not None:
        raise OptionError("a re-ranked or query-expanded evaluation keeps no state for incremental updates (--state): "
                          "appended rows change every neighbour list and row maximum, so it is recomputed, never "
                          "updated")
    if reasons:
        raise OptionError(f"protocol '{protocol.name}' keeps no state for incremental updates (--state): "
                          + "; ".join(reasons))


def saved_statistics(settings: Settings) -> tuple:
    """The statistics a state saved with ``settings`` holds (their fields follow from the options
    alone; the error bounds the feature dimension sets are the run's business)."""
    return settings.statistics(Metadata(), dim=1)


def array_layout(settings: Settings) -> dict:
    """Every array of a state saved with ``settings`` but positives/offsets: key -> ``Field``
    (rows per query or per positive, dtype, shape after the rows), in the order they are saved."""
    layout = {
        "positives/dist": Field("positive", np.float64, ()), "positives/gidx": Field("positive", np.int64, ()),
        "positives/bits": Field("positive", np.uint64, ()),
        "positives/junk": Field("query", np.int64, (settings.n_trials,)),
    }
    for key, (_, spec) in StatState.specs(saved_statistics(settings)).items():
        layout[STATS + key] = spec
    return layout


def _state_arrays(state: QueryState) -> dict:
    positives = state.positives
    arrays = {OFFSETS: positives.offsets, "positives/dist": positives.dist, "positives/gidx": positives.gidx,
              "positives/bits": positives.bits, "positives/junk": positives.junk}
    arrays.update({STATS + key: data for key, data in state.stats.arrays.items()})
    return {key: np.ascontiguousarray(data) for key, data in arrays.items()}


def _ranges_record(ranges: list | None) -> list | None:
    """Per trial [lo, hi], or null for a trial without pairs (its range is empty: lo > hi)."""
    if ranges is None:
        return None
    return [[float(r.lo), float(r.hi)] if r.lo <= r.hi else None for r in ranges]


def _ranges_from_record(record: list | None) -> list | None:
    if record is None:
        return None
    return [DistanceRange(np.inf, -np.inf) if r is None else DistanceRange(*r) for r in record]


# ----------------------------------------------------------------------------------------- structure


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _mapping(what: str):
    return (lambda v: isinstance(v, dict), what)


_TEXT = (lambda v: isinstance(v, str) and v != "", "a non-empty string")
_COUNT = (lambda v: _integer(v) and v >= 1, "a positive integer")
_ATTRIBUTE_FIELDS = {  # attribute: {key: (test, what it must be)}, keys exactly these
    "covers": {
        "query_fingerprint": _TEXT, "n_queries": _COUNT, "gallery_rows": _COUNT,
        "store_uid": (lambda v: v is None or isinstance(v, str), "a string or null"), "rows_fingerprint": _TEXT,
        "settings": _mapping("a mapping"),
    },
    "options": {
        "metric": _TEXT, "protocol": _mapping("a mapping (a protocol record)"), "precision": _TEXT,
        "gom_norm": _TEXT, "gom_vp": _TEXT, "max_rank": _COUNT, "gom_bins": _COUNT, "gom_b": _COUNT,
        "no_gom": (lambda v: isinstance(v, bool), "true or false"), "std_ddof": (_integer, "an integer"),
    },
}


_OPTIONAL_FIELDS = {"options": {"ranked": _mapping("a mapping (ranked.Spec's record)"),  # absent: none kept
                                "open_set": _mapping("a mapping (openset.Spec's record)"),
                                "verification": _mapping("a mapping (verification.Spec's record)")}}


def _attribute_problem(attrs: dict) -> str | None:
    """Attribute types: covers and options with exactly their keys (and any optional ones),
    checksums a mapping of strings."""
    for name, fields in _ATTRIBUTE_FIELDS.items():
        record = attrs.get(name)
        if not isinstance(record, dict):
            return f"attribute {name} is {record!r:.60}, not a mapping"
        fields = {**fields, **{key: spec for key, spec in _OPTIONAL_FIELDS.get(name, {}).items() if key in record}}
        if set(record) != set(fields):
            return f"attribute {name} has keys {sorted(record)}, expected {sorted(fields)}"
        for key, (test, kind) in fields.items():
            if not test(record[key]):
                return f"attribute {name}.{key} is {record[key]!r:.60}, expected {kind}"
    checksums = attrs.get("checksums")
    if not isinstance(checksums, dict) or not all(isinstance(v, str) for v in checksums.values()):
        return f"attribute checksums is {checksums!r:.60}, not a mapping of hashes"
    return None


def saved_settings(attrs: dict) -> tuple[Settings | None, str | None]:
    """(the settings the options of a version read back make, None) or (None, its first problem):
    attribute types, options that make valid settings of an updatable protocol, covers.settings and
    dist_range that agree with them, a checksum for every array they imply."""
    problem = _attribute_problem(attrs)
    if problem:
        return None, problem
    try:
        settings = Settings.parse(None, **attrs["options"])  # no store needed: the metric is always recorded
        check_updatable(settings)
    except (OptionError, TypeError, ValueError) as exc:
        return None, f"attribute options make no settings a state can hold ({one_line(exc)})"
    if attrs["covers"]["settings"] != settings.state_key():
        return None, "attribute covers.settings does not match attribute options"
    expected = {OFFSETS, *array_layout(settings), *SIGNED_ATTRIBUTES}
    if set(attrs["checksums"]) != expected:
        return None, f"attribute checksums has keys {sorted(attrs['checksums'])}, expected {sorted(expected)}"
    problem = _range_problem(attrs, settings)
    return (None, problem) if problem else (settings, None)


def _range_problem(attrs: dict, settings: Settings) -> str | None:
    if "dist_range" not in attrs:
        return "attribute dist_range is missing"
    ranges = attrs["dist_range"]
    if not settings.minmax:
        return None if ranges is None else f"attribute dist_range is {ranges!r:.60}, expected null (no minmax)"
    if not (isinstance(ranges, list) and len(ranges) == settings.n_trials and all(
            r is None or (isinstance(r, list) and len(r) == 2 and all(map(_finite, r)) and r[0] <= r[1])
            for r in ranges)):
        return (f"attribute dist_range is {ranges!r:.60}, expected per trial ({settings.n_trials}) [min, max] of the "
                "minmax normalisation, or null for a trial without pairs")
    return None


def _array_problem(attrs: dict, settings: Settings, arrays: dict) -> str | None:
    """The first problem of the arrays read back, or None.  What the numbers and the kernels rely
    on: every array's dtype and shape (CSR offsets from 0, never decreasing, one row per positive
    or per query as its field says), gallery rows in range, positives sorted, counts never negative."""
    layout = array_layout(settings)
    for key, spec in {OFFSETS: Field("query", np.int64, ()), **layout}.items():
        data, ndim = arrays[key], (spec.axis != "global") + len(spec.shape)
        if data.dtype != spec.dtype or data.ndim != ndim:
            return f"{key} is {data.ndim}-D {data.dtype}, expected {ndim}-D {np.dtype(spec.dtype)}"
    n, offsets = attrs["covers"]["n_queries"], arrays[OFFSETS]
    if offsets.shape != (n + 1,) or offsets[0] != 0 or (np.diff(offsets) < 0).any():
        return f"positives/offsets must be n_queries + 1 = {n + 1} entries from 0, never decreasing"
    rows = {"query": (n,), "positive": (int(offsets[-1]),), "global": ()}
    for key, spec in layout.items():
        shape, expected = arrays[key].shape, rows[spec.axis] + spec.shape
        if spec.axis == "positive" and shape[0] != expected[0]:
            return f"positives/offsets ends at {offsets[-1]} but {key} holds {shape[0]} positives"
        if shape != expected:
            per = "" if spec.axis == "global" else f" (a row per {spec.axis})"
            return f"{key} has shape {shape}, expected {expected}{per}"
    gallery_rows = attrs["covers"]["gallery_rows"]
    return (_positives_problem(gallery_rows, settings.n_trials, arrays) or _counts_problem(layout, arrays)
            or _lists_problem(gallery_rows, arrays) or _tails_problem(gallery_rows, n, arrays))


def _positives_problem(gallery_rows: int, n_trials: int, arrays: dict) -> str | None:
    offsets, dist, gidx, bits = (arrays[key] for key in (OFFSETS, "positives/dist", "positives/gidx", "positives/bits"))
    if not np.isfinite(dist).all():
        return "positives/dist holds non-finite distances"
    if ((gidx < 0) | (gidx >= gallery_rows)).any():
        return f"positives/gidx holds gallery rows outside [0, {gallery_rows})"
    if (bits & ~np.uint64((1 << n_trials) - 1)).any():
        return f"positives/bits marks trials beyond the protocol's {n_trials}"
    follows = np.ones(dist.shape[0], dtype=bool)  # entry i continues its query's list
    follows[offsets[:-1][np.diff(offsets) > 0]] = False
    ordered = (dist[1:] > dist[:-1]) | ((dist[1:] == dist[:-1]) & (gidx[1:] > gidx[:-1]))
    if (follows[1:] & ~ordered).any():
        return "positives/dist and positives/gidx are not sorted by (distance, gallery row) within each query"
    return None


def _counts_problem(layout: dict, arrays: dict) -> str | None:
    """Counts (the junk counts and the statistics' summed fields) never negative, min / max fields
    never NaN, identity-dedup lists packed from the front without repeats (as ``dedup._insert`` keeps them)."""
    for key, spec in layout.items():
        data = arrays[key]
        if (key.startswith(STATS) and spec.merge == "sum") or key == "positives/junk":
            if (data < 0).any():
                return f"{key} holds negative counts"
        elif spec.merge in ("min", "max") and np.isnan(data).any():
            return f"{key} holds NaN"
    held = arrays.get(STATS + "dedup/held")
    if held is not None:
        present = held != EMPTY
        if (present[..., 1:] & ~present[..., :-1]).any():
            return "stats/dedup/held has a pid after a free place"
        ordered = np.sort(held, axis=-1)
        if ((ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] != EMPTY)).any():
            return "stats/dedup/held lists a pid twice for one query and trial"
    return None


def _tails_problem(gallery_rows: int, n_queries: int, arrays: dict) -> str | None:
    """Verification's tails (``features.verification.kernels``): headers and entries well formed."""
    key = STATS + "verify/tail"
    problem = entries_problem(arrays[key], gallery_rows, n_queries) if key in arrays else None
    return f"{key} {problem}" if problem else None


def _lists_problem(gallery_rows: int, arrays: dict) -> str | None:
    """Ranked lists (``statistics.topk``): keys sorted, padding last, gallery rows counted."""
    for key in (STATS + "topk/kept", STATS + "topk/excluded"):
        problem = list_problem(arrays[key], gallery_rows) if key in arrays else None
        if problem:
            return f"{key} {problem}"
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
    parents = {key.rsplit("/", depth)[0] for key in arrays for depth in range(1, key.count("/") + 1)}
    for subgroup in sorted(parents):  # a parent sorts before its children
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


def save_state(path, store: Store, settings: Settings, state: QueryState, query_hash: str | None = None) -> str:
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
    arrays = _state_arrays(state)
    attrs = {
        "covers": coverage(store, settings, state.gallery_rows, query_hash),
        "options": settings.to_options(),
        "dist_range": _ranges_record(state.dist_range),
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


def _open_version(path: str, name: str) -> tuple[zarr.Group, dict]:
    """The group of version ``name`` and its attributes, as stored (StateError when unreadable)."""
    try:
        group = zarr.open_group(os.path.join(path, name), mode="r")
        return group, dict(group.attrs)
    except Exception as exc:  # zarr raises several types for missing or malformed metadata
        raise _damaged(path, f"{name} is not a readable zarr group: {one_line(exc)}") from None


def _read_arrays(path: str, group: zarr.Group, keys) -> dict:
    """The arrays ``keys`` of a version's group, as stored (StateError when missing or unreadable)."""
    arrays = {}
    for key in keys:
        try:
            arr = group[key]
            if not isinstance(arr, zarr.Array):
                raise TypeError("a group, not an array")
            arrays[key] = _read_array(arr)
        except KeyError:
            raise _damaged(path, f"{key} is missing") from None
        except Exception as exc:  # a chunk failing its crc32c, undecodable bytes, bad metadata
            raise _damaged(path, f"{key} cannot be read: {one_line(exc)}") from None
    return arrays


def _checksum_problem(attrs: dict, arrays: dict) -> str | None:
    recorded = attrs["checksums"]
    for key, value in _checksums(attrs, arrays).items():
        if recorded[key] != value:
            return f"{'attribute' if key in SIGNED_ATTRIBUTES else 'array'} {key} does not match its checksum"
    return None


def load_state(path) -> SavedState:
    """Open the live version of the state at ``path``, checked (StateError when there is none, or
    it is damaged).  Its statistics are those the saved options name (``saved_statistics``)."""
    path = _local_path(path)
    if not os.path.lexists(path):
        raise StateError(f"no state at '{path}' (make one with 'streameval eval STORE --state {path}')")
    name = _live_version(path)
    if name is None and _contents(path) == "unfinished":
        raise StateError(f"the state at '{path}' was never completed (its first save was interrupted); "
                         f"make it again with 'streameval eval STORE --state {path}'")
    if name is None:
        raise StateError(f"'{path}' is not a streameval state (no {POINTER} naming a version)")
    group, attrs = _open_version(path, name)
    schema = attrs.get("streameval_state")
    if schema != STATE_SCHEMA:
        raise StateError(f"'{path}' holds a state of another schema ({schema!r:.20}, expected {STATE_SCHEMA}); "
                         "make a new one with a full 'streameval eval --state'")
    settings, problem = saved_settings(attrs)
    if problem:
        raise _damaged(path, problem)
    arrays = _read_arrays(path, group, [OFFSETS, *array_layout(settings)])
    problem = _array_problem(attrs, settings, arrays) or _checksum_problem(attrs, arrays)
    if problem:
        raise _damaged(path, problem)
    positives = Positives(*(arrays[f"positives/{part}"] for part in ("offsets", "dist", "gidx", "bits", "junk")))
    stats = StatState(saved_statistics(settings), {key[len(STATS):]: data for key, data in arrays.items()
                                                    if key.startswith(STATS)})
    covers = attrs["covers"]
    query_state = QueryState(positives, stats, _ranges_from_record(attrs["dist_range"]), covers["gallery_rows"])
    return SavedState(path, name, covers, attrs["options"], query_state)


def _differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """'key old -> new' for every key whose value differs, mappings key by key (protocol.junk_pids)."""
    out = []
    for key in [*new, *(key for key in old if key not in new)]:
        was, now = old.get(key), new.get(key)
        if isinstance(was, dict) and isinstance(now, dict):
            out += _differences(was, now, f"{prefix}{key}.")
        elif was != now:
            out.append(f"{prefix}{key} {was!r} -> {now!r}")
    return out


def check_matches(saved: SavedState, store: Store, settings: Settings) -> str:
    """Refuse a state that was not taken over this store's queries, its gallery's first rows and
    these options (naming every option that differs, field by field for the protocol); return the
    query fingerprint."""
    covers = saved.covers
    where = f"the state at '{saved.path}'"
    if settings.state_key() != covers["settings"]:
        named = ", ".join(_differences(covers["settings"], settings.state_key()))
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
