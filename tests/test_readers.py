"""Readers of what users bring (streameval.io, docs/formats.md), through the command line.

Every format is written here by its own library (numpy, scipy.io for MATLAB v5, h5py for HDF5 and
MATLAB v7.3, torch when installed, the csv module) in the layouts people have: layumi's
``pytorch_result.mat``, torchreid / fast-reid names, nested HDF5 groups, folders of .npy files.
Each converts to a store holding exactly the arrays of the .npz route and evaluating to exactly its
numbers; distance matrices likewise give exactly the numbers of a distance store written from the
matrix in memory.  A wrong or ambiguous file is one ``error:`` line and exit 3, the output untouched.
"""

from __future__ import annotations

import csv
import json
import pickle
import sys
import tempfile
import zipfile

import h5py
import numpy as np
import pytest
import scipy.io

import streameval
from streameval import write_distance_store
from streameval.store import open_store
from streameval.store.paths import read_paths

from cli_checks import cli, one_error_line

NQ, NG, DIM = 24, 150, 6
LAYUMI = {"query_features": "query_f", "query_pids": "query_label", "query_camids": "query_cam",
          "gallery_features": "gallery_f", "gallery_pids": "gallery_label", "gallery_camids": "gallery_cam"}
SHORT = {"query_features": "qf", "query_pids": "q_pids", "query_camids": "q_camids",
         "gallery_features": "gf", "gallery_pids": "g_pids", "gallery_camids": "g_camids"}


@pytest.fixture(scope="module")
def arrays() -> dict:
    """Clustered identities with junk (-1) and distractors (0) in the gallery, float32 features."""
    rng = np.random.default_rng(12)
    centres = 2 * rng.standard_normal((9, DIM))
    q_pids, g_pids = rng.integers(1, 9, NQ), rng.integers(-1, 9, NG)
    return {
        "query_features": (centres[q_pids] + rng.standard_normal((NQ, DIM))).astype(np.float32),
        "query_pids": q_pids, "query_camids": rng.integers(0, 3, NQ),
        "gallery_features": (centres[np.maximum(g_pids, 0)] + rng.standard_normal((NG, DIM))).astype(np.float32),
        "gallery_pids": g_pids, "gallery_camids": rng.integers(0, 3, NG),
    }


def comparable(store) -> dict:
    """Every number of an evaluation (and what the store holds), not how it ran."""
    result = streameval.evaluate(store, progress=False, max_rank=10)
    numbers = {k: v for k, v in result.to_dict(per_query=True).items() if k != "run"}
    opened = open_store(store)
    fields = ("pids", "camids") if opened.holds_distances else ("features", "pids", "camids")
    held = {f"{fs.name}/{field}": getattr(fs, field)[:].tolist() for fs in (opened.query, opened.gallery)
            for field in fields}
    return {"numbers": numbers, "held": held}


@pytest.fixture(scope="module")
def expected(arrays, tmp_path_factory) -> dict:
    """The .npz route, as 'streameval convert' has always read it."""
    folder = tmp_path_factory.mktemp("npz")
    np.savez(folder / "feats.npz", **{SHORT[k]: v for k, v in arrays.items()})
    cli("convert", folder / "feats.npz", folder / "feats.zarr")
    return comparable(folder / "feats.zarr")


def convert(tmp_path, *args, code=0):
    """``streameval convert ARGS OUT`` into tmp_path/out.zarr: (the output, stderr)."""
    out = tmp_path / "out.zarr"
    result = cli("convert", *args, out, "--chunk-rows", "16", code=code)
    if code:
        assert not out.exists()
    return out, result.stderr


# ------------------------------------------------------------------------------------------ writers


def write_layumi_mat(path, arrays, **changes):
    """layumi's pytorch_result.mat: labels as 1 x N rows (savemat's default for 1-D arrays), the
    query labels as MATLAB's doubles."""
    content = {LAYUMI[k]: v for k, v in arrays.items()}
    content["query_label"] = arrays["query_pids"].astype(np.float64)
    content.update(changes)
    scipy.io.savemat(path, content)


MATLAB_HEADER = b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: Mon Jan  1 00:00:00 2024 HDF5 schema 1.00 ."


def write_matlab_v73(path, variables: dict):
    """An HDF5 file as MATLAB -v7.3 writes one: a 512-byte user block opening with MATLAB's header,
    every variable stored column-major (the dataset is the transpose of the MATLAB array), vectors
    as 1 x N arrays, numbers as doubles unless given another class."""
    with h5py.File(path, "w", userblock_size=512) as f:
        for name, value in variables.items():
            value = np.asarray(value)
            matlab = value.reshape(1, -1) if value.ndim == 1 else value
            ds = f.create_dataset(name, data=np.ascontiguousarray(matlab.T), chunks=True)
            ds.attrs["MATLAB_class"] = np.bytes_({np.dtype(np.float64): "double", np.dtype(np.float32): "single",
                                                  np.dtype(np.int64): "int64"}[value.dtype])
    with open(path, "r+b") as fh:
        fh.write(MATLAB_HEADER.ljust(116) + b"\0" * 8 + (0x0200).to_bytes(2, "little") + b"IM")


