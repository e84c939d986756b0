"""Brute-force float64 reference for protocols, trials and CMC flavours (docs/protocols.md).

Written from the specification only, independently of the engine and of ``streameval.protocols.draws``: the
seeded hash of docs/protocols.md#the-seeded-hash and every draw rule are re-implemented here on plain Python ints.  For
every (trial, query) it builds the kept set of docs/protocols.md#the-kept-set row by row, sorts it by (distance,
extended gallery index) and reads every metric off that list.  The expected single-gallery-shot
curve is the exact expectation over all draws, by enumerating them with ``fractions.Fraction``
(a plain Poisson-binomial programme only when there are too many draws to list).
Deliberately plain and slow: small problems only.

The extended gallery: rows 0..n_stored-1 are the stored gallery; with
``protocol.gallery_includes_queries`` query row i is also row n_stored + i (``extend_gallery``).
"""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import numpy as np
from reference import ap_rectangle, ap_trapezoid, gom_of_queries, inp, normalised

MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
SGS_TAG, TRIAL_TAG = 1, 2
SGS_ENUMERATION_LIMIT = 20_000  # joint draws listed one by one for the expected sgs curve
SCALARS = ("n_queries", "n_valid_queries", "n_open_queries", "mAP", "mAP_trapezoid", "mINP")
CURVES = ("cmc", "cmc_first_hit")
GOM_SCALARS = ("mReP_max", "tau_max", "mVP_max", "MREP", "MFR", "tau_nz")
GOM_CURVES = ("mRP", "mVP", "mReP", "mFR")


# ---- the seeded hash (docs/protocols.md#the-seeded-hash) -------------------------------------------

def mix64(z: int) -> int:
    z &= MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def seeded_hash(seed: int, *words: int) -> int:
    """H(seed; w_1 .. w_m); words are int64 values, so negative ints are read as two's complement."""
    h = mix64((seed & MASK64) + GAMMA)
    for word in words:
        h = mix64((h ^ (word & MASK64)) + GAMMA)
    return h


# ---- the extended gallery and the trial masks (docs/protocols.md) ---------------------------------

def extend_gallery(qf, q_pid, q_cam, gf, g_pid, g_cam, protocol):
    """(features, pids, cameras, n_stored) of the extended gallery: the stored rows, then the
    query rows when the protocol appends them."""
    gf, g_pid, g_cam = np.asarray(gf), np.asarray(g_pid), np.asarray(g_cam)
    n_stored = gf.shape[0]
    if not protocol.gallery_includes_queries:
        return gf, g_pid, g_cam, n_stored
    return (np.concatenate([gf, np.asarray(qf)]), np.concatenate([g_pid, np.asarray(q_pid)]),
            np.concatenate([g_cam, np.asarray(q_cam)]), n_stored)


def _in_cameras(camera: int, cameras) -> bool:
    return cameras is None or camera in set(int(c) for c in cameras)


def eligible_gallery_rows(g_cam, protocol) -> list[int]:
    return [g for g in range(len(g_cam)) if _in_cameras(int(g_cam[g]), protocol.gallery_cameras)]


def eligible_query_rows(q_cam, protocol) -> list[int]:
    return [i for i in range(len(q_cam)) if _in_cameras(int(q_cam[i]), protocol.query_cameras)]


def draw_trial_galleries(g_pid, g_cam, rows, trials) -> list[set[int]]:
    """Source ``draw``: per group (pid, or pid and camera) the ``shots`` rows with the smallest
    (H(seed; 2, t, idx), idx)."""
    groups: dict = {}
    for g in rows:
        key = int(g_pid[g]) if trials.group == "pid" else (int(g_pid[g]), int(g_cam[g]))
        groups.setdefault(key, []).append(g)
    galleries = []
    for t in range(trials.count):
        chosen = set()
        for members in groups.values():
            by_hash = sorted(members, key=lambda g: (seeded_hash(trials.seed, TRIAL_TAG, t, g), g))
            chosen.update(by_hash[:trials.shots])
        galleries.append(chosen)
    return galleries


