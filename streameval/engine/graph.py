"""The Dask graph: per-(query block, gallery chunk) tasks and a tree reduction per query block.

Three passes over the extended gallery (the stored gallery, then the queries' copies when the
protocol includes them: ``gallery_parts``), each built per query block (``Plan``)::

    load_rows(queries) ─┬─> find_positive_pairs(chunk 0..C) ─> collect_positives     positives pass
                        ├─> [minmax GOM only] range_chunk(chunk 0..C) ─> tree of min/max  range pass
                        │     in W chains
                        └─> score_chunk(chunk 0..C, positives, normalisation)            scoring pass
                              in W chains (chunk w, w+W, ...) ─> tree of StatState.merge

A scoring task asks the run's block source (``sources``: a GEMM of the features, a distance store's
values) for one block of values per query sub-block and runs every requested statistic on it
(``statistics``); trials are bits of each row (``Metadata``), counted in the same pass.
``build`` chains the passes over the whole gallery (one graph: the scoring tasks wait for the
positives and, with ``minmax``, for the per-trial ranges).  Incremental updates (``run/incremental.py``) run the
passes over the new rows and over the old rows of a subset of the queries.

Tasks receive the store's arrays (not data) and read their own gallery rows, so nothing but small
states travels between workers; a query block and its positives are computed once and shared.
A task whose arguments include the package's plain values (sets, parts, Scoring, Metadata) is made
with ``task``, which keeps Dask from searching them for Delayed values.
Tasks that read or score rows are named by ``progress.work_key``: their pass and their work
(``positives_work``, ``distance_work``), so the progress bar advances with the work done; merges
carry none.
A scoring task's state has a slot per positive of its query block, so the scoring pass runs as one
chain of tasks per worker (each task adds its chunk to a copy of its predecessor's state): only
O(workers) states are alive at once, however many chunks the gallery has.
"""

from __future__ import annotations

from dataclasses import dataclass, field, is_dataclass
from functools import reduce

import numpy as np
from dask import delayed

from . import kernels, scratch
from .metadata import Metadata
from .plan import GALLERY_SUB_BLOCK, QUERY_SUB_BLOCK, Plan
from .ranges import DistanceRange, normalisations
from ..core.progress import PAIR_OVERHEAD, RANGE_PAIR_OVERHEAD, pairs_work, read_work, work_key
from ..protocols.rules import Rules, camera_codes, camera_table
from .state import Positives
from .statistic import StatState
from .block import NOT_SCREENED, Block, dropped_columns, fill_distances
from ..store import FeatureSet, read_ids, read_rows

MERGE_FAN_IN = 8


def task(fn, *args, nout=None, **options):
    """``delayed(fn, nout=nout)(*args, **options)``, with the arguments that are plain values of this
    package (dataclass instances, and tuples of them: sets, parts, Scoring, Metadata, sources)
    bound into the task's function.  Dask looks for Delayed values inside every argument of a call,
    through dataclasses, lists and dicts: a FeatureSet's zarr arrays alone are ~4,000 objects, and
    that search was ~40% of a small evaluation.  Such values never hold a Delayed: Delayed
    arguments (and lists of them) are given to Dask as before."""
    bound = {i: arg for i, arg in enumerate(args) if _plain(arg)}
    given = [arg for i, arg in enumerate(args) if i not in bound]
    return delayed(Bound(fn, bound) if bound else fn, nout=nout)(*given, **options)


def _plain(arg) -> bool:
    """A dataclass instance, or a non-empty tuple of them."""
    if isinstance(arg, tuple):
        return len(arg) > 0 and all(_plain(item) for item in arg)
    return is_dataclass(arg) and not isinstance(arg, type)


class Bound:
    """``fn`` with the arguments at some positions bound (``task``); called with the others, in order."""

    def __init__(self, fn, bound: dict):
        self.fn, self.bound, self.__name__ = fn, bound, fn.__name__

    def __call__(self, *given):
        rest = iter(given)
        return self.fn(*[self.bound[i] if i in self.bound else next(rest) for i in range(len(self.bound) + len(given))])


