"""The brute-force protocol reference (tests/protocol_reference.py) against the worked vectors of
docs/protocols.md#the-seeded-hash, #10-worked-vectors (copied here as data), and consistency checks on random problems:
the reference is what the engine is tested against, so it is itself tested from the spec.
"""

from __future__ import annotations

import dataclasses
import math
import random
from fractions import Fraction

import numpy as np
import pytest
from protocol_reference import (
    draw_trial_galleries, extend_gallery, kept_in_key_order, mangye16_trial_galleries, official_trial_galleries,
    reference_protocol, seeded_hash, sgs_drawn_rows, sgs_expected_curve, trial_statistics,
)
from reference import distance_matrix, reference_evaluate, reference_gom

from streameval.protocols.presets import preset
from streameval.protocols.record import CameraRelation, Protocol, SgsSpec, TrialSpec

MARKET = Protocol(name="market")
NONE = Protocol(name="none", x_same=CameraRelation())
SYSU_LIKE = Protocol(name="t", x_any=CameraRelation(pairs=((3, 2),)), cmc="identity-dedup")
SEPARATE_CAMERAS = dict(x_same=CameraRelation(), x_any=CameraRelation(equal=True))


def sgs_protocol(mode, repeats=10, **fields):
    rule = "separate-cameras" if fields else "same-id-same-cam"
    return Protocol(name="cuhk03-sgs", cmc="sgs", sgs=SgsSpec(mode=mode, repeats=repeats, camera_rule=rule), **fields)


def assert_fraction(value, expected):
    """A float equal to the exact fraction ``expected`` up to float64 rounding."""
    assert value == pytest.approx(float(Fraction(expected)), rel=1e-12, abs=1e-15)


def assert_curve(curve, expected):
    assert len(curve) >= len(expected)
    for value, want in zip(curve, expected):
        assert_fraction(value, want)


# ---- docs/protocols.md#the-seeded-hash: the hash and the trial draw ------------------------------

def test_hash_test_values():
    assert seeded_hash(0) == 0xE220A8397B1DCDAF
    assert seeded_hash(0, 1, 0, 0, 1) == 0x00C3DEDF8D7BB611
    assert seeded_hash(0, 1, 0, 0, -1) == 0x1B5109B7B72DCB35
    assert seeded_hash(42, 2, 3, 7) == 0x2FDB8F6D67C11E6C


def test_trial_draw_vector():
    pids = [1, 1, 2, 2, 2, 3]
    galleries = draw_trial_galleries(pids, [0] * 6, range(6), TrialSpec(count=2, group="pid", shots=1, seed=0))
    assert galleries == [{1, 2, 5}, {1, 3, 5}]


# ---- docs/protocols.md#v1-two-queries-eight-gallery-rows ------------------------------------

V1_PID = [1, 3, 3, 4, 1, 2, 3, 1]
V1_CAM = [1, 2, 1, 2, 2, 1, 2, 2]
V1_DIST = np.array([[.10, .20, .30, .40, .50, .60, .65, .70],   # query A: pid 1, camera 1
                    [.30, .45, .20, .45, .25, .45, .90, .10]])  # query B: pid 2, camera 2
V1_Q_PID, V1_Q_CAM = [1, 2], [1, 2]


def v1(protocol, max_rank=8, **options):
    return reference_protocol(V1_DIST, V1_Q_PID, V1_Q_CAM, V1_PID, V1_CAM, protocol, max_rank=max_rank, **options)


