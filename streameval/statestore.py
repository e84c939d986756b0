"""Saved per-query state: what ``streameval eval --state`` writes and ``streameval update`` extends.

A state directory holds versions; a small pointer file names the live one::

    STATE/
      CURRENT                  the live version's name, one line, replaced atomically (os.replace)
      v000002.zarr/            zarr v3 group, never modified once CURRENT names it
        attrs  streameval_state = 1; covers (what the counts were taken over, below);
               options (evaluate's keyword arguments); dist_range ([dmin, dmax] of minmax GOM)
        positives/offsets (Nq + 1), positives/dist, positives/gidx, positives/junk (Nq)
        ranks/neg_slots, ranks/neg_hist (Nq, GOM bins + 2)

``covers``: the query set's fingerprint (a hash of its features as stored, pids and camids), the
gallery rows counted, the store's uid (new whenever a store is created) with a hash of a sample of
those rows, and the options the counts depend on (``Settings.state_key``).

Writing makes the next version in full beside the live one, syncs it, then swaps CURRENT and
removes older versions: interrupted anywhere (a crash, Ctrl-C), CURRENT names a complete version.
States are local directories (the swap needs a local file system).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass

import numpy as np
import zarr

from .errors import OptionError, StoreError
from .gom import DistanceRange
from .state import Positives, QueryState, RankState
from .store import FeatureSet, Store

STATE_SCHEMA = 1
POINTER = "CURRENT"
DIGEST_SAMPLE_ROWS = 9  # gallery rows hashed to recognise a rewritten gallery (evenly spaced, ends included)
CHUNK_ELEMENTS = 1 << 20
ARRAYS = ("positives/offsets", "positives/dist", "positives/gidx", "positives/junk", "ranks/neg_slots", "ranks/neg_hist")


class StateError(StoreError):
    """A saved state is missing, unreadable, or does not match the store or the options."""


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


def _live_version(path: str) -> str | None:
    """The live version's name, or None when ``path`` is not a state directory."""
    try:
        with open(os.path.join(path, POINTER)) as fh:
            name = fh.read().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return name if name and os.path.isdir(os.path.join(path, name)) else None


def check_writable(path, overwrite: bool) -> None:
    """Refuse to write a state where something else lives, or over a state without ``overwrite``."""
    path = _local_path(path)
    if not os.path.exists(path) or (os.path.isdir(path) and not os.listdir(path)):
        return
    if _live_version(path) is None:
        raise StateError(f"'{path}' exists and is not a streameval state; choose another --state path")
    if not overwrite:
        raise StateError(f"a state already exists at '{path}'; pass --overwrite (overwrite_state=True) to replace it, "
                         "or 'streameval update' to extend it")


# ------------------------------------------------------------------------------------------ fingerprints


