"""Statistics: what the scoring pass counts per query, one mechanism for all of them.

Each statistic declares

* its per-query state (``fields``: arrays whose first axis runs over the queries or over their
  positives, in the layout of ``state.Positives.offsets``), with how two states of it merge
  (``sum``, ``min``, ``max`` - exact in any order - or its own ``merge``); or a state over all the
  pairs of a set of queries (axis ``global``: one array, not per query, e.g. a histogram or a tail
  of the smallest negative distances), merged the same way when query blocks are joined;
* its chunk update (``update``: a numba kernel over one :data:`~.block.Block` of dot products,
  with ``reads_distances`` when it reads the block's filled distances);
* optionally ``prepare``: per-query-block data its update needs (computed once per block);
* optionally ``limits``: how far from each query its update looks (the pairs it reads all lie
  within them), so a source that screens on a device copies back only those pairs' dot products;
* its finalisation, in ``metrics`` / ``gom`` / its own module, per trial.

The scoring pass (``graph.score_chunk``) computes one block of dot products and runs the requested
statistics on it (``StatState``).  Statistics: ``slots`` (ranking slots: CMC, AP, INP), ``gom``
(GOM threshold histograms), ``dedup`` (identity-dedup CMC), ``sgs`` (single-gallery-shot CMC),
``topk`` (ranked lists).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

import numpy as np

from .state import segment_positions


@dataclass(frozen=True)
class Field:
    """One array of a statistic's state: (``axis`` rows, *``shape``), ``dtype``, initial ``fill``,
    and how two states of it merge."""

    axis: str  # "query", "positive" or "global"
    dtype: type
    shape: tuple
    fill: object = 0
    merge: str = "sum"  # "sum", "min", "max", "own" (the statistic's merge) or "list" (below)
    # "list": a list of arrays (``shape``: the most they hold together), concatenated when states
    # merge; a task appends what it collected, and a chain's next task copies the list, not its items.


class Statistic:
    """Base class; see the package docstring.  Subclasses set ``name`` and ``fields``."""

    name = ""
    fields: dict = {}
    # (flag, value, unit, bytes one unit adds per row, the rows' axis): the option that sizes the
    # state, named by the memory account (``session.check_memory``) with the most that fits; () for none
    option: tuple = ()
    # Whether ``update`` reads the block's filled float64 distances (``Block.dist``); the others take
    # them from the dot products where they need them (``block`` module docstring), and a pass
    # fills the block only for a statistic that reads it.
    reads_distances = False

    def prepare(self, meta, queries, positives):
        """Per-query-block data for ``update`` (None unless a statistic needs some)."""
        return None

    def limits(self, blk):
        """Per query row of ``blk``, the fast distance beyond which ``update`` reads no pair of the
        block (its dot products there may be left unset: ``sources.DeviceSource.fill``); None where
        it reads every pair.  Asked before the block's dot products are made: read only the rest
        of it (terms, norms, positives).  ``update`` may take the rows ``block.device_hits`` lists
        from such a block instead of ``block.within``'s: a few beyond the limit, decided exactly."""
        return None

    def update(self, blk, rows: slice, state: dict, aux, run) -> None:
        """Add the block's pairs to ``state``: this statistic's arrays for the block's query rows
        ``rows`` (of the query block; positive-axis arrays whole), ``aux`` from ``prepare``, and
        ``run``: the pass's ``graph.PassContext`` (GOM normalisation, gallery metadata)."""
        raise NotImplementedError

    def merge_own(self, key: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def copy_own(self, key: str, a: np.ndarray) -> np.ndarray:
        """A copy of an own-merge field (a statistic whose buffers are mostly empty copies the used
        part only: every chunk task copies its predecessor's state)."""
        return a.copy()


_MERGES = {"sum": np.add, "min": np.minimum, "max": np.maximum}


def _filled(spec: Field, rows: tuple):
    """A new field array (an empty list for a list field); zeros by calloc, so a large buffer's
    untouched pages take no memory."""
    if spec.merge == "list":
        return []
    shape = rows + spec.shape
    return np.zeros(shape, spec.dtype) if spec.fill == 0 else np.full(shape, spec.fill, spec.dtype)


def _copied(stat, spec: Field, key: str, a):
    return stat.copy_own(key.split("/", 1)[1], a) if spec.merge == "own" else a.copy()


def _merged(stat, spec: Field, key: str, a, b):
    """Two states of one field merged as it declares."""
    if spec.merge == "own":
        return stat.merge_own(key.split("/", 1)[1], a, b)
    if spec.merge == "list":
        return a + b
    return _MERGES[spec.merge](a, b)


class StatState:
    """The state of several statistics for a set of queries: ``arrays[key]`` for key
    ``"<statistic>/<field>"``.  Moves whole queries between layouts (``take``, ``scatter``,
    ``concat``) and merges, field by field, as each field declares."""

    def __init__(self, statistics: tuple, arrays: dict):
        self.statistics = statistics
        self.arrays = arrays

    @staticmethod
    def specs(statistics) -> dict:
        """key -> (statistic, Field) for every field of ``statistics``."""
        return {f"{stat.name}/{name}": (stat, spec) for stat in statistics for name, spec in stat.fields.items()}

    @classmethod
    def empty(cls, statistics: tuple, n_queries: int, n_positives: int) -> "StatState":
        rows = {"query": (n_queries,), "positive": (n_positives,), "global": ()}
        return cls(statistics, {key: _filled(spec, rows[spec.axis]) for key, (_, spec) in cls.specs(statistics).items()})

    def copy(self) -> "StatState":
        """A copy for the next task of a chain."""
        specs = self.specs(self.statistics)
        return StatState(self.statistics, {key: _copied(*specs[key], key, arr) for key, arr in self.arrays.items()})

    def fields(self, statistic) -> dict:
        """The arrays of ``statistic`` by field name."""
        return {name: self.arrays[f"{statistic.name}/{name}"] for name in statistic.fields}

    @staticmethod
    def merge(a: "StatState", b: "StatState") -> "StatState":
        return StatState(a.statistics, {key: _merged(stat, spec, key, a.arrays[key], b.arrays[key])
                                        for key, (stat, spec) in StatState.specs(a.statistics).items()})

    def take(self, offsets: np.ndarray, queries: np.ndarray) -> "StatState":
        """The state of ``queries`` (in that order); ``offsets`` is this state's positives layout.
        Global fields stay whole: they cannot be split by query."""
        at = segment_positions(offsets, queries)
        index = {"query": queries, "positive": at}
        return StatState(self.statistics, {key: arr if spec.axis == "global" else arr[index[spec.axis]]
                                           for key, (_, spec), arr in self._items()})

    @staticmethod
    def scatter(statistics: tuple, offsets: np.ndarray, pieces: list) -> "StatState":
        """The state of all queries in positives layout ``offsets``, from ``(queries, StatState)``
        pieces that together cover every query once (each piece in its ``queries``' order)."""
        out = StatState.empty(statistics, offsets.shape[0] - 1, int(offsets[-1]))
        for queries, piece in pieces:
            at = segment_positions(offsets, queries)
            for key, (stat, spec), arr in out._items():
                if spec.axis == "global":
                    out.arrays[key] = _merged(stat, spec, key, arr, piece.arrays[key])
                else:
                    arr[queries if spec.axis == "query" else at] = piece.arrays[key]
        return out

    @staticmethod
    def concat(parts: list["StatState"]) -> "StatState":
        """Consecutive query blocks joined in query order."""
        if len(parts) == 1:  # one block (the usual run): its arrays as they are, in a dict of its own
            return StatState(parts[0].statistics, dict(parts[0].arrays))
        joined = {}
        for key, (stat, spec) in StatState.specs(parts[0].statistics).items():
            arrays = [p.arrays[key] for p in parts]
            joined[key] = (reduce(lambda a, b: _merged(stat, spec, key, a, b), arrays) if spec.axis == "global"
                           else np.concatenate(arrays))
        return StatState(parts[0].statistics, joined)

    def _items(self):
        specs = self.specs(self.statistics)
        return [(key, specs[key], arr) for key, arr in self.arrays.items()]
