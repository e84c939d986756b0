"""Write tests/data/compat_upstream.npz: small problems and what torchreid's ``evaluate_rank`` and
fast-reid's ``ReidEvaluator`` return on them, both run unmodified (tests/test_compat.py reads it).

    python tests/data/make_compat_upstream.py TORCHREID_DIR FASTREID_DIR [SITE_DIR ...]

TORCHREID_DIR holds ``torchreid/`` of KaiyangZhou/deep-person-reid (commit f8cd150), FASTREID_DIR
``fastreid/`` of JDAI-CV/fast-reid (commit c9bc3ce), each with its ``rank_cylib`` built in place
(``python setup.py build_ext --inplace``); SITE_DIRs hold what fast-reid's modules import besides
numpy and torch (faiss-cpu, scikit-learn, termcolor, iopath, portalocker, tabulate).  Written with
numpy 2.4.6, torch 2.13.0+cpu, Cython 3.3.1, Python 3.11.

The packages' ``__init__`` files are not run (torchreid's imports torchvision and every model;
fast-reid's ``evaluation/__init__`` imports ``collections.Mapping``, gone since Python 3.10): each
module loads from its file under empty parent packages, its own code untouched.

Ties: numpy's argsort (unstable, SIMD on x86) orders equal distances as it likes, even in rows of
8, so upstream's metrics are defined only where no tie mixes a positive with a kept negative.  Every
problem is built (``class_parity_distances``, ``prototype_features``) or drawn so that this holds,
except ``tr_ties_across``, whose upstream output on the tied matrix is recorded as this machine
gave it, next to upstream's output on the matrix with j * 1e-3 added to column j (distances are integers, so the offsets break ties by
gallery index and keep every other order): the (distance, index) order streameval uses.  fast-reid
computes its distances in float32, so its problems of float features are also drawn until adjacent kept rows of
different classes lie more than 1e-4 (relative) apart in its matrix: float32 rounding cannot
reorder them.
"""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np

OUT = Path(__file__).with_name("compat_upstream.npz")
SGS_SEEDS = 400  # upstream cuhk03 runs (10 draws each) averaged for the expected CMC


def load(root: str, dotted: str):
    """Import ``dotted`` from ``root`` with its parent packages as empty modules (their __init__ not run)."""
    parts = dotted.split(".")
    for i in range(1, len(parts)):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(Path(root, *parts[:i]))]
            sys.modules[name] = package
    return importlib.import_module(dotted)


def draw_ids(rng, nq: int, ng: int, n_pids: int, n_cams: int, absent: int = 2):
    """Query and gallery ids: pids 0..n_pids-1 (the last ``absent`` never in the gallery), pid -1
    in both (an ordinary pid to both upstreams), random cameras (same-camera positives: junk)."""
    q_pids = rng.integers(-1, n_pids, nq)
    g_pids = rng.integers(-1, n_pids - absent, ng)
    return q_pids, rng.integers(0, n_cams, nq), g_pids, rng.integers(0, n_cams, ng)


def weak_features(rng, pids, dim: int, noise: float):
    """Features of a weak model: a centre per pid plus noise as large as the centres' spread."""
    centres = np.random.default_rng(7).normal(size=(64, dim)) * 2
    return centres[pids % 64] + rng.normal(size=(len(pids), dim)) * noise


def tie_and_gap_ok(dist, q_pids, q_camids, g_pids, g_camids, min_rel_gap: float, min_kept: int = 0) -> bool:
    """No positive and kept negative closer than ``min_rel_gap`` (relative; 0: not equal; junk rows
    may tie with anything: removing them keeps the others' order), and every valid query keeps at
    least ``min_kept`` rows (upstream's CMC breaks when a query keeps fewer than max_rank)."""
    for i in range(len(q_pids)):
        kept = ~((g_pids == q_pids[i]) & (g_camids == q_camids[i]))
        positive = (g_pids == q_pids[i])[kept]
        order = np.argsort(dist[i][kept], kind="stable")
        d, c = dist[i][kept][order].astype(np.float64), positive[order]
        close = np.abs(np.diff(d)) <= min_rel_gap * np.maximum(np.abs(d[1:]), 1e-12)
        if np.any(close & (c[1:] != c[:-1])):
            return False
        if positive.any() and kept.sum() < min_kept:
            return False
    return True


def class_parity_distances(rng, ids, high: int):
    """Integer distances with many ties, none between a positive and a negative: a query's
    same-pid rows take even values, the others odd ones."""
    q_pids, g_pids = ids[0], ids[2]
    values = rng.integers(0, high, (len(q_pids), len(g_pids))) * 2
    return (values + (g_pids[None] != q_pids[:, None])).astype(np.float32)


def prototype_features(rng, pids, n_queries: int, dim: int):
    """Integer features with ties: every gallery image is one of two integer prototypes of its pid,
    a query is its pid's first prototype plus integer noise (a weak model)."""
    prototypes = rng.integers(-20, 21, (128, 2, dim))
    gallery = prototypes[pids[n_queries:] % 128, rng.integers(0, 2, len(pids) - n_queries)]
    queries = prototypes[pids[:n_queries] % 128, 0] + rng.integers(-8, 9, (n_queries, dim))
    return np.concatenate([queries, gallery]).astype(np.float32)


