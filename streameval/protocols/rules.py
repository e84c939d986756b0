"""Who is kept, positive or negative for a query (docs/protocols.md#the-kept-set), from ids alone.

The protocol is a record (``protocols.record.Protocol``); this module applies it to rows:

* ``Rules``: the record's junk pids, camera relations and restrictions as arrays and small tables.
  The kernels get a camera relation as a table over the cameras of a query block and a gallery
  chunk (``camera_codes``, ``camera_table``: one lookup per pair), never as a code path of its own.
* ``positive_pairs``: the positives of a query block in a chunk (same pid, kept), and each query's
  excluded rows per trial (its "junk", which GOM returns at tau = 1).

A gallery row g is kept for query q (in trial t) iff it is in the trial's gallery, its pid is not a
junk pid, not (same pid and (c(q), c(g)) in x_same), (c(q), c(g)) not in x_any, and it is not q's
own copy (with ``gallery_includes_queries``).  Positives are the kept rows with q's pid.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .draws import eligible_rows


def in_relation(relation, q_cam: np.ndarray, g_cam: np.ndarray) -> np.ndarray:
    """Elementwise (broadcast): whether each pair (q_cam, g_cam) is in ``relation`` (a
    ``protocols.record.CameraRelation``)."""
    inside = np.zeros(np.broadcast(q_cam, g_cam).shape, dtype=bool)
    if relation.equal:
        inside |= q_cam == g_cam
    for qc, gc in relation.pairs:
        inside |= (q_cam == qc) & (g_cam == gc)
    return inside


def relation_matrix(relation, q_cams: np.ndarray, g_cams: np.ndarray) -> np.ndarray:
    """bool (len(q_cams), len(g_cams)): whether each (query camera, gallery camera) pair is in ``relation``."""
    q_cams, g_cams = np.asarray(q_cams, dtype=np.int64), np.asarray(g_cams, dtype=np.int64)
    return in_relation(relation, q_cams[:, None], g_cams[None, :])


def camera_codes(cams: np.ndarray) -> tuple:
    """(the distinct cameras, sorted; each row's index among them as int64)."""
    codes, cix = np.unique(cams, return_inverse=True)
    return codes, cix.astype(np.int64)


def camera_table(relation, q_codes: np.ndarray, g_codes: np.ndarray) -> np.ndarray:
    """uint8 table over ``camera_codes``' cameras of a query block and a gallery chunk:
    table[q, g] = 1 when the pair (q_codes[q], g_codes[g]) is in ``relation``."""
    table = relation_matrix(relation, q_codes, g_codes).astype(np.uint8)
    return table if table.size else np.zeros((1, 1), dtype=np.uint8)


@dataclass(frozen=True)
class Rules:
    """The record as the engine applies it; ``n_stored``: stored gallery rows (the index of query
    0's copy when queries are included)."""

    protocol: object
    junk_pids: np.ndarray
    n_trials: int

    @classmethod
    def of(cls, protocol) -> "Rules":
        return cls(protocol, np.asarray(protocol.junk_pids, dtype=np.int64),
                   protocol.trials.count if protocol.trials else 1)

    def junk_mask(self, g_pid: np.ndarray) -> np.ndarray:
        """uint8 flag per gallery row: 1 when its pid is a junk pid (excluded for every query)."""
        return np.isin(g_pid, self.junk_pids).astype(np.uint8)

    def camera_bits(self, cams: np.ndarray, allowed) -> np.ndarray:
        """Trial bits of rows without drawn trials: all T bits for rows whose camera is allowed."""
        every = np.uint64((1 << self.n_trials) - 1)  # T <= 64 bits
        return np.where(eligible_rows(cams, allowed), every, np.uint64(0)).astype(np.uint64)

    def positive_pairs(self, q_pid, q_cam, q_index, q_bits, g_pid, g_cam, g_bits, g_start: int, own_start):
        """Positive pairs between a query block and a chunk of the extended gallery, with each
        pair's trial bits, and each query's excluded rows per trial (queries x T).

        ``q_index``: the block's query rows; ``g_start``: the chunk's first extended row;
        ``own_start``: the extended row of query 0's copy (None when queries are not included).
        Returns (query positions in the block, chunk positions, bits, excluded counts), the pairs
        ordered by (chunk position, query position).
        """
        p, n_trials = self.protocol, self.n_trials
        junk = self.junk_mask(g_pid).astype(bool)
        excluded = _in_trials(g_bits[junk], n_trials).sum(axis=0)[None, :].repeat(q_pid.shape[0], axis=0)
        q_codes, q_class = np.unique(q_cam, return_inverse=True)
        g_codes, g_class = np.unique(g_cam[~junk], return_inverse=True)
        per_camera = np.zeros((g_codes.shape[0], n_trials), dtype=np.int64)
        np.add.at(per_camera, g_class, _in_trials(g_bits[~junk], n_trials))
        excluded += (relation_matrix(p.x_any, q_codes, g_codes).astype(np.int64) @ per_camera)[q_class]
        qrows, grows = _same_pid_pairs(q_pid, g_pid, ~junk)
        bits = g_bits[grows] & q_bits[qrows]
        dropped = in_relation(p.x_any, q_cam[qrows], g_cam[grows])  # counted above
        own = np.zeros(qrows.shape, dtype=bool) if own_start is None else g_start + grows == own_start + q_index[qrows]
        gone = ~dropped & (in_relation(p.x_same, q_cam[qrows], g_cam[grows]) | own)
        np.add.at(excluded, qrows[gone], _in_trials(bits[gone], n_trials))
        keep = ~dropped & ~gone & (bits != 0)
        return qrows[keep], grows[keep], bits[keep], excluded * _in_trials(q_bits, n_trials)


def _in_trials(bits: np.ndarray, n_trials: int) -> np.ndarray:
    """int64 (rows, T): 1 where the row's trial bit t is set."""
    return ((bits[:, None] >> np.arange(n_trials, dtype=np.uint64)) & np.uint64(1)).astype(np.int64)


def _same_pid_pairs(q_pid: np.ndarray, g_pid: np.ndarray, candidates: np.ndarray):
    """(query positions, gallery positions) of every pair with equal pids among ``candidates`` rows,
    ordered by (gallery position, query position)."""
    order = np.argsort(q_pid, kind="stable")
    sorted_pids = q_pid[order]
    rows = np.flatnonzero(candidates & np.isin(g_pid, sorted_pids))
    first = np.searchsorted(sorted_pids, g_pid[rows], side="left")
    last = np.searchsorted(sorted_pids, g_pid[rows], side="right")
    per_row = last - first
    grows = np.repeat(rows, per_row)
    # positions first[c], first[c]+1, ..., last[c]-1 for each row, flattened
    starts = np.repeat(first - np.cumsum(per_row) + per_row, per_row)
    qrows = order[starts + np.arange(grows.shape[0])]
    return qrows.astype(np.int64), grows.astype(np.int64)
