"""Average query expansion out of core (PROTOCOLS.md 6.3) against the dense float64 reference
(tests/rerank_reference.py ``aqe_reference``).

Small integer-valued problems with exact duplicates (ties by U row), stores of several chunks and
blocks whose boundaries fall inside chunks.  The kNN pass is given to ``expand`` as a callable; here
a dense one over the stored features (float64 cosine distance, self forced to 0, lists by (d, row)).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import streameval
from streameval import open_store, write_store
from streameval.core.errors import OptionError
from streameval.engine.neighbours import Neighbours
from streameval.features.rerank.expansion import expand
from streameval.store import read_rows

from rerank_reference import aqe_reference
from reference import reference_evaluate

TOL = 1e-12


def dense_pass(sets, k, metric):
    """Every U row's top-k by (canonical cosine distance, U row), from all of U in memory."""
    assert metric == "cosine"
    u = np.concatenate([read_rows(fs, slice(0, len(fs)), np.float64)[0] for fs in sets])
    norms = np.sqrt((u * u).sum(axis=1))
    d = 1.0 - (u @ u.T) / np.outer(norms, norms)
    np.fill_diagonal(d, 0.0)
    rows = np.arange(u.shape[0])
    index = np.array([np.lexsort((rows, row))[:k] for row in d], dtype=np.int64)
    return Neighbours(index, np.take_along_axis(d, index, axis=1), d.max(axis=1), metric)


def problem(seed: int, nq: int = 5, ng: int = 13, dim: int = 4):
    """Integer features in [-3, 3] (no zero row) with exact ties: U rows 6, 9 and 14 are one vector
    and row 15 twice it (all four at cosine distance exactly 0: norms 3 and 6), query 2 is gallery
    row 7 (norm 3); ids with junk and several cameras."""
    rng = np.random.default_rng(seed)
    features = rng.integers(-3, 4, size=(nq + ng, dim)).astype(np.float32)
    features[~features.any(axis=1)] = 1.0
    features[[nq + 1, nq + 4, nq + 9]] = [1, 2, -2, 0]
    features[nq + 10] = [2, 4, -4, 0]
    features[[2, nq + 7]] = [0, 0, 3, 0]
    pids = rng.integers(-1, 4, size=nq + ng)
    camids = rng.integers(0, 2, size=nq + ng)
    return features[:nq], pids[:nq], camids[:nq], features[nq:], pids[nq:], camids[nq:]


def stored(path, data, chunk_rows: int = 3):
    write_store(path, *data, chunk_rows=chunk_rows, default_metric="cosine")
    return open_store(path)


def read_back(store):
    return [read_rows(fs, slice(0, len(fs)), np.float64) for fs in (store.query, store.gallery)]


def assert_features_equal(got, want) -> None:
    np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL * np.abs(want).max())


@pytest.mark.parametrize("times", [1, 2])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_expanded_features_equal_the_dense_reference(tmp_path, k, times):
    data = problem(seed=10 * k + times)
    qf, q_pids, q_camids, gf, g_pids, g_camids = data
    # stored chunks of 3 rows, blocks of 2: block boundaries fall inside the chunks read
    expanded = expand(stored(tmp_path / "store.zarr", data), dense_pass, k, 3.0, times, tmp_path / "qe", block_rows=2)
    (q_got, q_pids_got, q_camids_got), (g_got, g_pids_got, g_camids_got) = read_back(expanded)
    q_want, g_want = aqe_reference(qf, gf, k=k, alpha=3.0, times=times)
    assert expanded.query.features.dtype == np.float64 and expanded.gallery.chunk_rows == 2
    assert_features_equal(q_got, q_want)
    assert_features_equal(g_got, g_want)
    for got, want in ((q_pids_got, q_pids), (q_camids_got, q_camids), (g_pids_got, g_pids), (g_camids_got, g_camids)):
        np.testing.assert_array_equal(got, want)
    assert expanded.default_metric == "cosine"


def test_blocking_does_not_change_a_bit(tmp_path):
    store = stored(tmp_path / "store.zarr", problem(seed=3))
    small = read_back(expand(store, dense_pass, 5, 3.0, 2, tmp_path / "small", block_rows=2))
    whole = read_back(expand(store, dense_pass, 5, 3.0, 2, tmp_path / "whole", block_rows=100))  # a block a set
    for (a, _, _), (b, _, _) in zip(small, whole):
        np.testing.assert_array_equal(a, b)


def test_the_expanded_store_evaluates_like_the_reference_features(tmp_path):
    """The expanded store is an ordinary store: evaluated (its float64 features in float64), it gives
    the reference's numbers for the reference's expanded features."""
    data = problem(seed=5)
    qf, q_pids, q_camids, gf, g_pids, g_camids = data
    expanded = expand(stored(tmp_path / "store.zarr", data), dense_pass, 5, 3.0, 1, tmp_path / "qe", block_rows=2)
    with pytest.raises(streameval.OptionError, match="holds float64 features, which float32 GEMMs would round"):
        streameval.evaluate(expanded.path, metric="cosine", no_gom=True)
    result = streameval.evaluate(expanded.path, metric="cosine", precision="float64", no_gom=True)
    q_want, g_want = aqe_reference(qf, gf, k=5, alpha=3.0, times=1)
    ref = reference_evaluate(q_want, q_pids, q_camids, g_want, g_pids, g_camids, metric="cosine")
    assert result.n_valid_queries == ref["n_valid_queries"] > 0
    for key in ("mAP", "mINP"):
        assert abs(getattr(result, key) - ref[key]) <= TOL, key
    np.testing.assert_allclose(result.cmc, ref["cmc"], rtol=0, atol=TOL)
    np.testing.assert_array_equal(result.per_query["first_hit_rank"], ref["per_query"]["first_hit_rank"])
    np.testing.assert_allclose(result.per_query["ap"], ref["per_query"]["ap"], rtol=0, atol=TOL, equal_nan=True)


def test_earlier_rounds_are_removed(tmp_path):
    expanded = expand(stored(tmp_path / "store.zarr", problem(seed=6)), dense_pass, 2, 3.0, 3, tmp_path / "qe")
    assert os.path.basename(expanded.path) == "aqe-3.zarr"
    assert {name for name in os.listdir(tmp_path / "qe") if name.endswith(".zarr")} == {"aqe-3.zarr"}


def test_a_negative_similarity_to_a_fractional_power_is_refused(tmp_path):
    """s = -1 (opposite vectors) to the power 2.5 is no real number: one error, no store left."""
    data = (np.array([[1.0, 0.0]]), [1], [0], np.array([[-1.0, 0.0]]), [1], [1])
    with pytest.raises(OptionError, match=r"U row 0's neighbour 2 \(U row 1\) has cosine similarity -1.*alpha 2.5"):
        expand(stored(tmp_path / "store.zarr", data), dense_pass, 2, 2.5, 1, tmp_path / "qe")
    assert not os.path.exists(tmp_path / "qe" / "aqe-1.zarr")
    expanded = expand(open_store(tmp_path / "store.zarr"), dense_pass, 2, 3.0, 1, tmp_path / "cubed")
    (q, _, _), (g, _, _) = read_back(expanded)  # an integer alpha keeps the sign: s^3 = -1
    np.testing.assert_array_equal(q, [[1.0, 0.0]])
    np.testing.assert_array_equal(g, [[-1.0, 0.0]])
