"""The Dask graph: per-(query block, gallery chunk) tasks and a tree reduction per query block.

Three passes over gallery rows [start, stop), each built per query block (``Plan``)::

    load_rows(queries) ─┬─> find_positive_pairs(chunk 0..C) ─> collect_positives     positives pass
                        ├─> [minmax GOM only] block_range(chunk 0..C) ─> tree of min/max  range pass
                        └─> score_chunk(chunk 0..C, positives, normalisation)            scoring pass
                              in W chains (chunk w, w+W, ...) ─> tree of RankState.merge

``build`` chains them over the whole gallery (one graph: the scoring tasks wait for the positives
and, with ``minmax``, for the global range).  Incremental updates (``incremental.py``) run the
passes over the new rows and over the old rows of a subset of the queries.

Tasks receive the store's arrays (not data) and read their own gallery rows, so nothing but small
states travels between workers; a query block and its positives are computed once and shared.
Tasks that read or score rows are named by ``progress.work_key``: their pass and their work
(``positives_work``, ``distance_work``), so the progress bar advances with the work done; merges
carry none.
A scoring task's state has a slot per positive of its query block, so the scoring pass runs as one
chain of tasks per worker (each task adds its chunk to a copy of its predecessor's state): only
O(workers) states are alive at once, however many chunks the gallery has.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import reduce

import numpy as np
from dask import delayed

from . import kernels
from .errors import OptionError, StoreError
from .gom import DistanceRange, GomOptions, Normalisation
from .plan import Plan
from .progress import pairs_work, read_work, work_key
from .protocol import Protocol
from .state import Positives, RankState
from .store import FeatureSet, read_ids, read_rows, row_number

MERGE_FAN_IN = 8
QUERY_SUB_BLOCK = 512  # query rows per GEMM inside a task: 512 x 4096 float32 dot products = 8 MiB


@dataclass(frozen=True)
class Scoring:
    """What every task needs to score pairs: working dtype, metric code, protocol, GOM options and
    the GEMM error bounds for ranking and threshold decisions (``kernels.dot_error_bound``,
    ``kernels.bin_error_bound``)."""

    dtype: np.dtype
    metric: int
    protocol: Protocol
    gom: GomOptions | None
    dot_bound: float
    bin_bound: float


@dataclass(frozen=True)
class Rows:
    """Rows of a set, read and prepared for scoring."""

    features: np.ndarray  # working dtype
    terms: np.ndarray  # float64, kernels.row_terms
    norms: np.ndarray  # float64 |x|, for the GEMM error windows
    pids: np.ndarray
    camids: np.ndarray


def load_rows(fs: FeatureSet, rows, scoring: Scoring) -> Rows:
    """Rows of a set (a slice or an array of row numbers)."""
    features, pids, camids = read_rows(fs, rows, scoring.dtype)
    terms = kernels.row_terms(features, scoring.metric)
    if scoring.metric == kernels.COSINE and not terms.all():
        row = row_number(rows, int(np.flatnonzero(terms == 0)[0]))
        raise StoreError(f"{fs.name} row {row} is an all-zero feature vector: its cosine distance is undefined")
    norms = terms if scoring.metric == kernels.COSINE else np.sqrt(terms)
    bad = kernels.first_out_of_range(norms, scoring.dtype)
    if bad is not None:  # its dot products would overflow or underflow in the GEMM: silently wrong numbers
        lo, hi = kernels.NORM_RANGE[scoring.dtype]
        raise OptionError(
            f"{fs.name} row {row_number(rows, bad)} has norm {norms[bad]:.3g}, outside [{lo:.3g}, {hi:.3g}] where "
            f"{scoring.dtype} dot products neither overflow nor underflow; evaluate with --precision float64 "
            "(precision='float64')")
    return Rows(features, terms, norms, pids, camids)


def find_positive_pairs(gallery: FeatureSet, start: int, stop: int, queries: Rows, scoring: Scoring):
    """Positive pairs between the query block and gallery rows [start, stop), with exact distances,
    and each query's junk count in those rows.

    Reads the chunk's features only when it holds a positive of some query in the block.
    """
    g_pid, g_cam = read_ids(gallery, start, stop)
    qrows, grows, junk = scoring.protocol.positive_pairs(
        queries.pids, queries.camids, g_pid, g_cam, scoring.protocol.junk_mask(g_pid)
    )
    if qrows.size == 0:
        return qrows, grows, np.empty(0, dtype=np.float64), junk
    chunk = load_rows(gallery, slice(start, stop), scoring)
    dist = kernels.pair_distances(
        queries.features, chunk.features, qrows, grows, queries.terms, chunk.terms, scoring.metric
    )
    return qrows, grows + start, dist, junk


def collect_positives(n_queries: int, *parts) -> Positives:
    qrows, gidx, dist = (np.concatenate(column) for column in list(zip(*parts))[:3])
    return Positives.from_pairs(n_queries, qrows, gidx, dist, sum(part[3] for part in parts))


_scratch: dict[int, np.ndarray] = {}  # thread id -> dot-product block buffer


def _dot_block(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b.T into a per-thread buffer reused across tasks: a fresh block of this size would cost
    page faults on every task (about as much as the GEMM itself at small D)."""
    size = a.shape[0] * b.shape[0]
    buffer = _scratch.get(threading.get_ident())
    if buffer is None or buffer.dtype != a.dtype or buffer.size < size:
        buffer = _scratch[threading.get_ident()] = np.empty(size, dtype=a.dtype)
    out = buffer[:size].reshape(a.shape[0], b.shape[0])
    np.matmul(a, b.T, out=out)
    return out


