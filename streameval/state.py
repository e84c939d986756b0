"""Per-query state: everything streaming the gallery leaves behind, and how it merges.

* :class:`Positives` - each query's positives (CSR, sorted by ``(distance, gallery index)``, with
  their exact distances) and its junk count.  Found from ids in a pass of their own.
* :class:`RankState` - integer counts of each query's negatives: per positive *slot* (ranking) and
  per GOM threshold.  Additive over gallery rows: ``merge(a, b) = a + b`` for states taken against
  the same positives, so any chunking and any merge order give the same numbers.
* :class:`QueryState` - both for every query, plus the global distance range of ``minmax`` GOM:
  what ``metrics`` turns into numbers and what ``statestore`` persists for incremental updates.

Ratios are only formed at the end (``metrics.py``, ``gom.py``).  Positives and slot counts are CSR
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

    ``offsets[i]:offsets[i+1]`` indexes query i's entries in ``dist`` (float64) and ``gidx`` (global
    gallery row, int64).  ``junk[i]`` is the number of gallery items that are junk for query i.
    """

    offsets: np.ndarray
    dist: np.ndarray
    gidx: np.ndarray
    junk: np.ndarray

    @classmethod
    def from_pairs(cls, n_queries: int, qrows, gidx, dist, junk) -> "Positives":
        order = np.lexsort((gidx, dist, qrows))
        offsets = offsets_from_counts(np.bincount(qrows, minlength=n_queries))
        return cls(offsets, np.ascontiguousarray(dist[order]), np.ascontiguousarray(gidx[order]),
                   np.asarray(junk, dtype=np.int64))

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
        return Positives(offsets_from_counts(self.counts[queries]), self.dist[at], self.gidx[at], self.junk[queries])

    def union(self, other: "Positives") -> "Positives":
        """Positives of the same queries over this and ``other``'s (disjoint) gallery rows."""
        if other.dist.shape[0] == 0:  # the common update (distractors only): no re-sort
            return Positives(self.offsets, self.dist, self.gidx, self.junk + other.junk)
        return Positives.from_pairs(
            self.n_queries, np.concatenate([self.query_rows(), other.query_rows()]),
            np.concatenate([self.gidx, other.gidx]), np.concatenate([self.dist, other.dist]), self.junk + other.junk,
        )

    @staticmethod
    def concat(parts: list["Positives"]) -> "Positives":
        """Consecutive query blocks joined in query order."""
        return Positives(
            offsets_from_counts(np.concatenate([p.counts for p in parts])),
            np.concatenate([p.dist for p in parts]), np.concatenate([p.gidx for p in parts]),
            np.concatenate([p.junk for p in parts]),
        )


@dataclass(frozen=True)
class RankState:
    """Counts of a set of queries' negatives.

    * ``neg_slots``: per positive slot, the number of negatives in that slot (see
      ``kernels.score_block``); the layout follows the queries' ``Positives.offsets``.
    * ``neg_hist``: (queries, GOM bins + 2) negatives first returned at each threshold, the last
      column for never; zero columns when GOM is off.
    """

    neg_slots: np.ndarray
    neg_hist: np.ndarray

    @classmethod
    def empty(cls, n_positives: int, n_queries: int, n_hist: int) -> "RankState":
        return cls(np.zeros(n_positives, dtype=np.int64), np.zeros((n_queries, n_hist), dtype=np.int64))

    @staticmethod
    def merge(a: "RankState", b: "RankState") -> "RankState":
        return RankState(a.neg_slots + b.neg_slots, a.neg_hist + b.neg_hist)

    def take(self, offsets: np.ndarray, queries: np.ndarray) -> "RankState":
        """The state of ``queries`` (in that order); ``offsets`` is this state's slot layout."""
        return RankState(self.neg_slots[segment_positions(offsets, queries)], self.neg_hist[queries])

    @staticmethod
    def scatter(offsets: np.ndarray, n_hist: int, pieces: list) -> "RankState":
        """The state of all queries in slot layout ``offsets``, from ``(queries, RankState)`` pieces
        that together cover every query once (each piece's state in its ``queries``' order)."""
        out = RankState.empty(int(offsets[-1]), offsets.shape[0] - 1, n_hist)
        for queries, piece in pieces:
            out.neg_slots[segment_positions(offsets, queries)] = piece.neg_slots
            out.neg_hist[queries] = piece.neg_hist
        return out

    @staticmethod
    def concat(parts: list["RankState"]) -> "RankState":
        """Consecutive query blocks joined in query order."""
        return RankState(np.concatenate([p.neg_slots for p in parts]), np.concatenate([p.neg_hist for p in parts]))


@dataclass(frozen=True)
class QueryState:
    """The reduced state of every query over gallery rows [0, ``gallery_rows``).

    ``dist_range``: the global (min, max) distance of ``minmax`` GOM normalisation, else None.
    """

    positives: Positives
    ranks: RankState
    dist_range: object  # gom.DistanceRange | None
    gallery_rows: int