def write_csv(path, pids, camids, paths=None, header=("pid", "camid", "path")):
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header[:2] if paths is None else header)
        for row in zip(pids, camids, *([paths] if paths is not None else [])):
            writer.writerow(row)


def image_paths(set_name: str, n: int) -> list[str]:
    return [f"images/{set_name}/{i:04d}_c{i % 3}.jpg" for i in range(n)]


# ------------------------------------------------------------------------------------------ features


def test_layumi_mat_v5(tmp_path, arrays, expected):
    write_layumi_mat(tmp_path / "pytorch_result.mat", arrays)
    out, stderr = convert(tmp_path, tmp_path / "pytorch_result.mat")
    assert stderr.splitlines() == [
        "reading pytorch_result.mat (MATLAB v5, read whole): query_f -> query features, gallery_f -> gallery features, "
        "query_label -> query pids, query_cam -> query camids, gallery_label -> gallery pids, "
        "gallery_cam -> gallery camids"]
    assert comparable(out) == expected


def test_matlab_v73_transposed_with_its_header(tmp_path, arrays, expected):
    variables = {LAYUMI[k]: v.astype(np.float64) if k.endswith("ids") else v for k, v in arrays.items()}
    write_matlab_v73(tmp_path / "pytorch_result.mat", variables)
    assert open(tmp_path / "pytorch_result.mat", "rb").read(10) == b"MATLAB 7.3"
    with h5py.File(tmp_path / "pytorch_result.mat") as f:  # as MATLAB lays it out
        assert f["gallery_f"].shape == (DIM, NG) and f["gallery_label"].shape == (NG, 1)
    out, stderr = convert(tmp_path, tmp_path / "pytorch_result.mat")
    assert stderr.startswith("reading pytorch_result.mat (MATLAB v7.3, HDF5): query_f -> query features")
    assert comparable(out) == expected


def test_plain_hdf5_mat_file_is_read_as_matlab_lays_it_out(tmp_path, arrays, expected):
    """A .mat in HDF5 form without MATLAB's header (h5py, as a script might write it for MATLAB)."""
    with h5py.File(tmp_path / "feats.mat", "w") as f:
        for key, value in arrays.items():
            f[SHORT[key]] = value.T if value.ndim == 2 else value.reshape(-1, 1)
    out, _ = convert(tmp_path, tmp_path / "feats.mat")
    assert comparable(out) == expected


def test_hdf5_groups_streamed_a_block_at_a_time(tmp_path, arrays, expected, monkeypatch):
    """query/features, gallery/pids ... in groups; every read is at most one store chunk of rows."""
    with h5py.File(tmp_path / "feats.h5", "w") as f:
        for key, value in arrays.items():
            f.create_dataset(key.replace("_", "/", 1), data=value, chunks=(10,) + value.shape[1:])
    from streameval.io import h5 as h5_module

    read_rows, real_read = [], h5_module.H5Array._read

    def spy(array, rows):
        read_rows.append(len(range(*rows.indices(array.shape[0]))))
        return real_read(array, rows)

    monkeypatch.setattr(h5_module.H5Array, "_read", spy)
    out, stderr = convert(tmp_path, tmp_path / "feats.h5")
    assert "query/features -> query features" in stderr and "gallery/camids -> gallery camids" in stderr
    assert read_rows and max(read_rows) == 16  # --chunk-rows 16
    assert comparable(out) == expected


def test_npy_folder_and_npy_files(tmp_path, arrays, expected):
    folder = tmp_path / "features"
    folder.mkdir()
    for key, value in arrays.items():
        np.save(folder / f"{key}.npy", value)
    out, stderr = convert(tmp_path, folder)
    assert stderr == ""  # streameval's own names: nothing to report
    assert comparable(out) == expected
    files = []
    for key, value in arrays.items():  # torchreid's names, one file each, the gallery in Fortran order
        files.append(tmp_path / f"{SHORT[key]}.npy")
        np.save(files[-1], np.asfortranarray(value))
    out.rename(tmp_path / "first.zarr")
    out, _ = convert(tmp_path, *files)
    assert comparable(out) == expected