def test_v1_market_kept_order_ranks_and_ap():
    assert kept_in_key_order(V1_DIST[0], set(range(8)), 0, 1, 1, V1_PID, V1_CAM, MARKET, 8) == [1, 2, 3, 4, 5, 6, 7]
    assert kept_in_key_order(V1_DIST[1], set(range(8)), 1, 2, 2, V1_PID, V1_CAM, MARKET, 8) == [7, 2, 4, 0, 1, 3, 5, 6]
    result = v1(MARKET)
    assert result["T"] == 1 and result["std"] is None and result["sem"] is None
    trial = result["per_trial"][0]
    per_query = trial["per_query"]
    assert list(per_query["first_hit_rank"]) == [4, 7]
    assert list(per_query["n_positives"]) == [2, 1]
    for name, a, b, mean in (("ap", "15/56", "1/7", "23/112"), ("ap_trapezoid", "59/336", "1/14", "83/672"),
                             ("inp", "2/7", "1/7", "3/14")):
        assert_fraction(per_query[name][0], a)
        assert_fraction(per_query[name][1], b)
    assert_fraction(trial["mAP"], "23/112")
    assert_fraction(trial["mAP_trapezoid"], "83/672")
    assert_fraction(trial["mINP"], "3/14")
    assert_curve(trial["cmc"], [0, 0, 0, "1/2", "1/2", "1/2", 1, 1])  # B's first hit is at rank 7
    assert np.array_equal(trial["cmc"], trial["cmc_first_hit"])
    assert (trial["n_queries"], trial["n_valid_queries"], trial["n_open_queries"]) == (2, 2, 0)
    assert result["mean"]["mAP"] == trial["mAP"]


def test_v1_identity_dedup():
    trial = v1(dataclasses.replace(MARKET, cmc="identity-dedup"))["per_trial"][0]
    assert list(trial["per_query"]["rho"]) == [3, 4]
    assert_curve(trial["cmc"], [0, 0, "1/2", 1, 1])
    assert_curve(trial["cmc_first_hit"], [0, 0, 0, "1/2"])
    assert_fraction(trial["mAP"], "23/112")


def test_v1_sgs_expected_exact_and_by_hand():
    kept_a = kept_in_key_order(V1_DIST[0], set(range(8)), 0, 1, 1, V1_PID, V1_CAM, MARKET, 8)
    kept_b = kept_in_key_order(V1_DIST[1], set(range(8)), 1, 2, 2, V1_PID, V1_CAM, MARKET, 8)
    half, sixth, third = Fraction(1, 2), Fraction(1, 6), Fraction(1, 3)
    for limit in (10**6, 0):  # enumeration of the joint draws, then the Poisson-binomial programme
        assert sgs_expected_curve(kept_a, 1, V1_PID, 5, limit) == [0, sixth, half, 1, 1]
        assert sgs_expected_curve(kept_b, 2, V1_PID, 5, limit) == [0, 0, third, 1, 1]
    result = v1(sgs_protocol("expected"), max_rank=4)
    assert result["T"] == 1 and len(result["per_trial"]) == 1
    assert_curve(result["per_trial"][0]["cmc"], [0, "1/12", "5/12", 1])
    assert_curve(result["cmc_sgs_expected"], [0, "1/12", "5/12", 1])
    assert_curve(result["sgs_expected_per_query"][0], [0, "1/6", "1/2", 1])
    assert_curve(result["sgs_expected_per_query"][1], [0, 0, "1/3", 1])
    assert_fraction(result["per_trial"][0]["mAP"], "23/112")  # AP on the full kept list


def test_v1_sgs_sampled_seed_0_four_repeats():
    result = v1(sgs_protocol("both", repeats=4), max_rank=4)
    assert result["T"] == 4 and [t["repeat"] for t in result["per_trial"]] == [0, 1, 2, 3]
    rho = [list(t["per_query"]["rho_sgs"]) for t in result["per_trial"]]
    assert [r[0] for r in rho] == [4, 4, 4, 2]  # A draws pid 1 rows g7 g7 g7 g4, pid 3 rows g2 g1 g2 g6
    assert [r[1] for r in rho] == [4, 4, 3, 4]  # B draws pid 1 rows g7 g7 g7 g4, pid 3 rows g1 g2 g6 g1
    assert_curve(result["mean"]["cmc"], [0, "1/8", "1/4", 1])
    assert_curve(result["cmc_sgs_expected"], [0, "1/12", "5/12", 1])
    for trial in result["per_trial"]:
        assert_fraction(trial["mAP"], "23/112")
    assert result["std"]["mAP"] == 0.0


