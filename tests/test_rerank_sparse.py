"""The query rows' sparse Jaccard distances (PROTOCOLS.md 6.1 steps 1-4, 6.2 steps 2-5) equal the dense
float64 reference's: from exact neighbour lists, J < 1 on the returned pairs and J = 1 everywhere
else, for every flavour, odd and even k1, k2 = 1 and 6, exact duplicates and queries' copies."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rerank_reference import base_distance, rerank_reference
from streameval.core.errors import OptionError
from streameval.engine.neighbours import Neighbours
from streameval.features.rerank.flavours import FLAVOURS
from streameval.features.rerank.sparse import jaccard

LAM = 0.3


def union_distances(qf, gf, metric):
    """The canonical d over U = queries then gallery, self distance 0."""
    u = np.concatenate([qf, gf]).astype(np.float64)
    d = base_distance(u, u, metric)
    np.fill_diagonal(d, 0.0)
    return d


def exact_neighbours(d, k, metric, key=None):
    """What the kNN pass returns: each row's first k U rows by (key, row) with their d, and its
    farthest d.  The key is by default B's order, max(d, 0): B counts a d rounded below 0 as 0."""
    key = np.maximum(d, 0.0) if key is None else key
    order = np.lexsort((np.broadcast_to(np.arange(d.shape[1]), d.shape), key), axis=1)[:, :k]
    return Neighbours(order, np.take_along_axis(d, order, axis=1), d.max(axis=1), metric)


def sparse_jaccard(qf, gf, flavour, metric, k1, k2, extra=0, key=None):
    """``jaccard`` on exact lists of max(L1, k2) (+ ``extra``) entries, pair distances read from the
    dense d; returns it, the dense d, the lists and every pair batch pair_distances was asked for."""
    base = flavour.base_metric(metric)
    d = union_distances(qf, gf, base)
    k = min(len(d), max(flavour.lists(k1), k2) + extra)
    neighbours = exact_neighbours(d, k, base, None if key is None else key(d))
    asked = []

    def pair_distances(i, j):
        asked.append((i.copy(), j.copy()))
        return d[i, j]

    return jaccard(neighbours, len(qf), flavour, metric, k1, k2, pair_distances), d, neighbours, asked


def dense(result, n_queries, n):
    """J over queries x U: the returned values, 1 elsewhere."""
    j = np.ones((n_queries, n))
    for q in range(n_queries):
        span = slice(result.indptr[q], result.indptr[q + 1])
        j[q, result.cols[span]] = result.values[span]
    return j


def check(qf, gf, name, metric, k1, k2, extra=0, key=None):
    flavour = FLAVOURS[name]
    result, d, neighbours, asked = sparse_jaccard(qf, gf, flavour, metric, k1, k2, extra, key)
    nq, n = len(qf), len(d)
    ref = rerank_reference(qf, gf, name, metric, k1, k2, LAM)

    for q in range(nq):  # CSR: columns strictly ascending, values < 1 (and >= 0 when clamped)
        cols = result.cols[result.indptr[q]:result.indptr[q + 1]]
        assert np.all(np.diff(cols) > 0)
    assert np.all(result.values < 1.0)
    if flavour.clamp:
        assert np.all(result.values >= 0.0)

    j = dense(result, nq, n)
    b = flavour.b(d, metric)
    a = b[:nq, nq:] / b[:nq].max(axis=1, keepdims=True) if flavour.normalised else d[:nq, nq:]
    np.testing.assert_allclose((1 - LAM) * j[:, nq:] + LAM * a, ref["final"], rtol=0, atol=1e-12)

    v = ref["v"]  # J against every U row, the queries' own rows included
    s = np.minimum(v[:nq, None, :], v[None, :, :]).sum(axis=2)
    j_ref = 1.0 - s / (2.0 - s)
    np.testing.assert_allclose(j, np.maximum(j_ref, 0.0) if flavour.clamp else j_ref, rtol=0, atol=1e-12)

    sizes = np.array([len(r) for r in ref["rstar"]])
    support = np.count_nonzero(v, axis=1)
    assert result.facts["rstar_max"] == sizes.max()
    assert result.facts["rstar_mean"] == pytest.approx(sizes.mean(), rel=1e-12)
    assert result.facts["support_max"] == support.max()
    assert result.facts["support_mean"] == pytest.approx(support.mean(), rel=1e-12)
    assert result.facts["candidates"] == ref["n_candidates"]

    # pair_distances: one call at most, with exactly the pairs of R* outside the lists
    assert len(asked) <= 1
    outside = {(i, int(c)) for i, r in enumerate(ref["rstar"]) for c in r
               if c != i and c not in neighbours.index[i]}
    got = list(zip(*(x.tolist() for x in asked[0]))) if asked else []
    assert len(got) == len(set(got)) and set(got) == outside
    return result


