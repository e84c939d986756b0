"""``convert``: what users bring -> a store; ``append_npz``: gallery rows of such a file -> appended to
a store; ``evaluation_store``: ``eval``'s input as a store, converted first when it is a file.

Inputs (``streameval.io``, docs/formats.md): .npz, .npy files or a folder of them, .mat (v5, v7.3),
.h5 / .hdf5, .pt / .pth, with ids optionally from CSV files (``query_ids`` / ``gallery_ids``) or
an existing store (``ids_from``).  The arrays are found by their conventional names or ``keys``.
A feature input becomes a feature store; a query x gallery distance or similarity matrix
(``matrix="distance"`` / ``"similarity"``) a distance store (``store.distances``).

Everything is checked before the output is touched: the arrays' presence, shapes and dtypes, then
every value in one streaming pass (``store.check_batch``: finite features that survive the cast to
the stored dtype, ids that fit int64; paths as ``store.paths.check_paths``).  Only then is the store
created and written, in a second pass; if that fails (no space left...), the partial store is
removed (``store.new_store``).  Memory stays bounded by a store chunk of rows where the format
allows streaming (.npz, .npy, HDF5, CSV); .mat v5 and torch files are read whole.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
from dataclasses import dataclass

import numpy as np

from ..engine import plan
from ..core import outputs
from ..core.choices import check_range
from ..core.errors import OptionError, StoreError
from ..io import CONVENTIONS, MATRIX_CONVENTIONS, Matching, match, open_source, parse_keys
from ..store import (Store, append_batches, appendable, check_batch, check_metric, commit_gallery, create_store,
                     feature_dtype, is_local_path, new_store, open_store, read_ids, refuse_existing, write_rows)
from ..store.layout import DISTANCE_KINDS

SETS = ("query", "gallery")


@dataclass(frozen=True)
class GivenIds:
    """A set's ids (and paths) from outside the input: a CSV file or an existing store."""

    label: str
    pids: object  # arrays in the ``streameval.io`` interface
    camids: object  # None: a store without camera ids
    paths: list | None


def convert(inputs, out, *, keys=None, query_ids=None, gallery_ids=None, ids_from=None, matrix: str | None = None,
            dtype: str | None = None, chunk_rows: int | None = None, default_metric: str | None = None,
            overwrite: bool = False, report=None, query_variants=None, gallery_variants=None) -> Store:
    """Convert ``inputs`` (a file, a folder of .npy files, or a list of .npy files) into a store at
    ``out`` and return it opened.

    ``keys``: {"qf": NAME, ...} or ["qf=NAME", ...], the input's arrays named directly (keys qf, gf,
    q_pids, g_pids, q_camids, g_camids, and dist, q_dist for a matrix).  ``query_ids`` /
    ``gallery_ids``: CSV files of a set's ids (and image paths); ``ids_from``: a store whose ids and
    paths are copied.  ``matrix``: "distance" or "similarity" when the input holds a query x gallery
    matrix instead of features.

    Feature stores: the stored dtype is ``dtype`` if given (float16 or float32), else float16 when
    the input features are float16 and float32 otherwise; ``default_metric`` defaults to euclidean.
    ``query_variants`` / ``gallery_variants``: {name: FILE} feature variants of a set written into
    the store too (docs/variants.md: a .npy of features, or a .npz of ``features`` and optionally
    ``corruption_type``, ``severity``, and ``pids``, ``camids`` that must equal the set's).
    ``report``: called with the :class:`~streameval.io.Matching` once the store is written.  Raises
    StoreError, before touching ``out``, when an array is missing or malformed or a value is not
    finite; refuses to replace an existing ``out`` unless ``overwrite``.
    """
    keys = parse_keys(keys)
    if chunk_rows is not None:
        check_range(chunk_rows, "chunk_rows")
    if matrix is not None:
        if matrix not in DISTANCE_KINDS:
            raise OptionError(f"matrix must be one of {', '.join(DISTANCE_KINDS)}, got {matrix!r}")
        if dtype is not None or default_metric is not None:
            raise OptionError("a distance store has no features: --dtype and --metric apply to feature inputs")
    else:
        dtype = None if dtype is None else feature_dtype(dtype)
        default_metric = default_metric or "euclidean"
        check_metric(default_metric)
    paths = [os.fspath(p) for p in inputs] if isinstance(inputs, (list, tuple)) else [os.fspath(inputs)]
    variants = _variant_specs(query_variants, gallery_variants)
    if matrix is not None and variants:
        raise OptionError("a distance store has no features: --query-variant and --gallery-variant apply to features")
    _check_output(out, [*paths, query_ids, gallery_ids, ids_from, *(path for _, _, path in variants)], overwrite)
    given = _given_ids(query_ids, gallery_ids, ids_from)
    with open_source(paths) as source:
        if matrix is not None:
            store, found, cameras = _convert_matrix(source, out, matrix, keys, given, chunk_rows, overwrite)
        else:
            store, found, cameras = _convert_features(source, out, keys, given, dtype, chunk_rows, default_metric,
                                                      overwrite, variants)
    if report is not None:
        report(Matching.of(source, found, {name: (ids.label, ids.paths is not None) for name, ids in given.items()},
                           cameras))
    return store