def test_v1_sgs_draws_per_identity():
    """The drawn rows of the worked vector, u = H(0; 1, r, i, j) mod n over j's kept rows by index."""
    kept_a = kept_in_key_order(V1_DIST[0], set(range(8)), 0, 1, 1, V1_PID, V1_CAM, MARKET, 8)
    kept_b = kept_in_key_order(V1_DIST[1], set(range(8)), 1, 2, 2, V1_PID, V1_CAM, MARKET, 8)
    draws_a = [sgs_drawn_rows(kept_a, 0, V1_PID, r, 0) for r in range(4)]
    draws_b = [sgs_drawn_rows(kept_b, 1, V1_PID, r, 0) for r in range(4)]
    assert [d[1] for d in draws_a] == [7, 7, 7, 4] and [d[3] for d in draws_a] == [2, 1, 2, 6]
    assert [d[1] for d in draws_b] == [7, 7, 7, 4] and [d[3] for d in draws_b] == [1, 2, 6, 1]
    assert all((d[2], d[4]) == (5, 3) for d in draws_a + draws_b)  # pids 2 and 4 have one kept row


def test_v1_separate_cameras():
    assert kept_in_key_order(V1_DIST[0], set(range(8)), 0, 1, 1, V1_PID, V1_CAM,
                             sgs_protocol("expected", **SEPARATE_CAMERAS), 8) == [1, 3, 4, 6, 7]
    result = v1(sgs_protocol("expected", **SEPARATE_CAMERAS), max_rank=3)
    per_query = result["per_trial"][0]["per_query"]
    assert_fraction(per_query["ap"][0], "11/30")
    assert_fraction(per_query["ap"][1], "1/3")
    assert_curve(result["sgs_expected_per_query"][0], [0, "1/4", 1])
    assert_curve(result["sgs_expected_per_query"][1], [0, 0, 1])
    assert_curve(result["cmc_sgs_expected"], [0, "1/8", 1])


def test_vectors_through_the_preset_records():
    market = v1(preset("market"))["per_trial"][0]
    assert_fraction(market["mAP"], "23/112")
    assert list(market["per_query"]["first_hit_rank"]) == [4, 7]
    sgs = preset("cuhk03-sgs")
    sampled = v1(dataclasses.replace(sgs, sgs=dataclasses.replace(sgs.sgs, mode="both", repeats=4)), max_rank=4)
    assert [list(t["per_query"]["rho_sgs"]) for t in sampled["per_trial"]] == [[4, 4], [4, 4], [4, 3], [2, 4]]
    assert_curve(sampled["cmc_sgs_expected"], [0, "1/12", "5/12", 1])
    pids, cams, dist = [1, 2, 1, 3], [2, 2, 1, 1], np.array([[.10, .20, .30, .40]])
    for camera, ap in ((3, "1"), (6, "5/6")):  # V3: one row per (pid, camera), so every trial keeps all four
        sysu = reference_protocol(dist, [1], [camera], pids, cams, preset("sysu-all"), max_rank=4)
        assert sysu["T"] == 10 and all(rows == [0, 1, 2, 3] for rows in sysu["trial_galleries"])
        assert_fraction(sysu["mean"]["mAP"], ap)
        assert sysu["std"]["mAP"] == 0.0
    extended = np.array([[.5, .3, 0., .2], [.1, .4, .2, 0.]])  # V4
    mars = reference_protocol(extended, [1, 1], [1, 2], [1, 2, 1, 1], [2, 1, 1, 2], preset("mars"))
    assert_fraction(mars["mean"]["mAP"], "11/12")


# ---- V2: denominator ------------------------------------------------------------------------------