def mangye16_trial_galleries(g_pid, g_cam, rows, trials) -> list[set[int]]:
    """Source ``mangye16-random``, as upstream: ``random.seed(t)``, pids ascending, cameras in the
    given order, pairs without rows skipped, one ``random.choice`` over the pair's rows."""
    if trials.shots != 1:
        raise ValueError("mangye16-random is single-shot only")
    cameras = [int(c) for c in trials.cameras] or sorted({int(g_cam[g]) for g in rows})
    pids = sorted({int(g_pid[g]) for g in rows})
    galleries = []
    for t in range(trials.count):
        random.seed(t)
        chosen = set()
        for pid in pids:
            for camera in cameras:
                pair_rows = [g for g in rows if int(g_pid[g]) == pid and int(g_cam[g]) == camera]
                if pair_rows:
                    chosen.add(random.choice(pair_rows))
        galleries.append(chosen)
    return galleries


def official_trial_galleries(g_pid, g_cam, rows, trials, table) -> list[set[int]]:
    """Source ``official``: ``table[t][(camera, pid)]`` lists 1-based ordinals among the extended
    gallery rows of that camera and pid (ascending row order); a trial takes the first ``shots``."""
    if table is None:
        raise ValueError("source official needs official_table")
    eligible = set(rows)
    galleries = []
    for t in range(trials.count):
        chosen = set()
        for (camera, pid), ordinals in table[t].items():
            pair_rows = [g for g in range(len(g_pid)) if int(g_pid[g]) == pid and int(g_cam[g]) == camera]
            for ordinal in ordinals[:trials.shots]:
                if not 1 <= ordinal <= len(pair_rows):
                    raise ValueError(f"trial {t}: camera {camera} pid {pid} has no image {ordinal}")
                if pair_rows[ordinal - 1] in eligible:
                    chosen.add(pair_rows[ordinal - 1])
        galleries.append(chosen)
    return galleries


def trial_galleries(g_pid, g_cam, protocol, official_table=None) -> list[set[int]]:
    """M_t for t = 0..T-1 over the extended gallery; T = 1 (every eligible row) without trials."""
    rows = eligible_gallery_rows(g_cam, protocol)
    trials = protocol.trials
    if trials is None:
        return [set(rows)]
    if trials.source == "draw":
        return draw_trial_galleries(g_pid, g_cam, rows, trials)
    if trials.source == "mangye16-random":
        return mangye16_trial_galleries(g_pid, g_cam, rows, trials)
    if trials.source == "official":
        return official_trial_galleries(g_pid, g_cam, rows, trials, official_table)
    raise ValueError(f"unknown trial source {trials.source!r}")


def trial_queries(q_cam, galleries, protocol, n_stored) -> list[set[int]]:
    """The queries of each trial: the eligible ones, or (``not-in-gallery``) those whose copy row is
    outside the trial's gallery."""
    rows = eligible_query_rows(q_cam, protocol)
    if protocol.trials is None or protocol.trials.queries == "all":
        return [set(rows) for _ in galleries]
    if not protocol.gallery_includes_queries:
        raise ValueError("queries not-in-gallery needs gallery_includes_queries")
    return [{i for i in rows if n_stored + i not in gallery} for gallery in galleries]


# ---- the kept set and one query's ranked list (docs/protocols.md) ---------------------------------

def _relation_holds(relation, q_cam: int, g_cam: int) -> bool:
    if relation.equal:
        return q_cam == g_cam
    return (q_cam, g_cam) in set((int(a), int(b)) for a, b in relation.pairs)