def release_scratch() -> None:
    """Drop the block buffers (the threaded scheduler's threads outlive an evaluation)."""
    _scratch.clear()


def _sub_blocks(queries: Rows, chunk: Rows):
    """(row slice, dot products) for consecutive QUERY_SUB_BLOCK-row slices of the query block.

    A task's dot products are made a few MiB at a time, so the kernel reads them from cache and the
    task's memory does not grow with the query block.
    """
    for first in range(0, queries.features.shape[0], QUERY_SUB_BLOCK):
        rows = slice(first, first + QUERY_SUB_BLOCK)
        yield rows, _dot_block(queries.features[rows], chunk.features)


def block_range(gallery: FeatureSet, start: int, stop: int, queries: Rows, scoring: Scoring) -> DistanceRange:
    """Min and max distance between the query block and gallery rows [start, stop)."""
    chunk = load_rows(gallery, slice(start, stop), scoring)
    ranges = [
        DistanceRange(*kernels.distance_range(
            dots, queries.features[rows], chunk.features, queries.terms[rows], chunk.terms, queries.norms[rows],
            chunk.norms, scoring.metric, scoring.dot_bound,
        ))
        for rows, dots in _sub_blocks(queries, chunk)
    ]
    return reduce(DistanceRange.merge, ranges)


def positives_range(positives: Positives) -> DistanceRange:
    """Positives' own (pair-computed) distances belong to the range too, so their d~ is in [0, 1]."""
    if positives.dist.size == 0:
        return DistanceRange(np.inf, -np.inf)
    return DistanceRange(float(positives.dist.min()), float(positives.dist.max()))