def test_v2_denominator():
    dist = np.vstack([V1_DIST, [.5, .4, .3, .2, .1, .6, .7, .8]])  # query C: pid 9, camera 1, no positive
    for denominator, m_ap, cmc4 in (("skip", "23/112", "1/2"), ("zero", "23/168", "1/3")):
        protocol = dataclasses.replace(MARKET, denominator=denominator)
        trial = reference_protocol(dist, [1, 2, 9], [1, 2, 1], V1_PID, V1_CAM, protocol, max_rank=4)["per_trial"][0]
        assert (trial["n_queries"], trial["n_valid_queries"], trial["n_open_queries"]) == (3, 2, 1)
        assert_fraction(trial["mAP"], m_ap)
        assert_fraction(trial["cmc"][3], cmc4)
        assert math.isnan(trial["per_query"]["ap"][2]) and trial["per_query"]["first_hit_rank"][2] == -1


def test_empty_q_plus_gives_null_closed_set_values():
    trial = reference_protocol(np.array([[.1, .2]]), [5], [1], [1, 2], [1, 1], MARKET, max_rank=2)["per_trial"][0]
    assert (trial["n_valid_queries"], trial["n_open_queries"]) == (0, 1)
    assert trial["cmc"] is None and trial["mAP"] is None and trial["mINP"] is None


# ---- V3: x_any -----------------------------------------------------------------------------------

def test_v3_x_any():
    pids, cams, dist = [1, 2, 1, 3], [2, 2, 1, 1], np.array([[.10, .20, .30, .40]])
    for camera, protocol, ranks, ap in ((3, MARKET, [1, 3], "5/6"), (3, SYSU_LIKE, [1], "1"),
                                        (6, MARKET, [1, 3], "5/6"), (6, SYSU_LIKE, [1, 3], "5/6")):
        trial = reference_protocol(dist, [1], [camera], pids, cams, protocol, max_rank=4)["per_trial"][0]
        assert trial["per_query"]["first_hit_rank"][0] == ranks[0]
        assert trial["per_query"]["n_positives"][0] == len(ranks)
        assert_fraction(trial["mAP"], ap)


# ---- V4: gallery includes queries ------------------------------------------------------------------

def test_v4_gallery_includes_queries():
    q_pid, q_cam, g_pid, g_cam = [1, 1], [1, 2], [1, 2], [2, 1]
    stored = np.array([[.5, .3], [.1, .4]])
    market = reference_protocol(stored, q_pid, q_cam, g_pid, g_cam, MARKET, max_rank=4)["per_trial"][0]
    assert (market["n_valid_queries"], market["n_open_queries"]) == (1, 1)
    assert_fraction(market["mAP"], "1/2")
    mars = dataclasses.replace(MARKET, name="mars", gallery_includes_queries=True, reference_ap="trapezoid")
    extended = np.array([[.5, .3, 0., .2], [.1, .4, .2, 0.]])  # copies Q0*, Q1* are rows 2 and 3
    trial = reference_protocol(extended, q_pid, q_cam, g_pid + q_pid, g_cam + q_cam, mars, max_rank=4)["per_trial"][0]
    assert (trial["n_valid_queries"], trial["n_open_queries"]) == (2, 0)
    assert_fraction(trial["per_query"]["ap"][0], "5/6")
    assert_fraction(trial["per_query"]["ap"][1], "1")
    assert_fraction(trial["mAP"], "11/12")


# ---- V5: trial statistics --------------------------------------------------------------------------

def test_v5_trial_statistics():
    stats = trial_statistics([0.50, 0.60, 0.70])
    assert stats["mean"] == pytest.approx(0.60) and stats["std"] == pytest.approx(0.10)
    assert stats["sem"] == pytest.approx(0.0577, abs=5e-5)
    assert (stats["min"], stats["max"]) == (0.50, 0.70)
    assert trial_statistics([0.50, 0.60, 0.70], ddof=0)["std"] == pytest.approx(0.0816, abs=5e-5)
    one = trial_statistics([0.5])
    assert one["std"] is None and one["sem"] is None and one["mean"] == 0.5


# ---- trial sources ---------------------------------------------------------------------------------

