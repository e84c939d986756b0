"""Feature variants in a store (docs/variants.md, docs/variants.md): written, read back,
refused, appended, converted, listed, and written corruption-like by synth."""

from __future__ import annotations

import json

import numpy as np
import pytest

import streameval
from cli_checks import cli, one_error_line
from signal_checks import ctrl_c_at_pause, paused_script
from streameval import OptionError, StoreError, append_gallery, evaluate, open_store, write_store
from streameval.store import open_group
from streameval.store.variants import CLEAN, variant_attrs, variant_columns, variant_names, variant_set, write_variant
from streameval.suite.plan import preset_variants
from streameval.tools.synth import CORRUPTIONS, MAX_SEVERITY, synthesize

NQ, NG, DIM, CHUNK = 11, 37, 5, 8


def problem(seed=0, n_query=NQ, n_gallery=NG) -> dict:
    rng = np.random.default_rng(seed)
    return dict(qf=rng.standard_normal((n_query, DIM)).astype(np.float32), q_pids=rng.integers(1, 6, n_query),
                q_camids=rng.integers(0, 2, n_query), gf=rng.standard_normal((n_gallery, DIM)).astype(np.float32),
                g_pids=rng.integers(1, 6, n_gallery), g_camids=rng.integers(0, 2, n_gallery))


def make_store(path, data=None, **kwargs):
    data = problem() if data is None else data
    return write_store(path, data["qf"], data["q_pids"], data["q_camids"], data["gf"], data["g_pids"],
                       data["g_camids"], chunk_rows=CHUNK, **kwargs)


def noisy(values, seed):
    """Features of the same rows, perturbed (stand-ins for corrupted images' features)."""
    return values + np.random.default_rng(seed).standard_normal(values.shape).astype(np.float32)


# ----------------------------------------------------------------------------------------- round trip


def test_write_and_read_back(tmp_path):
    data = problem()
    store = make_store(tmp_path / "s.zarr", data)
    types, severity = np.arange(NQ) % 5 - 1, np.arange(NQ) % 6
    corrupted = noisy(data["qf"], 1)
    store = write_variant(store, "query", "corrupt-t0", corrupted, corruption_type=types, severity=severity,
                          attrs={"trial": 0, "seed": 7, "setting": "query"})
    store = write_variant(tmp_path / "s.zarr", "query", "b.v_2", noisy(data["qf"], 2).astype(np.float64))
    store = write_variant(store, "gallery", "corrupt-t0", noisy(data["gf"], 3))

    assert variant_names(store, "query") == [CLEAN, "b.v_2", "corrupt-t0"]
    assert variant_names(store, "gallery") == [CLEAN, "corrupt-t0"]
    assert variant_set(store, "query", CLEAN) is store.query
    fs = variant_set(store, "query", "corrupt-t0")
    assert fs.name == "query variant 'corrupt-t0'" and len(fs) == NQ and fs.dim == DIM
    assert fs.pids is store.query.pids and fs.camids is store.query.camids
    assert fs.features.chunks == store.query.features.chunks == (CHUNK, DIM)
    np.testing.assert_array_equal(fs.features[:], corrupted)
    np.testing.assert_array_equal(variant_set(store, "query", "b.v_2").features[:],
                                  noisy(data["qf"], 2).astype(np.float64).astype(np.float32))
    np.testing.assert_array_equal(variant_set(store, "gallery", "corrupt-t0").features[:], noisy(data["gf"], 3))
    columns = variant_columns(store, "query", "corrupt-t0")
    assert columns["corruption_type"].dtype == np.int64
    np.testing.assert_array_equal(columns["corruption_type"], types)
    np.testing.assert_array_equal(columns["severity"], severity)
    assert variant_columns(store, "query", "b.v_2") == {"corruption_type": None, "severity": None}
    assert variant_columns(store, "query", CLEAN) == {"corruption_type": None, "severity": None}
    assert variant_attrs(store, "query", "corrupt-t0") == {"trial": 0, "seed": 7, "setting": "query"}
    assert variant_attrs(store, "gallery", "corrupt-t0") == {} == variant_attrs(store, "gallery", CLEAN)
    assert streameval.write_variant is write_variant and streameval.variant_names is variant_names


