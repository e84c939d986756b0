"""Pair-level verification (docs/verification.md#definitions, #how-it-is-computed; docs/options.md#the-json-result) against a brute-force reference written
here: every pair of a small problem materialised in float64, the kept sets of docs/protocols.md#the-kept-set
(``protocol_reference``), negatives sorted.  TAR, achieved FAR, thresholds, AUC and the ROC points
must be equal exactly (the same integer counts), for heavy ties (integer features), open-set and
same-camera-only queries, trials, several chunkings, the one-pass tail and the two-pass refinement,
the threaded scheduler and a real LocalCluster; vector V6; k exact from the decimal written;
fast-reid's inverted ROC (#168) reproduced from our numbers; update after an append."""

from __future__ import annotations

import json
import math
import struct
from contextlib import contextmanager
from fractions import Fraction

import numpy as np
import pytest
from click.testing import CliRunner

import streameval
from streameval.cli import main
from streameval.protocols import resolve

from protocol_reference import extend_gallery, kept_in_key_order, trial_galleries, trial_queries
from reference import distance_matrix

MASK = (1 << 64) - 1
TARGETS = "0,0.001,0.01,0.1,0.29,0.5,1"
CHUNKINGS = [dict(), dict(query_block=5, gallery_chunk=7), dict(query_block=64, gallery_chunk=13, workers=1)]
TWO_PASS = dict(tail_budget=32)  # one entry, the smallest budget: no tail fits: histogram, then refinement passes
NARROW = dict(tail_budget=64, hist_bits=4)  # two entries per bin: refined down to single keys
# Bands (a pilot places them; no tail, as when it would not fit): collected in the scoring pass;
# counted there and collected by one refinement pass; counted in minmax GOM's first pass and
# collected in its scoring pass; placed below every distance (as a pilot misled by its sample
# could), so the two-pass route takes over, counting the histogram again first.
BANDS = {"bands": {}, "counted bands": {"COLLECT_SHARE": 0.0}, "first-pass bands": {"COLLECT_SHARE": 0.0},
         "missed bands": {"band_edges": lambda *_: (-2.0, -1.0, 0.01, -2.0)}}
BAND_OPTIONS = {"first-pass bands": {"no_gom": False}}


@contextmanager
def routed(monkeypatch, route: str):
    """Verification takes ``route``: a key of BANDS, else the one the options choose.  Yields the
    list of how many targets each selection found in its bands."""
    from streameval import bands, verification

    found = []

    def banded(*args):
        out = selected(*args)
        found.append(len(out))
        return out

    with monkeypatch.context() as patch:
        if route in BANDS:
            selected = verification._banded
            patch.setattr(verification, "_banded", banded)
            patch.setattr(verification.Spec, "sized_core", lambda *_: 0)
            for name, value in BANDS[route].items():
                patch.setattr(bands, name, value)
        yield found


# ------------------------------------------------------------------------------- the reference


def key_bin(x: float, bits: int) -> int:
    """Top ``bits`` of the order-preserving key of float64 x (docs/verification.md#how-it-is-computed, on 64 bits)."""
    u = struct.unpack("<Q", struct.pack("<d", x + 0.0))[0]
    key = (~u & MASK) if u >> 63 else u | (1 << 63)
    return key >> (64 - bits)


def bin_edge(b: int, bits: int) -> float:
    key = b << (64 - bits)
    u = key ^ (1 << 63) if key >> 63 else ~key & MASK
    return struct.unpack("<d", struct.pack("<Q", u))[0]


def pooled_pairs(dist, q_pid, q_cam, ext_pid, ext_cam, protocol, n_stored):
    """Per trial (positive distances, negative distances), sorted: every kept pair of every query."""
    galleries = trial_galleries(ext_pid, ext_cam, protocol)
    out = []
    for gallery, queries in zip(galleries, trial_queries(q_cam, galleries, protocol, n_stored)):
        pos, neg = [], []
        for i in sorted(queries):
            for g in kept_in_key_order(dist[i], gallery, i, int(q_pid[i]), int(q_cam[i]), ext_pid, ext_cam, protocol,
                                       n_stored):
                (pos if ext_pid[g] == q_pid[i] else neg).append(float(dist[i, g]))
        out.append((sorted(pos), sorted(neg)))
    return out


