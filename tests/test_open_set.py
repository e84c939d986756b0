"""Open-set identification, DIR@FPIR (docs/open-set.md#definitions), against a brute-force reference.

The reference is written here from the specification: every distance of a small problem in float64,
each (trial, query)'s kept list from ``protocol_reference`` (docs/protocols.md#the-kept-set), the non-mated scores
(nearest kept row) and the mated ones (best positive, first-hit rank or rho), sorted and counted
with exact fractions.  Integer-valued features make every distance exact and ties frequent; every
problem holds open-set queries and a query whose only rows of its identity share its camera.  The
engine must agree exactly (thresholds bit for bit) for several chunkings, the threaded scheduler
and a LocalCluster of processes, after an incremental update, and through the command line.
V7 (docs/open-set.md#worked-example-v7) is realised as a distance store."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest

import streameval
from streameval.engine import kernels
from streameval.protocols import resolve
from streameval.present.report import summary
from streameval.run.statestore import StateError

from cli_checks import cli, one_error_line
from protocol_reference import (extend_gallery, identity_dedup_rho, is_kept, kept_in_key_order, positive_ranks,
                                trial_galleries, trial_queries)
from reference import distance_matrix

TARGETS = ("0", "0.05", "0.1", "0.125", "0.2", "0.25", "1/3", "0.5", "0.6", "0.75", "0.9", "1")
RANKS = (1, 2, 3, 5)
MAX_RANK = 8
CHUNKINGS = [dict(), dict(query_block=5, gallery_chunk=7), dict(query_block=64, gallery_chunk=13, workers=1)]
CASES = {  # name: (preset, overrides)
    "market": ("market", {}),
    "identity-dedup": ("market", {"cmc": "identity-dedup"}),
    "sysu-all-trials": ("sysu-all", {"trials": 2}),
    "mars": ("mars", {}),
    "cuhk03-sgs": ("cuhk03-sgs", {"sgs_repeats": 2}),
}
SAME_CAMERA_PID = 9  # a query identity whose only gallery rows share the query's camera


# ------------------------------------------------------------------------------------ the reference


def count(text: str, n: int, rounding: str) -> int:
    """k = x n rounded half up (MATLAB's round) or down, from the exact value of the target."""
    whole, rest = divmod(Fraction(text) * n, 1)
    return int(whole) + (rounding == "round" and rest >= Fraction(1, 2))


def reference_point(text: str, s: list, mated: list, ranks, rounding: str) -> dict:
    """One FPIR target from the sorted non-mated scores ``s`` and the mated (d+, r+) pairs, literally."""
    k = count(text, len(s), rounding)
    if k == 0 and s[0] != math.inf:
        below = [d for d, _ in mated if d < s[0]]
        threshold = (max(below) + s[0]) / 2 if below else s[0] - math.sqrt(np.finfo(float).eps)
        rule, accepted = "d < threshold", lambda d: d < s[0]
    elif k < len(s) and s[k - 1] != math.inf:
        threshold, rule = s[k - 1], "d <= threshold"
        accepted = lambda d: d <= s[k - 1]  # noqa: E731
    else:
        threshold, rule, accepted = None, "all", lambda d: True
    alarms = sum(1 for v in s if v != math.inf and accepted(v))
    return {"fpir": float(Fraction(text)), "k": k, "threshold": threshold, "accept": rule,
            "achieved_fpir": float(Fraction(alarms, len(s))), "dir": reference_dir(mated, accepted, ranks)}


def reference_dir(mated: list, accepted, ranks) -> dict:
    n_m = len(mated)
    return {str(r): float(Fraction(sum(1 for d, rank in mated if accepted(d) and rank <= r), n_m)) if n_m else None
            for r in ranks}


def reference_section(s: list, mated: list, targets=TARGETS, ranks=RANKS, rounding="round") -> dict:
    s = sorted(s)
    return {"n_mated": len(mated), "n_non_mated": len(s),
            "points": [reference_point(text, s, mated, ranks, rounding) for text in targets] if s else [],
            "closed_set_limit": reference_dir(mated, lambda d: True, ranks)}


def reference_open_set(dist, q_pid, q_cam, ext_pid, ext_cam, protocol, n_stored, **options) -> list:
    """One reference section per trial: s(q) = the nearest kept row (+inf if none) of each query
    without a kept positive; (d+, r+) = the first kept positive and its rank (rho with identity-dedup)."""
    galleries = trial_galleries(ext_pid, ext_cam, protocol)
    sections = []
    for gallery, queries in zip(galleries, trial_queries(q_cam, galleries, protocol, n_stored)):
        s, mated = [], []
        for i in sorted(queries):
            kept = kept_in_key_order(dist[i], gallery, i, int(q_pid[i]), int(q_cam[i]), ext_pid, ext_cam, protocol,
                                     n_stored)
            ranks = positive_ranks(kept, int(q_pid[i]), ext_pid)
            if not ranks:
                s.append(float(dist[i, kept[0]]) if kept else math.inf)
                continue
            rank = identity_dedup_rho(kept, int(q_pid[i]), ext_pid) if protocol.cmc == "identity-dedup" else ranks[0]
            mated.append((float(dist[i, kept[ranks[0] - 1]]), rank))
        sections.append(reference_section(s, mated, **options))
    return sections


def problem(seed: int, dim: int = 3, vmax: int = 2):
    """Integer features in [-vmax, vmax] (many exact ties), identities 6-7 absent from the gallery
    (open-set), and identity 9 whose two gallery rows are in its query's camera 3 (excluded by
    same-camera rules)."""
    rng = np.random.default_rng(seed)
    nq, ng = int(rng.integers(8, 14)), int(rng.integers(20, 40))
    qf = rng.integers(-vmax, vmax + 1, (nq, dim)).astype(np.float32)
    gf = rng.integers(-vmax, vmax + 1, (ng + 2, dim)).astype(np.float32)
    q_pid = np.append(rng.integers(0, 8, nq - 1), SAME_CAMERA_PID)
    g_pid = np.append(rng.integers(-1, 6, ng), [SAME_CAMERA_PID] * 2)
    q_cam = np.append(rng.choice([1, 2, 3, 6], nq - 1), 3)
    g_cam = np.append(rng.integers(1, 7, ng), [3, 3])
    return dict(qf=qf, q_pids=q_pid, q_camids=q_cam, gf=gf, g_pids=g_pid, g_camids=g_cam)


def assert_section(got: dict, want: dict, where: str) -> None:
    for key in ("n_mated", "n_non_mated", "closed_set_limit"):
        assert got[key] == want[key], f"{where}: {key} {got[key]} != {want[key]}"
    assert len(got["points"]) == len(want["points"]), where
    for mine, theirs in zip(got["points"], want["points"]):
        assert mine == theirs, f"{where}: {mine} != {theirs}"


# --------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("case", sorted(CASES))
def test_dir_at_fpir_equals_the_brute_force_reference_for_every_chunking(case):
    spec, overrides = CASES[case]
    protocol = resolve(spec, **overrides)
    for seed, spread in ((0, {}), (1, {}), (2, dict(dim=6, vmax=4))):  # heavy ties, then fewer
        data = problem(seed, **spread)
        ext_f, ext_pid, ext_cam, n_stored = extend_gallery(data["qf"], data["q_pids"], data["q_camids"], data["gf"],
                                                           data["g_pids"], data["g_camids"], protocol)
        dist = distance_matrix(data["qf"], ext_f, "euclidean")
        ref = reference_open_set(dist, data["q_pids"], data["q_camids"], ext_pid, ext_cam, protocol, n_stored)
        assert any(r["n_non_mated"] for r in ref) and any(r["n_mated"] for r in ref)
        sections = []
        for chunking in CHUNKINGS:
            result = streameval.evaluate(data, metric="euclidean", protocol=protocol, max_rank=MAX_RANK, no_gom=True,
                                         open_set=True, fpir=TARGETS, dir_ranks=RANKS, **chunking).to_dict()
            section, where = result["open_set"], f"{case} seed {seed} {chunking}"
            assert (section["fpir_targets"], section["ranks"], section["rounding"]) == (
                [float(Fraction(x)) for x in TARGETS], list(RANKS), "round")
            per_trial = section["per_trial"] if len(ref) > 1 else [section]
            for t, (got, want) in enumerate(zip(per_trial, ref, strict=True)):
                assert_section(got, want, f"{where} trial {t}")
            if len(ref) > 1:
                assert_trial_means(section, ref)
            # consistency (docs/open-set.md#definitions): accepting everything gives the protocol's CMC under skip
            cmc = result["cmc_first_hit"] if protocol.cmc == "sgs" else result["cmc"]
            if len(ref) == 1:
                assert [section["closed_set_limit"][str(r)] for r in RANKS] == [cmc[r - 1] for r in RANKS]
                assert section["points"][-1]["dir"] == section["closed_set_limit"]  # FPIR 1
            sections.append(section)
        assert all(s == sections[0] for s in sections), f"{case} seed {seed}: chunkings disagree"


def assert_trial_means(section: dict, ref: list) -> None:
    """Headline = means over the trials (the trials with non-mated queries, for the points)."""
    assert section["T"] == len(ref) and len(section["per_trial"]) == len(ref)
    assert section["n_mated"] == pytest.approx(np.mean([r["n_mated"] for r in ref]), abs=1e-12)
    present = [r for r in ref if r["points"]]
    for i, point in enumerate(section["points"]):
        for rank in map(str, RANKS):
            values = [r["points"][i]["dir"][rank] for r in present]
            assert point["dir"][rank] == pytest.approx(np.mean(values), abs=1e-12)
            if len(values) > 1:
                assert section["std"]["points"][i]["dir"][rank] == pytest.approx(np.std(values, ddof=1), abs=1e-12)
        assert point["achieved_fpir"] == pytest.approx(np.mean([r["points"][i]["achieved_fpir"] for r in present]))
        assert point["k"] is None and point["threshold"] is None  # per trial only


def test_the_problems_hold_same_camera_only_queries_which_are_non_mated():
    """Identity 9's query (camera 3) only has gallery rows in camera 3: mated without camera rules,
    non-mated under market's x_same (then scored by its nearest kept row)."""
    data = problem(0)
    q, rows = len(data["q_pids"]) - 1, set(range(len(data["g_pids"])))
    dist = distance_matrix(data["qf"], data["gf"], "euclidean")
    for name, mated in (("market", False), ("none", True)):
        kept = kept_in_key_order(dist[q], rows, q, SAME_CAMERA_PID, 3, data["g_pids"], data["g_camids"],
                                 resolve(name), len(rows))
        assert bool(positive_ranks(kept, SAME_CAMERA_PID, data["g_pids"])) == mated


def test_float_features_with_near_ties_give_the_exact_nearest_distance():
    """Real-valued features and near-duplicate rows (within the float32 GEMM's error window): the
    non-mated scores, read off as the thresholds s_(1) .. s_(N_nm - 1), equal the canonical distance
    (``kernels.pair_distances``, the definition of a pair's distance) of the nearest kept row."""
    rng = np.random.default_rng(3)
    nq, ng, dim = 12, 300, 64
    qf = rng.standard_normal((nq, dim)).astype(np.float32)
    gf = rng.standard_normal((ng, dim)).astype(np.float32)
    gf[:40] = qf[np.arange(40) % nq] + (1e-6 * rng.standard_normal((40, dim))).astype(np.float32)
    q_pid, g_pid = np.arange(100, 100 + nq), rng.integers(0, 5, ng)  # every query is non-mated
    q_cam, g_cam = np.ones(nq, int), rng.integers(1, 3, ng)
    expected = []
    metric = kernels.METRIC_CODES["euclidean"]
    for i in range(nq):
        kept = np.array([g for g in range(ng) if is_kept(g, set(range(ng)), i, int(q_pid[i]), 1, g_pid, g_cam,
                                                         resolve("market"), ng)])
        exact = kernels.pair_distances(qf, gf, np.full(kept.size, i), kept, kernels.row_terms(qf, metric),
                                       kernels.row_terms(gf, metric), metric)
        expected.append(exact.min())
    targets = [f"{k}/{nq}" for k in range(1, nq)]
    data = dict(qf=qf, q_pids=q_pid, q_camids=q_cam, gf=gf, g_pids=g_pid, g_camids=g_cam)
    for chunking in CHUNKINGS[:2]:
        section = streameval.evaluate(data, open_set=True, fpir=targets, dir_ranks=[1], no_gom=True,
                                      **chunking).open_set
        assert section["n_non_mated"] == nq and section["n_mated"] == 0
        assert [p["threshold"] for p in section["points"]] == sorted(expected)[:-1]
        assert section["points"][0]["dir"] == {"1": None} and section["closed_set_limit"] == {"1": None}
        assert section["note"] == "no mated query: DIR is undefined (null)"


V7_NON_MATED = (0.30, 0.50, 0.50, 0.80)
V7_MATED = ((0.20, 1), (0.40, 1), (0.50, 2), (0.90, 1))
V7_TABLE = (  # FPIR x, k, threshold, accept, achieved FPIR, DIR rank 1, DIR rank 2 (docs/open-set.md#worked-example-v7)
    ("0.1", 0, 0.25, "d < threshold", 0, 1 / 4, 1 / 4),
    ("0.125", 1, 0.30, "d <= threshold", 1 / 4, 1 / 4, 1 / 4),
    ("0.25", 1, 0.30, "d <= threshold", 1 / 4, 1 / 4, 1 / 4),
    ("0.5", 2, 0.50, "d <= threshold", 3 / 4, 1 / 2, 3 / 4),
    ("1", 4, None, "all", 1, 3 / 4, 1),
)


@pytest.fixture(scope="module")
def v7_store(tmp_path_factory):
    """V7 as stored distances: queries 0-3 non-mated (identities 101-104, nearest kept row at their
    score), queries 4-7 mated with identities 1-4 (positive at d+, a pid-50 row before the rank-2 one)."""
    far = 5.0
    dist = np.full((8, 5), far)
    for q, score in enumerate(V7_NON_MATED):
        dist[q, 4] = score
    for q, (d, rank) in enumerate(V7_MATED):
        dist[4 + q, q] = d
        if rank == 2:
            dist[4 + q, 4] = d - 0.05
    path = tmp_path_factory.mktemp("v7") / "v7.zarr"
    streameval.write_distance_store(path, dist, [101, 102, 103, 104, 1, 2, 3, 4], [1] * 8, [1, 2, 3, 4, 50],
                                    [2] * 5)
    return str(path)


def test_vector_v7(v7_store):
    section = streameval.evaluate(v7_store, open_set=True, fpir=[row[0] for row in V7_TABLE], dir_ranks=[1, 2],
                                  no_gom=True).open_set
    assert (section["n_non_mated"], section["n_mated"]) == (4, 4)
    got = [(p["k"], p["threshold"], p["accept"], p["achieved_fpir"], p["dir"]["1"], p["dir"]["2"])
           for p in section["points"]]
    assert got == [row[1:] for row in V7_TABLE]
    assert section["closed_set_limit"] == {"1": 3 / 4, "2": 1.0} and section["note"] is None
    floor = streameval.evaluate(v7_store, open_set=True, fpir="0.1,0.125", dir_ranks="1,2", fpir_rounding="floor",
                                no_gom=True).open_set
    assert floor["points"][1]["k"] == 0 and floor["points"][1]["threshold"] == 0.25  # as the 0.1 row
    assert floor["rounding"] == "floor" and floor["points"][0] == {**floor["points"][1], "fpir": 0.1}


def test_targets_are_exact_decimals_rounded_half_up():
    """0.29 x 100 is 29 (float64's product is 28.999...); 0.005 x 100 = 0.5 rounds up (Python's
    round would give 0); floor never exceeds the target."""
    from streameval.features.open_set.finalise import Spec

    spec = Spec.parse({"fpir": ["0.29", "0.005", "0.015"], "ranks": [1], "rounding": "round"}, 50)
    floor = Spec.parse({**spec.to_record(), "rounding": "floor"}, 50)
    assert [spec.count(x, 100) for x in spec.targets] == [1, 2, 29]
    assert [floor.count(x, 100) for x in floor.targets] == [0, 1, 29]
    assert spec.fpir == ("0.005", "0.015", "0.29")  # sorted by value, as written


def test_without_non_mated_queries_only_the_closed_set_limit_is_reported():
    data = problem(1)
    data["q_pids"][:] = data["g_pids"][data["g_pids"] >= 0][0]  # one identity, in the gallery: all mated
    data["q_camids"][:] = 7  # no gallery camera: no same-camera exclusion
    result = streameval.evaluate(data, open_set=True, dir_ranks="1,2", max_rank=5, no_gom=True)
    section = result.open_set
    assert section["n_non_mated"] == 0 and section["points"] == []
    assert section["note"].startswith("no non-mated query: DIR@FPIR is undefined")
    assert section["closed_set_limit"] == {"1": result.rank(1), "2": float(result.cmc[1])}


def test_trials_report_each_trial_and_the_spread():
    """sysu-all with 3 trials, every query in camera 3 or 6: each trial's section equals the
    reference (a row of one trial never scores another's query: fewer ties here, so the trials'
    nearest rows differ), headline means, mean and std."""
    data = problem(4, dim=6, vmax=4)
    data["q_camids"][:] = np.where(np.arange(len(data["q_camids"])) % 2, 3, 6)
    protocol = resolve("sysu-all", trials=3)
    evaluated = streameval.evaluate(data, protocol=protocol, open_set=True, fpir=TARGETS, dir_ranks=RANKS,
                                    max_rank=MAX_RANK, no_gom=True, query_block=4, gallery_chunk=9)
    result, section = evaluated.to_dict(), evaluated.open_set
    assert "means over 3 trials)" in summary(evaluated)
    dist = distance_matrix(data["qf"], data["gf"], "euclidean")
    ref = reference_open_set(dist, data["q_pids"], data["q_camids"], data["g_pids"], data["g_camids"], protocol,
                             len(data["g_pids"]))
    for t, (got, want) in enumerate(zip(section["per_trial"], ref, strict=True)):
        assert_section(got, want, f"trial {t}")
    assert section["T"] == 3 and section["std_ddof"] == 1
    for key in ("n_mated", "n_non_mated"):
        values = [s[key] for s in section["per_trial"]]
        assert section[key] == section["mean"][key] == np.mean(values)
        assert section["std"][key] == pytest.approx(np.std(values, ddof=1))
    rank1 = [s["closed_set_limit"]["1"] for s in section["per_trial"]]
    assert section["closed_set_limit"]["1"] == pytest.approx(np.mean(rank1))
    assert section["closed_set_limit"]["1"] == pytest.approx(result["rank1"])  # the CMC's trial mean


def write_problem(path, seed: int) -> str:
    data = problem(seed)
    streameval.write_store(path, data["qf"], data["q_pids"], data["q_camids"], data["gf"], data["g_pids"],
                           data["g_camids"], chunk_rows=8)
    return str(path)


def test_update_after_appends_equals_a_full_evaluation(tmp_path):
    """The nearest-row state merges by its minimum: after appending a row nearer to a non-mated
    query than any before (a copy of it, another identity) and a first positive of another, the
    update's section equals a full evaluation's."""
    store, state = write_problem(tmp_path / "s.zarr", 5), tmp_path / "state"
    options = dict(open_set=True, fpir=TARGETS, dir_ranks=RANKS, max_rank=MAX_RANK, gom_norm="fixed:0:8")
    before = streameval.evaluate(store, state=state, **options).open_set
    data = problem(5)
    open_pids = data["q_pids"][~np.isin(data["q_pids"], data["g_pids"])]
    near, gains = (np.flatnonzero(data["q_pids"] == pid)[0] for pid in (open_pids.min(), open_pids.max()))
    assert open_pids.min() < open_pids.max()
    streameval.append_gallery(store, data["qf"][[near, gains]], np.array([0, data["q_pids"][gains]]),
                              np.array([5, 5]))
    updated = streameval.update(store, state)
    assert updated.run["update"]["queries_with_new_positives"] >= 1
    assert updated.open_set == streameval.evaluate(store, **options).open_set != before
    assert updated.open_set["n_non_mated"] == before["n_non_mated"] - (open_pids == open_pids.max()).sum()
    # report-only options may change; a state without the nearest rows cannot gain them
    again = streameval.update(store, state, fpir="0.5", dir_ranks="1")
    assert again.open_set == streameval.evaluate(store, **{**options, "fpir": "0.5", "dir_ranks": "1"}).open_set
    plain = tmp_path / "plain"
    streameval.evaluate(store, state=plain, gom_norm="fixed:0:8")
    with pytest.raises(StateError, match="open_set"):
        streameval.update(store, plain, open_set=True)


def test_command_line_writes_the_section_and_the_summary(tmp_path):
    store = write_problem(tmp_path / "s.zarr", 6)
    out = tmp_path / "r.json"
    run = cli("eval", store, "--no-gom", "--open-set", "--fpir", "0.1,0.5", "--dir-ranks", "1,2", "--json", out)
    api = streameval.evaluate(store, no_gom=True, open_set=True, fpir="0.1,0.5", dir_ranks=[1, 2])
    assert json.loads(out.read_text())["open_set"] == api.to_dict()["open_set"]
    assert "open-set DIR@FPIR" in run.output and "FPIR 0.5 (achieved" in run.output
    for args, named in ((["--open-set", "--fpir", "1.5"], "--fpir"), (["--fpir", "0.1"], "--open-set"),
                        (["--open-set", "--dir-ranks", "60"], "--max-rank"), (["--open-set", "--fpir", "x"], "--fpir")):
        assert named in one_error_line(cli("eval", store, *args, code=2))


def test_a_local_cluster_of_processes_gives_the_threaded_numbers(tmp_path):
    pytest.importorskip("distributed")
    store = write_problem(tmp_path / "s.zarr", 7)
    options = dict(open_set=True, fpir=TARGETS, dir_ranks=RANKS, max_rank=MAX_RANK, no_gom=True, gallery_chunk=8)
    local = streameval.evaluate(store, cluster="local", n_workers=2, threads_per_worker=1, **options)
    assert local.open_set == streameval.evaluate(store, **options).open_set
    assert local.open_set["n_non_mated"] > 0