def duplicated_problem(seed, metric):
    """Small integer features with exact duplicates: gallery copies of queries and repeated gallery
    rows (ties by index: a lower copy precedes a row in its own list)."""
    rng = np.random.default_rng(seed)
    qf = rng.integers(-2, 3, size=(6, 4)).astype(np.float32)
    gf = rng.integers(-2, 3, size=(40, 4)).astype(np.float32)
    gf[[3, 17]] = qf[0]  # queries' copies in the gallery
    gf[25] = qf[4]
    qf[2] = qf[1]  # two identical queries
    gf[[5, 6, 30]] = gf[4]  # repeated gallery rows
    for f in (qf, gf):
        f[~f.any(axis=1)] = 1.0  # no zero rows (cosine undefined)
    return qf, gf


@pytest.mark.parametrize("k2", [1, 6])
@pytest.mark.parametrize("k1", [20, 19, 5])
@pytest.mark.parametrize("name", sorted(FLAVOURS))
@pytest.mark.parametrize("metric", ["cosine", "sqeuclidean"])
def test_equals_the_dense_reference(metric, name, k1, k2):
    qf, gf = duplicated_problem(k1 + k2, metric)
    result = check(qf, gf, name, metric, k1, k2)
    assert result.facts["candidates"] > 0


# Multiples of (1, 1, 1) (rows 0, 3, 4, 7, 12, 13): their canonical cosine distances are 0 or
# -2.2e-16, so lists by d put some of them before the row itself, while B counts all as 0 and
# orders them by row; the order decides R(i; h) here.
PARALLEL_Q = [[1, 1, 1], [1, 2, -3], [1, -3, 3], [4, 4, 4]]
PARALLEL_G = [[3, 3, 3], [2, -1, 1], [2, 2, -3], [8, 8, 8], [-2, 0, 2], [3, 3, 1], [2, 0, 0], [1, 0, -3],
              [7, 7, 7], [2, 2, 2], [-2, -3, -2]]


@pytest.mark.parametrize("k2", [1, 2, 6])
@pytest.mark.parametrize("k1", [6, 9])
@pytest.mark.parametrize("name", sorted(FLAVOURS))
def test_parallel_rows_tie_at_distance_zero_and_are_taken_by_row(name, k1, k2):
    """Parallel rows (cosine distance 0, rounded below 0 by the canonical sum and counted as 0):
    runs of equal keys in the lists, broken by row."""
    qf, gf = np.array(PARALLEL_Q, float), np.array(PARALLEL_G, float)
    d = union_distances(qf, gf, "cosine")
    np.fill_diagonal(d, 1.0)
    assert (d == 0).sum(axis=1).max() > 1
    check(qf, gf, name, "cosine", k1, k2)


@pytest.mark.parametrize("k2", [1, 6])
def test_underflowed_weights_are_no_support(k2):
    """fast-reid's w = exp(-B) on unnormalised squared distances is 0 beyond B ~ 745: such members
    of R* carry V = 0 and are not in supp V."""
    rng = np.random.default_rng(k2)
    qf = rng.integers(-30, 31, size=(4, 2)).astype(np.float64)
    gf = rng.integers(-30, 31, size=(30, 2)).astype(np.float64)
    result = check(qf, gf, "fastreid", "sqeuclidean", 20, k2)
    ref = rerank_reference(qf, gf, "fastreid", "sqeuclidean", 20, 1, LAM)
    assert any(len(r) > np.count_nonzero(v) for r, v in zip(ref["rstar"], ref["v"]))  # some V = 0 on R*
    assert result.facts["support_max"] > 0


