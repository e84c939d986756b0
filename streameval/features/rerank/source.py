"""The re-ranked distances as the run's block source (``engine/sources.py``):
final(q, g) = (1 - lambda) J(q, g) + lambda A(q, g), float64 (PROTOCOLS.md 6.1 step 5).

J is 1 but for each query's candidates (``sparse.Jaccard``); A is the base distance d of the pair
(the flavours: its B over the query's row maximum, or d itself), from a float64 GEMM of the rows'
features.  Values are exact as made (their window is zero, as a distance store's): the float64 GEMM
differs from the canonical sum only in summation order, which the re-ranking's exactness allows
(6.1).  Two kinds of pairs take their canonical d instead: a pair of one identity - every positive
among them - so that the value the positives pass lists (``pair_distances``) is the very value the
scoring pass meets; and a row with a twin in U (``twins``: an exact or near duplicate), whose GEMM
values could differ from its twin's in the last bit (BLAS sums a column by where it sits) and so
break their tie otherwise than by index.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from ...engine import kernels, scratch
from ...engine.sources import FeatureSource
from ...store import read_features


@dataclass(frozen=True)
class RerankedSource:
    base: FeatureSource  # the base metric's features (float64): terms, the GEMM, canonical pairs
    flavour: object  # flavours.Flavour
    run_metric: str  # the run's metric (the flavour's B depends on it)
    lam: float
    jaccard: object  # sparse.Jaccard of the query rows
    row_max: np.ndarray  # (n_queries,) B's maximum over U per query (normalised flavours), else ones
    n_queries: int  # U rows of the gallery start here
    gallery_rows: int  # extended gallery rows past these are the queries' copies
    twins: np.ndarray  # (N,) bool: U rows scored by their canonical distances (``twins``)
    metric: int = kernels.PRECOMPUTED  # the values are final distances, exact as made
    c_dot: float = 0.0
    c_refine: float = 0.0
    screens = False

    def prepare(self, fs, rows, features: np.ndarray) -> tuple:
        return self.base.prepare(fs, rows, features)

    def block(self, part, start: int, stop: int, queries, chunk, rows: slice, cols: slice = slice(None)) -> np.ndarray:
        """The final values, into this thread's scratch buffer (valid until the next block)."""
        first, last, _ = cols.indices(stop - start)
        start, stop, chunk = start + first, start + last, chunk.sub(cols)
        qf = queries.features[rows]
        dots = np.matmul(qf, chunk.features.T, out=scratch.buffer("rerank dots", np.float64, (qf.shape[0], stop - start)))
        u0 = self.u_row(part, start)
        query_rows, j = queries.index[rows], self.jaccard
        scale, power, row_max = self.original_terms(query_rows)
        out = final_block(dots, queries.terms[rows], chunk.terms, self.base.metric, scale, power, row_max, query_rows, u0,
                          j.indptr, j.cols, j.values, self.lam, scratch.buffer("rerank final", np.float64, dots.shape))
        same = canonical_pairs(queries.pids[rows], chunk.pids, self.twins[u0:u0 + dots.shape[1]])
        if same[0].size:
            d = kernels.pair_distances(qf, chunk.features, same[0], same[1], queries.terms[rows], chunk.terms,
                                       self.base.metric)
            out[same] = final_pairs(d, scale, power, row_max[same[0]], query_rows[same[0]], u0 + same[1], j.indptr,
                                    j.cols, j.values, self.lam)
        return out

    def exact(self, qf: np.ndarray, values: np.ndarray) -> np.ndarray:
        return values

    def pair_distances(self, part, start: int, stop: int, queries, qrows: np.ndarray, grows: np.ndarray) -> np.ndarray:
        features = read_features(part.fs, slice(start, stop), np.float64)
        terms = self.prepare(part.fs, slice(start, stop), features)[0]
        d = kernels.pair_distances(queries.features, features, qrows, grows, queries.terms, terms, self.base.metric)
        query_rows, j = queries.index[qrows], self.jaccard
        scale, power, row_max = self.original_terms(query_rows)
        return final_pairs(d, scale, power, row_max, query_rows, grows + self.u_row(part, start), j.indptr, j.cols,
                           j.values, self.lam)

    def u_row(self, part, start: int) -> int:
        """The U row of the part's row ``start``: gallery rows follow the queries; the queries' copies
        (the extended gallery's rows past the gallery) are the queries themselves."""
        row = part.offset + start
        return row + self.n_queries if row < self.gallery_rows else row - self.gallery_rows

    def original_terms(self, query_rows: np.ndarray) -> tuple:
        """(scale, power, row maxima) of the queries' A = scale * max(d, 0)^power / row maximum
        (``original_value``): the flavour's B over the row maximum, or d itself."""
        if not self.flavour.normalised:
            return 1.0, 1, np.ones(query_rows.shape[0])
        return self.flavour.scale(self.run_metric), self.flavour.power, self.row_max[query_rows]


