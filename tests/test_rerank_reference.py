"""The dense re-ranking / AQE reference (tests/rerank_reference.py) against the third-party codes
run unmodified (PROTOCOLS.md 6.1: every flavour agrees to float32 rounding), and on small cases
worked out by hand.

tests/data/rerank_upstream.npz holds the inputs and the upstream outputs.  Its ``cases`` entry (JSON)
lists, per case, the array key, the problem, the upstream, the flavour it reproduces, metric, k1,
k2, lambda and AQE settings; ``problem__NAME__{qf,gf,q_pids,q_camids,g_pids,g_camids}`` are the
problems.  Problems "wide" (6 x 40 x 8) and "wide2" (5 x 30 x 6): features k / 32 with integers k
in [-20, 20] (every product exact in float32; squared distances ~1-20, so fast-reid's exp(-B) does
not underflow), drawn until no list boundary (lengths L1, h, k2 of every flavour for k1 = 20, 19, 5; AQE's k = 5)
falls on a tie or a near-tie (relative gap > 2e-6), since the Python ports' sorts (np.argsort,
np.argpartition, faiss) leave ties undefined.  Problem "ties" (6 x 40 x 8 in [-2, 2], a gallery
row duplicated, a query equal to a gallery row): many exact ties, run in MATLAB's code only
(its sort is stable, and integer squared distances are exact in single precision).

Where each output came from (numpy 2.4.6, torch 2.13.0+cpu, faiss-cpu 1.15.1, GNU Octave 7.3.0):
* torchreid: KaiyangZhou/deep-person-reid f8cd150, torchreid/utils/rerank.py ``re_ranking`` with
  the inputs of torchreid/engine/engine.py ``_evaluate``: compute_distance_matrix (metrics/distance.py,
  "euclidean" = squared, or "cosine") for q x g (numpy), q x q and g x g.
* layumi: layumi/Person_reID_baseline_pytorch 82ff40f, re_ranking.py with the inputs of
  evaluate_rerank.py (np.dot of float32 features L2-normalised as test.py does).
* fast-reid: JDAI-CV/fast-reid c9bc3ce, fastreid/evaluation/reid_evaluation.py's TEST.AQE /
  TEST.RERANK path: query_expansion.py ``aqe``, utils/compute_dist.py ``build_dist`` for the distance
  (METRIC cosine or euclidean) and ``compute_jaccard_distance`` on the (normalised for cosine)
  features with search_option=3 (faiss CPU IndexFlatL2) where build_dist's "jaccard" asks for 0
  (faiss GPU): the same exact kNN, on the CPU.  The "aqeN" arrays are aqe's features alone.
* MATLAB: zhunzhong07/person-re-ranking 278f2c7, evaluation/utils/re_ranking.m with
  LOMO_XQDA/code/MahDist.m in Octave, called as evaluation/Market_1501_evaluation.m does
  (single features; "cosine": L2-normalised column by column first; M = W = 1).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from streameval.features.rerank.flavours import FLAVOURS

from rerank_reference import aqe_reference, base_distance, evaluate_matrix, reciprocal, rerank_reference, stable_order

DATA = np.load(Path(__file__).parent / "data" / "rerank_upstream.npz")
CASES = json.loads(str(DATA["cases"]))
RERANK_CASES = [c for c in CASES if c["flavour"]]
AQE_CASES = [c for c in CASES if not c["flavour"]]
FLOAT32_ROUNDING = 3e-7  # on values in [0, 1]; relative above 1 (fast-reid's A is unnormalised)
# AQE then re-ranking: the expanded features already carry float32 rounding (~3e-7 relative, see
# the AQE test), which the distances and V pass on
FLOAT32_ROUNDING_AFTER_AQE = 1e-6


def problem(name: str) -> dict:
    prefix = f"problem__{name}__"
    return {key[len(prefix):]: DATA[key] for key in DATA.files if key.startswith(prefix)}


def case_id(case: dict) -> str:
    return "-".join(str(case[k]) for k in ("key", "problem", "upstream", "metric", "k1", "k2")) + ("-aqe" if case["qe"] else "")


def effective_k2(case: dict) -> int:
    """fast-reid's initial_rank holds only each row's k1 nearest (faiss search with k1), so its
    query expansion averages min(k2, k1) rows where the spec says top(i, k2): an upstream
    difference outside the flavours table, pinned by its own test below."""
    return min(case["k2"], case["k1"]) if case["upstream"] == "fast-reid" else case["k2"]


def reference_for(case: dict, k2: int) -> dict:
    p = problem(case["problem"])
    qf, gf = p["qf"], p["gf"]
    if case["qe"]:
        qe = case["qe"]
        qf, gf = aqe_reference(qf, gf, qe["k"], qe["alpha"], qe["times"])
    return rerank_reference(qf, gf, case["flavour"], case["metric"], case["k1"], k2, case["lam"])


@pytest.mark.parametrize("case", RERANK_CASES, ids=case_id)
def test_reference_equals_the_upstream_output_to_float32_rounding(case):
    ref = reference_for(case, effective_k2(case))
    upstream = DATA[case["key"]].astype(np.float64)
    assert upstream.shape == ref["final"].shape
    rounding = FLOAT32_ROUNDING_AFTER_AQE if case["qe"] else FLOAT32_ROUNDING
    bound = rounding * np.maximum(1.0, np.abs(ref["final"]))
    assert np.all(np.abs(ref["final"] - upstream) <= bound), np.abs(ref["final"] - upstream).max()
    p = problem(case["problem"])
    ids = (p["q_pids"], p["q_camids"], p["g_pids"], p["g_camids"])
    want, got = evaluate_matrix(ref["final"], *ids), evaluate_matrix(upstream, *ids)
    np.testing.assert_array_equal(got["first_hit_rank"], want["first_hit_rank"])
    np.testing.assert_allclose(got["ap"], want["ap"], rtol=0, atol=1e-12)
    assert got["top"] == want["top"]


def test_the_upstream_cases_exercise_expansion_and_non_candidates():
    """At k1 = 19 and 20 every case has an R* larger than R(i; L1); at k1 = 5 the problems of 40
    gallery rows have non-candidates (J = 1); the smaller ones have few or none (6.2: small N)."""
    for case in (c for c in RERANK_CASES if not c["qe"]):
        ref = reference_for(case, case["k2"])
        p = problem(case["problem"])
        u = np.concatenate([p["qf"], p["gf"]])
        d = base_distance(u, u, "cosine" if case["metric"] == "cosine" else "sqeuclidean")
        np.fill_diagonal(d, 0.0)
        order = stable_order(d)
        if case["k1"] >= 19:
            assert any(len(r) > len(reciprocal(order, i, ref["L1"])) for i, r in enumerate(ref["rstar"])), case_id(case)
        elif ref["final"].shape[1] == 40:
            assert ref["n_candidates"] < ref["final"].size, case_id(case)
            assert np.any(ref["jaccard"] == 1.0)


def test_fastreid_averages_min_k2_k1_rows_where_k2_exceeds_k1():
    """The upstream difference ``effective_k2`` explains: with k1 = 5 < k2 = 6, fast-reid's output
    is the reference with k2 = 5, not with k2 = 6."""
    cases = [c for c in RERANK_CASES if c["upstream"] == "fast-reid" and c["k2"] > c["k1"]]
    assert cases
    for case in cases:
        upstream = DATA[case["key"]].astype(np.float64)
        assert np.abs(reference_for(case, case["k2"])["final"] - upstream).max() > 1e-3, case_id(case)
        assert np.abs(reference_for(case, case["k1"])["final"] - upstream).max() <= FLOAT32_ROUNDING * np.abs(upstream).max()


@pytest.mark.parametrize("case", AQE_CASES, ids=lambda c: f"{c['key']}-{c['problem']}-times{c['qe']['times']}")
def test_aqe_reference_equals_fastreid_aqe_to_float32_rounding(case):
    p, qe = problem(case["problem"]), case["qe"]
    qf2, gf2 = aqe_reference(p["qf"], p["gf"], qe["k"], qe["alpha"], qe["times"])
    for mine, theirs in ((qf2, DATA[case["key"] + "_q"]), (gf2, DATA[case["key"] + "_g"])):
        scale = np.abs(mine).max()
        assert np.abs(mine - theirs).max() <= 1e-6 * scale


# ------------------------------------------------------------------------------------ by hand
#
# Five 1-D points x = 0, 2, 3, 6, 7 (U = one query x = 0, then the gallery 2, 3, 6, 7), squared
# Euclidean distances, flavour "matlab" with k1 = 2: L1 = 3, h = 2.  Row 2 (x = 3) has a tie:
# items 0 and 3 are both at distance 9, item 0 comes first by index.
#   orders: 0: [0 1 2 3 4]   1: [1 2 0 3 4]   2: [2 1 0 3 4]   3: [3 4 2 1 0]   4: [4 3 2 1 0]
#   R(i; 3): 0, 1, 2 -> {0, 1, 2};  3, 4 -> {3, 4}   (2's top 3 is {2, 1, 0}: no 3)
#   R(c; 2): 0 -> {0} (1's top 2 is {1, 2});  1, 2 -> {1, 2};  3, 4 -> {3, 4}; all inside R(i; 3)
#   so R* = R(i; 3).

HAND = dict(qf=np.array([[0.0]]), gf=np.array([[2.0], [3.0], [6.0], [7.0]]))


def test_reciprocal_sets_of_the_five_point_example():
    ref = rerank_reference(HAND["qf"], HAND["gf"], "matlab", "euclidean", k1=2, k2=1)
    assert (ref["L1"], ref["h"]) == (3, 2)
    assert [r.tolist() for r in ref["rstar"]] == [[0, 1, 2], [0, 1, 2], [0, 1, 2], [3, 4], [3, 4]]
    order = stable_order(base_distance(np.concatenate([HAND["qf"], HAND["gf"]]),
                                       np.concatenate([HAND["qf"], HAND["gf"]]), "sqeuclidean"))
    assert order[2].tolist() == [2, 1, 0, 3, 4]  # the tie at 9: index 0 before index 3
    assert reciprocal(order, 0, 2) == {0}


def test_final_values_of_the_five_point_example():
    """V, J and final from the formulas: rowmax(0) = 49, rowmax(1) = 25; w = exp(-B / rowmax)."""
    ref = rerank_reference(HAND["qf"], HAND["gf"], "matlab", "euclidean", k1=2, k2=1, lam=0.3)
    w0 = [math.exp(-b / 49) for b in (0, 4, 9)]
    w1 = [math.exp(-b / 25) for b in (4, 0, 1)]
    v0 = [w / sum(w0) for w in w0]
    v1 = [w / sum(w1) for w in w1]
    assert ref["v"][0, :3].tolist() == pytest.approx(v0, abs=1e-15)
    assert ref["v"][1, :3].tolist() == pytest.approx(v1, abs=1e-15)
    s = sum(min(a, b) for a, b in zip(v0, v1))
    assert ref["final"][0, 0] == pytest.approx(0.7 * (1 - s / (2 - s)) + 0.3 * 4 / 49, abs=1e-15)
    # x = 6 and 7: supports {3, 4} and {0, 1, 2} are disjoint, J = 1
    assert ref["final"][0, 2:].tolist() == pytest.approx([0.7 + 0.3 * 36 / 49, 0.7 + 0.3 * 49 / 49], abs=1e-15)
    assert ref["n_candidates"] == 2


def test_qe_over_k2_rows_averages_their_v():
    ref1 = rerank_reference(HAND["qf"], HAND["gf"], "matlab", "euclidean", k1=2, k2=1)
    ref2 = rerank_reference(HAND["qf"], HAND["gf"], "matlab", "euclidean", k1=2, k2=2)
    assert np.allclose(ref2["v"][2], (ref1["v"][2] + ref1["v"][1]) / 2, rtol=0, atol=1e-16)  # row 2's top 2: 2, 1
    assert np.allclose(ref2["v"][0], (ref1["v"][0] + ref1["v"][1]) / 2, rtol=0, atol=1e-16)


def test_expansion_sizes_for_odd_k1():
    qf, gf = np.eye(3), np.eye(3)[::-1] + 1
    assert rerank_reference(qf, gf, "matlab", "euclidean", k1=19)["h"] == 10
    for name in ("torchreid", "layumi", "fastreid"):
        assert rerank_reference(qf, gf, name, "euclidean", k1=19)["h"] == 11


def test_a_duplicate_precedes_the_item_itself_in_its_own_list():
    """Self is not forced to the front: gallery rows 1 and 2 are equal, so row 2's list starts with 1."""
    qf, gf = np.array([[5.0, 0.0]]), np.array([[1.0, 1.0], [2.0, 1.0], [2.0, 1.0], [0.0, 3.0]])
    u = np.concatenate([qf, gf])
    order = stable_order(base_distance(u, u, "sqeuclidean"))
    assert order[3, :2].tolist() == [2, 3]
    ref = rerank_reference(qf, gf, "matlab", "euclidean", k1=2, k2=1)
    assert ref["final"][0, 1] == ref["final"][0, 2]


