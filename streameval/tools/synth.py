"""Synthetic ReID-like stores, written chunk by chunk.

The model, per image (all vectors ``dim``-dimensional, standard normal unless said otherwise)::

    signal  = centre[identity] + camera_offset[camera]
    feature = (quality * signal + noise_scale * noise) * norm(quality)

* ``centre``: one vector per identity.  Identities come in appearance groups of ``GROUP_SIZE``
  (pids 1-4, 5-8, ...) sharing a component that carries ``GROUP_WEIGHT`` of the variance: every
  identity has a few look-alikes, the hard negatives that keep rank-1 below 100%.  Open-set queries
  (pids ``n_ids+1..``, never in the gallery) have centres of their own, built the same way.
  Distractors (pid 0) and junk (pid -1) draw a fresh centre per image: they belong to no identity.
* ``camera_offset``: one vector per camera, ``CAMERA_SCALE`` times standard normal, shared by every
  image of the camera: the camera bias that makes cross-camera matching (the market protocol) hard.
* ``quality``: a per-image log-normal factor (median 1, spread ``QUALITY_SIGMA``) on the identity
  signal, and ``norm(quality)`` the factor that brings every image back to the same expected norm
  (so a poor image carries less identity, rather than sitting closer to or farther from everything).
* ``noise``: independent per image, scaled by ``noise * noise_scale(dim)``.  The argument ``noise``
  (default 1) sets how weak the model is: it scales the per-image noise against the identity
  signal.  At 1 the problem is the one described below; larger values push positives deeper down
  the ranked lists: ``NOISE_HARD`` puts the Market-sized problem at about rank-1 85%, mAP 53%, mINP
  7%, a query's last positive at rank ~570 (median; 10% of the queries beyond ~2,600).  1 keeps
  every store written before the argument existed byte-identical.

Distances between random vectors concentrate as the dimension grows: the identity signal in a
squared distance grows like ``dim`` while the noise's spread grows like ``noise_scale**2 *
sqrt(dim)``.  The noise scale therefore grows with the dimension (``dim ** NOISE_DIM_EXPONENT``,
slightly above 1/4, found empirically) so the metrics stay roughly the same at any dimension.  The
constants put the Market-1501-sized problem (3,368 queries, 19,732 gallery images, 2,048 dims, 750
identities, 6 cameras, euclidean) at about rank-1 95%, mAP 83%, mINP 50%: a strong but imperfect
model.  More gallery images or distractors make the problem harder, as with real data.

Randomness is drawn per fixed-size *generation block* of rows, each from its own seed derived from
``(seed, set, block index)``, and the block size depends only on the dimension.  So the store's
contents depend only on ``seed`` and the arguments, not on ``chunk_rows`` (the storage chunking),
and memory is bounded by a chunk plus a block plus the identity centres (``n_ids x dim``).

With ``images``, every row also gets a small PNG (a figure whose clothes are coloured by its pid, on
a background tinted by its camera; junk grey, distractors coloured by their row), written a chunk at
a time into ``images/query`` and ``images/gallery``, and its path in the store (``store.paths``),
so ``streameval show`` has something to draw.

Variants (``variants="cil-factorial"`` or ``"cil-upstream"``): after the clean store, the preset's
query and gallery variants (``suite.plan.preset_variants``), each a corruption-like copy of
the written features, as CIL-ReID corrupts every image: per row a corruption type (``CORRUPTIONS``:
gaussian noise, dropout of dimensions, contrast towards the row's mean, a shift along one direction
shared by the variant's rows, quantisation) and a severity 1..``MAX_SEVERITY``, drawn uniformly; the
perturbation grows linearly with the severity, is scaled by the row's RMS, and the row is brought
back to its clean norm (a corrupted gallery row is no nearer to every query).  Randomness comes per
generation block from ``(seed, set, variant name, block)``, so a variant does not depend on the
chunking or on the other variants.  On the default model every setting loses: mAP clean > query
corrupted > gallery corrupted > both (about 0.83, 0.70-0.75, 0.65, 0.50-0.56).
"""

