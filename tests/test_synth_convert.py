"""``synth.synthesize`` (synthetic stores) and ``convert.convert_npz`` (.npz -> store)."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
import zarr

from streameval import OptionError, StoreError, evaluate, open_store, validate_values
from streameval.tools.convert import convert_npz
from streameval.engine.plan import default_chunk_rows
from streameval.tools import synth as synth_mod
from streameval.tools.synth import NOISE_HARD, generation_block_rows, synthesize

SMALL = dict(n_query=150, n_gallery=2500, dim=24, n_ids=30, n_cams=4)


def arrays(store) -> dict:
    return {f"{s}/{f}": getattr(getattr(store, s), f)[:] for s in ("query", "gallery") for f in ("features", "pids", "camids")}


def assert_same_arrays(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


# ------------------------------------------------------------------------------------------- synth


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A store with junk, distractors and open-set queries."""
    path = tmp_path_factory.mktemp("synth") / "mixed.zarr"
    return synthesize(path, **SMALL, seed=3, junk_frac=0.1, distractor_frac=0.2, open_query_frac=0.2)


def test_synth_shapes_and_dtypes(mixed):
    assert (len(mixed.query), len(mixed.gallery), mixed.dim) == (150, 2500, 24)
    assert mixed.default_metric == "euclidean"
    for fs in (mixed.query, mixed.gallery):
        assert fs.features.dtype == np.float32
        assert fs.pids.dtype == np.int64
        assert fs.camids.dtype == np.int64
        assert fs.chunk_rows == min(default_chunk_rows(24, 4), len(fs))
        camids = fs.camids[:]
        assert camids.min() >= 0 and camids.max() <= 3
        assert len(np.unique(camids)) == 4
    validate_values(mixed)


def test_synth_id_fractions(mixed):
    g = mixed.gallery.pids[:]
    assert abs((g == -1).mean() - 0.1) < 0.03
    assert abs((g == 0).mean() - 0.2) < 0.03
    identities = g[g > 0]
    assert identities.max() <= 30 and set(np.unique(identities)) == set(range(1, 31))
    q = mixed.query.pids[:]
    assert q.min() >= 1
    open_rows = q > 30
    assert 0.1 < open_rows.mean() < 0.3
    assert not np.isin(q[open_rows], g).any()


def test_synth_open_queries_have_no_gallery_match(mixed):
    q = mixed.query.pids[:]
    result = evaluate(mixed, protocol="none")
    open_rows = q > 30
    assert (result.per_query["n_positives"][open_rows] == 0).all()
    assert (result.per_query["n_positives"][~open_rows] > 0).all()  # every closed identity is in the gallery
    assert result.n_open_queries == int(open_rows.sum())
    assert np.isnan(result.per_query["ap"][open_rows]).all()


def test_synth_without_junk_or_open_queries(tmp_path):
    store = synthesize(tmp_path / "s.zarr", **SMALL)
    assert (store.gallery.pids[:] >= 1).all()
    assert (store.query.pids[:] <= 30).all()


def test_synth_is_deterministic(tmp_path, mixed):
    kwargs = dict(SMALL, seed=3, junk_frac=0.1, distractor_frac=0.2, open_query_frac=0.2)
    again = synthesize(tmp_path / "again.zarr", **kwargs)
    assert_same_arrays(arrays(mixed), arrays(again))
    other = synthesize(tmp_path / "other.zarr", **dict(kwargs, seed=4))
    assert not np.array_equal(other.gallery.features[:], mixed.gallery.features[:])
    assert not np.array_equal(other.query.pids[:], mixed.query.pids[:])


def test_synth_does_not_depend_on_chunk_rows_or_threads(tmp_path):
    """Chunks straddling generation blocks, slabs of several chunks on several threads sharing a
    block, a last slab short: the rows of one thread and default chunks."""
    kwargs = dict(n_query=300, n_gallery=1500, dim=1024, n_ids=20, n_cams=3, seed=9, junk_frac=0.2,
                  distractor_frac=0.1, open_query_frac=0.1)
    block = generation_block_rows(1024)
    assert 1500 > 4 * block  # several generation blocks, straddled by the chunks below
    reference = arrays(synthesize(tmp_path / "ref.zarr", **kwargs, workers=1))
    for chunk_rows, workers in ((97, 3), (block, 1), (block, 4), (block + 1, 2), (1000, 2)):
        store = synthesize(tmp_path / f"c{chunk_rows}-{workers}.zarr", **kwargs, chunk_rows=chunk_rows, workers=workers)
        assert store.gallery.chunk_rows == chunk_rows
        assert_same_arrays(reference, arrays(store))


