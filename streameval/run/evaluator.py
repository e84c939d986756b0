"""``Evaluator``: an evaluation fed batch by batch, as a training loop produces features
(``add_queries`` / ``add_gallery``, then ``compute``, ``reset``), in bounded memory (docs/evaluator.md).

Batches are kept as given (numpy arrays, or torch tensors moved to the host: ``io.arrays.host_array``)
until they pass the buffer budget; then every row held goes into the evaluator's store, a temporary
one (removed by ``reset``, ``close``, the end of a ``with`` block, garbage collection or the
interpreter's exit) or the one named by ``path`` (kept: a normal store).  ``compute`` evaluates the
store with the options given, after writing the rows still held; without a store yet it writes them
to a store in memory, as ``evaluate`` does with arrays, so the result is ``evaluate``'s on the
concatenated arrays either way.
"""

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
from ..engine.plan import parse_bytes
from ..io.arrays import host_array
from ..store import (DEFAULT_CHUNK_ROWS, FIELDS, array_dtype, check_batch, commit_gallery, create_store, describe, new_store,
                     refuse_existing, write_rows, write_store)
from .evaluation import evaluate
from .pipeline import feature_requests
from .settings import PROTOCOL_OPTIONS, Execution, Settings
from .result import Result

SIDES = ("query", "gallery")
DEFAULT_BUFFER_BUDGET = 256 << 20  # bytes of batches held before they go to the store


class Evaluator:
    """Query and gallery rows added in batches, evaluated by ``compute()`` exactly as ``evaluate``
    evaluates the same rows given at once.

    ``options``: ``evaluate``'s keywords (metric, protocol, its overrides, the features' and the
    execution keywords), checked here.  ``buffer_budget``: bytes of added rows held in memory (a
    size such as "256MiB"; 0 writes each batch to the store at once) before they go to the store;
    ``path``: the store's path (kept, and replaced only with ``overwrite``), by default a temporary
    one; ``chunk_rows``: the store's rows per chunk.
    """

    def __init__(self, *, buffer_budget=DEFAULT_BUFFER_BUDGET, path=None, overwrite: bool = False,
                 chunk_rows: int = DEFAULT_CHUNK_ROWS, **options):
        check_options(options)
        self.options = options
        self.buffer_budget = check_range(parse_bytes(buffer_budget), "buffer_budget")
        self.chunk_rows = check_range(chunk_rows, "chunk_rows")
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
            raise OptionError(f"compute() needs query and gallery rows; none added yet to the {' and the '.join(missing)}"
                              f" ({', '.join(f'add_{side_method(side)}' for side in missing)})")
        if self._store is None and self.path is None:
            return evaluate(self._written(GrowingStore(zarr.storage.MemoryStore(), *self._layout)).opened(),
                            **self.options)
        self._spill()
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
        """A store's dimension, dtype (``write_store``'s of arrays: ``array_dtype``) and chunk rows."""
        dim, dtype = self._first
        return dim, array_dtype(dtype), self.chunk_rows

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

    def _spill(self) -> None:
        """Every row held into the evaluator's store (made on the first spill)."""
        if self._store is None:
            self._store = GrowingStore(self._store_path(), *self._layout, overwrite=self._overwrite)
        self._written(self._store)
        self._buffer = {side: [] for side in SIDES}
        self._held = 0

    def _written(self, store: "GrowingStore") -> "GrowingStore":
        for side in SIDES:
            store.write(side, self._buffer[side])
        return store

    def _store_path(self) -> str:
        if self.path is not None:
            return self.path
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
    Settings.parse(stand_in, given["metric"], given["protocol"], given["max_rank"], given["precision"],
                   given["std_ddof"], **{key: given[key] for key in ("no_gom", "gom_norm", "gom_bins", "gom_b", "gom_vp")},
                   **requests, **overrides)


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


def chunk_pieces(batches: list, start: int, chunk_rows: int):
    """The rows of ``batches``, to be written from row ``start``, as (row, features, pids, camids)
    pieces that end where the store's chunks end: each chunk is written whole, once (but the last)."""
    held, row = [], start
    for batch in batches:
        while len(batch[0]):
            room = chunk_rows - (row + sum(len(piece[0]) for piece in held)) % chunk_rows
            held.append([column[:room] for column in batch])
            batch = [column[room:] for column in batch]
            if len(held[-1][0]) == room:
                yield (row, *(np.concatenate(column) for column in zip(*held)))
                row, held = row + sum(len(piece[0]) for piece in held), []
    if held:
        yield (row, *(np.concatenate(column) for column in zip(*held)))


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

    def write(self, side: str, batches: list) -> None:
        """Append the rows of ``batches`` to the set ``side``."""
        fs, rows = self.sets[side], self.rows[side]
        try:
            with writing(self.target):
                for start, features, pids, camids in chunk_pieces(batches, rows, self.chunk_rows):
                    self._resize(side, start + len(pids))
                    write_rows(fs, start, features, pids, camids)
                    rows = start + len(pids)
        except OSError as exc:  # no space left...: the rows stay held, written again by the next try
            raise StoreError(f"cannot write the evaluator's store '{self.where}': {exc.strerror or exc}") from None
        finally:
            self.rows[side] = rows  # the rows written whole (a later write resizes past them)

    def opened(self):
        """The store with every row written, the gallery's committed: a normal store."""
        with writing(self.target):
            return commit_gallery(self.target)

    def _resize(self, side: str, rows: int) -> None:
        for field in FIELDS:
            array = getattr(self.sets[side], field)
            array.resize((rows, *array.shape[1:]))
