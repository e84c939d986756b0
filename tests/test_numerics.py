"""Numbers that stay right at the edges of floating point.

* Float32 GEMMs overflow on rows of huge norm and lose their products to underflow on rows of tiny
  norm, silently (features scaled by 1e19 gave mAP 0.045, by 1e-25 0.96, instead of 0.74): such
  rows are refused with the fix named (``kernels.NORM_RANGE``), and float64 precision takes them.
  Features scaled by a power of two inside the range give exactly the unscaled numbers.
* Fixed GOM normalisation clips distances outside LO:HI to the ends of the grid: the result counts
  them (``gom["clipped"]``), exactly, whatever the chunking, and the report warns.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

import streameval
from streameval import OptionError
from streameval.engine import kernels
from streameval.present import report

from reference import distance_matrix, reference_evaluate
import result_checks

TOL = 1e-12
PROTOCOL_OPTIONS = dict(protocol="market", junk_pids=(-1,))


def clustered_problem(seed=0, nq=40, ng=300, dim=24, ids=12):
    """Features around one centre per identity, some distractors (pid 0) and junk (pid -1)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((ids + 1, dim))

    def rows(pids):
        return (centres[np.maximum(pids, 0)] + 0.9 * rng.standard_normal((pids.shape[0], dim))).astype(np.float32)

    q_pids = rng.integers(1, ids + 1, nq)
    g_pids = np.where(rng.random(ng) < 0.1, rng.integers(-1, 1, ng), rng.integers(1, ids + 1, ng))
    return dict(qf=rows(q_pids), q_pids=q_pids, q_camids=rng.integers(0, 3, nq),
                gf=rows(g_pids), g_pids=g_pids, g_camids=rng.integers(0, 3, ng))


def scaled(problem: dict, scale: float) -> dict:
    return {**problem, "qf": (problem["qf"] * scale).astype(np.float32),
            "gf": (problem["gf"] * scale).astype(np.float32)}


def comparable(result, scale: float = 1.0) -> dict:
    """The result without run facts; the minmax range scaled back (euclidean distances scale exactly
    with a power-of-two scale)."""
    out = result_checks.comparable(result)
    if out["gom"] is not None and out["gom"]["dmin"] is not None:
        out["gom"]["dmin"] /= scale
        out["gom"]["dmax"] /= scale
    return out


def assert_matches_reference(result, problem: dict) -> None:
    ref = reference_evaluate(problem["qf"], problem["q_pids"], problem["q_camids"], problem["gf"], problem["g_pids"],
                             problem["g_camids"], metric=result.metric, **PROTOCOL_OPTIONS, max_rank=result.max_rank)
    for key in ("mAP", "mAP_trapezoid", "mINP"):
        assert abs(getattr(result, key) - ref[key]) <= TOL, key
    np.testing.assert_array_equal(result.cmc, ref["cmc"])
    np.testing.assert_array_equal(result.per_query["first_hit_rank"], ref["per_query"]["first_hit_rank"])


# ------------------------------------------------------------------------------- GEMM range of norms


@pytest.mark.parametrize("scale", [1e19, 1e-25])
def test_float32_refuses_rows_whose_dot_products_overflow_or_underflow(scale):
    problem = scaled(clustered_problem(), scale)
    with pytest.raises(OptionError, match=r"(query|gallery) row \d+ has norm .* outside .* --precision float64"):
        streameval.evaluate(problem, no_gom=True)


@pytest.mark.parametrize("scale", [1e19, 1e-25])
def test_float64_takes_the_rows_float32_refuses(scale):
    problem = scaled(clustered_problem(), scale)
    result = streameval.evaluate(problem, no_gom=True, precision="float64")
    assert_matches_reference(result, problem)
    assert 0.6 < result.mAP < 0.9  # the clustered problem's own mAP, not an artefact of the scale


@pytest.mark.parametrize("scale", [2.0**27, 2.0**-27])  # ~1.3e8 and ~7.5e-9, exact in float32
@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_scales_inside_the_range_give_the_unscaled_numbers(scale, precision):
    problem = clustered_problem(seed=1)
    unscaled = streameval.evaluate(problem, precision=precision)
    result = streameval.evaluate(scaled(problem, scale), precision=precision)
    assert comparable(result, scale) == comparable(unscaled)
    assert_matches_reference(result, scaled(problem, scale))


