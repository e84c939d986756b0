"""Distance stores (a query x gallery distance or similarity matrix instead of features): the
engine's numbers on them equal the brute-force protocol reference on the same matrix and the
feature store the matrix was computed from, for every preset and flavour and several chunkings;
what a distance store cannot answer is refused in one line."""

from __future__ import annotations

import os

import numpy as np
import pytest
from click.testing import CliRunner

import streameval
from streameval.cli import main
from streameval.core.errors import OptionError, StoreError
from streameval.protocols import resolve
from streameval.store import open_store, write_store
from streameval import write_distance_store

from protocol_reference import extend_gallery, reference_protocol
from reference import distance_matrix
from test_protocols_vs_reference import CASES, assert_entry, engine_options, problem

CHUNKINGS = [dict(), dict(query_block=5, gallery_chunk=8)]


def write_pair(tmp_path, seed: int, chunk_rows: int = 8):
    """A feature store and the distance store of its sqeuclidean distances (queries x queries too)."""
    qf, q_pid, q_cam, gf, g_pid, g_cam = problem(seed)
    features = write_store(tmp_path / f"f{seed}.zarr", qf, q_pid, q_cam, gf, g_pid, g_cam, chunk_rows=chunk_rows)
    distances = write_distance_store(tmp_path / f"d{seed}.zarr", distance_matrix(qf, gf, "sqeuclidean"), q_pid,
                                     q_cam, g_pid, g_cam, query_distances=distance_matrix(qf, qf, "sqeuclidean"),
                                     chunk_rows=chunk_rows)
    return features, distances


def comparable(result) -> dict:
    """A result's numbers (not how they were computed)."""
    return {k: v for k, v in result.to_dict().items() if k not in ("run", "metric", "options")}


@pytest.mark.parametrize("case", sorted(CASES))
def test_distance_store_equals_reference_and_its_feature_store(case, tmp_path):
    spec, overrides, gom = CASES[case]
    protocol = resolve(spec, **overrides)
    for seed in range(2):
        features, distances = write_pair(tmp_path, seed)
        qf, q_pid, q_cam, gf, g_pid, g_cam = problem(seed)
        ext_f, ext_pid, ext_cam, n_stored = extend_gallery(qf, q_pid, q_cam, gf, g_pid, g_cam, protocol)
        ref = reference_protocol(distance_matrix(qf, ext_f, "sqeuclidean"), q_pid, q_cam, ext_pid, ext_cam, protocol,
                                 max_rank=8, gom=gom, n_stored=n_stored)
        from_features = comparable(streameval.evaluate(features, metric="sqeuclidean", protocol=protocol, max_rank=8,
                                                       progress=False, **engine_options(gom)))
        for chunking in CHUNKINGS:
            got = comparable(streameval.evaluate(distances, protocol=protocol, max_rank=8, progress=False,
                                                 **engine_options(gom), **chunking))
            assert got == from_features, f"{case} seed {seed} {chunking}"
            first = got if ref["T"] == 1 else got["trials"]["per_trial"][0]
            assert_entry(first, ref["per_trial"][0], f"{case} seed {seed} {chunking}")


def test_ties_in_a_matrix_break_by_gallery_index_and_similarity_reverses_the_order(tmp_path):
    """An arbitrary matrix of few distinct values (no features behind it): every tie is decided by
    the gallery index; a similarity store of -D gives exactly D's numbers."""
    rng = np.random.default_rng(4)
    nq, ng = 9, 40
    dist = rng.integers(0, 4, (nq, ng)).astype(np.float32)
    q_pid, q_cam = rng.integers(0, 5, nq), rng.integers(0, 3, nq)
    g_pid, g_cam = rng.integers(-1, 5, ng), rng.integers(0, 3, ng)
    protocol = resolve("market")
    ref = reference_protocol(dist, q_pid, q_cam, g_pid, g_cam, protocol, max_rank=8,
                             gom=dict(norm="minmax", bins=20, b=7, vp="reference"))
    kinds = {}
    for kind, values in (("distance", dist), ("similarity", -dist)):
        store = write_distance_store(tmp_path / f"{kind}.zarr", values, q_pid, q_cam, g_pid, g_cam, kind=kind,
                                     chunk_rows=7)
        result = streameval.evaluate(store, max_rank=8, gom_bins=20, gom_b=7, progress=False)
        assert result.metric == kind
        assert_entry(result.to_dict(), ref["per_trial"][0], kind)
        kinds[kind] = comparable(result)
    assert kinds["distance"] == kinds["similarity"]


