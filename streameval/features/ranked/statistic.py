"""Ranked lists (docs/ranked-lists.md): per query, the k smallest keys (distance, gallery row) of
trial t's kept negatives and, with ``--with-junk``, of its excluded rows.

A list is a (k, 2) float64 array of keys sorted ascending: [canonical distance, extended gallery
row] (rows are exact in float64 below 2^53), padded with (inf, inf).  Two lists over disjoint
gallery rows merge into the k smallest keys of their union: exact in any chunking and merge order,
since the key is a strict total order and the distances are canonical.  The positives are not
listed: the positives pass knows them exactly, and ``ranked`` merges them in at the end.

A block is scanned twice per query, both times testing the fast distance against a limit first (the
loop's fast path; the membership test and the exact distance only for the few rows within it):

1. U = the k-th smallest *upper bound* (fast distance plus its error window) over the list's keys
   and the block's members, kept in a max-heap (an excluded-rows list caps U at its ceiling, see
   ``TopK``): at least k items are at most U, and a row whose fast distance is U or more cannot
   lower it;
2. the exact key of every member whose lower bound is at most U, inserted into the list.  A member
   whose lower bound exceeds U has k items before it, so it cannot be among the k smallest.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ...engine import kernels
from ...engine.statistic import Field, Statistic
from ...engine.block import kept_negative, trial_bit, widest

_jit = nb.njit(nogil=True, cache=True)
_inline = nb.njit(nogil=True, cache=True, inline="always")


@_inline
def _window(blk, i, j):
    return kernels.distance_window(blk.dist[i, j], blk.qn[i], blk.gn[j], blk.metric, blk.c_dot)


@_inline
def _is_positive(blk, i, j, w):
    """Whether row j is one of query i's positives: their canonical distances within the row's
    window are searched for its gallery row."""
    lo = blk.pos_off[i]
    hi = blk.pos_off[i + 1]
    d = blk.dist[i, j]
    g = blk.g_start + j
    m = lo + kernels.positives_before(blk.pos_d, blk.pos_g, lo, hi, d - w, np.int64(-1))
    found = False
    while m < hi and blk.pos_d[m] <= d + w:
        found |= blk.pos_g[m] == g
        m += 1
    return found


@_inline
def _excluded(blk, i, j):
    """Whether the protocol excludes row j for query i (junk pid, x_any, same pid but not a
    positive: x_same and the query's own copy)."""
    out = blk.g_dropped[blk.q_cix[i], j] != 0
    if (not out) & (blk.g_pid[j] == blk.q_pid[i]):
        out = not _is_positive(blk, i, j, _window(blk, i, j))
    return out


# The tests below combine with & (never ``and``): a short-circuit value returned by an inlined
# helper made numba's scan loops 4-5x slower.
@_inline
def _kept(blk, i, j, t):
    """Whether row j is a kept negative of query i in trial t."""
    return (trial_bit(blk.g_bits[j] & blk.q_bits[i], t) == 1) & kept_negative(blk, i, j)


@_inline
def _dropped(blk, i, j, t):
    """Whether row j is a row of trial t's gallery that the protocol excludes for query i."""
    return (trial_bit(blk.g_bits[j] & blk.q_bits[i], t) == 1) & _excluded(blk, i, j)


@_inline
def _reach(blk, i, d, gn_max):
    """A fast distance past which no row's lower bound (fast distance minus its window) is at most
    ``d``: ``d`` plus twice the widest window at ``d``.  Windows grow with the gallery norm, and a
    euclidean one shrinks as the distance grows (``kernels.distance_window``), so twice the window
    at ``d`` covers every row beyond it (``block.reach`` takes the window at distance 0: for
    euclidean distances hundreds of rows per query more would need their window computed)."""
    return d + 2.0 * kernels.distance_window(d, blk.qn[i], gn_max, blk.metric, blk.c_dot)


@_inline
def _update(blk, t, member, keys, ceilings, bounds):
    """keys[i]: query i's list (see the module docstring) of the rows ``member`` (``_kept`` or
    ``_dropped``) admits, up to distance ceilings[i] at least; ``bounds``: scratch of k float64.
    Each kernel below is compiled with its own test (a runtime switch between them slowed the scan)."""
    gn_max = widest(blk)
    for i in range(blk.dist.shape[0]):
        for m in range(bounds.shape[0]):  # the list's distances, descending: a max-heap
            bounds[m] = keys[i, bounds.shape[0] - 1 - m, 0]
        cut = min(bounds[0], ceilings[i])
        for j in range(blk.dist.shape[1]):
            if blk.dist[i, j] >= cut:  # its upper bound (distance plus window) cannot be below U
                continue
            if member(blk, i, j, t):
                kernels.push_bound(bounds, blk.dist[i, j] + _window(blk, i, j))
                cut = min(bounds[0], ceilings[i])
        limit = _reach(blk, i, cut, gn_max)
        for j in range(blk.dist.shape[1]):
            if blk.dist[i, j] > limit:
                continue
            w = _window(blk, i, j)
            if blk.dist[i, j] - w <= cut and member(blk, i, j, t):
                exact = blk.dist[i, j]
                if w != 0.0:
                    exact = kernels.canonical_distance(blk.qf, blk.gf, i, j, blk.qa[i], blk.ga[j], blk.metric)
                kernels.insert_key(keys[i], exact, np.float64(blk.g_start + j))


@_jit
def update_kept(blk, t, keys, ceilings, bounds):
    _update(blk, t, _kept, keys, ceilings, bounds)


@_jit
def update_excluded(blk, t, keys, ceilings, bounds):
    _update(blk, t, _dropped, keys, ceilings, bounds)


class TopK(Statistic):
    """Field ``kept``: the k smallest kept negatives of trial ``trial``; ``excluded`` (with junk):
    the k smallest excluded rows of that trial's gallery before the k-th kept negative.

    Only excluded rows before the k-th kept row are ever shown, so the excluded list passes over
    rows past its state's k-th kept negative: that negative is never before the final one (more
    rows only lower it), so every row shown is still listed.  Without this ceiling a query with
    fewer than k excluded rows (a gallery without junk) would test every row of every block."""

    name = "topk"
    reads_distances = True

    def __init__(self, k: int, trial: int, with_junk: bool):
        self.k, self.trial = k, trial
        lists = ("kept", "excluded") if with_junk else ("kept",)
        self.fields = {name: Field("query", np.float64, (k, 2), np.inf, "own") for name in lists}
        self.option = ("--ranked-list", k, "entries per list", 16 * len(lists), "query")

    def update(self, blk, rows: slice, state: dict, aux, run) -> None:
        bounds = np.empty(self.k)
        kept = state["kept"]
        update_kept(blk, self.trial, kept, np.full(kept.shape[0], np.inf), bounds)
        if "excluded" in state:
            update_excluded(blk, self.trial, state["excluded"], kept[:, -1, 0], bounds)

    def merge_own(self, key: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return kernels.merge_smallest(a, b)


def list_problem(keys: np.ndarray, gallery_rows: int) -> str | None:
    """What is wrong with lists read back from a saved state, or None: keys sorted ascending, a
    padding (inf, inf) only after the entries, entries with finite distances and gallery rows in
    [0, gallery_rows)."""
    d, g = keys[..., 0], keys[..., 1]
    pad = np.isinf(d) & (d > 0) & np.isinf(g) & (g > 0)
    entry = np.isfinite(d) & (g >= 0) & (g < gallery_rows) & (g == np.floor(g))
    if not (pad | entry).all():
        return "holds an entry that is neither a (distance, gallery row) key nor padding"
    if (pad[..., :-1] & entry[..., 1:]).any():
        return "holds an entry after its padding"
    ordered = (d[..., :-1] < d[..., 1:]) | ((d[..., :-1] == d[..., 1:]) & (g[..., :-1] < g[..., 1:])) | pad[..., 1:]
    if not ordered.all():
        return "is not sorted by (distance, gallery row)"
    return None
