"""Additive per-query state: what one (query block, gallery chunk) task contributes.

States are integer counts, so merging is exact and order-free: any tree of merges over any chunking
gives the same numbers.  Ratios are only formed at the end (``metrics.py``, ``gom.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RankState:
    """Counts of one query block's negatives.

    * ``neg_slots``: per positive slot, the number of negatives in that slot (see
      ``kernels.score_block``); the layout follows the block's ``Positives.offsets``.
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