def torchreid_cases(rank, rng) -> tuple[dict, list]:
    arrays, cases = {}, []

    def add(name, dist, ids, max_rank, what, sgs=False, tiebroken=None):
        q_pids, q_camids, g_pids, g_camids = ids
        for key, value in zip(("distmat", "q_pids", "q_camids", "g_pids", "g_camids"), (dist, *ids)):
            arrays[f"{name}__{key}"] = value
        case = {"name": name, "upstream": "torchreid", "max_rank": max_rank, "cuhk03": sgs, "what": what}
        if sgs:
            np.random.seed(0)
            cmc, mAP = rank.evaluate_rank(dist, q_pids, g_pids, q_camids, g_camids, max_rank, True, True)
            arrays[f"{name}__cy_cmc"], case["cy_mAP"] = cmc, float(mAP)
            runs = []
            for seed in range(SGS_SEEDS):
                np.random.seed(seed)
                runs.append(rank.evaluate_rank(dist, q_pids, g_pids, q_camids, g_camids, max_rank, True, True)[0])
            runs = np.asarray(runs, dtype=np.float64)
            arrays[f"{name}__cy_cmc_mean"] = runs.mean(0)
            arrays[f"{name}__cy_cmc_sem"] = runs.std(0, ddof=1) / np.sqrt(len(runs))
        else:
            for path, cython in (("cy", True), ("py", False)):
                source = dist if tiebroken is None else tiebroken
                cmc, mAP = rank.evaluate_rank(source, q_pids, g_pids, q_camids, g_camids, max_rank, False, cython)
                arrays[f"{name}__{path}_cmc"], case[f"{path}_mAP"] = cmc, float(mAP)
                case[f"{path}_mAP_type"] = type(mAP).__name__
            if tiebroken is not None:  # upstream on the tied matrix, as this machine's argsort broke the ties
                cmc, mAP = rank.evaluate_rank(dist, q_pids, g_pids, q_camids, g_camids, max_rank, False, False)
                arrays[f"{name}__tied_py_cmc"], case["tied_py_mAP"] = cmc, float(mAP)
        cases.append(case)

    # continuous distances (float32: the Cython path's cast changes nothing), junk, queries without positives
    while True:
        ids = draw_ids(rng, 16, 80, 12, 3)
        q, g = weak_features(rng, ids[0], 8, 1.5), weak_features(rng, ids[2], 8, 1.5)
        dist = ((q[:, None] - g[None]) ** 2).sum(-1).astype(np.float32)
        if tie_and_gap_ok(dist, *ids, 0.0, 20):
            break
    add("tr_float", dist, ids, 20, "continuous float32 distances, same-camera junk, pid -1, queries without positives")

    # integer distances with ties, each tie within one class (upstream's result does not depend on its sort)
    ids = draw_ids(rng, 10, 50, 8, 2)
    dist = class_parity_distances(rng, ids, 12)
    assert tie_and_gap_ok(dist, *ids, 0.0, 10)
    add("tr_ties_within", dist, ids, 10, "integer distances, ties only within a class")

    # integer distances with ties across classes: upstream on the index-tie-broken matrix too
    ids = draw_ids(rng, 10, 40, 6, 2)
    dist = rng.integers(0, 6, (10, 40)).astype(np.float32)
    tiebroken = (dist + np.arange(40, dtype=np.float32) * np.float32(1e-3)).astype(np.float32)
    assert (np.argsort(tiebroken, axis=1) == np.argsort(dist, axis=1, kind="stable")).all()
    add("tr_ties_across", dist, ids, 5, "integer distances 0..5, ties between positives and negatives",
        tiebroken=tiebroken)

    # a gallery smaller than max_rank (upstream: a note, max_rank = num_g); no camera junk, so every query keeps all rows
    q_pids, g_pids = rng.integers(0, 4, 6), np.array([0, 1, 2, 3, 0, 1, 4, 2])
    dist = rng.random((6, 8)).astype(np.float32)
    add("tr_small_gallery", dist, (q_pids, np.zeros(6, np.int64), g_pids, np.ones(8, np.int64)), 50,
        "8 gallery rows, max_rank 50")

    # cuhk03 with one kept image per gallery identity: the draws cannot change anything
    q_pids = rng.integers(0, 10, 12)
    g_pids = np.arange(12)  # pids 10, 11: distractors
    dist = rng.random((12, 12)).astype(np.float32)
    add("tr_sgs_single", dist, (q_pids, np.zeros(12, np.int64), g_pids, np.ones(12, np.int64)), 10,
        "cuhk03, one gallery image per identity", sgs=True)

    # cuhk03 with several images per identity: random draws
    while True:
        ids = draw_ids(rng, 12, 48, 8, 2)
        q, g = weak_features(rng, ids[0], 8, 1.5), weak_features(rng, ids[2], 8, 1.5)
        dist = ((q[:, None] - g[None]) ** 2).sum(-1).astype(np.float32)
        if tie_and_gap_ok(dist, *ids, 0.0):
            break
    add("tr_sgs_random", dist, ids, 10, "cuhk03, several images per identity", sgs=True)
    return arrays, cases


