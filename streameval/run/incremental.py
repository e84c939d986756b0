"""Incremental re-evaluation: score only the gallery rows appended since a state was saved.

A saved state (``statestore``) holds every query's counts over gallery rows [0, n0).  The store now
commits n1 > n0 rows.  ``update`` brings the state to [0, n1) and gives the same numbers as a full
evaluation, because it rebuilds exactly the integer state a full evaluation would reach:

1. **New rows, discovery** (gallery rows [n0, n1) only): every query's new positives and junk (the
   positives pass) and, with ``minmax`` GOM normalisation, the distance range of the new pairs.
2. **What the old rows owe.**  A query with a new positive had its old counts taken against other
   positives (a new positive splits a slot, negatives past the old last positive start to count,
   and an identity-dedup list holds the identities before the first positive): its old rows are
   re-scored.  With ``minmax``, a new minimum or maximum distance moves every threshold, so every
   query's histogram of the old rows is stale: all queries' old rows are re-scored, and the result
   says so.  Otherwise (and always with ``fixed`` / ``none``) the old counts stand.
   Verification's histograms and tails (global fields, over all queries' pairs) do not depend on
   the positives: the saved ones stand, taken once (not again from a partial re-scoring).  Its AUC
   compares every negative with every positive: with ``auc`` a new positive re-scores every
   query's old rows.  A tail sized for the old gallery may be too short for the new N-: the
   selection then takes windows from the histogram (``features.verification.report``).
3. **Scoring**: the new rows of every query against the merged positives, plus the old rows of the
   re-scored queries.  New state = (re-scored ? their old-rows state : the saved state) merged with
   the new-rows state (``StatState.merge``, field by field), saved atomically as the state's next
   version.

Only protocols whose old counts survive an append keep a state (``statestore.check_updatable``): no
trials, no sgs draws, no query copies in the gallery - so the extended gallery is the stored one.
"""

from __future__ import annotations

import os
from dataclasses import replace
from functools import partial

import numpy as np
from dask import delayed

from ..engine import graph
from ..core.locking import writing
from .pipeline import FEATURE_OPTIONS, as_store, feature_requests, run_passes
from ..engine.ranges import normalisations
from ..core.progress import Phases
from .session import Runner, session
from .significance import add_intervals, check_intervals
from .settings import PROTOCOL_OPTIONS, Execution, Settings
from ..engine.state import Positives, QueryState
from .statestore import check_matches, check_updatable, load_state, save_state
from ..engine.statistic import StatState
from ..store import Store


def update(
    data,
    state: str | os.PathLike,
    *,
    metric: str | None = None,
    protocol=None,
    max_rank: int | None = None,
    precision: str | None = None,
    no_gom: bool | None = None,
    gom_norm: str | None = None,
    gom_bins: int | None = None,
    gom_b: int | None = None,
    gom_vp: str | None = None,
    std_ddof: int | None = None,
    storage_options: dict | None = None,
    ci: float | None = None,
    ci_resamples: int = 10_000,
    ci_seed: int = 0,
    **options,
):
    """Extend the state saved at ``state`` to every committed gallery row of ``data`` (a store path,
    URL or :class:`~streameval.store.Store`) and return the :class:`~streameval.run.result.Result`,
    equal to a full ``evaluate`` of the store.

    Options default to the state's; ``protocol`` (a preset name, a protocol file, a Protocol) and
    its overrides (``junk_pids``, ``denominator``, ``cmc``, ...) are those of ``evaluate``.
    ``max_rank``, ``gom_b``, ``gom_vp`` and ``std_ddof`` may differ (they only shape the report;
    ``max_rank`` not with an identity-dedup CMC, whose state is that long); any other difference,
    a protocol field included, is refused (StateError naming it), as is a state of other queries or
    of a gallery that shrank or was rewritten.  The other keywords are ``evaluate``'s execution
    keywords.

    Ranked lists (``ranked_list``, ``trial``, ``with_junk``: as in the state; ``queries``,
    ``sort_by``, ``with_positives`` as ``evaluate``'s) are kept in the state and merged like the counts.
    Open-set identification (``open_set``) is as in the state, whose nearest-item scores merge by
    their minimum; ``fpir``, ``dir_ranks`` and ``fpir_rounding`` may differ.  So is verification
    (``verification``, ``auc``, ``hist_bits``); ``far`` and ``tail_budget`` may differ.
    ``ci``, ``ci_resamples``, ``ci_seed``: confidence intervals, as ``evaluate``'s (never part of the state).
    """
    intervals = check_intervals(ci, ci_resamples, ci_seed)
    phases = Phases()
    overrides = {key: options.pop(key) for key in PROTOCOL_OPTIONS if key in options}
    features = {key: options.pop(key) for key in FEATURE_OPTIONS if key in options}
    execution = Execution.from_options("update", options)
    store = as_store(data, storage_options)
    phases.lap("setup")
    with writing(state):  # from loading to saving: two updates of one state would each save over the other
        saved = load_state(state)
        phases.lap("loading state")
        requests, selection = feature_requests(features, saved.options)  # open_set=False: refused below
        if selection is not None:
            selection.check(len(store.query))
        given = dict(metric=metric, protocol=protocol, max_rank=max_rank, precision=precision, no_gom=no_gom,
                     gom_norm=gom_norm, gom_bins=gom_bins, gom_b=gom_b, gom_vp=gom_vp, std_ddof=std_ddof)
        settings = Settings.parse(store, **{**saved.options, **{k: v for k, v in given.items() if v is not None},
                                            **requests}, **overrides)
        check_updatable(settings)
        query_hash = check_matches(saved, store, settings)
        with session(store, settings, execution, phases, label="streameval update") as runner:
            passes = run_passes(store, settings, runner, partial(advance, saved=saved.query_state), place=False)
        if passes.facts["rows_added"]:
            save_state(state, store, settings, passes.state, query_hash)
            phases.lap("saving state")
        result = passes.result(store, runner, selection)
    if intervals is not None:
        add_intervals(result, *intervals)
    return result


