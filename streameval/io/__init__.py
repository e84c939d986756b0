"""Readers of the files users bring (docs/formats.md): each format opened as a :class:`Source`, its
arrays by the names the file gives them, and those names matched to what a store needs.

Formats (module by module): ``.npz`` (``npz``: members streamed from the zip), ``.npy`` files or a
folder of them (``npy``: memory-mapped), ``.mat`` (``mat``: MATLAB v4/v5/v7 through scipy, read
whole; v7.3 is HDF5), ``.h5`` / ``.hdf5`` (``h5``: datasets read a block of rows at a time),
``.pt`` / ``.pth`` (``pt``: torch, read whole, only if torch is installed) and id lists in CSV
files (``csv_ids``).

Every array offers the same small interface, so ``convert`` streams them alike: ``name``,
``shape`` and ``dtype`` (as the reader presents it: MATLAB arrays in MATLAB's orientation),
``blocks(step)`` (consecutive blocks of ``step`` rows), ``whole()`` (the array in memory) and
``matrix()`` (a 2-D array-like sliceable by rows and columns, for distance matrices).

Names are matched against the known conventions (``CONVENTIONS``): streameval's own, layumi's
(``query_f``, ``query_label``, ``query_cam``), torchreid / fast-reid's (``qf``, ``q_pids``,
``q_camids``), ``query_feature(s)`` ... after normalising case and separators (``Query-Feature``
and ``query/feature`` are ``query_feature``).  ``--key qf=NAME`` names one directly.  A missing or
ambiguous array is one StoreError listing what the file holds and how to name the keys.

Imports nothing heavy: the format modules (and scipy, h5py, torch) load only when such a file is read.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
from dataclasses import dataclass, field

from ..core.errors import OptionError, StoreError
from ..core.extras import require_extra

FEATURE_KEYS = {"qf": "query_features", "gf": "gallery_features", "q_pids": "query_pids",
                "g_pids": "gallery_pids", "q_camids": "query_camids", "g_camids": "gallery_camids"}
MATRIX_KEYS = {"dist": "distances", "q_dist": "query_distances"}
KEYS = {**FEATURE_KEYS, **MATRIX_KEYS}  # --key KEY=NAME: KEY -> the long name of what it names
SHORT = {long: short for short, long in KEYS.items()}
DESCRIPTIONS = {"distances": "query x gallery matrix", "query_distances": "query x query matrix"}

FORMATS = {".npz": "npz", ".npy": "npy", ".mat": "mat", ".h5": "h5", ".hdf5": "h5", ".hdf": "h5", ".pt": "pt",
           ".pth": "pt"}
SUPPORTED = ".npz, .npy (one file per array, or a folder of them), .mat (MATLAB v5 or v7.3), .h5/.hdf5, .pt/.pth"
LISTED = 16  # arrays named in a message, at most
NO_CAMERAS_HINT = "evaluate it with --protocol none, which applies no camera rule"


def _set_names(long: str, short: str) -> dict:
    """The conventional names of one set's arrays (``query``/``q``, ``gallery``/``g``)."""
    def names(*suffixes):
        return tuple(f"{prefix}_{suffix}" for prefix in (long, short) for suffix in suffixes)

    return {
        f"{long}_features": names("features", "feature", "feats", "feat", "f", "embeddings", "embedding", "emb")
        + (f"{short}f",),
        f"{long}_pids": names("pids", "pid", "labels", "label", "ids", "id", "person_ids"),
        f"{long}_camids": names("camids", "camid", "cams", "cam", "cam_ids", "cameras", "camera", "camera_ids"),
    }


CONVENTIONS = {**_set_names("query", "q"), **_set_names("gallery", "g")}
MATRIX_CONVENTIONS = {  # by kind: what re-ranking code and evaluators call their matrices
    "distance": {
        "distances": ("distmat", "dist_mat", "dist", "dists", "distance", "distances", "distance_matrix",
                      "dist_matrix", "q_g_dist", "qg_dist", "q_g_distance", "query_gallery_dist",
                      "query_gallery_distances", "re_rank", "rerank", "reranked", "re_ranked", "rerank_dist",
                      "re_rank_dist", "final_dist"),
        "query_distances": ("q_q_dist", "qq_dist", "query_query_dist", "query_query_distances"),
    },
    "similarity": {
        "distances": ("sim", "sims", "simmat", "sim_mat", "similarity", "similarities", "similarity_matrix",
                      "q_g_sim", "qg_sim", "score", "scores", "score_mat"),
        "query_distances": ("q_q_sim", "qq_sim", "query_query_sim", "query_query_similarity"),
    },
}

MATRIX_NAMES = {name for kind in MATRIX_CONVENTIONS.values() for names in kind.values() for name in names}