def is_kept(g, gallery, q_row, q_pid, q_cam, g_pid, g_cam, protocol, n_stored) -> bool:
    pid, camera = int(g_pid[g]), int(g_cam[g])
    own_copy = protocol.gallery_includes_queries and g == n_stored + q_row
    return (g in gallery
            and pid not in set(int(p) for p in protocol.junk_pids)
            and not (pid == q_pid and _relation_holds(protocol.x_same, q_cam, camera))
            and not _relation_holds(protocol.x_any, q_cam, camera)
            and not own_copy)


def kept_in_key_order(dist_row, gallery, q_row, q_pid, q_cam, g_pid, g_cam, protocol, n_stored) -> list[int]:
    order = sorted(range(len(dist_row)), key=lambda g: (float(dist_row[g]), g))  # key(g) of docs/protocols.md#the-kept-set
    return [g for g in order if is_kept(g, gallery, q_row, q_pid, q_cam, g_pid, g_cam, protocol, n_stored)]


def positive_ranks(kept, q_pid, g_pid) -> list[int]:
    return [rank for rank, g in enumerate(kept, start=1) if int(g_pid[g]) == q_pid]


def identity_dedup_rho(kept, q_pid, g_pid) -> int:
    """Position of the query's identity once the kept list is collapsed to identities in order of
    first appearance (upstream ``eval_sysu``'s unique-by-pid)."""
    identities = []
    for g in kept:
        if int(g_pid[g]) not in identities:
            identities.append(int(g_pid[g]))
    return identities.index(q_pid) + 1


def rows_by_identity(kept, g_pid) -> dict[int, list[int]]:
    """Kept rows of each identity, by gallery index (the order the sgs draw indexes)."""
    rows: dict[int, list[int]] = {}
    for g in sorted(kept):
        rows.setdefault(int(g_pid[g]), []).append(g)
    return rows


def sgs_drawn_rows(kept, q_row, g_pid, repeat: int, seed: int) -> dict[int, int]:
    """{identity j: its drawn row g_u, u = H(seed; 1, r, i, j) mod n_j} for one query and repeat."""
    return {j: rows[seeded_hash(seed, SGS_TAG, repeat, q_row, j) % len(rows)]
            for j, rows in rows_by_identity(kept, g_pid).items()}


def sgs_sampled_rho(kept, q_row, q_pid, g_pid, repeat: int, seed: int) -> int:
    position = {g: p for p, g in enumerate(kept)}
    drawn = sgs_drawn_rows(kept, q_row, g_pid, repeat, seed)
    return 1 + sum(1 for j, s in drawn.items() if j != q_pid and position[s] < position[drawn[q_pid]])


def _rho_distribution_by_enumeration(kept, q_pid, g_pid) -> dict[int, Fraction]:
    position = {g: p for p, g in enumerate(kept)}
    identities = rows_by_identity(kept, g_pid)
    others = [j for j in identities if j != q_pid]
    total = math.prod(len(rows) for rows in identities.values())
    counts: dict[int, int] = {}
    for drawn in itertools.product(*(identities[j] for j in [q_pid] + others)):
        rho = 1 + sum(1 for s in drawn[1:] if position[s] < position[drawn[0]])
        counts[rho] = counts.get(rho, 0) + 1
    return {rho: Fraction(count, total) for rho, count in counts.items()}


def _rho_distribution_by_dp(kept, q_pid, g_pid) -> dict[int, Fraction]:
    position = {g: p for p, g in enumerate(kept)}
    identities = rows_by_identity(kept, g_pid)
    positives = identities[q_pid]
    out: dict[int, Fraction] = {}
    for p in positives:
        before = [Fraction(sum(1 for g in rows if position[g] < position[p]), len(rows))
                  for j, rows in identities.items() if j != q_pid]
        distribution = [Fraction(1)]  # Pr[m identities drawn before p]
        for b in before:
            distribution = [(distribution[m] if m < len(distribution) else 0) * (1 - b)
                            + (distribution[m - 1] * b if m >= 1 else 0)
                            for m in range(len(distribution) + 1)]
        for m, probability in enumerate(distribution):
            out[m + 1] = out.get(m + 1, Fraction(0)) + probability / len(positives)
    return out