def test_zero_rows_are_not_refused():
    problem = clustered_problem(seed=2)
    problem["gf"][5] = 0.0
    problem["qf"][3] = 0.0
    result = streameval.evaluate(problem, no_gom=True)
    assert_matches_reference(result, problem)


def test_cli_refusal_is_one_error_line_and_exit_2(tmp_path):
    problem = scaled(clustered_problem(), 1e19)
    store = tmp_path / "huge.zarr"
    streameval.write_store(store, problem["qf"], problem["q_pids"], problem["q_camids"], problem["gf"],
                           problem["g_pids"], problem["g_camids"])
    command = [os.path.join(os.path.dirname(sys.executable), "streameval"), "eval", str(store), "--no-gom", "-q"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--precision float64" in lines[0], proc.stderr
    assert proc.stdout == ""


# -------------------------------------------------------------------------- fixed normalisation clipping


def integer_problem(seed: int):
    """Integer-valued features: every distance exact, so the clipping counts are exact in float32 too."""
    rng = np.random.default_rng(seed)
    nq, ng, dim = 23, 61, 5
    return dict(qf=rng.integers(-2, 3, (nq, dim)).astype(np.float32), q_pids=rng.integers(1, 6, nq),
                q_camids=rng.integers(0, 2, nq), gf=rng.integers(-2, 3, (ng, dim)).astype(np.float32),
                g_pids=rng.integers(-1, 7, ng), g_camids=rng.integers(0, 2, ng))


def reference_clipping(problem: dict, metric: str, lo: float, hi: float) -> dict:
    """Clipped: over every pair GOM thresholds (not junk: not a junk pid, not the query's pid in its
    camera); observed: over all pairs."""
    dist = distance_matrix(problem["qf"], problem["gf"], metric)
    same_pid = problem["q_pids"][:, None] == problem["g_pids"][None, :]
    same_cam = problem["q_camids"][:, None] == problem["g_camids"][None, :]
    kept = ~(same_pid & same_cam) & (problem["g_pids"] != -1)[None, :]
    side = (dist - lo) / (hi - lo)
    return {"below": int((kept & (side < 0)).sum()), "above": int((kept & (side > 1)).sum()), "pairs": int(kept.sum()),
            "observed_min": float(dist.min()), "observed_max": float(dist.max())}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("metric,precision", [("sqeuclidean", "float32"), ("euclidean", "float64"),
                                              ("cosine", "float64")])
def test_fixed_normalisation_counts_the_clipped_pairs_exactly_for_any_chunking(seed, metric, precision):
    problem = integer_problem(seed)
    for features in (problem["qf"], problem["gf"]):  # no all-zero row (cosine refuses them)
        features[np.abs(features).sum(1) == 0, 0] = 1
    dist = distance_matrix(problem["qf"], problem["gf"], metric)
    lo, hi = (float(v) for v in np.quantile(dist, [0.2, 0.7]))  # a range that clips both ends
    want = reference_clipping(problem, metric, lo, hi)
    assert want["below"] > 0 and want["above"] > 0
    results = []
    for query_block, gallery_chunk in [(None, None), (7, 13), (1, 61), (23, 4)]:
        result = streameval.evaluate(problem, metric=metric, precision=precision, gom_norm=f"fixed:{lo!r}:{hi!r}",
                                     query_block=query_block, gallery_chunk=gallery_chunk)
        assert result.gom["clipped"] == want
        results.append(comparable(result))
    assert all(other == results[0] for other in results[1:])
    warning = [line for line in report.summary(result).splitlines() if "warning" in line]
    assert len(warning) == 1 and f"{want['below']:,} below, {want['above']:,} above" in warning[0]


def test_a_fixed_range_covering_every_distance_clips_nothing():
    problem = integer_problem(3)
    dist = distance_matrix(problem["qf"], problem["gf"], "sqeuclidean")
    top = float(dist.max())
    result = streameval.evaluate(problem, metric="sqeuclidean", gom_norm=f"fixed:0:{top!r}", gallery_chunk=9)
    want = reference_clipping(problem, "sqeuclidean", 0.0, top)
    assert result.gom["clipped"] == want and want["below"] == want["above"] == 0
    assert "warning" not in report.summary(result)


def test_other_normalisations_report_no_clipping():
    problem = integer_problem(4)
    for norm in ("minmax", "none"):
        assert "clipped" not in streameval.evaluate(problem, gom_norm=norm).gom


def test_clipping_of_real_valued_features_is_identical_for_any_chunking():
    """Fast distances differ with the GEMM's blocks; the clipping counts and the observed range are
    decided as the thresholds are (the range canonically), so every chunking gives the same."""
    problem = clustered_problem(seed=5)
    dist = distance_matrix(problem["qf"], problem["gf"], "euclidean")
    lo, hi = (float(v) for v in np.quantile(dist, [0.1, 0.6]))
    results = [streameval.evaluate(problem, gom_norm=f"fixed:{lo!r}:{hi!r}", query_block=qb, gallery_chunk=gc)
               for qb, gc in [(None, None), (9, 31), (40, 7)]]
    assert all(comparable(other) == comparable(results[0]) for other in results[1:])
    clipped = results[0].gom["clipped"]
    np.testing.assert_allclose([clipped["observed_min"], clipped["observed_max"]], [dist.min(), dist.max()], rtol=1e-12)
    want = reference_clipping(problem, "euclidean", lo, hi)
    assert abs(clipped["below"] - want["below"]) + abs(clipped["above"] - want["above"]) <= 2  # float32 near LO, HI


@pytest.mark.parametrize("metric", ["sqeuclidean", "euclidean", "cosine", "distance"])
def test_no_row_past_the_reach_of_a_distance_can_be_at_or_below_it(metric):
    """``kernels.reach_distance``: a row whose fast distance d' exceeds the reach of d has its
    canonical distance above d, whatever the row's norm (up to the chunk's widest), since the
    canonical distance is at least d' - distance_window(d')."""
    from streameval.engine import kernels

    code = kernels.METRIC_CODES[metric]
    rng = np.random.default_rng(5)
    c_dot = kernels.dot_error_bound(2048, "float32")
    for _ in range(2000):
        d = float(rng.uniform(-50, 50)) if metric == "distance" else float(rng.choice([0.0, rng.uniform(0, 300)]))
        qn, gn_max = (float(v) for v in rng.uniform(0.01, 120, 2))
        limit = kernels.reach_distance(d, qn, gn_max, code, c_dot)
        for d_next in (np.nextafter(limit, np.inf), limit + abs(limit) * 1e-9 + 1e-300, limit + abs(limit) + 1.0):
            for gn in (gn_max, gn_max * float(rng.uniform(0, 1))):
                assert d_next - kernels.distance_window(d_next, qn, gn, code, c_dot) > d, (metric, d, qn, gn)


@pytest.mark.parametrize("metric", ["sqeuclidean", "euclidean", "cosine", "distance"])
def test_no_fast_distance_below_an_edge_has_an_upper_bound_past_its_peak(metric):
    """``features.verification.kernels._peak_upper``: every fast distance d' up to an edge E, with norms up to
    the block's widest, has d' + distance_window(d') at most the peak at E, the bound a tail is
    seeded with from the block's counts below E."""
    from streameval.engine import kernels
    from streameval.features.verification.kernels import _peak_upper

    code = kernels.METRIC_CODES[metric]
    rng = np.random.default_rng(6)
    c_dot = kernels.dot_error_bound(2048, "float32")
    for _ in range(500):
        edge = float(rng.uniform(-2, 2)) if metric in ("cosine", "distance") else float(rng.uniform(0, 300))
        qn_max, gn_max = (float(v) for v in rng.uniform(0.01, 120, 2))
        peak = _peak_upper(edge, qn_max, gn_max, code, c_dot)
        low = edge - 4 if metric in ("cosine", "distance") else 0.0
        for d in np.append(rng.uniform(low, edge, 50), [low, edge, min(edge, math.sqrt(2 * c_dot * qn_max * gn_max))]):
            for qn, gn in ((qn_max, gn_max), tuple(rng.uniform(0, 1, 2) * (qn_max, gn_max))):
                assert d + kernels.distance_window(float(d), qn, gn, code, c_dot) <= peak, (metric, edge, d)


@pytest.mark.parametrize("n_rows", [1, 7, 8, 13])
@pytest.mark.parametrize("metric", [kernels.SQEUCLIDEAN, kernels.COSINE])
def test_row_terms_are_sums_in_coordinate_order(n_rows, metric):
    """A row's term is its float64 squares added k = 0, 1, ... (the order the canonical distance
    assumes, whatever rows it is read with): checked bit for bit against a plain loop."""
    x = np.random.default_rng(n_rows).standard_normal((n_rows, 37)).astype(np.float32) * 3
    want = []
    for row in x:
        acc = 0.0
        for v in row.astype(np.float64):
            acc += v * v
        want.append(math.sqrt(acc) if metric == kernels.COSINE else acc)
    assert kernels.row_terms(x, metric).tolist() == want


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n_pairs", [0, 1, kernels.PREFETCH_AHEAD, 50])
@pytest.mark.parametrize("metric", [kernels.SQEUCLIDEAN, kernels.EUCLIDEAN, kernels.COSINE])
def test_listed_pair_distances_are_their_canonical_distances(metric, n_pairs, dtype):
    """``pair_distances`` (rows fetched ahead of the pair summed) gives each listed pair's canonical
    distance bit for bit, against the dot product added k = 0, 1, 2, 3 (mod 4) in a plain loop, for
    pairs in any order, rows repeated, on row slices of larger arrays, fewer pairs than it fetches
    ahead and none."""
    rng = np.random.default_rng(n_pairs)
    qf = (rng.standard_normal((40, 37)) * 3).astype(dtype)[5:30]
    gf = (rng.standard_normal((90, 37)) * 3).astype(dtype)[10:80]
    qa, ga = kernels.row_terms(qf, metric), kernels.row_terms(gf, metric)
    qrows, grows = rng.integers(0, len(qf), n_pairs), rng.integers(0, len(gf), n_pairs)
    want = []
    for i, j in zip(qrows, grows):
        sums = [0.0] * 4
        for k in range(36):
            sums[k % 4] += float(qf[i, k]) * float(gf[j, k])
        dot = (sums[0] + sums[1]) + (sums[2] + sums[3]) + float(qf[i, 36]) * float(gf[j, 36])
        want.append(kernels.pair_distance(dot, qa[i], ga[j], metric))
    assert kernels.pair_distances(qf, gf, qrows, grows, qa, ga, metric).tolist() == want


def _range_block(seed: int, metric: int):
    """A GEMM block of float32 features with near-ties at both ends: rows repeated (distance 0, the
    same extreme several times), some scaled copies (cosine 0, euclidean apart) and one nudged by
    an ulp-sized step; with each row's terms and norms as ``FeatureSource.prepare`` makes them."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((37, 19)).astype(np.float32)
    g = np.concatenate([rng.standard_normal((50, 19)), q[:5], -q[5:8], 2 * q[8:10]]).astype(np.float32)
    g[3] = np.nextafter(g[50], np.float32(np.inf))
    if metric != kernels.COSINE:  # a zero row (refused for cosine only)
        q[-1] = 0.0
    terms = [kernels.row_terms(x, metric) for x in (q, g)]
    norms = [t if metric == kernels.COSINE else np.sqrt(t) for t in terms]
    return q, g, terms, norms


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("metric", [kernels.SQEUCLIDEAN, kernels.EUCLIDEAN, kernels.COSINE])
def test_distance_range_is_the_canonical_min_and_max_of_every_pair(seed, metric):
    """``kernels.distance_range`` ranks pairs by keys (cosine without a division per pair, euclidean
    squared) and settles the extremes canonically: the same min and max, bit for bit, as the
    canonical distance of every pair of the block."""
    q, g, (qa, ga), (qn, gn) = _range_block(seed, metric)
    dots = q @ g.T
    rows, cols = (a.ravel() for a in np.indices(dots.shape))
    every = kernels.pair_distances(q, g, rows, cols, qa, ga, metric)
    got = kernels.distance_range(dots, q, g, qa, ga, qn, gn, metric, kernels.dot_error_bound(19, np.float32))
    assert got == (every.min(), every.max())


def test_the_cosine_range_key_is_within_its_bound_of_the_fast_distance():
    """1 - dot (1 / ga) (1 / qa) against 1 - dot / (qa ga), for quotients up to the largest a
    float32 GEMM can give (|dot| up to (1 + c_dot) qa ga) and norms over many binades."""
    rng = np.random.default_rng(11)
    qa, ga = (np.exp2(rng.uniform(-30, 30, 200_000)) for _ in range(2))
    dots = rng.uniform(-1.0001, 1.0001, qa.shape[0]) * (qa * ga)
    fast = 1.0 - dots / (qa * ga)
    key = 1.0 - dots * (1.0 / ga) * (1.0 / qa)
    assert np.abs(key - fast).max() <= kernels.COSINE_KEY_ERROR


def test_distance_range_of_stored_distances_is_their_min_and_max():
    """Stored (and re-ranked) values are their own distances, with zero terms: nothing divides by them."""
    values = np.random.default_rng(3).uniform(-2, 5, (9, 40))
    zeros = np.zeros(40)
    got = kernels.distance_range(values, values, values, zeros[:9], zeros, zeros[:9], zeros, kernels.PRECOMPUTED, 0.0)
    assert got == (values.min(), values.max())


def _gom_block(dots, qa, ga, metric):
    """A Block of one camera and trial where every pair is a kept negative (pids differ)."""
    from streameval.engine.block import NOT_SCREENED, Block

    nq, ng = dots.shape
    ints = np.zeros
    return Block(dots, NOT_SCREENED, np.zeros((0, 0)), dots, dots, qa, ga, np.sqrt(np.abs(qa)), np.sqrt(np.abs(ga)),
                 metric, 0.0, 0.0, np.arange(nq, dtype=np.int64), np.arange(nq, nq + ng, dtype=np.int64), ints(nq, np.int64),
                 ints((1, ng), np.uint8), np.ones(nq, np.uint64), np.ones(ng, np.uint64), 0, ints(nq + 1, np.int64),
                 ints(0), ints(0, np.int64), ints(0, np.uint64))


@pytest.mark.parametrize("metric", [kernels.COSINE, kernels.SQEUCLIDEAN, kernels.EUCLIDEAN, kernels.PRECOMPUTED])
def test_gom_bins_by_keys_are_the_bins_of_the_fast_distances(metric):
    """``update_hist`` bins a windowless row from keys times 1 / span (no division per pair) and
    settles the rows near a threshold on the fast distance: every count equals binning each fast
    distance, normalised, as ``kernels.threshold_bin`` does - with distances on the thresholds and
    an ulp either side of them."""
    from streameval.features.gom.statistic import update_hist

    rng = np.random.default_rng(metric)
    n_bins, nq, ng = 20, 6, 500
    if metric == kernels.PRECOMPUTED:
        lo, span = -0.75, 2.5
        grid = lo + np.arange(n_bins + 1) / n_bins * span
        dots = rng.choice(np.concatenate([grid, np.nextafter(grid, -np.inf), np.nextafter(grid, np.inf),
                                          rng.uniform(lo - 1, lo + span + 1, 200)]), (nq, ng))
        qa, ga = np.zeros(nq), np.zeros(ng)
    else:
        q, g = (rng.integers(-3, 4, (n, 8)).astype(np.float32) for n in (nq, ng))
        g[:, 0] += 0.5  # no zero row
        q[:, 0] += 0.5
        qa, ga = (kernels.row_terms(x, metric) for x in (q, g))
        dots = (q @ g.T).astype(np.float32)
    blk = _gom_block(dots, qa, ga, metric)
    fast = np.array([[kernels.pair_distance(dots[i, j], qa[i], ga[j], metric) for j in range(ng)] for i in range(nq)])
    if metric != kernels.PRECOMPUTED:  # integer features: distances on a grid whose step divides the span
        lo, span = float(fast.min()), float(fast.max() - fast.min())
    want = np.zeros((nq, 1, n_bins + 2), np.int64)
    for i in range(nq):
        for j in range(ng):
            want[i, 0, kernels.threshold_bin(kernels.normalise(fast[i, j], kernels.NORM_AFFINE, lo, span), n_bins)] += 1
    hist = np.zeros_like(want)
    empty = np.empty(0)
    update_hist(blk, 0.0, kernels.NORM_AFFINE, lo, span, n_bins, 0, 1, hist, np.empty((0, 3), np.int64), empty, empty)
    np.testing.assert_array_equal(hist, want)