@dataclass(frozen=True)
class Scoring:
    """What every task needs to score pairs: working dtype, the source of the distances and their
    error windows (``sources``), the protocol's rules, the distance scale the statistics read
    (``ranges.normalisations``; ``minmax`` adds the range pass) and the statistics the scoring pass counts."""

    dtype: np.dtype
    source: object  # sources.FeatureSource, StoredSource
    rules: Rules
    scale: object  # .norm ("none", "fixed" or "minmax"), .lo, .hi; None: distances as they are
    statistics: tuple

    @property
    def n_trials(self) -> int:
        return self.rules.n_trials

    @property
    def metric(self) -> int:
        """The kernels' metric code of the source's values."""
        return self.source.metric


@dataclass(frozen=True)
class PassContext:
    """What a scoring task's statistics share: per trial distance normalisations, the metadata, and what
    statistics comparing pairs with every positive of the run take from them (``pooled``)."""

    norms: tuple
    meta: Metadata
    pooled: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Rows:
    """Rows of a set, read and prepared for scoring."""

    features: np.ndarray  # working dtype
    terms: np.ndarray  # float64, kernels.row_terms
    norms: np.ndarray  # float64 |x|, for the GEMM error windows
    pids: np.ndarray
    camids: np.ndarray
    index: np.ndarray  # row numbers: query rows, or extended gallery rows
    bits: np.ndarray  # uint64 trial membership

    def sub(self, rows: slice) -> "Rows":
        """These rows' ``rows`` (views)."""
        return Rows(*(getattr(self, name)[rows] for name in self.__dataclass_fields__))


@dataclass(frozen=True)
class Part:
    """A run of extended gallery rows: rows [0, len) of ``fs`` are extended rows [offset, offset + len)."""

    fs: FeatureSet
    offset: int


def gallery_parts(query: FeatureSet, gallery: FeatureSet, includes_queries: bool) -> tuple:
    """The extended gallery: the stored gallery, then the queries' copies when they are included."""
    parts = (Part(gallery, 0),)
    return parts + (Part(query, len(gallery)),) if includes_queries else parts


def gallery_chunks(plan: Plan, parts: tuple, start: int = 0, reads: str = "gallery") -> list:
    """(part, first, stop) chunks of the extended gallery rows [start, end), in part-local rows:
    ``plan.gallery_ranges``, or with ``reads`` "scoring" the ``plan.read_ranges`` of the passes that
    score a query block, with "positives" the positives pass's ``plan.positives_ranges``."""
    ranges = {"gallery": plan.gallery_ranges, "scoring": plan.read_ranges, "positives": plan.positives_ranges}[reads]
    chunks = []
    for part in parts:
        first = max(start - part.offset, 0)
        chunks += [(part, a, b) for a, b in ranges(len(part.fs), first) if a < b]
    return chunks


def extended_rows(parts: tuple) -> int:
    return parts[-1].offset + len(parts[-1].fs)


def load_rows(fs: FeatureSet, rows, scoring: Scoring, meta: Metadata, part: Part | None = None) -> Rows:
    """Rows of a set (a slice or an array of row numbers): queries, or with ``part`` gallery rows."""
    features, pids, camids = read_rows(fs, rows, scoring.dtype)
    terms, norms = scoring.source.prepare(fs, rows, features)
    index = np.arange(rows.start, rows.stop, dtype=np.int64) if isinstance(rows, slice) else np.asarray(rows, np.int64)
    if part is None:
        index = index % fs.period if fs.period else index  # a stack of query variants: the clean row's draws
        drawn, allowed = meta.q_bits, scoring.rules.protocol.query_cameras
    else:
        index = index + part.offset
        drawn, allowed = meta.g_bits, scoring.rules.protocol.gallery_cameras
    bits = drawn[index] if drawn is not None else scoring.rules.camera_bits(camids, allowed)
    return Rows(features, terms, norms, pids, camids, index, bits)