def test_pairs_outside_the_lists_are_asked_for_once():
    """With lists of exactly max(L1, k2) entries R* reaches rows outside them, and those distances
    come from pair_distances, one call; with lists as long as U it is not called."""
    qf, gf = duplicated_problem(0, "cosine")
    _, _, _, asked = sparse_jaccard(qf, gf, FLAVOURS["matlab"], "cosine", 20, 6)
    assert len(asked) == 1 and len(asked[0][0]) > 0
    _, _, _, asked = sparse_jaccard(qf, gf, FLAVOURS["matlab"], "cosine", 20, 6, extra=len(qf) + len(gf))
    assert asked == []


def test_longer_lists_give_the_same_result():
    qf, gf = duplicated_problem(1, "sqeuclidean")
    short, *_ = sparse_jaccard(qf, gf, FLAVOURS["torchreid"], "sqeuclidean", 5, 6)
    long, *_ = sparse_jaccard(qf, gf, FLAVOURS["torchreid"], "sqeuclidean", 5, 6, extra=7)
    np.testing.assert_array_equal(short.indptr, long.indptr)
    np.testing.assert_array_equal(short.cols, long.cols)
    np.testing.assert_allclose(short.values, long.values, rtol=0, atol=1e-15)


def test_lists_too_short_are_refused():
    d = union_distances(*duplicated_problem(0, "cosine"), "cosine")
    with pytest.raises(ValueError, match="lists of 20 neighbours, re-ranking needs 21"):
        jaccard(exact_neighbours(d, 20, "cosine"), 6, FLAVOURS["matlab"], "cosine", 20, 6, None)


def test_all_items_identical_is_refused_where_b_is_normalised():
    """rowmax = 0: B / rowmax is 0 / 0 (the upstream codes give NaN); fast-reid's w = exp(-B) is defined."""
    qf = np.ones((2, 3))
    gf = np.ones((4, 3))
    with pytest.raises(OptionError, match="--rerank matlab: U row 0 is at distance 0 from every row"):
        sparse_jaccard(qf, gf, FLAVOURS["matlab"], "sqeuclidean", 3, 2)
    result, *_ = sparse_jaccard(qf, gf, FLAVOURS["fastreid"], "sqeuclidean", 3, 2)
    np.testing.assert_array_equal(dense(result, 2, 6), np.zeros((2, 6)))  # S = 1 for every pair


@st.composite
def problems(draw):
    nq = draw(st.integers(1, 5))
    ng = draw(st.integers(1, 25))
    dim = draw(st.integers(1, 4))
    vmax = draw(st.integers(1, 3))  # small ranges: many exact ties and duplicates
    u = draw(hnp.arrays(np.float32, (nq + ng, dim), elements=st.integers(-vmax, vmax).map(float)))
    u[~u.any(axis=1)] = 1.0
    return u[:nq], u[nq:]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems(), name=st.sampled_from(sorted(FLAVOURS)), metric=st.sampled_from(["cosine", "sqeuclidean"]),
       k1=st.integers(1, 24), k2=st.integers(1, 8), extra=st.integers(0, 3))
def test_random_problems_equal_the_dense_reference(problem, name, metric, k1, k2, extra):
    qf, gf = problem
    flavour = FLAVOURS[name]
    d = union_distances(qf, gf, flavour.base_metric(metric))
    if flavour.normalised and flavour.b(d.max(axis=1), metric).min() == 0.0:
        return  # all items identical: refused (test_all_items_identical_is_refused_where_b_is_normalised)
    check(qf, gf, name, metric, k1, k2, extra)
