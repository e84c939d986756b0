"""The engine against the brute-force protocol reference (tests/protocol_reference.py) for every
preset and flavour (docs/protocols.md), on random small problems with integer-valued
features (exact distances, frequent ties), for several chunkings: every trial's numbers, their
means and spread, and the sgs curves must match to 1e-12, and be identical across chunkings."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import streameval
from streameval.protocols import resolve

from cli_checks import cli
from protocol_reference import extend_gallery, reference_protocol
from reference import distance_matrix

TOL = 1e-12
GOM = dict(norm="minmax", bins=20, b=7, vp="reference")
CHUNKINGS = [dict(), dict(query_block=5, gallery_chunk=7), dict(query_block=64, gallery_chunk=13, workers=1)]

CASES = {  # name: (protocol spec, overrides, gom)
    "market": ("market", {}, GOM),
    "none-zero-denominator": ("none", {"denominator": "zero"}, None),
    # divided by each trial's queries, not by all queries (sysu's are the IR cameras' images only)
    "sysu-indoor-zero-denominator": ("sysu-indoor", {"trials": 3, "denominator": "zero"}, None),
    "sysu-all": ("sysu-all", {"trials": 3}, GOM),
    "sysu-indoor-multishot": ("sysu-indoor", {"trials": 2, "shots": 2, "seed": 7}, None),
    "sysu-all-mangye16": ("sysu-all", {"trials": 3, "trial_source": "mangye16-random"}, None),
    "identity-dedup-market": ("market", {"cmc": "identity-dedup"}, GOM),
    "mars": ("mars", {}, GOM),
    "regdb-v2t": ("regdb", {"direction": "v2t"}, None),
    "vehicleid": ("vehicleid", {"trials": 3}, None),
    "cuhk03-sgs-sampled": ("cuhk03-sgs", {"sgs_repeats": 4}, None),
    "cuhk03-sgs-both-separate": ("cuhk03-sgs", {"sgs_mode": "both", "sgs_repeats": 3, "camera_rule": "separate-cameras"}, None),
    "cuhk03-sgs-expected": ("cuhk03-sgs", {"sgs_mode": "expected"}, None),
}


def problem(seed: int):
    rng = np.random.default_rng(seed)
    nq, ng, dim = int(rng.integers(6, 14)), int(rng.integers(20, 45)), 3
    qf = rng.integers(-2, 3, (nq, dim)).astype(np.float32)
    gf = rng.integers(-2, 3, (ng, dim)).astype(np.float32)
    q_pid = rng.integers(0, 6, nq)
    g_pid = rng.integers(-1, 6, ng)
    q_cam = rng.choice([1, 2, 3, 6], nq)
    g_cam = rng.integers(1, 7, ng)
    return qf, q_pid, q_cam, gf, g_pid, g_cam


def engine_options(gom) -> dict:
    if gom is None:
        return {"no_gom": True}
    return {"gom_norm": gom["norm"], "gom_bins": gom["bins"], "gom_b": gom["b"], "gom_vp": gom["vp"]}


def close(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return np.allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=0, atol=TOL, equal_nan=True)


def assert_entry(got: dict, ref: dict, where: str) -> None:
    for key in ("n_queries", "n_valid_queries", "n_open_queries", "mAP", "mAP_trapezoid", "mINP", "cmc",
                "cmc_first_hit"):
        if key == "cmc_first_hit" and got.get(key) is None:
            continue  # reported only when the flavour is another
        assert close(got[key], ref[key]), f"{where}: {key} {got[key]} != {ref[key]}"
    if ref.get("gom") is not None:
        for key in ("mRP", "mVP", "mReP", "mFR", "mReP_max", "tau_max", "mVP_max", "MREP", "MFR", "tau_nz"):
            assert close(got["gom"][key], ref["gom"][key]), f"{where}: gom {key}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_protocol_matches_reference_for_every_chunking(case):
    spec, overrides, gom = CASES[case]
    protocol = resolve(spec, **overrides)
    for seed in range(4):
        qf, q_pid, q_cam, gf, g_pid, g_cam = problem(seed)
        ext_f, ext_pid, ext_cam, n_stored = extend_gallery(qf, q_pid, q_cam, gf, g_pid, g_cam, protocol)
        dist = distance_matrix(qf, ext_f, "sqeuclidean")
        ref = reference_protocol(dist, q_pid, q_cam, ext_pid, ext_cam, protocol, max_rank=8, gom=gom, n_stored=n_stored)
        data = dict(qf=qf, q_pids=q_pid, q_camids=q_cam, gf=gf, g_pids=g_pid, g_camids=g_cam)
        outputs = []
        for chunking in CHUNKINGS:
            result = streameval.evaluate(data, metric="sqeuclidean", protocol=protocol, max_rank=8,
                                         **engine_options(gom), **chunking).to_dict()
            where = f"{case} seed {seed} {chunking}"
            if ref["T"] == 1:
                assert result["trials"] is None
                assert_entry(result, ref["per_trial"][0], where)
            else:
                assert result["trials"]["T"] == ref["T"]
                for t, (got, want) in enumerate(zip(result["trials"]["per_trial"], ref["per_trial"])):
                    assert_entry(got, want, f"{where} trial {t}")
                for stat in ("mean", "std", "sem", "min", "max"):
                    for key in ("mAP", "mINP", "cmc"):
                        assert close(result["trials"][stat][key], ref[stat][key]), f"{where} {stat} {key}"
                assert close(result["mAP"], ref["mean"]["mAP"]) and close(result["cmc"], ref["mean"]["cmc"])
            if "cmc_sgs_expected" in ref and protocol.sgs.mode == "both":
                assert close(result["cmc_sgs_expected"], [float(v) for v in ref["cmc_sgs_expected"]]), where
            outputs.append({k: v for k, v in result.items() if k != "run"})
        assert all(out == outputs[0] for out in outputs), f"{case} seed {seed}: chunkings disagree"


def test_sgs_sampled_mean_over_2000_repeats_agrees_with_expected():
    """cuhk03-sgs sampled is unbiased: over 2,000 repeats its CMC is within 5 standard errors (the
    repeats' own std / sqrt(2000), plus 1e-3 for points whose spread is nearly 0) of expected."""
    qf, q_pid, q_cam, gf, g_pid, g_cam = problem(11)
    data = dict(qf=qf, q_pids=q_pid, q_camids=q_cam, gf=gf, g_pids=g_pid, g_camids=g_cam)
    result = streameval.evaluate(data, metric="sqeuclidean", protocol="cuhk03-sgs", sgs_mode="both",
                                 sgs_repeats=2000, max_rank=8, no_gom=True)
    sampled, expected = np.asarray(result.cmc), np.asarray(result.cmc_sgs_expected)
    sem = np.asarray(result.trials["sem"]["cmc"])
    assert np.all(np.abs(sampled - expected) <= 5 * sem + 1e-3), (sampled, expected, sem)
    assert not np.allclose(sampled, expected, atol=1e-9)  # sampled really is a different (noisy) estimate


def test_seeded_sgs_gives_the_same_numbers_for_any_chunking_and_changes_with_the_seed():
    qf, q_pid, q_cam, gf, g_pid, g_cam = problem(3)
    data = dict(qf=qf, q_pids=q_pid, q_camids=q_cam, gf=gf, g_pids=g_pid, g_camids=g_cam)
    runs = [streameval.evaluate(data, protocol="cuhk03-sgs", seed=seed, no_gom=True, **chunking).trials["per_trial"]
            for seed in (5, 6, 5) for chunking in CHUNKINGS]
    assert runs[0] == runs[1] == runs[2] == runs[6] == runs[7] == runs[8]  # seed 5, run twice
    assert runs[3] == runs[4] == runs[5]
    # another seed draws another gallery image per identity: other CMCs (mAP ranks the whole gallery)
    assert [trial["cmc"] for trial in runs[0]] != [trial["cmc"] for trial in runs[3]]
    assert math.isfinite(runs[0][0]["mAP"])


def test_regdb_runs_both_directions_each_as_its_own_evaluation():
    """t2v swaps the roles: thermal (the stored gallery) queries the visible images."""
    qf, q_pid, q_cam, gf, g_pid, g_cam = problem(5)
    data = dict(qf=qf, q_pids=q_pid, q_camids=q_cam, gf=gf, g_pids=g_pid, g_camids=g_cam)
    swapped = dict(qf=gf, q_pids=g_pid, q_camids=g_cam, gf=qf, g_pids=q_pid, g_camids=q_cam)
    both = streameval.evaluate(data, protocol="regdb", max_rank=8, no_gom=True)
    for direction, arrays in (("v2t", data), ("t2v", swapped)):
        alone = streameval.evaluate(arrays, protocol="regdb", direction="v2t", max_rank=8, no_gom=True).to_dict()
        got = both.directions[direction]
        assert got["n_queries"] == alone["n_queries"] and got["cmc"] == alone["cmc"] and got["mAP"] == alone["mAP"]
    assert both.to_dict()["mAP"] == both.directions["v2t"]["mAP"]


def test_regdb_gives_each_directions_per_query_arrays_as_its_own_run(tmp_path):
    qf, q_pid, q_cam, gf, g_pid, g_cam = problem(5)
    streameval.write_store(tmp_path / "s.zarr", qf, q_pid, q_cam, gf, g_pid, g_cam)
    run = cli("eval", tmp_path / "s.zarr", "--protocol", "regdb", "--max-rank", 8, "--no-gom", "--per-query",
              "--json", "-", "-q")
    both = json.loads(run.stdout)
    assert both["per_query"] == both["directions"]["v2t"]["per_query"]
    for direction in ("v2t", "t2v"):
        alone = streameval.evaluate(tmp_path / "s.zarr", protocol="regdb", direction=direction, max_rank=8,
                                    no_gom=True).to_dict(per_query=True)
        assert both["directions"][direction]["per_query"] == json.loads(json.dumps(alone["per_query"]))
        assert len(alone["per_query"]["ap"]) == (len(q_pid) if direction == "v2t" else len(g_pid))
    without = json.loads(cli("eval", tmp_path / "s.zarr", "--protocol", "regdb", "--max-rank", 8, "--no-gom",
                             "--json", "-", "-q").stdout)
    assert "per_query" not in without and all("per_query" not in d for d in without["directions"].values())