@nb.njit(nogil=True, cache=True, inline="always")
def combine(jaccard, original, lam):
    return (1.0 - lam) * jaccard + lam * original


@nb.njit(nogil=True, cache=True, inline="always")
def original_value(d, scale, power, row_max):
    """The flavours' A = scale * max(d, 0)^power / row maximum, power 1 or 2, in the operations and
    order of ``Flavour.b`` (numpy's square is one rounded product): the same bits in a block or a pair."""
    t = max(d, 0.0)
    return scale * (t if power == 1 else t * t) / row_max


@nb.njit(nogil=True, cache=True, inline="always")
def _final_row(dots, qa, ga, metric, scale, power, row_max, lam, out):
    """final of a row's pairs with J = 1."""
    for j in range(out.shape[0]):
        out[j] = combine(1.0, original_value(kernels.pair_distance(dots[j], qa, ga[j], metric), scale, power, row_max),
                         lam)


@nb.njit(nogil=True, cache=True)
def final_block(dots, qa, ga, metric, scale, power, row_max, query_rows, u0, indptr, cols, values, lam, out):
    """final[i, j] for query query_rows[i] and U row u0 + j from the GEMM's dot products (base
    distances as ``kernels.pair_distance`` makes them, of the base metric: cosine or sqeuclidean),
    into ``out``: J = 1 but for the query's candidates.  Pairs scored by their canonical distance
    are written over afterwards."""
    for i in range(out.shape[0]):
        most = row_max[i]  # locals: read through arrays (which ``out`` might alias) the loop ran scalar
        qai = qa[i]
        if metric == kernels.COSINE:  # a loop per base metric: a test of it inside kept the loop scalar
            _final_row(dots[i], qai, ga, kernels.COSINE, scale, power, most, lam, out[i])
        else:
            _final_row(dots[i], qai, ga, kernels.SQEUCLIDEAN, scale, power, most, lam, out[i])
        lo = indptr[query_rows[i]]
        hi = indptr[query_rows[i] + 1]
        m = lo + np.searchsorted(cols[lo:hi], u0)
        while m < hi and cols[m] < u0 + out.shape[1]:
            d = kernels.pair_distance(dots[i, cols[m] - u0], qai, ga[cols[m] - u0], metric)
            out[i, cols[m] - u0] = combine(values[m], original_value(d, scale, power, most), lam)
            m += 1
    return out


@nb.njit(nogil=True, cache=True)
def canonical_pairs(query_pids, gallery_pids, twins):
    """(rows, columns) of a block's pairs scored by their canonical distance: one identity, or a
    gallery row with a twin; row by row, columns ascending.  A query's identity is found by a
    search among the columns sorted by pid (a few per query among thousands: a test of every pair
    cost more than the values' own kernel), the twins of other identities added to it."""
    order = np.argsort(gallery_pids, kind="mergesort")
    first = np.searchsorted(gallery_pids[order], query_pids, side="left")
    stop = np.searchsorted(gallery_pids[order], query_pids, side="right")
    twin_columns = np.flatnonzero(twins)
    n = 0
    for i in range(query_pids.shape[0]):
        n += stop[i] - first[i] + np.sum(gallery_pids[twin_columns] != query_pids[i])
    rows = np.empty(n, dtype=np.int64)
    columns = np.empty(n, dtype=np.int64)
    n = 0
    for i in range(query_pids.shape[0]):
        own = np.sort(np.concatenate((order[first[i]:stop[i]],
                                      twin_columns[gallery_pids[twin_columns] != query_pids[i]])))
        rows[n:n + own.shape[0]] = i
        columns[n:n + own.shape[0]] = own
        n += own.shape[0]
    return rows, columns


@nb.njit(nogil=True, cache=True)
def final_pairs(d, scale, power, row_max, query_rows, u_rows, indptr, cols, values, lam):
    """final of the pairs (query_rows[m], u_rows[m])."""
    out = np.empty_like(d)
    for m in range(out.shape[0]):
        lo = indptr[query_rows[m]]
        hi = indptr[query_rows[m] + 1]
        at = lo + np.searchsorted(cols[lo:hi], u_rows[m])
        jaccard = values[at] if at < hi and cols[at] == u_rows[m] else 1.0
        out[m] = combine(jaccard, original_value(d[m], scale, power, row_max[m]), lam)
    return out


def twins(neighbours, tolerance: float = 1e-10) -> np.ndarray:
    """U rows with another row within ``tolerance`` of their farthest distance in their list: exact
    duplicates (their canonical distance is 0 up to rounding) and rows all but equal to one."""
    index, dist = neighbours.index, neighbours.dist
    rows = np.arange(index.shape[0])[:, None]
    near = (index != rows) & (dist <= tolerance * neighbours.farthest[:, None])
    marked = np.zeros(index.shape[0], dtype=bool)
    marked[rows[:, 0][near.any(axis=1)]] = True
    marked[index[near]] = True
    return marked