from __future__ import annotations

import collections
import colorsys
import concurrent.futures
import contextlib
import itertools
import math
import os
import shutil
import struct
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np

from ..engine import plan
from .. import store as store_mod
from ..core.choices import check_range
from ..core.errors import OptionError
from ..core.outputs import replace_file
from ..store import Store
from ..store.paths import complete_paths, create_paths, write_path_rows

NOISE_SCALE = 2.0  # at dim REFERENCE_DIM; scaled by (dim / REFERENCE_DIM) ** NOISE_DIM_EXPONENT
CAMERA_SCALE = 0.5
QUALITY_SIGMA = 0.1  # log-normal spread of the per-image signal factor
GROUP_SIZE = 4  # identities per appearance group
GROUP_WEIGHT = 0.6  # share of a centre's variance common to its group
REFERENCE_DIM = 2048
NOISE_DIM_EXPONENT = 0.3
NOISE_HARD = 1.4  # a weak model's noise (``noise``, module docstring): Market size at mAP ~53%
GENERATION_BLOCK_BYTES = 1 << 20  # float32 features per generation block

# stream ids of the seed sequences (never change: they define the data)
_CENTRES, _OPEN_CENTRES, _CAMERAS, _QUERY, _GALLERY = range(5)
_VARIANT = 5

# corruption-like variants: type -> strength at the largest severity (module docstring, "Variants")
CORRUPTIONS = {"gaussian_noise": 1.5, "dropout": 0.8, "contrast": 0.9, "shift": 1.5, "quantize": 3.0}
MAX_SEVERITY = 5


def noise_scale(dim: int) -> float:
    return NOISE_SCALE * (dim / REFERENCE_DIM) ** NOISE_DIM_EXPONENT


def generation_block_rows(dim: int) -> int:
    """Rows per generation block: about 1 MiB of float32, a power of two in [256, 65536]."""
    return plan.default_chunk_rows(dim, 4, GENERATION_BLOCK_BYTES)


def open_identity_count(n_query: int, n_ids: int, open_query_frac: float) -> int:
    """Identities reserved for open-set queries: about as many queries per identity as closed ones."""
    if open_query_frac <= 0:
        return 0
    return max(1, math.ceil(open_query_frac * min(n_ids, n_query)))


def _rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed) % (1 << 64), *stream]))


def _check_args(n_query, n_gallery, dim, n_ids, n_cams, junk_frac, distractor_frac, open_query_frac, dtype, noise):
    for name, value in {"n_query": n_query, "n_gallery": n_gallery, "dim": dim, "n_ids": n_ids, "n_cams": n_cams,
                        "junk_frac": junk_frac, "distractor_frac": distractor_frac, "open_query_frac": open_query_frac,
                        "noise": noise}.items():
        check_range(value, name)
    if junk_frac + distractor_frac > 1.0:
        raise OptionError(f"junk_frac + distractor_frac must be at most 1, got {junk_frac} + {distractor_frac}")
    return store_mod.feature_dtype(dtype)


