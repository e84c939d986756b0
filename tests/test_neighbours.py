"""The kNN pass (engine/neighbours.py) against brute force: every U row's top-k by (canonical
distance, U row), the row itself at distance 0, the farthest distance; pair distances over U."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings, strategies as st

from streameval.core.progress import Phases
from streameval.engine import sources
from streameval.engine.neighbours import (block_rows, neighbour_pass, pair_block_rows, pair_distances, read_u_rows,
                                         screen, symmetric_plan)
from streameval.engine.plan import Plan
from streameval.run.session import Runner
from streameval.store import write_store


def dense_distances(u: np.ndarray, metric: str) -> np.ndarray:
    """The canonical distances of integer-valued rows (every dot exact), the diagonal 0, none below 0."""
    u = u.astype(np.float64)
    if metric == "cosine":
        norms = np.sqrt((u * u).sum(1))
        d = np.maximum(1.0 - (u @ u.T) / (norms[:, None] * norms[None, :]), 0.0)  # parallel rows: 0
    else:
        terms = (u * u).sum(1)
        d = np.maximum(terms[:, None] + terms[None, :] - 2.0 * (u @ u.T), 0.0)
    np.fill_diagonal(d, 0.0)
    return d


def problem(seed: int, nq: int, ng: int, dim: int):
    """A store of integer-valued features with exact duplicates (a gallery pair, a query in the gallery)."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-2, 3, (nq, dim)).astype(np.float32)
    g = rng.integers(-2, 3, (ng, dim)).astype(np.float32)
    q[(q * q).sum(1) == 0, 0] = 1.0
    g[(g * g).sum(1) == 0, 0] = 1.0
    g[1] = g[0]
    g[2] = q[0]
    store = write_store(zarr.storage.MemoryStore(), q, rng.integers(0, 5, nq), rng.integers(0, 3, nq), g,
                        rng.integers(0, 5, ng), rng.integers(0, 3, ng))
    return store, np.concatenate([q, g])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), nq=st.integers(1, 20), ng=st.integers(3, 60), dim=st.integers(1, 9),
       k=st.integers(1, 25), metric=st.sampled_from(["cosine", "sqeuclidean"]),
       block=st.integers(1, 30), chunk=st.integers(1, 40), workers=st.integers(1, 3))
def test_every_row_gets_its_exact_top_k_and_farthest_distance(seed, nq, ng, dim, k, metric, block, chunk, workers):
    store, u = problem(seed, nq, ng, dim)
    k = min(k, u.shape[0])
    runner = Runner(None, Plan(block, chunk, workers), Phases(), None)
    found = neighbour_pass((store.query, store.gallery), k, metric, runner, np.float32)
    d = dense_distances(u, metric)
    rows = np.arange(u.shape[0])
    expected = np.stack([np.lexsort((rows, d[i]))[:k] for i in rows])
    np.testing.assert_array_equal(found.index, expected)
    np.testing.assert_array_equal(found.dist, np.take_along_axis(d, expected, 1))
    np.testing.assert_array_equal(found.farthest, d.max(1))
    assert found.metric == metric and found.k == k


def test_an_exact_duplicate_with_a_lower_row_comes_before_the_row_itself():
    """Ties by U row, the row itself not forced first: gallery row 2 is query 0's copy, so U row
    nq + 2 lists query 0 (row 0) first, both at distance 0."""
    store, u = problem(1, 4, 10, 3)
    runner = Runner(None, Plan(2, 3, 2), Phases(), None)
    found = neighbour_pass((store.query, store.gallery), 3, "sqeuclidean", runner, np.float32)
    copy = 4 + 2
    assert list(found.index[copy, :2]) == [0, copy] and list(found.dist[copy, :2]) == [0.0, 0.0]
    assert list(found.index[0, :2]) == [0, copy]


@pytest.mark.parametrize("metric", ["cosine", "sqeuclidean"])
def test_pair_distances_over_u_are_the_canonical_ones(metric):
    store, u = problem(2, 7, 40, 5)
    runner = Runner(None, Plan(5, 6, 2), Phases(), None)
    rng = np.random.default_rng(0)
    first, second = rng.integers(0, u.shape[0], 300), rng.integers(0, u.shape[0], 300)
    got = pair_distances((store.query, store.gallery), metric, np.float32, first, second, runner)
    np.testing.assert_array_equal(got, dense_distances(u, metric)[first, second])
    np.testing.assert_array_equal(read_u_rows((store.query, store.gallery), second, np.float32), u[second])


def test_blocks_take_the_memory_the_plan_gave_a_scoring_tasks_dot_products():
    """A kNN task holds a sub-block of dot products, not the scoring task's block x chunk: the rest
    holds more rows of U per block (fewer reads of U); small query blocks stay as planned."""
    # 2 workers x (2,000 - 512) rows x 1,000 x 4 B freed, over 2 blocks of 424 B rows (32 features,
    # 40 terms, norms, index and ids, 2 chains x 2 copies x (80 list + 8 farthest))
    assert block_rows(Plan(2000, 1000, 2), 8, 4, 5) == 11_904_000 // 848
    assert block_rows(Plan(2000, 100, 2), 8, 4, 5) == 2000
    assert block_rows(Plan(600, 10, 2), 8, 4, 5) == 600
    assert block_rows(Plan(300, 5000, 4), 8, 4, 5) == 300


