"""A tiny problem shaped like a real store, which a run evaluates first to compile its kernels
(``session.rehearse``; ``streameval warmup`` evaluates one too): the same stored dtype, dimension
and kind of store, ids that give every kind of row the protocol knows."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

TINY_IDENTITIES = 3  # identities with queries and gallery rows on every camera
GALLERY_SHOTS = 2  # gallery rows per identity and camera (trials draw among them)
TINY_CHUNK = 16  # gallery rows per chunk: two chunks, so two chains of tasks run and their states merge
DEFAULT_CAMERAS = (1, 2, 3)
OPEN_PID, DISTRACTOR_PID = 1001, 1002  # a query identity absent from the gallery; gallery rows of no query


def without_tables(protocol):
    """The protocol with official trial tables (sized for the real store) replaced by draws: the
    trial bits have the same type either way."""
    trials = protocol.trials
    if trials is None or trials.source != "official":
        return protocol
    return replace(protocol, trials=replace(trials, source="draw", path=None))


def shape_of(store) -> dict:
    """What ``tiny_store`` copies of a store: its kind, stored dtype and dimension, whether a
    distance store has query x query distances, its default metric."""
    if store.holds_distances:
        return {"kind": store.kind, "dtype": store.gallery.distances.dtype,
                "query_distances": store.query.distances is not None}
    return {"dtype": store.query.features.dtype, "dim": store.dim, "default_metric": store.default_metric}


def tiny_store(protocol, kind: str = "features", dtype=np.float32, dim: int = 0, query_distances: bool = False,
               default_metric: str = "euclidean"):
    """An in-memory store (``shape_of`` a real one) with ``TINY_IDENTITIES`` identities queried from
    every query camera of ``protocol`` and ``GALLERY_SHOTS`` gallery rows on every gallery camera,
    a query absent from the gallery (open-set), gallery rows of no query and of a junk pid."""
    import zarr.storage

    from ..store import write_store
    from ..store.distances import write_distance_store

    q_cams, g_cams = _cameras(protocol)
    ids = range(1, TINY_IDENTITIES + 1)
    q_pids = [pid for pid in ids for _ in q_cams] + [OPEN_PID]
    q_camids = [cam for _ in ids for cam in q_cams] + [q_cams[0]]
    others = [DISTRACTOR_PID, *protocol.junk_pids[:1]]
    g_pids = [pid for pid in [*ids, *others] for _ in g_cams for _ in range(GALLERY_SHOTS)]
    g_camids = [cam for _ in [*ids, *others] for cam in g_cams for _ in range(GALLERY_SHOTS)]
    rng = np.random.default_rng(0)
    target = zarr.storage.MemoryStore()
    if kind != "features":
        q_by_q = rng.random((len(q_pids),) * 2).astype(dtype) if query_distances else None
        return write_distance_store(target, rng.random((len(q_pids), len(g_pids))).astype(dtype), q_pids, q_camids,
                                    g_pids, g_camids, kind=kind, query_distances=q_by_q, chunk_rows=TINY_CHUNK)
    features = [rng.standard_normal((len(pids), dim)).astype(dtype) for pids in (q_pids, g_pids)]
    return write_store(target, features[0], q_pids, q_camids, features[1], g_pids, g_camids,
                       dtype=str(np.dtype(dtype)), chunk_rows=TINY_CHUNK, default_metric=default_metric)


def _cameras(protocol) -> tuple:
    """(query cameras, gallery cameras) of the tiny problem: those the protocol allows, among the
    cameras it names anywhere (or a few)."""
    named = set(protocol.query_cameras or ()) | set(protocol.gallery_cameras or ())
    for relation in (protocol.x_same, protocol.x_any):
        named |= {cam for pair in relation.pairs for cam in pair}
    if protocol.trials is not None:
        named |= set(protocol.trials.cameras)
    named = tuple(sorted(named)) or DEFAULT_CAMERAS
    return tuple(protocol.query_cameras or named), tuple(protocol.gallery_cameras or named)
