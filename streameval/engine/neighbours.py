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

from . import graph, kernels, sources
from ..core.progress import work_key
from ..store import read_rows


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
    U = the rows of ``sets`` in order: one U x U pass on ``runner`` (query blocks of U, chains of
    chunks per worker, the lists merged as sorted keys), GEMMs in ``dtype`` settled exactly."""
    if metric not in ("cosine", "sqeuclidean"):
        raise ValueError(f"the kNN pass takes cosine or sqeuclidean distances, not {metric!r}")
    source = sources.block_source(metric, sets[0].dim, dtype, runner.device)
    parts = u_parts(sets)
    k = min(k, parts[-1].offset + len(parts[-1].fs))  # a list of all of U is as long as one gets
    chunks = graph.gallery_chunks(runner.plan, parts)
    plan = replace(runner.plan, query_block=block_rows(runner.plan, sets[0].dim, np.dtype(dtype).itemsize, k))
    work = 0
    blocks = []
    for part in parts:
        for a, b in plan.query_ranges(len(part.fs)):
            rows = delayed(u_rows)(part, a, b, source, dtype)
            chains = [None] * max(1, min(runner.plan.workers, len(chunks)))
            for i, (other, c, e) in enumerate(chunks):
                cost = graph.distance_work(other.fs, b - a, c, e)
                work += cost
                chains[i % len(chains)] = delayed(nearest_in_chunk)(
                    other, c, e, rows, source, dtype, k, chains[i % len(chains)],
                    dask_key_name=work_key("neighbours", cost))
            blocks.append(graph.tree_reduce(chains, merge_found))
    runner.expect("neighbours", work)
    found = runner.compute(delayed(list)(blocks))
    keys = np.concatenate([keys for keys, _, _ in found])
    return Neighbours(keys[:, :, 1].astype(np.int64), np.ascontiguousarray(keys[:, :, 0]),
                      np.concatenate([far for _, far, _ in found]), metric, sum(n for _, _, n in found))


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


def nearest_in_chunk(part, start: int, stop: int, rows: graph.Rows, source, dtype, k: int, before):
    """``before`` (keys (n, k, 2), farthest (n,), pairs settled) or empty lists, with the part's rows
    [start, stop) added."""
    if before is None:
        keys = np.full((len(rows.index), k, 2), np.inf)
        far, settled = np.full(len(rows.index), -np.inf), 0
    else:
        keys, far, settled = before[0].copy(), before[1].copy(), before[2]
    chunk = u_rows(part, start, stop, source, dtype)
    bounds, dist, candidates = np.empty(k), np.empty(stop - start), np.empty(stop - start, dtype=np.int64)
    for first in range(0, len(rows.index), graph.QUERY_SUB_BLOCK):
        sub = slice(first, first + graph.QUERY_SUB_BLOCK)
        dots = source.block(part, start, stop, rows, chunk, sub)
        settled += nearest_update(dots, rows.features[sub], chunk.features, rows.terms[sub], chunk.terms,
                                  rows.norms[sub], chunk.norms, rows.index[sub], chunk.index, source.metric,
                                  source.c_dot, source.c_refine, keys[sub], far[sub], bounds, dist, candidates)
    return keys, far, settled


def merge_found(a, b):
    return kernels.merge_smallest(a[0], b[0]), np.maximum(a[1], b[1]), a[2] + b[2]


@nb.njit(nogil=True, cache=True)
def nearest_update(dots, qf, gf, qa, ga, qn, gn, q_index, g_index, metric, c_dot, c_refine, keys, far, bounds, dist,
                   candidates):
    """Add a block's rows to each query row's list ``keys[i]`` (k smallest (distance, U row)) and
    exact farthest distance ``far[i]``; returns the pairs whose canonical distance was computed.

    Per row, rounds on the rows the last one left open (``dist``, ``candidates``: scratch):

    1. the fast distances, screened against the list as it stands: a row may enter it only if its
       lower bound is below the list's last distance, and be the farthest only if its upper bound
       reaches the farthest so far (on a row's first block, the block's largest fast distance less a
       window).  For cosine and squared euclidean distances a pair's window does not depend on its
       distance, so the row's widest window (at the block's largest norm), doubled against rounding,
       bounds them all: a branch-free pass that keeps the few rows near either limit;
    2. over those, with each pair's own window (``kernels.distance_window``): the k-th smallest
       upper bound U over the list and them (a max-heap), the largest lower bound F; rows whose
       lower bound is at most U or whose upper bound reaches F stay open;
    3. their float64 dot products in any order (``kernels.refined_dots``, windows ~1e-13): U and F
       again over them;
    4. the canonical distance of those still open, into the list and the farthest.

    A row's distance to itself is 0, and a distance rounded below 0 (cosine) counts as 0."""
    settled = 0
    k = bounds.shape[0]
    gn_max = gn.max() if gn.shape[0] else 0.0
    for i in range(dots.shape[0]):
        widest = kernels.distance_window(0.0, qn[i], gn_max, metric, c_dot)
        fast_distances(dots[i], qa[i], ga, metric, dist)
        lowest = far[i]
        if lowest == -np.inf and dist.shape[0]:  # the row's first block
            lowest = dist.max() - widest
        n = screen(dist, keys[i, k - 1, 0] + 2.0 * widest, lowest - 2.0 * widest, candidates)
        for m in range(k):  # the list's distances, descending: a max-heap
            bounds[m] = keys[i, k - 1 - m, 0]
        for c in range(n):
            d = dist[candidates[c]]
            if d < bounds[0]:  # else its upper bound cannot lower the root
                kernels.push_bound(bounds, d + kernels.distance_window(d, qn[i], gn[candidates[c]], metric, c_dot))
            lowest = max(lowest, d - widest)
        cut = bounds[0]
        open_rows = 0
        for c in range(n):
            j = candidates[c]
            w = kernels.distance_window(dist[j], qn[i], gn[j], metric, c_dot)
            if (dist[j] - w <= cut) | (dist[j] + w >= lowest):
                candidates[open_rows] = j
                open_rows += 1
        refined = kernels.refined_dots(qf, gf, np.full(open_rows, i), candidates[:open_rows])
        for m in range(k):
            bounds[m] = keys[i, k - 1 - m, 0]
        lowest = far[i]
        for c in range(open_rows):
            j = candidates[c]
            refined[c] = kernels.pair_distance(refined[c], qa[i], ga[j], metric)
            w = kernels.distance_window(refined[c], qn[i], gn[j], metric, c_refine)
            kernels.push_bound(bounds, refined[c] + w)
            lowest = max(lowest, refined[c] - w)
        cut = bounds[0]
        for c in range(open_rows):
            j = candidates[c]
            w = kernels.distance_window(refined[c], qn[i], gn[j], metric, c_refine)
            if (refined[c] - w <= cut) | (refined[c] + w >= lowest):
                exact = 0.0
                if q_index[i] != g_index[j]:
                    exact = max(kernels.canonical_distance(qf, gf, i, j, qa[i], ga[j], metric), 0.0)
                settled += 1
                kernels.insert_key(keys[i], exact, np.float64(g_index[j]))
                far[i] = max(far[i], exact)
    return settled


@nb.njit(nogil=True, cache=True)
def screen(dist, below, above, candidates):
    """The rows whose fast distance is at most ``below`` or at least ``above``, into
    ``candidates``; returns how many (branch-free: each row written, the count advanced by the test)."""
    n = 0
    for j in range(dist.shape[0]):
        candidates[n] = j
        n += (dist[j] <= below) | (dist[j] >= above)
    return n


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
            out[inside] = read_rows(part.fs, wanted, dtype)[0][back]
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
                rows = delayed(u_rows)(part, a, b, source, dtype)
                tasks.append(delayed(block_pair_distances)(sets, source, dtype, rows, first[lo:hi], second[lo:hi],
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
        gf = read_rows(part.fs, slice(c, e), dtype)[0]
        ga = source.prepare(part.fs, slice(c, e), gf)[0]
        out[picked] = kernels.pair_distances(rows.features, gf, at[picked], second[picked] - part.offset - c,
                                             rows.terms, ga, source.metric)
    out[first == second] = 0.0
    return np.maximum(out, 0.0)
