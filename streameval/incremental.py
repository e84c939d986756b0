"""Incremental re-evaluation: score only the gallery rows appended since a state was saved.

A saved state (``statestore``) holds every query's counts over gallery rows [0, n0).  The store now
commits n1 > n0 rows.  ``update`` brings the state to [0, n1) and gives the same numbers as a full
evaluation, because it rebuilds exactly the integer state a full evaluation would reach:

1. **New rows, discovery** (gallery rows [n0, n1) only): every query's new positives and junk (the
   positives pass) and, with ``minmax`` GOM normalisation, the distance range of the new pairs.
2. **What the old rows owe.**  A query with a new positive had its old slot counts taken against
   other positives (a new positive splits a slot, and negatives past the old last positive start to
   count): its old rows are re-scored.  With ``minmax``, a new global minimum or maximum moves
   every threshold, so every query's histogram of the old rows is stale: all queries' old rows are
   re-scored, and the result says so.  Otherwise (and always with ``fixed`` / ``none``) the old
   counts stand.
3. **Scoring**: the new rows of every query against the merged positives, plus the old rows of the
   re-scored queries.  New state = (re-scored ? their old-rows state : the saved state) + new-rows
   state, saved atomically as the state's next version.
"""

from __future__ import annotations

import os

import numpy as np
from dask import delayed

from . import graph
from .evaluate import Execution, Runner, Settings, _as_store, make_result, session
from .gom import DistanceRange
from .progress import Phases
from .state import Positives, QueryState, RankState
from .statestore import check_matches, load_state, save_state
from .store import Store


def update(
    data,
    state: str | os.PathLike,
    *,
    metric: str | None = None,
    protocol: str | None = None,
    junk_pids=None,
    max_rank: int | None = None,
    precision: str | None = None,
    no_gom: bool | None = None,
    gom_norm: str | None = None,
    gom_bins: int | None = None,
    gom_b: int | None = None,
    gom_vp: str | None = None,
    storage_options: dict | None = None,
    **execution,
):
    """Extend the state saved at ``state`` to every committed gallery row of ``data`` (a store path,
    URL or :class:`~streameval.store.Store`) and return the :class:`~streameval.metrics.Result`,
    equal to a full ``evaluate`` of the store.

    Options default to the state's.  ``max_rank``, ``gom_b`` and ``gom_vp`` may differ (they only
    shape the report); the others decide the counts, and a value different from the state's is
    refused (StateError), as is a state of other queries or of a gallery that shrank or was
    rewritten.  The ``execution`` keywords are those of ``evaluate``.
    """
    phases = Phases()
    execution = Execution.from_options("update", execution)
    store = _as_store(data, storage_options)
    phases.lap("setup")
    saved = load_state(state)
    phases.lap("loading state")
    given = dict(metric=metric, protocol=protocol, junk_pids=junk_pids, max_rank=max_rank, precision=precision,
                 no_gom=no_gom, gom_norm=gom_norm, gom_bins=gom_bins, gom_b=gom_b, gom_vp=gom_vp)
    settings = Settings.parse(store, **{**saved.options, **{k: v for k, v in given.items() if v is not None}})
    query_hash = check_matches(saved, store, settings)
    old = saved.query_state
    with session(store, settings, execution, phases, label="streameval update") as runner:
        if len(store.gallery) == old.gallery_rows:
            new, facts, read, pairs = old, _facts(old, old, np.empty(0), np.empty(0)), 0, 0
        else:
            new, facts, read, pairs = extend(store, settings, runner, old)
    if new is not old:
        save_state(state, store, settings, new, query_hash)
        phases.lap("saving state")
    return make_result(store, settings, new, runner, read, pairs, update=facts)


def extend(store: Store, settings: Settings, runner: Runner, old: QueryState):
    """(state over every committed gallery row, facts about the update, bytes read, pairs scored)."""
    scoring = settings.scoring(store.dim)
    plan, gallery, n0, n1 = runner.plan, store.gallery, old.gallery_rows, len(store.gallery)
    blocks = graph.positives_pass(store.query, gallery, plan, scoring, start=n0)
    new_range = graph.range_pass(store.query, gallery, plan, scoring, blocks, start=n0) if settings.minmax else None
    runner.expect("scoring", graph.scoring_work(store.query, gallery, plan, len(store.query), n0, n1))
    found, new_range = runner.compute(delayed(tuple)([[positives for _, positives in blocks], new_range]))
    new_positives = Positives.concat(found)
    merged = old.positives.union(new_positives)
    affected = np.flatnonzero(new_positives.counts > 0)
    dist_range = DistanceRange.merge(old.dist_range, new_range) if settings.minmax else None
    everyone = np.arange(len(store.query))
    rescored = everyone if dist_range != old.dist_range else affected
    norm = graph.normalisation(settings.gom, dist_range)

    def score(queries: np.ndarray, start: int, stop: int, pass_name: str):
        return [graph.scoring_pass(gallery, plan, scoring, graph.block_size(rows),
                                   graph.load_queries(store.query, rows, scoring, pass_name),
                                   delayed(merged.take(rows)), norm, start, stop, pass_name)
                for rows in graph.query_blocks(plan, queries, len(queries))]

    new_rows, old_rows = runner.compute(delayed(tuple)([score(everyone, n0, n1, "scoring"),
                                                        score(rescored, 0, n0, "rescoring")]))
    kept = np.setdiff1d(everyone, rescored)
    pieces = [(kept, old.ranks.take(old.positives.offsets, kept))]
    if rescored.size:
        pieces.append((rescored, RankState.concat(old_rows)))
    base = RankState.scatter(merged.offsets, old.ranks.neg_hist.shape[1], pieces)
    new = QueryState(merged, RankState.merge(base, RankState.concat(new_rows)), dist_range, n1)
    passes = 2 if settings.minmax else 1
    read = sum(graph.positives_pass_bytes(gallery, plan, block, n0, n1) for block in found) + len(found) * (
        passes * graph.rows_bytes(gallery, n1 - n0)) + len(old_rows) * graph.rows_bytes(gallery, n0)
    read += (len(found) + len(old_rows)) * graph.rows_bytes(store.query, min(plan.query_block, len(store.query)))
    pairs = len(store.query) * (n1 - n0) + rescored.size * n0
    return new, _facts(old, new, affected, rescored), read, pairs


def _facts(old: QueryState, new: QueryState, affected: np.ndarray, rescored: np.ndarray) -> dict:
    """What the update did, for the report and the JSON."""
    def span(r):
        return None if r is None else [r.lo, r.hi]

    return {
        "rows_before": old.gallery_rows, "rows_added": new.gallery_rows - old.gallery_rows,
        "queries_with_new_positives": int(affected.size), "queries_rescored": int(rescored.size),
        "range_before": span(old.dist_range), "range_after": span(new.dist_range),
        "range_moved": old.dist_range != new.dist_range,
    }