def find_positive_pairs(part: Part, start: int, stop: int, queries: Rows, scoring: Scoring, meta: Metadata,
                        own_start):
    """Positive pairs between the query block and the part's rows [start, stop), with exact
    distances and trial bits, and each query's excluded rows per trial there.

    Reads the chunk's values only when it holds a positive of some query in the block.
    """
    g_pid, g_cam = read_ids(part.fs, start, stop)
    g_index = np.arange(start, stop, dtype=np.int64) + part.offset
    g_bits = meta.g_bits[g_index] if meta.g_bits is not None else scoring.rules.camera_bits(
        g_cam, scoring.rules.protocol.gallery_cameras)
    qrows, grows, bits, junk = scoring.rules.positive_pairs(
        queries.pids, queries.camids, queries.index, queries.bits, g_pid, g_cam, g_bits, part.offset + start, own_start)
    if qrows.size == 0:
        return qrows, grows, np.empty(0, dtype=np.float64), bits, junk
    # an identity at a time (each query row read from cache for all its gallery rows): the pairs come
    # by (gallery row, query row), so a stable sort by pid orders them by (pid, gallery row, query
    # row), as a lexsort of the three keys would at five times the cost
    order = np.argsort(g_pid[grows], kind="stable")
    dist = np.empty(qrows.shape[0], dtype=np.float64)
    dist[order] = scoring.source.pair_distances(part, start, stop, queries, qrows[order], grows[order])
    return qrows, grows + part.offset + start, dist, bits, junk


def collect_positives(n_queries: int, n_trials: int, *parts) -> Positives:
    """The query block's Positives from its positives tasks' (qrows, gidx, dist, bits, junk)."""
    junk = sum((part[4] for part in parts), np.zeros((n_queries, n_trials), dtype=np.int64))
    return Positives.from_parts(n_queries, [part[:4] for part in parts], junk)


def _in_trial(bits: np.ndarray, t: int):
    """Positions of the rows in trial t (a slice when all are)."""
    inside = ((bits >> np.uint64(t)) & np.uint64(1)).astype(bool)
    return slice(None) if inside.all() else np.flatnonzero(inside)


def _with_range(ranges: list, queries: Rows, rows: slice, chunk: Rows, dots: np.ndarray, scoring: Scoring) -> list:
    """``ranges`` merged with the per-trial range of the sub-block's pairs (values ``dots``)."""
    out = []
    for t, known in enumerate(ranges):
        q, g = _in_trial(queries.bits[rows], t), _in_trial(chunk.bits, t)
        whole = isinstance(q, slice) and isinstance(g, slice)
        trial_dots = dots if whole else np.ascontiguousarray(dots[q][:, g])
        found = kernels.distance_range(
            trial_dots, scoring.source.exact(queries.features[rows][q], trial_dots), chunk.features[g],
            queries.terms[rows][q], chunk.terms[g], queries.norms[rows][q], chunk.norms[g], scoring.metric,
            scoring.source.c_dot)
        out.append(DistanceRange.merge(known, DistanceRange(*found)))
    return out


def range_chunk(part: Part, start: int, stop: int, queries: Rows, scoring: Scoring, meta: Metadata,
                before: list | None) -> list:
    """``before`` (if any) merged with, per trial, the min and max distance between the block's
    queries and the part's rows [start, stop)."""
    ranges = before or [DistanceRange(np.inf, -np.inf)] * scoring.n_trials
    chunk = load_rows(part.fs, slice(start, stop), scoring, meta, part)
    for rows, cols in sub_blocks(len(queries.pids), stop - start):
        dots = scoring.source.block(part, start, stop, queries, chunk, rows, cols)
        ranges = _with_range(ranges, queries, rows, chunk.sub(cols), dots, scoring)
    return ranges