def below(values: list, t: float) -> int:
    return sum(v < t for v in values)


def reference_trial(pos: list, neg: list, targets: str, bits: int) -> dict:
    """docs/verification.md#definitions, literally."""
    points = []
    for text in targets.split(","):
        k = math.floor(Fraction(text) * len(neg))
        if k == len(neg):
            points.append({"k": k, "threshold": None, "accept": "all", "tar": 1.0 if pos else None,
                           "achieved_far": 1.0 if neg else None})
            continue
        t = neg[k]
        points.append({"k": k, "threshold": t, "accept": "d < threshold",
                       "tar": below(pos, t) / len(pos) if pos else None, "achieved_far": below(neg, t) / len(neg)})
    auc = sum(2 * below(pos, d) + pos.count(d) for d in neg)
    bins = sorted({key_bin(d, bits) for d in pos + neg})
    thresholds = [bin_edge(bins[0], bits)] + [bin_edge(b + 1, bits) for b in bins] if bins else []
    return {"n_pos": len(pos), "n_neg": len(neg), "points": points,
            "auc": auc / (2 * len(pos) * len(neg)) if pos and neg else None, "thresholds": thresholds}


def assert_trial(got: dict, pos: list, neg: list, targets: str, bits: int, where: str, auc: bool = True) -> None:
    ref = reference_trial(pos, neg, targets, bits)
    assert (got["n_pos"], got["n_neg"]) == (ref["n_pos"], ref["n_neg"]), where
    assert len(got["points"]) == len(ref["points"]), f"{where}: {len(got['points'])} points"
    for point, want in zip(got["points"], ref["points"], strict=True):
        assert {key: point[key] for key in want} == want, f"{where}: FAR {point['far']}"
    assert got["auc"] == (ref["auc"] if auc else None), where
    curves = got["curves"]
    assert curves["threshold"] == ref["thresholds"], where
    for t, tar, far in zip(curves["threshold"], curves["tar"], curves["far"], strict=True):
        assert tar == (below(pos, t) / len(pos) if pos else None) and far == below(neg, t) / len(neg), f"{where}: {t}"


# --------------------------------------------------------------------------------- problems


def float_traps(n_neg: int, count: int = 2) -> list[str]:
    """FAR targets, decimals of 20 digits as a user may write them, whose k = floor(x N-) float64
    gets wrong: x just above or below some k / N-, where the double nearest x falls on k's other side."""
    found = []
    for k in range(1, n_neg):
        scaled = Fraction(k, n_neg) * 10**20
        for digits in (math.ceil(scaled), math.floor(scaled)):
            text = "0." + str(digits).rjust(20, "0")
            if math.floor(float(text) * n_neg) != math.floor(Fraction(text) * n_neg) and len(found) < count:
                found.append(text)
    return found


def with_traps(targets: str, pairs: list) -> str:
    """``targets`` and the float traps of every trial's N-, ascending (as the result lists them)."""
    traps = [x for _, neg in pairs for x in float_traps(len(neg))]
    return ",".join(sorted(set(targets.split(",")) | set(traps), key=Fraction))


def problem(seed: int, dim: int = 3):
    """Integer features (exact distances, heavy ties); query pids 6 and 7 have no gallery row but
    the last one, pid 9 in the last query's camera: open-set queries, and a same-camera-only one
    (no positive under market's camera rule)."""
    rng = np.random.default_rng(seed)
    nq, ng = int(rng.integers(8, 16)), int(rng.integers(25, 50))
    qf = rng.integers(-2, 3, (nq, dim)).astype(np.float32)
    gf = rng.integers(-2, 3, (ng, dim)).astype(np.float32)
    q_pid, g_pid = np.append(rng.integers(0, 8, nq - 1), 9), np.append(rng.integers(-1, 6, ng - 1), 9)
    q_cam, g_cam = rng.integers(1, 3, nq), np.append(rng.integers(1, 4, ng - 1), 0)
    q_cam[-1] = 0
    return qf, q_pid, q_cam, gf, g_pid, g_cam