def sgs_expected_curve(kept, q_pid, g_pid, max_rank: int, enumeration_limit=SGS_ENUMERATION_LIMIT) -> list[Fraction]:
    """CMC_q(k) = Pr[rho <= k] over the joint single-gallery-shot draw, exactly."""
    draws = math.prod(len(rows) for rows in rows_by_identity(kept, g_pid).values())
    if draws <= enumeration_limit:
        distribution = _rho_distribution_by_enumeration(kept, q_pid, g_pid)
    else:
        distribution = _rho_distribution_by_dp(kept, q_pid, g_pid)
    return [sum((pr for rho, pr in distribution.items() if rho <= k), Fraction(0)) for k in range(1, max_rank + 1)]


def step_curve(rank: int, max_rank: int) -> np.ndarray:
    """[rank <= k] for k = 1..max_rank."""
    return np.array([1.0 if rank <= k else 0.0 for k in range(1, max_rank + 1)])


# ---- GOM per trial (docs/metrics.md#5-open-set-metrics-gom on the trial's pairs) --------------

def trial_gom(dist, queries, gallery, kept_of, g_pid, q_pid, *, norm="minmax", bins=100, b=3000, vp="reference"):
    """The GOM family over the trial's queries x the trial's gallery rows; a gallery row that is
    not kept for a query is that query's junk (returned only at tau >= 1)."""
    queries, columns = sorted(queries), sorted(gallery)
    block = np.array([[float(dist[i, g]) for g in columns] for i in queries], dtype=np.float64)
    block = block.reshape(len(queries), len(columns))
    normed, dmin, dmax = normalised(block, norm)
    tau = np.array([k * (1.0 / bins) for k in range(bins + 1)])
    per_query = []
    for a, i in enumerate(queries):
        kept = kept_of[i]
        normed_of = {g: normed[a, c] for c, g in enumerate(columns)}
        positives = [g for g in kept if int(g_pid[g]) == int(q_pid[i])]
        per_query.append(([normed_of[g] for g in kept], [normed_of[g] for g in positives],
                          positive_ranks(kept, int(q_pid[i]), g_pid), len(columns) - len(kept)))
    return {"tau": tau, "dmin": dmin, "dmax": dmax, **gom_of_queries(per_query, tau, b, vp)}


# ---- statistics over trials (docs/protocols.md#reporting-trials) -----------------------------------

def trial_statistics(values, ddof: int = 1) -> dict:
    """mean, std (ddof), sem = s / sqrt(T) with the Bessel-corrected s, min, max of per-trial
    scalars or equal-length curves; std and sem are None for T = 1."""
    x = np.array([np.asarray(v, dtype=np.float64) for v in values])
    count = x.shape[0]
    mean = x.sum(axis=0) / count
    out = {"mean": mean, "min": x.min(axis=0), "max": x.max(axis=0), "std": None, "sem": None}
    if count > 1:
        squares = ((x - mean) ** 2).sum(axis=0)
        out["std"] = np.sqrt(squares / (count - ddof))
        out["sem"] = np.sqrt(squares / (count - 1)) / math.sqrt(count)
    if x.ndim == 1:
        out = {k: (None if v is None else float(v)) for k, v in out.items()}
    return out


def _statistics_over_trials(per_trial, ddof) -> dict:
    """{statistic: {key: value}} for every scalar and curve (GOM ones under "gom"); a key is taken
    over the trials where it is not None (None when there is none); std and sem are None for T = 1."""
    out = {name: {} for name in ("mean", "std", "sem", "min", "max")}
    for nested, keys in ((False, SCALARS + CURVES), (True, GOM_SCALARS + GOM_CURVES)):
        if nested and per_trial[0]["gom"] is None:
            continue
        for key in keys:
            values = [(entry["gom"] if nested else entry)[key] for entry in per_trial]
            values = [v for v in values if v is not None]
            stats = trial_statistics(values, ddof) if values else dict.fromkeys(out)
            for name in out:
                (out[name].setdefault("gom", {}) if nested else out[name])[key] = stats[name]
    if len(per_trial) == 1:
        out["std"] = out["sem"] = None
    return out


