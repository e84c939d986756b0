"""What users install is what CI tests.

The wheel built from this checkout holds the package and only the package, every module of it.
Installed with its dependencies into a fresh venv outside the tree, on each Python from 3.11 to
3.13 this machine has, and run from another folder (so the checkout cannot be imported): every
module imports, and the commands a new user tries first work -- ``--help``, ``synth``, ``eval``
(with ``--ci`` and ``--per-query-out``), ``compare``, ``suite`` and ``plot``, and in Python the
``Evaluator`` and the torchreid adapter.  Without the plot extra, ``plot`` is one error line naming what to install;
without torch (the gpu extra), so is ``eval --device cuda``.

Slow (a venv and pip per Python: about a minute each once pip's cache holds the dependencies);
scripts/test, and so CI, runs it with the rest.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PYTHONS = ("3.11", "3.12", "3.13")  # requires-python >=3.11 and the classifiers of pyproject.toml
PIP_TIMEOUT_S = 900  # the first install on a Python downloads numba, llvmlite, numpy, zarr, dask, matplotlib
COMMAND_TIMEOUT_S = 300  # numba compiles the kernels on their first call in a fresh environment
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

IMPORT_EVERY_MODULE = """
import importlib, json, pkgutil
import streameval

def fail(name):
    raise  # walk_packages would skip a package that fails to import

names = [found.name for found in pkgutil.walk_packages(streameval.__path__, "streameval.", onerror=fail)]
for name in names:
    importlib.import_module(name)
print(json.dumps({"file": streameval.__file__, "version": streameval.__version__, "modules": names}))
"""


EVALUATOR_AND_ADAPTER = """
import numpy as np, streameval
from streameval.compat.torchreid import evaluate_rank
store = streameval.open_store("tiny.zarr")
q, g = (store.query, store.gallery)
qf, qp, qc, gf, gp, gc = (np.asarray(a[:]) for a in (q.features, q.pids, q.camids, g.features, g.pids, g.camids))
evaluator = streameval.Evaluator(buffer_budget=0)
evaluator.add_queries(qf, qp, qc)
for start in range(0, len(gp), 64):
    evaluator.add_gallery(gf[start:start + 64], gp[start:start + 64], gc[start:start + 64])
whole = streameval.evaluate(dict(qf=qf, q_pids=qp, q_camids=qc, gf=gf, g_pids=gp, g_camids=gc))
print("same" if evaluator.compute().mAP == whole.mAP else "differ")
distmat = ((qf[:, None, :].astype(np.float64) - gf[None, :, :]) ** 2).sum(-1)
cmc, mAP = evaluate_rank(distmat, qp, gp, qc, gc, max_rank=10)
print("same" if abs(mAP - streameval.evaluate(dict(distances=distmat, q_pids=qp, q_camids=qc, g_pids=gp, g_camids=gc),
                                                junk_pids=[]).mAP) < 1e-12 else "differ")
"""


def run(args, *, cwd: Path, timeout: float = COMMAND_TIMEOUT_S, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def succeeded(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, (done.args, done.stdout[-2000:], done.stderr[-4000:])
    return done


def checkout_modules() -> set[str]:
    """The dotted names of the checkout's modules and packages under streameval/ (the package itself aside)."""
    package = ROOT / "streameval"
    names = set()
    for path in package.rglob("*.py"):
        parts = path.relative_to(package).with_suffix("").parts
        names.add(".".join(("streameval", *(parts[:-1] if parts[-1] == "__init__" else parts))))
    return names - {"streameval"}


def find_python(version: str) -> str | None:
    """An interpreter of ``version`` that runs and can make a venv: on PATH, else in pyenv's folders
    (pyenv's shims are on PATH but answer only for the versions pyenv has made active)."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    installed = glob.glob(str(pyenv / "versions" / f"{version}.*" / "bin" / f"python{version}"))
    newest_first = sorted(installed, key=lambda path: [int(n) for n in re.findall(r"\d+", Path(path).parts[-3])],
                          reverse=True)
    for candidate in filter(None, [shutil.which(f"python{version}"), *newest_first]):
        probe = subprocess.run([candidate, "-c", "import sys, ensurepip, venv; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True, timeout=60)
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return candidate
    return None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of this checkout, built as a user would (pip, isolated build) from a copy of the files
    git sees: building in the tree would leave build/ there, whose stale files later wheels pick up."""
    listed = succeeded(run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT)).stdout
    source = tmp_path_factory.mktemp("source")
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():  # a tracked file deleted in the work tree is not built
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    succeeded(run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, source], cwd=out,
                  timeout=PIP_TIMEOUT_S))
    (built,) = out.glob("streameval-*.whl")
    return built


def wheel_version(wheel: Path) -> str:
    return wheel.name.split("-")[1]