def positives_range(positives: Positives, n_trials: int) -> list:
    """Per trial, the positives' own (pair-computed) distances belong to the range too, so their
    d~ is in [0, 1]."""
    ranges = []
    for t in range(n_trials):
        dist = positives.dist[((positives.bits >> np.uint64(t)) & np.uint64(1)).astype(bool)]
        ranges.append(DistanceRange(float(dist.min()), float(dist.max())) if dist.size else DistanceRange(np.inf, -np.inf))
    return ranges


def pooled(statistics: tuple, *blocks: Positives) -> dict:
    """Statistic name -> what it takes from every positive of the run (``pool``), for the
    statistics that compare each pair with all of them (``pools``: the AUC of verification)."""
    everyone = Positives.concat(list(blocks))
    return {stat.name: stat.pool(everyone) for stat in statistics if getattr(stat, "pools", False)}


def merge_ranges(a: list, b: list) -> list:
    return [DistanceRange.merge(x, y) for x, y in zip(a, b)]


def prepare(statistics: tuple, meta: Metadata, queries: Rows, positives: Positives) -> tuple:
    """Each statistic's per-query-block data (``Statistic.prepare``)."""
    return tuple(stat.prepare(meta, queries, positives) for stat in statistics)


def score_chunk(part: Part, start: int, stop: int, queries: Rows, positives: Positives, aux: tuple,
                scoring: Scoring, run: PassContext, before: StatState | None) -> StatState:
    """``before`` (if any) plus every statistic's counts over the part's rows [start, stop): one
    distance block per query sub-block, handed to each statistic's update."""
    if before is None:
        state = StatState.empty(scoring.statistics, len(queries.pids), positives.dist.shape[0])
    else:  # a copy, so a task never changes its input (Dask may hold or re-use it)
        state = before.copy()
    for rows, blk in _blocks(part, start, stop, queries, positives, scoring, run.meta):
        _update(scoring.statistics, aux, blk, rows, state, run)
    return state


NO_DISTANCES = np.zeros((0, 0))  # Block.dist where no statistic reads the filled distances


def _blocks(part: Part, start: int, stop: int, queries: Rows, positives: Positives, scoring: Scoring, meta):
    """(query row slice, Block) per QUERY_SUB_BLOCK query rows and GALLERY_SUB_BLOCK rows of the
    part's rows [start, stop): a task's values are made a few MiB at a time, so the kernels read
    them from cache and the task's memory grows with neither the query block nor the rows it reads
    (a task reads whole store chunks where it can: reading a part of one decodes all of it).
    A source that ``screens`` (a device's) makes the values of ``call_rows`` query rows in one
    call (``_screened``: at most ``sources.DEVICE_CALL_PAIRS`` values, in the thread's buffer) and
    the sub-blocks are rows of them; another source's call is every query row of the task."""
    chunk = load_rows(part.fs, slice(start, stop), scoring, meta, part)
    filled = any(stat.reads_distances for stat in scoring.statistics)
    source = scoring.source
    n_queries = len(queries.pids)
    q_codes, q_cix = camera_codes(queries.camids)  # the block's cameras, for all its sub-blocks
    for cols in _slices(stop - start, GALLERY_SUB_BLOCK):
        gallery = chunk.sub(cols)
        g_dropped = _dropped(scoring.rules, q_codes, gallery)

        def block(rows: slice, dots: np.ndarray, hits: np.ndarray = NOT_SCREENED, dist: np.ndarray = NO_DISTANCES):
            return Block(
                dots, hits, dist, source.exact(queries.features[rows], dots), gallery.features,
                queries.terms[rows], gallery.terms, queries.norms[rows], gallery.norms, source.metric, source.c_dot,
                source.c_refine, queries.pids[rows], gallery.pids, q_cix[rows], g_dropped, queries.bits[rows],
                gallery.bits, part.offset + start + cols.start, positives.offsets[rows.start:rows.stop + 1],
                positives.dist, positives.gidx, positives.bits)

        call_rows = source.call_rows(cols.stop - cols.start) if source.screens else max(n_queries, 1)
        for call in _slices(n_queries, call_rows):
            screened = _screened(block, scoring.statistics, source, queries, chunk, call, cols) if source.screens else None
            for rows in _slices(call.stop, QUERY_SUB_BLOCK, call.start):
                if screened is None:
                    dots, hits = source.block(part, start, stop, queries, chunk, rows, cols), NOT_SCREENED
                else:
                    own = slice(rows.start - call.start, rows.stop - call.start)
                    dots, hits = screened.dots[own], screened.hits[own]
                dist = NO_DISTANCES
                if filled:
                    dist = scratch.buffer("distances", np.float64, dots.shape)
                    fill_distances(dots, queries.terms[rows], gallery.terms, scoring.metric, dist)
                yield rows, block(rows, dots, hits, dist)


