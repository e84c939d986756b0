"""Dense float64 brute-force reference for k-reciprocal re-ranking and average query expansion
(PROTOCOLS.md 6.1 and 6.3), written from the spec, independently of the engine.

It builds the full N x N matrices over U = queries then gallery, sorts every row by (key, index)
with a stable sort, and follows the spec's steps one by one with Python sets.  Deliberately plain
and slow: it only runs on small test problems.  The flavour (B, L1, h, w, A, clamp) comes from the
flavours table, ``streameval.features.rerank.flavours.FLAVOURS``.
"""

from __future__ import annotations

import numpy as np

from streameval.features.rerank.flavours import FLAVOURS
from streameval.protocols import resolve

from protocol_reference import kept_in_key_order, positive_ranks
from reference import ap_rectangle


def base_distance(x, y, metric: str) -> np.ndarray:
    """The engine's canonical float64 distance (streameval/engine/kernels.py): each dot product
    summed in a fixed order - four partial sums over k = 0, 1, 2, 3 (mod 4), added as
    (s0 + s1) + (s2 + s3), then the tail - and each row's term |x|^2 summed k = 0, 1, ...;
    "cosine" d = 1 - x.y / (|x| |y|), "sqeuclidean" d = max(|x|^2 + |y|^2 - 2 x.y, 0).  (For
    integer-valued features every sum is exact, whatever the order.)"""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    dots = fixed_order_dots(x, y)
    tx, ty = squared_norms(x), squared_norms(y)
    if metric == "cosine":  # rounded below 0 (parallel rows): 0, as the engine's kNN pass counts it
        return np.maximum(1.0 - dots / (np.sqrt(tx)[:, None] * np.sqrt(ty)[None, :]), 0.0)
    if metric == "sqeuclidean":
        return np.maximum(tx[:, None] + ty[None, :] - 2.0 * dots, 0.0)
    raise ValueError(f"no canonical distance for {metric!r}")


def fixed_order_dots(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    dim = x.shape[1]
    full = dim - dim % 4
    partial = [np.zeros((x.shape[0], y.shape[0])) for _ in range(4)]
    for k in range(full):
        partial[k % 4] += x[:, k, None] * y[None, :, k]
    dots = (partial[0] + partial[1]) + (partial[2] + partial[3])
    for k in range(full, dim):
        dots += x[:, k, None] * y[None, :, k]
    return dots


def squared_norms(x: np.ndarray) -> np.ndarray:
    total = np.zeros(x.shape[0])
    for k in range(x.shape[1]):
        total += x[:, k] * x[:, k]
    return total


def stable_order(keys: np.ndarray) -> np.ndarray:
    """Each row's columns by (key, column) ascending: ties by index."""
    columns = np.arange(keys.shape[1])
    return np.stack([np.lexsort((columns, row)) for row in keys])


def reciprocal(order: np.ndarray, i: int, length: int) -> set[int]:
    """R(i; L) = {j in top(i, L) : i in top(j, L)}."""
    return {int(j) for j in order[i, :length] if i in order[j, :length]}


def expanded_set(order: np.ndarray, i: int, l1: int, h: int) -> list[int]:
    """R*(i) (6.1 step 1), sorted."""
    base = reciprocal(order, i, l1)
    rstar = set(base)
    for c in base:
        candidate = reciprocal(order, c, h)
        if 3 * len(candidate & base) > 2 * len(candidate):
            rstar |= candidate
    return sorted(rstar)


def rerank_reference(qf, gf, flavour, metric: str = "cosine", k1: int = 20, k2: int = 6, lam: float = 0.3) -> dict:
    """final (Q x G) and its intermediates for ``flavour`` (a name or a Flavour of the table)."""
    flavour = FLAVOURS[flavour] if isinstance(flavour, str) else flavour
    nq = np.asarray(qf).shape[0]
    u = np.concatenate([np.asarray(qf, dtype=np.float64), np.asarray(gf, dtype=np.float64)])
    n = u.shape[0]
    d = base_distance(u, u, flavour.base_metric(metric))
    np.fill_diagonal(d, 0.0)
    b = flavour.b(d, metric)
    rowmax = b.max(axis=1)
    order = stable_order(b)
    l1, h = flavour.lists(k1), flavour.expansion(k1)

    rstar = [np.array(expanded_set(order, i, l1, h), dtype=np.int64) for i in range(n)]
    w = np.exp(-b / rowmax[:, None]) if flavour.normalised else np.exp(-b)
    v = np.zeros((n, n))
    for i in range(n):
        v[i, rstar[i]] = w[i, rstar[i]] / w[i, rstar[i]].sum()
    if k2 != 1:
        v = np.stack([v[order[i, :k2]].sum(axis=0) / k2 for i in range(n)])

    s = np.array([[np.minimum(v[q], v[nq + g]).sum() for g in range(n - nq)] for q in range(nq)])
    jaccard = 1.0 - s / (2.0 - s)
    if flavour.clamp:
        jaccard = np.maximum(jaccard, 0.0)
    a = b[:nq, nq:] / rowmax[:nq, None] if flavour.normalised else d[:nq, nq:]
    return {"final": (1.0 - lam) * jaccard + lam * a, "jaccard": jaccard, "a": a, "rstar": rstar, "v": v, "L1": l1, "h": h,
            "n_candidates": int((jaccard < 1.0).sum())}


def aqe_reference(qf, gf, k: int = 5, alpha: float = 3.0, times: int = 1):
    """Average query expansion (6.3): each item of U becomes the mean of its top-k items' current
    (unnormalised) features weighted by s^alpha, k by (-s, index) over all of U, itself included;
    s is the cosine similarity 1 - d of the canonical cosine distance (s(i, i) = 1)."""
    nq = np.asarray(qf).shape[0]
    f = np.concatenate([np.asarray(qf, dtype=np.float64), np.asarray(gf, dtype=np.float64)])
    for _ in range(times):
        d = base_distance(f, f, "cosine")
        np.fill_diagonal(d, 0.0)
        s = 1.0 - d
        top = stable_order(-s)[:, :k]
        f = np.stack([(f[top[i]] * s[i, top[i], None] ** alpha).sum(axis=0) / k for i in range(f.shape[0])])
    return f[:nq], f[nq:]


def evaluate_matrix(final, q_pids, q_camids, g_pids, g_camids, junk_pids=(-1,), k: int = 10) -> dict:
    """Per query under the market protocol (docs/protocols.md, via protocol_reference): AP (NaN
    without positives), first-hit rank (-1 without), and the top-k kept gallery rows with their values."""
    protocol = resolve("market", junk_pids=tuple(junk_pids))
    gallery = set(range(final.shape[1]))
    out = {"ap": [], "first_hit_rank": [], "top": [], "top_distance": []}
    for q in range(final.shape[0]):
        kept = kept_in_key_order(final[q], gallery, q, int(q_pids[q]), int(q_camids[q]), g_pids, g_camids,
                                 protocol, final.shape[1])
        ranks = positive_ranks(kept, int(q_pids[q]), g_pids)
        out["ap"].append(ap_rectangle(ranks) if ranks else np.nan)
        out["first_hit_rank"].append(ranks[0] if ranks else -1)
        out["top"].append(kept[:k])
        out["top_distance"].append([float(final[q, g]) for g in kept[:k]])
    return out