def test_float16_store_casts_like_the_clean_features(tmp_path):
    data = problem()
    store = make_store(tmp_path / "s.zarr", data, dtype="float16")
    corrupted = noisy(data["gf"], 4)
    store = write_variant(store, "gallery", "g", corrupted)
    fs = variant_set(store, "gallery", "g")
    assert fs.features.dtype == np.float16
    np.testing.assert_array_equal(fs.features[:], corrupted.astype(np.float16))


def test_overwrite_replaces_a_variant(tmp_path):
    data = problem()
    store = make_store(tmp_path / "s.zarr", data)
    store = write_variant(store, "query", "v", data["qf"], corruption_type=np.zeros(NQ, int), attrs={"trial": 1})
    store = write_variant(store, "query", "v", noisy(data["qf"], 5), overwrite=True)
    np.testing.assert_array_equal(variant_set(store, "query", "v").features[:], noisy(data["qf"], 5))
    assert variant_columns(store, "query", "v")["corruption_type"] is None
    assert variant_attrs(store, "query", "v") == {}


def test_evaluating_a_variant_reads_its_features(tmp_path):
    """A variant's FeatureSet is a drop-in for the clean set: the same rows, other features."""
    data = problem()
    store = write_variant(make_store(tmp_path / "s.zarr", data), "query", "v", noisy(data["qf"], 6))
    features, pids, camids = streameval.store.read_rows(variant_set(store, "query", "v"), slice(2, 9), np.float64)
    np.testing.assert_array_equal(features, noisy(data["qf"], 6)[2:9].astype(np.float64))
    np.testing.assert_array_equal(pids, data["q_pids"][2:9])
    np.testing.assert_array_equal(camids, data["q_camids"][2:9])


# ----------------------------------------------------------------------------------------- refusals


def with_nan(values, row):
    values = values.copy()
    values[row, 2] = np.nan
    return values


@pytest.mark.parametrize("call, error, message", [
    (lambda s, d: variant_set(s, "query", "nope"), StoreError,
     "has no query variant 'nope'; its query variants: clean, v"),
    (lambda s, d: variant_columns(s, "gallery", "v"), StoreError, "its gallery variants: clean"),
    (lambda s, d: write_variant(s, "query", "w", d["qf"][:-1]), StoreError,
     f"query variant 'w': features have shape ({NQ - 1}, {DIM}), expected ({NQ}, {DIM})"),
    (lambda s, d: write_variant(s, "query", "w", d["qf"][:, :-1]), StoreError, "expected"),
    (lambda s, d: write_variant(s, "gallery", "w", with_nan(d["gf"], 13)), StoreError,
     "gallery variant 'w' features hold non-finite values (NaN or inf), first at row 13"),
    (lambda s, d: write_variant(s, "query", "w", np.full((NQ, DIM), 1e40)), StoreError,
     "query variant 'w' features row 0 holds values too large for float32"),
    (lambda s, d: write_variant(s, "query", "w", d["qf"].astype(int)), StoreError, "floating-point"),
    (lambda s, d: write_variant(s, "query", "v", d["qf"]), StoreError,
     "already has the query variant 'v'; pass --overwrite"),
    (lambda s, d: write_variant(s, "query", "a/b", d["qf"]), OptionError, "variant name 'a/b'"),
    (lambda s, d: write_variant(s, "query", ".hidden", d["qf"]), OptionError, "not starting with a dot"),
    (lambda s, d: write_variant(s, "query", CLEAN, d["qf"]), OptionError, "'clean' names the set's own"),
    (lambda s, d: write_variant(s, "probe", "w", d["qf"]), OptionError, "variants belong to query or gallery"),
    (lambda s, d: write_variant(s, "query", "w", d["qf"], severity=np.full(NQ, -1)), StoreError,
     "query variant 'w': severity row 0 holds -1"),
    (lambda s, d: write_variant(s, "query", "w", d["qf"], corruption_type=np.zeros(NQ - 1, int)), StoreError,
     f"corruption_type must hold {NQ} integers"),
    (lambda s, d: write_variant(s, "query", "w", d["qf"], corruption_type=np.zeros(NQ)), StoreError,
     "corruption_type must hold"),
    (lambda s, d: write_variant(s, "query", "w", d["qf"], attrs={"seed": object()}), OptionError, "JSON"),
])
def test_refusals_name_the_variant_and_change_nothing(tmp_path, call, error, message):
    data = problem()
    store = write_variant(make_store(tmp_path / "s.zarr", data), "query", "v", data["qf"])
    with pytest.raises(error) as info:
        call(store, data)
    assert message in str(info.value)
    assert variant_names(open_store(tmp_path / "s.zarr"), "query") == [CLEAN, "v"]
    assert not (tmp_path / "s.zarr" / "query" / "variants" / "w").exists()