def _screened(block, statistics: tuple, source, queries: Rows, chunk: Rows, rows: slice, cols: slice):
    """The Block of the query rows ``rows`` against the gallery rows ``cols``, its values made by a
    source that screens: only those within the statistics' ``limits`` where every statistic
    declares some."""
    whole = block(rows, source.host_dots(queries, chunk, rows, cols))
    return source.fill(whole, queries, chunk, rows, cols, _limits(statistics, whole))


def _limits(statistics: tuple, blk):
    """How far from each query row of ``blk`` the statistics read (``Statistic.limits``): the
    farthest of theirs; None where one of them reads every pair."""
    found = [stat.limits(blk) for stat in statistics]
    return None if any(limits is None for limits in found) else reduce(np.maximum, found)


def sub_blocks(n_queries: int, n_rows: int):
    """(query rows, gallery rows) slices of a task's sub-blocks: QUERY_SUB_BLOCK x GALLERY_SUB_BLOCK
    at most, the queries inner, so a sub-block's gallery rows stay in cache while the queries pass."""
    for cols in _slices(n_rows, GALLERY_SUB_BLOCK):
        for rows in _slices(n_queries, QUERY_SUB_BLOCK):
            yield rows, cols


def _slices(n: int, step: int, start: int = 0):
    """slice(a, b) over [start, n) in steps of ``step``."""
    for first in range(start, n, step):
        yield slice(first, min(first + step, n))


def _dropped(rules: Rules, q_codes: np.ndarray, chunk: Rows) -> np.ndarray:
    """Block.g_dropped of a gallery sub-block for the query block's cameras ``q_codes``: taken
    once for all the query sub-blocks (per sub-block, the cameras' sort and the columns took ~100
    us, 2% of the bench's closed-set scoring pass)."""
    g_codes, g_cix = camera_codes(chunk.camids)
    table = camera_table(rules.protocol.x_any, q_codes, g_codes)
    return dropped_columns(rules.junk_mask(chunk.pids), g_cix, table)


def _update(statistics: tuple, aux: tuple, blk, rows: slice, state: StatState, run: PassContext) -> None:
    """Every statistic's update on one Block (its query-axis arrays viewed at the block's rows)."""
    for stat, extra in zip(statistics, aux):
        views = {name: arr[rows] if stat.fields[name].axis == "query" else arr
                 for name, arr in state.fields(stat).items()}
        stat.update(blk, rows, views, extra, run)


def _merge_all(merge, *states):
    return reduce(merge, states)


def tree_reduce(items: list, merge, fan_in: int = MERGE_FAN_IN):
    """Merge delayed states ``fan_in`` at a time until one is left (depth log_fan_in(len))."""
    while len(items) > 1:
        items = [delayed(_merge_all)(merge, *items[i:i + fan_in]) for i in range(0, len(items), fan_in)]
    return items[0]


