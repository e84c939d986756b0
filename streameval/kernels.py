"""Numba kernels: pure, serial, nogil functions over one block of data.

Distances.  Every distance is ``pair_distance(dot, qa, ga, metric)``: the dot product comes from the
working precision (a float32 or float64 GEMM), the per-row terms ``qa``/``ga`` are float64 (squared
norms for the euclidean metrics, norms for cosine, see ``row_terms``), and the combination is done in
float64.  So each pair has one well-defined distance whichever kernel computes it.

Ranking state.  For a query with positives ``p_1 < ... < p_n`` (ordered by ``(distance, gallery
index)``), a negative's *slot* is the number of positives ordered before it.  ``neg_slots[a + s]``
counts the negatives in slot ``s``; the j-th positive then has ``n_j = sum_{s<j} neg_slots[a + s]``
negatives before it and rank ``r_j = j + n_j``.  Slot counts are additive over gallery chunks, which
is what lets the gallery stream.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

SQEUCLIDEAN, EUCLIDEAN, COSINE = 0, 1, 2
METRIC_CODES = {"sqeuclidean": SQEUCLIDEAN, "euclidean": EUCLIDEAN, "cosine": COSINE}

_jit = nb.njit(nogil=True, cache=True)


@nb.njit(nogil=True, cache=True, inline="always")
def pair_distance(dot, qa, ga, metric):
    """Distance of one pair from its dot product and the two rows' float64 terms."""
    dot = np.float64(dot)
    if metric == COSINE:
        return 1.0 - dot / (qa * ga)
    d = max(qa + ga - 2.0 * dot, 0.0)
    if metric == EUCLIDEAN:
        d = math.sqrt(d)
    return d


@_jit
def row_terms(x, metric):
    """Per-row float64 term: the squared norm (euclidean metrics) or the norm (cosine).

    Summed in float64 in a fixed order, so a row's term does not depend on the chunk it is read in.
    """
    out = np.empty(x.shape[0], dtype=np.float64)
    for i in range(x.shape[0]):
        acc = 0.0
        for k in range(x.shape[1]):
            v = np.float64(x[i, k])
            acc += v * v
        out[i] = math.sqrt(acc) if metric == COSINE else acc
    return out


@_jit
def pair_distances(qf, gf, qrows, grows, qa, ga, metric):
    """Distances of the listed pairs (qf[qrows[k]], gf[grows[k]]), dot products summed in float64."""
    out = np.empty(qrows.shape[0], dtype=np.float64)
    for k in range(qrows.shape[0]):
        qi = qrows[k]
        gi = grows[k]
        dot = 0.0
        for t in range(qf.shape[1]):
            dot += np.float64(qf[qi, t]) * np.float64(gf[gi, t])
        out[k] = pair_distance(dot, qa[qi], ga[gi], metric)
    return out


@nb.njit(nogil=True, cache=True, inline="always")
def _positives_before(pos_d, pos_g, lo, hi, d, g):
    """Number of positives in pos[lo:hi] ordered before the item (d, g): a lower bound search."""
    start = lo
    while lo < hi:
        mid = (lo + hi) >> 1
        before = (pos_d[mid] < d) | ((pos_d[mid] == d) & (pos_g[mid] < g))
        lo = mid + 1 if before else lo
        hi = hi if before else mid
    return lo - start


@_jit
def count_negative_slots(dots, qa, ga, metric, q_pid, g_pid, g_junk, g_start, pos_off, pos_d, pos_g, neg_slots):
    """Add this chunk's negatives to ``neg_slots`` (see the module docstring).

    dots: (qb, gc) dot products of the query block with the gallery chunk starting at global row
    ``g_start``.  A gallery item is a negative of query i when it is not junk (``g_junk``) and its pid
    differs from the query's (same-pid items are positives or same-camera junk).  Only negatives
    ordered before the query's last positive are counted: later ones change no rank.
    """
    nq, ng = dots.shape
    for i in range(nq):
        lo = pos_off[i]
        hi = pos_off[i + 1]
        if hi == lo:
            continue
        d_last = pos_d[hi - 1]
        g_last = pos_g[hi - 1]
        qp = q_pid[i]
        qai = qa[i]
        for j in range(ng):
            d = pair_distance(dots[i, j], qai, ga[j], metric)
            g = g_start + j
            if (d < d_last) | ((d == d_last) & (g < g_last)):
                if (g_pid[j] != qp) & (g_junk[j] == 0):
                    neg_slots[lo + _positives_before(pos_d, pos_g, lo, hi, d, g)] += 1


@_jit
def rank_summaries(pos_off, neg_slots, first_rank, ap, ap_trapezoid, inp):
    """Per-query first-hit rank, AP (rectangle and trapezoid) and INP from the slot counts.

    AP = (1/n) sum_j j / r_j;  AP_trapezoid = (1/n) sum_j ((j-1)/(r_j-1) + j/r_j) / 2, the first term
    being 1 when r_j = 1;  INP = n / r_n.  Queries without positives get rank -1 and NaN.
    """
    for q in range(pos_off.shape[0] - 1):
        lo = pos_off[q]
        n = pos_off[q + 1] - lo
        if n == 0:
            first_rank[q] = -1
            ap[q] = np.nan
            ap_trapezoid[q] = np.nan
            inp[q] = np.nan
            continue
        negatives_before = 0
        rect = 0.0
        trap = 0.0
        rank = 0
        for j in range(1, n + 1):
            negatives_before += neg_slots[lo + j - 1]
            rank = j + negatives_before
            precision = j / rank
            previous = 1.0 if rank == 1 else (j - 1) / (rank - 1)
            rect += precision
            trap += 0.5 * (previous + precision)
            if j == 1:
                first_rank[q] = rank
        ap[q] = rect / n
        ap_trapezoid[q] = trap / n
        inp[q] = n / rank
