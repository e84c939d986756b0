"""The kNN pass: every row of a union of sets against every row of it (re-ranking's U x U, query
expansion's neighbours), keeping each row's exact top-k list and its exact farthest distance.

Rows of U are numbered through the sets in order (queries 0..nq-1, then gallery nq..N-1).  A list
holds the k smallest keys (canonical distance, U row) of its row, the row itself included at
distance 0 (its canonical value is forced to 0; an exact duplicate at distance 0 and a lower row
number comes first).  ``farthest`` is the largest canonical distance over all of U.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Neighbours:
    """Each U row's exact top-k: ``index`` (N, k) int64 U rows and ``dist`` (N, k) float64 canonical
    distances, ascending by (distance, row); ``farthest`` (N,) float64; ``metric`` the engine metric
    of the distances; ``refined``: pairs whose order the fast distances left open, settled exactly."""

    index: np.ndarray
    dist: np.ndarray
    farthest: np.ndarray
    metric: str
    refined: int = 0

    @property
    def k(self) -> int:
        return self.index.shape[1]