def test_synth_threads_are_the_cores_or_what_a_quarter_of_the_memory_holds(monkeypatch):
    monkeypatch.setattr(synth_mod.plan, "physical_memory", lambda: 64 << 30)
    assert synth_mod.slab_threads(None, 1 << 20) == os.cpu_count()
    assert synth_mod.slab_threads(16, 1 << 30) == 16
    assert synth_mod.slab_threads(64, 1 << 30) == 16  # 16 GiB of slabs in 64 GiB
    assert synth_mod.slab_threads(8, 32 << 30) == 1  # never none
    monkeypatch.setattr(synth_mod.plan, "physical_memory", lambda: None)  # not said: the threads asked for
    assert synth_mod.slab_threads(64, 1 << 40) == 64


def test_synth_chunked_writing_fills_every_chunk(tmp_path):
    store = synthesize(tmp_path / "s.zarr", **SMALL, chunk_rows=96)
    assert store.gallery.chunk_rows == 96 and store.query.chunk_rows == 96
    assert store.gallery.features.nchunks == -(-2500 // 96)
    norms = np.linalg.norm(store.gallery.features[:], axis=1)
    assert (norms > 0).all()  # no row left at the fill value
    assert (store.gallery.pids[:] != 0).all()
    validate_values(store)


def test_synth_float16(tmp_path, mixed):
    kwargs = dict(SMALL, seed=3, junk_frac=0.1, distractor_frac=0.2, open_query_frac=0.2)
    half = synthesize(tmp_path / "half.zarr", **kwargs, dtype="float16", default_metric="cosine")
    assert half.gallery.features.dtype == np.float16 and half.query.features.dtype == np.float16
    assert half.default_metric == "cosine"
    assert half.gallery.chunk_rows == min(default_chunk_rows(24, 2), 2500)
    np.testing.assert_array_equal(half.gallery.features[:], mixed.gallery.features[:].astype(np.float16))
    np.testing.assert_array_equal(half.query.pids[:], mixed.query.pids[:])
    validate_values(half)


def test_synth_metrics_are_realistic(tmp_path):
    """Neither trivial nor hopeless: real ReID models score roughly this on Market-1501."""
    store = synthesize(tmp_path / "s.zarr", n_query=300, n_gallery=3000, dim=128, n_ids=100, n_cams=6, seed=1)
    result = evaluate(store)
    assert 0.5 < result.mAP < 0.95, result.mAP
    assert 0.7 < result.rank(1) < 1.0, result.rank(1)
    assert result.mINP < result.mAP < result.rank(1)


def test_synth_default_noise_writes_the_stores_of_before(mixed):
    """noise=1 (the default) is the model as it was before the argument existed: the digest of this
    store's arrays was taken with the code of that time."""
    digest = hashlib.sha256()
    for fs in (mixed.query, mixed.gallery):
        for field in (fs.features, fs.pids, fs.camids):
            digest.update(np.ascontiguousarray(field[:]).tobytes())
    assert digest.hexdigest() == "a0ee4ba7fcdcf31adf84f72c6b6c68c4be5350043dd4c3681548adc5f39cb7b7"


def last_positive_ranks(result) -> np.ndarray:
    """Each valid query's rank of its last positive: its positives over its INP."""
    q = result.per_query
    valid = q["n_positives"] > 0
    return q["n_positives"][valid] / q["inp"][valid]


def test_synth_noise_makes_a_weaker_model(tmp_path):
    """More noise: the same ids, other features, and positives ranked deeper; no noise: nearly perfect."""
    kwargs = dict(n_query=300, n_gallery=3000, dim=128, n_ids=100, n_cams=6, seed=1)
    stores = {noise: synthesize(tmp_path / f"n{noise}.zarr", **kwargs, noise=noise) for noise in (0.0, 1.0, NOISE_HARD)}
    results = {noise: evaluate(store, no_gom=True) for noise, store in stores.items()}
    for noise in (0.0, NOISE_HARD):
        np.testing.assert_array_equal(stores[noise].gallery.pids[:], stores[1.0].gallery.pids[:])
        np.testing.assert_array_equal(stores[noise].query.camids[:], stores[1.0].query.camids[:])
        assert not np.array_equal(stores[noise].gallery.features[:], stores[1.0].gallery.features[:])
    assert results[0.0].mAP > 0.99
    assert results[1.0].mAP - 0.1 > results[NOISE_HARD].mAP > 0.4
    assert results[1.0].mINP > 2 * results[NOISE_HARD].mINP
    assert np.median(last_positive_ranks(results[NOISE_HARD])) > 2 * np.median(last_positive_ranks(results[1.0]))


def test_synth_into_a_zarr_store_object():
    store = synthesize(zarr.storage.MemoryStore(), n_query=10, n_gallery=50, dim=4, n_ids=3, n_cams=2)
    assert len(store.gallery) == 50


def test_synth_progress(tmp_path, capsys):
    synthesize(tmp_path / "s.zarr", n_query=10, n_gallery=700, dim=8, n_ids=3, n_cams=2, chunk_rows=100, progress=True)
    err = capsys.readouterr().err
    assert "synth gallery: 700/700 rows (100%)" in err
    assert len(err.splitlines()) <= 10
    synthesize(tmp_path / "t.zarr", n_query=10, n_gallery=700, dim=8, n_ids=3, n_cams=2)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("kwargs, message", [
    (dict(junk_frac=0.7, distractor_frac=0.5), "junk_frac \\+ distractor_frac"),
    (dict(open_query_frac=1.5), "open_query_frac must be a number from 0 to 1, got 1.5"),
    (dict(n_ids=0), "n_ids must be a positive integer"),
    (dict(n_gallery=0), "n_gallery must be a positive integer"),
    (dict(dtype="float64"), "dtype must be float16 or float32"),
    (dict(dtype="nonsense"), "dtype must be float16 or float32"),
    (dict(chunk_rows=0), "chunk_rows must be a positive integer"),
    (dict(noise=-0.5), "noise must be a finite number >= 0"),
    (dict(noise=float("inf")), "noise must be a finite number >= 0"),
    (dict(noise="hard"), "noise must be a finite number >= 0"),
])
def test_synth_rejects_bad_arguments(tmp_path, kwargs, message):
    with pytest.raises(OptionError, match=message):
        synthesize(tmp_path / "s.zarr", **{**SMALL, **kwargs})
    assert not (tmp_path / "s.zarr").exists()


def test_synth_refuses_to_overwrite(tmp_path):
    path = tmp_path / "s.zarr"
    synthesize(path, n_query=10, n_gallery=50, dim=4, n_ids=3, n_cams=2)
    with pytest.raises(StoreError, match="already exists"):
        synthesize(path, n_query=20, n_gallery=60, dim=4, n_ids=3, n_cams=2)
    assert len(open_store(path).gallery) == 50
    assert len(synthesize(path, n_query=20, n_gallery=60, dim=4, n_ids=3, n_cams=2, overwrite=True).gallery) == 60
    assert len(open_store(path).gallery) == 60


# ----------------------------------------------------------------------------------------- convert


def make_arrays(n_query=40, n_gallery=300, dim=12, n_ids=8, seed=0) -> dict:
    """Long-named float64 arrays (what a PyTorch pipeline typically saves)."""
    rng = np.random.default_rng(seed)
    centres = 2 * rng.standard_normal((n_ids + 1, dim))
    qp = rng.integers(1, n_ids + 1, n_query)
    gp = rng.integers(-1, n_ids + 1, n_gallery)
    return {
        "query_features": centres[qp] + rng.standard_normal((n_query, dim)),
        "query_pids": qp,
        "query_camids": rng.integers(0, 4, n_query),
        "gallery_features": centres[np.maximum(gp, 0)] + rng.standard_normal((n_gallery, dim)),
        "gallery_pids": gp,
        "gallery_camids": rng.integers(0, 4, n_gallery),
    }


SHORT = {"query_features": "qf", "query_pids": "q_pids", "query_camids": "q_camids",
         "gallery_features": "gf", "gallery_pids": "g_pids", "gallery_camids": "g_camids"}


def result_values(result) -> dict:
    d = result.to_dict()
    return {k: d[k] for k in ("n_queries", "n_valid_queries", "n_open_queries", "n_gallery", "cmc", "mAP", "mAP_trapezoid", "mINP")}


def test_convert_long_names(tmp_path):
    data = make_arrays()
    np.savez(tmp_path / "in.npz", **data)
    store = convert_npz(tmp_path / "in.npz", tmp_path / "out.zarr", chunk_rows=64)
    assert store.gallery.features.dtype == np.float32  # float64 input stored as float32
    assert store.gallery.chunk_rows == 64 and store.query.chunk_rows == 40
    for s in ("query", "gallery"):
        fs = getattr(store, s)
        np.testing.assert_array_equal(fs.features[:], data[f"{s}_features"].astype(np.float32))
        np.testing.assert_array_equal(fs.pids[:], data[f"{s}_pids"])
        np.testing.assert_array_equal(fs.camids[:], data[f"{s}_camids"])
    as32 = {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in data.items()}
    assert result_values(evaluate(store)) == result_values(evaluate(as32))


def test_convert_short_names_compressed_float16(tmp_path):
    data = make_arrays(seed=1)
    short = {SHORT[k]: v for k, v in data.items()}
    short["qf"] = short["qf"].astype(np.float16)
    short["gf"] = np.asfortranarray(short["gf"].astype(np.float16))  # Fortran order: read whole
    short["q_pids"] = short["q_pids"].astype(np.int32)
    short["g_camids"] = short["g_camids"].astype(np.uint8)
    np.savez_compressed(tmp_path / "in.npz", **short)
    store = convert_npz(tmp_path / "in.npz", tmp_path / "out.zarr", chunk_rows=7, default_metric="cosine")
    assert store.gallery.features.dtype == np.float16  # float16 input stays float16
    assert store.default_metric == "cosine"
    assert store.gallery.chunk_rows == 7
    np.testing.assert_array_equal(store.gallery.features[:], short["gf"])
    np.testing.assert_array_equal(store.query.features[:], short["qf"])
    assert store.query.pids.dtype == np.int64 and store.gallery.camids.dtype == np.int64
    np.testing.assert_array_equal(store.query.pids[:], data["query_pids"])
    np.testing.assert_array_equal(store.gallery.camids[:], data["gallery_camids"])


def test_convert_dtype_option_and_default_chunks(tmp_path):
    data = make_arrays(seed=2)
    np.savez(tmp_path / "in.npz", **data)
    store = convert_npz(tmp_path / "in.npz", tmp_path / "out.zarr", dtype="float16")
    assert store.gallery.features.dtype == np.float16
    assert store.gallery.chunk_rows == min(default_chunk_rows(12, 2), 300)
    np.testing.assert_array_equal(store.gallery.features[:], data["gallery_features"].astype(np.float16))
    mixed = dict(data, query_features=data["query_features"].astype(np.float16))
    np.savez(tmp_path / "mixed.npz", **mixed)
    assert convert_npz(tmp_path / "mixed.npz", tmp_path / "m.zarr").query.features.dtype == np.float32


def _edit(**changes):
    def make(data):
        out = dict(data)
        for key, change in changes.items():
            if change is None:
                del out[key]
            else:
                out[key] = change(out[key])
        return out
    return make


def _set(row, value):
    def put(x):
        x = x.copy()
        x[row, 3] = value
        return x
    return put


CONVERT_ERRORS = {
    "missing gallery_pids": (_edit(gallery_pids=None), {}, r"lack 'gallery_pids' \(or its short name 'g_pids'\); it holds: gallery_camids"),
    "missing query_features": (_edit(query_features=None), {}, r"lack 'query_features'"),
    "pids length": (_edit(gallery_pids=lambda x: x[:-1]), {}, r"'gallery_pids' has 299 entries but 'gallery_features' has 300 rows"),
    "camids length": (_edit(query_camids=lambda x: x[:10]), {}, r"'query_camids' has 10 entries"),
    "dimension mismatch": (_edit(gallery_features=lambda x: x[:, :5]), {}, r"query features have dimension 12 but gallery features have 5"),
    # whole-number float ids are read as integers (test_readers.py); a fraction is refused with its row
    "float ids": (_edit(query_pids=lambda x: x + 0.5), {}, r"'query_pids' row 0 holds \d+\.5, not an integer id"),
    "bool camids": (_edit(gallery_camids=lambda x: x > 1), {}, r"'gallery_camids' has dtype bool"),
    "integer features": (_edit(gallery_features=lambda x: x.astype(np.int16)), {}, r"features must be floating point"),
    "complex features": (_edit(query_features=lambda x: x.astype(np.complex64)), {}, r"features must be floating point"),
    "1-D features": (_edit(query_features=lambda x: x[:, 0]), {}, r"'query_features' must be 2-D"),
    "2-D pids": (_edit(gallery_pids=lambda x: x.reshape(-1, 1)), {}, r"'gallery_pids' must be 1-D"),
    "NaN": (_edit(gallery_features=_set(201, np.nan)), {"chunk_rows": 64}, r"in.npz': gallery features hold non-finite values .* first at row 201"),
    "inf": (_edit(query_features=_set(7, -np.inf)), {}, r"in.npz': query features hold non-finite values .* row 7"),
    "float16 overflow": (_edit(gallery_features=_set(5, 1e6)), {"dtype": "float16"}, r"gallery features row 5 holds values too large for float16 .*; store the features as float32"),
    "empty gallery": (
        _edit(gallery_features=lambda x: x[:0], gallery_pids=lambda x: x[:0], gallery_camids=lambda x: x[:0]), {},
        r"'gallery_features' is empty"),
}


@pytest.mark.parametrize("case", list(CONVERT_ERRORS))
def test_convert_errors(tmp_path, case):
    make, kwargs, message = CONVERT_ERRORS[case]
    np.savez(tmp_path / "in.npz", **make(make_arrays()))
    with pytest.raises(StoreError, match=message):
        convert_npz(tmp_path / "in.npz", tmp_path / "out.zarr", **kwargs)
    assert not (tmp_path / "out.zarr").exists()


def test_convert_unreadable_inputs(tmp_path):
    (tmp_path / "text.npz").write_text("hello\n")
    with pytest.raises(StoreError, match="is not an .npz archive"):
        convert_npz(tmp_path / "text.npz", tmp_path / "out.zarr")
    with pytest.raises(StoreError, match="no input file"):
        convert_npz(tmp_path / "missing.npz", tmp_path / "out.zarr")
    np.savez_compressed(tmp_path / "good.npz", **make_arrays())
    raw = bytearray((tmp_path / "good.npz").read_bytes())
    raw[len(raw) // 3: len(raw) // 3 + 64] = b"\x00" * 64  # inside a compressed member
    (tmp_path / "bad.npz").write_bytes(bytes(raw))
    with pytest.raises(StoreError, match="cannot read"):
        convert_npz(tmp_path / "bad.npz", tmp_path / "out.zarr")
    assert not (tmp_path / "out.zarr").exists()


def test_convert_refuses_to_overwrite(tmp_path):
    np.savez(tmp_path / "in.npz", **make_arrays())
    out = tmp_path / "out.zarr"
    out.mkdir()
    (out / "precious.txt").write_text("keep\n")
    with pytest.raises(StoreError, match="already exists; pass --overwrite"):
        convert_npz(tmp_path / "in.npz", out)
    assert (out / "precious.txt").read_text() == "keep\n"
    with pytest.raises(StoreError, match="is the input file"):
        convert_npz(tmp_path / "in.npz", tmp_path / "in.npz", overwrite=True)
    assert (tmp_path / "in.npz").stat().st_size > 0
    # --overwrite replaces a store streameval wrote, never a folder of somebody's files
    with pytest.raises(OptionError, match=r"is not a streameval store \(it holds precious.txt\)"):
        convert_npz(tmp_path / "in.npz", out, overwrite=True)
    assert (out / "precious.txt").read_text() == "keep\n"
    convert_npz(tmp_path / "in.npz", tmp_path / "store.zarr")
    store = convert_npz(tmp_path / "in.npz", tmp_path / "store.zarr", overwrite=True)
    assert len(store.gallery) == 300
    validate_values(open_store(tmp_path / "store.zarr"))


@pytest.mark.parametrize("kwargs, message", [
    (dict(dtype="float64"), "dtype must be float16 or float32"),
    (dict(chunk_rows=0), "chunk_rows must be a positive integer"),
    (dict(default_metric="hamming"), "default metric must be one of"),
])
def test_convert_rejects_bad_options(tmp_path, kwargs, message):
    np.savez(tmp_path / "in.npz", **make_arrays())
    with pytest.raises(OptionError, match=message):
        convert_npz(tmp_path / "in.npz", tmp_path / "out.zarr", **kwargs)
    assert not (tmp_path / "out.zarr").exists()