def query_blocks(plan: Plan, queries: np.ndarray | None, n_query: int) -> list:
    """Row selections of the query blocks: slices of all queries, or blocks of the listed ones."""
    if queries is None:
        return [slice(a, b) for a, b in plan.query_ranges(n_query)]
    return [queries[a:b] for a, b in plan.query_ranges(queries.shape[0])]


def block_size(rows) -> int:
    """Queries in a row selection of ``query_blocks``."""
    return rows.stop - rows.start if isinstance(rows, slice) else len(rows)


def load_queries(query: FeatureSet, rows, scoring: Scoring, meta, pass_name: str):
    """Delayed Rows of a query block, read as part of pass ``pass_name``."""
    return task(load_rows, query, rows, scoring, meta,
                dask_key_name=work_key(pass_name, read_work(rows_bytes(query, block_size(rows)))))


def positives_pass(query: FeatureSet, parts: tuple, plan: Plan, scoring: Scoring, meta, start: int = 0):
    """Per query block of all queries: (delayed Rows, delayed Positives in extended rows [start, end))."""
    chunks = gallery_chunks(plan, parts, start, reads="positives")
    own_start = parts[1].offset if len(parts) > 1 else None
    blocks = []
    for rows in query_blocks(plan, None, len(query)):
        queries = load_queries(query, rows, scoring, meta, "positives")
        pairs = [task(find_positive_pairs, part, a, b, queries, scoring, meta, own_start,
                      dask_key_name=work_key("positives", positives_work(part.fs, a, b)))
                 for part, a, b in chunks]
        blocks.append((queries, delayed(collect_positives)(block_size(rows), scoring.n_trials, *pairs)))
    return blocks


def range_pass(parts: tuple, plan: Plan, scoring: Scoring, meta, blocks, sizes: list, start: int = 0):
    """The range pass over extended rows [start, end): per trial, the delayed DistanceRange of every
    pair of the blocks' queries (``positives_pass``), their positives' distances included.  Chains
    of chunks per worker, as the scoring pass: O(workers) ranges alive, not one per chunk."""
    chunks = gallery_chunks(plan, parts, start, reads="scoring")
    ends = []
    for n_queries, (queries, _) in zip(sizes, blocks):
        chains = [None] * max(1, min(plan.workers, len(chunks)))
        for i, (part, a, b) in enumerate(chunks):
            chains[i % len(chains)] = task(
                range_chunk, part, a, b, queries, scoring, meta, chains[i % len(chains)],
                dask_key_name=work_key("range", distance_work(part.fs, n_queries, a, b, RANGE_PAIR_OVERHEAD)))
        ends += chains
    return tree_reduce(ends + [delayed(positives_range)(positives, scoring.n_trials) for _, positives in blocks],
                       merge_ranges)


def scoring_pass(parts: tuple, plan: Plan, scoring: Scoring, n_queries: int, queries, positives, run, meta,
                 start: int, stop: int, pass_name: str = "scoring"):
    """Delayed StatState of one block of ``n_queries`` queries over extended rows [start, stop): a
    chain of chunks per worker, the chains' states merged at the end."""
    chunks = [(part, a, min(b, stop - part.offset))
              for part, a, b in gallery_chunks(plan, parts, start, reads="scoring")
              if part.offset + a < stop]
    aux = task(prepare, scoring.statistics, meta, queries, positives)
    chains = [None] * max(1, min(plan.workers, len(chunks)))
    for i, (part, a, b) in enumerate(chunks):
        chains[i % len(chains)] = task(
            score_chunk, part, a, b, queries, positives, aux, scoring, run, chains[i % len(chains)],
            dask_key_name=work_key(pass_name, distance_work(part.fs, n_queries, a, b)),
        )
    return tree_reduce(chains, StatState.merge)


