"""Ranking slots: each query's negatives counted per positive *slot*, per trial (CMC, AP, INP).

A negative's slot is the number of the query's positives (the superset's, sorted by (distance,
gallery index)) ordered before it.  ``counts[a + s, t]`` (a: the query's first positive) is the
number of trial-t negatives in slot s.  The negative is before positive m (0-based) iff its slot is
at most m, so the negatives before trial t's positive m number ``sum_{s <= m} counts[a + s, t]``
and its rank is (its index among trial t's positives, 1-based) plus that.  Only negatives before
the query's last positive are counted: later ones change no rank.  Additive over gallery rows.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ...engine.statistic import Field, Statistic
from ...engine.block import last_positive_limits, negatives_buffers, slotted_negatives, trial_bit

_jit = nb.njit(nogil=True, cache=True)


@_jit
def update_slots(blk, counts, qi, gj, slot):
    n_trials = counts.shape[1]
    for k in range(slotted_negatives(blk, last_positive_limits(blk), qi, gj, slot)):
        i = qi[k]
        lo = blk.pos_off[i]
        if slot[k] < blk.pos_off[i + 1] - lo:
            bits = blk.g_bits[gj[k]] & blk.q_bits[i]
            for t in range(n_trials):
                counts[lo + slot[k], t] += trial_bit(bits, t)


class Slots(Statistic):
    name = "slots"

    def __init__(self, n_trials: int):
        self.fields = {"counts": Field("positive", np.int64, (n_trials,))}

    def limits(self, blk):
        return last_positive_limits(blk)

    def update(self, blk, rows: slice, state: dict, aux, run) -> None:
        update_slots(blk, state["counts"], *negatives_buffers(blk))


def restrict(positives, counts: np.ndarray, t: int):
    """Trial ``t``'s view: (its positives, their slot counts in that layout).

    The trial's positives are the superset's with bit t; the negatives between two consecutive
    trial positives (superset indices m' < m) are those of slots m' + 1 .. m.
    """
    in_trial = ((positives.bits >> np.uint64(t)) & np.uint64(1)).astype(bool)
    prefix = np.concatenate([[0], np.cumsum(counts[:, t])])  # flat, over every query's slots
    before = prefix[1:] - np.repeat(prefix[positives.offsets[:-1]], positives.counts)  # before each superset positive
    kept = np.flatnonzero(in_trial)
    trial = positives.subset(kept)
    before = before[kept]
    first = np.zeros(kept.shape[0], dtype=bool)
    first[trial.offsets[:-1][trial.counts > 0]] = True
    slots = np.where(first, before, before - np.concatenate([[0], before[:-1]]))
    return trial, slots.astype(np.int64)
