"""GOM fixed vectors: the paper's Table 2 lists and the edge vectors of the spec (docs/metrics.md#8-test-vectors).

The spec states them with normalisation ``none`` on distances such as 0.30.  A float32 store cannot
hold 0.30 exactly, so each list is built from integer 1-D features (query at 0, gallery item at
100 * d, euclidean distance exactly 100 * d) and normalised with ``fixed:0:100``: d~ = 100d / 100,
the correctly rounded d, the same float64 value as the spec's and as the grid value tau = 0.30.
"""

import math

import numpy as np
import pytest

import streameval

QUERY_PID, QUERY_CAM, OTHER_PID = 7, 0, 3


def evaluate_list(distances, positives, *, junk_at=(), b=5, bins=100, vp="reference"):
    """One query (pid 7, camera 0) against gallery items at the given distances (camera 1).

    ``positives``: '1'/'0' per item in list order (the lists are given in rank order).
    """
    n = len(distances)
    gallery = np.rint(np.array(distances)[:, None] * 100).astype(np.float32)
    pids = np.array([QUERY_PID if flag == "1" else OTHER_PID for flag in positives], dtype=np.int64)
    pids[list(junk_at)] = -1
    return streameval.evaluate(
        dict(qf=np.zeros((1, 1), np.float32), q_pids=[QUERY_PID], q_camids=[QUERY_CAM],
             gf=gallery, g_pids=pids, g_camids=np.ones(n, dtype=np.int64)),
        metric="euclidean", gom_norm="fixed:0:100", gom_b=b, gom_bins=bins, gom_vp=vp,
    )


def at(result, curve, tau):
    index = int(np.flatnonzero(np.isclose(result.gom["tau"], tau, rtol=0, atol=1e-12))[0])
    return result.gom[curve][index]


# list: distances, gt, AP, INP, (RP, VP, ReP) at tau1 = .30 and tau2 = .60
TABLE2_CLOSED = {
    "I": ([.10, .20, .40, .70, .80], "11100", 1, 1, (1, 2 / 3, math.sqrt(2 / 3)), (1, 1, 1)),
    "II": ([.50, .65, .70, .75, .80], "11100", 1, 1, (0, 0, 0), (1, 1 / 3, math.sqrt(1 / 3))),
    "III": ([.20, .35, .45, .55, .80], "10110", 29 / 36, 3 / 4, (1, 1 / 3, math.sqrt(1 / 3)),
            (29 / 36, 3 / 4, math.sqrt(29 / 48))),
    "IV": ([.10, .32, .45, .55, .70], "11010", 11 / 12, 3 / 4, (1, 1 / 3, math.sqrt(1 / 3)),
           (11 / 12, 3 / 4, math.sqrt(11 / 16))),
}
TABLE2_OPEN = {  # list: distances, FR at tau1, FR at tau2 (B = 5)
    "V": ([.35, .55, .65, .75, .85], 0, 2 / 5),
    "VI": ([.55, .70, .75, .80, .90], 0, 1 / 5),
}


@pytest.mark.parametrize("name", TABLE2_CLOSED)
def test_table2_closed_set_lists(name):
    distances, gt, ap, inp, at_tau1, at_tau2 = TABLE2_CLOSED[name]
    result = evaluate_list(distances, gt)
    assert result.mAP == pytest.approx(ap, abs=1e-12)
    assert result.mINP == pytest.approx(inp, abs=1e-12)
    for tau, expected in ((0.30, at_tau1), (0.60, at_tau2)):
        got = [at(result, curve, tau) for curve in ("mRP", "mVP", "mReP")]
        assert got == pytest.approx(list(expected), abs=1e-12), (name, tau)
    assert result.gom["mFR"] is None and result.gom["MFR"] is None and result.gom["tau_nz"] is None


@pytest.mark.parametrize("name", TABLE2_OPEN)
def test_table2_open_set_lists(name):
    distances, fr_tau1, fr_tau2 = TABLE2_OPEN[name]
    result = evaluate_list(distances, "00000")
    assert result.n_open_queries == 1 and result.mAP is None
    assert at(result, "mFR", 0.30) == pytest.approx(fr_tau1, abs=1e-12)
    assert at(result, "mFR", 0.60) == pytest.approx(fr_tau2, abs=1e-12)
    assert result.gom["mReP"] is None and result.gom["mReP_max"] is None


def test_vp_is_capped_at_the_last_positive():
    result = evaluate_list([.1, .2, .3, .4, .5], "10100")
    for tau in (0.3, 0.4, 0.5, 1.0):
        assert at(result, "mVP", tau) == pytest.approx(2 / 3, abs=1e-12)
        assert at(result, "mRP", tau) == pytest.approx(5 / 6, abs=1e-12)
    jaccard = evaluate_list([.1, .2, .3, .4, .5], "10100", vp="jaccard")
    assert at(jaccard, "mVP", 0.5) == pytest.approx(2 / 5, abs=1e-12)


def test_thresholds_are_inclusive():
    result = evaluate_list([.30, .50, .90], "101")
    assert at(result, "mRP", 0.29) == 0 and at(result, "mVP", 0.29) == 0
    assert at(result, "mRP", 0.30) == pytest.approx(1, abs=1e-12)
    assert at(result, "mVP", 0.30) == pytest.approx(1 / 2, abs=1e-12)
    assert at(result, "mVP", 0.50) == pytest.approx(1 / 3, abs=1e-12)
    assert result.mAP == pytest.approx(5 / 6, abs=1e-12)
    assert at(result, "mRP", 1.0) == pytest.approx(5 / 6, abs=1e-12)
    assert at(result, "mVP", 1.0) == pytest.approx(2 / 3, abs=1e-12)


def test_fr_counts_everything_returned_junk_only_at_one():
    result = evaluate_list([.1, .2, .3, .4, .95], "00000", junk_at=(2,), b=3)
    assert at(result, "mFR", 0.15) == pytest.approx(1 / 3, abs=1e-12)
    assert at(result, "mFR", 0.25) == pytest.approx(2 / 3, abs=1e-12)
    assert at(result, "mFR", 0.45) == pytest.approx(1, abs=1e-12)
    assert result.gom["tau_nz"] == pytest.approx(0.10, abs=1e-12)


def test_summaries_follow_their_definitions():
    result = evaluate_list([.20, .35, .45, .55, .80], "10110", bins=20)
    gom = result.gom
    tau, m_rep = np.array(gom["tau"]), np.array(gom["mReP"])
    assert gom["mReP_max"] == m_rep.max()
    assert gom["tau_max"] == tau[np.flatnonzero(m_rep == m_rep.max())[0]]
    assert gom["mVP_max"] == max(gom["mVP"])
    assert gom["MREP"] == pytest.approx(float(np.sum(np.diff(tau) * (m_rep[1:] + m_rep[:-1]) / 2)), abs=1e-12)
    assert gom["normalisation"] == "fixed:0:100" and gom["B"] == 5 and len(tau) == 21