convert_npz = convert  # the name of the converter from the days it read .npz files only


def _check_output(out, inputs: list, overwrite: bool) -> None:
    """Neither the output nor what --overwrite would delete holds an input."""
    if isinstance(out, (str, os.PathLike)) and os.path.exists(out):
        real_out = os.path.realpath(out)
        for src in (os.fspath(p) for p in inputs if p is not None and os.path.exists(p)):
            if os.path.samefile(out, src):
                raise StoreError(f"the output '{os.fspath(out)}' is the input file '{src}'")
            if os.path.commonpath([real_out, os.path.realpath(src)]) == real_out:
                raise StoreError(f"the input '{src}' is inside the output '{os.fspath(out)}', "
                                 "which --overwrite would delete")
    refuse_existing(out, overwrite)


def _given_ids(query_ids, gallery_ids, ids_from) -> dict:
    """{set name: GivenIds} for the sets whose ids do not come from the input."""
    if ids_from is not None:
        if query_ids is not None or gallery_ids is not None:
            raise OptionError("ids come from --ids-from or from --query-ids / --gallery-ids, not both")
        return _store_ids(ids_from)
    from ..io.csv_ids import CsvIds
    from ..store.paths import check_paths

    given = {}
    for set_name, path in (("query", query_ids), ("gallery", gallery_ids)):
        if path is not None:
            ids = CsvIds(path, set_name)
            if ids.paths is not None:
                check_paths(ids.paths, f"'{ids.path}' {set_name} paths", ids.rows)
            given[set_name] = GivenIds(os.path.basename(ids.path), ids.column("pids"), ids.column("camids"), ids.paths)
    return given


def _store_ids(target) -> dict:
    from ..io.arrays import MemoryArray
    from ..store.paths import read_paths

    store = open_store(target)
    given = {}
    for fs in (store.query, store.gallery):
        pids, camids = read_ids(fs)
        given[fs.name] = GivenIds(os.path.basename(os.fspath(target)), MemoryArray(f"{fs.name} pids", pids),
                                  MemoryArray(f"{fs.name} camids", camids) if store.cameras else None,
                                  read_paths(store, fs.name, slice(None)))
    return given


def _id_names(given: dict, field_names=("pids", "camids")) -> list:
    """The long names of the ids the input must hold (those of sets not given otherwise)."""
    return [f"{s}_{field}" for s in SETS if s not in given for field in field_names]


def _match_ids(source, wanted: list, keys: dict, given: dict, optional=(), **matching) -> tuple[dict, bool]:
    """``match`` of ``wanted`` arrays and the ids; returns (found, cameras).  An input without any
    camera ids (nor given ones) is converted with every row camera 0 and the store marked as having
    no cameras, so that only protocols without camera rules evaluate it; camera ids of some sets
    only are missing ones, refused as usual."""
    given_cameras = [ids.camids is not None for ids in given.values()]
    try:
        return match(source, [*wanted, *_id_names(given)], keys, optional=optional, **matching), all(given_cameras)
    except StoreError as missing:
        try:
            found = match(source, [*wanted, *_id_names(given, field_names=("pids",))], keys,
                          optional=[*optional, *_id_names(given, field_names=("camids",))], **matching)
        except StoreError:
            raise missing from None
        if any(given_cameras) or any(long.endswith("camids") for long in found):
            raise missing from None
        return found, False


def _members(source, found: dict, given: dict, cameras: bool = True) -> dict:
    """{long name: array}: the input's arrays (ids as ``source.ids`` reads them) and the given ids;
    without ``cameras``, camera 0 for every row (a zero-strided view: no memory per row)."""
    from ..io.arrays import MemoryArray

    members = {long: source.ids(array) if long.endswith(("pids", "camids")) else array for long, array in found.items()}
    for set_name, ids in given.items():
        members[f"{set_name}_pids"], members[f"{set_name}_camids"] = ids.pids, ids.camids
    if not cameras:
        for set_name in (name for name in SETS if f"{name}_pids" in members):  # append: the gallery only
            rows = members[f"{set_name}_pids"].shape[-1]
            members[f"{set_name}_camids"] = MemoryArray("no camids", np.broadcast_to(np.int64(0), (rows,)))
    return members


# ------------------------------------------------------------------------------------------ features


