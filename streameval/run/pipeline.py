"""The one sequence of a run, shared by ``evaluate`` (each direction), ``update``, and a suite's run
and update: the store the options name (:func:`as_store`, :func:`with_variants`, :func:`oriented`),
then, on a ``session.Runner``, :func:`run_passes` (verification's bands placed, the scoring passes,
verification's section) and ``Passes.result`` (the reported metrics, :func:`make_result`)."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import replace
from typing import NamedTuple

import numpy as np
import zarr.storage

from ..engine import graph, metadata
from . import result as metrics
from ..features.open_set import finalise as openset
from ..features.ranked import finalise as ranked
from ..features.verification import placement, report, spec as verification
from ..features.rerank import spec as reranking
from ..core.errors import OptionError
from ..engine.ranges import normalisations
from ..core.progress import COMPILING, compile_timer
from .settings import Settings
from ..engine.state import Positives, QueryState
from ..engine.statistic import StatState
from ..store import Store, open_store, write_store

ARRAY_NAMES = {  # accepted names for in-memory input, long form first: query_features or qf, query_pids or q_pids, ...
    f"{side}_{what}": (f"{side}_{what}", f"{side[0]}f" if what == "features" else f"{side[0]}_{what}")
    for side in ("query", "gallery") for what in ("features", "pids", "camids")}
MATRIX_KINDS = {"distances": "distance", "similarity": "similarity"}  # in-memory matrix key -> distance store kind


def as_store(data, storage_options=None) -> Store:
    """The Store of what ``evaluate``, ``update`` and the suite take: a Store, a path or URL, or
    in-memory arrays (features and ids, or a query x gallery matrix) written to a store in memory."""
    if isinstance(data, Store):
        return data
    if isinstance(data, Mapping):
        if any(key in data for key in MATRIX_KINDS):
            return _matrix_store(data)
        return write_store(zarr.storage.MemoryStore(), *(pick_array(data, name) for name in ARRAY_NAMES))
    return open_store(data, storage_options=storage_options)


def _matrix_store(arrays: Mapping) -> Store:
    """An in-memory query x gallery matrix (``distances`` or ``similarity``, larger is closer) with
    the ids, optionally ``query_distances`` (query x query, of the same kind), as a distance store
    in memory: evaluated exactly as one written by ``write_distance_store`` or ``convert --distances``."""
    from ..store.distances import write_distance_store

    given = [key for key in MATRIX_KINDS if key in arrays]
    features = [key for name in ("query_features", "gallery_features") for key in ARRAY_NAMES[name] if key in arrays]
    if len(given) > 1 or features:
        raise OptionError(f"input arrays hold {' and '.join(given + features)}: give one query x gallery matrix "
                          "(distances or similarity) or the features, not both")
    ids = [pick_array(arrays, name) for name in ARRAY_NAMES if not name.endswith("features")]
    return write_distance_store(zarr.storage.MemoryStore(), arrays[given[0]], *ids, kind=MATRIX_KINDS[given[0]],
                                query_distances=arrays.get("query_distances"))


def pick_array(arrays: Mapping, name: str):
    for key in ARRAY_NAMES[name]:
        if key in arrays:
            return arrays[key]
    raise OptionError(f"input arrays lack '{name}' (or its short name '{ARRAY_NAMES[name][1]}')")


def with_variants(store: Store, protocol, query_variant: str | None, gallery_variant: str | None) -> Store:
    """The store with the named feature variants (docs/variants.md) in place of its clean sets.
    The names are the evaluation's sides: with direction t2v the queries are the store's gallery."""
    if query_variant is None and gallery_variant is None:
        return store
    from ..store.variants import CLEAN, variant_set

    if len(protocol.directions) == 2:
        raise OptionError("feature variants are evaluated one direction at a time: set direction 'v2t' or 't2v'")
    chosen = {store_set(protocol, "query"): query_variant or CLEAN, store_set(protocol, "gallery"): gallery_variant or CLEAN}
    return replace(store, **{name: variant_set(store, name, variant) for name, variant in chosen.items()})


def store_set(protocol, side: str) -> str:
    """The store's set that is the evaluation's ``side`` ("query" or "gallery"): with direction
    t2v the queries are the store's gallery."""
    return {"query": "gallery", "gallery": "query"}[side] if protocol.directions == ("t2v",) else side


def oriented(store: Store, protocol) -> Store:
    """The store as the protocol's single direction reads it: ``t2v`` swaps queries and gallery."""
    if protocol.directions == ("t2v",):
        return replace(store, query=store.gallery, gallery=store.query)
    return store


FEATURE_OPTIONS = (*ranked.RANKED_OPTIONS, *openset.OPEN_SET_OPTIONS, *verification.VERIFY_OPTIONS,
                   *reranking.REQUEST_KEYS)


