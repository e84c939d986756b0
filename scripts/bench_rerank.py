"""The re-ranking mode of scripts/bench.py (``--rerank [FLAVOUR]``, issue 26): k-reciprocal re-ranking
on an MSMT17-shaped synthetic store (11,659 queries + 82,161 gallery rows, D = 2,048 and 256,
float16; ``--rerank-scale S`` shrinks both row counts and the identities by S, ``--size`` replaces
the shapes), side by side in one run:

* ``rerank``: ``streameval eval STORE --rerank FLAVOUR -q --metric M`` as the process a user runs
  (spawn to exit, peak RSS from wait4), one untimed warm-up run (numba's cache), then the best of
  ``--repeat``; with ``--against REV`` the same command of REV's streameval, the rounds of both
  sides interleaved;
* ``uu-floor``: the bare U x U GEMM over the same data: U = queries then gallery (N rows), U x U in
  float32 over evaluate's chunk plan, read, GEMM and norm combination as bench.py's floor computes
  query x gallery: the one quadratic step of re-ranking, a lower bound for any exact re-ranking;
* ``dense``: the dense re-ranking of the public codebases (torchreid's ``re_ranking``: full N x N
  float32 distance, rank, V and V_qe matrices, numpy), in-process, at the largest N that fits this
  machine (3 float32 N x N arrays held at once, ``DENSE_MEMORY_SHARE`` of the available memory): on
  the first N rows of U, queries and gallery rows in U's proportion.

The goals (issue 26): ``rerank`` within 1.5x the ``uu-floor``, peak RSS < 2 GB.
"""

from __future__ import annotations

import os
import sys
import time

RERANK_METHODS = ("rerank", "uu-floor", "dense")
RERANK_CHILDREN = ("uu-floor", "dense")
RERANK_SIZES = ("11659x82161x2048:3060", "11659x82161x256:3060")  # MSMT17's test split: 3,060 identities
RERANK_DTYPE = "float16"
RERANK_K = {"k1": 20, "k2": 6, "lam": 0.3}  # streameval's defaults (and the dense reference's)
GOAL_OVER_FLOOR = 1.5
GOAL_RSS_MB = 2048
DENSE_ARRAYS = 3  # float32 N x N arrays the dense reference holds at once (see dense_rerank)
DENSE_MEMORY_SHARE = 0.8  # of MemAvailable: room for the interpreter, numpy's temporaries, the page cache


def scaled_sizes(scale: float) -> list[str]:
    """RERANK_SIZES with both row counts and the identities scaled by ``scale`` (at least 1 each)."""
    sizes = []
    for text in RERANK_SIZES:
        shape, ids = text.split(":")
        nq, ng, dim = (int(v) for v in shape.split("x"))
        nq, ng, ids = (max(1, round(v * scale)) for v in (nq, ng, int(ids)))
        sizes.append(f"{nq}x{ng}x{dim}:{ids}")
    return sizes


def dense_rows(n_query: int, n_gallery: int, available_bytes: int) -> int:
    """The largest N whose DENSE_ARRAYS float32 N x N arrays fit DENSE_MEMORY_SHARE of
    ``available_bytes``, at most all of U."""
    n = int((DENSE_MEMORY_SHARE * available_bytes / (4 * DENSE_ARRAYS)) ** 0.5)
    return min(n, n_query + n_gallery)


def dense_split(n: int, n_query: int, n_gallery: int) -> tuple[int, int]:
    """(queries, gallery rows) of the first n rows of U in U's proportion, at least one of each."""
    nq = min(n_query, max(1, round(n * n_query / (n_query + n_gallery))))
    return nq, min(n_gallery, n - nq)


def available_bytes() -> int:
    """MemAvailable (Linux), else the physical memory."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def u_rows(store):
    """rows(a, b) of U = queries then gallery, across the two sets' boundary."""
    import numpy as np

    nq = len(store.query)

    def rows(a: int, b: int):
        parts = []
        if a < nq:
            parts.append(np.asarray(store.query.features[a:min(b, nq)]))
        if b > nq:
            parts.append(np.asarray(store.gallery.features[max(a, nq) - nq:b - nq]))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    return rows


# --------------------------------------------------------------------------------------------------
# children


def run_uu_floor(args) -> dict:
    """bench.py's floor over U x U."""
    from bench import timed_floor
    from streameval.store import open_store

    store = open_store(args._store)
    n = len(store.query) + len(store.gallery)
    rows = u_rows(store)
    out = timed_floor(args, rows, n, rows, n, store.dim, store.gallery.features.dtype.itemsize,
                      store.gallery.chunk_rows)
    out["rows"] = n
    return out


