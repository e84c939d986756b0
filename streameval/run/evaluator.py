"""``Evaluator``: an evaluation fed batch by batch, as a training loop produces features
(``add_queries`` / ``add_gallery``, then ``compute``, ``reset``), in bounded memory (docs/evaluator.md).

Batches are kept as given (numpy arrays, or torch tensors moved to the host: ``io.arrays.host_array``)
until they pass the buffer budget; then every row held goes into the evaluator's store, a temporary
one (removed by ``reset``, ``close``, the end of a ``with`` block, garbage collection or the
interpreter's exit) or the one named by ``path`` (kept: a normal store).  ``compute`` writes the
rows still held there too and evaluates the store with the options given: memory holds no row then,
and the result is ``evaluate``'s on the concatenated arrays (which writes them to a store in memory:
the numbers do not depend on the store's chunks)."""

from __future__ import annotations

import inspect
import weakref
from contextlib import ExitStack

import numpy as np
import zarr.storage

from ..core.choices import check_range
from ..core.errors import OptionError, StoreError
from ..core.locking import writing
from ..core.outputs import check_folder, temporary_folder
from ..engine.plan import default_chunk_rows, parse_bytes
from ..io.arrays import host_array
from ..store import (FIELDS, array_dtype, check_batch, commit_gallery, create_store, describe, new_store,
                     refuse_existing, write_rows, write_store)
from .evaluation import evaluate
from .pipeline import feature_requests
from .settings import PROTOCOL_OPTIONS, Execution, Settings
from .result import Result

SIDES = ("query", "gallery")
# bytes of batches held before they go to the store: the memory they took may stay with the process
# (the allocator keeps what they free) and add to the evaluation's, so a fraction of it
DEFAULT_BUFFER_BUDGET = 64 << 20