def feature_requests(options: dict, saved: dict | None = None) -> tuple[dict, object]:
    """Take the features' keywords out of ``options``: (their records, as ``Settings.parse`` takes
    them; the ranked lists' Selection or None).  ``saved``: a saved state's options, which given
    keywords override (``update``)."""
    saved = saved or {}
    spec, selection = ranked.request(options, saved.get("ranked"))
    return {"ranked": spec, "open_set": openset.request(options, saved.get("open_set")),
            "verification": verification.request(options, saved.get("verification")),
            "rerank": reranking.request(options)}, selection


class Passes(NamedTuple):
    """What a run's passes give its result."""

    settings: Settings  # with verification's bands placed
    state: QueryState
    read: int  # bytes
    pairs: int  # scored
    verification: dict | None  # the section ``verification.report`` made
    facts: dict | None = None  # an update's (``incremental.advance``)

    def result(self, store: Store, runner, selection=None) -> metrics.Result:
        """The Result (``make_result``), an update's facts with it."""
        return make_result(store, self.settings, self.state, runner, self.read, self.pairs, runner.meta, selection,
                           verification=self.verification, **({} if self.facts is None else {"update": self.facts}))


def run_passes(store: Store, settings: Settings, runner, passes=None, place: bool = True) -> Passes:
    """Every pass of a one-direction run on ``runner`` (a ``session.Runner``): verification's bands
    placed if ``place`` (a saved state keeps the two-pass route's arrays: none), the scoring passes
    ``passes(store, settings, runner) -> (QueryState, bytes read, pairs scored, facts)`` (by default
    every pair's, :func:`full_state`; an update's extend its saved state), then verification's section."""
    from ..features import REGISTRY

    with ExitStack() as temporary:
        for feature in REGISTRY:
            store, settings = feature.prepare_run(store, settings, runner, temporary)
        if place:
            settings = placement.place(store, settings, runner, runner.meta)
        state, read, pairs, facts = (passes or full_state)(store, settings, runner)
        return Passes(settings, state, read, pairs, report.report(store, settings, state, runner, runner.meta),
                      facts)


def gallery_metadata(store: Store, settings: Settings) -> graph.Metadata:
    """What every pass reads of the rows' ids: identities, trial membership (``metadata.build``)."""
    parts = graph.gallery_parts(store.query, store.gallery, settings.protocol.gallery_includes_queries)
    return metadata.build(store.query, parts, settings.rules)


def full_state(store: Store, settings: Settings, runner):
    """(Every query's state over the whole extended gallery, the bytes the graph read, the pairs
    scored, None: no update's facts)."""
    parts = graph.gallery_parts(store.query, store.gallery, settings.protocol.gallery_includes_queries)
    scoring = settings.scoring(store.dim, runner.meta, runner.device)
    positives, states, dist_range = runner.compute(graph.build(store.query, parts, runner.plan, scoring, runner.meta))
    query_state = QueryState(Positives.concat(positives), StatState.concat(states), dist_range,
                             graph.extended_rows(parts))
    passes = 2 if settings.minmax else 1
    read = graph.rows_bytes(store.query, len(store.query)) + sum(
        graph.positives_pass_bytes(runner.plan, parts, block, 0, query_state.gallery_rows)
        + passes * graph.rows_bytes(parts[0].fs, query_state.gallery_rows) for block in positives
    )
    return query_state, read, len(store.query) * query_state.gallery_rows, None


