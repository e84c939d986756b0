"""From the kNN pass's lists to the query rows' sparse Jaccard distances (PROTOCOLS.md 6.1 steps 1-4,
6.2 steps 2-5), in memory O(nnz): nothing of size N x N or Q x G.

1. ``R(i; L)`` for L = L1 and h from the lists alone (``_reciprocal``), then ``R*(i)``
   (``_expanded_sets``, ascending U rows).
2. ``V(i, j) = w(i, j) / sum w`` on R*(i): B(i, j) comes from i's list where j is in it, else from
   ``pair_distances`` (one call with every such pair: the out-of-core reader).
3. ``V_qe(i)``: (1/k2) times the sum of V over top(i, k2), or V itself for k2 = 1 (``_qe_row``).
   It is computed row by row and never kept whole: the query rows' rows are kept (``_query_rows``),
   and of every row only its entries in the columns those touch, as an inverted index (``_inverted``).
4. ``S(q, .)`` in one accumulator per query over the rows its columns reach (``_similarities``),
   ``J = 1 - S / (2 - S)``.

Only pairs with J < 1 are returned: J = 1 exactly wherever the supports do not meet (S = 0), and
where a tiny S rounds J to 1, the default is the value.  Sums run in any order (6.1 allows it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numba as nb
import numpy as np

from ...core.errors import OptionError
from ...engine import kernels  # noqa: F401  numba's versioned cache folder, set before the kernels below are compiled
from ...engine.neighbours import Neighbours
from .flavours import Flavour

_jit = nb.njit(nogil=True, cache=True)
_inline = nb.njit(nogil=True, cache=True, inline="always")


@dataclass(frozen=True)
class Jaccard:
    """The query rows' Jaccard distances with J < 1, as CSR over U rows: row q's columns are
    ``cols[indptr[q]:indptr[q + 1]]`` (ascending U rows, the queries' own rows included), its values
    ``values[...]`` (float64, clamped at 0 where the flavour says so).  Every other (q, u) has J = 1.
    ``facts``: mean and max |R*| and |supp V| (after query expansion) over U
    (``rstar_mean``, ``rstar_max``, ``support_mean``, ``support_max``) and ``candidates``, the
    number of (query, gallery row) pairs with J < 1."""

    indptr: np.ndarray
    cols: np.ndarray
    values: np.ndarray
    facts: dict


def jaccard(neighbours: Neighbours, n_queries: int, flavour: Flavour, metric: str, k1: int, k2: int,
            pair_distances: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Jaccard:
    """J(q, u) for the first ``n_queries`` rows of U against all of U (6.1 steps 1-4).

    ``neighbours``: each U row's list of at least max(L1, k2) rows (all N where N is smaller) by
    (d, row), with its farthest d.  The lists are taken in the order of (B, row) (``_ordered_by_b``);
    they must hold the rows that come first in that order, which lists by (d, row) do unless more
    rows than a list holds are at B = 0 from its row (a kNN pass keyed on max(d, 0) always does).
    ``pair_distances(i_rows, j_rows)``: the canonical d of those U pairs (float64), called once
    with every pair (i, j in R*(i)) outside i's list, if there is one."""
    n = neighbours.index.shape[0]
    l1, h = min(flavour.lists(k1), n), min(flavour.expansion(k1), n)
    if neighbours.k < min(max(l1, k2), n):
        raise ValueError(f"lists of {neighbours.k} neighbours, re-ranking needs {min(max(l1, k2), n)}")
    rowmax = flavour.b(neighbours.farthest, metric) if flavour.normalised else None
    if rowmax is not None and np.any(rowmax == 0.0):
        raise OptionError(f"--rerank {flavour.name}: U row {int(np.argmin(rowmax))} is at distance 0 from "
                          "every row, so B / rowmax is undefined; all items are identical")
    lists, b = _ordered_by_b(neighbours.index, flavour.b(neighbours.dist, metric))
    r1, n1 = _reciprocal(lists, l1)
    rh, nh = _reciprocal(lists, h)
    v_indptr, v_cols = _expanded_sets(r1, n1, rh, nh)
    del r1, n1, rh, nh
    v_vals = _weights(v_indptr, v_cols, lists, b, rowmax, lambda i, j: flavour.b(pair_distances(i, j), metric))
    qe = lists[:, :k2] if k2 != 1 else np.arange(n, dtype=np.int64)[:, None]  # k2 = 1: V itself
    q_indptr, q_cols, q_vals = _query_rows(n_queries, qe, k2, v_indptr, v_cols, v_vals)
    inv_indptr, inv_rows, inv_vals, support = _inverted(q_cols, qe, k2, v_indptr, v_cols, v_vals)
    indptr, cols, values = _similarities(q_indptr, q_cols, q_vals, inv_indptr, inv_rows, inv_vals,
                                         flavour.clamp)
    sizes = np.diff(v_indptr)
    facts = {"rstar_mean": float(sizes.mean()), "rstar_max": int(sizes.max()),
             "support_mean": float(support.mean()), "support_max": int(support.max()),
             "candidates": int(np.count_nonzero(cols >= n_queries))}
    return Jaccard(indptr, cols, values, facts)


def _weights(indptr, cols, lists, b_lists, rowmax, pair_b):
    """V's values on R*: w(i, j) = exp(-B / rowmax) (``rowmax`` None: exp(-B)) over each row's sum;
    B from i's list, else from ``pair_b`` (one call with every such pair)."""
    rows = np.repeat(np.arange(len(indptr) - 1, dtype=np.int64), np.diff(indptr))
    b, missing = _listed(indptr, cols, lists, b_lists)
    if missing.any():
        b[missing] = pair_b(rows[missing], cols[missing])
    if rowmax is not None:
        b /= rowmax[rows]
    return _row_normalised(indptr, np.exp(-b))


@_inline
def _room(buf, used, need):
    """``buf`` with room for ``need`` more entries after ``used`` (a doubled copy when full)."""
    if used + need <= buf.shape[0]:
        return buf
    grown = np.empty(max(2 * buf.shape[0], used + need), buf.dtype)
    grown[:used] = buf[:used]
    return grown


@_jit
def _ordered_by_b(index, b):
    """The lists (copies) in the order of (B, row).  A list by (d, row) can differ: the canonical
    cosine distance of parallel rows can round below 0, and B counts it as 0, a tie with the row
    itself that the row numbers break (and d^2 underflows to 0 below 1.5e-154)."""
    index = index.copy()
    b = b.copy()
    for i in range(index.shape[0]):
        for p in range(1, index.shape[1]):
            j, key = index[i, p], b[i, p]
            r = p
            while r > 0 and (b[i, r - 1] > key or (b[i, r - 1] == key and index[i, r - 1] > j)):
                index[i, r], b[i, r] = index[i, r - 1], b[i, r - 1]
                r -= 1
            index[i, r], b[i, r] = j, key
    return index, b


@_jit
def _reciprocal(lists, length):
    """R(i; length) of every row: members (padded (N, length), in list order) and counts."""
    n = lists.shape[0]
    members = np.empty((n, length), np.int64)
    counts = np.zeros(n, np.int64)
    for i in range(n):
        for p in range(length):
            j = lists[i, p]
            for r in range(length):
                if lists[j, r] == i:
                    members[i, counts[i]] = j
                    counts[i] += 1
                    break
    return members, counts


@_inline
def _shared(members_a, count_a, members_b, count_b):
    """|A ∩ B| of two sets without repeats."""
    shared = 0
    for a in range(count_a):
        for b in range(count_b):
            if members_a[a] == members_b[b]:
                shared += 1
                break
    return shared


@_jit
def _expanded_sets(r1, n1, rh, nh):
    """R*(i) = R(i; L1) with every R(c; h), c in R(i; L1), that shares more than two thirds of
    itself with R(i; L1): CSR (indptr, ascending U rows)."""
    n = r1.shape[0]
    indptr = np.zeros(n + 1, np.int64)
    cols = np.empty(n * r1.shape[1] + 1, np.int64)
    scratch = np.empty(r1.shape[1] * (1 + rh.shape[1]), np.int64)
    for i in range(n):
        size = n1[i]
        scratch[:size] = r1[i, :size]
        for a in range(n1[i]):
            c = r1[i, a]
            if 3 * _shared(rh[c], nh[c], r1[i], n1[i]) > 2 * nh[c]:
                scratch[size:size + nh[c]] = rh[c, :nh[c]]
                size += nh[c]
        members = scratch[:size]
        members.sort()
        cols = _room(cols, indptr[i], size)
        used = indptr[i]
        for s in range(size):
            if s == 0 or members[s] != members[s - 1]:
                cols[used] = members[s]
                used += 1
        indptr[i + 1] = used
    return indptr, cols[:indptr[n]].copy()


@_jit
def _listed(indptr, cols, lists, b_lists):
    """B(i, j) on R*(i) where j is in i's list, and which pairs are not."""
    b = np.zeros(cols.shape[0])
    missing = np.ones(cols.shape[0], np.bool_)
    for i in range(indptr.shape[0] - 1):
        for e in range(indptr[i], indptr[i + 1]):
            j = cols[e]
            for p in range(lists.shape[1]):
                if lists[i, p] == j:
                    b[e] = b_lists[i, p]
                    missing[e] = False
                    break
    return b, missing


@_jit
def _row_normalised(indptr, w):
    """Each CSR row of ``w`` divided by its sum."""
    out = np.empty_like(w)
    for i in range(indptr.shape[0] - 1):
        total = 0.0
        for e in range(indptr[i], indptr[i + 1]):
            total += w[e]
        for e in range(indptr[i], indptr[i + 1]):
            out[e] = w[e] / total
    return out


@_inline
def _accumulate(acc, stamp, touched, size, m, owner, value):
    """acc[m] += value in a sparse accumulator of ``owner`` (a row): the first touch of m by this owner
    (``stamp``) zeroes it and lists m in ``touched[:size]``; returns the new size."""
    if stamp[m] != owner:
        stamp[m] = owner
        acc[m] = 0.0
        touched[size] = m
        size += 1
    acc[m] += value
    return size


@_inline
def _qe_row(i, qe, k2, v_indptr, v_cols, v_vals, acc, stamp, out_cols, out_vals):
    """V_qe(i) = (1/k2) sum of V over rows ``qe[i]`` (fewer than k2 where N is), into ``out_cols`` /
    ``out_vals`` (unordered, nonzero entries only: an underflowed weight is no support); returns its size.  ``acc`` and
    ``stamp`` (-1 or the last row that used the column) are N-long work arrays."""
    size = 0
    for a in range(qe.shape[1]):
        j = qe[i, a]
        for e in range(v_indptr[j], v_indptr[j + 1]):
            size = _accumulate(acc, stamp, out_cols, size, v_cols[e], i, v_vals[e])
    kept = 0
    for s in range(size):
        m = out_cols[s]
        value = acc[m] / k2
        if value > 0.0:
            out_cols[kept] = m
            out_vals[kept] = value
            kept += 1
    return kept


@_inline
def _qe_work(qe, v_indptr):
    """``_qe_row``'s work arrays: acc, stamp, and an output as long as any row's sum of sizes."""
    n = v_indptr.shape[0] - 1
    longest = np.max(v_indptr[1:] - v_indptr[:-1]) * qe.shape[1] if n else 0
    return (np.zeros(n), np.full(n, -1, np.int64), np.empty(longest, np.int64), np.empty(longest))


@_jit
def _query_rows(n_queries, qe, k2, v_indptr, v_cols, v_vals):
    """V_qe of the query rows, CSR (columns unordered within a row)."""
    acc, stamp, row_cols, row_vals = _qe_work(qe, v_indptr)
    indptr = np.zeros(n_queries + 1, np.int64)
    cols = np.empty(max(1, n_queries * row_cols.shape[0] // 4), np.int64)
    vals = np.empty(cols.shape[0])
    for q in range(n_queries):
        size = _qe_row(q, qe, k2, v_indptr, v_cols, v_vals, acc, stamp, row_cols, row_vals)
        cols = _room(cols, indptr[q], size)
        vals = _room(vals, indptr[q], size)
        cols[indptr[q]:indptr[q] + size] = row_cols[:size]
        vals[indptr[q]:indptr[q] + size] = row_vals[:size]
        indptr[q + 1] = indptr[q] + size
    return indptr, cols[:indptr[n_queries]].copy(), vals[:indptr[n_queries]].copy()


@_jit
def _inverted(query_cols, qe, k2, v_indptr, v_cols, v_vals):
    """The inverted index of V_qe over all of U restricted to the columns the query rows touch:
    column m's (row, value) pairs are ``inv_rows`` / ``inv_vals`` [inv_indptr[m]:inv_indptr[m + 1]],
    rows ascending; and every row's |supp V_qe|.  Two passes over the rows (count, then fill),
    each computing V_qe afresh, so that no row of it is kept."""
    acc, stamp, row_cols, row_vals = _qe_work(qe, v_indptr)
    n = v_indptr.shape[0] - 1
    touched = np.zeros(n, np.bool_)
    touched[query_cols] = True
    support = np.zeros(n, np.int64)
    inv_indptr = np.zeros(n + 1, np.int64)
    for i in range(n):
        support[i] = _qe_row(i, qe, k2, v_indptr, v_cols, v_vals, acc, stamp, row_cols, row_vals)
        for s in range(support[i]):
            inv_indptr[row_cols[s] + 1] += touched[row_cols[s]]
    inv_indptr = np.cumsum(inv_indptr)
    inv_rows = np.empty(inv_indptr[n], np.int64)
    inv_vals = np.empty(inv_indptr[n])
    filled = inv_indptr[:-1].copy()
    stamp[:] = -1
    for i in range(n):
        size = _qe_row(i, qe, k2, v_indptr, v_cols, v_vals, acc, stamp, row_cols, row_vals)
        for s in range(size):
            m = row_cols[s]
            if touched[m]:
                inv_rows[filled[m]] = i
                inv_vals[filled[m]] = row_vals[s]
                filled[m] += 1
    return inv_indptr, inv_rows, inv_vals, support


@_jit
def _similarities(q_indptr, q_cols, q_vals, inv_indptr, inv_rows, inv_vals, clamp):
    """J(q, u) = 1 - S / (2 - S) with S(q, u) = sum_m min(V_qe(q, m), V_qe(u, m)) over the columns
    both touch, for each query row against the U rows its columns reach: CSR of the pairs with
    J < 1, columns ascending."""
    n_queries = q_indptr.shape[0] - 1
    n = inv_indptr.shape[0] - 1
    acc = np.zeros(n)
    stamp = np.full(n, -1, np.int64)
    reached = np.empty(n, np.int64)
    indptr = np.zeros(n_queries + 1, np.int64)
    cols = np.empty(max(1, 4 * q_cols.shape[0]), np.int64)
    values = np.empty(cols.shape[0])
    for q in range(n_queries):
        size = 0
        for e in range(q_indptr[q], q_indptr[q + 1]):
            m = q_cols[e]
            for f in range(inv_indptr[m], inv_indptr[m + 1]):
                size = _accumulate(acc, stamp, reached, size, inv_rows[f], q, min(q_vals[e], inv_vals[f]))
        rows = reached[:size]
        rows.sort()
        cols = _room(cols, indptr[q], size)
        values = _room(values, indptr[q], size)
        used = indptr[q]
        for u in rows:
            j = 1.0 - acc[u] / (2.0 - acc[u])
            if clamp:
                j = max(j, 0.0)
            if j < 1.0:
                cols[used] = u
                values[used] = j
                used += 1
        indptr[q + 1] = used
    return indptr, cols[:indptr[n_queries]].copy(), values[:indptr[n_queries]].copy()