class Evaluator:
    """Query and gallery rows added in batches, evaluated by ``compute()`` exactly as ``evaluate``
    evaluates the same rows given at once.

    ``options``: ``evaluate``'s keywords (metric, protocol, its overrides, the features' and the
    execution keywords), checked here.  ``buffer_budget``: bytes of added rows held in memory (a
    size such as "64MiB"; 0: each chunk of rows is written as soon as it is full) before they go to
    the store;
    ``path``: the store's path (kept, and replaced only with ``overwrite``), by default a temporary
    one; ``chunk_rows``: the store's rows per chunk (default: ~8 MiB chunks).
    """

    def __init__(self, *, buffer_budget=DEFAULT_BUFFER_BUDGET, path=None, overwrite: bool = False,
                 chunk_rows: int | None = None, **options):
        check_options(options)
        self.options = options
        self.buffer_budget = check_range(parse_bytes(buffer_budget), "buffer_budget")
        self.chunk_rows = None if chunk_rows is None else check_range(chunk_rows, "chunk_rows")
        self.path = path
        if path is not None:
            check_folder(path, "store")
            refuse_existing(path, overwrite)
        self._overwrite = overwrite
        self._temporary = None  # the finaliser that removes a temporary store's folder
        self._clear()

    def add_queries(self, features, pids, camids) -> None:
        """Add query rows: one batch, or lists (tuples) of batches, one item per batch in each."""
        self._add("query", features, pids, camids)

    def add_gallery(self, features, pids, camids) -> None:
        """Add gallery rows: one batch, or lists (tuples) of batches, one item per batch in each."""
        self._add("gallery", features, pids, camids)

    def compute(self) -> Result:
        """``evaluate`` on every row added so far (more may be added after, and computed again)."""
        missing = [side for side in SIDES if not self._rows[side]]
        if missing:
            calls = ", ".join(f"add_{side_method(side)}" for side in missing)
            raise OptionError(f"compute() needs query and gallery rows; none added yet to the "
                              f"{' and the '.join(missing)} ({calls})")
        self._spill(whole=True)  # the store then holds every row, and memory none: the evaluation's own is all it takes
        return evaluate(self._store.opened(), **self.options)

    def reset(self) -> None:
        """Forget every row added (a temporary store is removed; a store at ``path`` is kept as it
        is, and replaced by the next rows that go to a store)."""
        self._remove_temporary()
        if self._store is not None and self.path is not None:
            self._overwrite = True  # the store there is this evaluator's own
        self._clear()

    close = reset

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        held = f"{self._held:,} bytes held" + ("" if self._store is None else f", the rest in {self._store.where}")
        return f"Evaluator({self._rows['query']:,} queries, {self._rows['gallery']:,} gallery rows; {held})"

    def _clear(self) -> None:
        self._buffer = {side: [] for side in SIDES}  # (features, pids, camids) batches not in the store yet
        self._held = 0  # their bytes
        self._rows = dict.fromkeys(SIDES, 0)
        self._batches = dict.fromkeys(SIDES, 0)  # added, empty ones too: the numbers messages name
        self._first = None  # (dimension, dtype) of the first batch with rows: every batch's
        self._store = None  # GrowingStore where rows past the buffer budget went

    @property
    def _layout(self) -> tuple:
        """A store's dimension, dtype (``write_store``'s of arrays: ``array_dtype``) and chunk rows (by
        default those of ~8 MiB chunks, as synth and convert make them)."""
        dim, dtype = self._first
        dtype = array_dtype(dtype)
        return dim, dtype, self.chunk_rows or default_chunk_rows(dim, dtype.itemsize)

    def _add(self, side: str, features, pids, camids) -> None:
        """Check every batch first: a refused call adds nothing."""
        first, checked = self._first, []
        for index, batch in enumerate(batches_of(side, features, pids, camids), self._batches[side]):
            columns, first = checked_batch(f"{side} batch {index}", *batch, first)
            checked.append(columns)
        self._first = first
        self._batches[side] += len(checked)
        for columns in filter(None, checked):
            self._buffer[side].append(columns)
            self._held += sum(column.nbytes for column in columns)
            self._rows[side] += len(columns[0])
        if self._held > self.buffer_budget:
            self._spill()

    def _spill(self, whole: bool = False) -> None:
        """The rows held into the evaluator's store (made by the first spill): every one if
        ``whole``, else those that fill its chunks (the others stay held: each chunk is written once)."""
        if self._store is None:
            self._store = GrowingStore(self._store_path(), *self._layout, overwrite=self._overwrite)
        for side in SIDES:
            self._buffer[side] = self._store.write(side, self._buffer[side], whole)
        self._held = sum(column.nbytes for side in SIDES for batch in self._buffer[side] for column in batch)

    def _store_path(self) -> str:
        if self.path is not None:
            return self.path
        self._remove_temporary()  # the folder of a store whose making failed
        cleanup = ExitStack()
        folder = cleanup.enter_context(temporary_folder())
        self._temporary = weakref.finalize(self, cleanup.close)  # also at the interpreter's exit
        return f"{folder}/evaluator.zarr"

    def _remove_temporary(self) -> None:
        if self._temporary is not None:
            self._temporary()
            self._temporary = None


def side_method(side: str) -> str:
    return {"query": "queries", "gallery": "gallery"}[side]


def check_options(options: dict) -> None:
    """Refuse what ``evaluate`` would refuse of ``options`` by its own parsing, before any row comes:
    the execution keywords (``Execution.from_options``) and the settings (``Settings.parse``, given
    a stand-in store of one row a side: what depends on the rows is checked by ``compute``)."""
    named = {name: parameter.default for name, parameter in inspect.signature(evaluate).parameters.items()
             if parameter.kind is parameter.KEYWORD_ONLY}
    given = {**named, **{key: value for key, value in options.items() if key in named}}
    rest = {key: value for key, value in options.items() if key not in named}
    overrides = {key: rest.pop(key) for key in PROTOCOL_OPTIONS if key in rest}
    requests, _ = feature_requests(rest)
    variants = [key for key in ("query_variant", "gallery_variant") if rest.pop(key, None) is not None]
    if variants:
        raise OptionError(f"{' and '.join(variants)}: feature variants are sets of a store (docs/variants.md); "
                          "an Evaluator's rows have none")
    Execution.from_options("Evaluator", rest)
    row = np.ones((1, 1), np.float32), [1], [1]
    stand_in = write_store(zarr.storage.MemoryStore(), *row, *row)
    gom = {key: given[key] for key in ("no_gom", "gom_norm", "gom_bins", "gom_b", "gom_vp")}
    Settings.parse(stand_in, given["metric"], given["protocol"], given["max_rank"], given["precision"],
                   given["std_ddof"], **gom, **requests, **overrides)


