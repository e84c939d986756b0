"""The Dask graph: per-(query block, gallery chunk) tasks and a tree reduction per query block.

For each query block::

    load_query_block ─┬─> find_positive_pairs(chunk 0..C) ─> collect_positives ─┐
                      └──────────────────────────────────────────────────────────┴─> score_chunk(chunk 0..C)
                                                     tree of RankState.merge <─┘
                                                              └─> rank_summaries (per-query arrays)

Tasks receive the store's arrays (not data) and read their own gallery rows, so nothing but small
states travels between workers; the query block and its positives are computed once and shared.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

import numpy as np
from dask import delayed

from . import kernels
from .errors import StoreError
from .plan import Plan
from .protocol import Positives, Protocol
from .state import RankState
from .store import FeatureSet, read_ids, read_rows

MERGE_FAN_IN = 8


@dataclass(frozen=True)
class Scoring:
    """What every task needs to score pairs: working dtype, metric code and protocol."""

    dtype: np.dtype
    metric: int
    protocol: Protocol


@dataclass(frozen=True)
class Rows:
    """Rows [start, start + len) of a set, read and prepared for scoring."""

    start: int
    features: np.ndarray  # working dtype
    terms: np.ndarray  # float64, kernels.row_terms
    pids: np.ndarray
    camids: np.ndarray


def load_rows(fs: FeatureSet, start: int, stop: int, scoring: Scoring) -> Rows:
    features, pids, camids = read_rows(fs, start, stop, scoring.dtype)
    terms = kernels.row_terms(features, scoring.metric)
    if scoring.metric == kernels.COSINE and not terms.all():
        row = start + int(np.flatnonzero(terms == 0)[0])
        raise StoreError(f"{fs.name} row {row} is an all-zero feature vector: its cosine distance is undefined")
    return Rows(start, features, terms, pids, camids)


def find_positive_pairs(gallery: FeatureSet, start: int, stop: int, queries: Rows, scoring: Scoring):
    """Positive pairs between the query block and gallery rows [start, stop), with exact distances.

    Reads the chunk's features only when it holds a positive of some query in the block.
    """
    g_pid, g_cam = read_ids(gallery, start, stop)
    qrows, grows = scoring.protocol.positive_pairs(
        queries.pids, queries.camids, g_pid, g_cam, scoring.protocol.junk_mask(g_pid)
    )
    if qrows.size == 0:
        return qrows, grows, np.empty(0, dtype=np.float64)
    chunk = load_rows(gallery, start, stop, scoring)
    dist = kernels.pair_distances(
        queries.features, chunk.features, qrows, grows, queries.terms, chunk.terms, scoring.metric
    )
    return qrows, grows + start, dist


def collect_positives(n_queries: int, *parts) -> Positives:
    qrows, gidx, dist = (np.concatenate(column) for column in zip(*parts))
    return Positives.from_pairs(n_queries, qrows, gidx, dist)


def score_chunk(gallery: FeatureSet, start: int, stop: int, queries: Rows, positives: Positives, scoring: Scoring) -> RankState:
    """Slot counts of the negatives in gallery rows [start, stop) for every query of the block."""
    state = RankState.empty(positives.dist.shape[0])
    chunk = load_rows(gallery, start, stop, scoring)
    dots = queries.features @ chunk.features.T
    kernels.count_negative_slots(
        dots, queries.terms, chunk.terms, scoring.metric, queries.pids, chunk.pids,
        scoring.protocol.junk_mask(chunk.pids), start,
        positives.offsets, positives.dist, positives.gidx, state.neg_slots,
    )
    return state


def summarize_block(positives: Positives, state: RankState) -> dict:
    """Per-query arrays for one query block: first-hit rank, AP, AP_trapezoid, INP, #positives."""
    n = positives.offsets.shape[0] - 1
    out = {
        "first_hit_rank": np.empty(n, dtype=np.int64),
        "ap": np.empty(n), "ap_trapezoid": np.empty(n), "inp": np.empty(n),
    }
    kernels.rank_summaries(positives.offsets, state.neg_slots, out["first_hit_rank"], out["ap"], out["ap_trapezoid"], out["inp"])
    out["n_positives"] = positives.counts
    return out


def _merge_all(merge, *states):
    return reduce(merge, states)


def tree_reduce(items: list, merge, fan_in: int = MERGE_FAN_IN):
    """Merge delayed states ``fan_in`` at a time until one is left (depth log_fan_in(len))."""
    while len(items) > 1:
        items = [delayed(_merge_all)(merge, *items[i:i + fan_in]) for i in range(0, len(items), fan_in)]
    return items[0]


def build(query: FeatureSet, gallery: FeatureSet, plan: Plan, scoring: Scoring) -> list:
    """One delayed per-query summary dict per query block, in query order."""
    chunks = plan.gallery_ranges(len(gallery))
    summaries = []
    for q_start, q_stop in plan.query_ranges(len(query)):
        queries = delayed(load_rows)(query, q_start, q_stop, scoring)
        pairs = [delayed(find_positive_pairs)(gallery, a, b, queries, scoring) for a, b in chunks]
        positives = delayed(collect_positives)(q_stop - q_start, *pairs)
        states = [delayed(score_chunk)(gallery, a, b, queries, positives, scoring) for a, b in chunks]
        summaries.append(delayed(summarize_block)(positives, tree_reduce(states, RankState.merge)))
    return summaries