def run_dense(args) -> dict:
    """The dense reference at the largest N that fits, timed from the store's rows to the final matrix."""
    import numpy as np

    from bench import Combiner, timed_runs
    from streameval.store import open_store

    store = open_store(args._store)
    n = dense_rows(len(store.query), len(store.gallery), available_bytes())
    nq, ng = dense_split(n, len(store.query), len(store.gallery))
    combine = Combiner("cosine" if args.metric == "cosine" else "sqeuclidean")

    def once():
        seconds = {}
        t = time.perf_counter()
        u = np.concatenate([np.asarray(store.query.features[:nq], np.float32),
                            np.asarray(store.gallery.features[:ng], np.float32)])
        seconds["load"] = time.perf_counter() - t
        final = dense_rerank(u, nq, args.metric, combine, seconds, **RERANK_K)
        return float(final.mean()), seconds

    out = timed_runs(once, args.repeat)
    out["checksum"] = out.pop("result")  # the final matrix's mean: it was computed in full
    out.update(rows=nq + ng, queries=nq, gallery=ng, available_gb=available_bytes() / 2**30,
               dense_bytes_per_array=4 * (nq + ng) ** 2)
    out["warmup"] = (f"first {nq} queries + {ng} gallery rows of U (N = {nq + ng:,}), "
                     f"from {out['available_gb']:.0f} GB available")
    return out


def dense_rerank(u, n_query: int, metric: str, combine, seconds: dict, k1: int, k2: int, lam: float):
    """torchreid's ``re_ranking`` (deep-person-reid utils/rerank.py) on U, the way the public codebases
    compute it: the full N x N float32 distance (squared again, as torchreid's engine passes squared
    distances), each row divided by its maximum, every row argsorted, V dense with the k-reciprocal
    weights, V averaged over the top-k2 rows, the Jaccard distance of the queries through an inverted
    index, final = (1 - lam) J + lam d.  Three N x N float32 arrays at most at once (distance, rank,
    V; then rank, V, V_qe).  Returns the query x gallery final distances."""
    import numpy as np

    from bench import classic_distmat

    n = len(u)
    t = time.perf_counter()
    dist = classic_distmat({"qf": u, "gf": u}, "cosine" if metric == "cosine" else "sqeuclidean", combine)
    np.square(dist, out=dist)
    dist /= dist.max(axis=1, keepdims=True)
    seconds["distance"] = time.perf_counter() - t

    t = time.perf_counter()
    rank = np.empty((n, n), np.int32)
    for a in range(0, n, 1024):  # argsort's int64 output a slab at a time
        rank[a:a + 1024] = np.argsort(dist[a:a + 1024], axis=1)
    seconds["argsort"] = time.perf_counter() - t

    t = time.perf_counter()
    h = int(np.around(k1 / 2.0)) + 1
    v = np.zeros((n, n), np.float32)
    for i in range(n):
        own = reciprocal(rank, i, k1 + 1)
        expansion = own
        for c in own:
            candidate = reciprocal(rank, c, h)
            if len(np.intersect1d(candidate, own)) > 2.0 / 3 * len(candidate):
                expansion = np.append(expansion, candidate)
        expansion = np.unique(expansion)
        weight = np.exp(-dist[i, expansion])
        v[i, expansion] = weight / weight.sum()
    query_dist = dist[:n_query].copy()
    del dist
    seconds["V"] = time.perf_counter() - t

    t = time.perf_counter()
    if k2 != 1:
        v_qe = np.empty_like(v)
        for i in range(n):
            v_qe[i] = v[rank[i, :k2]].mean(axis=0)
        v = v_qe
        del v_qe
    del rank
    seconds["query expansion"] = time.perf_counter() - t

    t = time.perf_counter()
    inverted = [np.flatnonzero(v[:, j]) for j in range(n)]
    jaccard = np.empty((n_query, n), np.float32)
    for i in range(n_query):
        overlap = np.zeros(n, np.float32)
        for j in np.flatnonzero(v[i]):
            rows = inverted[j]
            overlap[rows] += np.minimum(v[i, j], v[rows, j])
        jaccard[i] = 1 - overlap / (2 - overlap)
    seconds["jaccard"] = time.perf_counter() - t
    return (jaccard * (1 - lam) + query_dist * lam)[:, n_query:]


def reciprocal(rank, i: int, k: int):
    """The items of i's top-k that have i in their own top-k (rank: every row's argsort)."""
    forward = rank[i, :k]
    return forward[(rank[forward, :k] == i).any(axis=1)]


CHILD_RUNNERS = {"uu-floor": run_uu_floor, "dense": run_dense}


# --------------------------------------------------------------------------------------------------
# parent


def rerank_command(python: str, store: str, args) -> list:
    from bench import streameval_command

    return streameval_command(python) + ["eval", store, "--rerank", args.rerank, "-q", "--metric", args.metric]