def write_npz_members(path, members: dict, version) -> None:
    """An .npz as numpy.savez lays it out, each member written in .npy format ``version``."""
    with zipfile.ZipFile(path, "w") as zf:
        for name, value in members.items():
            with zf.open(f"{name}.npy", "w") as fh:
                np.lib.format.write_array(fh, np.asanyarray(value), version=version, allow_pickle=False)


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_npz_members_in_every_npy_format_version(tmp_path, arrays, expected, version):
    """Version 3.0 (a UTF-8 header) is read through numpy's public API, as 1.0 and 2.0 are."""
    write_npz_members(tmp_path / "feats.npz", {SHORT[k]: v for k, v in arrays.items()}, version)
    out, _ = convert(tmp_path, tmp_path / "feats.npz")
    assert comparable(out) == expected
    result = cli("eval", tmp_path / "feats.npz", "--json", "-", "--per-query", "-q", "--max-rank", "10")
    got = json.loads(result.stdout)
    got.pop("run")
    assert got == as_json(expected["numbers"])


def test_a_damaged_npy_3_0_header_is_one_line(tmp_path, arrays):
    write_npz_members(tmp_path / "feats.npz", {SHORT[k]: v for k, v in arrays.items()}, (3, 0))
    with zipfile.ZipFile(tmp_path / "feats.npz") as zf:
        members = {info.filename: zf.read(info) for info in zf.infolist()}
    members["qf.npy"] = members["qf.npy"].replace(b"'shape'", b"'shapes'")
    with zipfile.ZipFile(tmp_path / "bad.npz", "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    line = one_error_line(cli("convert", tmp_path / "bad.npz", tmp_path / "out.zarr", code=3))
    assert "cannot read 'qf' from" in line and "descr, fortran_order and shape" in line
    assert not (tmp_path / "out.zarr").exists()


def test_whole_float_ids_in_an_npz_read_as_integers_as_from_a_mat_file(tmp_path, arrays, expected):
    floats = {SHORT[k]: v.astype(np.float64) if "features" not in k else v for k, v in arrays.items()}
    np.savez(tmp_path / "feats.npz", **floats)
    out, _ = convert(tmp_path, tmp_path / "feats.npz")
    assert comparable(out) == expected
    for where, fraction in ((5, 12.5), (7, np.nan)):
        floats["g_pids"] = arrays["gallery_pids"].astype(np.float32)
        floats["g_pids"][where] = fraction
        np.savez(tmp_path / "fraction.npz", **floats)
        line = one_error_line(cli("convert", tmp_path / "fraction.npz", tmp_path / "bad.zarr", code=3))
        assert line.endswith(f"'g_pids' row {where} holds {fraction}, not an integer id"), line
        assert not (tmp_path / "bad.zarr").exists()


def test_an_npz_without_camera_ids_evaluates_under_protocol_none_only(tmp_path, arrays):
    """No camera rule: the numbers are those of the same rows with their cameras, under 'none'."""
    np.savez(tmp_path / "feats.npz", **{SHORT[k]: v for k, v in arrays.items() if not k.endswith("camids")})
    out, stderr = convert(tmp_path, tmp_path / "feats.npz")
    assert "no camera ids: every row is camera 0 (evaluate it with --protocol none" in stderr
    assert not open_store(out).cameras and not open_store(out).query.camids[:].any()
    with_cameras = streameval.evaluate(dict(arrays), protocol="none", max_rank=10).to_dict(per_query=True)
    with_cameras.pop("run")
    for target in (out, tmp_path / "feats.npz"):
        result = cli("eval", target, "--protocol", "none", "--json", "-", "--per-query", "-q", "--max-rank", "10")
        got = json.loads(result.stdout)
        got.pop("run")
        assert got == as_json(with_cameras)
    for protocol, uses in (("market", "x_same"), ("sysu-all", "x_same, x_any, query_cameras, gallery_cameras, trials")):
        line = one_error_line(cli("eval", out, "--protocol", protocol, "-q", code=2))
        assert f"has no camera ids (its input had none), but protocol '{protocol}' uses them ({uses})" in line, line
        assert line.endswith("evaluate it with --protocol none, which applies no camera rule")


def test_a_store_without_camera_ids_takes_appended_rows_without_them(tmp_path, arrays):
    first, more = slice(0, 100), slice(100, None)
    short = {SHORT[k]: v for k, v in arrays.items() if not k.endswith("camids")}
    np.savez(tmp_path / "feats.npz", **{**short, "gf": short["gf"][first], "g_pids": short["g_pids"][first]})
    np.savez(tmp_path / "more.npz", gf=short["gf"][more], g_pids=short["g_pids"][more])
    np.savez(tmp_path / "cams.npz", gf=short["gf"][more], g_pids=short["g_pids"][more],
             g_camids=arrays["gallery_camids"][more])
    out, _ = convert(tmp_path, tmp_path / "feats.npz")
    line = one_error_line(cli("append", out, tmp_path / "cams.npz", code=3))
    assert "has no camera ids (its input had none): the camera ids 'g_camids'" in line
    cli("append", out, tmp_path / "more.npz")
    store = open_store(out)
    assert not store.cameras and len(store.gallery) == NG and not store.gallery.camids[:].any()
    got = streameval.evaluate(out, protocol="none", max_rank=10).to_dict(per_query=True)
    want = streameval.evaluate(dict(arrays), protocol="none", max_rank=10).to_dict(per_query=True)
    assert {k: v for k, v in got.items() if k != "run"} == {k: v for k, v in want.items() if k != "run"}


def test_camera_ids_of_one_set_only_are_refused_as_missing(tmp_path, arrays):
    np.savez(tmp_path / "feats.npz", **{SHORT[k]: v for k, v in arrays.items() if k != "gallery_camids"})
    line = one_error_line(cli("convert", tmp_path / "feats.npz", tmp_path / "out.zarr", code=3))
    assert "input arrays lack 'gallery_camids' (or its short name 'g_camids')" in line
    assert not (tmp_path / "out.zarr").exists()


def test_torch_dict_of_tensors_arrays_and_lists(tmp_path, arrays, expected):
    torch = torch_or_skip()
    content = {"qf": torch.from_numpy(arrays["query_features"]), "gf": torch.from_numpy(arrays["gallery_features"]),
               "q_pids": arrays["query_pids"].tolist(), "g_pids": torch.from_numpy(arrays["gallery_pids"]),
               "q_camids": arrays["query_camids"], "g_camids": torch.from_numpy(arrays["gallery_camids"]),
               "epoch": 60}
    torch.save(content, tmp_path / "features.pt")
    out, _ = convert(tmp_path, tmp_path / "features.pt")
    assert comparable(out) == expected
    nested = {s: {"feature": torch.from_numpy(arrays[f"{s}_features"]), "label": torch.from_numpy(arrays[f"{s}_pids"]),
                  "cam": torch.from_numpy(arrays[f"{s}_camids"])} for s in ("query", "gallery")}
    torch.save(nested, tmp_path / "nested.pth")
    out.rename(tmp_path / "first.zarr")
    out, stderr = convert(tmp_path, tmp_path / "nested.pth")
    assert stderr.startswith("reading nested.pth (PyTorch, read whole): query/feature -> query features")
    assert comparable(out) == expected


def test_csv_ids_with_image_paths(tmp_path, arrays, expected):
    np.savez(tmp_path / "feats.npz", qf=arrays["query_features"], gf=arrays["gallery_features"])
    paths = {s: image_paths(s, n) for s, n in (("query", NQ), ("gallery", NG))}
    write_csv(tmp_path / "q.csv", arrays["query_pids"], arrays["query_camids"], paths["query"])
    write_csv(tmp_path / "g.csv", arrays["gallery_pids"], arrays["gallery_camids"], paths["gallery"],
              header=("Person ID", "Camera", "image_path"))
    out, stderr = convert(tmp_path, tmp_path / "feats.npz", "--query-ids", tmp_path / "q.csv",
                          "--gallery-ids", tmp_path / "g.csv")
    assert stderr.strip().endswith("q.csv -> query pids, camids, paths, g.csv -> gallery pids, camids, paths")
    assert comparable(out) == expected
    store = open_store(out)
    for set_name in ("query", "gallery"):
        assert read_paths(store, set_name, slice(None)) == paths[set_name]


def test_keys_name_what_no_convention_knows_and_settle_ambiguity(tmp_path, arrays, expected):
    odd = {"feat_q": arrays["query_features"], "feat_g": arrays["gallery_features"], "pid_q": arrays["query_pids"],
           "pid_g": arrays["gallery_pids"], "cam_q": arrays["query_camids"], "cam_g": arrays["gallery_camids"]}
    np.savez(tmp_path / "odd.npz", **odd)
    line = one_error_line(cli("convert", tmp_path / "odd.npz", tmp_path / "out.zarr", code=3))
    assert line == (f"error: '{tmp_path / 'odd.npz'}': input arrays lack 'query_features' (or its short name 'qf'), "
                    "'gallery_features' (or its short name 'gf'), 'query_pids' (or its short name 'q_pids'), "
                    "'query_camids' (or its short name 'q_camids'), 'gallery_pids' (or its short name 'g_pids'), "
                    "'gallery_camids' (or its short name 'g_camids'); it holds: cam_g (150,) int64, cam_q (24,) int64, "
                    "feat_g (150, 6) float32, feat_q (24, 6) float32, pid_g (150,) int64, pid_q (24,) int64; name them "
                    "with --key KEY=NAME (KEY: qf, gf, q_pids, q_camids, g_pids, g_camids)")
    keys = [a for k, v in (("qf", "feat_q"), ("gf", "feat_g"), ("q_pids", "pid_q"), ("g_pids", "pid_g"),
                           ("q_camids", "cam_q"), ("g_camids", "cam_g")) for a in ("--key", f"{k}={v}")]
    out, stderr = convert(tmp_path, tmp_path / "odd.npz", *keys)
    assert "feat_q -> query features" in stderr
    assert comparable(out) == expected

    both = {SHORT[k]: v for k, v in arrays.items()} | {"query_f": arrays["query_features"] + 1}
    np.savez(tmp_path / "both.npz", **both)
    line = one_error_line(cli("convert", tmp_path / "both.npz", tmp_path / "b.zarr", code=3))
    assert "'query_f' and 'qf' could each be the query features; choose with --key qf=NAME; it holds: " in line
    assert "query_f (24, 6) float32" in line
    out.rename(tmp_path / "first.zarr")
    out, _ = convert(tmp_path, tmp_path / "both.npz", "--key", "qf=qf")
    assert comparable(out) == expected


# ------------------------------------------------------------------------------------------ refusals


def test_wrong_or_ambiguous_files_are_one_line_and_exit_3(tmp_path, arrays):
    (tmp_path / "notes.mat").write_text("not matlab\n")
    (tmp_path / "notes.h5").write_text("not hdf5\n")
    (tmp_path / "notes.txt").write_text("hello\n")
    fraction = arrays["query_pids"].astype(np.float64)
    fraction[5] = 3.5
    write_layumi_mat(tmp_path / "fraction.mat", arrays, query_label=fraction)
    write_layumi_mat(tmp_path / "no_cams.mat", {k: v for k, v in arrays.items() if k != "gallery_camids"})
    np.savez(tmp_path / "feats.npz", qf=arrays["query_features"], gf=arrays["gallery_features"])
    write_csv(tmp_path / "bad.csv", ["1", "x"], ["0", "1"])
    write_csv(tmp_path / "short.csv", arrays["query_pids"][:5], arrays["query_camids"][:5])
    write_csv(tmp_path / "g.csv", arrays["gallery_pids"], arrays["gallery_camids"])
    (tmp_path / "nocam.csv").write_text("pid,frame\n1,2\n")
    cases = {
        "notes.mat": ([], "is not a MATLAB .mat file"),
        "notes.h5": ([], "as an HDF5 file"),
        "notes.txt": ([], "cannot tell its format from its extension '.txt'"),
        "fraction.mat": ([], "'query_label' row 5 holds 3.5, not an integer id"),
        "no_cams.mat": ([], "lack 'gallery_camids' (or its short name 'g_camids'); it holds: gallery_f (150, 6) "
                            "float32, gallery_label (1, 150) int64, query_cam (1, 24) int64"),
        "feats.npz": (["--query-ids", tmp_path / "bad.csv", "--gallery-ids", tmp_path / "g.csv"],
                      "bad.csv' line 3: pid 'x' is not an integer"),
        "feats.npz ": (["--query-ids", tmp_path / "short.csv", "--gallery-ids", tmp_path / "g.csv"],
                       "'short.csv:pid' has 5 entries but 'qf' has 24 rows"),
        "feats.npz  ": (["--query-ids", tmp_path / "nocam.csv", "--gallery-ids", tmp_path / "g.csv"],
                        "nocam.csv' has no camid column (its header line: pid,frame)"),
    }
    for name, (args, message) in cases.items():
        result = cli("convert", tmp_path / name.strip(), *args, tmp_path / "out.zarr", code=3)
        line = one_error_line(result)
        assert result.stderr.count("\n") == 1 and message in line, (name, line)
        assert not (tmp_path / "out.zarr").exists()


def test_bad_keys_are_option_errors(tmp_path, arrays):
    np.savez(tmp_path / "feats.npz", **{SHORT[k]: v for k, v in arrays.items()})
    for args, message in ((["--key", "qf=nothing"], "--key qf=nothing: '"), (["--key", "qf"], "--key expects KEY=NAME"),
                          (["--key", "feats=qf"], "KEY one of qf, gf, q_pids"),
                          (["--key", "dist=qf"], "--key dist=qf does not apply")):
        line = one_error_line(cli("convert", tmp_path / "feats.npz", tmp_path / "out.zarr", *args, code=2))
        assert message in line, line
    assert not (tmp_path / "out.zarr").exists()


def torch_or_skip():
    return pytest.importorskip("torch", reason="torch is not installed: scripts/test installs its CPU build where "
                                              "pip's find-links folder offers one (pyproject's torch extra)")


class Opens:
    """Unpickled, it would create ``path``: a stand-in for a file that runs code when loaded."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def test_torch_files_without_torch_say_how_to_get_it(tmp_path, monkeypatch):
    (tmp_path / "features.pt").write_bytes(b"anything")
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails, as where it is not installed
    line = one_error_line(cli("convert", tmp_path / "features.pt", tmp_path / "out.zarr", code=3))
    assert "needs torch, which is not installed: pip install torch" in line


def test_torch_files_run_no_code(tmp_path, arrays):
    torch = torch_or_skip()
    torch.save({"qf": torch.zeros(2, 3), "config": pytest.MonkeyPatch()}, tmp_path / "pickled.pt")
    line = one_error_line(cli("convert", tmp_path / "pickled.pt", tmp_path / "out.zarr", code=3))
    assert "holds a _pytest.monkeypatch.MonkeyPatch object" in line and "weights_only=True" in line


@pytest.mark.parametrize("how", ["torch.save", "pickle protocol 4"])
def test_a_malicious_torch_file_is_refused_in_one_line_without_torch_advice(tmp_path, how):
    """No code runs, and the one line never repeats torch's advice to load with weights_only=False
    (which would run the file's code); pickle's own opcodes come with a warning torch prints: not shown."""
    torch = torch_or_skip()
    marker, path = tmp_path / "ran", tmp_path / "evil.pt"
    if how == "torch.save":
        torch.save({"qf": torch.zeros(2, 3), "payload": Opens(marker)}, path)
    else:
        path.write_bytes(pickle.dumps({"qf": np.zeros((2, 3)), "payload": Opens(marker)}, protocol=4))
    result = cli("convert", path, tmp_path / "out.zarr", code=3)
    line = one_error_line(result)
    assert result.stderr == line + "\n", result.stderr
    assert ("holds a io.open object" if how == "torch.save" else "Unsupported operand") in line, line
    assert "weights_only=True" in line and "False" not in line and "trusted" not in line, line
    assert not marker.exists() and not (tmp_path / "out.zarr").exists()


def test_a_sparse_tensor_is_one_error_line(tmp_path):
    torch = torch_or_skip()
    path = tmp_path / "sparse.pt"
    torch.save({"qf": torch.eye(3).to_sparse(), "gf": torch.zeros(2, 3)}, path)
    line = one_error_line(cli("convert", path, tmp_path / "out.zarr", code=3))
    assert f"'{path}': qf is a sparse_coo tensor; save it dense (tensor.to_dense())" in line, line


# ------------------------------------------------------------------------------------------ matrices


def distance_matrix(arrays) -> np.ndarray:
    q, g = arrays["query_features"].astype(np.float64), arrays["gallery_features"].astype(np.float64)
    return ((q[:, None, :] - g[None, :, :]) ** 2).sum(axis=2)


@pytest.fixture(scope="module")
def expected_matrix(arrays, tmp_path_factory) -> dict:
    """A distance store written from the matrix in memory (the Python API)."""
    out = tmp_path_factory.mktemp("matrix") / "ref.zarr"
    write_distance_store(out, distance_matrix(arrays), arrays["query_pids"], arrays["query_camids"],
                         arrays["gallery_pids"], arrays["gallery_camids"], chunk_rows=16)
    return comparable(out)


def test_distance_matrix_npy_with_ids_from_the_feature_store(tmp_path, arrays, expected_matrix):
    np.savez(tmp_path / "feats.npz", **arrays)
    cli("convert", tmp_path / "feats.npz", tmp_path / "feats.zarr")
    np.save(tmp_path / "reranked.npy", distance_matrix(arrays))
    out, stderr = convert(tmp_path, tmp_path / "reranked.npy", "--distances", "--ids-from", tmp_path / "feats.zarr")
    assert "reranked -> query x gallery matrix, feats.zarr -> query pids, camids" in stderr
    assert comparable(out) == expected_matrix


def test_distance_matrix_npy_with_csv_ids_and_paths(tmp_path, arrays, expected_matrix):
    np.save(tmp_path / "dist.npy", distance_matrix(arrays))
    paths = {s: image_paths(s, n) for s, n in (("query", NQ), ("gallery", NG))}
    for s in ("query", "gallery"):
        write_csv(tmp_path / f"{s}.csv", arrays[f"{s}_pids"], arrays[f"{s}_camids"], paths[s])
    out, _ = convert(tmp_path, tmp_path / "dist.npy", "--distances", "--query-ids", tmp_path / "query.csv",
                     "--gallery-ids", tmp_path / "gallery.csv")
    assert comparable(out) == expected_matrix
    assert read_paths(open_store(out), "gallery", slice(None)) == paths["gallery"]


def test_distance_and_similarity_matrices_in_mat_and_h5_files(tmp_path, arrays, expected_matrix):
    ids = {SHORT[k]: v for k, v in arrays.items() if not k.endswith("features")}
    scipy.io.savemat(tmp_path / "dist.mat", {"distmat": distance_matrix(arrays), **ids})
    out, stderr = convert(tmp_path, tmp_path / "dist.mat", "--distances")
    assert stderr.startswith("reading dist.mat (MATLAB v5, read whole): distmat -> query x gallery matrix")
    assert comparable(out) == expected_matrix

    write_matlab_v73(tmp_path / "rerank.mat", {"q_g_dist": distance_matrix(arrays), **ids})
    out.rename(tmp_path / "v5.zarr")
    out, _ = convert(tmp_path, tmp_path / "rerank.mat", "--distances")
    assert comparable(out) == expected_matrix

    with h5py.File(tmp_path / "scores.h5", "w") as f:
        f.create_dataset("score", data=-distance_matrix(arrays), chunks=(5, 40))
        for key, value in ids.items():
            f[key] = value
    out.rename(tmp_path / "v73.zarr")
    out, _ = convert(tmp_path, tmp_path / "scores.h5", "--similarity")
    got = comparable(out)
    assert got["numbers"].pop("metric") == "similarity"
    assert got == {**expected_matrix, "numbers": {k: v for k, v in expected_matrix["numbers"].items() if k != "metric"}}


def test_a_matrix_file_without_a_known_matrix_says_what_it_holds(tmp_path, arrays):
    ids = {SHORT[k]: v for k, v in arrays.items() if not k.endswith("features")}
    scipy.io.savemat(tmp_path / "two.mat", {"a": distance_matrix(arrays), "b": distance_matrix(arrays), **ids})
    line = one_error_line(cli("convert", tmp_path / "two.mat", tmp_path / "out.zarr", "--distances", code=3))
    assert ("lack the query x gallery matrix (named e.g. distmat, dist_mat, dist, dists); it holds: a (24, 150) "
            "float64, b (24, 150) float64") in line
    assert line.endswith("name it with --key dist=NAME")
    scipy.io.savemat(tmp_path / "dist.mat", {"distmat": distance_matrix(arrays), **ids})
    line = one_error_line(cli("convert", tmp_path / "dist.mat", tmp_path / "out.zarr", "--similarity", code=3))
    assert "'distmat' is named as a distance matrix, but this conversion reads the other kind" in line
    assert not (tmp_path / "out.zarr").exists()


# ------------------------------------------------------------------------------------------ eval


def as_json(numbers: dict) -> dict:
    return json.loads(json.dumps(numbers))


def test_eval_converts_a_file_to_a_temporary_store(tmp_path, arrays, expected, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    write_layumi_mat(tmp_path / "pytorch_result.mat", arrays)
    told = cli("eval", tmp_path / "pytorch_result.mat", "--json", "-", "--max-rank", "10")
    assert told.stderr.splitlines()[0] == (
        f"'{tmp_path / 'pytorch_result.mat'}' is not a store: converted it to a temporary store (removed after the "
        "evaluation; --convert-to PATH keeps it); reading pytorch_result.mat (MATLAB v5, read whole): query_f -> query "
        "features, gallery_f -> gallery features, query_label -> query pids, query_cam -> query camids, gallery_label "
        "-> gallery pids, gallery_cam -> gallery camids")
    result = cli("eval", tmp_path / "pytorch_result.mat", "--json", "-", "--per-query", "-q", "--max-rank", "10")
    assert result.stderr == ""  # -q: not even the conversion's line
    got = json.loads(result.stdout)
    got.pop("run")
    assert got == as_json(expected["numbers"])
    assert list((tmp_path / "tmp").iterdir()) == []  # the temporary store is gone


def layumi_figures(arrays: dict, max_rank: int) -> tuple[np.ndarray, float]:
    """(CMC@1..max_rank, mAP) as layumi's evaluate_gpu.py computes them, in numpy: scores are dot
    products, a same-pid row from another camera is good, a same-pid same-camera row or a pid -1
    row is junk, the AP is the trapezoid one, and the sums are divided by every query (a query
    without a good row adds 0)."""
    qf, gf = arrays["query_features"].astype(np.float64), arrays["gallery_features"].astype(np.float64)
    gp, gc = arrays["gallery_pids"], arrays["gallery_camids"]
    cmc, ap_sum = np.zeros(len(gp)), 0.0
    for q in range(len(qf)):
        same_pid, same_cam = gp == arrays["query_pids"][q], gc == arrays["query_camids"][q]
        good, junk = same_pid & ~same_cam, (same_pid & same_cam) | (gp == -1)
        if not good.any():
            continue
        order = np.argsort(-(gf @ qf[q]), kind="stable")
        rows = np.flatnonzero(good[order[~junk[order]]])  # 0-based places of the good rows, junk removed
        cmc[rows[0]:] += 1
        j = np.arange(len(rows))
        before = np.where(rows == 0, 1.0, j / np.maximum(rows, 1))  # precision just before each good row
        ap_sum += np.mean((before + (j + 1) / (rows + 1)) / 2)
    return cmc[:max_rank] / len(qf), ap_sum / len(qf)


def test_denominator_zero_and_the_trapezoid_ap_give_layumis_figures(tmp_path, arrays):
    """What the README says of layumi's pytorch_result.mat: --denominator zero and mAP_trapezoid."""
    normalised = {**arrays, "query_pids": arrays["query_pids"].copy()}
    for name in ("query_features", "gallery_features"):
        normalised[name] = arrays[name] / np.linalg.norm(arrays[name], axis=1, keepdims=True)
    normalised["query_pids"][:4] = 50  # no gallery row: queries without a positive
    write_layumi_mat(tmp_path / "pytorch_result.mat", normalised)
    cmc, m_ap = layumi_figures(normalised, 10)
    results = {denominator: json.loads(cli("eval", tmp_path / "pytorch_result.mat", "--denominator", denominator,
                                            "--max-rank", "10", "--no-gom", "--json", "-", "-q").stdout)
               for denominator in ("zero", "skip")}
    zero, skip = results["zero"], results["skip"]
    assert zero["n_open_queries"] >= 4 and zero["n_queries"] == NQ
    np.testing.assert_allclose(zero["cmc"], cmc, rtol=1e-12)
    assert zero["mAP_trapezoid"] == pytest.approx(m_ap, rel=1e-12)
    assert skip["mAP_trapezoid"] == pytest.approx(m_ap * NQ / skip["n_valid_queries"], rel=1e-12)  # skip: over Q+


def test_eval_keeps_a_named_store_and_evaluates_a_matrix_file(tmp_path, arrays, expected, expected_matrix):
    folder = tmp_path / "features"
    folder.mkdir()
    for key, value in arrays.items():
        np.save(folder / f"{SHORT[key]}.npy", value)
    kept = tmp_path / "kept.zarr"
    result = cli("eval", folder, "--convert-to", kept, "--json", "-", "--per-query", "--max-rank", "10")
    assert result.stderr.startswith(f"'{folder}' is not a store: converted it to the store '{kept}'; reading features "
                                    "(.npy, memory-mapped): qf -> query features")
    got = json.loads(result.stdout)
    got.pop("run")
    assert got == as_json(expected["numbers"])
    assert comparable(kept) == expected

    np.save(tmp_path / "reranked.npy", distance_matrix(arrays))
    result = cli("eval", tmp_path / "reranked.npy", "--distances", "--ids-from", kept, "--json", "-", "--per-query",
                 "-q", "--max-rank", "10")
    got = json.loads(result.stdout)
    got.pop("run")
    assert got == as_json(expected_matrix["numbers"])


def test_eval_refusals_come_before_any_work(tmp_path, arrays, expected, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    write_layumi_mat(tmp_path / "pytorch_result.mat", arrays)
    fraction = arrays["gallery_pids"].astype(np.float64) + 0.25
    write_layumi_mat(tmp_path / "fraction.mat", arrays, gallery_label=fraction)
    (tmp_path / "notes.txt").write_text("hello\n")
    (tmp_path / "taken.zarr").mkdir()
    np.savez(tmp_path / "feats.npz", **arrays)
    cli("convert", tmp_path / "feats.npz", tmp_path / "feats.zarr")
    cases = [
        (["pytorch_result.mat", "--state", "state"], 2, "add --convert-to PATH to keep it"),
        (["pytorch_result.mat", "--convert-to", "taken.zarr"], 2, "already exists; pass --overwrite"),
        (["feats.zarr", "--key", "qf=x"], 2, "is a store: --convert-to, --key"),
        (["notes.txt"], 3, "it evaluates zarr stores and converts .npz, .npy"),
        (["fraction.mat"], 3, "'gallery_label' row 0 holds"),
    ]
    for args, code, message in cases:
        result = cli("eval", tmp_path / args[0], *(tmp_path / a if a in ("state", "taken.zarr") else a
                                                   for a in args[1:]), "-q", code=code)
        assert result.stderr.count("\n") == 1 and message in one_error_line(result), (args, result.stderr)
    assert list((tmp_path / "tmp").iterdir()) == [] and not (tmp_path / "state").exists()
    assert list((tmp_path / "taken.zarr").iterdir()) == []


@pytest.mark.parametrize("module, file, package", [("scipy.io", "f.mat", "scipy"), ("h5py", "f.h5", "h5py")])
def test_missing_optional_libraries_say_how_to_get_them(tmp_path, monkeypatch, module, file, package):
    (tmp_path / file).write_bytes(b"anything")
    monkeypatch.setitem(sys.modules, module, None)
    line = one_error_line(cli("convert", tmp_path / file, tmp_path / "out.zarr", code=3))
    assert f"needs {package}, which is not installed: pip install {package}" in line