def _variant_specs(query_variants, gallery_variants) -> list:
    """[(set, name, path)] of the variant files to convert, names checked."""
    from ..store.variants import check_name

    return [(set_name, check_name(name), os.fspath(path))
            for set_name, given in (("query", query_variants), ("gallery", gallery_variants))
            for name, path in (given or {}).items()]


def _convert_features(source, out, keys, given, dtype, chunk_rows, default_metric, overwrite, variant_specs=()):
    found, cameras = _match_ids(source, ["query_features", "gallery_features"], keys, given)
    members = _members(source, found, given, cameras)
    dim = _check_headers(members, source.path)
    if dtype is None:
        half = all(members[f"{s}_features"].dtype == np.float16 for s in SETS)
        dtype = np.dtype(np.float16 if half else np.float32)
    if chunk_rows is None:
        chunk_rows = plan.default_chunk_rows(dim, dtype.itemsize)
    for set_name in SETS:
        _check_values(members, set_name, chunk_rows, dim, dtype, source.path)
    n_query, n_gallery = (members[f"{s}_features"].shape[0] for s in SETS)
    from ..store.variants import file_attrs, variant_files, write_variant_blocks

    with variant_files(variant_specs) as variants:
        for set_name, _, rows in variants:  # checked before the store is created (or --overwrite deletes one)
            ids = functools.partial(_id_blocks, members, set_name)
            rows.check(members[f"{set_name}_features"].shape[0], dim, dtype, chunk_rows, ids=ids)
        with new_store(out, overwrite):
            store = create_store(out, n_query, n_gallery, dim, dtype.name, chunk_rows, default_metric, cameras=cameras)
            for fs in (store.query, store.gallery):
                for start, feats, pids, camids in _batches(members, fs.name, fs.chunk_rows):
                    write_rows(fs, start, feats, pids, camids)
            store = commit_gallery(out)
            _write_paths(out, given)
            for (set_name, name, rows), (_, _, path) in zip(variants, variant_specs):
                store = write_variant_blocks(out, set_name, name, rows.blocks(chunk_rows, dtype),
                                             columns=rows.columns, attrs=file_attrs(path))
    return store, found, cameras


def _id_blocks(members: dict, set_name: str, step: int):
    """(pids, camids) per block of ``step`` rows of one set."""
    return zip(*(members[f"{set_name}_{field}"].blocks(step) for field in ("pids", "camids")))


def _write_paths(out, given: dict) -> None:
    from ..store.paths import write_paths

    for set_name, ids in given.items():
        if ids.paths is not None:
            write_paths(out, set_name, ids.paths)


def _check_headers(members: dict, src: str, sets=SETS) -> int:
    """Shapes and dtypes of the arrays of ``sets``; returns the feature dimension."""
    for set_name in sets:
        feats = members[f"{set_name}_features"]
        if len(feats.shape) != 2:
            raise StoreError(f"'{src}': '{feats.name}' must be 2-D (rows x dim), got shape {feats.shape}")
        if feats.dtype.kind != "f":
            raise StoreError(f"'{src}': '{feats.name}' has dtype {feats.dtype}; features must be floating point")
        if feats.shape[0] == 0 or feats.shape[1] == 0:
            raise StoreError(f"'{src}': '{feats.name}' is empty (shape {feats.shape})")
        for field in ("pids", "camids"):
            ids = members[f"{set_name}_{field}"]
            if len(ids.shape) != 1:
                raise StoreError(f"'{src}': '{ids.name}' must be 1-D, got shape {ids.shape}")
            if ids.dtype.kind not in "iu":
                raise StoreError(f"'{src}': '{ids.name}' has dtype {ids.dtype}; ids must be integers")
            if ids.shape[0] != feats.shape[0]:
                raise StoreError(f"'{src}': '{ids.name}' has {ids.shape[0]} entries but '{feats.name}' has "
                                 f"{feats.shape[0]} rows; features, pids and camids must have one entry per image")
    dims = {set_name: members[f"{set_name}_features"].shape[1] for set_name in sets}
    if len(set(dims.values())) > 1:
        raise StoreError(f"'{src}': query features have dimension {dims['query']} "
                         f"but gallery features have {dims['gallery']}")
    return int(dims[sets[0]])


def _batches(members: dict, set_name: str, step: int):
    """(start, features, pids, camids) per block of ``step`` rows of one set."""
    streams = (members[f"{set_name}_{field}"].blocks(step) for field in ("features", "pids", "camids"))
    start = 0
    for feats, pids, camids in zip(*streams):
        yield start, feats, pids, camids
        start += feats.shape[0]


def _check_values(members: dict, set_name: str, step: int, dim: int, dtype: np.dtype, src: str) -> None:
    """Every row as ``store.check_batch`` checks it before writing (finite features representable in
    the stored dtype, ids that fit int64), a block at a time."""
    for start, feats, pids, camids in _batches(members, set_name, step):
        check_batch(feats, pids, camids, f"'{src}': {set_name}", dim, dtype, start)