def test_a_damaged_variant_is_refused_on_opening(tmp_path):
    data = problem()
    path = tmp_path / "s.zarr"
    write_variant(make_store(path, data), "gallery", "v", data["gf"], severity=np.ones(NG, int))
    group = open_group(str(path), mode="r+")
    group["gallery/variants/v/features"].attrs["complete"] = False  # as a write interrupted before its end
    with pytest.raises(StoreError, match="'.*' gallery variant 'v' was not written completely"):
        variant_set(open_store(path), "gallery", "v")
    del group["gallery/variants/v/features"]
    group.create_array("gallery/variants/v/features", data=data["gf"], chunks=(NG, DIM))  # other chunks
    with pytest.raises(StoreError, match=r"gallery variant 'v': features are float32 in chunks \(37, 5\), expected "
                                         r"float32 in chunks \(8, 5\)"):
        variant_set(open_store(path), "gallery", "v")


def test_a_missing_chunk_is_an_error_naming_the_variant(tmp_path):
    data = problem()
    path = tmp_path / "s.zarr"
    write_variant(make_store(path, data), "gallery", "v", data["gf"])
    (path / "gallery" / "variants" / "v" / "features" / "c" / "1" / "0").unlink()
    result = cli("validate", path, code=3)
    assert "gallery variant 'v' rows 8-15: chunk missing from the store" in one_error_line(result)


# ----------------------------------------------------------------------------------------- appends


def store_with_gallery_variants(path):
    data = problem()
    store = make_store(path, data)
    store = write_variant(store, "gallery", "a", noisy(data["gf"], 1), corruption_type=np.zeros(NG, int),
                          severity=np.ones(NG, int))
    store = write_variant(store, "gallery", "b", noisy(data["gf"], 2))
    return write_variant(store, "query", "q", noisy(data["qf"], 3)), data


def new_rows(n=10, seed=9):
    extra = problem(seed, n_gallery=n)
    return extra["gf"], extra["g_pids"], extra["g_camids"]


def test_append_writes_every_gallery_variant(tmp_path):
    path = tmp_path / "s.zarr"
    _, data = store_with_gallery_variants(path)
    features, pids, camids = new_rows()
    types, severity = np.arange(10) % 3, np.arange(10) % 5 + 1
    store = append_gallery(path, features, pids, camids, variants={
        "a": {"features": features + 1, "corruption_type": types, "severity": severity}, "b": features + 2})
    assert len(store.gallery) == NG + 10
    a, b = (variant_set(store, "gallery", name) for name in ("a", "b"))
    assert len(a) == len(b) == NG + 10
    np.testing.assert_array_equal(a.features[:], np.concatenate([noisy(data["gf"], 1), features + 1]))
    np.testing.assert_array_equal(b.features[:], np.concatenate([noisy(data["gf"], 2), features + 2]))
    columns = variant_columns(store, "gallery", "a")
    np.testing.assert_array_equal(columns["corruption_type"], np.concatenate([np.zeros(NG), types]))
    np.testing.assert_array_equal(columns["severity"], np.concatenate([np.ones(NG), severity]))
    assert len(variant_set(store, "query", "q")) == NQ


def snapshot(path) -> dict:
    """Every array of the store, whole (uncommitted tails included), and the attributes."""
    group = open_group(str(path), mode="r")
    arrays = {key: np.asarray(arr[...]) for key, arr in group.arrays()}
    for name in ("query", "gallery"):
        for key, arr in group[name].arrays():
            arrays[f"{name}/{key}"] = np.asarray(arr[...])
        if "variants" in group[name]:
            for vname, variant in group[f"{name}/variants"].groups():
                for key, arr in variant.arrays():
                    arrays[f"{name}/variants/{vname}/{key}"] = np.asarray(arr[...])
    return {"attrs": dict(group.attrs), **arrays}