def normalise(name: str) -> str:
    """Case and separators dropped: ``Query-Feature``, ``query/feature`` -> ``query_feature``."""
    return re.sub(r"[^0-9a-z]+", "_", name.lower()).strip("_")


def describe_key(long: str) -> str:
    return DESCRIPTIONS.get(long, long.replace("_", " "))


@dataclass
class Source:
    """The arrays of one input (a file, several .npy files or a folder), by the names it gives them."""

    path: str
    label: str  # the input and its format, as the report names it: "feats.mat (MATLAB v5, read whole)"
    arrays: dict
    matlab: bool = False  # MATLAB has no 1-D arrays and stores numbers as double: ids read as such
    close: object = field(default=lambda: None, repr=False)

    def listing(self) -> str:
        """What the input holds, for messages: ``qf (30, 10) float32, ...``."""
        if not self.arrays:
            return "no arrays"
        items = [f"{name} {tuple(a.shape)} {a.dtype}" for name, a in sorted(self.arrays.items())]
        more = f", and {len(items) - LISTED} more" if len(items) > LISTED else ""
        return ", ".join(items[:LISTED]) + more

    def ids(self, array):
        """An array used as ids: a MATLAB 1 x N or N x 1 array as a vector; whole floating point
        numbers (MATLAB's doubles, pids saved from float tensors) as int64, fractions refused."""
        from .ids import integral_ids

        return integral_ids(array.vector() if self.matlab else array, self.path)


@dataclass(frozen=True)
class Matching:
    """Which array of the input became what, and which sets' ids came from elsewhere: the line
    ``convert`` and ``eval`` report."""

    label: str
    pairs: tuple  # (name in the input, long name)
    given: tuple  # (where from, set name, with paths)
    cameras: bool = True  # False: no camera ids anywhere, every row camera 0

    @classmethod
    def of(cls, source: Source, found: dict, given: dict, cameras: bool = True) -> Matching:
        """``found``: {long name: array} as ``match`` returns; ``given``: {set name: (label, with paths)}."""
        return cls(source.label, tuple((array.name, long) for long, array in found.items()),
                   tuple((label, set_name, paths) for set_name, (label, paths) in given.items()), cameras)

    @property
    def notable(self) -> bool:
        """Anything but streameval's own names, all from the input, with cameras."""
        return (bool(self.given) or not self.cameras
                or any(name not in (long, SHORT[long]) for name, long in self.pairs))

    def __str__(self) -> str:
        parts = [f"{name} -> {describe_key(long)}" for name, long in self.pairs]
        parts += [f"{label} -> {set_name} pids" + (", camids" if self.cameras else "") + (", paths" if paths else "")
                  for label, set_name, paths in self.given]
        if not self.cameras:
            parts.append(f"no camera ids: every row is camera 0 ({NO_CAMERAS_HINT})")
        return f"reading {self.label}: " + ", ".join(parts)


def parse_keys(items) -> dict:
    """``--key KEY=NAME`` items (or a mapping) -> {long name: name in the input}."""
    pairs = items.items() if isinstance(items, dict) else (item.partition("=")[::2] for item in items or ())
    keys = {}
    for key, name in pairs:
        if key not in KEYS or not name:
            raise OptionError(f"--key expects KEY=NAME with KEY one of {', '.join(KEYS)}, got {key}={name}")
        keys[KEYS[key]] = name
    return keys


