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
    entries = np.empty(positives.dist.shape[0], dtype=np.int64)
    slots = np.empty(positives.dist.shape[0], dtype=np.int64)
    n = trial_slots(positives.offsets, positives.bits, counts, t, entries, slots)
    return positives.subset(entries[:n]), slots[:n]


@_jit
def trial_slots(offsets, bits, counts, t, entries, slots):
    """Writes the superset positions of trial ``t``'s positives (``entries``) and each one's slot
    count (``slots``: the negatives since the query's previous trial positive); returns how many.
    One pass: the numpy form (a prefix sum, a repeat and five gathers) took 6 s for 42,000,000
    positives, a serial step at the end of every run."""
    n = 0
    for q in range(offsets.shape[0] - 1):
        since = 0
        for m in range(offsets[q], offsets[q + 1]):
            since += counts[m, t]
            kept = trial_bit(bits[m], t)
            entries[n] = m
            slots[n] = since
            n += kept
            since *= 1 - kept
    return n
