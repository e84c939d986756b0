"""The engine against the brute-force reference (tests/reference.py) on many small random problems.

Integer-valued features (small values, stored as float32 or float16) make every distance exact in
every precision and make ties frequent, so these tests pin the tie rule (ties broken by gallery
index) and the protocol (junk, distractors, same-camera positives, open-set queries) exactly.  Every
problem is evaluated with the default chunking and with random query blocks / gallery chunks: the
numbers must match the reference to 1e-12 and be bit-identical across chunkings.
"""

from __future__ import annotations

import contextlib
import json
import math
import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import streameval
from streameval import open_store, write_store
from streameval.engine import graph, plan
from streameval.engine.plan import GALLERY_SUB_BLOCK, PAIR_SCRATCH_BYTES, QUERY_SUB_BLOCK, make_plan

from reference import reference_evaluate

TOL = 1e-12
MAX_TASK_PAIRS = 12  # (query blocks) x (gallery chunks) per drawn chunking: keeps each evaluate() fast

SETTINGS = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)

# (metric, precision) pairs exact against a float64 reference for integer-valued features
EXACT_SCORINGS = [
    ("sqeuclidean", "float32"),
    ("euclidean", "float32"),
    ("cosine", "float64"),
    ("sqeuclidean", "float64"),
    ("euclidean", "float64"),
]


# --------------------------------------------------------------------------------------------- helpers


def _close(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= TOL


def assert_matches_reference(result, ref, max_rank: int) -> None:
    for key in ("n_queries", "n_valid_queries", "n_open_queries", "n_gallery"):
        assert getattr(result, key) == ref[key], key
    for key in ("mAP", "mAP_trapezoid", "mINP"):
        assert _close(getattr(result, key), ref[key]), (key, getattr(result, key), ref[key])
    if ref["cmc"] is None:
        assert result.cmc is None
    else:
        assert result.cmc is not None
        cmc = np.asarray(result.cmc, dtype=np.float64)
        assert cmc.shape == (max_rank,)
        np.testing.assert_allclose(cmc, ref["cmc"], rtol=0, atol=TOL)
        assert result.rank(1) == cmc[0]
    pq, rpq = result.per_query, ref["per_query"]
    for key in ("first_hit_rank", "n_positives"):
        np.testing.assert_array_equal(np.asarray(pq[key]), rpq[key], err_msg=key)
    for key in ("ap", "ap_trapezoid", "inp"):
        got = np.asarray(pq[key], dtype=np.float64)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(rpq[key]), err_msg=key)
        np.testing.assert_allclose(got, rpq[key], rtol=0, atol=TOL, equal_nan=True, err_msg=key)


def assert_identical(a, b) -> None:
    """Two evaluations of the same problem (different chunkings) give bit-identical numbers."""
    for key in ("n_queries", "n_valid_queries", "n_open_queries", "n_gallery", "mAP", "mAP_trapezoid", "mINP"):
        assert getattr(a, key) == getattr(b, key), key
    if a.cmc is None:
        assert b.cmc is None
    else:
        np.testing.assert_array_equal(a.cmc, b.cmc)
    for key in ("ap", "ap_trapezoid", "inp", "first_hit_rank", "n_positives"):
        np.testing.assert_array_equal(a.per_query[key], b.per_query[key], err_msg=key)