def time_rerank_processes(sides: dict, args) -> dict:
    """{side: best process} of the re-ranking command of every side (``sides``: label -> (python,
    store)): one untimed warm-up run each, then ``--repeat`` rounds running every side in turn."""
    from bench import best_of_processes, time_process

    commands = {side: rerank_command(python, store, args) for side, (python, store) in sides.items()}
    runs = {side: [] for side in commands}
    failed = {}
    for side, cmd in commands.items():
        warm = time_process(cmd)
        if "error" in warm:
            failed[side] = {"error": warm["error"], "command": cmd}
    for _ in range(args.repeat):
        for side, cmd in commands.items():
            if side not in failed:
                runs[side].append(time_process(cmd))
    return {side: failed.get(side) or best_of_processes(runs[side], commands[side]) for side in commands}


def run_rerank_mode(args, size, store_path: str, how: str, rev) -> dict:
    """Every method side by side on one store; the table and the goals."""
    from bench import HEAD, REV, run_child
    from bench_against import revision_store

    rows = {}
    if "rerank" in args.methods:
        sides = {HEAD: (sys.executable, store_path)}
        if rev:
            sides[REV] = (rev.python, revision_store(rev, store_path, size)[0])
        for side, result in time_rerank_processes(sides, args).items():
            rows["rerank" if side == HEAD else f"rerank {REV}"] = result
    for method in RERANK_CHILDREN:
        if method in args.methods:
            rows[method] = run_child(args, method, store_path)
    nq, ng, dim, ids = size
    print(f"=== re-ranking {args.rerank} (k1 {RERANK_K['k1']}, k2 {RERANK_K['k2']}, lambda {RERANK_K['lam']}): "
          f"{nq:,} + {ng:,} = {nq + ng:,} rows x {dim} ({ids} ids, {args.dtype} store, metric {args.metric}) ===")
    print(f"store   : {store_path} ({how})")
    report_rerank(rows, nq + ng, args, rev)
    print()
    return {"size": {"n_query": nq, "n_gallery": ng, "dim": dim, "n_ids": ids}, "store": store_path,
            "store_status": how, "flavour": args.rerank, "rows": rows, "goals": rerank_goals(rows)}


def report_rerank(rows: dict, n: int, args, rev) -> None:
    floor = rows.get("uu-floor", {}).get("time_s")
    header = f"{'method':<16}{'rows':>10}{'time (s)':>11}{'peak RSS (MB)':>15}{'x U x U floor':>15}  what"
    print(header)
    print("-" * len(header))
    for name, row in rows.items():
        if "time_s" not in row:
            print(f"{name:<16}  FAILED: {row.get('error', '')}")
            continue
        rows_done = row.get("rows", n)
        over = row["time_s"] / floor if floor and rows_done == n else None
        print(f"{name:<16}{rows_done:>10,}{row['time_s']:>11.3f}{row['peak_rss_mb']:>15.0f}"
              f"{'-' if over is None else f'{over:.2f}x':>15}  {rerank_label(name, row, args, rev)}")
    dense = rows.get("dense", {})
    if "rows" in dense:
        full = 4 * DENSE_ARRAYS * n ** 2 / 2**30
        print(f"  dense at all {n:,} rows would hold {DENSE_ARRAYS} x 4 B x N^2 = {full:,.1f} GiB "
              f"(its {dense['rows']:,} rows: {DENSE_ARRAYS * dense['dense_bytes_per_array'] / 2**30:.1f} GiB)")
    for name, row in rows.items():
        if row.get("detail"):
            print(f"  {name}: " + ", ".join(f"{k} {v:.3f}s" for k, v in row["detail"].items())
                  + (f"; {row['warmup']}" if row.get("warmup") else ""))
    for goal in rerank_goals(rows):
        print(f"  goal: {goal['what']}: {goal['value']:.2f} ({'met' if goal['met'] else 'NOT met'})")


def rerank_label(name: str, row: dict, args, rev) -> str:
    if name.startswith("rerank"):
        side = f" ({rev.commit[:10]})" if name.endswith("REV") else ""
        return f"streameval eval --rerank {args.rerank}, whole process{side}"
    if name == "uu-floor":
        return "bare U x U GEMM (read + GEMM + norms), float32, evaluate's chunk plan"
    return f"dense torchreid-style numpy ({row['queries']:,} queries + {row['gallery']:,} gallery rows)"


def rerank_goals(rows: dict) -> list:
    """The issue's goals where the rows to judge them are there."""
    goals = []
    rerank, floor = rows.get("rerank", {}), rows.get("uu-floor", {})
    if "time_s" in rerank and "time_s" in floor:
        ratio = rerank["time_s"] / floor["time_s"]
        goals.append({"what": f"rerank / uu-floor <= {GOAL_OVER_FLOOR}", "value": ratio,
                      "met": ratio <= GOAL_OVER_FLOOR})
    if "peak_rss_mb" in rerank:
        goals.append({"what": f"rerank peak RSS (MB) < {GOAL_RSS_MB}", "value": rerank["peak_rss_mb"],
                      "met": rerank["peak_rss_mb"] < GOAL_RSS_MB})
    return goals