def scoring_work(query: FeatureSet, parts: tuple, plan: Plan, n_queries: int, start: int, stop: int) -> int:
    """The work of scoring ``n_queries`` queries over extended rows [start, stop): ``scoring_pass``
    and ``load_queries`` of each query block."""
    return sum(read_work(rows_bytes(query, b - a)) + distance_work(parts[0].fs, b - a, start, stop)
               for a, b in plan.query_ranges(n_queries))


def positives_pass_work(query: FeatureSet, parts: tuple, plan: Plan, start: int = 0) -> int:
    """The work of ``positives_pass`` over extended rows [start, end): each query block read, and
    every chunk's positives task."""
    chunk_work = sum(positives_work(part.fs, a, b)
                     for part, a, b in gallery_chunks(plan, parts, start, reads="positives"))
    return sum(read_work(rows_bytes(query, b - a)) + chunk_work for a, b in plan.query_ranges(len(query)))


def build(query: FeatureSet, parts: tuple, plan: Plan, scoring: Scoring, meta: Metadata):
    """The full evaluation, one delayed (Positives per query block, StatState per query block, per
    trial DistanceRange or None).

    With ``minmax`` GOM normalisation the ranges are a first pass over all pairs; every scoring
    task waits for them.
    """
    blocks = positives_pass(query, parts, plan, scoring, meta)
    sizes = [block_size(rows) for rows in query_blocks(plan, None, len(query))]
    minmax = scoring.scale is not None and scoring.scale.norm == "minmax"
    dist_ranges = range_pass(parts, plan, scoring, meta, blocks, sizes) if minmax else None
    pools = any(getattr(stat, "pools", False) for stat in scoring.statistics)
    everyone = delayed(pooled)(scoring.statistics, *[positives for _, positives in blocks]) if pools else {}
    run = delayed(PassContext)(delayed(normalisations)(scoring.scale, dist_ranges, scoring.n_trials), meta, everyone)
    end = extended_rows(parts)
    states = [scoring_pass(parts, plan, scoring, n_queries, queries, positives, run, meta, 0, end)
              for n_queries, (queries, positives) in zip(sizes, blocks)]
    return delayed(tuple)([[positives for _, positives in blocks], states, dist_ranges])


def positives_work(fs: FeatureSet, start: int, stop: int) -> int:
    """A positives task's work: reading rows [start, stop), features included (read whenever the
    rows hold a positive of the query block, the common case)."""
    return read_work(rows_bytes(fs, stop - start))


def distance_work(fs: FeatureSet, n_queries: int, start: int, stop: int, overhead: int = PAIR_OVERHEAD) -> int:
    """A scoring task's work (a range task's with ``RANGE_PAIR_OVERHEAD``): reading rows [start, stop)
    and every pair with ``n_queries``."""
    return read_work(rows_bytes(fs, stop - start)) + pairs_work(n_queries, stop - start, fs.dim, overhead)


def rows_bytes(fs: FeatureSet, n_rows: int, features: bool = True) -> int:
    """Bytes of ``n_rows`` rows of a set: ids, and features unless ``features`` is False."""
    row = fs.pids.dtype.itemsize + fs.camids.dtype.itemsize
    return n_rows * (row + (fs.value_bytes if features else 0))


def positives_pass_bytes(plan: Plan, parts: tuple, positives: Positives, start: int, stop: int) -> int:
    """What one query block's positives pass over extended rows [start, stop) read: every row's
    ids, and the features of the chunks holding one of the block's positives."""
    fs = parts[0].fs
    step = plan.positives_rows
    held = np.zeros(-(-(stop - start) // step), dtype=bool)  # a flag a chunk: no sort of every positive
    held[(positives.gidx[positives.gidx >= start] - start) // step] = True
    chunks = np.flatnonzero(held)
    feature_rows = int(np.minimum(step, stop - start - chunks * step).sum())
    return rows_bytes(fs, stop - start, features=False) + rows_bytes(fs, feature_rows)