@st.composite
def chunking(draw, nq: int, ng: int):
    """(query_block, gallery_chunk) with at most MAX_TASK_PAIRS block pairs (1..N each)."""
    gc = draw(st.integers(max(1, math.ceil(ng / MAX_TASK_PAIRS)), ng))
    q_blocks = max(1, MAX_TASK_PAIRS // math.ceil(ng / gc))
    qb = draw(st.integers(max(1, math.ceil(nq / q_blocks)), nq))
    return qb, gc


@st.composite
def chunkings(draw, nq: int, ng: int, n: int = 2):
    """The defaults plus ``n`` drawn chunkings."""
    return [(None, None)] + [draw(chunking(nq, ng)) for _ in range(n)]


@st.composite
def ids(draw, nq: int, ng: int):
    """Person and camera ids with junk (-1), distractors (0), same-camera positives, open-set queries.

    Query pids reach one past the gallery's range, so some queries have no gallery match at all.
    """
    n_pids = draw(st.integers(1, 6))
    n_cams = draw(st.integers(1, 3))
    g_pids = draw(hnp.arrays(np.int64, ng, elements=st.integers(-1, n_pids)))
    q_pids = draw(hnp.arrays(np.int64, nq, elements=st.integers(-1, n_pids + 1)))
    g_cams = draw(hnp.arrays(np.int64, ng, elements=st.integers(0, n_cams - 1)))
    q_cams = draw(hnp.arrays(np.int64, nq, elements=st.integers(0, n_cams - 1)))
    junk = draw(st.one_of(st.just((-1,)), st.lists(st.integers(-1, n_pids + 1), max_size=3).map(tuple)))
    return q_pids, q_cams, g_pids, g_cams, junk


def integer_features(nq: int, ng: int, dim: int, vmax: int):
    return hnp.arrays(np.float32, (nq + ng, dim), elements=st.integers(-vmax, vmax).map(float))


def no_zero_rows(f: np.ndarray) -> np.ndarray:
    """Cosine distance is undefined for an all-zero vector: give such rows a unit first component."""
    f = f.copy()
    f[~f.any(axis=1), 0] = 1
    return f


@st.composite
def integer_problems(draw, max_nq: int = 30, max_ng: int = 80, max_dim: int = 8):
    nq = draw(st.integers(1, max_nq))
    ng = draw(st.integers(1, max_ng))
    dim = draw(st.integers(1, max_dim))
    vmax = draw(st.integers(1, 3))  # small ranges: many exact ties
    metric, precision = draw(st.sampled_from(EXACT_SCORINGS))
    feats = draw(integer_features(nq, ng, dim, vmax))
    if metric == "cosine":
        feats = no_zero_rows(feats)
    q_pids, q_cams, g_pids, g_cams, junk = draw(ids(nq, ng))
    data = dict(qf=feats[:nq], q_pids=q_pids, q_camids=q_cams, gf=feats[nq:], g_pids=g_pids, g_camids=g_cams)
    options = dict(
        metric=metric, precision=precision, protocol=draw(st.sampled_from(["market", "none"])),
        junk_pids=junk, max_rank=draw(st.one_of(st.just(50), st.integers(1, 100))),
    )
    return data, options


def reference_for(data: dict, options: dict, features_dtype=np.float32) -> dict:
    """Reference numbers for features as the store holds them (cast to the store dtype)."""
    return reference_evaluate(
        np.asarray(data["qf"]).astype(features_dtype), data["q_pids"], data["q_camids"],
        np.asarray(data["gf"]).astype(features_dtype), data["g_pids"], data["g_camids"],
        metric=options["metric"], protocol=options["protocol"], junk_pids=options["junk_pids"],
        max_rank=options["max_rank"],
    )


def check_all_chunkings(source, data: dict, options: dict, plans, features_dtype=np.float32) -> None:
    ref = reference_for(data, options, features_dtype)
    results = []
    for qb, gc in plans:
        result = streameval.evaluate(source, query_block=qb, gallery_chunk=gc, **options)
        assert_matches_reference(result, ref, options["max_rank"])
        results.append(result)
    for other in results[1:]:
        assert_identical(results[0], other)


# ----------------------------------------------------------------------------------------------- tests


@settings(max_examples=100, **SETTINGS)
@given(st.data())
def test_integer_features_match_reference(data):
    """All metrics, protocols, junk sets, max_rank below and above the gallery size, many chunkings."""
    problem, options = data.draw(integer_problems())
    plans = data.draw(chunkings(len(problem["q_pids"]), len(problem["g_pids"])))
    check_all_chunkings(problem, problem, options, plans)


@settings(max_examples=50, **SETTINGS)
@given(st.data())
def test_tiny_problems_every_chunking(data):
    """Tiny problems, evaluated with every (query_block, gallery_chunk) pair there is."""
    problem, options = data.draw(integer_problems(max_nq=3, max_ng=5, max_dim=3))
    nq, ng = len(problem["q_pids"]), len(problem["g_pids"])
    plans = [(None, None)] + [(qb, gc) for qb in range(1, nq + 1) for gc in range(1, ng + 1)]
    check_all_chunkings(problem, problem, options, plans)


@settings(max_examples=40, **SETTINGS)
@given(st.data())
def test_continuous_features_float64(data):
    """Random continuous features (stored float32), distances in float64: no exact ties expected."""
    nq = data.draw(st.integers(1, 30))
    ng = data.draw(st.integers(1, 80))
    dim = data.draw(st.integers(1, 8))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    scale = data.draw(st.sampled_from([1e-3, 1.0, 1e3]))
    q_pids, q_cams, g_pids, g_cams, junk = data.draw(ids(nq, ng))
    problem = dict(
        qf=rng.standard_normal((nq, dim)) * scale, q_pids=q_pids, q_camids=q_cams,
        gf=rng.standard_normal((ng, dim)) * scale, g_pids=g_pids, g_camids=g_cams,
    )
    options = dict(
        metric=data.draw(st.sampled_from(["euclidean", "sqeuclidean", "cosine"])), precision="float64",
        protocol=data.draw(st.sampled_from(["market", "none"])), junk_pids=junk,
        max_rank=data.draw(st.integers(1, 100)),
    )
    check_all_chunkings(problem, problem, options, data.draw(chunkings(nq, ng)))


@settings(max_examples=30, suppress_health_check=SETTINGS["suppress_health_check"] + [HealthCheck.function_scoped_fixture], deadline=None)
@given(st.data())
def test_float16_store_from_path(tmp_path, data):
    """Integer features written as a float16 store on disk (any store chunking), evaluated by path."""
    problem, options = data.draw(integer_problems())
    nq, ng = len(problem["q_pids"]), len(problem["g_pids"])
    path = tmp_path / f"{uuid.uuid4().hex}.zarr"
    chunk_rows = data.draw(st.integers(1, max(nq, ng)))
    write_store(path, problem["qf"], problem["q_pids"], problem["q_camids"],
                problem["gf"], problem["g_pids"], problem["g_camids"], dtype="float16", chunk_rows=chunk_rows)
    store = open_store(path)
    assert store.query.features.dtype == np.float16 and store.gallery.features.dtype == np.float16
    np.testing.assert_array_equal(store.gallery.features[:], problem["gf"])  # integers are exact in float16
    check_all_chunkings(str(path), problem, options, data.draw(chunkings(nq, ng)), features_dtype=np.float16)


def _tie_vectors(case):
    """(query row, gallery row) of one identical-rows case: 1-D decimals, or random vectors."""
    if case == "1d":
        return np.array([0.1], np.float32), np.array([0.2], np.float32)  # not exact in binary
    dim, seed = case
    rng = np.random.default_rng(seed)
    return rng.standard_normal(dim).astype(np.float32), rng.standard_normal(dim).astype(np.float32)


@pytest.mark.parametrize("case", ["1d", (16, 29), (32, 1), (64, 36), (64, 38)])
@pytest.mark.parametrize("precision", ["float32", "float64"])
@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean", "cosine"])
@pytest.mark.parametrize("positive_first", [True, False])
def test_identical_gallery_rows_are_tied(case, precision, metric, positive_first):
    """Two identical gallery rows, one positive and one negative: an exact tie, broken by index.

    The features are not integers, so the tie only holds if both rows get one distance, whatever
    kernel computes it (the (64, 36)-like cases are ones where a different summation order of the
    float64 dot product changes the last bit).
    """
    q, v = _tie_vectors(case)
    g_pids = np.array([1, 2]) if positive_first else np.array([2, 1])
    problem = dict(qf=q[None, :], q_pids=np.array([1]), q_camids=np.array([0]),
                   gf=np.stack([v, v]), g_pids=g_pids, g_camids=np.array([1, 1]))
    options = dict(metric=metric, precision=precision, protocol="market", junk_pids=(-1,), max_rank=2)
    ref = reference_for(problem, options)
    assert ref["mAP"] == (1.0 if positive_first else 0.5)
    for qb, gc in ((None, None), (1, 1)):
        result = streameval.evaluate(problem, query_block=qb, gallery_chunk=gc, **options)
        assert_matches_reference(result, ref, 2)
        assert result.cmc[0] == (1.0 if positive_first else 0.0)


def _nudged(row: np.ndarray, rng, n: int) -> np.ndarray:
    """``n`` copies of a float32 row, each with one random coordinate moved by 1-3 units in the last
    place: distances to a query differ from the row's by ~1e-9 relative, far inside a float32 GEMM's
    error window (~D 6e-8) and far outside float64 rounding."""
    out = np.repeat(row[None, :], n, axis=0)
    for copy in out:
        k = rng.integers(row.shape[0])
        for _ in range(rng.integers(1, 4)):
            copy[k] = np.nextafter(copy[k], np.float32(np.inf) if rng.random() < 0.5 else np.float32(-np.inf))
    return out


@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean", "cosine"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_near_ties_beyond_the_gemm_precision_are_ranked_exactly(metric, seed):
    """Negatives a few ulps from each positive: the float32 GEMM's window leaves every one of them
    undecided, and the float64 decision (``kernels.refined_dots``, else the canonical distance) must
    order them as the float64 reference does, in any chunking."""
    rng = np.random.default_rng(seed)
    dim, nq = 96, 3
    qf = rng.standard_normal((nq, dim)).astype(np.float32)
    positives = rng.standard_normal((4, dim)).astype(np.float32)
    gf = np.concatenate([positives] + [_nudged(p, rng, 6) for p in positives])
    g_pids = np.concatenate([np.ones(4, np.int64), np.full(24, 2)])
    order = rng.permutation(gf.shape[0])
    problem = dict(qf=qf, q_pids=np.ones(nq, np.int64), q_camids=np.zeros(nq, np.int64),
                   gf=gf[order], g_pids=g_pids[order], g_camids=np.ones(gf.shape[0], np.int64))
    options = dict(metric=metric, precision="float32", protocol="market", junk_pids=(-1,), max_rank=28)
    check_all_chunkings(problem, problem, options, [(None, None), (1, 5), (2, 3)])


@pytest.mark.parametrize("precision", ["float32", "float64"])
# no shrink phase: a failure here is reported at once instead of after minutes of shrinking
@settings(max_examples=30, phases=(Phase.explicit, Phase.reuse, Phase.generate), **SETTINGS)
@given(data=st.data())
def test_duplicate_rows_tie_by_gallery_index(precision, data):
    """Non-integer features with duplicated gallery rows: identical vectors are exact ties.

    A duplicate of a positive carried by a negative (or by another positive) must be ordered by
    gallery index, in any precision and any chunking: two identical rows have one distance.
    """
    nq = data.draw(st.integers(1, 10))
    dim = data.draw(st.integers(1, 64))
    n_distinct = data.draw(st.integers(1, 4))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    distinct = rng.standard_normal((n_distinct, dim)).astype(np.float32)
    copies = data.draw(st.lists(st.integers(0, n_distinct - 1), min_size=1, max_size=24))
    gf = distinct[copies]
    ng = gf.shape[0]
    q_pids, q_cams, g_pids, g_cams, junk = data.draw(ids(nq, ng))
    problem = dict(
        qf=rng.standard_normal((nq, dim)).astype(np.float32), q_pids=q_pids, q_camids=q_cams,
        gf=gf, g_pids=g_pids, g_camids=g_cams,
    )
    options = dict(
        metric=data.draw(st.sampled_from(["euclidean", "sqeuclidean", "cosine"])), precision=precision,
        protocol=data.draw(st.sampled_from(["market", "none"])), junk_pids=junk, max_rank=10,
    )
    check_all_chunkings(problem, problem, options, data.draw(chunkings(nq, ng)))


# --------------------------------------------------------------------------- sub-blocks inside a task


@contextlib.contextmanager
def sub_blocks_of(queries: int, rows: int):
    """Tasks make their values QUERY_SUB_BLOCK x GALLERY_SUB_BLOCK at a time: made small here, so a
    task of a small problem holds many sub-blocks (512 x 4096 by default: one)."""
    with pytest.MonkeyPatch.context() as patch:
        for module in (graph, plan):  # the passes' and the plan's (``plan.read_chunk``)
            patch.setattr(module, "QUERY_SUB_BLOCK", queries)
            patch.setattr(module, "GALLERY_SUB_BLOCK", rows)
        yield


@settings(max_examples=40, **SETTINGS)
@given(st.data())
def test_sub_blocks_of_a_task_match_reference(data):
    """A task's query rows and gallery rows split into sub-blocks of any size: the reference's numbers
    in every chunking, bit-identical to one sub-block a task."""
    problem, options = data.draw(integer_problems())
    nq, ng = len(problem["q_pids"]), len(problem["g_pids"])
    plans = data.draw(chunkings(nq, ng))
    with sub_blocks_of(data.draw(st.integers(1, 6)), data.draw(st.integers(1, 9))):
        check_all_chunkings(problem, problem, options, plans)
    chunking = dict(query_block=plans[1][0], gallery_chunk=plans[1][1])
    one = streameval.evaluate(problem, **chunking, **options)
    with sub_blocks_of(3, 4):
        assert_identical(streameval.evaluate(problem, **chunking, **options), one)


def test_sub_blocks_give_every_statistic_the_same_numbers():
    """GOM, open-set, verification and their per-query arrays over sub-blocks of 3 x 5: the numbers
    of one sub-block a task."""
    rng = np.random.default_rng(7)
    nq, ng = 23, 61
    problem = dict(qf=rng.integers(-3, 4, (nq, 6)).astype(np.float32), q_pids=rng.integers(0, 9, nq),
                   q_camids=rng.integers(0, 3, nq), gf=rng.integers(-3, 4, (ng, 6)).astype(np.float32),
                   g_pids=rng.integers(0, 12, ng), g_camids=rng.integers(0, 3, ng))
    problem["qf"][problem["qf"].sum(axis=1) == 0, 0] = 1  # no zero rows (cosine)
    problem["gf"][~problem["gf"].any(axis=1), 0] = 1
    options = dict(metric="euclidean", open_set=True, verification=True, gallery_chunk=17, query_block=9)
    plain = streameval.evaluate(problem, **options).to_dict(per_query=True)
    with sub_blocks_of(3, 5):
        split = streameval.evaluate(problem, **options).to_dict(per_query=True)
    plain.pop("run"), split.pop("run")
    assert json.dumps(split, sort_keys=True, default=str) == json.dumps(plain, sort_keys=True, default=str)


def test_a_planned_task_reads_whole_store_chunks_within_its_memory():
    """The planned gallery chunk is a fraction of a store chunk where the budget sizes it so (a block
    of every query x the chunk): a task then reads as many of them as its memory holds, up to the
    store chunk and a task a worker's quarter of the gallery; an explicit chunk is read as given."""
    shape = dict(n_query=10_000, n_gallery=100_000, dim=256, itemsize=4, stored_itemsize=2, store_chunk_rows=16384,
                 workers=2)
    planned = make_plan(**shape)
    assert (planned.gallery_chunk, planned.read_chunk) == (4096, 8192)
    assert planned.read_ranges(100_000)[:2] == [(0, 8192), (8192, 16384)]
    # the positives pass's short tasks read whole store chunks, two tasks a worker at least
    assert planned.positives_ranges(100_000)[-2:] == [(81920, 98304), (98304, 100000)]
    assert make_plan(**{**shape, "n_gallery": 60_000}).positives_rows == 8192
    # the 1,696 rows left after twelve tasks: a task for each worker, not one that ends the pass alone
    assert planned.read_ranges(100_000)[-3:] == [(90112, 98304), (98304, 99152), (99152, 100000)]
    assert planned.read_ranges(100_000, 98_000) == [(98_000, 99_000), (99_000, 100_000)]
    assert planned.read_ranges(98_304 + 100)[-1] == (98_304, 98_404)  # too few rows to share
    # after eleven whole tasks: the odd one and the 1,696 left shared, so each worker has six tasks
    assert planned.read_ranges(90_112 + 1_696)[-3:] == [(73_728, 81_920), (81_920, 86_864), (86_864, 91_808)]
    assert planned.read_ranges(9 * 8192)[-3:] == [(57_344, 65_536), (65_536, 69_632), (69_632, 73_728)]  # nine whole: 4.5 each
    assert make_plan(**shape, memory_budget=1 << 32).read_chunk == 8192  # a worker's quarter: 12,500 rows
    given = make_plan(**shape, gallery_chunk=4096)
    assert given.read_chunk == 4096 and given.read_ranges(100_000)[-1] == (98_304, 100_000)
    assert given.positives_ranges(100_000) == given.read_ranges(100_000)
    def memory(rows: int) -> int:  # a sub-block's dot products and lists, and the rows read
        return QUERY_SUB_BLOCK * min(rows, GALLERY_SUB_BLOCK) * (4 + PAIR_SCRATCH_BYTES) + rows * 256 * (4 + 2)

    for budget in (1 << 26, 1 << 28, 1 << 30):  # the memory, then the balance binds
        planned = make_plan(**shape, memory_budget=budget)
        assert planned.read_chunk % planned.gallery_chunk == 0 and planned.read_chunk <= 16384
        assert memory(planned.read_chunk) <= planned.task_bytes
        assert memory(2 * planned.read_chunk) > planned.task_bytes or 2 * planned.read_chunk > 12_500


def test_the_default_budget_is_half_a_gib_a_worker_within_the_machines_memory(monkeypatch):
    """At least 1 GiB, 512 MiB a worker beyond two, at most a quarter of the machine's memory."""
    from streameval.engine import plan

    gib = 1 << 30
    monkeypatch.setattr(plan, "physical_memory", lambda: 128 * gib)
    assert [plan.default_memory_budget(workers) for workers in (1, 2, 3, 16, 64, 128)] == \
        [gib, gib, 3 * gib // 2, 8 * gib, 32 * gib, 32 * gib]
    monkeypatch.setattr(plan, "physical_memory", lambda: 2 * gib)  # a quarter is less than the least
    assert plan.default_memory_budget(16) == gib
    monkeypatch.setattr(plan, "physical_memory", lambda: None)  # a system that does not say
    assert plan.default_memory_budget(16) == 8 * gib
    assert plan.resolve_budget(None, 4) == 2 * gib and plan.resolve_budget("3GB", 4) == 3 * 10**9


def test_sixteen_workers_default_plan_reads_whole_store_chunks(monkeypatch):
    """10,000 x 10,000,000 x 256 (float16 store) on 16 workers: the default budget plans tasks of
    whole 16,384-row store chunks; 1 GiB shared by the 16 planned tasks of 512 rows, a 32nd of one
    (each task's per-query costs then paid 32 times as often: twice the time, README)."""
    from streameval.engine import plan

    monkeypatch.setattr(plan, "physical_memory", lambda: 128 << 30)
    shape = dict(n_query=10_000, n_gallery=10_000_000, dim=256, itemsize=4, stored_itemsize=2,
                 store_chunk_rows=16384, workers=16)
    assert make_plan(**shape).read_chunk == 16384
    assert make_plan(**shape, memory_budget=1 << 30).read_chunk == 512


def test_a_planned_task_reading_several_chunks_matches_reference(tmp_path):
    """A store chunk of 1,024 rows, a budget that plans 256-row gallery chunks, small sub-blocks: each
    task reads 512 rows (``plan.read_chunk``), two share the 304 left, and a positives task the whole
    store chunk; the reference's numbers, as with chunks read as given."""
    rng = np.random.default_rng(11)
    nq, ng, dim = 30, 4400, 4
    problem = dict(qf=rng.integers(-3, 4, (nq, dim)).astype(np.float32), q_pids=rng.integers(0, 25, nq),
                   q_camids=rng.integers(0, 6, nq), gf=rng.integers(-3, 4, (ng, dim)).astype(np.float32),
                   g_pids=rng.integers(0, 25, ng), g_camids=rng.integers(0, 6, ng))
    path = tmp_path / "chunked.zarr"
    write_store(path, problem["qf"], problem["q_pids"], problem["q_camids"], problem["gf"], problem["g_pids"],
                problem["g_camids"], chunk_rows=1024)
    options = dict(metric="sqeuclidean", protocol="market", junk_pids=(-1,), max_rank=20)
    budget = 182_000  # ~300 rows a chunk fit (aligned down to 256); a worker's quarter is 512 rows
    with sub_blocks_of(3, 4):
        planned = make_plan(nq, ng, dim, 4, 4, 1024, 2, budget)
        assert (planned.gallery_chunk, planned.read_chunk) == (256, 512)
        assert planned.read_ranges(ng)[-3:] == [(3584, 4096), (4096, 4248), (4248, 4400)]
        assert planned.positives_ranges(ng)[-2:] == [(3072, 4096), (4096, 4400)]
        result = streameval.evaluate(str(path), memory_budget=budget, workers=2, no_gom=True, **options)
        given = streameval.evaluate(str(path), memory_budget=budget, workers=2, no_gom=True, gallery_chunk=256,
                                    **options)
    assert_matches_reference(result, reference_for(problem, options), options["max_rank"])
    assert_identical(result, given)
