"""Brute-force float64 reference for the closed-set metrics of docs/metrics.md.

Written from the specification only, independently of the engine: it builds the full Nq x Ng
distance matrix, sorts every row by (distance, gallery index), drops junk and reads the ranks of the
positives off the sorted list.  Deliberately plain and slow: it only runs on small test problems.
"""

from __future__ import annotations

import math

import numpy as np

METRICS = ("euclidean", "sqeuclidean", "cosine")
PROTOCOLS = ("market", "none")


def distance_matrix(qf, gf, metric: str) -> np.ndarray:
    """Nq x Ng distances in float64, with the formulas of docs/metrics.md#1-inputs-and-distances.

    ``qf``/``gf`` are the features as stored; every sum is taken in float64, term by term.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}")
    qf = np.asarray(qf, dtype=np.float64)
    gf = np.asarray(gf, dtype=np.float64)
    nq, ng = qf.shape[0], gf.shape[0]

    def sumsq(v):
        acc = 0.0
        for x in v:
            acc += float(x) * float(x)
        return acc

    q_sq = [sumsq(q) for q in qf]
    g_sq = [sumsq(g) for g in gf]
    dist = np.empty((nq, ng), dtype=np.float64)
    for i in range(nq):
        for j in range(ng):
            dot = 0.0
            for a, b in zip(qf[i], gf[j]):
                dot += float(a) * float(b)
            if metric == "cosine":
                dist[i, j] = 1.0 - dot / (math.sqrt(q_sq[i]) * math.sqrt(g_sq[j]))
            else:
                d = max(q_sq[i] + g_sq[j] - 2.0 * dot, 0.0)
                dist[i, j] = math.sqrt(d) if metric == "euclidean" else d
    return dist


def query_ranks(dist_row, q_pid, q_cam, g_pids, g_camids, protocol: str, junk_pids) -> list[int]:
    """1-based ranks of the positives of one query in its ranked list of non-junk gallery items."""
    order = np.lexsort((np.arange(dist_row.shape[0]), dist_row))  # by distance, then gallery index
    junk = set(int(p) for p in junk_pids)
    ranks = []
    rank = 0
    for g in order:
        g_pid, g_cam = int(g_pids[g]), int(g_camids[g])
        if g_pid in junk:
            continue
        if protocol == "market" and g_pid == q_pid and g_cam == q_cam:
            continue
        rank += 1  # a kept (non-junk) item
        if g_pid == q_pid:
            ranks.append(rank)
    return ranks


def ap_rectangle(ranks) -> float:
    return sum(j / r for j, r in enumerate(ranks, start=1)) / len(ranks)


def ap_trapezoid(ranks) -> float:
    total = 0.0
    for j, r in enumerate(ranks, start=1):
        previous = 1.0 if r == 1 else (j - 1) / (r - 1)
        total += (previous + j / r) / 2
    return total / len(ranks)


def inp(ranks) -> float:
    return len(ranks) / ranks[-1]


def reference_evaluate(qf, q_pids, q_camids, gf, g_pids, g_camids, *, metric="euclidean",
                       protocol="market", junk_pids=(-1,), max_rank=50) -> dict:
    """Every closed-set number of docs/metrics.md#4-closed-set-metrics-cmc-ap-inp, plus per-query arrays.

    Open-set queries (no positive) get NaN AP/INP and first-hit rank -1, and are left out of the
    means; with no valid query at all, cmc and the means are None.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}")
    dist = distance_matrix(qf, gf, metric)
    nq = dist.shape[0]
    per_query = {
        "ap": np.full(nq, np.nan), "ap_trapezoid": np.full(nq, np.nan), "inp": np.full(nq, np.nan),
        "first_hit_rank": np.full(nq, -1, dtype=np.int64), "n_positives": np.zeros(nq, dtype=np.int64),
    }
    valid = []
    for i in range(nq):
        ranks = query_ranks(dist[i], int(q_pids[i]), int(q_camids[i]), g_pids, g_camids, protocol, junk_pids)
        per_query["n_positives"][i] = len(ranks)
        if not ranks:
            continue
        valid.append(i)
        per_query["ap"][i] = ap_rectangle(ranks)
        per_query["ap_trapezoid"][i] = ap_trapezoid(ranks)
        per_query["inp"][i] = inp(ranks)
        per_query["first_hit_rank"][i] = ranks[0]
    out = {
        "n_queries": nq, "n_valid_queries": len(valid), "n_open_queries": nq - len(valid),
        "n_gallery": dist.shape[1], "per_query": per_query, "distances": dist,
    }
    if not valid:
        out.update(cmc=None, mAP=None, mAP_trapezoid=None, mINP=None)
        return out
    cmc = np.zeros(max_rank)
    for i in valid:
        for k in range(1, max_rank + 1):
            if per_query["first_hit_rank"][i] <= k:
                cmc[k - 1] += 1
    out.update(
        cmc=cmc / len(valid),
        mAP=sum(per_query["ap"][i] for i in valid) / len(valid),
        mAP_trapezoid=sum(per_query["ap_trapezoid"][i] for i in valid) / len(valid),
        mINP=sum(per_query["inp"][i] for i in valid) / len(valid),
    )
    return out


