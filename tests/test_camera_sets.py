"""A protocol whose camera sets keep under half of the queries or of the gallery rows says so:
SYSU's cameras are 1-6 (docs/protocols.md#sysu-all-sysu-indoor: infrared queries from cameras 3 and 6, a visible
gallery from 1, 2, 4, 5), so a store numbering them 0-5 silently lost most queries.  The warning is
a ``warning:`` line on stderr (with -q too), a line of the summary and the result's ``warnings``."""

from __future__ import annotations

import json

import numpy as np
import pytest

import streameval

from cli_checks import cli

N_QUERY, N_GALLERY, N_IDS = 30, 60, 6


def sysu_like(tmp_path, first_camera: int):
    """SYSU's cameras numbered from ``first_camera``: infrared queries (SYSU 3 and 6, and some of
    camera 2, which sysu-all does not query) and a visible gallery (SYSU 1, 2, 4, 5, camera 1 twice)."""
    rng = np.random.default_rng(3)
    q_pid, g_pid = np.arange(N_QUERY) % N_IDS, np.arange(N_GALLERY) % N_IDS
    q_cam = np.array([3, 6, 3, 6, 2])[np.arange(N_QUERY) % 5] - 1 + first_camera
    g_cam = np.array([1, 1, 2, 4, 5, 1])[np.arange(N_GALLERY) % 6] - 1 + first_camera
    qf = (np.eye(N_IDS)[q_pid] + 0.3 * rng.standard_normal((N_QUERY, N_IDS))).astype(np.float32)
    gf = (np.eye(N_IDS)[g_pid] + 0.3 * rng.standard_normal((N_GALLERY, N_IDS))).astype(np.float32)
    path = tmp_path / f"from{first_camera}.zarr"
    streameval.write_store(path, qf, q_pid, q_cam, gf, g_pid, g_cam)
    return path, q_cam, g_cam


def test_zero_based_cameras_under_sysu_are_said_loudly_with_counts_and_cameras(tmp_path):
    store, q_cam, g_cam = sysu_like(tmp_path, first_camera=0)
    kept_queries = int(np.isin(q_cam, (3, 6)).sum())  # none: SYSU's 3 and 6 are stored as 2 and 5
    kept_gallery = int(np.isin(g_cam, (1, 2, 4, 5)).sum())  # SYSU's 2 and 5 (stored as 1 and 4), not its 1 and 4
    assert kept_queries == 0 and 2 * kept_gallery < N_GALLERY
    from_one = {"queries": int(np.isin(q_cam + 1, (3, 6)).sum()), "gallery": N_GALLERY}
    want = [f"protocol 'sysu-all' keeps 0 of {N_QUERY} queries: its query_cameras are 3, 6, but the store's queries "
            f"have cameras 1, 2, 5; counted from 1, the store's camera ids would keep {from_one['queries']} (are they "
            "0-based?)",
            f"protocol 'sysu-all' keeps {kept_gallery} of {N_GALLERY} gallery rows: its gallery_cameras are 1, 2, 4, "
            "5, but the store's gallery rows have cameras 0, 1, 3, 4; counted from 1, the store's camera ids would "
            f"keep {from_one['gallery']} (are they 0-based?)"]
    result = cli("eval", store, "--protocol", "sysu-all", "--no-gom", "--json", tmp_path / "r.json")
    assert [line for line in result.stderr.splitlines() if line.startswith("warning:")] == \
        [f"warning: {w}" for w in want]
    assert all(f"  warning: {w}" in result.stdout.splitlines() for w in want)  # in the summary
    assert json.loads((tmp_path / "r.json").read_text())["warnings"] == want
    quiet = cli("eval", store, "--protocol", "sysu-all", "--no-gom", "-q")
    assert quiet.stdout == "" and quiet.stderr.splitlines() == [f"warning: {w}" for w in want]
    assert streameval.evaluate(store, protocol="sysu-all", no_gom=True).warnings == want


@pytest.mark.parametrize("protocol", ["sysu-all", "market"])
def test_cameras_the_protocol_expects_or_no_camera_set_give_no_warning(tmp_path, protocol):
    store, q_cam, _ = sysu_like(tmp_path, first_camera=1)
    assert np.isin(q_cam, (3, 6)).mean() > 0.5  # 1-based: only the camera-2 queries are left out
    result = cli("eval", store, "--protocol", protocol, "--no-gom", "--json", "-", "-q")
    assert "warning" not in result.stderr and "warnings" not in json.loads(result.stdout)