def score_chunk(gallery: FeatureSet, start: int, stop: int, queries: Rows, positives: Positives,
                scoring: Scoring, norm: Normalisation, before: RankState | None) -> RankState:
    """``before`` (if any) plus the slot counts (and GOM threshold histograms) of the negatives in
    gallery rows [start, stop)."""
    gom = scoring.gom
    n_bins = gom.bins if gom else 1
    if before is None:
        state = RankState.empty(positives.dist.shape[0], len(queries.pids), n_bins + 2 if gom else 0,
                                clipping=gom is not None and gom.norm == "fixed")
    else:  # a copy, so a task never changes its input (Dask may hold or re-use it)
        state = before.copy()
    chunk = load_rows(gallery, slice(start, stop), scoring)
    junk = scoring.protocol.junk_mask(chunk.pids)
    for rows, dots in _sub_blocks(queries, chunk):
        kernels.score_block(
            dots, queries.features[rows], chunk.features, queries.terms[rows], chunk.terms, queries.norms[rows],
            chunk.norms, scoring.metric, scoring.dot_bound, scoring.bin_bound, queries.pids[rows], chunk.pids, junk,
            start, positives.offsets[rows.start:rows.stop + 1], positives.dist, positives.gidx, state.neg_slots,
            gom is not None, norm.mode, norm.lo, norm.span, n_bins, state.neg_hist[rows], state.clipped[rows],
            state.pair_range[rows],
        )
    return state


def _merge_all(merge, *states):
    return reduce(merge, states)


def tree_reduce(items: list, merge, fan_in: int = MERGE_FAN_IN):
    """Merge delayed states ``fan_in`` at a time until one is left (depth log_fan_in(len))."""
    while len(items) > 1:
        items = [delayed(_merge_all)(merge, *items[i:i + fan_in]) for i in range(0, len(items), fan_in)]
    return items[0]


def normalisation(options: GomOptions | None, dist_range) -> Normalisation:
    """d~'s kernel arguments: identity (no GOM, ``none``), fixed LO:HI, or the global range."""
    if options is None or options.norm == "none":
        return Normalisation.identity()
    if options.norm == "fixed":
        return Normalisation.affine(options.lo, options.hi)
    return Normalisation.affine(dist_range.lo, dist_range.hi)


def query_blocks(plan: Plan, queries: np.ndarray | None, n_query: int) -> list:
    """Row selections of the query blocks: slices of all queries, or blocks of the listed ones."""
    if queries is None:
        return [slice(a, b) for a, b in plan.query_ranges(n_query)]
    return [queries[a:b] for a, b in plan.query_ranges(queries.shape[0])]


def block_size(rows) -> int:
    """Queries in a row selection of ``query_blocks``."""
    return rows.stop - rows.start if isinstance(rows, slice) else len(rows)


def block_sizes(plan: Plan, n_query: int) -> list[int]:
    """Queries in each block of all ``n_query`` queries (the blocks of ``positives_pass``)."""
    return [b - a for a, b in plan.query_ranges(n_query)]


def load_queries(query: FeatureSet, rows, scoring: Scoring, pass_name: str):
    """Delayed Rows of a query block, read as part of pass ``pass_name``."""
    return delayed(load_rows)(query, rows, scoring,
                              dask_key_name=work_key(pass_name, read_work(rows_bytes(query, block_size(rows)))))


def positives_pass(query: FeatureSet, gallery: FeatureSet, plan: Plan, scoring: Scoring, start: int = 0):
    """Per query block of all queries: (delayed Rows, delayed Positives in gallery rows [start, end))."""
    chunks = plan.gallery_ranges(len(gallery), start)
    blocks = []
    for rows in query_blocks(plan, None, len(query)):
        queries = load_queries(query, rows, scoring, "positives")
        pairs = [delayed(find_positive_pairs)(gallery, a, b, queries, scoring,
                                              dask_key_name=work_key("positives", positives_work(gallery, a, b)))
                 for a, b in chunks]
        blocks.append((queries, delayed(collect_positives)(block_size(rows), *pairs)))
    return blocks


def range_pass(query: FeatureSet, gallery: FeatureSet, plan: Plan, scoring: Scoring, blocks, start: int = 0):
    """Delayed DistanceRange of every pair of the blocks' queries (``positives_pass`` of ``query``)
    with gallery rows [start, end), their positives' distances included."""
    chunks = plan.gallery_ranges(len(gallery), start)
    sizes = block_sizes(plan, len(query))
    ranges = [delayed(block_range)(gallery, a, b, queries, scoring,
                                   dask_key_name=work_key("range", distance_work(gallery, n_queries, a, b)))
              for n_queries, (queries, _) in zip(sizes, blocks) for a, b in chunks]
    ranges += [delayed(positives_range)(positives) for _, positives in blocks]
    return tree_reduce(ranges, DistanceRange.merge)