def query_fingerprint(fs: FeatureSet) -> str:
    """Hash of the whole query set as stored (read a chunk at a time)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{len(fs)} {fs.dim} {fs.features.dtype}".encode())
    for start in range(0, len(fs), fs.chunk_rows):
        rows = slice(start, min(start + fs.chunk_rows, len(fs)))
        for arr in (fs.features[rows], fs.pids[rows], fs.camids[rows]):
            digest.update(np.ascontiguousarray(arr).tobytes())
    return digest.hexdigest()


def gallery_digest(fs: FeatureSet, rows: int) -> str:
    """Hash of a sample of gallery rows [0, rows): enough to notice a rewritten gallery cheaply."""
    sample = np.unique(np.linspace(0, rows - 1, DIGEST_SAMPLE_ROWS).astype(np.int64))
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{rows} {fs.dim} {fs.features.dtype}".encode())
    for arr in (fs.features.oindex[sample, :], fs.pids.oindex[sample], fs.camids.oindex[sample]):
        digest.update(np.ascontiguousarray(arr).tobytes())
    return digest.hexdigest()


def coverage(store: Store, settings, gallery_rows: int, query_hash: str | None = None) -> dict:
    """What a state over gallery rows [0, gallery_rows) of ``store`` with ``settings`` covers."""
    return {
        "query_fingerprint": query_hash or query_fingerprint(store.query),
        "n_queries": len(store.query),
        "gallery_rows": gallery_rows,
        "store_uid": store.uid,
        "gallery_digest": gallery_digest(store.gallery, gallery_rows),
        "settings": settings.state_key(),
    }


# ---------------------------------------------------------------------------------------- write / read


def _write_array(group: zarr.Group, name: str, data: np.ndarray) -> None:
    rows = max(1, CHUNK_ELEMENTS // max(1, int(np.prod(data.shape[1:]))))
    chunks = (max(1, min(rows, data.shape[0])),) + data.shape[1:]
    group.create_array(name, shape=data.shape, dtype=data.dtype, chunks=chunks)[...] = data


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


def save_state(path, store: Store, settings, state: QueryState, query_hash: str | None = None) -> str:
    """Write ``state`` as the new live version of the state at ``path``; return the version's name."""
    path = _local_path(path)
    os.makedirs(path, exist_ok=True)
    live = _live_version(path)
    number = int(live[1:7]) + 1 if live else 1
    name = f"v{number:06d}.zarr"
    target = os.path.join(path, name)
    if os.path.exists(target):  # left by an interrupted write: never live, safe to drop
        shutil.rmtree(target)
    group = zarr.open_group(target, mode="w")
    arrays = (state.positives.offsets, state.positives.dist, state.positives.gidx, state.positives.junk,
              state.ranks.neg_slots, state.ranks.neg_hist)
    for key, data in zip(ARRAYS, arrays):
        _write_array(group, key, np.ascontiguousarray(data))
    group.attrs.update({
        "streameval_state": STATE_SCHEMA,
        "covers": coverage(store, settings, state.gallery_rows, query_hash),
        "options": settings.to_options(),
        "dist_range": None if state.dist_range is None else [state.dist_range.lo, state.dist_range.hi],
    })
    _sync_tree(target)
    pointer = os.path.join(path, POINTER + ".tmp")
    with open(pointer, "w") as fh:
        fh.write(name + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(pointer, os.path.join(path, POINTER))  # the commit point
    _sync_dir(path)
    for other in os.listdir(path):
        if other.endswith(".zarr") and other != name:
            shutil.rmtree(os.path.join(path, other), ignore_errors=True)
    return name


def load_state(path) -> SavedState:
    """Open the live version of the state at ``path`` (StateError when there is none)."""
    path = _local_path(path)
    if not os.path.exists(path):
        raise StateError(f"no state at '{path}' (make one with 'streameval eval STORE --state {path}')")
    name = _live_version(path)
    if name is None:
        raise StateError(f"'{path}' is not a streameval state (no {POINTER} naming a version)")
    try:
        group = zarr.open_group(os.path.join(path, name), mode="r")
        if group.attrs.get("streameval_state") != STATE_SCHEMA:
            raise StateError(f"'{path}' holds a state of another schema ({group.attrs.get('streameval_state')!r})")
        offsets, dist, gidx, junk, slots, hist = (np.asarray(group[key][...]) for key in ARRAYS)
        attrs = dict(group.attrs)
        covers, options, dist_range = attrs["covers"], attrs["options"], attrs["dist_range"]
    except StateError:
        raise
    except Exception as exc:  # a damaged state: missing arrays or attributes, unreadable chunks
        raise StateError(f"cannot read the state at '{path}' ({type(exc).__name__}: {exc})") from None
    query_state = QueryState(
        Positives(offsets, dist, gidx, junk), RankState(slots, hist),
        None if dist_range is None else DistanceRange(*dist_range), covers["gallery_rows"],
    )
    return SavedState(path, name, covers, options, query_state)


def check_matches(saved: SavedState, store: Store, settings) -> str:
    """Refuse a state that was not taken over this store's queries, its gallery's first rows and
    these options; return the query fingerprint."""
    covers = saved.covers
    where = f"the state at '{saved.path}'"
    if settings.state_key() != covers["settings"]:
        diff = {k: (covers["settings"].get(k), v) for k, v in settings.state_key().items() if covers["settings"].get(k) != v}
        named = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in diff.items())
        raise StateError(f"{where} was made with other options ({named}); run a full 'streameval eval --state'")
    query_hash = query_fingerprint(store.query)
    if query_hash != covers["query_fingerprint"]:
        raise StateError(f"{where} was made for other queries than those of '{store.path}'")
    rows = covers["gallery_rows"]
    if len(store.gallery) < rows:
        raise StateError(f"{where} covers {rows:,} gallery rows but '{store.path}' has {len(store.gallery):,}: "
                         "the gallery shrank or was rewritten; run a full 'streameval eval --state'")
    if covers["store_uid"] != store.uid or covers["gallery_digest"] != gallery_digest(store.gallery, rows):
        raise StateError(f"the gallery of '{store.path}' was rewritten since {where} was made (its first {rows:,} "
                         "rows differ); run a full 'streameval eval --state'")
    return query_hash
