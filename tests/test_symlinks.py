"""No write follows a symbolic link: a store with a link inside is not written to (its link's target
would be), and an output whose path is a link replaces the link, never its target.  Real links,
real stores, the real command line."""

from __future__ import annotations

import os

import numpy as np
import pytest

import streameval
from streameval.store import open_store

from cli_checks import cli, one_error_line


def make_store(path, n_gallery: int = 40, seed: int = 0):
    rng = np.random.default_rng(seed)
    qf, gf = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((n_gallery, 4)).astype(np.float32)
    qp, gp = np.arange(8) % 4 + 1, np.arange(n_gallery) % 4 + 1
    return streameval.write_store(path, qf, qp, np.zeros(8, int), gf, gp, np.ones(n_gallery, int), chunk_rows=10)


def tree(path) -> dict:
    """Every file under ``path`` (links not followed) and its bytes."""
    out = {}
    for folder, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(folder, name), "rb") as fh:
                out[os.path.relpath(os.path.join(folder, name), path)] = fh.read()
    return out


def test_append_refuses_a_store_whose_array_is_a_link_to_another_store(tmp_path):
    mine, other = tmp_path / "mine.zarr", tmp_path / "other.zarr"
    make_store(mine)
    make_store(other, seed=1)
    os.rename(mine / "gallery" / "features", tmp_path / "moved")
    (mine / "gallery" / "features").symlink_to(other / "gallery" / "features")
    before_other, before_mine = tree(other), tree(mine)
    rng = np.random.default_rng(2)
    np.savez(tmp_path / "a.npz", gf=rng.standard_normal((15, 4)).astype(np.float32), g_pids=np.ones(15, int),
             g_camids=np.ones(15, int))
    line = one_error_line(cli("append", mine, tmp_path / "a.npz", code=3))
    assert line == (f"error: '{mine}': gallery/features is a symbolic link (to '{other / 'gallery' / 'features'}'), "
                    "and streameval writes nothing through a link out of a store; put a copy in its place (cp -rL) "
                    "to write to this store")
    assert tree(other) == before_other and tree(mine) == before_mine
    with pytest.raises(streameval.StoreError, match="gallery/features is a symbolic link"):
        streameval.append_gallery(mine, rng.standard_normal((5, 4)), np.ones(5, int), np.ones(5, int))
    assert tree(other) == before_other


def test_variants_add_refuses_a_linked_variants_group(tmp_path):
    store, outside = tmp_path / "s.zarr", tmp_path / "outside"
    make_store(store)
    outside.mkdir()
    (store / "query" / "variants").symlink_to(outside)
    np.save(tmp_path / "v.npy", np.ones((8, 4), np.float32))
    line = one_error_line(cli("variants", store, "--add", f"query:blur={tmp_path / 'v.npy'}", code=3))
    assert line.startswith(f"error: '{store}': query/variants is a symbolic link (to '{outside}')"), line
    assert os.listdir(outside) == []


def test_plot_over_a_link_replaces_the_link_not_its_target(tmp_path):
    store = tmp_path / "s.zarr"
    make_store(store)
    cli("eval", store, "--json", tmp_path / "r.json", "--no-gom", "--workers", "1", "-q")
    target, link = tmp_path / "target.png", tmp_path / "link.png"
    target.write_bytes(b"the user's own picture")
    link.symlink_to(target)
    cli("plot", tmp_path / "r.json", "--out", link, "--overwrite")
    assert target.read_bytes() == b"the user's own picture"
    assert not link.is_symlink() and link.read_bytes().startswith(b"\x89PNG")


def test_synth_images_over_links_replace_the_links(tmp_path):
    images, target = tmp_path / "images", tmp_path / "mine.png"
    (images / "gallery").mkdir(parents=True)
    target.write_bytes(b"keep")
    (images / "gallery" / "000000.png").symlink_to(target)
    cli("synth", tmp_path / "s.zarr", "--queries", 3, "--gallery", 5, "--dim", 4, "--images", images, "--overwrite",
        "-q")
    assert target.read_bytes() == b"keep"
    assert not (images / "gallery" / "000000.png").is_symlink()
    assert len(open_store(tmp_path / "s.zarr").gallery) == 5