def test_fastreid_clamps_j_at_zero_and_adds_the_unnormalised_distance():
    """Queries equal to gallery rows: S = 1 up to rounding, and here rounding puts S above 1
    (J = -4e-16 unclamped); fast-reid's J is max(J, 0).  A = d itself (1 - cos), no row maximum."""
    rng = np.random.default_rng(3)
    gf = rng.integers(-3, 4, (12, 4)).astype(np.float64)
    qf = gf[[4, 7]]
    clamped = rerank_reference(qf, gf, "fastreid", "cosine", k1=4, k2=3, lam=0.3)
    raw = rerank_reference(qf, gf, dataclasses.replace(FLAVOURS["fastreid"], clamp=False), "cosine", k1=4, k2=3, lam=0.3)
    assert raw["jaccard"].min() < 0
    np.testing.assert_array_equal(clamped["jaccard"], np.maximum(raw["jaccard"], 0.0))
    d = base_distance(qf, gf, "cosine")
    np.testing.assert_array_equal(clamped["final"], 0.7 * clamped["jaccard"] + 0.3 * d)


def test_aqe_by_hand():
    """f = (1, 0), (1, 1), (0, 1); s = 1 / sqrt 2 between neighbours, 0 between the ends; k = 2,
    alpha = 3.  Row 1 has a tie (rows 0 and 2 at s = 1 / sqrt 2): row 0 is taken."""
    f = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    c = (1 / math.sqrt(2)) ** 3
    qf2, gf2 = aqe_reference(f[:1], f[1:], k=2, alpha=3.0, times=1)
    want = np.array([(f[0] + c * f[1]) / 2, (f[1] + c * f[0]) / 2, (f[2] + c * f[1]) / 2])
    np.testing.assert_allclose(np.concatenate([qf2, gf2]), want, rtol=0, atol=1e-15)
