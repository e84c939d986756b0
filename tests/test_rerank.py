"""Re-ranking and average query expansion in the engine (PROTOCOLS.md 6) against the dense float64
reference (tests/rerank_reference.py, itself checked against the upstream codes in
test_rerank_reference.py).

For every flavour and metric: per-query AP (to 1e-9), first-hit ranks (exact) and the top-10
ranked lists (gallery rows exact, final values to 1e-12) equal the reference's on the final
re-ranked distances, under the market protocol with junk (-1) and distractors (0) in U like any
row.  Integer-valued features make every dot product exact and ties frequent: exact duplicates (a
gallery row repeated, a query equal to a gallery row) put items at equal keys, broken by index in
the neighbour lists and in the evaluation.  AQE's expanded features are float64 non-integers: the
reference sums their distances in the engine's canonical order, so the values agree to the bit and
the expanded duplicates stay exact ties.  Odd k1 (h differs between the
flavours), k2 = 1 (no query expansion), k2 > L1, small k1 (non-candidates, J = 1), lambda 0 (only
J: the non-candidates tie at 1) and 1; several chunkings, a zarr store, a Dask cluster; AQE alone
and AQE then re-ranking.  As 6.1's exactness says, queries with two final values within summation
rounding of each other that are not the same computation are left out (``undecided_queries``); a
fixed problem keeps most of its queries.  Each fast test runs one chunking (every chunking is met across them); the
full flavour x metric x chunking product, the cluster and most random problems are marked slow.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streameval
from streameval.engine.cluster import PIN_ENV
from streameval.features.rerank.flavours import FLAVOURS

from rerank_reference import aqe_reference, base_distance, evaluate_matrix, rerank_reference

AP_TOL = 1e-9
VALUE_TOL = 1e-12
NEAR = 1e-12  # relative to S: closer final values are decided exactly only between alike ones
TOP = 10
FLAVOUR_NAMES = sorted(FLAVOURS)
# the defaults; interleaved chunks counted by three threads and merged; one query per block, one thread
CHUNKINGS = [dict(), dict(query_block=3, gallery_chunk=7, workers=3), dict(query_block=1, gallery_chunk=16, workers=1)]
OPTIONS = dict(protocol="market", no_gom=True, ranked_list=TOP)


# --------------------------------------------------------------------------------------- problems


def problem(seed: int, nq: int = 8, ng: int = 40, dim: int = 8, vmax: int = 4) -> dict:
    """Integer features with exact duplicates (gallery rows 3 and 9, query 1 = gallery row 12), no
    all-zero row (cosine); pids with several positives, junk -1, distractors 0, open-set queries."""
    rng = np.random.default_rng(seed)
    qf = rng.integers(-vmax, vmax + 1, (nq, dim)).astype(np.float32)
    gf = rng.integers(-vmax, vmax + 1, (ng, dim)).astype(np.float32)
    if ng > 12:
        gf[9] = gf[3]
        qf[min(1, nq - 1)] = gf[12]
    qf[~qf.any(axis=1), 0] = 1
    gf[~gf.any(axis=1), 0] = 1
    return dict(qf=qf, q_pids=rng.integers(0, 6, nq), q_camids=rng.integers(0, 3, nq),
                gf=gf, g_pids=rng.integers(-1, 6, ng), g_camids=rng.integers(0, 3, ng))


def ids(data: dict) -> tuple:
    return data["q_pids"], data["q_camids"], data["g_pids"], data["g_camids"]


def rerank_option(flavour: str, k1: int, k2: int, lam: float) -> dict:
    return {"flavour": flavour, "k1": k1, "k2": k2, "lambda": lam}


def expected_rerank(data, flavour, metric, k1, k2, lam, qe=None, junk_pids=(-1,)) -> dict:
    qf, gf = data["qf"], data["gf"]
    if qe:
        qf, gf = aqe_reference(qf, gf, qe["k"], qe["alpha"], qe["times"])
    ref = rerank_reference(qf, gf, flavour, metric, k1, k2, lam)
    nq = len(qf)

    def alike(q, g1, g2):
        """final(q, g1) and final(q, g2) are the same computation: equal A (one canonical formula)
        and J both 1 (no common support) or of equal V rows (exact duplicates)."""
        same_a = lam == 0 or ref["a"][q, g1] == ref["a"][q, g2]
        same_j = lam == 1 or (ref["jaccard"][q, g1] == ref["jaccard"][q, g2] == 1.0
                              or np.array_equal(ref["v"][nq + g1], ref["v"][nq + g2]))
        return same_a and same_j

    overlap = 2 * (1 - ref["jaccard"]) / (2 - ref["jaccard"])  # S, from J = 1 - S / (2 - S)
    return {**evaluate_matrix(ref["final"], *ids(data), junk_pids=junk_pids, k=TOP), "reference": ref,
            "undecided": undecided_queries(ref["final"], alike, overlap)}


def expected_aqe(data, metric, qe) -> dict:
    """The ordinary evaluation of the expanded features: "cosine" or "sqeuclidean" distances."""
    qf, gf = aqe_reference(data["qf"], data["gf"], qe["k"], qe["alpha"], qe["times"])
    final = base_distance(qf, gf, metric)
    return {**evaluate_matrix(final, *ids(data), k=TOP),
            "undecided": undecided_queries(final, lambda q, g1, g2: np.array_equal(gf[g1], gf[g2]))}


def undecided_queries(final: np.ndarray, alike, overlap=None) -> set[int]:
    """Queries whose order the spec leaves open.  6.1: V, S and J may be summed in any order
    (differences ~1e-16 relative to S), AQE's means too; so two final values closer than
    ``NEAR`` x S (the larger overlap) plus a few units of rounding of the values themselves are
    decided by the tie rule only where they are the same computation (``alike``).  Small problems
    with few distinct distances have such near-ties: S of different terms equal in exact arithmetic
    (the reference itself rounds one such J = 0.5 to 0.4999999999999999).  Exact duplicates and
    non-candidates are alike: their ties are decided by index, and asserted."""
    overlap = np.zeros_like(final) if overlap is None else overlap
    undecided = set()
    for q, row in enumerate(final):
        order = np.lexsort((np.arange(row.size), row))
        for g1, g2 in zip(order[:-1], order[1:]):
            slack = NEAR * max(overlap[q, g1], overlap[q, g2]) + 8 * np.finfo(float).eps * abs(row[g2])
            if row[g2] - row[g1] <= slack and not alike(q, g1, g2):
                undecided.add(q)
    return undecided


# ------------------------------------------------------------------------------------- assertions


def assert_equals_reference(result, want: dict, where) -> None:
    """AP to 1e-9, first hits exact, the top-10 kept gallery rows exact with their final values to
    1e-12, for every query but the undecided ones (``undecided_queries``)."""
    decided = [q for q in range(len(want["ap"])) if q not in want["undecided"]]
    got_ap = np.asarray(result.per_query["ap"], dtype=np.float64)[decided]
    want_ap = np.asarray(want["ap"], dtype=np.float64)[decided]
    np.testing.assert_array_equal(np.isnan(got_ap), np.isnan(want_ap), err_msg=str(where))
    np.testing.assert_allclose(got_ap, want_ap, rtol=0, atol=AP_TOL, equal_nan=True, err_msg=str(where))
    np.testing.assert_array_equal(np.asarray(result.per_query["first_hit_rank"])[decided],
                                  np.asarray(want["first_hit_rank"])[decided], err_msg=str(where))
    records = {record["query"]: record for record in result.ranked_lists}
    assert sorted(records) == list(range(len(want["top"]))), where
    for q in decided:
        record = records[q]
        assert [e["gallery"] for e in record["top"]] == want["top"][q], (where, q)
        assert [e["distance"] for e in record["top"]] == pytest.approx(want["top_distance"][q], rel=0, abs=VALUE_TOL), (where, q)


def check(data, want, where, chunkings, **options) -> None:
    assert 2 * len(want["undecided"]) <= len(want["ap"]), (where, "most queries of a fixed problem are decided")
    for chunking in chunkings:
        result = streameval.evaluate(data, **OPTIONS, **options, **chunking)
        assert_equals_reference(result, want, (where, chunking))


def spread(cases):
    """Each case with one chunking of CHUNKINGS in turn: every chunking is met without running
    every case under every chunking (that is the slow test's job)."""
    return [(*case, CHUNKINGS[n % len(CHUNKINGS)]) for n, case in enumerate(cases)]


# ----------------------------------------------------------------------------------------- tests

FLAVOUR_METRIC = [(flavour, metric) for flavour in FLAVOUR_NAMES for metric in ("cosine", "euclidean")]


@pytest.mark.parametrize("flavour, metric, chunking", spread(zip(FLAVOUR_NAMES, ["cosine", "euclidean"] * 2)))
def test_every_flavour_equals_the_reference_at_the_defaults(flavour, metric, chunking):
    """k1 = 20, k2 = 6, lambda = 0.3; the other metric of each flavour is in the AQE test below
    and in the slow test that runs every flavour, metric and chunking."""
    data = problem(0)
    want = expected_rerank(data, flavour, metric, 20, 6, 0.3)
    check(data, want, (flavour, metric), [chunking], metric=metric, rerank=rerank_option(flavour, 20, 6, 0.3))


@pytest.mark.slow
@pytest.mark.parametrize("flavour, metric", FLAVOUR_METRIC)
def test_every_flavour_metric_and_chunking(flavour, metric):
    data = problem(11)
    want = expected_rerank(data, flavour, metric, 20, 6, 0.3)
    check(data, want, (flavour, metric), CHUNKINGS, metric=metric, rerank=rerank_option(flavour, 20, 6, 0.3))


@pytest.mark.parametrize("flavour, metric, chunking", spread(zip(FLAVOUR_NAMES, ["sqeuclidean", "cosine"] * 2)))
def test_odd_k1_and_no_query_expansion(flavour, metric, chunking):
    """k1 = 19: h = 10 (matlab) or 11 (the ports); k2 = 1: V without the QE step."""
    data = problem(1)
    want = expected_rerank(data, flavour, metric, 19, 1, 0.3)
    check(data, want, (flavour, metric), [chunking], metric=metric, rerank=rerank_option(flavour, 19, 1, 0.3))


@pytest.mark.parametrize("flavour, k1, k2, chunking", spread(zip(FLAVOUR_NAMES, [3, 5, 5, 3], [6, 2, 6, 2])))
def test_small_k1_leaves_non_candidates_in_their_original_order(flavour, k1, k2, chunking):
    """k1 = 3 or 5: most pairs have J = 1 (6.2's non-candidates); k2 = 6 > L1 for k1 = 3 (and for
    fast-reid's L1 = k1 = 5): the lists must reach k2."""
    data = problem(2, nq=6, ng=60)
    want = expected_rerank(data, flavour, "euclidean", k1, k2, 0.3)
    assert want["reference"]["n_candidates"] < data["q_pids"].size * data["g_pids"].size
    check(data, want, (flavour, k1, k2), [chunking], metric="euclidean", rerank=rerank_option(flavour, k1, k2, 0.3))


@pytest.mark.parametrize("flavour, metric, lam, chunking", spread(zip(
    FLAVOUR_NAMES, ["sqeuclidean", "cosine", "euclidean", "cosine"], [0.3, 0.0, 1.0, 0.0])))
def test_exact_duplicates_and_ties_everywhere_are_broken_by_index(flavour, metric, lam, chunking):
    """Features in {-1, 0, 1}^3: many exact duplicates, so equal keys in every neighbour list and, with
    lambda = 0 (final = J), every non-candidate at exactly 1; lambda = 1: final = A."""
    data = problem(3, nq=7, ng=36, dim=3, vmax=1)
    want = expected_rerank(data, flavour, metric, 6, 3, lam)
    check(data, want, (flavour, metric, lam), [chunking], metric=metric, rerank=rerank_option(flavour, 6, 3, lam))


def test_junk_pids_change_the_evaluation_not_the_reranking():
    """Rows of junk pids stay in U (they are neighbours like any row); only the evaluation drops them."""
    data = problem(4)
    for junk in ((-1,), (-1, 0)):
        want = expected_rerank(data, "matlab", "cosine", 20, 6, 0.3, junk_pids=junk)
        result = streameval.evaluate(data, **OPTIONS, metric="cosine", junk_pids=junk,
                                     rerank=rerank_option("matlab", 20, 6, 0.3))
        assert_equals_reference(result, want, junk)


def test_the_defaults_and_the_rerank_section():
    """rerank="matlab": k1 = 20, k2 = 6, lambda = 0.3; the section reports them with L1, h and N."""
    data = problem(5)
    want = expected_rerank(data, "matlab", "cosine", 20, 6, 0.3)
    result = streameval.evaluate(data, **OPTIONS, metric="cosine", rerank="matlab")
    assert_equals_reference(result, want, "default")
    section = result.to_dict()["rerank"]
    assert {k: section[k] for k in ("flavour", "k1", "k2", "lambda", "L1", "h", "N", "metric")} == {
        "flavour": "matlab", "k1": 20, "k2": 6, "lambda": 0.3, "L1": 21, "h": 11, "N": 48, "metric": "cosine"}


@pytest.mark.parametrize("flavour", FLAVOUR_NAMES)
def test_fewer_items_than_the_lists_take_all_of_u(flavour):
    """N = 14 < L1 = 21: every top list is all of U, as the dense codes' argsort gives it."""
    data = problem(11, nq=4, ng=10)
    want = expected_rerank(data, flavour, "euclidean", 20, 6, 0.3)
    result = streameval.evaluate(data, **OPTIONS, metric="euclidean", rerank=rerank_option(flavour, 20, 6, 0.3))
    assert_equals_reference(result, want, flavour)
    assert result.to_dict()["rerank"]["knn"]["list_length"] == 14


def test_options_out_of_range_are_refused_before_any_work():
    data = problem(12, nq=4, ng=10)
    with pytest.raises(streameval.OptionError, match="--qe-k 15 is more than the 14 queries"):
        streameval.evaluate(data, qe={"k": 15})
    with pytest.raises(streameval.OptionError, match="rerank must be one of"):
        streameval.evaluate(data, rerank="zhong")
    with pytest.raises(streameval.OptionError, match="--rerank-k2 only go with --rerank"):
        streameval.evaluate(data, rerank_k2=3)
    with pytest.raises(streameval.OptionError, match="keeps no state"):
        streameval.evaluate(data, rerank="matlab", state="unused-state")


@pytest.mark.parametrize("metric, qe, chunking", spread([
    ("cosine", dict(k=5, alpha=3.0, times=2)), ("sqeuclidean", dict(k=2, alpha=1.0, times=1)), ("cosine", "aqe")]))
def test_aqe_alone_equals_the_reference(metric, qe, chunking):
    """The ordinary evaluation on the expanded features (float64): two rounds of the defaults
    (k = 5, alpha = 3), k = 2 with alpha = 1, and qe="aqe" (one round of the defaults)."""
    data = problem(7)
    spelled = dict(k=5, alpha=3.0, times=1) if qe == "aqe" else qe
    check(data, expected_aqe(data, metric, spelled), (metric, qe), [chunking], metric=metric, qe=qe)


@pytest.mark.parametrize("flavour, metric, chunking", spread(zip(FLAVOUR_NAMES, ["euclidean", "cosine"] * 2)))
def test_aqe_then_rerank_equals_the_reference(flavour, metric, chunking):
    data = problem(8)
    qe = dict(k=5, alpha=3.0, times=1)
    want = expected_rerank(data, flavour, metric, 20, 6, 0.3, qe=qe)
    check(data, want, (flavour, metric), [chunking], metric=metric, qe=qe, rerank=rerank_option(flavour, 20, 6, 0.3))


def test_aqe_keeps_exact_duplicates_tied_in_the_reranked_distances():
    """Gallery rows 3 and 9 are equal, so are their expanded features, V rows and A: query 4's final
    values of them are one computation and tie, by index (a case where a float64 GEMM's dot product
    of the two rows differs in the last bit with the row's position)."""
    data = problem(8, dim=6, vmax=3)
    qe = dict(k=5, alpha=3.0, times=1)
    want = expected_rerank(data, "torchreid", "cosine", 20, 6, 0.3, qe=qe)
    assert 4 not in want["undecided"]
    ref = want["reference"]["final"][4]
    assert ref[3] == ref[9]
    check(data, want, "duplicates after aqe", CHUNKINGS[:1], metric="cosine", qe=qe,
          rerank=rerank_option("torchreid", 20, 6, 0.3))


def test_a_float16_store_on_disk(tmp_path):
    """Features read from a store in chunks of 7 rows: the kNN pass, AQE's expanded features and the
    scoring pass all read it."""
    data = problem(9)
    path = tmp_path / "s.zarr"
    streameval.write_store(path, data["qf"], data["q_pids"], data["q_camids"], data["gf"], data["g_pids"],
                           data["g_camids"], dtype="float16", chunk_rows=7)
    qe = dict(k=5, alpha=3.0, times=1)
    want = expected_rerank(data, "torchreid", "cosine", 19, 6, 0.3)
    check(str(path), want, "store", CHUNKINGS[1:2], metric="cosine", rerank=rerank_option("torchreid", 19, 6, 0.3))
    want = expected_rerank(data, "fastreid", "euclidean", 19, 6, 0.3, qe=qe)
    check(str(path), want, "store, aqe", CHUNKINGS[:1], metric="euclidean", qe=qe,
          rerank=rerank_option("fastreid", 19, 6, 0.3))


@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    # as --cluster local starts it (engine/cluster.py), on a free dashboard port
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, env=PIN_ENV,
                                  dashboard_address=":0") as local:
        yield local.scheduler_address


