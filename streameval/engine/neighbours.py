"""The kNN pass: every row of a union of sets against every row of it (re-ranking's U x U, query
expansion's neighbours), keeping each row's exact top-k list and its exact farthest distance.

Rows of U are numbered through the sets in order (queries 0..nq-1, then gallery nq..N-1).  A list
holds the k smallest keys (canonical distance, U row) of its row, the row itself included at
distance 0 (its canonical value is forced to 0, and a cosine distance rounded below 0 counts as 0:
an exact duplicate at distance 0 and a lower row number comes first).  ``farthest`` is the largest canonical distance over all of U.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numba as nb
import numpy as np
from dask import delayed

from . import graph, kernels, scratch, sources
from .block import compact, mask
from ..core.progress import work_key
from ..store import read_features, read_rows


@dataclass(frozen=True)
class Neighbours:
    """Each U row's exact top-k: ``index`` (N, k) int64 U rows and ``dist`` (N, k) float64 canonical
    distances, ascending by (distance, row); ``farthest`` (N,) float64; ``metric`` the engine metric
    of the distances; ``refined``: pairs whose order the fast distances left open, settled exactly."""

    index: np.ndarray
    dist: np.ndarray
    farthest: np.ndarray
    metric: str
    refined: int = 0

    @property
    def k(self) -> int:
        return self.index.shape[1]


def neighbour_pass(sets: tuple, k: int, metric: str, runner, dtype) -> Neighbours:
    """Each U row's exact top-``k`` (all of U when it holds fewer rows) and farthest distance under
    ``metric`` ("cosine" or "sqeuclidean": ``nearest_update``'s windows do not depend on the distance),
    U = the rows of ``sets`` in order, GEMMs in ``dtype`` settled exactly, on ``runner``.

    The distance is symmetric, so each pair is computed once: a block of U rows meets only the
    chunks from its own first row on (``symmetric_plan``: blocks of whole chunks), and a chunk inside
    the block only the block's rows from the chunk's first on.  The block's rows get their
    neighbours among the chunk's rows, and the chunk's rows theirs among the block's rows past the
    chunk (``nearest_in_chunk``): a chunk's own lists are handed on from block to block, so a row's
    list is its block's merged with those its chunk gathered from the blocks up to its own.  What
    the chunks of a block gathered before it bounds what its own lists need settle (``limits``).
    Chains of chunks per worker, the lists merged as sorted keys."""
    if metric not in ("cosine", "sqeuclidean"):
        raise ValueError(f"the kNN pass takes cosine or sqeuclidean distances, not {metric!r}")
    source = sources.block_source(metric, sets[0].dim, dtype, runner.device)
    parts = u_parts(sets)
    k = min(k, parts[-1].offset + len(parts[-1].fs))  # a list of all of U is as long as one gets
    plan = symmetric_plan(runner.plan, sets[0].dim, np.dtype(dtype).itemsize, k)
    chunks = graph.gallery_chunks(plan, parts)
    work = 0
    blocks = []
    gathered = {}  # a chunk's first U row -> delayed lists of its rows over the blocks so far
    for part in parts:
        for a, b in plan.query_ranges(len(part.fs)):
            first, end = part.offset + a, part.offset + b
            rows = graph.task(u_rows, part, a, b, source, dtype)
            ahead = [(other, c, e) for other, c, e in chunks if other.offset + c >= first]
            earlier = [gathered[u0] for other, c, _ in ahead if (u0 := other.offset + c) < end and u0 in gathered]
            bounds = delayed(limits)(*earlier) if earlier else None
            chains = [(None, None)] * max(1, min(plan.workers, len(ahead)))
            for i, (other, c, e) in enumerate(ahead):
                u0 = other.offset + c
                lo, hi = (u0 - first, u0 - first + e - c) if u0 < end else (0, 0)  # the block's rows in the chunk
                cost = graph.distance_work(other.fs, b - a - lo, c, e)
                work += cost
                chains[i % len(chains)] = graph.task(
                    nearest_in_chunk, other, c, e, rows, source, dtype, k, *chains[i % len(chains)], gathered.get(u0),
                    bounds, lo, hi, nout=2, dask_key_name=work_key("neighbours", cost))
                gathered[u0] = chains[i % len(chains)][1]
            inside = [gathered.pop(other.offset + c) for other, c, _ in ahead if other.offset + c < end]
            own = graph.tree_reduce([lists for lists, _ in chains], merge_found)
            blocks.append(delayed(merge_found)(own, delayed(concat_found)(*inside)))
    runner.expect("neighbours", work)
    found = runner.compute(delayed(list)(blocks))
    keys = np.concatenate([keys for keys, _, _ in found])
    return Neighbours(keys[:, :, 1].astype(np.int64), np.ascontiguousarray(keys[:, :, 0]),
                      np.concatenate([far for _, far, _ in found]), metric, sum(n for _, _, n in found))


def symmetric_plan(plan, dim: int, itemsize: int, k: int):
    """The kNN pass's plan: blocks of ``block_rows`` U rows, rounded down to whole chunks (a chunk
    smaller than the block where the block is under a chunk), so a chunk lies inside a block or
    wholly past it."""
    rows = block_rows(plan, dim, itemsize, k)
    chunk = min(plan.gallery_chunk, rows)
    return replace(plan, query_block=rows // chunk * chunk, gallery_chunk=chunk)


def block_rows(plan, dim: int, itemsize: int, k: int) -> int:
    """U rows per block of the kNN pass: U is read once per block, so the larger the fewer reads.
    The plan sized a scoring task's dot products for its query block x a chunk, while a kNN task
    holds those of ``graph.QUERY_SUB_BLOCK`` rows only: the memory that frees on every worker holds
    more rows of the block instead, halved as two blocks can be held at once (the last chains of
    one, the first of the next).  A row costs its features, terms, norms, index and ids once, and
    its list and farthest distance twice per chain (``nearest_in_chunk`` copies its predecessor's)."""
    freed = plan.workers * max(0, plan.query_block - graph.QUERY_SUB_BLOCK) * plan.gallery_chunk * itemsize
    row_bytes = dim * itemsize + 40 + 2 * plan.workers * (16 * k + 8)
    return max(plan.query_block, freed // (2 * row_bytes))


def pair_block_rows(plan, dim: int, itemsize: int, n_rows: int) -> int:
    """U rows per block of ``pair_distances``: a block is a task that reads U once and holds no
    dot products, so it takes as many rows as a kNN block without lists (``block_rows``), but no
    more than a worker's share of U's ``n_rows``, so that every worker has a block."""
    return min(block_rows(plan, dim, itemsize, 0), max(plan.query_block, -(-n_rows // plan.workers)))


def u_parts(sets: tuple) -> tuple:
    """The sets as consecutive runs of U rows."""
    offsets = np.cumsum([0] + [len(fs) for fs in sets])
    return tuple(graph.Part(fs, int(offset)) for fs, offset in zip(sets, offsets))


def u_rows(part, start: int, stop: int, source, dtype) -> graph.Rows:
    """The part's rows [start, stop) read and prepared (their U rows in ``index``)."""
    features, pids, camids = read_rows(part.fs, slice(start, stop), dtype)
    terms, norms = source.prepare(part.fs, slice(start, stop), features)
    index = np.arange(start, stop, dtype=np.int64) + part.offset
    return graph.Rows(features, terms, norms, pids, camids, index, np.zeros(0, np.uint64))


def nearest_in_chunk(part, start: int, stop: int, rows: graph.Rows, source, dtype, k: int, before, handed, gathered,
                     bounds, lo: int, hi: int):
    """The lists of the block's ``rows`` (``before``, or empty ones) and of the part's rows [start,
    stop) (``gathered``, or empty ones) with the pairs between them added: the block's rows from
    ``lo`` on, those in [lo, hi) (the chunk's own rows: their pairs both ways round in one GEMM) to
    the block's lists only, which need not settle what ``bounds`` (``limits``, or None) rules out.
    Lists: (keys (n, k, 2), farthest (n,), pairs settled).

    ``handed``, the chunk lists of the task before in the chain, is not read: taking it makes Dask
    take them out of that task's result at once, which frees its block lists; the block that reads
    them runs much later, and would hold the whole result until then."""
    keys, far, settled = empty_lists(len(rows.index), k) if before is None else copied(before)
    cap, floor = (np.full(len(rows.index), np.inf), np.full(len(rows.index), -np.inf)) if bounds is None else bounds
    chunk = u_rows(part, start, stop, source, dtype)
    own, own_far, own_settled = empty_lists(stop - start, k) if gathered is None else copied(gathered)
    heap, dist, near, candidates = np.empty(k), np.empty(stop - start), np.empty(stop - start), \
        np.empty(stop - start, dtype=np.int64)
    for first, last in ((lo, hi), (hi, len(rows.index))):
        for a in range(first, last, graph.QUERY_SUB_BLOCK):
            sub = slice(a, min(a + graph.QUERY_SUB_BLOCK, last))
            dots = source.block(part, start, stop, rows, chunk, sub)
            terms = (rows.features[sub], chunk.features, rows.terms[sub], chunk.terms, rows.norms[sub], chunk.norms,
                     rows.index[sub], chunk.index, source.metric, source.c_dot, source.c_refine)
            settled += nearest_update(dots, *terms, keys[sub], far[sub], cap[sub], floor[sub], heap, dist, near,
                                      candidates)
            if first == hi:
                own_settled += nearest_columns(dots, *terms, own, own_far, heap, *column_buffers(dots.shape))
    return (keys, far, settled), (own, own_far, own_settled)


def empty_lists(n: int, k: int) -> tuple:
    return np.full((n, k, 2), np.inf), np.full(n, -np.inf), 0


def copied(lists: tuple) -> tuple:
    """A copy of lists (a task never changes its input: Dask may hold or re-use it)."""
    return lists[0].copy(), lists[1].copy(), lists[2]


def merge_found(a, b):
    return kernels.merge_smallest(a[0], b[0]), np.maximum(a[1], b[1]), a[2] + b[2]


def limits(*lists) -> tuple:
    """(cap, floor) of consecutive rows' lists: each row's k-th distance and farthest so far.  A
    pair above a row's cap is not among its k nearest, nor one below its floor its farthest, so
    its other lists need not settle them (ties with the cap are settled: the row decides them)."""
    return np.concatenate([x[0][:, -1, 0] for x in lists]), np.concatenate([x[1] for x in lists])


def concat_found(*lists):
    """Consecutive rows' lists as one."""
    return (np.concatenate([x[0] for x in lists]), np.concatenate([x[1] for x in lists]),
            sum(x[2] for x in lists))


@nb.njit(nogil=True, cache=True)
def nearest_update(dots, qf, gf, qa, ga, qn, gn, q_index, g_index, metric, c_dot, c_refine, keys, far, cap, floor,
                   bounds, dist, near, candidates):
    """Add a block's rows to each query row's list ``keys[i]`` (k smallest (distance, U row)) and
    exact farthest distance ``far[i]``; returns the pairs whose canonical distance was computed.
    Pairs above ``cap[i]`` or below ``floor[i]`` (``limits``: other lists of the row) are not
    settled unless they may be its farthest or among its k nearest.

    Per row, rounds on the rows the last one left open (``dist``, ``near``, ``candidates``: scratch):

    1. the fast distances, screened against the list as it stands: a row may enter it only if its
       lower bound is below the list's last distance, and be the farthest only if its upper bound
       reaches the farthest so far (on a row's first block, the block's largest fast distance less a
       window).  For cosine and squared euclidean distances a pair's window does not depend on its
       distance, so the row's widest window (at the block's largest norm), doubled against rounding,
       bounds them all: a branch-free pass that keeps the few rows near either limit;
    2. to 4. (``settle``) over those, with each pair's own window, the float64 dot products, then
       the canonical distances of the rows still open.

    A row's distance to itself is 0, and a distance rounded below 0 (cosine) counts as 0."""
    settled = 0
    k = bounds.shape[0]
    row = dist[:dots.shape[1]]
    gn_max = gn.max() if gn.shape[0] else 0.0
    for i in range(dots.shape[0]):
        widest = kernels.distance_window(0.0, qn[i], gn_max, metric, c_dot)
        fast_distances(dots[i], qa[i], ga, metric, row)
        lowest = max(far[i], floor[i])
        if lowest == -np.inf and row.shape[0]:  # the row's first block
            lowest = row.max() - widest
        n = screen(row, min(keys[i, k - 1, 0], cap[i]) + 2.0 * widest, lowest - 2.0 * widest, candidates)
        for c in range(n):
            near[c] = row[candidates[c]]
        settled += settle(qf, gf, i, candidates, near, n, qa[i], ga, qn[i], gn, q_index[i], g_index, metric, c_dot,
                          c_refine, widest, lowest, cap[i], floor[i], keys[i], far, bounds)
    return settled


COLUMN_SLAB = 64  # rows of a block screened at once for its columns' lists (``nearest_columns``)


def column_buffers(shape: tuple) -> tuple:
    """This thread's int64 and float64 scratch for ``nearest_columns`` on a block of ``shape``."""
    n_rows, n_cols = shape
    pairs = min(n_rows, COLUMN_SLAB) * n_cols
    return (scratch.buffer("column ints", np.int64, (3 * pairs + 2 * n_cols + COLUMN_SLAB + 1,)),
            scratch.buffer("column floats", np.float64, (2 * pairs + 6 * n_cols + COLUMN_SLAB,)))


@nb.njit(nogil=True, cache=True)
def nearest_columns(dots, qf, gf, qa, ga, qn, gn, q_index, g_index, metric, c_dot, c_refine, keys, far, bounds, ints,
                    floats):
    """``nearest_update`` the other way round: each column j of ``dots`` (row j of ``gf``, U row
    ``g_index[j]``) takes the rows of ``qf`` as candidates, into ``keys[j]`` and ``far[j]``; returns
    the pairs whose canonical distance was computed.  ``ints``, ``floats``: ``column_buffers``.

    The same rounds, ``COLUMN_SLAB`` rows at a time: the slab's fast distances screened row by row
    against every column's limits (the lists as they stand: a loop over the row that vectorises),
    the pairs kept grouped by column (a counting sort: rows stay ascending), then ``settle`` per
    column.  A column's first rows bound its farthest by their largest fast distance, as a row's
    first block does, for every slab (the farthest the first slab settles may lie far below it)."""
    n_rows, n_cols = dots.shape
    if n_rows == 0 or n_cols == 0:
        return 0
    k = bounds.shape[0]
    slab = min(n_rows, COLUMN_SLAB)
    pairs = slab * n_cols
    pair_col, pair_row, sorted_row = ints[:pairs], ints[pairs:2 * pairs], ints[2 * pairs:3 * pairs]
    candidates = ints[3 * pairs:3 * pairs + n_cols + slab]
    at = ints[3 * pairs + n_cols + slab:3 * pairs + 2 * n_cols + slab + 1]
    pair_dist, sorted_dist = floats[:pairs], floats[pairs:2 * pairs]
    rest = floats[2 * pairs:]
    row, col_max, below, above = rest[:n_cols], rest[n_cols:2 * n_cols], rest[2 * n_cols:3 * n_cols], rest[3 * n_cols:4 * n_cols]
    lowest, widest, near = rest[4 * n_cols:5 * n_cols], rest[5 * n_cols:6 * n_cols], rest[6 * n_cols:6 * n_cols + slab]
    qn_max = qn.max()
    col_max[:] = -np.inf
    if np.any(far == -np.inf):  # some column's first rows
        for i in range(n_rows):
            fast_distances(dots[i], qa[i], ga, metric, row)
            for j in range(n_cols):
                col_max[j] = max(col_max[j], row[j])
    for j in range(n_cols):
        widest[j] = kernels.distance_window(0.0, gn[j], qn_max, metric, c_dot)
    settled = 0
    for s0 in range(0, n_rows, slab):
        for j in range(n_cols):
            lowest[j] = max(far[j], col_max[j] - widest[j])  # a first slab's far alone would let in every later pair
            below[j] = keys[j, k - 1, 0] + 2.0 * widest[j]
            above[j] = lowest[j] - 2.0 * widest[j]
        at[:] = 0
        n_pairs = 0
        for i in range(s0, min(s0 + slab, n_rows)):
            fast_distances(dots[i], qa[i], ga, metric, row)
            for c in range(screen_each(row, below, above, candidates)):
                j = candidates[c]
                pair_col[n_pairs] = j
                pair_row[n_pairs] = i
                pair_dist[n_pairs] = row[j]
                at[j + 1] += 1
                n_pairs += 1
        for j in range(n_cols):
            at[j + 1] += at[j]
        for m in range(n_pairs):  # at[j] ends at column j's end: its start once all are placed
            j = pair_col[m]
            sorted_row[at[j]] = pair_row[m]
            sorted_dist[at[j]] = pair_dist[m]
            at[j] += 1
        start = 0
        for j in range(n_cols):
            n = at[j] - start
            for c in range(n):
                candidates[c] = sorted_row[start + c]
                near[c] = sorted_dist[start + c]
            if n:
                settled += settle(gf, qf, j, candidates, near, n, ga[j], qa, gn[j], qn, g_index[j], q_index, metric,
                                  c_dot, c_refine, widest[j], lowest[j], np.inf, -np.inf, keys[j], far, bounds)
            start = at[j]
    return settled


@nb.njit(nogil=True, cache=True, inline="always")
def settle(own_f, other_f, o, candidates, near, n, own_a, other_a, own_n, other_n, own_row, other_rows, metric, c_dot,
           c_refine, widest, lowest, cap, floor, keys, far, bounds):
    """Rounds 2 to 4 of ``nearest_update`` for row o of ``own_f`` (U row ``own_row``, list ``keys``,
    farthest ``far[o]``) and its candidates, rows ``candidates[:n]`` of ``other_f`` at fast distances
    ``near[:n]`` (screened against ``lowest``, the farthest bound, and ``widest``), none above
    ``cap`` or below ``floor`` (``nearest_update``) settled for the list or the farthest:

    2. with each pair's own window (``kernels.distance_window``): the k-th smallest upper bound U
       over the list and them (a max-heap), the largest lower bound F; rows whose lower bound is at
       most U or whose upper bound reaches F stay open;
    3. their float64 dot products in any order (``kernels.refined_dots``, windows ~1e-13): U and F
       again over them;
    4. the canonical distance of those still open, into the list and the farthest.

    Returns the pairs whose canonical distance was computed.  The distance is symmetric to the bit
    (``kernels.canonical_distance``), so a pair settled either way round gives the same key."""
    k = bounds.shape[0]
    for m in range(k):  # the list's distances, descending: a max-heap
        bounds[m] = keys[k - 1 - m, 0]
    for c in range(n):
        d = near[c]
        if d < bounds[0]:  # else its upper bound cannot lower the root
            kernels.push_bound(bounds, d + kernels.distance_window(d, own_n, other_n[candidates[c]], metric, c_dot))
        lowest = max(lowest, d - widest)
    cut = min(bounds[0], cap)
    open_rows = 0
    for c in range(n):
        j = candidates[c]
        w = kernels.distance_window(near[c], own_n, other_n[j], metric, c_dot)
        if (near[c] - w <= cut) | (near[c] + w >= lowest):
            candidates[open_rows] = j
            open_rows += 1
    refined = near[:open_rows]  # the fast distances are read no more
    kernels.refined_row_dots(own_f, other_f, o, candidates[:open_rows], refined)
    for m in range(k):
        bounds[m] = keys[k - 1 - m, 0]
    lowest = max(far[o], floor)
    for c in range(open_rows):
        j = candidates[c]
        refined[c] = kernels.pair_distance(refined[c], own_a, other_a[j], metric)
        w = kernels.distance_window(refined[c], own_n, other_n[j], metric, c_refine)
        kernels.push_bound(bounds, refined[c] + w)
        lowest = max(lowest, refined[c] - w)
    cut = min(bounds[0], cap)
    settled = 0
    for c in range(open_rows):
        j = candidates[c]
        w = kernels.distance_window(refined[c], own_n, other_n[j], metric, c_refine)
        if (refined[c] - w <= cut) | (refined[c] + w >= lowest):
            exact = 0.0
            if own_row != other_rows[j]:
                exact = max(kernels.canonical_distance(own_f, other_f, o, j, own_a, other_a[j], metric), 0.0)
            settled += 1
            kernels.insert_key(keys, exact, np.float64(other_rows[j]))
            far[o] = max(far[o], exact)
    return settled


@nb.njit(nogil=True, cache=True)
def screen(dist, below, above, candidates):
    """The rows whose fast distance is at most ``below`` or at least ``above``, into
    ``candidates``; returns how many.  A loop that vectorises into a mask, then its set positions
    (``block.compact``: a sparse mask costs a read of it)."""
    hit = mask(dist.shape[0])
    for j in range(dist.shape[0]):
        hit[j] = (dist[j] <= below) | (dist[j] >= above)
    return compact(hit, candidates)


@nb.njit(nogil=True, cache=True)
def screen_each(dist, below, above, candidates):
    """``screen`` with each row's own limits ``below[j]`` and ``above[j]``."""
    hit = mask(dist.shape[0])
    for j in range(dist.shape[0]):
        hit[j] = (dist[j] <= below[j]) | (dist[j] >= above[j])
    return compact(hit, candidates)


@nb.njit(nogil=True, cache=True)
def fast_distances(dots, qa, ga, metric, out):
    """``kernels.pair_distance`` of one row's dot products, a loop per metric (vectorised)."""
    if metric == kernels.COSINE:
        for j in range(dots.shape[0]):
            out[j] = 1.0 - np.float64(dots[j]) / (qa * ga[j])
    else:
        for j in range(dots.shape[0]):
            out[j] = max(qa + ga[j] - 2.0 * np.float64(dots[j]), 0.0)


def read_u_rows(sets: tuple, rows: np.ndarray, dtype) -> np.ndarray:
    """Features of the U rows ``rows`` (any order, repeats allowed), reading only their chunks."""
    parts = u_parts(sets)
    out = np.empty((rows.shape[0], sets[0].dim), dtype=dtype)
    for part in parts:
        inside = np.flatnonzero((rows >= part.offset) & (rows < part.offset + len(part.fs)))
        if inside.size:
            wanted, back = np.unique(rows[inside] - part.offset, return_inverse=True)
            out[inside] = read_features(part.fs, wanted, dtype)[back]
    return out


def pair_distances(sets: tuple, metric: str, dtype, first: np.ndarray, second: np.ndarray, runner) -> np.ndarray:
    """Canonical distances of the U pairs (first[m], second[m]) (0 for a row with itself): a pass over
    U per block of ``first`` rows (``pair_block_rows``), each chunk of U read once per block, so
    memory stays a block and a chunk whatever the pairs."""
    source = sources.block_source(metric, sets[0].dim, dtype)
    order = np.lexsort((second, first))
    first, second = first[order], second[order]
    parts = u_parts(sets)
    n_rows = parts[-1].offset + len(parts[-1].fs)
    plan = replace(runner.plan, query_block=pair_block_rows(runner.plan, sets[0].dim, np.dtype(dtype).itemsize, n_rows))
    tasks = []
    for part in parts:
        for a, b in plan.query_ranges(len(part.fs)):
            lo, hi = np.searchsorted(first, [part.offset + a, part.offset + b])
            if lo < hi:
                rows = graph.task(u_rows, part, a, b, source, dtype)
                tasks.append(graph.task(block_pair_distances, sets, source, dtype, rows, first[lo:hi], second[lo:hi],
                                        runner.plan))
    out = np.empty(first.shape[0])
    out[order] = np.concatenate(runner.compute(delayed(list)(tasks))) if tasks else np.empty(0)
    return out


def block_pair_distances(sets: tuple, source, dtype, rows: graph.Rows, first: np.ndarray, second: np.ndarray,
                         plan) -> np.ndarray:
    """``pair_distances`` of pairs whose first rows lie in one block of U rows (``rows``, read), U's
    chunks that hold second rows read in turn."""
    at = first - rows.index[0]
    out = np.empty(first.shape[0])
    by_second = np.argsort(second, kind="stable")
    ordered = second[by_second]
    for part, c, e in graph.gallery_chunks(plan, u_parts(sets)):
        lo, hi = np.searchsorted(ordered, [part.offset + c, part.offset + e])
        if lo == hi:
            continue
        picked = by_second[lo:hi]
        gf = read_features(part.fs, slice(c, e), dtype)
        ga = source.prepare(part.fs, slice(c, e), gf)[0]
        out[picked] = kernels.pair_distances(rows.features, gf, at[picked], second[picked] - part.offset - c,
                                             rows.terms, ga, source.metric)
    out[first == second] = 0.0
    return np.maximum(out, 0.0)
