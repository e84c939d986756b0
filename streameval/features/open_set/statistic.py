"""The nearest kept item of each open-set query (docs/open-set.md#how-it-is-computed).

A non-mated query's open-set score is s(q) = min over its kept rows K_t(q) of d (+inf when K_t(q) is
empty).  ``dist[i, t]`` holds that minimum as an exact (canonical) distance over the rows counted so
far; two states merge by ``min``: exact in any chunking and merge order.  Only the trials in which
query i has no positive need it (a query with one is mated there and scored by its best positive):
its kept rows in such a trial are all kept negatives (``block.kept_negative`` with the trial's bit),
and the other queries' values stay +inf.

A block is scanned twice per row that needs it, both scans testing the fast distance first:

1. per trial, F_t = the smallest fast distance of a kept row (no window, no exact distance), whose
   row's canonical distance is at most U_t = F_t + its window (the widest, with the largest gallery
   norm); so the minimum is at most cut_t = min(dist[i, t], U_t);
2. a kept row can lower it only if its lower bound (fast distance minus its own window) is at most
   cut_t: the fast test against cut_t plus twice the widest window at cut_t (as ``topk._reach``: a
   euclidean window shrinks as the distance grows, so the window at distance 0, ``block.reach``,
   would let far more rows through), then its own window, then its canonical distance.  Only rows
   within a window or two of the minimum get that far: a handful, whatever the gallery's order.
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
def _open_trials(blk, i):
    """The trial bits in which query i takes part but has no positive."""
    held = np.uint64(0)
    for m in range(blk.pos_off[i], blk.pos_off[i + 1]):
        held |= blk.pos_bits[m]
    return blk.q_bits[i] & ~held


@_inline
def _window(blk, i, d, gn):
    return kernels.distance_window(d, blk.qn[i], gn, blk.metric, blk.c_dot)


@_jit
def update_nearest(blk, dist):
    """dist[i, t] = min(dist[i, t], the canonical distance of each kept row of query i in trial t),
    for the trials in which query i has no positive."""
    n_trials = dist.shape[1]
    gn_max = widest(blk)
    cut = np.empty(n_trials)
    for i in range(blk.dist.shape[0]):
        need = _open_trials(blk, i)
        if need == 0:  # most rows: mated in every trial
            continue
        cut[:] = np.inf
        for j in range(blk.dist.shape[1]):
            bits = blk.g_bits[j] & need
            if kept_negative(blk, i, j) & (bits != 0):
                for t in range(n_trials):
                    if trial_bit(bits, t):
                        cut[t] = min(cut[t], blk.dist[i, j])
        furthest = -np.inf
        for t in range(n_trials):
            if trial_bit(need, t):
                cut[t] = min(dist[i, t], cut[t] + _window(blk, i, cut[t], gn_max))
                furthest = max(furthest, cut[t] + 2.0 * _window(blk, i, cut[t], gn_max))
            else:
                cut[t] = -np.inf  # no row's lower bound is below it
        for j in range(blk.dist.shape[1]):
            d = blk.dist[i, j]
            if d > furthest:  # the fast path: too far to lower any trial's minimum
                continue
            bits = blk.g_bits[j] & need
            if not (kept_negative(blk, i, j) & (bits != 0)):
                continue
            w = _window(blk, i, d, blk.gn[j])
            exact = np.nan
            for t in range(n_trials):
                if trial_bit(bits, t) & (d - w <= cut[t]):
                    if exact != exact:
                        exact = d if w == 0.0 else kernels.canonical_distance(blk.qf, blk.gf, i, j, blk.qa[i],
                                                                               blk.ga[j], blk.metric)
                    dist[i, t] = min(dist[i, t], exact)


class Nearest(Statistic):
    name = "nearest"
    reads_distances = True

    def __init__(self, n_trials: int):
        self.fields = {"dist": Field("query", np.float64, (n_trials,), np.inf, "min")}

    def update(self, blk, rows: slice, state: dict, aux, run) -> None:
        update_nearest(blk, state["dist"])