def test_what_a_distance_store_cannot_answer_is_refused(tmp_path):
    qf, q_pid, q_cam, gf, g_pid, g_cam = problem(1)
    without_qq = write_distance_store(tmp_path / "d.zarr", distance_matrix(qf, gf, "euclidean"), q_pid, q_cam, g_pid,
                                      g_cam)
    with pytest.raises(OptionError, match="--metric cosine does not apply"):
        streameval.evaluate(without_qq, metric="cosine")
    with pytest.raises(OptionError, match="no query x query distances"):
        streameval.evaluate(without_qq, protocol="mars")
    with pytest.raises(OptionError, match="t2v"):
        streameval.evaluate(without_qq, protocol="regdb")
    with pytest.raises(OptionError, match="keeps no state"):
        streameval.evaluate(without_qq, state=tmp_path / "state")
    assert not (tmp_path / "state").exists()
    bad = distance_matrix(qf, gf, "euclidean")
    bad[2, 5] = np.nan
    with pytest.raises(StoreError, match="non-finite value at query 2, gallery row 5"):
        write_distance_store(tmp_path / "nan.zarr", bad, q_pid, q_cam, g_pid, g_cam)
    assert not (tmp_path / "nan.zarr").exists()
    with pytest.raises(StoreError, match=r"must have shape \(%d, %d\)" % (len(q_pid), len(g_pid))):
        write_distance_store(tmp_path / "t.zarr", bad.T, q_pid, q_cam, g_pid, g_cam)


def test_cli_evaluates_a_distance_store_and_refuses_a_damaged_one_in_one_line(tmp_path):
    features, distances = write_pair(tmp_path, 2, chunk_rows=8)
    runner = CliRunner()
    out = runner.invoke(main, ["eval", distances.path, "--json", str(tmp_path / "d.json"), "--quiet", "--no-gom"])
    assert out.exit_code == 0, out.output
    want = runner.invoke(main, ["eval", features.path, "--metric", "sqeuclidean", "--json", str(tmp_path / "f.json"),
                                "--quiet", "--no-gom"])
    assert want.exit_code == 0, want.output
    import json

    got, ref = (json.loads((tmp_path / name).read_text()) for name in ("d.json", "f.json"))
    assert got["cmc"] == ref["cmc"] and got["mAP"] == ref["mAP"] and got["mINP"] == ref["mINP"]
    assert got["metric"] == "distance"
    np.savez(tmp_path / "x.npz", gf=np.ones((2, 3), np.float32), g_pids=np.array([1, 2]), g_camids=np.array([1, 1]))
    append = runner.invoke(main, ["append", distances.path, str(tmp_path / "x.npz")])
    assert append.exit_code == 3 and append.output.count("error:") == 1 and "do not grow" in append.output
    assert runner.invoke(main, ["validate", distances.path]).exit_code == 0
    chunk = next(p for p in sorted((tmp_path / "d2.zarr" / "gallery" / "distances").rglob("*")) if p.is_file()
                 and p.name != "zarr.json")
    os.remove(chunk)
    damaged = runner.invoke(main, ["eval", distances.path, "--quiet", "--no-gom"])
    assert damaged.exit_code == 3 and damaged.output.strip().startswith("error:")
    assert "distances missing or not finite" in damaged.output and len(damaged.output.strip().splitlines()) == 1
    assert open_store(distances.path).holds_distances


def k_reciprocal_rerank(qf, gf, k1: int = 4, k2: int = 2, lam: float = 0.3) -> np.ndarray:
    """Dense k-reciprocal re-ranking (docs/distances.md) on a small problem: the kind of matrix a
    user brings."""
    feats = np.concatenate([qf, gf]).astype(np.float64)
    dist = ((feats[:, None, :] - feats[None, :, :]) ** 2).sum(-1)
    dist_hat = dist / dist.max(axis=1, keepdims=True)
    order = np.argsort(dist, axis=1, kind="stable")

    def reciprocal(i, k):
        return {j for j in order[i, :k + 1] if i in order[j, :k + 1]}

    n = feats.shape[0]
    weights = np.zeros((n, n))
    half = int(np.floor((k1 + 1) / 2 + 0.5))
    for i in range(n):
        expanded = reciprocal(i, k1)
        for c in list(expanded):
            candidate = reciprocal(c, half)
            if len(candidate & reciprocal(i, k1)) > 2 / 3 * len(candidate):
                expanded |= candidate
        members = sorted(expanded)
        weights[i, members] = np.exp(-dist_hat[i, members]) / np.exp(-dist_hat[i, members]).sum()
    if k2 > 1:
        weights = np.stack([weights[order[i, :k2]].mean(axis=0) for i in range(n)])
    nq = qf.shape[0]
    shared = np.minimum(weights[:nq, None, :], weights[None, nq:, :]).sum(-1)
    jaccard = 1 - shared / (2 - shared)
    return (1 - lam) * jaccard + lam * dist_hat[:nq, nq:]