def arrays(qf, q_pid, q_cam, gf, g_pid, g_cam) -> dict:
    return dict(qf=qf, q_pids=q_pid, q_camids=q_cam, gf=gf, g_pids=g_pid, g_camids=g_cam)


def without_curves(section: dict) -> dict:
    """What every method and chunking must agree on (the curves' resolution is --hist-bits)."""
    trials = [without_curves(trial) for trial in section.get("per_trial") or []]
    return {**{k: v for k, v in section.items() if k not in ("method", "curves")}, "per_trial": trials}


CASES = {  # name: (protocol, overrides)
    "market": ("market", {}),
    "none": ("none", {}),
    "mars-queries-in-gallery": ("mars", {}),
    "sysu-trials": ("sysu-all", {"trials": 3}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_verification_equals_the_pairs_reference_for_every_chunking_and_method(case, monkeypatch):
    spec, overrides = CASES[case]
    protocol = resolve(spec, **overrides)
    trapped = False
    for seed in range(2):
        qf, q_pid, q_cam, gf, g_pid, g_cam = problem(seed)
        if spec == "sysu-all":  # its cameras: queries 3 and 6, gallery 1, 2, 4, 5
            q_cam, g_cam = np.where(q_cam == 1, 3, 6), np.array([1, 2, 4, 5])[g_cam % 4]
        ext_f, ext_pid, ext_cam, n_stored = extend_gallery(qf, q_pid, q_cam, gf, g_pid, g_cam, protocol)
        pairs = pooled_pairs(distance_matrix(qf, ext_f, "euclidean"), q_pid, q_cam, ext_pid, ext_cam, protocol,
                             n_stored)
        targets = with_traps(TARGETS, pairs)  # k exact, not float64's (as test_k_is_exact_... alone did)
        trapped |= targets != TARGETS
        outputs = []
        for method, extra in (("tail", {}), ("tail", {"auc": False}), ("tail", {"auc": False, "hist_bits": 20}),
                              ("two-pass", TWO_PASS), ("two-pass", NARROW),
                              *((route, {"auc": False, **BAND_OPTIONS.get(route, {})}) for route in BANDS)):
            for chunking in CHUNKINGS:
                with routed(monkeypatch, method) as banded:
                    result = streameval.evaluate(arrays(qf, q_pid, q_cam, gf, g_pid, g_cam), metric="euclidean",
                                                 protocol=protocol, verification=True, far=targets,
                                                 **{"no_gom": True, "auc": True, **extra}, **chunking
                                                 ).to_dict()["verification"]
                where = f"{case} seed {seed} {method} {extra} {chunking}"
                bits = extra.get("hist_bits", 16)
                if method == "two-pass":
                    assert result["method"] == "two-pass", where
                if method in BANDS:  # (the targets a tiny pilot cannot place take the two-pass route)
                    assert bool(sum(banded)) == (method != "missed bands"), where
                auc = extra.get("auc", True)
                if len(pairs) == 1:
                    assert_trial(result, *pairs[0], targets, bits, where, auc)
                else:
                    assert result["T"] == len(pairs) and result["curves"] is None
                    for t, (got, (pos, neg)) in enumerate(zip(result["per_trial"], pairs)):
                        assert_trial(got, pos, neg, targets, bits, f"{where} trial {t}", auc)
                    tars = [[p["tar"] for p in trial["points"]] for trial in result["per_trial"]]
                    assert [p["tar"] for p in result["points"]] == pytest.approx(np.mean(tars, axis=0), abs=1e-15)
                    assert result["std"]["tar"] == pytest.approx(np.std(tars, axis=0, ddof=1).tolist(), abs=1e-15)
                if auc:  # (without the AUC, the same points and curves are checked above)
                    outputs.append(json.dumps(without_curves(result)))
        assert len(set(outputs)) == 1, f"{case} seed {seed}: chunkings or methods disagree"
    assert trapped  # some N- here has targets float64 gets wrong


def test_near_ties_overflowing_the_tail_take_the_two_pass_route():
    """Every pair at distance sqrt(3) (inside a bin): every negative lies within its float32 window
    of the tail's bound and they fill its buffer: unusable, the refinement selects."""
    _, q_pid, q_cam, _, g_pid, g_cam = problem(0)
    qf, gf = np.ones((len(q_pid), 3), np.float32), np.full((len(g_pid), 3), 2, np.float32)
    protocol = resolve("market")
    ext_f, ext_pid, ext_cam, n_stored = extend_gallery(qf, q_pid, q_cam, gf, g_pid, g_cam, protocol)
    ((pos, neg),) = pooled_pairs(distance_matrix(qf, ext_f, "euclidean"), q_pid, q_cam, ext_pid, ext_cam, protocol,
                                 n_stored)
    result = streameval.evaluate(arrays(qf, q_pid, q_cam, gf, g_pid, g_cam), metric="euclidean", no_gom=True,
                                 verification=True, far="0.01").verification  # (the AUC would settle them)
    assert result["method"] == "two-pass"
    assert_trial(result, pos, neg, "0.01", 16, "overflow", auc=False)


def test_a_band_past_its_capacity_holds_at_most_it_per_chain_and_falls_back(monkeypatch):
    """A band far wider than its capacity (every distance, 64 members): each chain's tasks stop
    collecting at the capacity (counted across the chain, though each task fills its own buffer),
    the joined band is marked overflowed, and the targets take the two-pass route, exact."""
    from streameval import bands
    from streameval.statistics import verify

    rng = np.random.default_rng(6)
    qf, gf = rng.normal(size=(30, 16)).astype(np.float32), rng.normal(size=(400, 16)).astype(np.float32)
    data = arrays(qf, rng.integers(0, 40, 30), rng.integers(0, 4, 30), gf, rng.integers(0, 40, 400),
                  rng.integers(0, 4, 400))
    options = dict(verification=True, far="0.001,0.01,0.1", auc=False, no_gom=True, gallery_chunk=50, workers=2)
    expected = streameval.evaluate(data, **options).to_dict()["verification"]
    joined = []

    def join(self, key, a, pieces):
        out = join_band(self, key, a, pieces)
        joined.append((max(int(sum(p[job, 0, verify.COUNT] for p in (a, *pieces))) for job in range(a.shape[0])),
                       bool(out[:, 0, verify.OVERFLOW].all())))
        return out

    join_band = verify.Verify.join_own
    with routed(monkeypatch, "bands") as banded:
        monkeypatch.setattr(bands, "band_edges", lambda *_: (0.0, 1e300, 0.0, 0.0))
        monkeypatch.setattr(verify.Verify, "join_own", join)
        result = streameval.evaluate(data, **options).to_dict()["verification"]
    assert joined and sum(banded) == 0 and result["method"] == "two-pass"
    assert all(total <= 2 * 64 and overflowed for total, overflowed in joined), joined  # 2 chains
    assert without_curves(result) == without_curves(expected)


@pytest.mark.parametrize("auc", [True, False])
@pytest.mark.parametrize("gallery_chunk", [64, 400])
def test_tail_and_two_pass_agree_on_real_valued_features_with_float32_windows(auc, gallery_chunk, monkeypatch):
    """Random float features: fast (float32 GEMM) distances differ from the canonical ones within
    their windows, so entries near each threshold are settled by reading their rows again.  (The
    one-pass curves are binned on fast distances with float32 GEMMs: left out here.)  Without the
    AUC the scoring pass counts a row at a time; one chunk of 400 rows holds more negatives than the
    tail's length, so the tail's bound is placed from the block's own counts before it takes any.
    Without the AUC the bands' routes too: members collected with their canonical distances."""
    rng = np.random.default_rng(5)
    qf, gf = rng.normal(size=(30, 64)).astype(np.float32), rng.normal(size=(400, 64)).astype(np.float32)
    data = arrays(qf, rng.integers(0, 40, 30), rng.integers(0, 4, 30), gf, rng.integers(0, 40, 400),
                  rng.integers(0, 4, 400))
    found = {}
    routes = (("tail", {}), ("two-pass", TWO_PASS), ("float64", dict(precision="float64")),
              *(((route, BAND_OPTIONS.get(route, {})) for route in BANDS) if not auc else ()))
    for name, extra in routes:
        with routed(monkeypatch, name) as banded:
            result = streameval.evaluate(data, verification=True, far="0.001,0.01,0.1", auc=auc,
                                         gallery_chunk=gallery_chunk, **{"no_gom": True, **extra}
                                         ).to_dict()["verification"]
        found[name] = json.dumps(without_curves(result))
        if name in BANDS:
            assert bool(sum(banded)) == (name != "missed bands"), name
        # exact: binned on canonical distances where it mattered (as the two-pass route counts again)
        assert result["curves"]["exact"] == (name == "float64" or result["method"] == "two-pass"), name
    assert len(set(found.values())) == 1


# ------------------------------------------------------------------------------ fixed vectors


def v6_store(tmp_path):
    """docs/verification.md#worked-example-v6 as a distance store: query A (pid 1, camera 4) has positive pairs .2, .5
    and negatives .1, .3, .5, .7; query B (pid 2, camera 3) positive .4 and negatives .3, .6, .8, .9
    (gallery row 3 is B's identity in B's camera: excluded for B by the market rule)."""
    g_pids, g_cams = np.array([1, 1, 2, 2, 5, 6]), np.array([1, 1, 2, 3, 2, 2])
    dist = np.array([[.2, .5, .1, .3, .5, .7],
                     [.3, .6, .4, .05, .8, .9]])
    path = str(tmp_path / "v6.zarr")
    streameval.write_distance_store(path, dist, np.array([1, 2]), np.array([4, 3]), g_pids, g_cams)
    return path


V6 = [  # x, k, threshold, TAR, achieved FAR
    ("0", 0, .1, 0, 0), ("0.125", 1, .3, 1 / 3, 1 / 8), ("0.2", 1, .3, 1 / 3, 1 / 8), ("0.25", 2, .3, 1 / 3, 1 / 8),
    ("0.375", 3, .5, 2 / 3, 3 / 8), ("0.5", 4, .6, 1, 1 / 2), ("1", 8, None, 1, 1),
]


@pytest.mark.parametrize("extra", [{}, TWO_PASS], ids=["tail", "two-pass"])
def test_vector_v6(tmp_path, extra):
    result = streameval.evaluate(v6_store(tmp_path), protocol="market", no_gom=True, verification=True,
                                 far=",".join(x for x, *_ in V6), auc=True, **extra).verification
    assert (result["n_pos"], result["n_neg"]) == (3, 8)
    got = [(p["k"], p["threshold"], p["tar"], p["achieved_far"]) for p in result["points"]]
    assert got == [(k, t, tar, far) for _, k, t, tar, far in V6]
    assert result["points"][-1]["accept"] == "all" and result["points"][0]["accept"] == "d < threshold"
    assert result["auc"] == 11 / 16


def test_k_is_exact_from_the_decimal_written(tmp_path):
    """0.29 x 100 negatives: k = 29 (float64 gives 28.999999999999996)."""
    assert math.floor(0.29 * 100) == 28
    dist = np.concatenate([[0.5], np.arange(1, 101, dtype=np.float64)])[None, :]
    path = str(tmp_path / "k.zarr")
    streameval.write_distance_store(path, dist, np.array([1]), np.array([1]), np.concatenate([[1], np.arange(2, 102)]),
                                    np.full(101, 2))
    for far in ("0.29", [0.29]):
        (point,) = streameval.evaluate(path, no_gom=True, verification=True, far=far).verification["points"]
        assert (point["k"], point["threshold"], point["achieved_far"], point["tar"]) == (29, 30.0, 0.29, 1.0)


def test_fast_reid_inverted_roc_is_reproduced_from_our_numbers(tmp_path):
    """fast-reid's roc.py (#168) gives positive pairs label 0 and negative pairs label 1 and ranks
    by distance, so its "TPR"(t) = #{neg: d >= t} / N- and its "FPR"(t) = #{pos: d >= t} / N+
    (= 1 - TAR<(t)), computed here from the materialised pairs: FAR(t) = 1 - its TPR(t)."""
    qf, q_pid, q_cam, gf, g_pid, g_cam = problem(3)
    protocol = resolve("market")
    ext_f, ext_pid, ext_cam, n_stored = extend_gallery(qf, q_pid, q_cam, gf, g_pid, g_cam, protocol)
    ((pos, neg),) = pooled_pairs(distance_matrix(qf, ext_f, "euclidean"), q_pid, q_cam, ext_pid, ext_cam, protocol,
                                 n_stored)

    def fast_reid_tpr(t):
        return Fraction(sum(d >= t for d in neg), len(neg))

    def fast_reid_fpr(t):
        return Fraction(sum(d >= t for d in pos), len(pos))

    result = streameval.evaluate(arrays(qf, q_pid, q_cam, gf, g_pid, g_cam), metric="euclidean", no_gom=True,
                                 verification=True, far=TARGETS).verification
    checked = 0
    points = [(p["threshold"], p["tar"], p["achieved_far"]) for p in result["points"] if p["threshold"] is not None]
    curves = result["curves"]
    for t, tar, far in points + list(zip(curves["threshold"], curves["tar"], curves["far"])):
        assert far == pytest.approx(float(1 - fast_reid_tpr(t)), abs=1e-15)
        assert tar == pytest.approx(float(1 - fast_reid_fpr(t)), abs=1e-15)
        checked += 1
    assert checked >= 8
    # V6 (docs/verification.md#worked-example-v6): fast-reid's "TPR" at t = .5 is 5/8 = 1 - FAR<(.5)
    v6 = streameval.evaluate(v6_store(tmp_path), no_gom=True, verification=True, far="0.375").verification
    assert v6["points"][0]["threshold"] == .5 and 1 - v6["points"][0]["achieved_far"] == 5 / 8


# --------------------------------------------------------------------- updates, CLI, cluster


def comparable(verification: dict) -> dict:
    """Integer features: fast and canonical distances agree, so the curves too, however binned."""
    curves = {k: v for k, v in verification["curves"].items() if k != "exact"}
    return {**{k: v for k, v in verification.items() if k != "method"}, "curves": curves}


@pytest.mark.parametrize("new_pids", ["distractors", "new-positives"])
def test_update_after_an_append_equals_a_full_evaluation(tmp_path, new_pids):
    rng = np.random.default_rng(11)
    qf, q_pid, q_cam, gf, g_pid, g_cam = problem(1, dim=4)
    store, state = str(tmp_path / "s.zarr"), str(tmp_path / "state")
    streameval.write_store(store, qf, q_pid, q_cam, gf, g_pid, g_cam)
    options = dict(no_gom=True, verification=True, far=TARGETS, auc=True)
    streameval.evaluate(store, state=state, **options)
    n = 60  # more negatives than the saved tail was sized for: the selection refines in a second pass
    pids = np.full(n, 50) if new_pids == "distractors" else rng.choice(q_pid, n)  # pid 50: no query
    streameval.append_gallery(store, rng.integers(-2, 3, (n, 4)).astype(np.float32), pids, rng.integers(1, 4, n))
    updated = streameval.update(store, state)
    assert updated.run["update"]["queries_rescored"] == (0 if new_pids == "distractors" else len(qf))
    full = streameval.evaluate(store, **options)
    assert comparable(updated.verification) == comparable(full.verification)
    assert updated.verification["method"] == "two-pass" and full.verification["method"] == "tail"
    again = streameval.update(store, state, far="0.01")  # nothing appended: the report options may change
    assert comparable(again.verification) == comparable(streameval.evaluate(store, **{**options, "far": "0.01"})
                                                        .verification)


def test_cli_options_summary_and_errors(tmp_path):
    path = v6_store(tmp_path)
    out = tmp_path / "r.json"
    run = CliRunner().invoke(main, ["eval", path, "--no-gom", "--verification", "--far", "0.25,0.5", "--auc",
                                    "--hist-bits", "8", "--tail-budget", "1KiB", "--json", str(out)])
    assert run.exit_code == 0, run.output
    assert "TAR@FAR=0.25  33.33%" in run.output and "AUC 0.687500" in run.output
    section = json.loads(out.read_text())["verification"]
    assert section["far_targets"] == [0.25, 0.5] and section["curves"]["bits"] == 8
    assert section["label_convention"].startswith("label 1 = positive pair")
    for args, message in ((["--far", "0.1"], "only go with --verification"),
                          (["--verification", "--far", "1.5"], "FAR targets from 0 to 1"),
                          (["--verification", "--far", "x"], "decimal FAR targets"),
                          (["--verification", "--hist-bits", "30"], "--hist-bits")):
        run = CliRunner().invoke(main, ["eval", path, "--no-gom", *args])
        assert run.exit_code == 2 and message in run.output and run.output.count("\n") == 1, run.output


def test_local_cluster_equals_threaded_for_both_methods(tmp_path, monkeypatch):
    """The two-pass route, and bands counted in minmax GOM's first pass (the pilot's tasks, the
    riding statistic and its hand-over to the scoring pass on the workers)."""
    pytest.importorskip("distributed")
    data = str(tmp_path / "s.zarr")  # on disk: the workers are other processes
    streameval.write_store(data, *problem(0))
    for route, options in (("two-pass", dict(no_gom=True, auc=True, **TWO_PASS)), ("first-pass bands", {})):
        options = dict(verification=True, far=TARGETS, gallery_chunk=9, **options)
        with routed(monkeypatch, route) as banded:
            threaded = streameval.evaluate(data, **options).verification
            clustered = streameval.evaluate(data, cluster="local", n_workers=2, threads_per_worker=1,
                                            **options).verification
        assert clustered == threaded, route
        assert threaded["method"] == "two-pass" if route == "two-pass" else banded[0] == banded[1] > 0


def test_forged_tails_in_a_state_are_refused(tmp_path):
    import zarr

    qf, q_pid, q_cam, gf, g_pid, g_cam = problem(1)
    store, state = str(tmp_path / "s.zarr"), tmp_path / "state"
    streameval.write_store(store, qf, q_pid, q_cam, gf, g_pid, g_cam)
    streameval.evaluate(store, state=str(state), no_gom=True, verification=True, far="0.1")
    version = zarr.open_group(str(state / (state / "CURRENT").read_text().strip()), mode="r+")
    tail = np.asarray(version["stats/verify/tail"])
    for row, column, value, problem_text in ((0, 0, tail.shape[1], "has a malformed header"),  # count > capacity
                                             (1, 2, len(gf), "holds an entry that is not")):  # gallery row > rows
        forged = tail.copy()
        forged[:, row, column] = value
        version.create_array("stats/verify/tail", data=forged, overwrite=True)
        run = CliRunner().invoke(main, ["update", store, "--state", str(state), "-q"])
        assert run.exit_code == 3 and f"stats/verify/tail {problem_text}" in run.output, run.output