def reference_gom(dist, q_pids, q_camids, g_pids, g_camids, *, protocol="market", junk_pids=(-1,),
                  norm="minmax", bins=100, b=3000, vp="reference") -> dict:
    """The GOM family of docs/metrics.md#5-open-set-metrics-gom, literally, from the full distance matrix.

    ``norm``: "minmax", "none" or (LO, HI) for fixed.
    """
    normed, dmin, dmax = normalised(np.asarray(dist, dtype=np.float64), norm)
    tau = np.array([i * (1.0 / bins) for i in range(bins + 1)])
    junk_set = set(int(p) for p in junk_pids)
    queries = []
    for i in range(dist.shape[0]):
        q_pid, q_cam = int(q_pids[i]), int(q_camids[i])
        is_junk = np.array([
            int(p) in junk_set or (protocol == "market" and int(p) == q_pid and int(c) == q_cam)
            for p, c in zip(g_pids, g_camids)
        ], dtype=bool)
        ranks = query_ranks(dist[i], q_pid, q_cam, g_pids, g_camids, protocol, junk_pids)
        # positives in rank order with their normalised distances
        order = np.lexsort((np.arange(dist.shape[1]), dist[i]))
        positive_order = [g for g in order if not is_junk[g] and int(g_pids[g]) == q_pid]
        queries.append((list(normed[i][~is_junk]), [normed[i, g] for g in positive_order], ranks, int(is_junk.sum())))
    return {"tau": tau, "dmin": dmin, "dmax": dmax, **gom_of_queries(queries, tau, b, vp)}


def normalised(dist: np.ndarray, norm):
    """(d~ of every pair, dmin, dmax) for ``norm`` "minmax" (over these pairs), "none" or (LO, HI);
    dmin and dmax are None without pairs."""
    dmin = float(dist.min()) if dist.size else None
    dmax = float(dist.max()) if dist.size else None
    if norm == "minmax":
        return ((dist - dmin) / (dmax - dmin) if dist.size and dmax > dmin else np.zeros_like(dist)), dmin, dmax
    if norm == "none":
        return dist, dmin, dmax
    lo, hi = norm
    return np.clip((dist - lo) / (hi - lo), 0.0, 1.0), dmin, dmax


def gom_of_queries(queries, tau, b, vp) -> dict:
    """GOM curves and summaries (docs/metrics.md#53-per-query-quantities, #54-mean-curves-and-summaries) of ``queries``: per query (d~ of its kept rows,
    d~ of its positives in rank order, their ranks, its number of junk rows)."""
    bins = tau.shape[0] - 1
    sums = {name: np.zeros(bins + 1) for name in ("rp", "vp", "rep", "fr")}
    n_valid = n_open = 0
    for kept, positives, ranks, n_junk in queries:
        n = len(positives)
        for t, threshold in enumerate(tau):
            returned = sum(1 for d in kept if d <= threshold) + (n_junk if threshold >= 1 else 0)
            if n == 0:
                sums["fr"][t] += min(returned, b) / b
                continue
            hits = [j for j, d in enumerate(positives, start=1) if d <= threshold]
            tp = len(hits)
            rp = sum(j / ranks[j - 1] for j in hits) / tp if tp else 0.0
            cap = returned if vp == "jaccard" else min(returned, ranks[-1])
            vp_value = tp / (cap - tp + n)
            sums["rp"][t] += rp
            sums["vp"][t] += vp_value
            sums["rep"][t] += math.sqrt(rp * vp_value)
        if n:
            n_valid += 1
        else:
            n_open += 1

    def trapezoid(curve):
        return sum((tau[k + 1] - tau[k]) * (curve[k] + curve[k + 1]) / 2 for k in range(bins))

    out = {"mRP": None, "mVP": None, "mReP": None, "mReP_max": None, "tau_max": None, "mVP_max": None, "MREP": None,
           "mFR": None, "MFR": None, "tau_nz": None}
    if n_valid:
        m_rep = sums["rep"] / n_valid
        best = max(m_rep)
        out.update(mRP=sums["rp"] / n_valid, mVP=sums["vp"] / n_valid, mReP=m_rep, mReP_max=best,
                   tau_max=float(tau[list(m_rep).index(best)]), mVP_max=max(sums["vp"] / n_valid),
                   MREP=trapezoid(m_rep))
    if n_open:
        m_fr = sums["fr"] / n_open
        nonzero = [float(tau[k]) for k in range(bins + 1) if m_fr[k] > 0]
        out.update(mFR=m_fr, MFR=trapezoid(m_fr), tau_nz=nonzero[0] if nonzero else None)
    return out
