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


NORM_NONE, NORM_AFFINE = 0, 1


@nb.njit(nogil=True, cache=True, inline="always")
def normalise(d, norm_mode, lo, span):
    """GOM's d~: ``d`` itself (mode none) or ``(d - lo) / span`` clipped to [0, 1] (minmax, fixed).

    A zero span (every distance equal) maps everything to 0.
    """
    if norm_mode == NORM_NONE:
        return d
    if span == 0.0:
        return 0.0
    return min(max((d - lo) / span, 0.0), 1.0)


@nb.njit(nogil=True, cache=True, inline="always")
def threshold_bin(dn, n_bins):
    """Smallest i with ``dn <= tau_i = i * (1/N)``; N + 1 when no threshold returns the item.

    The estimate ceil(dn * N) is at most one off; it is corrected against the grid values computed
    exactly as the grid is defined, so a distance equal to a grid value lands at that threshold.
    Branch-free, so row loops over it vectorise.
    """
    step = 1.0 / n_bins
    k = np.int64(math.ceil(min(max(dn, 0.0), 2.0) * n_bins))
    k = min(k, n_bins + 1)
    k -= np.int64((k > 0) & (dn <= (k - 1) * step))
    k += np.int64((k <= n_bins) & (dn > k * step))
    return k


@_jit
def score_block(dots, qa, ga, metric, q_pid, g_pid, g_junk, g_start, pos_off, pos_d, pos_g, neg_slots,
                with_gom, norm_mode, lo, span, n_bins, neg_hist):
    """Add this chunk's negatives to the ranking slots and, with GOM, to the threshold histograms.

    dots: (qb, gc) dot products of the query block with the gallery chunk starting at global row
    ``g_start``.  A gallery item is a negative of query i when it is not junk (``g_junk``) and its pid
    differs from the query's (same-pid items are positives or same-camera junk).

    * ``neg_slots`` (see the module docstring): only negatives ordered before the query's last
      positive are counted, later ones change no rank.
    * ``neg_hist[i, k]`` (with_gom): negatives first returned at threshold tau_k
      (k = n_bins + 1: never returned).

    Each row is done in simple loops (distances, bins, histogram, slots) so the first two vectorise.
    """
    nq, ng = dots.shape
    dist = np.empty(ng, dtype=np.float64)
    bins = np.empty(ng, dtype=np.int64)
    negative = np.empty(ng, dtype=np.int64)
    for i in range(nq):
        qp = q_pid[i]
        qai = qa[i]
        for j in range(ng):
            dist[j] = pair_distance(dots[i, j], qai, ga[j], metric)
            negative[j] = np.int64((g_pid[j] != qp) & (g_junk[j] == 0))
        if with_gom:
            for j in range(ng):
                bins[j] = threshold_bin(normalise(dist[j], norm_mode, lo, span), n_bins)
            for j in range(ng):
                neg_hist[i, bins[j]] += negative[j]
        lo_pos = pos_off[i]
        hi_pos = pos_off[i + 1]
        if hi_pos == lo_pos:
            continue
        d_last = pos_d[hi_pos - 1]
        g_last = pos_g[hi_pos - 1]
        for j in range(ng):
            d = dist[j]
            g = g_start + j
            if (d < d_last) | ((d == d_last) & (g < g_last)):
                if negative[j]:
                    neg_slots[lo_pos + _positives_before(pos_d, pos_g, lo_pos, hi_pos, d, g)] += 1


@_jit
def distance_range(dots, qa, ga, metric):
    """(min, max) distance over a block: the first GOM pass of ``minmax`` normalisation."""
    lo = np.inf
    hi = -np.inf
    for i in range(dots.shape[0]):
        for j in range(dots.shape[1]):
            d = pair_distance(dots[i, j], qa[i], ga[j], metric)
            lo = min(lo, d)
            hi = max(hi, d)
    return lo, hi


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


@_jit
def gom_block_sums(pos_off, pos_d, neg_slots, neg_hist, junk, tau, norm_mode, lo, span, vp_jaccard, b_cap,
                   rp_sum, vp_sum, rep_sum, fr_sum):
    """Add each query's GOM curves (METRICS.md 4.2) over the grid ``tau`` to the running sums.

    Per query: R_tau = returned non-junk items (negatives from ``neg_hist``, positives from their
    exact distances) plus its ``junk`` items when tau >= 1; TP_tau = returned positives, a prefix of
    the positives since they are sorted by distance.  Q+ adds RP, VP, ReP; Q- adds FR.

    RP_tau = (1/TP) sum_{j<=TP} j / r_j (0 when TP = 0);
    VP_tau = TP / (min(R_tau, r_n) - TP + n)   (reference) or TP / (R_tau - TP + n) (jaccard);
    ReP_tau = sqrt(RP_tau * VP_tau);  FR_tau = min(R_tau, B) / B.
    """
    n_tau = tau.shape[0]
    returned = np.empty(n_tau + 1, dtype=np.int64)
    for q in range(pos_off.shape[0] - 1):
        first = pos_off[q]
        n = pos_off[q + 1] - first
        returned[:] = neg_hist[q, : n_tau + 1]
        for p in range(first, first + n):
            returned[threshold_bin(normalise(pos_d[p], norm_mode, lo, span), n_tau - 1)] += 1
        for t in range(1, n_tau):
            returned[t] += returned[t - 1]
        for t in range(n_tau):
            if tau[t] >= 1.0:
                returned[t] += junk[q]
        if n == 0:
            for t in range(n_tau):
                fr_sum[t] += min(returned[t], b_cap) / b_cap
            continue
        last_rank = n + neg_slots[first: first + n].sum()
        tp = 0
        negatives_before = 0
        precision_sum = 0.0
        for t in range(n_tau):
            while tp < n and threshold_bin(normalise(pos_d[first + tp], norm_mode, lo, span), n_tau - 1) <= t:
                negatives_before += neg_slots[first + tp]
                tp += 1
                precision_sum += tp / (tp + negatives_before)
            rp = precision_sum / tp if tp > 0 else 0.0
            cap = returned[t] if vp_jaccard else min(returned[t], last_rank)
            vp = tp / (cap - tp + n)
            rp_sum[t] += rp
            vp_sum[t] += vp
            rep_sum[t] += math.sqrt(rp * vp)