def test_pair_blocks_take_a_workers_share_of_u_within_the_memory_of_a_knn_block():
    """``pair_distances`` holds no lists: blocks of ``block_rows`` without them, at most a worker's
    share of U (every worker gets a block), never under the plan's query block."""
    # 2 workers x (600 - 512) rows x 1,500 x 4 B freed over 2 blocks of 88 B rows (16 features, 40,
    # 2 chains x 2 copies x 8 farthest): 6,000 rows, capped at half of 1,530 rows
    assert pair_block_rows(Plan(600, 1500, 2), 4, 4, 1530) == 765
    assert pair_block_rows(Plan(600, 1500, 2), 4, 4, 20_000) == 6000
    assert pair_block_rows(Plan(600, 1500, 2), 4, 4, 700) == 600
    assert pair_block_rows(Plan(5, 6, 2), 4, 4, 47) == 5


def test_pair_distances_in_grown_blocks_are_the_canonical_ones():
    store, u = problem(8, 30, 1500, 4)
    runner = Runner(None, Plan(600, 1500, 2), Phases(), None)
    rng = np.random.default_rng(1)
    first, second = rng.integers(0, u.shape[0], 3000), rng.integers(0, u.shape[0], 3000)
    got = pair_distances((store.query, store.gallery), "sqeuclidean", np.float32, first, second, runner)
    np.testing.assert_array_equal(got, dense_distances(u, "sqeuclidean")[first, second])


def test_grown_blocks_give_the_exact_lists():
    """Blocks larger than the plan's query block (1,294 rows against 600) list the same."""
    store, u = problem(7, 30, 1500, 4)
    plan = Plan(600, 1500, 2)
    assert block_rows(plan, 4, 4, 5) == 1294
    found = neighbour_pass((store.query, store.gallery), 5, "sqeuclidean", Runner(None, plan, Phases(), None),
                           np.float32)
    d = dense_distances(u, "sqeuclidean")
    rows = np.arange(u.shape[0])
    expected = np.stack([np.lexsort((rows, d[i]))[:5] for i in rows])
    np.testing.assert_array_equal(found.index, expected)
    np.testing.assert_array_equal(found.farthest, d.max(1))


@settings(max_examples=30, deadline=None)
@given(values=st.lists(st.sampled_from([-np.inf, -1.0, 0.0, 0.5, 1.0, 2.0, np.inf]), max_size=40),
       below=st.sampled_from([-1.0, 0.0, 0.5, np.inf]), above=st.sampled_from([-np.inf, 0.5, 1.0, 2.0]))
def test_the_screen_keeps_exactly_the_rows_near_either_limit(values, below, above):
    dist = np.array(values, dtype=np.float64)
    candidates = np.empty(dist.shape[0], dtype=np.int64)
    n = screen(dist, below, above, candidates)
    np.testing.assert_array_equal(candidates[:n], np.flatnonzero((dist <= below) | (dist >= above)))


def test_blocks_are_whole_chunks():
    """A chunk lies inside a block of the kNN pass or wholly past it: blocks of ``block_rows`` rounded
    down to whole chunks, a chunk no larger than a block."""
    for plan, dim, k in ((Plan(2000, 1000, 2), 8, 5), (Plan(600, 1500, 2), 4, 5), (Plan(2, 3, 2), 3, 3),
                         (Plan(7, 3, 3), 5, 2)):
        got = symmetric_plan(plan, dim, 4, k)
        rows = block_rows(plan, dim, 4, k)
        assert got.query_block % got.gallery_chunk == 0 and got.gallery_chunk <= got.query_block <= rows
        assert got.gallery_chunk == min(plan.gallery_chunk, rows) and rows - got.query_block < got.gallery_chunk


def test_each_pair_is_computed_once_but_within_a_chunk(monkeypatch):
    """The distance is symmetric: the pass's GEMMs hold each pair of U once, but a chunk's pairs with
    itself (both ways round in one GEMM), and the lists are still exact."""
    store, u = problem(11, 40, 200, 4)
    computed = []
    block = sources.FeatureSource.block

    def counted(self, part, start, stop, queries, chunk, rows):
        dots = block(self, part, start, stop, queries, chunk, rows)
        computed.append(dots.size)
        return dots

    monkeypatch.setattr(sources.FeatureSource, "block", counted)
    runner = Runner(None, Plan(30, 10, 2), Phases(), None)
    found = neighbour_pass((store.query, store.gallery), 4, "sqeuclidean", runner, np.float32)
    n, chunk = u.shape[0], symmetric_plan(runner.plan, 4, 4, 4).gallery_chunk
    # every unordered pair at least once; twice only the pairs within a chunk (n chunk rows at most)
    assert n * (n + 1) // 2 <= sum(computed) <= n * (n + 1) // 2 + n * chunk // 2
    d = dense_distances(u, "sqeuclidean")
    rows = np.arange(n)
    np.testing.assert_array_equal(found.index, np.stack([np.lexsort((rows, d[i]))[:4] for i in rows]))