def test_mangye16_random_matches_the_upstream_walk():
    """Upstream walks sorted zero-padded pid folders, cameras 1, 2, 4, 5, sorted file names, and calls
    random.choice once per non-empty folder; the rows are stored in a shuffled order here."""
    rng = random.Random(5)
    files = [(pid, cam, number) for pid in (3, 7, 12) for cam in (1, 2, 4, 5)
             for number in range(1, rng.randint(0, 4) + 1)]
    rng.shuffle(files)
    g_pid, g_cam = [f[0] for f in files], [f[1] for f in files]
    # the converter keeps file numbers in row order within a (pid, camera) pair
    for key in {(p, c) for p, c, _ in files}:
        rows = [g for g, f in enumerate(files) if (f[0], f[1]) == key]
        for number, g in enumerate(rows, start=1):
            files[g] = (key[0], key[1], number)
    row_of = {f"cam{c}/{p:04d}/{n:04d}.jpg": g for g, (p, c, n) in enumerate(files)}
    trials = TrialSpec(count=4, source="mangye16-random", cameras=(1, 2, 4, 5))
    galleries = mangye16_trial_galleries(g_pid, g_cam, list(range(len(files))), trials)
    for t in range(4):
        random.seed(t)
        upstream = []
        for pid in sorted({f"{p:04d}" for p, _, _ in files}):
            for cam in ("cam1", "cam2", "cam4", "cam5"):
                names = sorted(name for name in row_of if name.startswith(f"{cam}/{pid}/"))
                if names:
                    upstream.append(row_of[random.choice(names)])
        assert galleries[t] == set(upstream)


def test_official_table_takes_the_first_shots():
    g_pid, g_cam = [1, 1, 1, 2, 2, 1], [1, 1, 2, 1, 1, 1]  # camera 1 pid 1: rows 0, 1, 5
    table = {0: {(1, 1): [3, 1], (2, 1): [1], (1, 2): [2, 1]}, 1: {(1, 1): [2, 3], (1, 2): [1, 2]}}
    rows = list(range(6))
    single = official_trial_galleries(g_pid, g_cam, rows, TrialSpec(count=2, source="official"), table)
    assert single == [{5, 2, 4}, {1, 3}]
    multi = official_trial_galleries(g_pid, g_cam, rows, TrialSpec(count=2, source="official", shots=2), table)
    assert multi == [{5, 0, 2, 4, 3}, {1, 5, 3, 4}]
    with pytest.raises(ValueError, match="no image 4"):
        official_trial_galleries(g_pid, g_cam, rows, TrialSpec(count=1, source="official"), {0: {(1, 1): [4]}})


# ---- random consistency checks ---------------------------------------------------------------------

def random_problem(rng, nq, ng, n_pids=5, cameras=(1, 2, 3), junk=True, ties=True):
    q_pid = rng.integers(0 if not junk else -1, n_pids, nq)
    g_pid = rng.integers(-1 if junk else 0, n_pids, ng)
    q_cam, g_cam = rng.choice(cameras, nq), rng.choice(cameras, ng)
    dist = rng.integers(0, 6, (nq, ng)) / 5.0 if ties else rng.random((nq, ng))
    return dist, q_pid, q_cam, g_pid, g_cam


def per_trial_close(a, b):
    for key in ("n_queries", "n_valid_queries", "n_open_queries", "mAP", "mAP_trapezoid", "mINP"):
        assert (a[key] is None and b[key] is None) or a[key] == pytest.approx(b[key], rel=1e-12, abs=1e-15), key
    for key in ("cmc", "cmc_first_hit"):
        assert (a[key] is None and b[key] is None) or np.allclose(a[key], b[key], rtol=0, atol=1e-12), key


def gom_close(a, b):
    for key in ("mRP", "mVP", "mReP", "mFR", "MREP", "MFR", "mReP_max", "tau_max", "mVP_max", "tau_nz", "dmin", "dmax"):
        assert (a[key] is None and b[key] is None) or np.allclose(a[key], b[key], rtol=0, atol=1e-12), key