def make_result(store: Store, settings: Settings, state: QueryState, runner, bytes_read: int, pairs: int,
                meta=None, selection=None, verification=None, **run_facts) -> metrics.Result:
    """Per-query values, closed-set and GOM aggregates of ``state`` per trial, their means when
    there are several, and how the run went: ``pairs`` scored, ``bytes_read``, any other
    ``run_facts``, and the time of each phase of ``runner.phases``, this one ("metrics") included,
    with numba's compiling or loading of kernels the rehearsal did not meet named apart.
    With ranked lists, the lists of the queries ``selection`` (a ``ranked.Selection``) names;
    ``verification``: the section ``verification.report`` made while the session was open (its
    refinement may take further passes); each other feature's section is made here (``Feature.finalise``)."""
    from ..features.closed_set import trials
    from ..features import REGISTRY
    from ..store import read_ids

    meta = meta or graph.Metadata()
    finalising = [feature for feature in REGISTRY
                  if feature.finalise is not None and getattr(settings, feature.name) is not None]
    with compile_timer() as compiling:
        q_pid, q_cam = read_ids(store.query)
        q_bits = meta.q_bits if meta.q_bits is not None else settings.rules.camera_bits(
            q_cam, settings.protocol.query_cameras)
        norms = normalisations(settings.gom, state.dist_range, settings.n_trials)
        found, extras = trials.entries(state, settings, q_bits, q_cam, meta, norms)
        values, block = trials.headline(found, settings.max_rank, settings.std_ddof)
        sections = {"gom": values["gom"], "verification": verification}
        for feature in (feature for feature in finalising if feature.phase is None):
            sections[feature.name] = feature.finalise(store, settings, state, q_bits, selection)
    runner.phases.lap("metrics", carved={COMPILING: compiling.seconds} if compiling.seconds else None)
    for feature in (feature for feature in finalising if feature.phase is not None):
        sections[feature.name] = feature.finalise(store, settings, state, q_bits, selection)
        runner.phases.lap(feature.phase)
    per_query = found[0]["per_query"] if len(found) == 1 else {
        name: np.stack([entry["per_query"][name] for entry in found]) for name in found[0]["per_query"]}
    cmc = values["cmc"]
    return metrics.Result(
        n_queries=values["n_queries"], n_valid_queries=values["n_valid_queries"],
        n_open_queries=values["n_open_queries"], n_gallery=state.gallery_rows, metric=settings.metric,
        protocol=settings.protocol.name, max_rank=settings.max_rank, per_query=per_query,
        cmc=None if cmc is None else np.asarray(cmc), mAP=values["mAP"], mAP_trapezoid=values["mAP_trapezoid"],
        mINP=values["mINP"], options={"precision": settings.precision, "std_ddof": settings.std_ddof},
        run={
            "query_block": runner.plan.query_block, "gallery_chunk": runner.plan.gallery_chunk,
            "workers": runner.plan.workers, "scheduler": runner.where, "device": runner.devices,
            "bytes_read": bytes_read,
            **metrics.run_timing(dict(runner.phases.seconds), pairs), **run_facts,
        },
        protocol_record=settings.protocol.to_record(), cmc_flavour=settings.protocol.cmc, cmc_first_hit=values["cmc_first_hit"],
        cmc_sgs_expected=None if extras.get("cmc_sgs_expected") is None else list(map(float, extras["cmc_sgs_expected"])),
        trials=block, warnings=camera_set_warnings(store, settings.protocol, q_cam),
        queries=query_ids(store, settings, q_pid, q_cam, q_bits, len(found)),
        **{feature.result_field: sections.get(feature.name) for feature in REGISTRY if feature.result_field},
    )


def query_ids(store: Store, settings: Settings, pids: np.ndarray, camids: np.ndarray, q_bits: np.ndarray,
              n_entries: int) -> dict:
    """The queries' ids for ``Result.queries``: pids, camids, image paths (None when the store has
    none) and, with several trials or sgs repeats (``n_entries``), each query's membership of each
    (T, Q): a trial's bit, or with repeats (one trial) the one trial's.  The paths are read from
    the store's own set: with direction t2v the queries are its gallery."""
    from ..store.paths import read_paths

    paths = read_paths(oriented(store, settings.protocol), store_set(settings.protocol, "query"), slice(None))
    in_trial = None
    if n_entries > 1:
        bits = range(n_entries) if settings.n_trials == n_entries else [0] * n_entries
        in_trial = np.stack([((q_bits >> np.uint64(t)) & np.uint64(1)).astype(bool) for t in bits])
    return {"pid": pids, "camid": camids, "path": paths, "in_trial": in_trial}


def camera_set_warnings(store: Store, protocol, q_cam: np.ndarray) -> list[str]:
    """A warning for each side whose protocol camera set (query_cameras, gallery_cameras) keeps
    under half of its rows: most likely the store counts cameras otherwise than the protocol (SYSU's
    cameras are 1-6; 0-based ids drop most queries), and the numbers over the few rows kept look
    normal.  The gallery's camera ids are read a chunk at a time, only when it has a camera set."""
    from ..store import read_field

    def gallery_chunks():
        fs = store.gallery
        for start in range(0, len(fs), fs.chunk_rows):
            yield np.asarray(read_field(fs, "camids", slice(start, min(start + fs.chunk_rows, len(fs)))))

    warnings = []
    for what, allowed, chunks in (("queries", protocol.query_cameras, lambda: iter([q_cam])),
                                  ("gallery rows", protocol.gallery_cameras, gallery_chunks)):
        if allowed is None:
            continue
        kept, shifted, total, held = 0, 0, 0, np.zeros(0, dtype=np.int64)
        for cams in chunks():
            kept, total = kept + int(np.isin(cams, allowed).sum()), total + cams.shape[0]
            shifted += int(np.isin(cams + 1, allowed).sum())  # as if the store counted cameras from 0
            held = np.union1d(held, cams)
        if 2 * kept < total:
            warnings.append(_camera_set_warning(protocol.name, what, (kept, shifted, total), allowed, held))
    return warnings


def _camera_set_warning(name: str, what: str, counts: tuple, allowed: tuple, held: np.ndarray) -> str:
    kept, shifted, total = counts
    shown = ", ".join(str(c) for c in held[:12]) + (f", ... ({held.shape[0]:,} cameras)" if held.shape[0] > 12 else "")
    field = "query_cameras" if what == "queries" else "gallery_cameras"
    hint = (f"; counted from 1, the store's camera ids would keep {shifted:,} (are they 0-based?)"
            if 2 * shifted >= total else "")
    return (f"protocol '{name}' keeps {kept:,} of {total:,} {what}: its {field} are "
            f"{', '.join(str(c) for c in allowed)}, but the store's {what} have cameras {shown}{hint}")
