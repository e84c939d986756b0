"""Fixed vectors of docs/metrics.md#4-closed-set-metrics-cmc-ap-inp (worked examples) and the ranking-related ones of docs/metrics.md#8-test-vectors.

Every vector is built as real features whose distances produce the wanted ranking: 1-D features,
query at 0, so the euclidean distance of a gallery item is its feature value (sqeuclidean: its
square, the same order).  Unless a test is about cameras, the query is on camera 0 and the gallery
on camera 1, so the camera filter of protocol ``market`` removes nothing.  Expected values are exact
fractions, worked out by hand from the section-3 formulas.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest

import streameval

from reference import reference_evaluate

TOL = 1e-12
QUERY_PID, NEGATIVE_PID = 7, 8
CHUNKINGS = [(None, None), (1, 1), (1, 2), (2, 3)]


# --------------------------------------------------------------------------------------------- helpers


def one_query_problem(distances, positives, negative_pid=NEGATIVE_PID, gallery_cam=1, dtype=np.float32):
    """Gallery item i at 1-D position distances[i] (query at 0); item i is positive iff positives[i]."""
    distances = np.asarray(distances, dtype=np.float64)
    return dict(
        qf=np.zeros((1, 1), dtype=dtype), q_pids=np.array([QUERY_PID]), q_camids=np.array([0]),
        gf=distances.reshape(-1, 1).astype(dtype),
        g_pids=np.where(np.asarray(positives, dtype=bool), QUERY_PID, negative_pid),
        g_camids=np.full(distances.shape[0], gallery_cam),
    )


def ranked_problem(positive_ranks, n_items, **kwargs):
    """Gallery at 1, 2, ..., n_items, so gallery item i has rank i + 1; positives at the given ranks."""
    return one_query_problem(np.arange(1, n_items + 1), [r in positive_ranks for r in range(1, n_items + 1)], **kwargs)


def evaluate_all(problem, chunkings=CHUNKINGS, **options):
    """Evaluate with several chunkings; the results must be bit-identical.  Returns the first."""
    results = [streameval.evaluate(problem, query_block=qb, gallery_chunk=gc, **options) for qb, gc in chunkings]
    first = results[0]
    for other in results[1:]:
        for key in ("n_queries", "n_valid_queries", "n_open_queries", "mAP", "mAP_trapezoid", "mINP"):
            assert getattr(other, key) == getattr(first, key), key
        if first.cmc is None:
            assert other.cmc is None
        else:
            np.testing.assert_array_equal(other.cmc, first.cmc)
        for key, values in first.per_query.items():
            np.testing.assert_array_equal(other.per_query[key], values, err_msg=key)
    return first


def ap_rectangle(ranks) -> Fraction:
    return sum(Fraction(j, r) for j, r in enumerate(ranks, 1)) / len(ranks)


def ap_trapezoid(ranks) -> Fraction:
    terms = [((Fraction(1) if r == 1 else Fraction(j - 1, r - 1)) + Fraction(j, r)) / 2 for j, r in enumerate(ranks, 1)]
    return sum(terms) / len(ranks)


def assert_single_query(result, ap, inp, first_hit, n_positives, ap_trap=None):
    assert (result.n_queries, result.n_valid_queries, result.n_open_queries) == (1, 1, 0)
    pq = result.per_query
    assert pq["first_hit_rank"][0] == first_hit
    assert pq["n_positives"][0] == n_positives
    assert abs(pq["ap"][0] - float(ap)) <= TOL
    assert abs(pq["inp"][0] - float(inp)) <= TOL
    assert abs(result.mAP - float(ap)) <= TOL
    assert abs(result.mINP - float(inp)) <= TOL
    if ap_trap is not None:
        assert abs(pq["ap_trapezoid"][0] - float(ap_trap)) <= TOL
        assert abs(result.mAP_trapezoid - float(ap_trap)) <= TOL
    assert result.mAP_trapezoid <= result.mAP + TOL


# -------------------------------------------------------------- docs/metrics.md#4-closed-set-metrics-cmc-ap-inp: worked examples


# (positive ranks, AP to 4 decimals, exact AP, exact AP trapezoid, INP) for 10 ranked items, 3 positives
WORKED_EXAMPLES = [
    ((1, 2, 10), 0.7667, Fraction(23, 30), Fraction(407, 540), Fraction(3, 10)),
    ((1, 4, 5), 0.7, Fraction(7, 10), Fraction(59, 90), Fraction(3, 5)),
]


@pytest.mark.parametrize("ranks, ap4, ap, ap_trap, inp", WORKED_EXAMPLES)
@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean"])
@pytest.mark.parametrize("protocol", ["none", "market"])
def test_worked_examples(ranks, ap4, ap, ap_trap, inp, metric, protocol):
    assert ap_rectangle(ranks) == ap and ap_trapezoid(ranks) == ap_trap  # the fixtures themselves
    result = evaluate_all(ranked_problem(ranks, 10), metric=metric, protocol=protocol, max_rank=10)
    assert round(result.mAP, 4) == ap4
    assert_single_query(result, ap, inp, first_hit=1, n_positives=3, ap_trap=ap_trap)
    np.testing.assert_array_equal(result.cmc, np.ones(10))


def test_worked_examples_as_one_problem():
    """Both worked examples as two queries of one gallery (2-D features): means over both."""
    # query 0 at (0, 0) with gallery items (k, 0); query 1 at (0, 100) with items (k, 100), k = 1..10.
    # Each query's own items are at distance k; the other query's items are >= 100 away.
    qf = np.array([[0, 0], [0, 100]], np.float32)
    gf = np.array([[k, y] for y in (0, 100) for k in range(1, 11)], np.float32)
    g_pids = np.array([1 if k in (1, 2, 10) else 0 for k in range(1, 11)]
                      + [2 if k in (1, 4, 5) else 0 for k in range(1, 11)])
    problem = dict(qf=qf, q_pids=np.array([1, 2]), q_camids=np.array([0, 0]),
                   gf=gf, g_pids=g_pids, g_camids=np.ones(20, dtype=np.int64))
    result = evaluate_all(problem, metric="euclidean")
    np.testing.assert_allclose(result.per_query["ap"], [23 / 30, 7 / 10], rtol=0, atol=TOL)
    np.testing.assert_allclose(result.per_query["inp"], [3 / 10, 3 / 5], rtol=0, atol=TOL)
    np.testing.assert_allclose(result.per_query["ap_trapezoid"], [407 / 540, 59 / 90], rtol=0, atol=TOL)
    assert abs(result.mAP - float((Fraction(23, 30) + Fraction(7, 10)) / 2)) <= TOL
    assert abs(result.mINP - 0.45) <= TOL
    assert result.rank(1) == 1.0 and len(result.cmc) == 50


# ------------------------------------------------------------- docs/metrics.md#8-test-vectors: Table 2, AP and INP


# list: (distances, gt, AP, INP); lists V and VI have no positive (open-set queries)
TABLE_2 = {
    "I": ([.10, .20, .40, .70, .80], "11100", Fraction(1), Fraction(1)),
    "II": ([.50, .65, .70, .75, .80], "11100", Fraction(1), Fraction(1)),
    "III": ([.20, .35, .45, .55, .80], "10110", Fraction(29, 36), Fraction(3, 4)),
    "IV": ([.10, .32, .45, .55, .70], "11010", Fraction(11, 12), Fraction(3, 4)),
    "V": ([.35, .55, .65, .75, .85], "00000", None, None),
    "VI": ([.55, .70, .75, .80, .90], "00000", None, None),
}


@pytest.mark.parametrize("name", ["I", "II", "III", "IV"])
@pytest.mark.parametrize("negative_pid", [NEGATIVE_PID, 0])  # pid 0 (distractor) is an ordinary negative
@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_table2_closed_set_lists(name, negative_pid, precision):
    distances, gt, ap, inp = TABLE_2[name]
    positives = [c == "1" for c in gt]
    ranks = [i + 1 for i, p in enumerate(positives) if p]
    assert ap_rectangle(ranks) == ap
    problem = one_query_problem(distances, positives, negative_pid=negative_pid)
    result = evaluate_all(problem, metric="euclidean", precision=precision, max_rank=5)
    assert_single_query(result, ap, inp, first_hit=1, n_positives=gt.count("1"), ap_trap=ap_trapezoid(ranks))
    np.testing.assert_array_equal(result.cmc, np.ones(5))


@pytest.mark.parametrize("name", ["V", "VI"])
def test_table2_open_set_lists(name):
    distances, gt, _, _ = TABLE_2[name]
    result = evaluate_all(one_query_problem(distances, [c == "1" for c in gt]), metric="euclidean")
    assert (result.n_queries, result.n_valid_queries, result.n_open_queries) == (1, 0, 1)
    assert result.mAP is None and result.cmc is None
    assert np.isnan(result.per_query["ap"][0]) and result.per_query["first_hit_rank"][0] == -1


def test_table2_all_lists_as_one_problem():
    """The six lists as six queries of one gallery (2-D): means over I-IV, V and VI open-set."""
    names = list(TABLE_2)
    qf, gf, g_pids, q_pids = [], [], [], []
    for i, name in enumerate(names):
        distances, gt, _, _ = TABLE_2[name]
        y = 10.0 * i  # lists 10 apart: every list's own items come first in its query's ranking
        qf.append([0.0, y])
        q_pids.append(100 + i)
        for d, c in zip(distances, gt):
            gf.append([d, y])
            g_pids.append(100 + i if c == "1" else 0)
    problem = dict(qf=np.array(qf), q_pids=np.array(q_pids), q_camids=np.zeros(6, np.int64),
                   gf=np.array(gf), g_pids=np.array(g_pids), g_camids=np.ones(30, np.int64))
    result = evaluate_all(problem, chunkings=[(None, None), (4, 7)], metric="euclidean", precision="float64", max_rank=5)
    assert (result.n_queries, result.n_valid_queries, result.n_open_queries) == (6, 4, 2)
    aps = [TABLE_2[n][2] for n in names[:4]]
    inps = [TABLE_2[n][3] for n in names[:4]]
    np.testing.assert_allclose(result.per_query["ap"][:4], [float(a) for a in aps], rtol=0, atol=TOL)
    np.testing.assert_allclose(result.per_query["inp"][:4], [float(a) for a in inps], rtol=0, atol=TOL)
    assert np.isnan(result.per_query["ap"][4:]).all() and np.isnan(result.per_query["inp"][4:]).all()
    np.testing.assert_array_equal(result.per_query["first_hit_rank"], [1, 1, 1, 1, -1, -1])
    np.testing.assert_array_equal(result.per_query["n_positives"], [3, 3, 3, 3, 0, 0])
    assert abs(result.mAP - float(sum(aps) / 4)) <= TOL
    assert abs(result.mINP - float(sum(inps) / 4)) <= TOL


# ---------------------------------------------- docs/metrics.md#8-test-vectors: edge vectors (ranking part only)


@pytest.mark.parametrize(
    "distances",
    [[.1, .2, .3, .4, .5],  # "VP cap": positives at ranks 1 and 3, AP (RP at tau = 1) = 5/6
     [.30, .50, .90]],  # "inclusive threshold": positives at ranks 1 and 3, AP = 5/6 at tau = 1
)
def test_edge_vectors_ap(distances):
    positives = [i in (0, 2) for i in range(len(distances))]
    result = evaluate_all(one_query_problem(distances, positives), metric="euclidean")
    assert_single_query(result, Fraction(5, 6), Fraction(2, 3), first_hit=1, n_positives=2,
                        ap_trap=ap_trapezoid([1, 3]))


# Ties: d = [.2 .2 .9] -> integer features [2, 2, 9] (scaled by 10, same order, exact distances).
# The item at distance .9 is the second positive: AP = (1/2 + 2/3) / 2 = 7/12 with the negative at
# the lower gallery index, (1 + 2/3) / 2 = 5/6 with the positive there.
@pytest.mark.parametrize("tied_features", [(2, 2), (-2, 2), (2, -2)])  # one vector, or two at one distance
@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean"])
@pytest.mark.parametrize("protocol", ["market", "none"])
@pytest.mark.parametrize(
    "negative_first, ap, ap_trap, cmc1",
    [(True, Fraction(7, 12), Fraction(5, 12), 0.0), (False, Fraction(5, 6), Fraction(19, 24), 1.0)],
)
def test_tie_broken_by_gallery_index(tied_features, metric, protocol, negative_first, ap, ap_trap, cmc1):
    ranks = [2, 3] if negative_first else [1, 3]
    assert ap_rectangle(ranks) == ap and ap_trapezoid(ranks) == ap_trap
    positives = [not negative_first, negative_first, True]
    problem = one_query_problem([tied_features[0], tied_features[1], 9], positives)
    result = evaluate_all(problem, metric=metric, protocol=protocol, max_rank=3)
    assert_single_query(result, ap, Fraction(2, 3), first_hit=ranks[0], n_positives=2, ap_trap=ap_trap)
    assert result.cmc[0] == cmc1
    np.testing.assert_array_equal(result.cmc[1:], [1.0, 1.0])


def test_tie_among_many_items_across_chunks():
    """Five items at one distance (alternating negative/positive by index), then a far positive."""
    positives = [False, True, False, True, False, True]
    problem = one_query_problem([3, -3, 3, -3, 3, 4], positives)
    ranks = [2, 4, 6]
    result = evaluate_all(problem, metric="euclidean", max_rank=6)
    assert_single_query(result, ap_rectangle(ranks), Fraction(1, 2), first_hit=2, n_positives=3,
                        ap_trap=ap_trapezoid(ranks))


def test_cosine_tie_broken_by_gallery_index():
    """Cosine: parallel gallery vectors of different lengths have exactly one distance."""
    qf = np.array([[1, 0]], np.float32)
    gf = np.array([[2, 2], [1, 1], [0, 1]], np.float32)  # cos distance 1 - 1/sqrt(2) twice, then 1
    problem = dict(qf=qf, q_pids=np.array([7]), q_camids=np.array([0]),
                   gf=gf, g_pids=np.array([8, 7, 7]), g_camids=np.array([1, 1, 1]))
    result = evaluate_all(problem, metric="cosine", precision="float64", max_rank=3)
    assert_single_query(result, Fraction(7, 12), Fraction(2, 3), first_hit=2, n_positives=2,
                        ap_trap=Fraction(5, 12))


@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean"])
def test_same_camera_only_query_is_open_set(metric):
    """Query 0's only same-pid items share its camera: junk under market, so query 0 is in Q-.

    Query 1 (pid 5, camera 1) is an ordinary closed-set query; only it counts in the means.
    """
    problem = dict(
        qf=np.array([[0], [0]], np.float32), q_pids=np.array([7, 5]), q_camids=np.array([0, 1]),
        gf=np.array([[1], [2], [3], [4]], np.float32),
        g_pids=np.array([7, 8, 5, 7]), g_camids=np.array([0, 1, 0, 0]),
    )
    result = evaluate_all(problem, metric=metric, protocol="market")
    assert (result.n_queries, result.n_valid_queries, result.n_open_queries) == (2, 1, 1)
    pq = result.per_query
    assert pq["n_positives"].tolist() == [0, 1] and pq["first_hit_rank"].tolist() == [-1, 3]
    assert np.isnan(pq["ap"][0]) and np.isnan(pq["ap_trapezoid"][0]) and np.isnan(pq["inp"][0])
    # query 1 ranks: item 0 (pid 7, a negative for pid 5) 1, item 1 2, item 2 (its positive) 3, item 3 4
    assert abs(result.mAP - 1 / 3) <= TOL and abs(result.mINP - 1 / 3) <= TOL
    assert abs(result.mAP_trapezoid - float(ap_trapezoid([3]))) <= TOL
    np.testing.assert_array_equal(result.cmc[:4], [0, 0, 1, 1])
    # protocol none: same-camera items are positives, query 0 becomes closed-set (ranks 1 and 4)
    result = evaluate_all(problem, metric=metric, protocol="none")
    assert (result.n_valid_queries, result.n_open_queries) == (2, 0)
    assert result.per_query["n_positives"].tolist() == [2, 1]
    assert abs(result.per_query["ap"][0] - float(ap_rectangle([1, 4]))) <= TOL


def test_custom_junk_pids():
    """Items whose pid is in junk_pids disappear from the ranking; -1 is ordinary once not listed."""
    problem = one_query_problem([1, 2, 3, 4], [False, False, False, True])
    problem["g_pids"] = np.array([-1, 3, 8, QUERY_PID])
    for junk, rank in (((-1,), 3), ((3,), 3), ((-1, 3), 2), ((-1, 3, 8), 1), ((), 4)):
        result = evaluate_all(problem, metric="euclidean", junk_pids=junk, chunkings=[(None, None), (1, 1)])
        assert_single_query(result, Fraction(1, rank), Fraction(1, rank), first_hit=rank, n_positives=1)


# ------------------------------------------------------------------------- other section-3 rules


def test_trapezoid_never_above_rectangle_every_ranking():
    """Every subset of positives among 6 ranked items (63 queries in one problem):
    per-query AP rectangle and trapezoid are the exact formulas, and trapezoid <= rectangle."""
    subsets = [s for s in range(1, 64)]
    qf, gf, g_pids = [], [], []
    for q, s in enumerate(subsets):
        y = 10 * q  # each query's own 6 items at distance 1..6; every other item is >= 10 away
        qf.append([0, y])
        for k in range(6):
            gf.append([k + 1, y])
            g_pids.append(q + 1 if s >> k & 1 else 0)
    problem = dict(qf=np.array(qf, np.float32), q_pids=np.arange(1, 64), q_camids=np.zeros(63, np.int64),
                   gf=np.array(gf, np.float32), g_pids=np.array(g_pids), g_camids=np.ones(len(gf), np.int64))
    result = evaluate_all(problem, metric="sqeuclidean", chunkings=[(None, None), (7, 50)])
    pq = result.per_query
    for q, s in enumerate(subsets):
        ranks = [k + 1 for k in range(6) if s >> k & 1]
        assert abs(pq["ap"][q] - float(ap_rectangle(ranks))) <= TOL
        assert abs(pq["ap_trapezoid"][q] - float(ap_trapezoid(ranks))) <= TOL
        assert abs(pq["inp"][q] - len(ranks) / ranks[-1]) <= TOL
        assert pq["first_hit_rank"][q] == ranks[0]
        assert pq["ap_trapezoid"][q] <= pq["ap"][q]
    assert result.mAP_trapezoid <= result.mAP


@pytest.mark.parametrize("seed", range(3))
def test_trapezoid_never_above_rectangle_random(seed):
    rng = np.random.default_rng(seed)
    problem = dict(qf=rng.integers(-2, 3, (40, 3)).astype(np.float32), q_pids=rng.integers(1, 6, 40),
                   q_camids=rng.integers(0, 2, 40), gf=rng.integers(-2, 3, (300, 3)).astype(np.float32),
                   g_pids=rng.integers(-1, 6, 300), g_camids=rng.integers(0, 2, 300))
    result = streameval.evaluate(problem, metric="euclidean")
    valid = result.per_query["n_positives"] > 0
    assert valid.any()
    assert (result.per_query["ap_trapezoid"][valid] <= result.per_query["ap"][valid]).all()
    assert result.mAP_trapezoid <= result.mAP


@pytest.mark.parametrize("junk_pids", [(-1,), (7,)])
def test_no_valid_query(junk_pids):
    """No query has a positive: closed-set values are None, nothing crashes, the JSON is valid."""
    problem = dict(
        qf=np.array([[0], [1]], np.float32), q_pids=np.array([7, 9]), q_camids=np.array([0, 0]),
        gf=np.array([[1], [2], [3]], np.float32), g_pids=np.array([-1, 8, 7]), g_camids=np.array([1, 1, 0]),
    )
    # pid 7's only item is on the query's camera (market junk) or its pid is junk; pid 9 has none
    result = evaluate_all(problem, metric="euclidean", junk_pids=junk_pids)
    assert (result.n_queries, result.n_valid_queries, result.n_open_queries) == (2, 0, 2)
    assert result.cmc is None and result.mAP is None and result.mAP_trapezoid is None and result.mINP is None
    assert result.rank(1) is None
    assert result.per_query["first_hit_rank"].tolist() == [-1, -1]
    assert np.isnan(result.per_query["ap"]).all()
    out = json.loads(json.dumps(result.to_dict(per_query=True), allow_nan=False))
    assert out["mAP"] is None and out["cmc"] is None and out["rank1"] is None
    assert out["per_query"]["ap"] == [None, None]


@pytest.mark.parametrize("max_rank", [1, 2, 5, 50])
def test_tiny_gallery_cmc_stays_at_one(max_rank):
    """3 gallery items, one of them junk: 2 kept items, fewer than max_rank; first hit at rank 2."""
    problem = one_query_problem([1, 2, 3], [False, False, True])
    problem["g_pids"] = np.array([8, -1, QUERY_PID])
    result = evaluate_all(problem, metric="euclidean", max_rank=max_rank)
    expected = np.ones(max_rank)
    expected[0] = 0.0
    np.testing.assert_array_equal(result.cmc, expected)
    assert result.rank(1) == 0.0
    if max_rank >= 5:
        assert result.rank(5) == 1.0
    else:  # past the computed curve: a clear error, not a silent None
        with pytest.raises(ValueError, match="from 1 to max_rank"):
            result.rank(5)
    assert_single_query(result, Fraction(1, 2), Fraction(1, 2), first_hit=2, n_positives=1)


def test_tiny_gallery_cmc_two_queries():
    """Two queries over a 2-item gallery, max_rank 50: CMC = [1/2, 1, 1, ...]."""
    problem = dict(qf=np.array([[0], [0]], np.float32), q_pids=np.array([1, 2]), q_camids=np.array([0, 0]),
                   gf=np.array([[1], [2]], np.float32), g_pids=np.array([1, 2]), g_camids=np.array([1, 1]))
    result = evaluate_all(problem, metric="euclidean")
    expected = np.ones(50)
    expected[0] = 0.5
    np.testing.assert_array_equal(result.cmc, expected)
    assert math.isclose(result.mAP, 0.75, abs_tol=TOL)


# ---------------------------------------------------------------- the reference on the same vectors


def test_reference_reproduces_spec_vectors():
    """tests/reference.py (used by test_engine_vs_reference) agrees with the hand-computed vectors."""

    def ref(problem, **options):
        return reference_evaluate(problem["qf"], problem["q_pids"], problem["q_camids"], problem["gf"],
                                  problem["g_pids"], problem["g_camids"], **options)

    for ranks, _, ap, ap_trap, inp in WORKED_EXAMPLES:
        out = ref(ranked_problem(ranks, 10), metric="euclidean", protocol="none")
        assert out["per_query"]["first_hit_rank"][0] == 1
        assert abs(out["mAP"] - float(ap)) <= TOL and abs(out["mAP_trapezoid"] - float(ap_trap)) <= TOL
        assert abs(out["mINP"] - float(inp)) <= TOL
    for name, (distances, gt, ap, inp) in TABLE_2.items():
        out = ref(one_query_problem(distances, [c == "1" for c in gt]), metric="euclidean")
        if ap is None:
            assert out["mAP"] is None and out["cmc"] is None and out["n_open_queries"] == 1
        else:
            assert abs(out["mAP"] - float(ap)) <= TOL and abs(out["mINP"] - float(inp)) <= TOL
    for positives, ap, cmc1 in (([False, True, True], Fraction(7, 12), 0.0), ([True, False, True], Fraction(5, 6), 1.0)):
        out = ref(one_query_problem([2, 2, 9], positives), metric="sqeuclidean", max_rank=3)
        assert abs(out["mAP"] - float(ap)) <= TOL and out["cmc"][0] == cmc1
    same_cam = one_query_problem([1, 2], [True, False], gallery_cam=0)
    assert ref(same_cam, protocol="market")["n_open_queries"] == 1
    assert ref(same_cam, protocol="none")["n_valid_queries"] == 1