# ---- the evaluation ---------------------------------------------------------------------------

def _closed_set_mean(values, n_queries: int, denominator: str):
    """Section 1.4: the sum over Q+ divided by |Q+| (skip) or by every query of the trial (zero)."""
    if not values:
        return None
    total = values[0] * 0.0
    for v in values:
        total = total + v
    return total / (len(values) if denominator == "skip" else n_queries)


def _query_record(kept, q_pid, g_pid, max_rank):
    ranks = positive_ranks(kept, q_pid, g_pid)
    if not ranks:
        return {"n_positives": 0}
    return {"n_positives": len(ranks), "ranks": ranks, "ap": ap_rectangle(ranks), "ap_trapezoid": ap_trapezoid(ranks),
            "inp": inp(ranks), "first_hit_rank": ranks[0], "rho": identity_dedup_rho(kept, q_pid, g_pid),
            "cmc_first_hit": step_curve(ranks[0], max_rank)}


def _trial_entry(records, queries, nq, denominator, flavour_curve):
    """One per-trial result from the per-query records; ``flavour_curve(i)`` is CMC_q of the
    protocol's flavour for a valid query i."""
    valid = sorted(i for i in queries if records[i]["n_positives"])
    per_query = {"in_trial": np.zeros(nq, dtype=bool), "n_positives": np.full(nq, -1, dtype=np.int64)}
    for name in ("ap", "ap_trapezoid", "inp"):
        per_query[name] = np.full(nq, np.nan)
    for name in ("first_hit_rank", "rho"):
        per_query[name] = np.full(nq, -1, dtype=np.int64)
    for i in queries:
        per_query["in_trial"][i] = True
        per_query["n_positives"][i] = records[i]["n_positives"]
    for i in valid:
        for name in ("ap", "ap_trapezoid", "inp", "first_hit_rank", "rho"):
            per_query[name][i] = records[i][name]
    n_queries = len(queries)

    def mean(values):
        return _closed_set_mean(values, n_queries, denominator)

    return {
        "n_queries": n_queries, "n_valid_queries": len(valid), "n_open_queries": n_queries - len(valid),
        "cmc": mean([flavour_curve(i) for i in valid]),
        "cmc_first_hit": mean([records[i]["cmc_first_hit"] for i in valid]),
        "mAP": mean([records[i]["ap"] for i in valid]),
        "mAP_trapezoid": mean([records[i]["ap_trapezoid"] for i in valid]),
        "mINP": mean([records[i]["inp"] for i in valid]),
        "per_query": per_query,
    }


