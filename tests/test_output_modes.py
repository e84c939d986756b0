"""Every output follows the umask, as any file a program writes: mode 0o666 & ~umask for files and
0o777 & ~umask for folders, although each is written beside its name and renamed into place."""

from __future__ import annotations

import os
import stat
from contextlib import contextmanager

import pytest

from cli_checks import cli

SYNTH = ("--queries", 8, "--gallery", 40, "--dim", 4, "--ids", 5, "--cams", 2, "--chunk-rows", 16, "-q")


@contextmanager
def umask(mask: int):
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def modes_under(folder) -> dict:
    """Mode of the folder and of everything below it, by path relative to it."""
    found = {".": mode(folder)}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            found[os.path.relpath(path, folder)] = mode(path)
    return found


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002])
def test_results_ranked_lists_pages_and_states_follow_the_umask(tmp_path, mask):
    cli("synth", tmp_path / "s.zarr", *SYNTH)
    file_mode, folder_mode = 0o666 & ~mask, 0o777 & ~mask
    with umask(mask):
        cli("eval", tmp_path / "s.zarr", "-q", "--no-gom", "--ranked-list", 3, "--json", tmp_path / "out.json",
            "--state", tmp_path / "state")
        cli("eval", tmp_path / "s.zarr", "-q", "--no-gom", "--ranked-list", 3, "--ranked-out", tmp_path / "lists.zarr")
        cli("show", tmp_path / "out.json", "--out", tmp_path / "page.html")
        cli("eval", tmp_path / "s.zarr", "-q", "--no-gom", "--json", tmp_path / "out.json", "--overwrite")
    for written in ("out.json", "out.ranked.jsonl", "page.html"):
        assert mode(tmp_path / written) == file_mode, written
    for name in ("lists.zarr", "state"):
        for path, got in modes_under(tmp_path / name).items():
            want = folder_mode if os.path.isdir(tmp_path / name / path) else file_mode
            assert got == want, (name, path, oct(got))
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".streameval-")]  # no temporary left behind
