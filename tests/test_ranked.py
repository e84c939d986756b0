"""Ranked lists (docs/ranked-lists.md) against a brute-force top-k.

The reference builds the full query x extended-gallery distance matrix in float64, sorts every
row by (distance, gallery index), keeps the rows of docs/protocols.md#the-kept-set (``protocol_reference.is_kept``)
and reads the top-k, the excluded rows before the k-th kept one and the positives' ranks off that
list.  Integer-valued features make every distance exact, so ties are frequent and the lists must
be equal entry for entry, for several chunkings and protocols (queries in the gallery, camera
rules, trials).  Real-valued near-ties are ranked exactly too, also when every fast (GEMM) distance
is pushed to the edge of its error window.  Then: vector V9 (copied from the spec), worst / best
ordering, ``update`` after appends, image paths, and the command line end to end (JSON lines and
zarr group).
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
from fractions import Fraction

import numpy as np
import pytest
import zarr

import streameval
from streameval.engine import graph, kernels
from streameval.protocols import resolve
from streameval.features.ranked.finalise import read_records
from streameval.run.statestore import StateError
from streameval.store.paths import write_paths

from cli_checks import cli, one_error_line
from protocol_reference import extend_gallery, identity_dedup_rho, is_kept, trial_galleries, trial_queries
from reference import ap_rectangle, ap_trapezoid, distance_matrix, inp

TOL = 1e-12
# three workers: chains of interleaved chunks, merged (``graph.scoring_pass``)
CHUNKINGS = [dict(), dict(query_block=3, gallery_chunk=5, workers=3), dict(query_block=64, gallery_chunk=13, workers=1)]
CASES = {  # name: (protocol, overrides, trial whose lists are taken)
    "market": ("market", {}, 0),
    "none": ("none", {}, 0),
    "sysu-all-trials": ("sysu-all", {"trials": 3}, 2),  # identity-dedup, x_any, drawn trial galleries
    "mars": ("mars", {}, 0),  # queries in the gallery, the query's own copy excluded
}
OPTIONS = dict(metric="sqeuclidean", no_gom=True)


def problem(seed: int, nq=None):
    rng = np.random.default_rng(seed)
    nq, ng, dim = nq or int(rng.integers(6, 14)), int(rng.integers(20, 45)), 3
    return (rng.integers(-2, 3, (nq, dim)).astype(np.float32), rng.integers(0, 6, nq), rng.choice([1, 2, 3, 6], nq),
            rng.integers(-2, 3, (ng, dim)).astype(np.float32), rng.integers(-1, 6, ng), rng.integers(1, 7, ng))


def as_data(arrays) -> dict:
    return dict(zip(("qf", "q_pids", "q_camids", "gf", "g_pids", "g_camids"), arrays))


# --------------------------------------------------------------------------------------- reference


def reference_lists(arrays, protocol, k: int, trial: int = 0, with_junk: bool = False) -> dict:
    """{query: expected record} for the queries of the trial, brute force (see the module docstring)."""
    qf, q_pid, q_cam, gf, g_pid, g_cam = arrays
    ext_f, ext_pid, ext_cam, n_stored = extend_gallery(qf, q_pid, q_cam, gf, g_pid, g_cam, protocol)
    dist = distance_matrix(qf, ext_f, "sqeuclidean")
    galleries = trial_galleries(ext_pid, ext_cam, protocol)
    gallery, queries = galleries[trial], trial_queries(q_cam, galleries, protocol, n_stored)[trial]
    out = {}
    for i in sorted(queries):
        pid = int(q_pid[i])

        def key(g):
            return (float(dist[i, g]), g)

        def entry(g, **extra):
            return {"gallery": g, "pid": int(ext_pid[g]), "camid": int(ext_cam[g]), "path": None,
                    "distance": float(dist[i, g]), **extra}

        order = sorted(range(dist.shape[1]), key=key)
        kept = [g for g in order if is_kept(g, gallery, i, pid, int(q_cam[i]), ext_pid, ext_cam, protocol, n_stored)]
        top = [entry(g, mark="positive" if ext_pid[g] == pid else "negative", rank=r)
               for r, g in enumerate(kept[:k], 1)]
        if with_junk:
            last = key(kept[k - 1]) if len(kept) >= k else (math.inf, math.inf)
            junk = [g for g in order if g in gallery and g not in kept and key(g) < last][:k]
            top = sorted(top + [entry(g, mark="junk", rank=None) for g in junk], key=lambda e: key(e["gallery"]))
        positives = [entry(g, rank=r) for r, g in enumerate(kept, 1) if ext_pid[g] == pid]
        ranks = [p["rank"] for p in positives]
        out[i] = {"query": i, "trial": trial, "pid": pid, "camid": int(q_cam[i]), "path": None,
                  "n_positives": len(ranks), "ap": ap_rectangle(ranks) if ranks else None,
                  "ap_trapezoid": ap_trapezoid(ranks) if ranks else None, "inp": inp(ranks) if ranks else None,
                  "first_hit_rank": ranks[0] if ranks else None,
                  "rho": identity_dedup_rho(kept, pid, ext_pid) if ranks and protocol.cmc == "identity-dedup" else None,
                  "top": top, "positives": positives}
    return out


FLOATS = ("ap", "ap_trapezoid", "inp")


def assert_record(got: dict, want: dict, where: str) -> None:
    """Equal records (AP, trapezoid AP and INP to 1e-12); ``positives`` only if the engine lists them."""
    want = {name: value for name, value in want.items() if name != "positives" or "positives" in got}
    assert set(got) == set(want), where
    for name in FLOATS:
        expected = None if want[name] is None else pytest.approx(float(want[name]), rel=TOL, abs=TOL)
        assert got[name] == expected, (where, name, got[name], want[name])
    assert {n: got[n] for n in want if n not in FLOATS} == {n: want[n] for n in want if n not in FLOATS}, where


# ------------------------------------------------------------------------- engine against reference


@pytest.mark.parametrize("case", sorted(CASES))
def test_ranked_lists_equal_a_brute_force_top_k_for_every_chunking(case):
    spec, overrides, trial = CASES[case]
    protocol = resolve(spec, **overrides)
    for seed, k in enumerate((1, 4, 50)):  # 50: longer than every kept list (padding)
        arrays = problem(seed)
        with_junk = seed != 1
        want = reference_lists(arrays, protocol, k, trial, with_junk)
        for chunking in CHUNKINGS:
            result = streameval.evaluate(as_data(arrays), protocol=protocol, ranked_list=k, trial=trial,
                                         with_junk=with_junk, with_positives=seed != 2, **OPTIONS, **chunking)
            records = list(result.ranked_lists)
            where = f"{case} seed {seed} k {k} {chunking}"
            assert [r["query"] for r in records] == sorted(want), where
            for record in records:
                assert_record(record, want[record["query"]], f"{where} query {record['query']}")


def near_tie_problem():
    """Real-valued features: every gallery row three times (itself, an exact copy, and a copy one
    float32 step away in every coordinate, which a float32 GEMM's rounding can put on either side),
    queries near them."""
    rng = np.random.default_rng(12)
    base = rng.standard_normal((10, 64)).astype(np.float32)
    gf = np.concatenate([base, np.nextafter(base, np.float32(np.inf)), base])[rng.permutation(30)]
    qf = (base[:6] + 0.05 * rng.standard_normal((6, 64))).astype(np.float32)
    return qf, rng.integers(0, 3, 6), np.zeros(6, dtype=np.int64), gf, rng.integers(-1, 3, 30), rng.integers(0, 2, 30)


def assert_near(result, want: dict, where) -> None:
    """The lists of ``want`` (reference_lists), distances to 1e-12 (the brute force sums the dot
    products in another order)."""
    for record in result.ranked_lists:
        expected = want[record["query"]]["top"]
        assert [(e["gallery"], e["mark"], e["rank"]) for e in record["top"]] == [
            (e["gallery"], e["mark"], e["rank"]) for e in expected], where
        assert [e["distance"] for e in record["top"]] == pytest.approx([e["distance"] for e in expected], rel=TOL)


def test_near_ties_are_ranked_exactly_whatever_the_gemm_precision():
    """The lists of ``near_tie_problem`` are the brute force's for float32 and float64 GEMMs and
    every chunking."""
    arrays = near_tie_problem()
    for k, precision, chunking in itertools.product((2, 4, 5), ("float32", "float64"), CHUNKINGS):
        want = reference_lists(arrays, resolve("market"), k, with_junk=True)
        result = streameval.evaluate(as_data(arrays), ranked_list=k, with_junk=True, precision=precision, **OPTIONS,
                                     **chunking)
        assert_near(result, want, (k, precision, chunking))


def test_lists_stay_exact_when_fast_distances_err_by_almost_their_whole_window(monkeypatch):
    """The GEMM only accelerates: with every fast distance pushed up or down by 0.9 of its error
    window (further than a real GEMM errs), the near-tie problem above still gets the brute force's lists."""
    arrays = near_tie_problem()
    fill, bound, signs = graph.fill_distances, kernels.dot_error_bound(64, "float32"), np.random.default_rng(3)

    def adversarial(dots, qa, ga, metric, out):
        fill(dots, qa, ga, metric, out)
        for (i, j), sign in zip(np.ndindex(out.shape), signs.choice([-0.9, 0.9], out.size)):
            out[i, j] += sign * kernels.distance_window(out[i, j], math.sqrt(qa[i]), math.sqrt(ga[j]), metric, bound)

    monkeypatch.setattr(graph, "fill_distances", adversarial)
    for k in (2, 4, 5):
        want = reference_lists(arrays, resolve("market"), k, with_junk=True)
        for chunking in (dict(workers=1), dict(query_block=3, gallery_chunk=5, workers=1)):
            result = streameval.evaluate(as_data(arrays), ranked_list=k, with_junk=True, **OPTIONS, **chunking)
            assert_near(result, want, (k, chunking))


def test_equal_distances_are_listed_by_gallery_index_across_chunks_and_merges():
    """Every gallery row at the same distance: the top-k are the first k kept rows by index (every
    fourth row is junk), also when interleaved chunks are counted in separate chains and merged."""
    arrays = (np.zeros((2, 2), dtype=np.float32), np.array([1, 2]), np.array([1, 2]),
              np.ones((23, 2), dtype=np.float32), np.arange(23) % 4 - 1, np.full(23, 3))
    for chunking in CHUNKINGS:
        result = streameval.evaluate(as_data(arrays), ranked_list=7, **OPTIONS, **chunking)
        for record in result.ranked_lists:
            assert record["top"] == reference_lists(arrays, resolve("market"), 7)[record["query"]]["top"]
            assert [e["gallery"] for e in record["top"]] == [1, 2, 3, 5, 6, 7, 9]


def test_a_query_without_positives_is_listed_by_id_only_and_outside_its_trial_has_no_list():
    arrays = problem(4)
    q_pid = arrays[1].copy()
    q_pid[0] = 99  # no gallery row of pid 99
    arrays = (arrays[0], q_pid, *arrays[2:])
    result = streameval.evaluate(as_data(arrays), ranked_list=3, queries="ids:0,2", **OPTIONS)
    open_query, other = result.ranked_lists
    want = reference_lists(arrays, resolve("market"), 3)
    assert_record(open_query, want[0], "open-set query")
    assert open_query["n_positives"] == 0 and open_query["first_hit_rank"] is None and open_query["top"]
    assert other["query"] == 2
    for sort_by in ("ap", "inp", "rank"):
        worst = streameval.evaluate(as_data(arrays), ranked_list=3, queries="worst:100", sort_by=sort_by, **OPTIONS)
        assert 0 not in [r["query"] for r in worst.ranked_lists]
        assert 0 not in worst.ranked_lists.worst + worst.ranked_lists.best


# ------------------------------------------------------------------------------------ vector V9

# docs/protocols.md#v1-two-queries-eight-gallery-rows: two queries, eight gallery rows (pid, camera, distances)
V1_PID = [1, 3, 3, 4, 1, 2, 3, 1]
V1_CAM = [1, 2, 1, 2, 2, 1, 2, 2]
V1_DIST = [[".10", ".20", ".30", ".40", ".50", ".60", ".65", ".70"],  # query A: pid 1, camera 1
           [".30", ".45", ".20", ".45", ".25", ".45", ".90", ".10"]]  # query B: pid 2, camera 2


def v1_arrays():
    """Query q's feature holds -20 d(q, g) at coordinate g and gallery row g is the unit vector e_g,
    so the sqeuclidean distance is |q|^2 + 1 + 40 d(q, g): V1's order and ties, in exact integers."""
    twenty = np.array([[int(20 * Fraction(d)) for d in row] for row in V1_DIST])
    return (-twenty.astype(np.float32), np.array([1, 2]), np.array([1, 2]), np.eye(8, dtype=np.float32),
            np.array(V1_PID), np.array(V1_CAM))


def v1_distance(query: int, value: str) -> float:
    """The distance of the V1 store realising V1's distance ``value`` for ``query``."""
    qf = v1_arrays()[0]
    return float((qf[query].astype(np.float64) ** 2).sum() + 1 + 40 * Fraction(value))


def listed(record) -> list:
    return [(e["gallery"], e["distance"], e["mark"], e["rank"]) for e in record["top"]]


def test_v9_market_top_3_with_junk_and_positives():
    """V9: A's top-3 g1 (.20, 1), g2 (.30, 2), g3 (.40, 3), all red; with junk g0 (.10, grey, no
    rank) first; A's positives g4 rank 4, g7 rank 7.  B's top-3 g7, g2, g4, all red; its positive g5
    is rank 7, after g1 and g3 at the same distance.  worst:2 lists B (AP 1/7) before A (15/56)."""
    data = as_data(v1_arrays())
    plain = streameval.evaluate(data, ranked_list=3, queries="worst:2", with_positives=True, **OPTIONS)
    b, a = plain.ranked_lists
    assert (b["query"], a["query"]) == (1, 0)
    assert a["ap"] == pytest.approx(15 / 56, rel=TOL) and b["ap"] == pytest.approx(1 / 7, rel=TOL)
    assert listed(a) == [(1, v1_distance(0, ".20"), "negative", 1), (2, v1_distance(0, ".30"), "negative", 2),
                         (3, v1_distance(0, ".40"), "negative", 3)]
    assert [(p["gallery"], p["rank"], p["distance"]) for p in a["positives"]] == [
        (4, 4, v1_distance(0, ".50")), (7, 7, v1_distance(0, ".70"))]
    assert listed(b) == [(7, v1_distance(1, ".10"), "negative", 1), (2, v1_distance(1, ".20"), "negative", 2),
                         (4, v1_distance(1, ".25"), "negative", 3)]
    assert [(p["gallery"], p["rank"]) for p in b["positives"]] == [(5, 7)]
    assert plain.to_dict()["ranked_list"] == {"k": 3, "trial": 0, "with_junk": False, "with_positives": True,
                                              "queries": "worst:2", "sort_by": "ap", "path": None, "worst": [1, 0],
                                              "best": [0, 1]}
    junk = streameval.evaluate(data, ranked_list=3, with_junk=True, **OPTIONS)
    a, b = junk.ranked_lists
    assert listed(a)[0] == (0, v1_distance(0, ".10"), "junk", None)
    assert listed(a)[1:] == listed(plain.ranked_lists.record(1))
    assert listed(b) == listed(plain.ranked_lists.record(0))  # B drops nothing (g5 is camera 1)
    long = streameval.evaluate(data, ranked_list=8, queries="ids:1", **OPTIONS)
    (b,) = long.ranked_lists
    assert [(e["gallery"], e["rank"]) for e in b["top"][4:]] == [(1, 5), (3, 6), (5, 7), (6, 8)]
    assert b["top"][6]["mark"] == "positive" and b["top"][4]["distance"] == b["top"][6]["distance"]


def test_v9_from_a_distance_store_holding_v1(tmp_path):
    """The same vector from V1's distances themselves (a distance store: no GEMM, no window)."""
    distances = np.array([[float(d) for d in row] for row in V1_DIST])
    store = streameval.write_distance_store(tmp_path / "v1.zarr", distances, [1, 2], [1, 2], V1_PID, V1_CAM)
    result = streameval.evaluate(store, ranked_list=3, with_junk=True, with_positives=True, queries="worst:2",
                                 no_gom=True)
    b, a = result.ranked_lists
    assert listed(a) == [(0, 0.10, "junk", None), (1, 0.20, "negative", 1), (2, 0.30, "negative", 2),
                         (3, 0.40, "negative", 3)]
    assert [(p["gallery"], p["rank"], p["distance"]) for p in a["positives"]] == [(4, 4, 0.50), (7, 7, 0.70)]
    assert listed(b) == [(7, 0.10, "negative", 1), (2, 0.20, "negative", 2), (4, 0.25, "negative", 3)]
    assert [(p["gallery"], p["rank"], p["distance"]) for p in b["positives"]] == [(5, 7, 0.45)]


# --------------------------------------------------------------------------------- worst and best


def test_worst_and_best_follow_ap_inp_or_rank_with_ties_by_query_index():
    qf, q_pid, q_cam, gf, g_pid, g_cam = problem(5, nq=8)
    arrays = (np.concatenate([qf, qf]), np.concatenate([q_pid, q_pid]), np.concatenate([q_cam, q_cam]),
              gf, g_pid, g_cam)  # every query twice: equal values, ordered by query index
    want = reference_lists(arrays, resolve("market"), 2)
    valid = [i for i, r in want.items() if r["n_positives"]]
    keys = {"ap": lambda i: want[i]["ap"], "inp": lambda i: want[i]["inp"],
            "rank": lambda i: -want[i]["first_hit_rank"]}
    for sort_by, key in keys.items():
        worst = sorted(valid, key=lambda i: (key(i), i))
        best = sorted(valid, key=lambda i: (-key(i), i))
        for kind, order in (("worst", worst), ("best", best)):
            result = streameval.evaluate(as_data(arrays), ranked_list=2, queries=f"{kind}:5", sort_by=sort_by,
                                         **OPTIONS)
            assert [r["query"] for r in result.ranked_lists] == order[:5], (sort_by, kind)
            assert (result.ranked_lists.worst, result.ranked_lists.best) == (worst[:10], best[:10]), sort_by


def test_bad_ranked_options_are_refused_before_any_work():
    data = as_data(problem(0))
    refused = [({"with_junk": True}, "--with-junk"), ({"ranked_list": 0}, "ranked_list"),
               ({"ranked_list": 3, "trial": 1}, "trial"), ({"ranked_list": 3, "queries": "worst:0"}, "queries"),
               ({"ranked_list": 3, "queries": "ids:1,1"}, "twice"), ({"ranked_list": 3, "sort_by": "x"}, "sort_by"),
               ({"ranked_list": 3, "queries": "ids:500"}, "query row 500")]
    for options, named in refused:
        with pytest.raises(streameval.OptionError, match=named):
            streameval.evaluate(data, **options, **OPTIONS)
    with pytest.raises(streameval.OptionError, match="one direction"):
        streameval.evaluate(data, protocol="regdb", ranked_list=3, **OPTIONS)


# ---------------------------------------------------------------------------------------- update


def rows(rng, n, pids):
    return rng.integers(-2, 3, (n, 3)).astype(np.float32), np.asarray(pids), rng.integers(0, 3, n)


def test_update_after_appends_equals_a_full_evaluation(tmp_path):
    rng = np.random.default_rng(8)
    store, state = tmp_path / "s.zarr", tmp_path / "state"
    query = rows(rng, 6, rng.integers(1, 6, 6))
    streameval.write_store(store, *query, *rows(rng, 25, rng.integers(-1, 6, 25)), chunk_rows=4)
    options = dict(ranked_list=3, with_junk=True, **OPTIONS)
    streameval.evaluate(store, state=state, **options)
    batches = [rows(rng, 7, rng.integers(-1, 1, 7)),  # distractors and junk only: no query is re-scored
               (query[0][:3], query[1][:3], (query[2][:3] + 1) % 3),  # copies of queries: distance 0, positives
               rows(rng, 9, rng.choice(query[1], 9))]  # new positives of several queries
    for batch in batches:
        streameval.append_gallery(store, *batch)
        updated = streameval.update(store, state, with_positives=True, queries="all")
        full = streameval.evaluate(store, with_positives=True, **options)
        assert list(updated.ranked_lists) == list(full.ranked_lists)
        assert updated.to_dict()["ranked_list"] == full.to_dict()["ranked_list"]
    opened = streameval.open_store(store)
    arrays = (opened.query.features[:], opened.query.pids[:], opened.query.camids[:], opened.gallery.features[:],
              opened.gallery.pids[:], opened.gallery.camids[:])
    want = reference_lists(arrays, resolve("market"), 3, with_junk=True)
    for record in updated.ranked_lists:
        assert_record(record, want[record["query"]], f"query {record['query']}")
    with pytest.raises(StateError, match="ranked"):
        streameval.update(store, state, ranked_list=4)


def test_a_state_without_ranked_lists_refuses_them_and_damaged_lists_are_refused(tmp_path):
    rng = np.random.default_rng(9)
    store = tmp_path / "s.zarr"
    streameval.write_store(store, *rows(rng, 4, [1, 2, 3, 4]), *rows(rng, 12, rng.integers(0, 5, 12)))
    plain = streameval.evaluate(store, state=tmp_path / "plain", **OPTIONS)
    assert plain.ranked_lists is None and "ranked_list" not in plain.to_dict()  # nothing of it without ranked_list
    version = (tmp_path / "plain" / "CURRENT").read_text().strip()
    assert not (tmp_path / "plain" / version / "stats" / "topk").exists()
    with pytest.raises(StateError, match="ranked None"):
        streameval.update(store, tmp_path / "plain", ranked_list=3)
    streameval.evaluate(store, state=tmp_path / "ranked", ranked_list=3, **OPTIONS)
    version = (tmp_path / "ranked" / "CURRENT").read_text().strip()
    kept = zarr.open_array(tmp_path / "ranked" / version / "stats" / "topk" / "kept", mode="r+")
    kept[0] = kept[0][::-1]  # the first query's list reversed
    with pytest.raises(StateError, match=r"stats/topk/kept is not sorted"):
        streameval.update(store, tmp_path / "ranked")


# ---------------------------------------------------------------------------------- command line


def test_cli_writes_json_lines_next_to_the_json_and_a_zarr_group_on_request(tmp_path):
    arrays = problem(6)
    store = tmp_path / "s.zarr"
    streameval.write_store(store, *arrays)
    args = ["eval", store, "--metric", "sqeuclidean", "--no-gom", "--ranked-list", "4", "--with-junk",
            "--with-positives", "--queries", "worst:5", "-q"]
    cli(*args, "--json", tmp_path / "out.json")
    records = read_records(tmp_path / "out.ranked.jsonl")
    api = streameval.evaluate(store, ranked_list=4, with_junk=True, with_positives=True, queries="worst:5",
                              **OPTIONS)
    assert records == list(api.ranked_lists) and len(records) == 5
    section = json.loads((tmp_path / "out.json").read_text())["ranked_list"]
    assert section == {**api.ranked_lists.section(), "path": "out.ranked.jsonl"}
    want = reference_lists(arrays, resolve("market"), 4, with_junk=True)
    for record in records:
        assert_record(record, want[record["query"]], f"query {record['query']}")

    cli(*args, "--ranked-out", tmp_path / "lists.zarr")
    assert read_records(tmp_path / "lists.zarr") == records
    assert zarr.open_group(tmp_path / "lists.zarr", mode="r")["top/gallery"].shape[0] == 5

    (tmp_path / "again.ranked.jsonl").write_text("somebody's file\n")
    refused = [
        (["--json", tmp_path / "again.json"], "exists"),  # the default lists file is somebody's
        (["--ranked-out", tmp_path / "lists.zarr"], "exists"),
        (["--queries", "ids:1000", "--ranked-out", tmp_path / "new.jsonl"], "query row 1000"),
        (["--queries", "some", "--ranked-out", tmp_path / "new.jsonl"], "worst:N"),
        ([], "--ranked-out"),  # nowhere to write them
    ]
    for extra, message in refused:
        result = cli(*args, *extra, code=2)
        assert message in one_error_line(result)
    assert not os.path.exists(tmp_path / "again.json") and not os.path.exists(tmp_path / "new.jsonl")
    assert (tmp_path / "again.ranked.jsonl").read_text() == "somebody's file\n"
    result = cli("eval", store, "--with-junk", "-q", code=2)
    assert "--with-junk only go with --ranked-list" in one_error_line(result)


def test_records_carry_the_stores_image_paths_also_for_query_copies(tmp_path):
    arrays = problem(7)
    store, n_stored = tmp_path / "s.zarr", len(arrays[3])
    streameval.write_store(store, *arrays)
    write_paths(store, "query", [f"q/{i}.jpg" for i in range(len(arrays[0]))])
    write_paths(store, "gallery", [f"g/{g}.jpg" for g in range(n_stored)])
    result = streameval.evaluate(store, protocol="mars", ranked_list=4, with_positives=True, **OPTIONS)
    for record in result.ranked_lists:
        assert record["path"] == f"q/{record['query']}.jpg"
        for entry in record["top"] + record["positives"]:
            row = entry["gallery"]
            assert entry["path"] == (f"g/{row}.jpg" if row < n_stored else f"q/{row - n_stored}.jpg")
    assert any(e["gallery"] >= n_stored for r in result.ranked_lists for e in r["top"])  # copies are listed
    result.ranked_lists.write(tmp_path / "lists.zarr")
    assert read_records(tmp_path / "lists.zarr") == list(result.ranked_lists)
    with pytest.raises(streameval.OptionError, match="exists"):
        result.ranked_lists.write(tmp_path / "lists.zarr")
    result.ranked_lists.write(tmp_path / "names.csv")  # the plain CSV of file names (docs/ranked-lists.md#one-record-per-query-json-lines)
    with open(tmp_path / "names.csv", newline="") as fh:
        lines = list(csv.DictReader(fh))
    items = [(record, position, item) for record in result.ranked_lists
             for position, item in enumerate(record["top"], 1)]
    assert len(lines) == len(items)
    for line, (record, position, item) in zip(lines, items):
        assert line["query_path"] == record["path"] and line["gallery_path"] == item["path"]
        assert (int(line["query"]), int(line["position"]), line["mark"]) == (record["query"], position, item["mark"])
        assert float(line["distance"]) == item["distance"] and line["rank"] == str(item["rank"] or "")
