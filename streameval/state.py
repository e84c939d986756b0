"""Additive per-query state: what one (query block, gallery chunk) task contributes.

States are integer counts, so merging is exact and order-free: any tree of merges over any chunking
gives the same numbers.  Ratios are only formed at the end (``metrics.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RankState:
    """``neg_slots``: per positive slot of a query block, the number of negatives in that slot.

    See ``kernels.count_negative_slots`` for the slot definition; the layout follows the block's
    ``Positives.offsets``.
    """

    neg_slots: np.ndarray

    @classmethod
    def empty(cls, n_positives: int) -> "RankState":
        return cls(neg_slots=np.zeros(n_positives, dtype=np.int64))

    @staticmethod
    def merge(a: "RankState", b: "RankState") -> "RankState":
        return RankState(neg_slots=a.neg_slots + b.neg_slots)
