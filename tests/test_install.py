"""The install story (issue 10 item 6): scripts/demo and scripts/test run pip only when pyproject.toml
or the requested extras changed, and hints name a command that works from a clone."""

from __future__ import annotations

import hashlib
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
STAMP = pathlib.Path(sys.prefix) / ".streameval-install"


def bash(script: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f"source '{ROOT}/scripts/_venv.sh'; {script}"], capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", **env}, timeout=120)


def install_wanted(stamp: pathlib.Path, extras: str) -> subprocess.CompletedProcess:
    return bash(f"_install_wanted '{sys.executable}' '{ROOT}' '{stamp}' '{extras}'")


def digest() -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()


def test_a_stamp_of_this_pyproject_covering_the_extras_means_no_install(tmp_path):
    stamp = tmp_path / "stamp"
    stamp.write_text(f"{digest()} distributed,plot,test\n")
    for extras in ("plot", "test,plot,distributed", "plot,distributed"):
        done = install_wanted(stamp, extras)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [digest(), "distributed,plot,test"]


def test_new_extras_or_a_changed_pyproject_ask_for_an_install(tmp_path):
    stamp = tmp_path / "stamp"
    stamp.write_text(f"{digest()} plot\n")
    more = install_wanted(stamp, "test")
    assert more.returncode == 1 and more.stdout.split() == [digest(), "plot,test"]  # installed together
    stamp.write_text(f"{'0' * 64} plot,test\n")
    changed = install_wanted(stamp, "plot")
    assert changed.returncode == 1 and changed.stdout.split() == [digest(), "plot"]
    missing = install_wanted(tmp_path / "no-stamp", "plot")
    assert missing.returncode == 1


@pytest.mark.skipif(not STAMP.exists(), reason="this venv was not set up by scripts/test (no install stamp)")
def test_a_second_set_up_is_silent_and_runs_no_pip():
    """What every scripts/test and scripts/demo run after the first does: nothing, quietly."""
    done = bash("ensure_venv plot,distributed && echo ready", STREAMEVAL_VENV=sys.prefix)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ready" and done.stderr == ""


def test_hints_name_a_command_that_works_from_a_clone():
    sources = "\n".join(path.read_text() for path in (ROOT / "streameval").rglob("*.py"))
    assert "pip install 'streameval[" not in sources
    assert ".venv/bin/pip install -e '.[distributed]'" in sources and ".venv/bin/pip install -e '.[plot]'" in sources


def test_the_torch_cpu_wheel_is_found_in_pips_find_links(tmp_path):
    """scripts/test installs torch's CPU build from a find-links folder (the CUDA build from the index
    is gigabytes): the newest CPU wheel for this Python is picked, and nothing without one."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    for name in (f"torch-2.9.0+cpu-{tag}-{tag}-manylinux_2_28_x86_64.whl",
                 f"torch-2.10.1+cpu-{tag}-{tag}-manylinux_2_28_x86_64.whl",
                 "torch-9.0.0+cpu-cp27-cp27-manylinux_2_28_x86_64.whl",  # another Python
                 f"torch-9.0.0-{tag}-{tag}-manylinux_2_28_x86_64.whl"):  # a CUDA build
        (tmp_path / name).touch()
    isolated = {"PIP_CONFIG_FILE": "/dev/null", "PIP_FIND_LINKS": f"file://{tmp_path}"}
    found = bash(f"_cpu_torch_version '{sys.executable}'", **isolated)
    assert found.returncode == 0 and found.stdout == "2.10.1+cpu\n", found.stderr
    none = bash(f"_cpu_torch_version '{sys.executable}'", **{**isolated, "PIP_FIND_LINKS": str(tmp_path / "empty")})
    assert none.returncode == 0 and none.stdout == "", none.stderr