def batches_of(side: str, features, pids, camids) -> list[tuple]:
    """(features, pids, camids) of each batch given: lists (or tuples) of batches, or one batch."""
    if not isinstance(features, (list, tuple)):
        return [(features, pids, camids)]
    for name, ids in (("pids", pids), ("camids", camids)):
        if not isinstance(ids, (list, tuple)) or len(ids) != len(features):
            raise OptionError(f"add_{side_method(side)}: features are a list of {len(features)} batches, so {name} "
                              f"must be a list of as many batches, got {type(ids).__name__}"
                              + (f" of {len(ids)}" if isinstance(ids, (list, tuple)) else ""))
    return list(zip(features, pids, camids))


def checked_batch(where: str, features, pids, camids, first: tuple | None) -> tuple:
    """(the batch's columns as the store takes them, ``check_batch``, or None for a batch of no
    rows; the (dimension, dtype) every batch must have: ``first``'s, or this batch's)."""
    features, pids, camids = (host_array(value, f"{where} {name}") for name, value in
                              zip(FIELDS, (features, pids, camids)))
    if features.ndim != 2:
        raise StoreError(f"{where} features must be 2-D (rows x dim), got shape {features.shape}")
    if first is not None:
        for what, value, expected in (("dimension", features.shape[1], first[0]), ("dtype", features.dtype, first[1])):
            if value != expected:
                raise StoreError(f"{where} has {what} {value}, earlier batches {expected}")
    if features.shape[0] == 0 and pids.size == 0 and camids.size == 0:
        return None, first
    columns = check_batch(features, pids, camids, where, dtype=array_dtype(features.dtype))
    return columns, first or (features.shape[1], features.dtype)


def split_rows(batches: list, n: int) -> tuple[list, list]:
    """(the first ``n`` rows of ``batches``, the others), as lists of batches (views: nothing copied)."""
    head, rest = [], list(batches)
    while n > 0 and rest:
        batch = rest.pop(0)
        if len(batch[0]) > n:
            batch, left = (tuple(column[:n] for column in batch), tuple(column[n:] for column in batch))
            rest.insert(0, left)
        head.append(batch)
        n -= len(batch[0])
    return head, rest


class GrowingStore:
    """A store whose query and gallery sets grow as rows are written to them, under its writer lock
    (``locking.writing``); ``opened`` commits the gallery's rows and opens it, a normal store."""

    def __init__(self, target, dim: int, dtype: str, chunk_rows: int, overwrite: bool = False):
        self.target, self.where, self.chunk_rows = target, describe(target), chunk_rows
        with new_store(target, overwrite):  # a failure removes what was made
            made = create_store(target, chunk_rows, chunk_rows, dim, dtype, chunk_rows)  # (its chunks' shape)
            self.sets = {side: getattr(made, side) for side in SIDES}
            for side in SIDES:
                self._resize(side, 0)
        self.rows = dict.fromkeys(SIDES, 0)

    def write(self, side: str, batches: list, whole: bool = True) -> list:
        """Append the rows of ``batches`` to the set ``side``, a chunk at a time, each chunk written
        once: all of them, or (not ``whole``) those that fill chunks.  Returns the batches of the
        rows not written."""
        fs, rows, chunk = self.sets[side], self.rows[side], self.chunk_rows
        end = rows + sum(len(batch[0]) for batch in batches)
        end = end if whole else end // chunk * chunk
        if end <= rows:
            return batches
        try:
            with writing(self.target):
                self._resize(side, end)
                while rows < end:
                    piece, batches = split_rows(batches, min(end, (rows // chunk + 1) * chunk) - rows)
                    features, pids, camids = (np.concatenate(column) for column in zip(*piece))
                    write_rows(fs, rows, features, pids, camids)
                    rows += len(pids)
        except OSError as exc:  # no space left...: the rows stay held, all written again by the next try
            raise StoreError(f"cannot write the evaluator's store '{self.where}': {exc.strerror or exc}") from None
        self.rows[side] = rows
        return batches

    def opened(self):
        """The store with every row written, the gallery's committed: a normal store."""
        with writing(self.target):
            return commit_gallery(self.target)

    def _resize(self, side: str, rows: int) -> None:
        for field in FIELDS:
            array = getattr(self.sets[side], field)
            array.resize((rows, *array.shape[1:]))