def fastreid_cases(modules, rng) -> tuple[dict, list]:
    reid_evaluation, rank, compute_dist, query_expansion = modules
    arrays, cases = {}, []

    def config(metric: str, aqe: bool):
        off = SimpleNamespace(ENABLED=False)
        return SimpleNamespace(TEST=SimpleNamespace(
            METRIC=metric, ROC=off, RERANK=off,
            AQE=SimpleNamespace(ENABLED=aqe, QE_TIME=1, QE_K=5, ALPHA=3.0)))

    def upstream_dist(feats, nq, metric, aqe):
        import torch

        qf, gf = torch.from_numpy(feats[:nq]), torch.from_numpy(feats[nq:])
        if aqe:
            qf, gf = query_expansion.aqe(qf, gf, 1, 5, 3.0)
        return compute_dist.build_dist(qf, gf, metric)

    def add(name, feats, pids, camids, nq, metric, aqe, batches, what):
        import torch

        cfg = config(metric, aqe)
        evaluator = reid_evaluation.ReidEvaluator(cfg, nq)
        evaluator.reset()
        for part in np.array_split(np.arange(len(pids)), batches):
            evaluator.process({"targets": torch.from_numpy(pids[part]), "camids": torch.from_numpy(camids[part])},
                              torch.from_numpy(feats[part]))
        results = evaluator.evaluate()
        dist = upstream_dist(feats, nq, metric, aqe)
        ids = (pids[:nq], pids[nq:], camids[:nq], camids[nq:])
        _, ap, inp = rank.evaluate_rank(dist, *ids, use_cython=False)
        _, ap_cy, _ = rank.evaluate_rank(dist, *ids, use_cython=True)
        for key, value in (("feats", feats), ("pids", pids), ("camids", camids), ("py_ap", np.asarray(ap)),
                           ("py_inp", np.asarray(inp)), ("cy_ap", np.asarray(ap_cy))):
            arrays[f"{name}__{key}"] = value
        cases.append({"name": name, "upstream": "fast-reid", "num_query": nq, "metric": metric, "aqe": aqe,
                      "batches": batches, "what": what,
                      "results": {k: float(v) for k, v in results.items()},
                      "result_types": {k: type(v).__name__ for k, v in results.items()}})

    def draw(nq, ng, dim, integer, metric, aqe, gap):
        while True:
            q_pids, q_camids, g_pids, g_camids = draw_ids(rng, nq, ng, 10, 3)
            pids, camids = np.concatenate([q_pids, g_pids]), np.concatenate([q_camids, g_camids])
            feats = (prototype_features(rng, pids, nq, dim) if integer
                     else weak_features(rng, pids, dim, 1.5).astype(np.float32))
            dist = upstream_dist(feats, nq, metric, aqe)
            if tie_and_gap_ok(dist, q_pids, q_camids, g_pids, g_camids, gap, 50) and (
                    not integer or any(len(np.unique(row)) < len(row) for row in dist)):
                return feats, pids, camids

    feats, pids, camids = draw(10, 70, 6, True, "euclidean", False, 0.0)
    add("fr_euclidean_ties", feats, pids, camids, 10, "euclidean", False, 3,
        "integer features (exact float32 squared distances), ties within a class")
    feats, pids, camids = draw(12, 70, 8, False, "cosine", False, 1e-4)
    add("fr_cosine", feats, pids, camids, 12, "cosine", False, 4, "float features, cosine")
    feats, pids, camids = draw(12, 70, 8, False, "cosine", True, 1e-4)
    add("fr_cosine_aqe", feats, pids, camids, 12, "cosine", True, 2, "float features, cosine, TEST.AQE (k 5, alpha 3, 1 round)")
    return arrays, cases


def main(torchreid_dir: str, fastreid_dir: str, *sites: str) -> None:
    sys.path.extend(sites)  # after the environment's own numpy and torch
    rank = load(torchreid_dir, "torchreid.metrics.rank")
    assert rank.IS_CYTHON_AVAI, "build torchreid/metrics/rank_cylib first"
    modules = tuple(load(fastreid_dir, f"fastreid.{m}") for m in (
        "evaluation.reid_evaluation", "evaluation.rank", "utils.compute_dist", "evaluation.query_expansion"))
    assert modules[1].IS_CYTHON_AVAI, "build fastreid/evaluation/rank_cylib first"
    rng = np.random.default_rng(2027)
    tr_arrays, tr_cases = torchreid_cases(rank, rng)
    fr_arrays, fr_cases = fastreid_cases(modules, rng)
    np.savez_compressed(OUT, cases=json.dumps(tr_cases + fr_cases), **tr_arrays, **fr_arrays)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main(*sys.argv[1:])