def append_npz(input_npz, store_target, paths=None, keys=None) -> Store:
    """Append the gallery rows of an input ``convert`` reads (``gallery_features``,
    ``gallery_pids``, ``gallery_camids`` or ``gf``, ``g_pids``, ``g_camids``, or another known name,
    or ``keys``) to an existing store, streamed a store chunk at a time, with their image ``paths``
    if the store holds gallery paths.  Every gallery variant of the store gets its new rows from the
    input's arrays ``variant.NAME`` (and ``variant.NAME.corruption_type`` / ``.severity`` when the
    variant has them; docs/variants.md).  Everything is checked before the store is touched; the rows
    become visible only once all are written (``store.append_batches``)."""
    from ..store.variants import input_variants

    store = appendable(store_target)
    with open_source(input_npz) as source:
        if store.cameras:
            found = match(source, ["gallery_features", "gallery_pids", "gallery_camids"], parse_keys(keys))
        else:  # converted from an input without camera ids: its new rows come without them too
            found = match(source, ["gallery_features", "gallery_pids"], parse_keys(keys), optional=["gallery_camids"])
            if "gallery_camids" in found:
                raise StoreError(f"'{store.path}' has no camera ids (its input had none): the camera ids "
                                 f"'{found['gallery_camids'].name}' of '{source.path}' cannot be appended to it; "
                                 "convert the whole gallery again with them")
        members = _members(source, found, {}, store.cameras)
        dim = _check_headers(members, source.path, sets=("gallery",))
        if dim != store.dim:
            raise StoreError(f"'{source.path}': gallery features have dimension {dim} but the store's have {store.dim}")
        step = store.gallery.chunk_rows
        _check_values(members, "gallery", step, dim, store.gallery.features.dtype, source.path)
        return append_batches(store_target, members["gallery_features"].shape[0], _batches(members, "gallery", step),
                              paths, input_variants(source.arrays, source.path))


# ------------------------------------------------------------------------------------------ matrices


def _convert_matrix(source, out, kind, keys, given, chunk_rows, overwrite):
    """A query x gallery matrix (and optionally query x query) with its ids -> a distance store."""
    from ..store.distances import write_distance_store

    conventions = {**CONVENTIONS, **MATRIX_CONVENTIONS[kind]}
    found, cameras = _match_ids(source, ["distances"], keys, given, optional=["query_distances"],
                                conventions=conventions, ids_elsewhere=True)
    members = _members(source, found, given, cameras)
    ids = [members[f"{s}_{field}"].whole() for s in SETS for field in ("pids", "camids")]
    query_distances = members.get("query_distances")
    store = write_distance_store(out, members["distances"].matrix(), *ids, kind=kind, chunk_rows=chunk_rows,
                                 query_distances=None if query_distances is None else query_distances.matrix(),
                                 overwrite=overwrite, cameras=cameras)
    try:
        _write_paths(out, given)
    except BaseException:
        if is_local_path(out):
            shutil.rmtree(out, ignore_errors=True)
        raise
    return store, found, cameras


# ------------------------------------------------------------------------------------------ eval


@contextlib.contextmanager
def evaluation_store(target, *, convert_to=None, overwrite: bool = False, state=None, say=None, **reading):
    """``eval``'s input as a store: ``target`` itself if it is one; otherwise ``target`` converted
    (``reading``: ``convert``'s keywords) into the store ``convert_to``, or into a temporary store
    removed afterwards.  ``say``: called with the line telling so, once converted."""
    from ..io import is_store

    if is_store(target):
        if convert_to is not None or any(value for value in reading.values()):
            raise OptionError(f"'{os.fspath(target)}' is a store: --convert-to, --key, --query-ids, --gallery-ids, "
                              "--ids-from, --distances and --similarity apply to a file that eval converts first")
        yield target
        return
    if state is not None and convert_to is None:
        raise OptionError("--state is for 'streameval update' of the evaluated store, but a converted input's store "
                          "is temporary: add --convert-to PATH to keep it")
    if state is not None:
        from ..core.outputs import check_folder
        from ..run.statestore import check_writable

        check_folder(state, "state directory")  # before the conversion, as eval checks its outputs first
        check_writable(state, overwrite)

    def tell(matching):
        if say is not None:
            kept = f"the store '{os.fspath(convert_to)}'" if convert_to is not None else \
                "a temporary store (removed after the evaluation; --convert-to PATH keeps it)"
            say(f"'{os.fspath(target)}' is not a store: converted it to {kept}; {matching}")

    if convert_to is not None:
        yield convert(target, convert_to, overwrite=overwrite, report=tell, **reading).path
        return
    with outputs.temporary_folder() as folder:
        yield convert(target, os.path.join(folder, "store.zarr"), report=tell, **reading).path