@pytest.mark.parametrize("seed", range(6))
def test_market_and_none_agree_with_the_closed_set_reference(seed):
    rng = np.random.default_rng(seed)
    qf, gf = rng.integers(-2, 3, (6, 3)).astype(float), rng.integers(-2, 3, (15, 3)).astype(float)
    _, q_pid, q_cam, g_pid, g_cam = random_problem(rng, 6, 15)
    dist = distance_matrix(qf, gf, "sqeuclidean")
    for name, protocol in (("market", MARKET), ("none", NONE)):
        ours = reference_protocol(dist, q_pid, q_cam, g_pid, g_cam, protocol, max_rank=10,
                                  gom=dict(norm="minmax", bins=20, b=30, vp="reference"))
        trial = ours["per_trial"][0]
        theirs = reference_evaluate(qf, q_pid, q_cam, gf, g_pid, g_cam, metric="sqeuclidean", protocol=name,
                                    max_rank=10)
        per_trial_close(trial, dict(theirs, cmc_first_hit=theirs["cmc"]))
        for key in ("ap", "ap_trapezoid", "inp", "first_hit_rank"):
            assert np.allclose(trial["per_query"][key], theirs["per_query"][key], equal_nan=True), key
        gom_close(trial["gom"], reference_gom(dist, q_pid, q_cam, g_pid, g_cam, protocol=name, bins=20, b=30))


@pytest.mark.parametrize("seed", range(8))
def test_identity_dedup_rho_bounds_the_first_hit(seed):
    rng = np.random.default_rng(100 + seed)
    dist, q_pid, q_cam, g_pid, g_cam = random_problem(rng, 8, 25)
    result = reference_protocol(dist, q_pid, q_cam, g_pid, g_cam, dataclasses.replace(SYSU_LIKE, junk_pids=(-1, 0)),
                                max_rank=25)
    trial = result["per_trial"][0]
    rho, first = trial["per_query"]["rho"], trial["per_query"]["first_hit_rank"]
    valid = first > 0
    assert np.all(rho[valid] <= first[valid]) and np.array_equal(rho[valid] == 1, first[valid] == 1)
    assert np.all(rho[~valid] == -1)
    assert np.all(trial["cmc"] >= trial["cmc_first_hit"]) and trial["cmc"][0] == trial["cmc_first_hit"][0]


@pytest.mark.parametrize("seed", range(6))
def test_sgs_expected_enumeration_equals_the_poisson_binomial_programme(seed):
    rng = np.random.default_rng(200 + seed)
    dist, q_pid, q_cam, g_pid, g_cam = random_problem(rng, 5, 14, n_pids=4, junk=False)
    for fields in ({}, SEPARATE_CAMERAS):
        protocol = sgs_protocol("expected", **fields)
        listed = reference_protocol(dist, q_pid, q_cam, g_pid, g_cam, protocol, max_rank=6)
        programme = reference_protocol(dist, q_pid, q_cam, g_pid, g_cam, protocol, max_rank=6, sgs_enumeration_limit=0)
        assert np.array_equal(listed["sgs_expected_per_query"], programme["sgs_expected_per_query"], equal_nan=True)


def test_sgs_sampled_mean_agrees_with_expected_within_monte_carlo_error():
    """2,000 seeded repeats: each point of the sampled mean curve lies within 5 standard errors of
    the expected curve, the standard error computed from the expected per-query probabilities."""
    rng = np.random.default_rng(7)
    dist, q_pid, q_cam, g_pid, g_cam = random_problem(rng, 4, 16, n_pids=4, junk=False, ties=False)
    repeats = 2000
    result = reference_protocol(dist, q_pid, q_cam, g_pid, g_cam, sgs_protocol("both", repeats=repeats), max_rank=4)
    per_query = result["sgs_expected_per_query"]
    valid = ~np.isnan(per_query[:, 0])
    assert valid.sum() >= 2
    p = per_query[valid]
    standard_error = np.sqrt((p * (1 - p)).sum(axis=0) / repeats) / valid.sum()
    assert np.all(np.abs(result["mean"]["cmc"] - result["cmc_sgs_expected"]) <= 5 * standard_error + 1e-12)
    assert 0 < result["cmc_sgs_expected"][0] < 1  # a point with real randomness is checked


