"""Who is junk, positive or negative for a query (METRICS.md section 2), and the positives' order.

* Junk: gallery items whose pid is in ``junk_pids``, and, with protocol ``market``, items with the
  query's pid AND camera.  Junk is ignored by the ranking metrics.
* Positives: non-junk items with the query's pid.  Negatives: every other non-junk item.

Positives are few (a handful per query), so they are found first, from ids alone, and their exact
distances computed pair by pair (``state.Positives`` keeps them sorted by ``(distance, gallery
index)``: the order every later count is taken against).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np

from .choices import INT64_MAX, INT64_MIN, PROTOCOLS
from .errors import OptionError



@dataclass(frozen=True)
class Protocol:
    """``camera_filter``: same-pid same-camera items are junk (protocol ``market``)."""

    camera_filter: bool
    junk_pids: np.ndarray

    @classmethod
    def from_options(cls, protocol: str, junk_pids) -> "Protocol":
        if protocol not in PROTOCOLS:
            raise OptionError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        return cls(camera_filter=protocol == "market", junk_pids=np.unique(np.asarray(_junk_list(junk_pids), dtype=np.int64)))

    def junk_mask(self, g_pid: np.ndarray) -> np.ndarray:
        """uint8 flag per gallery item: 1 when its pid is a junk pid (junk for every query)."""
        return np.isin(g_pid, self.junk_pids).astype(np.uint8)

    def positive_pairs(self, q_pid, q_cam, g_pid, g_cam, g_junk):
        """Positive pairs between a query block and a chunk, and each query's junk count there.

        Returns (query rows, gallery rows, junk per query): junk pids plus, under ``market``,
        same-pid same-camera items.
        """
        order = np.argsort(q_pid, kind="stable")
        sorted_pids = q_pid[order]
        candidates = np.flatnonzero((g_junk == 0) & np.isin(g_pid, sorted_pids))
        first = np.searchsorted(sorted_pids, g_pid[candidates], side="left")
        last = np.searchsorted(sorted_pids, g_pid[candidates], side="right")
        per_candidate = last - first
        grows = np.repeat(candidates, per_candidate)
        # positions first[c], first[c]+1, ..., last[c]-1 for each candidate, flattened
        starts = np.repeat(first - np.cumsum(per_candidate) + per_candidate, per_candidate)
        qrows = order[starts + np.arange(grows.shape[0])]
        junk = np.full(q_pid.shape[0], int(g_junk.sum()), dtype=np.int64)
        if self.camera_filter:
            keep = q_cam[qrows] != g_cam[grows]
            junk += np.bincount(qrows[~keep], minlength=q_pid.shape[0])
            qrows, grows = qrows[keep], grows[keep]
        return qrows.astype(np.int64), grows.astype(np.int64), junk


def _junk_list(junk_pids) -> list[int]:
    """The junk pids as Python ints within int64 (the stores' pid type; its minimum is reserved)."""
    try:
        pids = [operator.index(p) for p in junk_pids]
    except TypeError:
        raise OptionError(f"junk_pids must be integers, got {junk_pids!r}") from None
    outside = [p for p in pids if not INT64_MIN < p <= INT64_MAX]
    if outside:
        raise OptionError(f"junk pid {outside[0]} is outside the pid range (64-bit signed integers above {INT64_MIN})")
    return pids