def test_the_wheel_holds_every_module_of_the_package_and_nothing_else(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = f"streameval-{wheel_version(wheel)}.dist-info"
        metadata = archive.read(f"{info}/METADATA").decode()
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    assert {name.split("/")[0] for name in names} == {"streameval", info}  # no tests/, scripts/, docs/
    modules = {".".join(Path(name).with_suffix("").parts) for name in names if name.endswith(".py")}
    assert {name.removesuffix(".__init__") for name in modules} - {"streameval"} == checkout_modules()
    assert "Requires-Python: >=3.11" in metadata
    for version in PYTHONS:
        assert f"Classifier: Programming Language :: Python :: {version}" in metadata
    assert re.search(r"^streameval = streameval\.entry:main$", entry_points, re.M)


@pytest.fixture
def venv(tmp_path):
    """Where the venv goes; removed afterwards (half a gigabyte with matplotlib, numba and its cache)."""
    yield tmp_path / "venv"
    shutil.rmtree(tmp_path / "venv", ignore_errors=True)


@pytest.mark.parametrize("version", PYTHONS)
def test_the_installed_wheel_runs_from_any_folder(wheel, venv, tmp_path, version):
    python = find_python(version)
    if python is None:
        pytest.skip(f"no python{version} on this machine")
    work = tmp_path / "work"
    work.mkdir()
    assert ROOT not in venv.parents and ROOT not in work.parents
    succeeded(run([python, "-m", "venv", venv], cwd=work, timeout=120))
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-compile"]  # bytecode of what is imported only
    succeeded(run([*pip, wheel], cwd=work, env=env, timeout=PIP_TIMEOUT_S))  # no extra: plot refuses, below

    imported = json.loads(succeeded(run([venv / "bin" / "python", "-c", IMPORT_EVERY_MODULE], cwd=work, env=env)).stdout)
    assert Path(imported["file"]).is_relative_to(venv)  # the installed copy, not the checkout
    assert set(imported["modules"]) == checkout_modules()
    assert imported["version"] == wheel_version(wheel)

    def streameval(*args, code=0):
        done = run([venv / "bin" / "streameval", *args], cwd=work, env=env)
        assert done.returncode == code, (args, done.returncode, done.stdout[-2000:], done.stderr[-4000:])
        assert "Traceback" not in done.stderr
        return done

    assert "Usage: streameval" in streameval("--help").stdout
    assert wheel_version(wheel) in streameval("--version").stdout
    streameval("synth", "tiny.zarr", "--queries", "30", "--gallery", "200", "--dim", "16", "--ids", "20", "-q")
    streameval("eval", "tiny.zarr", "--json", "result.json", "-q")
    result = json.loads((work / "result.json").read_text())
    assert 0 <= result["mAP"] <= 1 and 0 <= result["rank1"] <= 1 and result["n_queries"] == 30
    assert result["streameval_version"] == wheel_version(wheel)
    # a float16 store (as big galleries are kept): its features upcast by the installed store.halfs
    streameval("synth", "half.zarr", "--queries", "30", "--gallery", "200", "--dim", "16", "--ids", "20",
               "--dtype", "float16", "-q")
    streameval("eval", "half.zarr", "--json", "half.json", "-q")
    assert json.loads((work / "half.json").read_text())["n_queries"] == 30

    # issue 27's commands: intervals, the per-query table, compare; the Evaluator and an adapter in Python
    streameval("eval", "tiny.zarr", "--per-query", "--ci", "0.9", "--ci-resamples", "200", "--json", "a.json",
               "--per-query-out", "queries.csv", "-q")
    assert set(json.loads((work / "a.json").read_text())["ci"]["intervals"]) >= {"mAP", "rank1"}
    assert len((work / "queries.csv").read_text().splitlines()) == 1 + 30
    streameval("eval", "tiny.zarr", "--per-query", "--json", "b.json", "-q")
    assert "| a (baseline) |" in streameval("compare", "a.json", "b.json", "--resamples", "200").stdout
    evaluated = succeeded(run([venv / "bin" / "python", "-c", EVALUATOR_AND_ADAPTER], cwd=work, env=env)).stdout
    assert evaluated.split() == ["same", "same"], evaluated

    refused = streameval("plot", "result.json", "curves.png", code=2)
    assert refused.stderr.splitlines() == [refused.stderr.strip()]  # one line
    assert refused.stderr.startswith("error: streameval plot needs matplotlib, which is not installed: "
                                     "pip install matplotlib (the 'plot' extra")
    assert not (work / "curves.png").exists()
    no_torch = streameval("eval", "tiny.zarr", "--device", "cuda", "-q", code=4)  # torch: the gpu extra
    assert no_torch.stderr.splitlines() == [no_torch.stderr.strip()]
    assert no_torch.stderr.startswith("error: --device (the GPU path) needs torch, which is not installed: "
                                      "pip install torch (the 'gpu' extra")

    succeeded(run([*pip, f"{wheel}[plot]"], cwd=work, env=env, timeout=PIP_TIMEOUT_S))
    streameval("plot", "result.json", "curves.png")
    assert (work / "curves.png").read_bytes().startswith(PNG_SIGNATURE)

    streameval("synth", "variants.zarr", "--queries", "30", "--gallery", "200", "--dim", "16", "--ids", "20",
               "--variants", "cil-factorial", "--variant-trials", "2", "-q")
    streameval("suite", "variants.zarr", "cil-factorial", "--trials", "2", "--json", "suite.json", "--plot", "suite.png",
               "-q")
    suite = json.loads((work / "suite.json").read_text())["suite"]
    assert set(suite["settings"]) == {"clean", "query", "gallery", "both"}
    assert all(0 <= setting["mean"]["mAP"] <= 1 for setting in suite["settings"].values())
    assert (work / "suite.png").read_bytes().startswith(PNG_SIGNATURE)