@pytest.mark.slow
def test_a_dask_cluster_equals_the_reference(cluster, tmp_path):
    """The kNN pass and the scoring pass on worker processes (a store they open)."""
    data = problem(10)
    path = tmp_path / "s.zarr"
    streameval.write_store(path, data["qf"], data["q_pids"], data["q_camids"], data["gf"], data["g_pids"],
                           data["g_camids"], chunk_rows=9)
    qe = dict(k=5, alpha=3.0, times=1)
    for flavour, metric, with_qe, chunking in (("matlab", "cosine", False, dict()),
                                               ("fastreid", "euclidean", True, dict(query_block=3, gallery_chunk=7))):
        want = expected_rerank(data, flavour, metric, 19, 6, 0.3, qe=qe if with_qe else None)
        result = streameval.evaluate(str(path), **OPTIONS, metric=metric, scheduler=cluster, qe=qe if with_qe else None,
                                     rerank=rerank_option(flavour, 19, 6, 0.3), **chunking)
        assert_equals_reference(result, want, (flavour, metric, chunking))


@st.composite
def random_cases(draw):
    nq = draw(st.integers(1, 6))
    ng = draw(st.integers(14, 30))
    data = problem(draw(st.integers(0, 2**32 - 1)), nq=nq, ng=ng, dim=draw(st.integers(1, 5)), vmax=draw(st.integers(1, 3)))
    n = nq + ng
    k1 = draw(st.integers(1, n - 1))
    k2 = draw(st.integers(1, min(8, n)))
    gc = draw(st.integers(max(1, math.ceil(ng / 6)), ng))
    chunking = draw(st.sampled_from([dict(), dict(query_block=draw(st.integers(1, nq)), gallery_chunk=gc)]))
    return (data, draw(st.sampled_from(FLAVOUR_NAMES)), draw(st.sampled_from(["cosine", "euclidean", "sqeuclidean"])),
            k1, k2, draw(st.sampled_from([0.0, 0.3, 1.0])), chunking)


