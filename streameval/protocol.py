"""Who is junk, positive or negative for a query (METRICS.md section 2), and the positives' order.

* Junk: gallery items whose pid is in ``junk_pids``, and, with protocol ``market``, items with the
  query's pid AND camera.  Junk is ignored by the ranking metrics.
* Positives: non-junk items with the query's pid.  Negatives: every other non-junk item.

Positives are few (a handful per query), so they are found first, from ids alone, and their exact
distances computed pair by pair (``state.Positives`` keeps them sorted by ``(distance, gallery
index)``: the order every later count is taken against).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import OptionError

PROTOCOLS = ("market", "none")


@dataclass(frozen=True)
class Protocol:
    """``camera_filter``: same-pid same-camera items are junk (protocol ``market``)."""

    camera_filter: bool
    junk_pids: np.ndarray

    @classmethod
    def from_options(cls, protocol: str, junk_pids) -> "Protocol":
        if protocol not in PROTOCOLS:
            raise OptionError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        return cls(camera_filter=protocol == "market", junk_pids=np.unique(np.asarray(list(junk_pids), dtype=np.int64)))

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
