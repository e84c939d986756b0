"""Several feature variants of one set read as a single set (docs/suites.md#execution-one-pass-per-gallery-variant).

A suite scores every query variant paired with one gallery variant in one pass over that gallery:
the variants, each over the same n rows, are stacked into one query set of k x n rows.  Row i of the
stack holds the features of variant i // n at row i % n; its ids are the shared ids of row i % n,
and it is that row for everything drawn or matched by row number (``FeatureSet.period``): trial
draws, sgs draws, a query's own row.  Each row keeps its own per-query state, so the stack's state
splits back into one state per variant.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from .layout import FeatureSet
from .reading import read_field, rows_fingerprint


class StackedField:
    """One field (features, pids or camids) of equal-length sets, stacked by rows: the array-like
    ``read_field`` reads through ``oindex``.  Each piece is read by ``read_field`` on its own set, so
    a damaged chunk or a non-finite value is reported in that set's name and rows."""

    def __init__(self, sets: tuple, field: str):
        first = getattr(sets[0], field)
        self.sets, self.field, self.period = sets, field, len(sets[0])
        self.shape = (self.period * len(sets),) + tuple(first.shape[1:])
        self.dtype, self.ndim, self.chunks = first.dtype, first.ndim, first.chunks
        self.oindex = self

    def __getitem__(self, key) -> np.ndarray:
        rows = key[0] if isinstance(key, tuple) else key
        index = np.arange(*rows.indices(self.shape[0])) if isinstance(rows, slice) else np.asarray(rows, np.int64)
        out = np.empty((index.shape[0],) + self.shape[1:], dtype=self.dtype)
        piece = index // self.period
        for p in np.unique(piece):
            at = np.flatnonzero(piece == p)
            local = index[at] - p * self.period
            contiguous = local.size and local[-1] - local[0] == local.size - 1 and np.all(np.diff(local) == 1)
            selection = slice(int(local[0]), int(local[-1]) + 1) if contiguous else local
            out[at] = read_field(self.sets[p], self.field, selection)
        return out


@dataclass(frozen=True)
class Stack:
    """How a stack of sets is fingerprinted (``FeatureSet.reader``): its pieces' fingerprints, in order."""

    sets: tuple

    def fingerprint(self, fs: FeatureSet, rows: int) -> str:
        digest = hashlib.blake2b(digest_size=16)
        for piece in self.sets:
            digest.update(rows_fingerprint(piece, len(piece)).encode())
        return digest.hexdigest()


def stack_sets(sets: list[FeatureSet], name: str) -> FeatureSet:
    """The sets (variants of one set: equal rows, shared ids) as one set of len(sets) x rows rows."""
    sets = tuple(sets)
    rows = len(sets[0])
    fields = {field: StackedField(sets, field) for field in ("features", "pids", "camids")}
    return FeatureSet(name, fields["features"], fields["pids"], fields["camids"], rows * len(sets), period=rows,
                      reader=Stack(sets))