@pytest.mark.parametrize("seed", range(4))
def test_each_trial_equals_an_evaluation_on_its_explicit_subset(seed):
    """Draws over the eligible rows (gallery cameras 1, 2, 4; query cameras 3, 6): each trial's
    figures equal an evaluation without trials on the trial's queries x gallery rows, cut out."""
    rng = np.random.default_rng(300 + seed)
    nq, ng = 8, 36
    dist, q_pid, _, g_pid, _ = random_problem(rng, nq, ng, n_pids=4, ties=False)
    q_cam, g_cam = rng.choice([1, 3, 6], nq), rng.choice([1, 2, 4, 5, 6], ng)
    shots = 1 + seed % 2
    trials = TrialSpec(count=3, source="draw", group="pid-camera", shots=shots, seed=seed)
    protocol = dataclasses.replace(SYSU_LIKE, trials=trials, query_cameras=(3, 6), gallery_cameras=(1, 2, 4))
    gom = dict(norm="minmax", bins=10, b=3, vp="reference")
    result = reference_protocol(dist, q_pid, q_cam, g_pid, g_cam, protocol, max_rank=8, gom=gom)
    assert result["T"] == 3
    eligible_queries = [i for i in range(nq) if q_cam[i] in (3, 6)]
    for t, trial in enumerate(result["per_trial"]):
        rows = result["trial_galleries"][t]
        assert result["trial_queries"][t] == eligible_queries
        assert list(np.flatnonzero(trial["per_query"]["in_trial"])) == eligible_queries
        for key in {(int(g_pid[g]), int(g_cam[g])) for g in range(ng) if g_cam[g] in (1, 2, 4)}:
            group = [g for g in range(ng) if (int(g_pid[g]), int(g_cam[g])) == key]
            assert len(set(rows) & set(group)) == min(shots, len(group))
        assert all(g_cam[g] in (1, 2, 4) for g in rows)
        cut = np.ix_(eligible_queries, rows)
        alone = reference_protocol(dist[cut], q_pid[eligible_queries], q_cam[eligible_queries],
                                   g_pid[rows], g_cam[rows],
                                   dataclasses.replace(protocol, trials=None, query_cameras=None, gallery_cameras=None),
                                   max_rank=8, gom=gom)["per_trial"][0]
        per_trial_close(trial, alone)
        gom_close(trial["gom"], alone["gom"])
        for key in ("ap", "rho", "first_hit_rank"):
            assert np.allclose(trial["per_query"][key][eligible_queries], alone["per_query"][key], equal_nan=True)
    for key in ("mAP", "mINP"):
        values = [trial[key] for trial in result["per_trial"]]
        assert result["mean"][key] == pytest.approx(np.mean(values))
        assert result["std"][key] == pytest.approx(np.std(values, ddof=1))
    assert np.allclose(result["mean"]["cmc"], np.mean([trial["cmc"] for trial in result["per_trial"]], axis=0))


