"""GOM (docs/metrics.md#5-open-set-metrics-gom) from the engine against the brute-force reference, on random problems
mixing Q+ and Q- queries, junk and same-camera positives, for every normalisation mode and several
chunkings.  Integer-valued features make every distance exact, so thresholds are hit exactly."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import streameval

from reference import distance_matrix, reference_gom
from test_engine_vs_reference import SETTINGS, chunkings, integer_problems

TOL = 1e-12
CURVES = ("mRP", "mVP", "mReP", "mFR")
SCALARS = ("mReP_max", "tau_max", "mVP_max", "MREP", "MFR", "tau_nz")


@st.composite
def gom_options(draw):
    norm = draw(st.sampled_from(["minmax", "none", "fixed"]))
    if norm == "fixed":
        lo = draw(st.integers(-2, 10))
        norm = (float(lo), float(lo + draw(st.integers(1, 40))))
    return dict(norm=norm, bins=draw(st.integers(1, 20)), b=draw(st.integers(1, 12)),
                vp=draw(st.sampled_from(["reference", "jaccard"])))


def engine_options(gom: dict) -> dict:
    norm = gom["norm"] if isinstance(gom["norm"], str) else "fixed:{:g}:{:g}".format(*gom["norm"])
    return dict(gom_norm=norm, gom_bins=gom["bins"], gom_b=gom["b"], gom_vp=gom["vp"])


def assert_gom_matches(got: dict, ref: dict) -> None:
    for key in CURVES:
        if ref[key] is None:
            assert got[key] is None, key
        else:
            np.testing.assert_allclose(got[key], ref[key], rtol=0, atol=TOL, err_msg=key)
    for key in SCALARS:
        if ref[key] is None:
            assert got[key] is None, key
        else:
            assert abs(got[key] - ref[key]) <= TOL, (key, got[key], ref[key])
    np.testing.assert_array_equal(got["tau"], ref["tau"])


@settings(max_examples=80, **SETTINGS)
@given(st.data())
def test_gom_matches_reference_for_every_normalisation_and_chunking(data):
    problem, options = data.draw(integer_problems(max_nq=20, max_ng=50, max_dim=6))
    gom = data.draw(gom_options())
    dist = distance_matrix(problem["qf"], problem["gf"], options["metric"])
    ref = reference_gom(dist, problem["q_pids"], problem["q_camids"], problem["g_pids"], problem["g_camids"],
                        protocol=options["protocol"], junk_pids=options["junk_pids"], **gom)
    results = []
    for qb, gc in data.draw(chunkings(len(problem["q_pids"]), len(problem["g_pids"]))):
        result = streameval.evaluate(problem, query_block=qb, gallery_chunk=gc, **options, **engine_options(gom))
        assert_gom_matches(result.gom, ref)
        if gom["norm"] == "minmax":
            assert result.gom["dmin"] == ref["dmin"] and result.gom["dmax"] == ref["dmax"]
        results.append(result.gom)
    for other in results[1:]:
        assert other == results[0]


def test_no_gom_skips_the_open_set_metrics_only():
    rng = np.random.default_rng(3)
    problem = dict(qf=rng.integers(-2, 3, (8, 4)).astype(np.float32), q_pids=rng.integers(1, 5, 8),
                   q_camids=np.zeros(8, int), gf=rng.integers(-2, 3, (40, 4)).astype(np.float32),
                   g_pids=rng.integers(1, 7, 40), g_camids=np.ones(40, int))
    full = streameval.evaluate(problem)
    closed = streameval.evaluate(problem, no_gom=True)
    assert closed.gom is None and full.gom is not None
    assert closed.mAP == full.mAP and closed.mINP == full.mINP
    np.testing.assert_array_equal(closed.cmc, full.cmc)
