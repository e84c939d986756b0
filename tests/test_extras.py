"""A command that needs a library of a missing extra (plot: matplotlib, distributed, io: scipy and
h5py) stops before any work with one error line: what needs it, and the commands that install it,
from a wheel or a plain ``pip install`` and from the clone.  The exit code is the command's for
that kind of failure: 2 for what was asked (a plot), 4 for a cluster, 3 for a file to read
(tests/test_readers.py).  tests/test_wheel.py checks ``plot`` in a venv that truly lacks matplotlib."""

from __future__ import annotations

import json
import sys

import pytest

from streameval.tools.synth import synthesize

from cli_checks import cli, one_error_line


def hint(purpose: str, package: str, extra: str) -> str:
    return (f"error: {purpose} needs {package}, which is not installed: pip install {package} (the '{extra}' extra; "
            f"in the streameval clone: .venv/bin/pip install -e '.[{extra}]')")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("extras") / "s.zarr"
    synthesize(path, n_query=10, n_gallery=60, dim=4, n_ids=5, n_cams=2, progress=False)
    return path


@pytest.fixture
def no_matplotlib(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails, as where it is not installed


def test_plot_without_matplotlib_names_the_plot_extra(store, tmp_path, no_matplotlib):
    cli("eval", store, "-q", "--no-gom", "--json", tmp_path / "r.json")
    line = one_error_line(cli("plot", tmp_path / "r.json", tmp_path / "r.png", code=2))
    assert line == hint("streameval plot", "matplotlib", "plot")
    assert not (tmp_path / "r.png").exists()


def test_suite_plot_without_matplotlib_is_refused_before_the_suite_runs(tmp_path, no_matplotlib):
    refused = cli("suite", tmp_path / "absent.zarr", "cil-factorial", "--json", tmp_path / "s.json",
                  "--plot", tmp_path / "s.png", code=2)  # refused before the store is opened
    assert one_error_line(refused) == hint("--plot", "matplotlib", "plot")
    assert list(tmp_path.iterdir()) == []


def test_show_png_without_matplotlib_names_the_plot_extra(tmp_path, no_matplotlib):
    (tmp_path / "ranked.json").write_text(json.dumps({}))
    refused = cli("show", tmp_path / "ranked.json", "--png", tmp_path / "grids", code=2)
    assert one_error_line(refused) == hint("--png", "matplotlib", "plot")
    assert not (tmp_path / "grids").exists() and not (tmp_path / "ranked.html").exists()


def test_a_cluster_without_distributed_names_the_distributed_extra(store, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)
    refused = cli("eval", store, "-q", "--cluster", "local", "--json", tmp_path / "r.json", code=4)
    assert one_error_line(refused) == hint("running on a Dask cluster", "distributed", "distributed")
    assert not (tmp_path / "r.json").exists()