def assert_same_snapshot(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.parametrize("variants, message", [
    (None, "has the gallery variants a, b: every one needs the appended rows, and those of 'a', 'b' are missing"),
    ({"a": {"features": "F", "corruption_type": "T", "severity": "S"}}, "those of 'b' are missing"),
    ({"a": {"features": "F", "corruption_type": "T", "severity": "S"}, "b": "F", "c": "F"},
     "has no gallery variant 'c' to append to; its gallery variants: clean, a, b"),
    ({"a": "F", "b": "F"}, "appended gallery variant 'a': corruption_type missing: the stored variant has one per row"),
    ({"a": {"features": "F", "corruption_type": "T", "severity": "S"}, "b": {"features": "F", "severity": "S"}},
     "appended gallery variant 'b': severity given: the stored variant has none, so they would be lost"),
    ({"a": {"features": "NAN", "corruption_type": "T", "severity": "S"}, "b": "F"},
     "appended gallery variant 'a' features hold non-finite values (NaN or inf), first at row 4"),
])
def test_an_append_missing_or_naming_an_unknown_variant_is_refused(tmp_path, variants, message):
    path = tmp_path / "s.zarr"
    store_with_gallery_variants(path)
    before = snapshot(path)
    features, pids, camids = new_rows()
    values = {"F": features, "T": np.zeros(10, int), "S": np.ones(10, int), "NAN": with_nan(features, 4)}
    given = None if variants is None else {
        name: values[v] if isinstance(v, str) else {key: values[x] for key, x in v.items()}
        for name, v in variants.items()}
    with pytest.raises(StoreError) as info:
        append_gallery(path, features, pids, camids, variants=given)
    assert message in str(info.value)
    assert_same_snapshot(snapshot(path), before)


def test_an_interrupted_append_leaves_every_variant_as_it_was(tmp_path):
    """A real Ctrl-C (SIGINT) once every row is written, before the commit."""
    path = tmp_path / "s.zarr"
    _, data = store_with_gallery_variants(path)
    features, pids, camids = new_rows(7)
    given = {"a": {"features": features, "corruption_type": np.zeros(7, int), "severity": np.ones(7, int)},
             "b": features}
    np.savez(tmp_path / "rows.npz", features=features, pids=pids, camids=camids)
    append = ('rows = np.load(sys.argv[2]); streameval.append_gallery(sys.argv[1], rows["features"], rows["pids"], '
              'rows["camids"], variants={"a": {"features": rows["features"], "corruption_type": np.zeros(7, int), '
              '"severity": np.ones(7, int)}, "b": rows["features"]})')
    ctrl_c_at_pause(paused_script("streameval.store.writing", "commit_gallery", append), path, tmp_path / "rows.npz")
    store = open_store(path)
    a = variant_set(store, "gallery", "a")
    assert len(a) == NG and a.features.shape[0] == NG + 7  # an uncommitted tail, not read
    np.testing.assert_array_equal(a.features[:NG], noisy(data["gf"], 1))
    assert len(variant_columns(store, "gallery", "a")["severity"]) == NG
    # the next append replaces the tail
    store = append_gallery(path, features[:3], pids[:3], camids[:3],
                           variants={name: ({k: v[:3] for k, v in value.items()} if isinstance(value, dict)
                                            else value[:3]) for name, value in given.items()})
    b = variant_set(store, "gallery", "b")
    assert len(b) == NG + 3 and b.features.shape[0] == NG + 3
    np.testing.assert_array_equal(b.features[NG:], features[:3])


def test_cli_append_reads_the_variants_rows(tmp_path):
    path = tmp_path / "s.zarr"
    store_with_gallery_variants(path)
    features, pids, camids = new_rows(6)
    common = dict(gf=features, g_pids=pids, g_camids=camids)
    np.savez(tmp_path / "missing.npz", **common, **{"variant.a": features + 1,
                                                   "variant.a.corruption_type": np.zeros(6, int),
                                                   "variant.a.severity": np.ones(6, int)})
    before = snapshot(path)
    result = cli("append", path, tmp_path / "missing.npz", code=3)
    assert "those of 'b' are missing" in one_error_line(result)
    assert_same_snapshot(snapshot(path), before)

    np.savez(tmp_path / "rows.npz", **common, **{"variant.a": features + 1, "variant.a.corruption_type": np.full(6, 2),
                                                "variant.a.severity": np.full(6, 3), "variant.b": features + 2})
    assert "appended 6 rows" in cli("append", path, tmp_path / "rows.npz").output
    store = open_store(path)
    np.testing.assert_array_equal(variant_set(store, "gallery", "b").features[NG:], features + 2)
    np.testing.assert_array_equal(variant_columns(store, "gallery", "a")["severity"][NG:], np.full(6, 3))

    np.savez(tmp_path / "orphan.npz", **common, **{"variant.a.severity": np.ones(6, int)})
    result = cli("append", path, tmp_path / "orphan.npz", code=3)
    assert "variant.a.severity given without the features 'variant.a'" in one_error_line(result)


# ----------------------------------------------------------------------------------------- convert


@pytest.fixture
def inputs(tmp_path):
    data = problem()
    np.savez(tmp_path / "feats.npz", **data)
    np.save(tmp_path / "q0.npy", noisy(data["qf"], 1))
    np.savez(tmp_path / "g0.npz", features=noisy(data["gf"], 2), corruption_type=np.arange(NG) % 4,
             severity=np.arange(NG) % 5 + 1, pids=data["g_pids"], camids=data["g_camids"])
    np.savez(tmp_path / "g_shuffled.npz", features=noisy(data["gf"], 2), pids=np.roll(data["g_pids"], 1))
    return data


def test_convert_stores_variants_from_npy_and_npz(tmp_path, inputs):
    out = tmp_path / "out.zarr"
    cli("convert", tmp_path / "feats.npz", out, "--query-variant", f"q0={tmp_path / 'q0.npy'}",
        "--gallery-variant", f"g0={tmp_path / 'g0.npz'}", "--chunk-rows", CHUNK)
    store = open_store(out)
    assert variant_names(store, "query") == [CLEAN, "q0"] and variant_names(store, "gallery") == [CLEAN, "g0"]
    np.testing.assert_array_equal(variant_set(store, "query", "q0").features[:], noisy(inputs["qf"], 1))
    np.testing.assert_array_equal(variant_set(store, "gallery", "g0").features[:], noisy(inputs["gf"], 2))
    assert variant_set(store, "gallery", "g0").features.chunks == (CHUNK, DIM)
    np.testing.assert_array_equal(variant_columns(store, "gallery", "g0")["corruption_type"], np.arange(NG) % 4)
    assert variant_columns(store, "query", "q0")["severity"] is None
    assert variant_attrs(store, "query", "q0") == {"source": "file", "file": str(tmp_path / "q0.npy")}


@pytest.mark.parametrize("args, code, message", [
    (["--gallery-variant", "g1={tmp}/g_shuffled.npz"], 3,
     "gallery variant 'g1' ('{tmp}/g_shuffled.npz'): pids differ from the clean set's, first at row 0"),
    (["--query-variant", "q1={tmp}/g0.npz"], 3,
     f"query variant 'q1' ('{{tmp}}/g0.npz'): features have shape ({NG}, {DIM}), expected ({NQ}, {DIM})"),
    (["--query-variant", "q1={tmp}/feats.npz"], 3, "expected the arrays features and optionally"),
    (["--query-variant", "q1={tmp}/absent.npy"], 3, "no input file at"),
    (["--query-variant", "bad name={tmp}/q0.npy"], 2, "variant name 'bad name'"),
    (["--query-variant", "q0"], 2, "expected NAME=FILE"),
    (["--query-variant", "q={tmp}/q0.npy", "--query-variant", "q={tmp}/q0.npy"], 2, "'q' is given twice"),
    (["--query-variant", "q={tmp}/q0.npy", "--distances"], 2, "a distance store has no features"),
])
def test_convert_refuses_bad_variants_before_writing(tmp_path, inputs, args, code, message):
    out = tmp_path / "out.zarr"
    result = cli("convert", tmp_path / "feats.npz", out, *(a.format(tmp=tmp_path) for a in args), code=code)
    assert message.format(tmp=tmp_path) in one_error_line(result)
    assert not out.exists()


def test_convert_with_overwrite_keeps_the_old_store_when_a_variant_is_refused(tmp_path, inputs):
    out = tmp_path / "out.zarr"
    cli("convert", tmp_path / "feats.npz", out)
    cli("convert", tmp_path / "feats.npz", out, "--overwrite", "--gallery-variant",
        f"g1={tmp_path / 'g_shuffled.npz'}", code=3)
    assert len(open_store(out).gallery) == NG


# ----------------------------------------------------------------------------------------- variants command


def test_variants_command_lists_and_adds(tmp_path, inputs):
    path = tmp_path / "s.zarr"
    make_store(path, inputs)
    listing = cli("variants", path).output
    assert f"query: 1 variant\n  clean  {NQ} rows (the set's own features)" in listing
    output = cli("variants", path, "--add", f"query:q0={tmp_path / 'q0.npy'}", "--add",
                 f"gallery:g0={tmp_path / 'g0.npz'}").output
    assert "query: 2 variants" in output and "gallery: 2 variants" in output
    line = next(line for line in output.splitlines() if line.strip().startswith("g0"))
    assert f"{NG} rows, corruption_type and severity, " in line
    assert json.loads(line.split("severity, ", 1)[1]) == {"source": "file", "file": str(tmp_path / "g0.npz")}
    np.testing.assert_array_equal(variant_set(open_store(path), "query", "q0").features[:], noisy(inputs["qf"], 1))

    result = cli("variants", path, "--add", f"query:q0={tmp_path / 'g0.npz'}", code=3)
    assert "already has the query variant 'q0'; pass --overwrite" in one_error_line(result)
    np.save(tmp_path / "q1.npy", noisy(inputs["qf"], 8))
    cli("variants", path, "--add", f"query:q0={tmp_path / 'q1.npy'}", "--overwrite")
    np.testing.assert_array_equal(variant_set(open_store(path), "query", "q0").features[:], noisy(inputs["qf"], 8))

    # all checked before any is written
    result = cli("variants", path, "--add", f"query:new={tmp_path / 'q0.npy'}", "--add",
                 f"gallery:g1={tmp_path / 'g_shuffled.npz'}", code=3)
    assert "gallery variant 'g1'" in one_error_line(result)
    assert variant_names(open_store(path), "query") == [CLEAN, "q0"]
    for spec, message in (("q2=x.npy", "expected SET:NAME=FILE"), ("probe:q2=x.npy", "expected SET:NAME=FILE"),
                          ("query:q2", "expected NAME=FILE")):
        assert message in one_error_line(cli("variants", path, "--add", spec, code=2))
    assert "no feature store at" in one_error_line(cli("variants", tmp_path / "none.zarr", code=3))


# ----------------------------------------------------------------------------------------- synth


SMALL = dict(n_query=120, n_gallery=900, dim=32, n_ids=40, n_cams=4)


@pytest.fixture(scope="module")
def factorial(tmp_path_factory):
    path = tmp_path_factory.mktemp("synth") / "f.zarr"
    cli("synth", path, "--queries", 120, "--gallery", 900, "--dim", 32, "--ids", 40, "--cams", 4, "--seed", 3,
        "--variants", "cil-factorial", "--variant-trials", 2, "-q")
    return path


def test_synth_writes_the_preset_variants(factorial):
    store = open_store(factorial)
    for set_name, rows in (("query", 120), ("gallery", 900)):
        assert variant_names(store, set_name) == [CLEAN, "corrupt-t0", "corrupt-t1"]
        for trial in (0, 1):
            name = f"corrupt-t{trial}"
            fs = variant_set(store, set_name, name)
            clean = getattr(store, set_name).features[:]
            assert fs.features.shape == (rows, 32) and fs.features.chunks == getattr(store, set_name).features.chunks
            features = fs.features[:]
            assert np.isfinite(features).all() and np.abs(features).max() < 100
            assert not np.isclose(features, clean).all(axis=1).any()  # every row corrupted
            np.testing.assert_allclose(np.linalg.norm(features, axis=1), np.linalg.norm(clean, axis=1), rtol=1e-4)
            columns = variant_columns(store, set_name, name)
            assert set(np.unique(columns["corruption_type"])) == set(range(len(CORRUPTIONS)))
            assert set(np.unique(columns["severity"])) == set(range(1, MAX_SEVERITY + 1))
            assert variant_attrs(store, set_name, name) == {
                "trial": trial, "seed": 3, "setting": "factorial", "plan": "cil-factorial", "source": "synth",
                "corruption_names": list(CORRUPTIONS), "max_severity": MAX_SEVERITY}
    a, b = (variant_set(store, "query", f"corrupt-t{t}").features[:] for t in (0, 1))
    assert not np.isclose(a, b).all(axis=1).any()  # trials draw anew


def test_synth_variants_are_deterministic_and_independent_of_chunking(tmp_path, factorial):
    other = synthesize(tmp_path / "o.zarr", **SMALL, seed=3, chunk_rows=64, variants="cil-factorial", variant_trials=2)
    store = open_store(factorial)
    for set_name in ("query", "gallery"):
        for name in ("corrupt-t0", "corrupt-t1"):
            np.testing.assert_array_equal(variant_set(other, set_name, name).features[:],
                                          variant_set(store, set_name, name).features[:])
            for column, values in variant_columns(other, set_name, name).items():
                np.testing.assert_array_equal(values, variant_columns(store, set_name, name)[column])


def test_synth_upstream_names_and_float16(tmp_path):
    store = synthesize(tmp_path / "u.zarr", **SMALL, variants="cil-upstream", variant_trials=2, dtype="float16")
    assert variant_names(store, "query") == [CLEAN, "both-t0", "both-t1", "query-t0", "query-t1"]
    assert variant_names(store, "gallery") == [CLEAN, "both-t0", "both-t1", "gallery-t0", "gallery-t1"]
    assert variant_set(store, "gallery", "both-t1").features.dtype == np.float16
    assert variant_attrs(store, "query", "both-t1")["setting"] == "both"
    assert variant_attrs(store, "gallery", "gallery-t0")["setting"] == "gallery"
    preset = preset_variants("cil-upstream", 2)
    assert [name for name, _, _ in preset["query"]] == ["query-t0", "both-t0", "query-t1", "both-t1"]
    assert {name for name, _, _ in preset["gallery"]} == set(variant_names(store, "gallery")[1:])
    streameval.store.validate_values(store)
    cli("validate", tmp_path / "u.zarr")


def test_corruption_lowers_map_but_not_to_zero(tmp_path):
    store = synthesize(tmp_path / "m.zarr", n_query=300, n_gallery=2000, dim=64, n_ids=100, n_cams=4, seed=1,
                       variants="cil-factorial", variant_trials=1)

    def mean_ap(query, gallery):
        q, g = variant_set(store, "query", query), variant_set(store, "gallery", gallery)
        arrays = dict(qf=q.features[:], q_pids=q.pids[:], q_camids=q.camids[:], gf=g.features[:], g_pids=g.pids[:],
                      g_camids=g.camids[:])
        return evaluate(arrays, no_gom=True).mAP

    clean, query, gallery, both = (mean_ap(q, g) for q, g in (
        (CLEAN, CLEAN), ("corrupt-t0", CLEAN), (CLEAN, "corrupt-t0"), ("corrupt-t0", "corrupt-t0")))
    assert clean - 0.05 > max(query, gallery) and min(query, gallery) - 0.05 > both > 0.2, (clean, query, gallery, both)


@pytest.mark.parametrize("kwargs, message", [
    (dict(variants="cil-other"), "no variant preset 'cil-other'"),
    (dict(variants="cil-factorial", variant_trials=0), "variant_trials must be a positive integer"),
])
def test_synth_rejects_bad_variant_arguments(tmp_path, kwargs, message):
    with pytest.raises(OptionError, match=message):
        synthesize(tmp_path / "x.zarr", **SMALL, **kwargs)
    assert not (tmp_path / "x.zarr").exists()
    result = cli("synth", tmp_path / "x.zarr", "--variants", "cil-other", code=2)
    assert "--variants" in one_error_line(result)