def scoring_pass(gallery: FeatureSet, plan: Plan, scoring: Scoring, n_queries: int, queries, positives, norm,
                 start: int, stop: int, pass_name: str = "scoring"):
    """Delayed RankState of one block of ``n_queries`` queries over gallery rows [start, stop): a
    chain of chunks per worker, the chains' states merged at the end."""
    chunks = plan.gallery_ranges(stop, start)
    chains = [None] * max(1, min(plan.workers, len(chunks)))
    for i, (a, b) in enumerate(chunks):
        chains[i % len(chains)] = delayed(score_chunk)(
            gallery, a, b, queries, positives, scoring, norm, chains[i % len(chains)],
            dask_key_name=work_key(pass_name, distance_work(gallery, n_queries, a, b)),
        )
    return tree_reduce(chains, RankState.merge)


def scoring_work(query: FeatureSet, gallery: FeatureSet, plan: Plan, n_queries: int, start: int, stop: int) -> int:
    """The work of scoring ``n_queries`` queries over gallery rows [start, stop): ``scoring_pass`` and
    ``load_queries`` of each query block."""
    return sum(read_work(rows_bytes(query, b - a)) + distance_work(gallery, b - a, start, stop)
               for a, b in plan.query_ranges(n_queries))


def build(query: FeatureSet, gallery: FeatureSet, plan: Plan, scoring: Scoring):
    """The full evaluation, one delayed (Positives per query block, RankState per query block,
    global DistanceRange or None).

    With ``minmax`` GOM normalisation the range is a first pass over all pairs; every scoring task
    waits for it.
    """
    blocks = positives_pass(query, gallery, plan, scoring)
    minmax = scoring.gom is not None and scoring.gom.norm == "minmax"
    dist_range = range_pass(query, gallery, plan, scoring, blocks) if minmax else None
    norm = delayed(normalisation)(scoring.gom, dist_range)
    sizes = block_sizes(plan, len(query))
    states = [scoring_pass(gallery, plan, scoring, n_queries, queries, positives, norm, 0, len(gallery))
              for n_queries, (queries, positives) in zip(sizes, blocks)]
    return delayed(tuple)([[positives for _, positives in blocks], states, dist_range])


def positives_work(gallery: FeatureSet, start: int, stop: int) -> int:
    """A positives task's work: reading gallery rows [start, stop), features included (read whenever
    the rows hold a positive of the query block, the common case)."""
    return read_work(rows_bytes(gallery, stop - start))


def distance_work(gallery: FeatureSet, n_queries: int, start: int, stop: int) -> int:
    """A range or scoring task's work: reading gallery rows [start, stop) and every pair with ``n_queries``."""
    return read_work(rows_bytes(gallery, stop - start)) + pairs_work(n_queries, stop - start, gallery.dim)


def rows_bytes(fs: FeatureSet, n_rows: int, features: bool = True) -> int:
    """Bytes of ``n_rows`` rows of a set: ids, and features unless ``features`` is False."""
    row = fs.pids.dtype.itemsize + fs.camids.dtype.itemsize
    return n_rows * (row + (fs.dim * fs.features.dtype.itemsize if features else 0))


def positives_pass_bytes(gallery: FeatureSet, plan: Plan, positives: Positives, start: int, stop: int) -> int:
    """What one query block's positives pass over gallery rows [start, stop) read: every row's ids,
    and the features of the chunks holding one of the block's positives."""
    chunks = np.unique((positives.gidx[positives.gidx >= start] - start) // plan.gallery_chunk)
    feature_rows = int(np.minimum(plan.gallery_chunk, stop - start - chunks * plan.gallery_chunk).sum())
    return rows_bytes(gallery, stop - start, features=False) + rows_bytes(gallery, feature_rows)