def _identity_centres(out: np.ndarray, rng: np.random.Generator) -> None:
    """Fill ``out`` (ids x dim) with unit-variance centres; consecutive runs of GROUP_SIZE
    identities share an appearance component (weight GROUP_WEIGHT of the variance)."""
    n, dim = out.shape
    groups = rng.standard_normal((-(-n // GROUP_SIZE), dim), dtype=np.float32)
    groups *= np.float32(math.sqrt(GROUP_WEIGHT))
    rng.standard_normal(dtype=np.float32, out=out)
    out *= np.float32(math.sqrt(1 - GROUP_WEIGHT))
    for member in range(GROUP_SIZE):  # the member-th identity of every group (in place: no copy of ``out``)
        rows = out[member::GROUP_SIZE]
        rows += groups[:len(rows)]


class _Blocks:
    """Rows made per generation block (cached: consecutive chunks reuse a straddling block)."""

    def __init__(self, dim: int):
        self.block_rows = generation_block_rows(dim)
        self._cached = (None, None)

    def block(self, index: int):
        if self._cached[0] != index:
            self._cached = (index, self.make_block(index))
        return self._cached[1]

    def rows(self, start: int, stop: int):
        parts = []
        for index in range(start // self.block_rows, (stop - 1) // self.block_rows + 1):
            b0 = index * self.block_rows
            lo, hi = max(start, b0) - b0, min(stop, b0 + self.block_rows) - b0
            parts.append(tuple(column[lo:hi] for column in self.block(index)))
        if len(parts) == 1:
            return parts[0]
        return tuple(np.concatenate(column) for column in zip(*parts))


class _Generator(_Blocks):
    """Rows of one set: features, pids, camids."""

    def __init__(self, seed, stream, n_rows, dim, make_ids, centres, cameras, sigma):
        super().__init__(dim)
        self.seed, self.stream, self.n_rows, self.dim = seed, stream, n_rows, dim
        self.make_ids, self.centres, self.cameras, self.sigma = make_ids, centres, cameras, sigma

    def make_block(self, index: int):
        start = index * self.block_rows
        n = min(self.block_rows, self.n_rows - start)
        rng = _rng(self.seed, self.stream, index)
        pids, centre_rows = self.make_ids(rng, n)  # centre_rows: index into centres, -1 = own centre
        camids = rng.integers(0, self.cameras.shape[0], size=n, dtype=np.int64)
        quality = np.exp(QUALITY_SIGMA * rng.standard_normal(n, dtype=np.float32))
        own = centre_rows < 0
        n_own = int(own.sum())
        feats = np.empty((n, self.dim), dtype=np.float32)
        if n_own:
            feats[own] = rng.standard_normal((n_own, self.dim), dtype=np.float32)
        if n_own < n:
            feats[~own] = self.centres[centre_rows[~own]]
        feats += self.cameras[camids]
        # signal weighted by quality, noise added, rows scaled back to a common expected norm
        feats *= quality[:, None]
        feats += self.sigma * rng.standard_normal((n, self.dim), dtype=np.float32)
        signal = 1 + CAMERA_SCALE**2
        feats *= np.sqrt((signal + self.sigma**2) / (quality**2 * signal + self.sigma**2))[:, None]
        return feats, pids, camids


class _Corrupted(_Blocks):
    """A corruption-like variant of a written set (module docstring, "Variants"): per row a random
    corruption type and severity, and the clean features perturbed accordingly."""

    def __init__(self, fs, seed: int, stream: int, name: str):
        super().__init__(fs.dim)
        self.fs = fs
        self.key = (seed, _VARIANT, stream, len(name), *name.encode())  # the variant's own streams
        self.direction = _rng(*self.key, 0).standard_normal(fs.dim, dtype=np.float32)  # "shift": one per variant

    def make_block(self, index: int):
        start = index * self.block_rows
        feats = store_mod.read_features(self.fs, slice(start, min(start + self.block_rows, len(self.fs))),
                                         np.float32)
        return corrupt(feats, _rng(*self.key, 1, index), self.direction)


def corrupt(feats: np.ndarray, rng: np.random.Generator, direction: np.ndarray):
    """(corrupted features, corruption types, severities) of float32 rows: each row gets a type of
    CORRUPTIONS and a severity 1..MAX_SEVERITY, uniformly; the perturbation grows with the severity
    and is scaled by the row's RMS, so it stays within a few times the clean values."""
    n, dim = feats.shape
    types = rng.integers(0, len(CORRUPTIONS), size=n).astype(np.int32)
    severity = rng.integers(1, MAX_SEVERITY + 1, size=n).astype(np.int32)
    noise = rng.standard_normal((n, dim), dtype=np.float32)
    kept = rng.random((n, dim), dtype=np.float32)
    strength = (severity / np.float32(MAX_SEVERITY)).astype(np.float32)[:, None]
    scale = np.sqrt(np.mean(np.square(feats), axis=1, keepdims=True))  # the row's RMS
    out = feats.copy()
    for kind, (name, weight) in enumerate(CORRUPTIONS.items()):
        rows = types == kind
        x, s, r = out[rows], weight * strength[rows], scale[rows]
        if name == "gaussian_noise":
            x += s * r * noise[rows]
        elif name == "dropout":  # a fraction s of the dimensions lost
            x *= kept[rows] >= s
        elif name == "contrast":  # values pulled towards the row's mean
            mean = x.mean(axis=1, keepdims=True)
            x = mean + (x - mean) * (1 - s)
        elif name == "shift":  # every such row moved the same way (a colour cast, fog)
            x += s * r * direction
        else:  # "quantize": values rounded to a coarse step
            x = np.round(x / (s * r)) * (s * r)
        out[rows] = x
    # back to each row's clean norm: a corrupted row is no nearer to everything (a hub in the gallery)
    norms = np.sqrt(np.sum(np.square(out), axis=1, keepdims=True))
    out *= np.divide(scale * np.float32(np.sqrt(dim)), norms, out=np.ones_like(norms), where=norms > 0)
    return out, types, severity


def check_room(path, n_query, n_gallery, dim, dtype, chunk_rows, overwrite) -> None:
    """Refuse a store larger than the free space of its file system (counting what ``overwrite``
    deletes first), before writing anything: a full disk would stop the writing halfway."""
    if not store_mod.is_local_path(path):
        return  # a zarr store object or a URL: no local file system to ask
    parent = os.path.abspath(path)
    while not os.path.isdir(parent):
        parent = os.path.dirname(parent)
    block = os.statvfs(parent).f_frsize if hasattr(os, "statvfs") else 4096
    need = store_mod.estimated_bytes(n_query, n_gallery, dim, dtype, chunk_rows, block)
    free = shutil.disk_usage(parent).free
    if overwrite and os.path.lexists(path):
        free += _size_on_disk(path)
    if need > free:
        raise OptionError(f"the store needs about {plan.format_bytes(need)} ({need:,} bytes) but the file system of "
                          f"'{parent}' has {plan.format_bytes(free)} ({free:,} bytes) free; free some space or make a "
                          "smaller store")


def _size_on_disk(path) -> int:
    if not os.path.isdir(path):
        return os.lstat(path).st_size
    return sum(os.lstat(os.path.join(root, name)).st_size for root, _, files in os.walk(path) for name in files)


def check_memory(n_query, n_gallery, dim, n_centres, n_cams, chunk_rows) -> None:
    """Refuse arguments whose resident arrays would not fit in half the physical memory: the
    identity centres and camera offsets (held throughout), a generation block and a store chunk
    with their temporaries.  Nothing else grows with the store."""
    physical = plan.physical_memory()
    if physical is None:
        return  # not a POSIX system: nothing to compare with
    rows = n_centres + n_cams + 4 * generation_block_rows(dim) + 3 * min(chunk_rows, max(n_query, n_gallery))
    need = rows * dim * 4
    if need > physical // 2:
        raise OptionError(f"synth needs about {plan.format_bytes(need)} of memory for {n_centres:,} identity centres "
                          f"and {n_cams:,} camera offsets of {dim:,} dims plus a chunk, more than half the physical "
                          f"memory ({plan.format_bytes(physical)}); use fewer ids, cameras or chunk rows, or fewer "
                          "dims")


IMAGE_HEIGHT, IMAGE_WIDTH = 64, 32  # a person crop's proportions
IMAGE_BYTES = 1024  # on disk per image, at most (a few hundred bytes of PNG, rounded up)
GOLDEN = 0.6180339887  # hue step: consecutive ids get well separated colours
SKIN = (224, 180, 150)


def _hsv(hue: float, saturation: float, value: float) -> np.ndarray:
    """One RGB colour (uint8) from hue, saturation and value in [0, 1]."""
    return np.round(255 * np.array(colorsys.hsv_to_rgb(hue, saturation, value))).astype(np.uint8)


def _clothes(pid: int, row: int) -> tuple[np.ndarray, np.ndarray]:
    """(top, trousers) colours: the top by appearance group (look-alikes dress alike, as their
    features are alike), the trousers by pid; grey for junk, by row for a distractor."""
    if pid < 0:
        return _hsv(0, 0, 0.55), _hsv(0, 0, 0.35)
    key = pid if pid > 0 else 7919 * row + 13
    group = (key - 1) // GROUP_SIZE
    return _hsv(group * GOLDEN % 1, 0.8, 0.9), _hsv((key * GOLDEN + 0.5) % 1, 0.6, 0.5)


def person_image(pid: int, camid: int, row: int) -> np.ndarray:
    """A ``IMAGE_HEIGHT x IMAGE_WIDTH`` RGB image: head, top and trousers on the camera's background,
    shifted by a pixel or two per row so that images of one identity differ."""
    image = np.empty((IMAGE_HEIGHT, IMAGE_WIDTH, 3), dtype=np.uint8)
    image[...] = _hsv(camid * GOLDEN % 1, 0.25, 0.95)
    image[-6:] = _hsv(camid * GOLDEN % 1, 0.4, 0.7)  # the floor
    top, trousers = _clothes(pid, row)
    x = 16 + row % 5 - 2  # the figure's centre column
    yy, xx = np.mgrid[:IMAGE_HEIGHT, :IMAGE_WIDTH]
    image[(yy - 9) ** 2 + (xx - x) ** 2 <= 25] = SKIN
    image[14:36, x - 8:x + 8] = top
    image[36:58, x - 7:x - 1] = trousers
    image[36:58, x + 1:x + 7] = trousers
    return image


def png_bytes(rgb: np.ndarray) -> bytes:
    """An 8-bit RGB PNG of ``rgb`` (height x width x 3, uint8): no imaging library needed."""
    height, width, _ = rgb.shape
    rows = np.concatenate([np.zeros((height, 1), np.uint8), rgb.reshape(height, width * 3)], axis=1)  # filter 0

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows.tobytes(), 9))
            + chunk(b"IEND", b""))


def write_images(folder: str, relative_to: str | None, first_row: int, pids, camids) -> list[str]:
    """One PNG per row (rows ``first_row``...) in ``folder``; returns their paths, relative to
    ``relative_to`` (the store's folder) or absolute when it is None."""
    paths = []
    for offset, (pid, camid) in enumerate(zip(pids.tolist(), camids.tolist())):
        row = first_row + offset
        name = os.path.join(folder, f"{row:06d}.png")
        image = png_bytes(person_image(pid, camid, row))
        replace_file(name, lambda tmp, image=image: Path(tmp).write_bytes(image))  # a link there is replaced
        paths.append(os.path.abspath(name) if relative_to is None else os.path.relpath(name, relative_to))
    return paths


def check_images_folder(images, store_path, n_rows: int, overwrite: bool) -> None:
    """Before any work: the image folder can be made (its parent exists, nothing there unless
    ``overwrite``), lies outside the store, and its file system has room for ``n_rows`` images."""
    folder = os.path.abspath(images)
    parent = os.path.dirname(folder)
    if not os.path.isdir(parent):
        raise OptionError(f"the folder of the image folder '{images}' does not exist ({parent}); create it first")
    if os.path.lexists(folder) and not (overwrite and os.path.isdir(folder)):
        raise OptionError(f"'{images}' already exists; pass --overwrite to write the images into it")
    if store_mod.is_local_path(store_path):
        store = os.path.abspath(store_path)
        if os.path.commonpath([folder, store]) in (folder, store):
            raise OptionError(f"the image folder '{images}' and the store '{os.fspath(store_path)}' must not "
                              "contain one another")
    block = os.statvfs(parent).f_frsize if hasattr(os, "statvfs") else 4096
    need = n_rows * -(-IMAGE_BYTES // block) * block
    free = shutil.disk_usage(parent).free
    if need > free:
        raise OptionError(f"{n_rows:,} images need about {plan.format_bytes(need)} but the file system of "
                          f"'{parent}' has {plan.format_bytes(free)} free; free some space or make fewer rows")


@contextlib.contextmanager
def _image_folders(images):
    """The query and gallery image folders, made here; removed again if writing fails (only the
    folders made here: an existing folder given with --overwrite is left as it is)."""
    folder = os.path.abspath(images)
    made = not os.path.exists(folder)
    try:
        for name in ("query", "gallery"):
            os.makedirs(os.path.join(folder, name), exist_ok=True)
        yield {name: os.path.join(folder, name) for name in ("query", "gallery")}
    except BaseException:
        if made:
            shutil.rmtree(folder, ignore_errors=True)
        raise


class _Progress:
    """One line on stderr: carriage-return updates on a terminal, a line per quarter otherwise."""

    def __init__(self, enabled: bool, total: int, label: str):
        self.enabled, self.total, self.label = enabled, total, label
        self.tty = enabled and sys.stderr.isatty()
        self.started = time.perf_counter()
        self.last_print = 0.0
        self.quarter = 0

    def update(self, done: int) -> None:
        now = time.perf_counter()
        if self.tty and (now - self.last_print >= 0.2 or done == self.total):
            self.last_print = now
            print(f"\r{self._text(done, now)}", end="\n" if done == self.total else "", file=sys.stderr, flush=True)
        elif self.enabled and not self.tty and 4 * done // self.total > self.quarter:
            self.quarter = 4 * done // self.total
            print(self._text(done, now), file=sys.stderr, flush=True)

    def _text(self, done: int, now: float) -> str:
        return (f"synth {self.label}: {done:,}/{self.total:,} rows ({100 * done / self.total:3.0f}%) "
                f"{now - self.started:.1f} s")


def synthesize(path, *, n_query: int, n_gallery: int, dim: int, n_ids: int, n_cams: int, seed: int = 0,
               junk_frac: float = 0.0, distractor_frac: float = 0.0, open_query_frac: float = 0.0,
               dtype: str = "float32", chunk_rows: int | None = None, default_metric: str = "euclidean",
               overwrite: bool = False, progress: bool = False, images=None, variants: str | None = None,
               variant_trials: int = 10, noise: float = 1.0, workers: int | None = None) -> Store:
    """Write a synthetic store at ``path`` (see the module docstring) and return it opened.

    Query pids are drawn uniformly from ``1..n_ids``, except a fraction ``open_query_frac`` of
    queries with pids ``n_ids+1..`` that no gallery image has.  Gallery rows are junk (pid -1) with
    probability ``junk_frac``, distractors (pid 0) with probability ``distractor_frac``, otherwise
    uniform over ``1..n_ids``.  Camera ids are uniform over ``0..n_cams-1``.  (In a gallery too small
    to hold every identity, the queries of a missing identity are open-set as well.)

    Raises, before anything is written: OptionError for invalid arguments, a store larger than the
    free disk space (``check_room``) or resident arrays larger than half the memory
    (``check_memory``), an ``images`` folder that exists (without ``overwrite``) or has no room
    (``check_images_folder``); StoreError if ``path`` exists and not ``overwrite``.  Writing fails
    with a StoreError (no space left...) after removing the partial store (and the image folder it
    made); with ``overwrite``, the old store is deleted before the new one is written.  With
    ``images``, every row gets a PNG there and its path in the store, relative to the store's folder.
    With ``variants`` ("cil-factorial" or "cil-upstream"), the preset's query and gallery variants
    for ``variant_trials`` trials are written too, corruption-like (module docstring, "Variants").
    ``noise`` scales the per-image noise (module docstring): 1 is the default model, larger a weaker one.
    ``workers``: threads that make and write the rows (default: the cores; the store is the same).
    """
    dtype = _check_args(n_query, n_gallery, dim, n_ids, n_cams, junk_frac, distractor_frac, open_query_frac, dtype,
                        noise)
    chunk_rows = plan.default_chunk_rows(dim, dtype.itemsize) if chunk_rows is None else check_range(chunk_rows,
                                                                                                      "chunk_rows")
    n_open_ids = open_identity_count(n_query, n_ids, open_query_frac)
    variant_names = _variant_names(variants, variant_trials)
    store_mod.refuse_existing(path, overwrite)
    copies = {set_name: 1 + len(names) for set_name, names in variant_names.items()}  # clean + variants
    check_room(path, n_query * copies["query"], n_gallery * copies["gallery"], dim, dtype, chunk_rows, overwrite)
    check_memory(n_query, n_gallery, dim, n_ids + n_open_ids, n_cams, chunk_rows)
    if images is not None:
        check_images_folder(images, path, n_query + n_gallery, overwrite)

    # identity centres 1..n_ids, then the open-set identities' (separate streams: adding open
    # queries does not change the closed identities)
    centres = np.empty((n_ids + n_open_ids, dim), dtype=np.float32)
    _identity_centres(centres[:n_ids], _rng(seed, _CENTRES))
    if n_open_ids:
        _identity_centres(centres[n_ids:], _rng(seed, _OPEN_CENTRES))
    cameras = CAMERA_SCALE * _rng(seed, _CAMERAS).standard_normal((n_cams, dim), dtype=np.float32)
    sigma = np.float32(noise * noise_scale(dim))  # noise 1: exactly the default model's scale

    def query_ids(rng, n):
        pids = rng.integers(1, n_ids + 1, size=n, dtype=np.int64)
        open_rows = rng.random(n) < open_query_frac
        if n_open_ids:
            pids[open_rows] = n_ids + 1 + rng.integers(0, n_open_ids, size=int(open_rows.sum()), dtype=np.int64)
        return pids, pids - 1

    def gallery_ids(rng, n):
        pids = rng.integers(1, n_ids + 1, size=n, dtype=np.int64)
        u = rng.random(n)
        pids[u < junk_frac + distractor_frac] = 0
        pids[u < junk_frac] = -1
        return pids, np.where(pids > 0, pids - 1, -1)

    relative_to = os.path.dirname(os.path.abspath(path)) if store_mod.is_local_path(path) else None
    # a failure removes the partial store (and the image folders made here)
    with store_mod.new_store(path, overwrite), (_image_folders(images) if images is not None
                                                else contextlib.nullcontext()) as folders:
        store = store_mod.create_store(path, n_query, n_gallery, dim, dtype.name, chunk_rows, default_metric)
        for fs, stream, make_ids in ((store.query, _QUERY, query_ids), (store.gallery, _GALLERY, gallery_ids)):
            def generator():
                return _Generator(seed, stream, len(fs), dim, make_ids, centres, cameras, sigma)

            bar = _Progress(progress, len(fs), fs.name)
            if folders is None:
                _write_set(fs, generator, bar, workers)
            else:  # the images and their paths a chunk at a time, in order
                gen, paths = generator(), create_paths(fs)
                for start in range(0, len(fs), fs.chunk_rows):
                    stop = min(start + fs.chunk_rows, len(fs))
                    features, pids, camids = gen.rows(start, stop)
                    store_mod.write_rows(fs, start, features, pids, camids)
                    write_path_rows(paths, start, write_images(folders[fs.name], relative_to, start, pids, camids))
                    bar.update(stop)
                complete_paths(paths)
        store = store_mod.commit_gallery(path)
        if variants is not None:
            _write_variants(path, store, seed, variants, variant_names, progress)
        return store_mod.open_store(path)


SLAB_COPIES = 5  # a thread's float32 copies of its slab's rows: the generation blocks, their rows, the cast to write


def slab_threads(workers: int | None, slab_bytes: int) -> int:
    """Threads for ``_write_set``: ``workers`` (default: the cores), no more than a quarter of the
    memory holds at ``slab_bytes`` each, at least one."""
    threads = workers or os.cpu_count() or 1
    physical = plan.physical_memory()
    if physical is not None:
        threads = min(threads, physical // 4 // slab_bytes)
    return max(1, threads)


def _write_set(fs, generator, bar: "_Progress", workers: int | None) -> None:
    """Every row of ``fs``, made by ``generator()``'s generators and written on ``workers`` threads
    (default: the cores), a slab of whole chunks each, at least a generation block: no two threads
    write to the same chunk, and a row is the same whoever makes it (a block two slabs share is
    made by both).  Making rows (numpy's generators and arithmetic) and writing them (zarr's
    codecs, the files) mostly release the GIL: 10,000 x 1,000,000 x 256 float16 took 7.3 s on one
    thread and 3.4 s on two, on this project's 2-core machine.  At most two slabs a thread are in
    flight, at most as many threads as a quarter of the memory holds (``SLAB_COPIES`` a slab's
    rows each: a large ``chunk_rows`` on many cores would otherwise hold many large slabs)."""
    slab = fs.chunk_rows * -(-generation_block_rows(fs.dim) // fs.chunk_rows)
    threads = slab_threads(workers, SLAB_COPIES * slab * fs.dim * 4)
    local = threading.local()

    def write(start: int) -> int:
        if not hasattr(local, "gen"):  # a generator a thread: its cache of the last block is its own
            local.gen = generator()
        stop = min(start + slab, len(fs))
        store_mod.write_rows(fs, start, *local.gen.rows(start, stop))
        return stop

    starts = iter(range(0, len(fs), slab))
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        pending = collections.deque(pool.submit(write, start) for start in itertools.islice(starts, 2 * threads))
        try:
            while pending:
                bar.update(pending.popleft().result())  # in order: the bar counts a prefix of rows
                for start in itertools.islice(starts, 1):
                    pending.append(pool.submit(write, start))
        except BaseException:
            for future in pending:
                future.cancel()
            raise


def _variant_names(variants: str | None, trials) -> dict:
    """{set: [(name, setting, trial)]} of the preset ``variants`` (none without)."""
    from ..suite.plan import preset_variants

    if variants is None:
        return {"query": [], "gallery": []}
    return preset_variants(variants, check_range(trials, "variant_trials"))


def _write_variants(path, store: Store, seed: int, plan_name: str, names: dict, progress: bool) -> None:
    """The corruption-like variants ``names`` of both sets, a store chunk at a time."""
    from ..store.variants import COLUMNS, write_variant_blocks

    bar = _Progress(progress, sum(len(getattr(store, s)) * len(n) for s, n in names.items()), "variants")
    done = 0
    for set_name, stream in (("query", _QUERY), ("gallery", _GALLERY)):
        fs = getattr(store, set_name)
        for name, setting, trial in names[set_name]:
            corrupted = _Corrupted(fs, seed, stream, name)

            def blocks():
                nonlocal done
                for start in range(0, len(fs), fs.chunk_rows):
                    stop = min(start + fs.chunk_rows, len(fs))
                    yield dict(zip(("features", *COLUMNS), corrupted.rows(start, stop)))
                    done += stop - start
                    bar.update(done)

            attrs = {"trial": trial, "seed": seed, "setting": setting, "plan": plan_name, "source": "synth",
                     "corruption_names": list(CORRUPTIONS), "max_severity": MAX_SEVERITY}
            write_variant_blocks(path, set_name, name, blocks(), columns=COLUMNS, attrs=attrs)