def match(source: Source, wanted, keys: dict, optional=(), conventions=CONVENTIONS,
          ids_elsewhere: bool = False) -> dict:
    """{long name: array} for every name of ``wanted`` (``optional`` ones only when present):
    ``keys`` (long name -> name) first, then the conventional names.  Raises OptionError for a
    ``--key`` naming no array, StoreError for a missing or ambiguous array (``ids_elsewhere``: its
    message says ids may come from elsewhere, as a matrix's often do)."""
    for long, name in keys.items():
        if long not in (*wanted, *optional):
            raise OptionError(f"--key {SHORT[long]}={name} does not apply: this conversion reads no "
                              f"{describe_key(long)} from '{source.path}' (dist and q_dist name a matrix, read with "
                              "--distances or --similarity; ids given by --query-ids, --gallery-ids or --ids-from "
                              "are not read from the input)")
    by_norm = {}
    for name in source.arrays:
        by_norm.setdefault(normalise(name), []).append(name)
    chosen, missing = {}, []
    for long in (*wanted, *optional):
        if long in keys:
            if keys[long] not in source.arrays:
                raise OptionError(f"--key {SHORT[long]}={keys[long]}: '{source.path}' has no array "
                                  f"'{keys[long]}'; it holds: {source.listing()}")
            chosen[long] = keys[long]
            continue
        taken = set(keys.values())
        found = [name for conventional in conventions[long] for name in by_norm.get(conventional, ())
                 if name not in taken]
        if not found and long == "distances":  # a file holding one matrix holds the one meant, unless its name
            matrices = [name for name, a in source.arrays.items()  # says it is of the other kind
                        if len(a.shape) == 2 and min(a.shape) > 1 and normalise(name) not in MATRIX_NAMES]
            found = matrices if len(matrices) == 1 and matrices[0] not in taken else []
        if len(found) > 1:
            raise StoreError(f"'{source.path}': {' and '.join(repr(n) for n in found)} could each be the "
                             f"{describe_key(long)}; choose with --key {SHORT[long]}=NAME; "
                             f"it holds: {source.listing()}")
        if found:
            chosen[long] = found[0]
        elif long in wanted:
            missing.append(long)
    if "distances" in missing:
        _refuse_other_kind(source, conventions["distances"])
    if missing:
        lack = ", ".join(f"'{long}' (or its short name '{SHORT[long]}')" if long in CONVENTIONS else
                         f"the {describe_key(long)} (named e.g. {', '.join(conventions[long][:4])})"
                         for long in missing)
        hint = (f"name it with --key {SHORT[missing[0]]}=NAME" if len(missing) == 1 else
                f"name them with --key KEY=NAME (KEY: {', '.join(SHORT[long] for long in missing)})")
        if ids_elsewhere and all(long.endswith(("pids", "camids")) for long in missing):
            hint += ", or give the ids with --ids-from STORE or --query-ids / --gallery-ids CSV files"
        raise StoreError(f"'{source.path}': input arrays lack {lack}; it holds: {source.listing()}; {hint}")
    return {long: source.arrays[name] for long, name in chosen.items()}


def _refuse_other_kind(source: Source, names) -> None:
    """A matrix named as the other kind (``distmat`` with --similarity) is a likely mistake, said so."""
    for name in source.arrays:
        kinds = [kind for kind, known in MATRIX_CONVENTIONS.items() if normalise(name) in known["distances"]]
        if kinds and normalise(name) not in names:
            flag = "--distances" if kinds[0] == "distance" else "--similarity"
            raise StoreError(f"'{source.path}': '{name}' is named as a {kinds[0]} matrix, but this conversion reads "
                             f"the other kind (--distances: smaller is closer, --similarity: larger is closer); pass "
                             f"{flag}, or --key dist={name} if its name misleads")


def is_store(target) -> bool:
    """Whether ``eval`` reads ``target`` as a store (a URL, a folder holding zarr.json, a path named
    .zarr, a missing path of no input format) rather than converting it first."""
    path = os.fspath(target)
    if "://" in path or os.path.exists(os.path.join(path, "zarr.json")):
        return True
    if os.path.exists(path):  # a file named .zarr is a damaged store, not an input to convert
        return path.rstrip("/").endswith(".zarr")
    return os.path.splitext(path)[1].lower() not in FORMATS


def _npy_files(folder: str) -> list:
    return sorted(os.path.join(folder, name) for name in os.listdir(folder) if name.lower().endswith(".npy"))


@contextlib.contextmanager
def open_source(inputs):
    """The :class:`Source` of ``inputs``: a file, a folder of .npy files, or several .npy files."""
    paths = [os.fspath(p) for p in inputs] if isinstance(inputs, (list, tuple)) else [os.fspath(inputs)]
    for path in paths:
        if not os.path.exists(path):
            raise StoreError(f"no input file at '{path}'")
    if len(paths) == 1 and os.path.isdir(paths[0]):
        if os.path.exists(os.path.join(paths[0], "zarr.json")):
            raise StoreError(f"'{paths[0]}' is a store already; convert reads {SUPPORTED}")
        files = _npy_files(paths[0])
        if not files:
            raise StoreError(f"'{paths[0]}' is neither a store (no zarr.json) nor a folder of .npy files; "
                             f"streameval converts {SUPPORTED} (docs/formats.md)")
        source = _module("npy").open_files(files, folder=paths[0])
    elif len(paths) > 1 or _format(paths[0]) == "npy":
        if any(_format(path) != "npy" for path in paths):
            raise StoreError(f"several inputs must all be .npy files (one array each), got {', '.join(paths)}")
        source = _module("npy").open_files(paths)
    else:
        source = _module(_format(paths[0])).open_source(paths[0])
    try:
        yield source
    finally:
        source.close()


def _format(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise StoreError(f"'{path}' is not a store, and streameval cannot tell its format from its extension "
                         f"'{ext}': it evaluates zarr stores and converts {SUPPORTED} ('streameval convert', "
                         f"docs/formats.md)")
    return FORMATS[ext]


def _module(name: str):
    return importlib.import_module(f".{name}", __name__)


def require(module: str, package: str, path: str):
    """Import an optional library a format needs (the io extra), or one StoreError naming the package to install."""
    return require_extra(module, package=package, extra="io", purpose=f"reading '{path}'", error=StoreError)