def check_random_case(case) -> None:
    data, flavour, metric, k1, k2, lam, chunking = case
    want = expected_rerank(data, flavour, metric, k1, k2, lam)
    result = streameval.evaluate(data, **OPTIONS, metric=metric, rerank=rerank_option(flavour, k1, k2, lam), **chunking)
    assert_equals_reference(result, want, (flavour, metric, k1, k2, lam, chunking))


SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@settings(max_examples=4, **SETTINGS)
@given(random_cases())
def test_random_small_problems(case):
    check_random_case(case)


@pytest.mark.slow
@settings(max_examples=30, **SETTINGS)
@given(random_cases())
def test_more_random_small_problems(case):
    check_random_case(case)


def test_every_feature_reads_the_reranked_distances_as_a_distance_store_would():
    """GOM, trials, open-set identification and verification on --rerank equal the same options on
    the reference's final matrix given as a distance store (a matrix made elsewhere)."""
    data = problem(13, nq=8, ng=40)
    want = expected_rerank(data, "matlab", "euclidean", 20, 6, 0.3)
    options = dict(protocol="market", open_set=True, verification=True, auc=True, trials=3)
    ids_only = {key: value for key, value in data.items() if not key.endswith("f")}
    stored = streameval.evaluate({**ids_only, "distances": want["reference"]["final"]}, **options)
    reranked = streameval.evaluate(data, metric="euclidean", rerank="matlab", **options)
    assert reranked.mAP == pytest.approx(stored.mAP, abs=1e-12)
    np.testing.assert_allclose(reranked.cmc, stored.cmc, atol=1e-12)
    for name in ("MREP", "MFR", "mReP_max"):
        assert reranked.gom[name] == pytest.approx(stored.gom[name], abs=1e-9), name
    assert reranked.open_set["points"] == stored.open_set["points"]
    assert reranked.verification["points"] == stored.verification["points"]
    assert reranked.verification["auc"] == pytest.approx(stored.verification["auc"], abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(query_pids=st.lists(st.integers(0, 3), max_size=6), gallery=st.lists(st.tuples(st.integers(0, 3), st.booleans()),
                                                                              max_size=8))
def test_the_canonical_pairs_of_a_block_are_those_of_one_identity_or_a_twin(query_pids, gallery):
    from streameval.features.rerank.source import canonical_pairs

    q = np.array(query_pids, dtype=np.int64)
    g = np.array([pid for pid, _ in gallery], dtype=np.int64)
    twins = np.array([twin for _, twin in gallery], dtype=bool)
    rows, columns = canonical_pairs(q, g, twins)
    expected = np.nonzero((q[:, None] == g[None, :]) | twins[None, :])
    np.testing.assert_array_equal(rows, expected[0])
    np.testing.assert_array_equal(columns, expected[1])