def reference_protocol(dist, q_pid, q_cam, g_pid, g_cam, protocol, *, max_rank=50, gom=None, n_stored=None,
                       official_table=None, std_ddof=1, sgs_enumeration_limit=SGS_ENUMERATION_LIMIT) -> dict:
    """Every number of docs/protocols.md for one protocol, literally.

    ``dist``: Nq x N_ext float64 distances over the extended gallery; ``g_pid``/``g_cam``: the
    extended gallery's ids (``extend_gallery``); ``n_stored``: stored gallery rows (default N_ext - Nq
    when the protocol appends the queries, else N_ext).  ``gom``: None or dict(norm="minmax" | "none"
    | (lo, hi), bins, b, vp), computed per trial.  ``official_table``: {t: {(camera, pid): [1-based
    ordinals]}} for trial source ``official``.

    Returns {"T", "std_ddof", "cmc_flavour", "per_trial": [...], "mean", "std", "sem", "min", "max",
    "trial_galleries", "trial_queries"}, plus for cmc = sgs with mode expected or both
    "cmc_sgs_expected" and "sgs_expected_per_query" (Nq x max_rank, NaN rows outside Q+).
    A per-trial entry holds n_queries, n_valid_queries, n_open_queries, cmc (the protocol's
    flavour), cmc_first_hit, mAP, mAP_trapezoid, mINP (None with Q+ empty), gom (or None) and
    per_query = {in_trial, n_positives (-1 outside the trial), ap, ap_trapezoid, inp (NaN outside
    Q+), first_hit_rank, rho (identity-dedup; -1 outside Q+)}; with sgs sampled one entry per
    repeat, which adds "repeat" and per_query "rho_sgs" (that repeat's rho).
    """
    dist = np.asarray(dist, dtype=np.float64)
    nq, n_ext = dist.shape
    if n_stored is None:
        n_stored = n_ext - nq if protocol.gallery_includes_queries else n_ext
    if protocol.cmc == "sgs" and protocol.trials is not None:
        raise ValueError("the reference does not combine sgs repeats with trials")
    galleries = trial_galleries(g_pid, g_cam, protocol, official_table)
    queries_of = trial_queries(q_cam, galleries, protocol, n_stored)
    sgs = protocol.sgs
    out = {"T": len(galleries), "std_ddof": std_ddof, "cmc_flavour": protocol.cmc,
           "trial_galleries": [sorted(g) for g in galleries], "trial_queries": [sorted(q) for q in queries_of]}
    per_trial = []
    for t, (gallery, queries) in enumerate(zip(galleries, queries_of)):
        kept_of = {i: kept_in_key_order(dist[i], gallery, i, int(q_pid[i]), int(q_cam[i]), g_pid, g_cam,
                                        protocol, n_stored) for i in queries}
        records = {i: _query_record(kept_of[i], int(q_pid[i]), g_pid, max_rank) for i in queries}
        gom_result = None if gom is None else trial_gom(dist, queries, gallery, kept_of, g_pid, q_pid, **gom)

        def entry(flavour_curve):
            result = _trial_entry(records, queries, nq, protocol.denominator, flavour_curve)
            result.update(trial=t, gom=gom_result)
            return result

        if protocol.cmc == "first-hit":
            per_trial.append(entry(lambda i: records[i]["cmc_first_hit"]))
        elif protocol.cmc == "identity-dedup":
            per_trial.append(entry(lambda i: step_curve(records[i]["rho"], max_rank)))
        else:
            valid = [i for i in sorted(queries) if records[i]["n_positives"]]
            expected = {i: sgs_expected_curve(kept_of[i], int(q_pid[i]), g_pid, max_rank, sgs_enumeration_limit)
                        for i in valid} if sgs.mode in ("expected", "both") else {}
            if sgs.mode in ("sampled", "both"):
                for r in range(sgs.repeats):
                    rho = {i: sgs_sampled_rho(kept_of[i], i, int(q_pid[i]), g_pid, r, sgs.seed) for i in valid}
                    repeat_entry = entry(lambda i: step_curve(rho[i], max_rank))
                    repeat_entry["repeat"] = r
                    repeat_entry["per_query"]["rho_sgs"] = np.array([rho.get(i, -1) for i in range(nq)], dtype=np.int64)
                    per_trial.append(repeat_entry)
            else:
                per_trial.append(entry(lambda i: np.array([float(p) for p in expected[i]])))
            if sgs.mode in ("expected", "both"):
                curves = np.full((nq, max_rank), np.nan)
                for i, curve in expected.items():
                    curves[i] = [float(p) for p in curve]
                out["sgs_expected_per_query"] = curves
                out["cmc_sgs_expected"] = _closed_set_mean([curves[i] for i in valid], len(queries),
                                                           protocol.denominator)
    out["T"] = len(per_trial)
    out["per_trial"] = per_trial
    out.update(_statistics_over_trials(per_trial, std_ddof))
    return out
