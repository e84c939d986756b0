"""Per-query state: everything streaming the gallery leaves behind, and how it merges.

* :class:`Positives` - each query's positives (CSR, sorted by ``(distance, gallery index)``, with
  their exact distances and trials) and its junk counts.  Found from ids in a pass of their own.
* The statistics' counts (``statistics.StatState``), taken against those positives.
* :class:`QueryState` - both for every query, plus the distance ranges of ``minmax`` GOM: what
  ``metrics`` turns into numbers and what ``statestore`` persists for incremental updates.

Ratios are only formed at the end (the features' finalisation: ``features/closed_set/metrics.py``, ``features/gom/finalise.py``).  Positives and slot counts are CSR
arrays indexed by ``offsets``; ``take`` / ``scatter`` move whole queries between layouts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def offsets_from_counts(counts: np.ndarray) -> np.ndarray:
    offsets = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets


def segment_positions(offsets: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Flat positions of the CSR entries of ``queries``, query after query in the given order."""
    queries = np.asarray(queries, dtype=np.int64)
    starts = offsets[queries]
    counts = offsets[queries + 1] - starts
    shift = np.repeat(starts - (np.cumsum(counts) - counts), counts)
    return shift + np.arange(shift.shape[0], dtype=np.int64)


@dataclass(frozen=True)
class Positives:
    """Positives of a set of queries, in CSR form, each query's sorted by (distance, gallery index).

    ``offsets[i]:offsets[i+1]`` indexes query i's entries in ``dist`` (float64), ``gidx`` (extended
    gallery row, int64) and ``bits`` (uint64: bit t = the positive is in trial t, its query too).
    ``junk[i, t]`` is the number of trial-t gallery rows excluded for query i (docs/protocols.md#the-kept-set).
    """

    offsets: np.ndarray
    dist: np.ndarray
    gidx: np.ndarray
    bits: np.ndarray
    junk: np.ndarray

    @classmethod
    def from_pairs(cls, n_queries: int, qrows, gidx, dist, bits, junk) -> "Positives":
        return cls.from_parts(n_queries, [(qrows, gidx, dist, bits)], junk)

    @classmethod
    def from_parts(cls, n_queries: int, parts, junk) -> "Positives":
        """The positives of (qrows, gidx, dist, bits) pairs given in parts (a gallery chunk's each),
        placed by query and sorted (``kernels.place_by_query``, ``kernels.sort_each_query``)."""
        from .kernels import place_by_query, sort_each_query  # numba: not for the commands that only read a state

        parts = [(np.asarray(q, np.int64), np.asarray(g, np.int64), np.asarray(d, np.float64), np.asarray(b, np.uint64))
                 for q, g, d, b in parts]
        counts = np.zeros(n_queries, dtype=np.int64)
        for qrows, *_ in parts:
            counts += np.bincount(qrows, minlength=n_queries)
        offsets = offsets_from_counts(counts)
        fill = offsets[:-1].copy()
        size = int(offsets[-1])
        dist, gidx, bits = np.empty(size, np.float64), np.empty(size, np.int64), np.empty(size, np.uint64)
        for qrows, g, d, b in parts:
            place_by_query(qrows, d, g, b, fill, dist, gidx, bits)
        sort_each_query(offsets, dist, gidx, bits)
        return cls(offsets, dist, gidx, bits, np.asarray(junk, dtype=np.int64))

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def n_queries(self) -> int:
        return self.offsets.shape[0] - 1

    def query_rows(self) -> np.ndarray:
        """The query of every entry."""
        return np.repeat(np.arange(self.n_queries, dtype=np.int64), self.counts)

    def take(self, queries: np.ndarray) -> "Positives":
        """The positives of ``queries`` (in that order)."""
        at = segment_positions(self.offsets, queries)
        return Positives(offsets_from_counts(self.counts[queries]), self.dist[at], self.gidx[at], self.bits[at],
                         self.junk[queries])

    def subset(self, entries: np.ndarray) -> "Positives":
        """The same queries with only the entries at flat positions ``entries`` (ascending, each once)."""
        if entries.shape[0] == self.dist.shape[0]:  # every entry: nothing to gather
            return self
        counts = np.diff(np.searchsorted(entries, self.offsets))
        return Positives(offsets_from_counts(counts), self.dist[entries], self.gidx[entries], self.bits[entries],
                         self.junk)

    def union(self, other: "Positives") -> "Positives":
        """Positives of the same queries over this and ``other``'s (disjoint) gallery rows."""
        if other.dist.shape[0] == 0:  # the common update (distractors only): no re-sort
            return Positives(self.offsets, self.dist, self.gidx, self.bits, self.junk + other.junk)
        gidx, dist, bits = (np.concatenate([getattr(self, f), getattr(other, f)]) for f in ("gidx", "dist", "bits"))
        return Positives.from_pairs(self.n_queries, np.concatenate([self.query_rows(), other.query_rows()]), gidx, dist,
                                    bits, self.junk + other.junk)

    @staticmethod
    def concat(parts: list["Positives"]) -> "Positives":
        """Consecutive query blocks joined in query order."""
        if len(parts) == 1:  # one block (the usual run): nothing to join, no copy of its columns
            return parts[0]
        columns = (np.concatenate([getattr(p, name) for p in parts]) for name in ("dist", "gidx", "bits", "junk"))
        return Positives(offsets_from_counts(np.concatenate([p.counts for p in parts])), *columns)


@dataclass(frozen=True)
class QueryState:
    """The reduced state of every query over extended gallery rows [0, ``gallery_rows``).

    ``stats``: the statistics' counts (``statistics.StatState``); ``dist_range``: per trial, the
    (min, max) distance of ``minmax`` GOM normalisation (a list of ``ranges.DistanceRange``), else None.
    """

    positives: Positives
    stats: object  # statistics.StatState
    dist_range: list | None
    gallery_rows: int
