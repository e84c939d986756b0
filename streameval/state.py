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
    * ``clipped``: (queries, 2) negatives whose distance fixed GOM normalisation clipped, below LO
      and above HI; ``pair_range``: (queries, 2) the min and max (canonical) distance of all the
      query's pairs, [inf, -inf] before any.  Zero columns unless the normalisation is fixed.

    ``merge`` adds the counts and takes the min / max of the ranges: exact, in any order.
    """

    neg_slots: np.ndarray
    neg_hist: np.ndarray
    clipped: np.ndarray
    pair_range: np.ndarray

    @classmethod
    def empty(cls, n_positives: int, n_queries: int, n_hist: int, clipping: bool = False) -> "RankState":
        width = 2 if clipping else 0
        return cls(np.zeros(n_positives, dtype=np.int64), np.zeros((n_queries, n_hist), dtype=np.int64),
                   np.zeros((n_queries, width), dtype=np.int64),
                   np.tile(np.array([np.inf, -np.inf])[:width], (n_queries, 1)))

    def copy(self) -> "RankState":
        return RankState(*(np.array(arr, copy=True) for arr in self.arrays))

    @property
    def arrays(self) -> tuple:
        return self.neg_slots, self.neg_hist, self.clipped, self.pair_range

    @staticmethod
    def merge(a: "RankState", b: "RankState") -> "RankState":
        low = np.minimum(a.pair_range[:, :1], b.pair_range[:, :1])
        high = np.maximum(a.pair_range[:, 1:], b.pair_range[:, 1:])
        return RankState(a.neg_slots + b.neg_slots, a.neg_hist + b.neg_hist, a.clipped + b.clipped,
                         np.concatenate([low, high], axis=1))

    def take(self, offsets: np.ndarray, queries: np.ndarray) -> "RankState":
        """The state of ``queries`` (in that order); ``offsets`` is this state's slot layout."""
        return RankState(self.neg_slots[segment_positions(offsets, queries)], self.neg_hist[queries],
                         self.clipped[queries], self.pair_range[queries])

    @staticmethod
    def scatter(offsets: np.ndarray, n_hist: int, pieces: list) -> "RankState":
        """The state of all queries in slot layout ``offsets``, from ``(queries, RankState)`` pieces
        that together cover every query once (each piece's state in its ``queries``' order)."""
        out = RankState.empty(int(offsets[-1]), offsets.shape[0] - 1, n_hist, pieces[0][1].clipped.shape[1] > 0)
        for queries, piece in pieces:
            out.neg_slots[segment_positions(offsets, queries)] = piece.neg_slots
            for mine, theirs in zip(out.arrays[1:], piece.arrays[1:]):
                mine[queries] = theirs
        return out

    @staticmethod
    def concat(parts: list["RankState"]) -> "RankState":
        """Consecutive query blocks joined in query order."""
        return RankState(*(np.concatenate(arrays) for arrays in zip(*(p.arrays for p in parts))))


@dataclass(frozen=True)
class QueryState:
    """The reduced state of every query over gallery rows [0, ``gallery_rows``).

    ``dist_range``: the global (min, max) distance of ``minmax`` GOM normalisation, else None.
    """

    positives: Positives
    ranks: RankState
    dist_range: object  # gom.DistanceRange | None
    gallery_rows: int

    def clipping(self, lo: float, hi: float) -> dict:
        """What fixed GOM normalisation to [lo, hi] clipped (``RankState.clipped``): the pairs GOM
        thresholds (positives, from their exact distances, and negatives; junk is not thresholded)
        below LO and above HI, out of ``pairs``, and the range of all pairs' distances, the one
        minmax would take (``RankState.pair_range``; None without pairs)."""
        lo, span = float(lo), float(hi) - float(lo)
        dist = self.positives.dist
        low = self.ranks.pair_range[:, 0].min(initial=np.inf)
        high = self.ranks.pair_range[:, 1].max(initial=-np.inf)
        n_queries = self.positives.n_queries
        return {
            "below": int(self.ranks.clipped[:, 0].sum() + (dist < lo).sum()),  # as kernels.clip_side
            "above": int(self.ranks.clipped[:, 1].sum() + (dist - lo > span).sum()),
            "pairs": n_queries * self.gallery_rows - int(self.positives.junk.sum()),
            "observed_min": float(low) if low <= high else None,
            "observed_max": float(high) if low <= high else None,
        }