def test_a_reranked_matrix_saved_with_numpy_is_evaluated_end_to_end_from_the_cli(tmp_path):
    """features -> re-ranked matrix (.npy) -> `convert --distances --ids-from` -> `eval`: the numbers
    of the brute-force reference on that matrix."""
    features, _ = write_pair(tmp_path, 3)
    qf, q_pid, q_cam, gf, g_pid, g_cam = problem(3)
    reranked = k_reciprocal_rerank(qf, gf)
    np.save(tmp_path / "reranked.npy", reranked)
    runner = CliRunner()
    converted = runner.invoke(main, ["convert", str(tmp_path / "reranked.npy"), str(tmp_path / "rr.zarr"),
                                     "--distances", "--ids-from", features.path])
    assert converted.exit_code == 0, converted.output
    evaluated = runner.invoke(main, ["eval", str(tmp_path / "rr.zarr"), "--json", str(tmp_path / "rr.json"),
                                     "--max-rank", "8", "--gom-bins", "20", "--gom-b", "7", "--quiet"])
    assert evaluated.exit_code == 0, evaluated.output
    import json

    got = json.loads((tmp_path / "rr.json").read_text())
    ref = reference_protocol(reranked, q_pid, q_cam, g_pid, g_cam, resolve("market"), max_rank=8,
                             gom=dict(norm="minmax", bins=20, b=7, vp="reference"))
    assert_entry(got, ref["per_trial"][0], "re-ranked")
    plain = streameval.evaluate(features, metric="sqeuclidean", max_rank=8, no_gom=True)
    assert got["cmc"] != plain.to_dict()["cmc"] or got["mAP"] != plain.mAP  # re-ranking changed the ranking


def test_an_in_memory_matrix_evaluates_as_its_converted_store_and_the_reference(tmp_path):
    from reference import reference_evaluate

    qf, q_pid, q_cam, gf, g_pid, g_cam = problem(2)
    ids = dict(q_pids=q_pid, q_camids=q_cam, g_pids=g_pid, g_camids=g_cam)
    dist = distance_matrix(qf, gf, "sqeuclidean")
    write_store(tmp_path / "feats.zarr", qf, q_pid, q_cam, gf, g_pid, g_cam, chunk_rows=8)
    np.save(tmp_path / "M.npy", dist)
    converted = CliRunner().invoke(main, ["convert", str(tmp_path / "M.npy"), str(tmp_path / "M.zarr"), "--distances",
                                          "--ids-from", str(tmp_path / "feats.zarr")])
    assert converted.exit_code == 0, converted.output
    options = dict(max_rank=8, progress=False)
    from_store = streameval.evaluate(tmp_path / "M.zarr", **options)
    in_memory = streameval.evaluate(dict(distances=dist, **ids), **options)
    assert comparable(in_memory) == comparable(from_store) and in_memory.metric == "distance"
    assert in_memory.to_dict(per_query=True)["per_query"] == from_store.to_dict(per_query=True)["per_query"]
    similar = streameval.evaluate(dict(similarity=-dist, **ids), **options)
    assert comparable(similar) == comparable(in_memory) and similar.metric == "similarity"

    ref = reference_evaluate(qf, q_pid, q_cam, gf, g_pid, g_cam, metric="sqeuclidean", protocol="market", max_rank=8)
    assert in_memory.n_valid_queries == ref["n_valid_queries"]
    assert np.array_equal(in_memory.cmc, ref["cmc"])
    for name in ("mAP", "mAP_trapezoid", "mINP"):
        assert getattr(in_memory, name) == pytest.approx(ref[name], rel=1e-12, abs=0)
    for name, values in ref["per_query"].items():
        np.testing.assert_allclose(in_memory.per_query[name], values, rtol=1e-12, atol=0, err_msg=name)

    with pytest.raises(OptionError, match="give one query x gallery matrix"):
        streameval.evaluate(dict(distances=dist, similarity=-dist, **ids))
    with pytest.raises(OptionError, match="give one query x gallery matrix"):
        streameval.evaluate(dict(distances=dist, qf=qf, gf=gf, **ids))
