"""Identity-dedup CMC (docs/protocols.md#cmc-flavours; SYSU-MM01's official evaluation).

rho(q) = 1 + the number of other identities with a kept row before q's first positive.  Per query
and trial the state holds up to L = max_rank distinct pids of negatives seen before that trial's
first positive (``EMPTY`` marks free places).  Merging two states takes the union, capped at L:
exact in any chunking and merge order, because a capped union holds min(L, |A u B|) pids, and
CMC@k for k <= L only asks whether rho <= k.  rho = 1 + (pids held), L + 1 meaning "beyond".
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ...core.choices import INT64_MIN
from ...engine.statistic import Field, Statistic
from ...engine.block import last_positive_limits, negatives_buffers, reach, slotted_negatives, trial_bit, widest

EMPTY = INT64_MIN  # a reserved pid (no store holds it)
_jit = nb.njit(nogil=True, cache=True)
_inline = nb.njit(nogil=True, cache=True, inline="always")


@_inline
def _insert(held, pid):
    """Add ``pid`` to the list ``held`` unless present or full."""
    for k in range(held.shape[0]):
        if held[k] == pid:
            return
        if held[k] == EMPTY:
            held[k] = pid
            return


@_jit
def update_dedup(blk, held, qi, gj, slot):
    """held[i, t]: pids of negatives before trial t's first positive of query i."""
    n_trials = held.shape[1]
    first = np.empty((blk.dots.shape[0], n_trials), dtype=np.int64)  # superset index of each trial's first positive
    limits = np.full(blk.dots.shape[0], -np.inf)
    gn_max = widest(blk)
    for i in range(blk.dots.shape[0]):
        lo = blk.pos_off[i]
        n = blk.pos_off[i + 1] - lo
        last = -1
        for t in range(n_trials):
            first[i, t] = n
            for m in range(n - 1, -1, -1):
                if trial_bit(blk.pos_bits[lo + m], t):
                    first[i, t] = m
            if first[i, t] < n:
                last = max(last, first[i, t])
        if last >= 0:
            limits[i] = reach(blk, i, blk.pos_d[lo + last], gn_max)
    for k in range(slotted_negatives(blk, limits, qi, gj, slot)):
        i = qi[k]
        n = blk.pos_off[i + 1] - blk.pos_off[i]
        bits = blk.g_bits[gj[k]] & blk.q_bits[i]
        for t in range(n_trials):
            if trial_bit(bits, t) & (slot[k] <= first[i, t]) & (first[i, t] < n):
                _insert(held[i, t], blk.g_pid[gj[k]])


@_jit
def union_capped(a, b):
    out = a.copy()
    for i in range(out.shape[0]):
        for t in range(out.shape[1]):
            for k in range(b.shape[2]):
                if b[i, t, k] != EMPTY:
                    _insert(out[i, t], b[i, t, k])
    return out


class Dedup(Statistic):
    name = "dedup"

    def __init__(self, n_trials: int, length: int):
        self.fields = {"held": Field("query", np.int64, (n_trials, length), EMPTY, "own")}

    def limits(self, blk):
        return last_positive_limits(blk)  # its trials' first positives' reach is at most the last one's

    def update(self, blk, rows: slice, state: dict, aux, run) -> None:
        update_dedup(blk, state["held"], *negatives_buffers(blk))

    def merge_own(self, key: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return union_capped(a, b)


def dedup_ranks(held: np.ndarray, t: int) -> np.ndarray:
    """rho per query in trial t (L + 1 when L or more identities come first)."""
    return 1 + (held[:, t, :] != EMPTY).sum(axis=1)