@pytest.mark.parametrize("seed", range(3))
def test_vehicleid_like_draws_give_every_query_one_positive(seed):
    """The pool as queries appended to an empty stored gallery, one drawn row per vehicle per trial,
    queries = the pool rows not drawn: AP = 1 / r_1 and a single-image vehicle is gallery-only."""
    rng = np.random.default_rng(400 + seed)
    n = 14
    q_pid, q_cam = rng.integers(0, 5, n), np.zeros(n, dtype=np.int64)
    qf = rng.random((n, 3))
    protocol = Protocol(name="vehicleid", x_same=CameraRelation(), gallery_includes_queries=True,
                        trials=TrialSpec(count=3, group="pid", shots=1, seed=seed, queries="not-in-gallery"))
    ext_f, ext_pid, ext_cam, n_stored = extend_gallery(qf, q_pid, q_cam, np.zeros((0, 3)), np.zeros(0, dtype=np.int64),
                                                       np.zeros(0, dtype=np.int64), protocol)
    assert n_stored == 0 and len(ext_pid) == n
    dist = distance_matrix(qf, ext_f, "euclidean")
    result = reference_protocol(dist, q_pid, q_cam, ext_pid, ext_cam, protocol, max_rank=5)
    for t, trial in enumerate(result["per_trial"]):
        gallery, queries = set(result["trial_galleries"][t]), result["trial_queries"][t]
        assert sorted(int(ext_pid[g]) for g in gallery) == sorted(set(int(p) for p in q_pid))
        assert set(queries) == set(range(n)) - gallery
        assert trial["n_open_queries"] == 0
        per_query = trial["per_query"]
        for i in queries:
            assert per_query["n_positives"][i] == 1
            assert per_query["ap"][i] == pytest.approx(1 / per_query["first_hit_rank"][i])
        assert all(per_query["n_positives"][i] == -1 and not per_query["in_trial"][i] for i in gallery)


@pytest.mark.parametrize("seed", range(3))
def test_own_copy_is_always_excluded(seed):
    """Protocol none with the queries appended: each query equals protocol none on a gallery that
    holds every copy but its own (the copies built with extend_gallery, distances from features)."""
    rng = np.random.default_rng(500 + seed)
    qf, gf = rng.integers(-2, 3, (5, 2)).astype(float), rng.integers(-2, 3, (9, 2)).astype(float)
    _, q_pid, q_cam, g_pid, g_cam = random_problem(rng, 5, 9)
    protocol = dataclasses.replace(NONE, gallery_includes_queries=True)
    ext_f, ext_pid, ext_cam, n_stored = extend_gallery(qf, q_pid, q_cam, gf, g_pid, g_cam, protocol)
    dist = distance_matrix(qf, ext_f, "euclidean")
    per_query = reference_protocol(dist, q_pid, q_cam, ext_pid, ext_cam, protocol)["per_trial"][0]["per_query"]
    for i in range(5):
        others = [g for g in range(len(ext_pid)) if g != n_stored + i]
        alone = reference_evaluate(qf[i:i + 1], q_pid[i:i + 1], q_cam[i:i + 1], ext_f[others], ext_pid[others],
                                   ext_cam[others], protocol="none")["per_query"]
        for key in ("ap", "first_hit_rank", "n_positives"):
            assert np.allclose(per_query[key][i], alone[key][0], equal_nan=True), key
    # x_same equal already drops the own copy: appending equals market on a gallery holding the queries
    mars_like = dataclasses.replace(MARKET, gallery_includes_queries=True)
    appended = reference_protocol(dist, q_pid, q_cam, ext_pid, ext_cam, mars_like)
    stored = reference_protocol(dist, q_pid, q_cam, ext_pid, ext_cam, MARKET)
    per_trial_close(appended["per_trial"][0], stored["per_trial"][0])


def test_denominator_zero_scales_skip_by_the_valid_fraction():
    rng = np.random.default_rng(600)
    dist, q_pid, q_cam, g_pid, g_cam = random_problem(rng, 10, 12)
    skip = reference_protocol(dist, q_pid, q_cam, g_pid, g_cam, MARKET, max_rank=6)["per_trial"][0]
    zero = reference_protocol(dist, q_pid, q_cam, g_pid, g_cam, dataclasses.replace(MARKET, denominator="zero"),
                              max_rank=6)["per_trial"][0]
    assert 0 < skip["n_valid_queries"] < skip["n_queries"]
    fraction = skip["n_valid_queries"] / skip["n_queries"]
    assert zero["mAP"] == pytest.approx(skip["mAP"] * fraction)
    assert np.allclose(zero["cmc"], skip["cmc"] * fraction)