def advance(store: Store, settings: Settings, runner: Runner, saved: QueryState):
    """(state, bytes read, pairs scored, facts about the update): the ``saved`` state over every row
    of the store's extended gallery, scored on ``runner`` (its plan the store's); as saved when
    nothing was added."""
    parts = graph.gallery_parts(store.query, store.gallery, settings.protocol.gallery_includes_queries)
    meta = runner.meta
    # the saved counts under this run's statistics (the same fields: check_matches compared the options)
    old = replace(saved, stats=StatState(settings.statistics(meta, store.dim), saved.stats.arrays))
    if graph.extended_rows(parts) == old.gallery_rows:
        return old, 0, 0, _facts(old, old, np.empty(0), np.empty(0))
    scoring = settings.scoring(store.dim, meta, runner.device)
    plan, n0, n1 = runner.plan, old.gallery_rows, graph.extended_rows(parts)
    blocks = graph.positives_pass(store.query, parts, plan, scoring, meta, start=n0)
    sizes = [graph.block_size(rows) for rows in graph.query_blocks(plan, None, len(store.query))]
    new_range = graph.range_pass(parts, plan, scoring, meta, blocks, sizes, start=n0) if settings.minmax else None
    runner.expect("scoring", graph.scoring_work(store.query, parts, plan, len(store.query), n0, n1))
    found, new_range = runner.compute(delayed(tuple)([[positives for _, positives in blocks], new_range]))
    new_positives = Positives.concat(found)
    merged = old.positives.union(new_positives)
    affected = np.flatnonzero(new_positives.counts > 0)
    dist_range = graph.merge_ranges(old.dist_range, new_range) if settings.minmax else None
    everyone = np.arange(len(store.query))
    # a moved range (any trial's) changes every threshold; the AUC compares every negative with every positive
    auc = settings.verification is not None and settings.verification.auc and affected.size > 0
    rescored = everyone if dist_range != old.dist_range or auc else affected
    run = graph.PassContext(normalisations(settings.gom, dist_range, settings.n_trials), meta,
                            graph.pooled(scoring.statistics, merged))

    def score(queries: np.ndarray, start: int, stop: int, pass_name: str):
        return [graph.scoring_pass(parts, plan, scoring, graph.block_size(rows),
                                   graph.load_queries(store.query, rows, scoring, meta, pass_name),
                                   delayed(merged.take(rows)), run, meta, start, stop, pass_name)
                for rows in graph.query_blocks(plan, queries, len(queries))]

    new_rows, old_rows = runner.compute(delayed(tuple)([score(everyone, n0, n1, "scoring"),
                                                        score(rescored, 0, n0, "rescoring")]))
    kept = np.setdiff1d(everyone, rescored)
    whole = rescored.size == everyone.size  # then the old rows' global fields come from the re-scoring
    pieces = [(kept, _with_globals(old.stats.take(old.positives.offsets, kept), not whole))]
    if rescored.size:
        pieces.append((rescored, _with_globals(StatState.concat(old_rows), whole)))
    base = StatState.scatter(scoring.statistics, merged.offsets, pieces)
    new = QueryState(merged, StatState.merge(base, StatState.concat(new_rows)), dist_range, n1)
    read = _bytes_read(store, settings, plan, parts, found, old_rows, n0, n1, rescored.size)
    return new, read, len(store.query) * (n1 - n0) + rescored.size * n0, _facts(old, new, affected, rescored)


def _with_globals(state: StatState, keep: bool) -> StatState:
    """``state``, with its global fields (verification's: over the pairs of all its queries) emptied
    unless ``keep``: the old rows' are taken from one piece only."""
    if keep:
        return state
    blank = StatState.empty(state.statistics, 0, 0)
    return StatState(state.statistics, {key: blank.arrays[key] if spec.axis == "global" else state.arrays[key]
                                        for key, (_, spec) in StatState.specs(state.statistics).items()})


def _bytes_read(store: Store, settings: Settings, plan, parts: tuple, found: list, old_rows: list, n0: int, n1: int,
                n_rescored: int) -> int:
    """What the update read: per query block the new rows' positives pass, range pass (minmax) and
    scoring pass, the old rows of each re-scored block, and the queries of every pass (all of them
    for the discovery passes and for the scoring, the re-scored ones again)."""
    gallery = parts[0].fs
    passes = 2 if settings.minmax else 1
    read = sum(graph.positives_pass_bytes(plan, parts, block, n0, n1) for block in found)
    read += len(found) * passes * graph.rows_bytes(gallery, n1 - n0) + len(old_rows) * graph.rows_bytes(gallery, n0)
    return read + graph.rows_bytes(store.query, 2 * len(store.query) + n_rescored)


def _facts(old: QueryState, new: QueryState, affected: np.ndarray, rescored: np.ndarray) -> dict:
    """What the update did, for the report and the JSON."""
    return {
        "rows_before": old.gallery_rows, "rows_added": new.gallery_rows - old.gallery_rows,
        "queries_with_new_positives": int(affected.size), "queries_rescored": int(rescored.size),
        "range_before": _span(old.dist_range), "range_after": _span(new.dist_range),
        "range_moved": old.dist_range != new.dist_range,
    }


def _span(ranges: list | None) -> list | None:
    """The minmax range as [lo, hi] (None without minmax, or without pairs).  A state holds one
    trial (``check_updatable``), so one range."""
    if ranges is None:
        return None
    (only,) = ranges
    return [only.lo, only.hi] if only.lo <= only.hi else None
