"""Verification's exact selection (docs/verification.md#definitions): each target's (k+1)-th smallest negative
distance n_(k+1) and #{neg < n_(k+1)}, from the tail or from windows (``statistic``).

Each target keeps an exact bracket, a key range [low, high) with #{neg < low} <= k < #{neg < high}
(at first every key, with N- below its top).  Every window of its trial that a pass counted
narrows it (``Target.narrow``: its count below and fine counts are exact); an exact histogram is
such a window too, over every key.  A target is resolved when a window that collected all its
members holds it (the (k + 1 - below)-th member), or when its bracket is a single key.  Otherwise
``place`` puts a window on its bracket for one more pass, each pass narrowing it by the fine bins
at least: placement (the pilot's, or a guess from a histogram binned on fast distances) decides
only how many passes, never a number.  Entries whose error window could change the selection (a
tail's fast distances) get their canonical distance (``Selection.finish``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .kernels import ENTRY_BYTES, OVERFLOW, key_value
from .statistic import Windows, members

KEYS = 1 << 64  # one past the largest key


@dataclass(eq=False)
class Target:
    """One (trial, k) to select; its bracket [klow, khigh) with ``base`` negatives below it and
    ``top`` below its high end; ``guess``, a key range to try first; ``value`` and ``below`` once found."""

    trial: int
    k: int
    top: int
    klow: int = 0
    base: int = 0
    khigh: int = KEYS
    guess: tuple | None = None
    value: float | None = None
    below: int | None = None

    def narrow(self, klow: int, khigh: int, shift: int, below: int, fine: np.ndarray) -> None:
        """Narrow the bracket by a window's counts: ``below`` negatives under key ``klow``, ``fine[i]``
        with keys in [klow + (i << shift), klow + (i + 1 << shift)) (the last bin up to ``khigh``)."""
        n = (khigh - klow + (1 << shift) - 1) >> shift
        cum = below + np.concatenate([[0], np.cumsum(fine[:n])])
        lo = int(np.searchsorted(cum, self.k, side="right")) - 1  # the last edge with at most k below
        hi = int(np.searchsorted(cum, self.k + 1, side="left"))  # the first edge with more
        if lo >= 0 and min(klow + (lo << shift), khigh) > self.klow:
            self.klow, self.base = min(klow + (lo << shift), khigh), int(cum[lo])
        if hi <= n and min(klow + (hi << shift), khigh) < self.khigh:
            self.khigh, self.top = min(klow + (hi << shift), khigh), int(cum[hi])
        if self.khigh - self.klow == 1:  # one key: every negative in the bracket equals its value
            self.value, self.below = key_value(self.klow), self.base


def guess(target: Target, hist: np.ndarray, shift: int) -> tuple:
    """A key range around the bin where a histogram binned on fast distances reaches k + 1, a bin
    either side for the fast distances' error."""
    b = int(np.searchsorted(np.cumsum(hist), target.k + 1, side="left"))
    return max(b - 1, 0) << shift, min((b + 2) << shift, KEYS)


def place(targets: list, budget: int) -> tuple:
    """Windows for one more pass over the ``targets``' brackets (or their guesses, tried once), the
    budget shared between them; and per window its targets."""
    jobs = {}
    for target in targets:
        window = (target.klow, target.khigh)
        if target.guess is not None:
            window = (max(target.guess[0], target.klow), min(target.guess[1], target.khigh))
            target.guess = None
            window = window if window[0] < window[1] else (target.klow, target.khigh)
        jobs.setdefault((target.trial, *window), target.top - target.base if window == (target.klow, target.khigh)
                        else None)
    share = budget // ENTRY_BYTES // len(jobs)
    return Windows.of((t, low, high, share if count is None else min(count, share))
                      for (t, low, high), count in jobs.items())


def resolve(windows: Windows, arrays: dict, targets: list, selection: "Selection") -> list:
    """Narrow every target by its trial's ``windows`` (a pass's state: ``arrays``), resolving those a
    complete window holds; returns the targets left."""
    below, fine, taken = arrays["verify/below"], arrays["verify/fine"], arrays["verify/taken"]
    left = []
    for target in targets:
        for job in np.flatnonzero(np.array(windows.trials) == target.trial):
            target.narrow(windows.klows[job], windows.khighs[job], windows.shift(job), int(below[job]), fine[job])
            rank, inside = target.k + 1 - int(below[job]), int(fine[job].sum())
            if target.value is None and 1 <= rank <= inside == int(taken[job]):
                selection.add(members(arrays["verify/members"], job), int(below[job]), [target])
                break
        else:
            if target.value is None:
                left.append(target)
    return left


def _ambiguous(entries: np.ndarray, ranks: list) -> np.ndarray:
    """Entries whose canonical distance the selection of the ``ranks``-th smallest (1-based) needs:
    those with a window (w > 0) overlapping [r-th smallest lower bound, r-th smallest upper bound].
    The others are certainly below or above the r-th value, on their fast distance's side."""
    d, w = entries[:, 0], entries[:, 1]
    lo, hi = d - w, d + w
    out = np.zeros(d.shape[0], dtype=bool)
    for r in ranks:
        lo_r, hi_r = np.partition(lo, r - 1)[r - 1], np.partition(hi, r - 1)[r - 1]
        out |= (w > 0) & (hi >= lo_r) & (lo <= hi_r)
    return out


def _order_statistic(values: np.ndarray, rank: int) -> tuple[float, int]:
    """(the rank-th smallest value, how many values are below it)."""
    value = float(np.partition(values, rank - 1)[rank - 1])
    return value, int((values < value).sum())


class Selection:
    """Lists of entries (``kernels``' layout rows) with the ranks to read off each, whose
    ambiguous entries are settled together (one read of the rows they need)."""

    def __init__(self):
        self.lists = []  # (entries, base, targets)

    def add(self, entries: np.ndarray, base: int, targets: list) -> None:
        self.lists.append((entries, base, targets))

    def finish(self, settle) -> None:
        marks = [_ambiguous(entries, [t.k + 1 - base for t in targets]) for entries, base, targets in self.lists]
        pairs = np.concatenate([entries[mark][:, 2:4] for (entries, _, _), mark in zip(self.lists, marks)]) \
            if self.lists else np.empty((0, 2))
        exact = settle(pairs[:, 1].astype(np.int64), pairs[:, 0].astype(np.int64)) if pairs.shape[0] else np.empty(0)
        start = 0
        for (entries, base, targets), mark in zip(self.lists, marks):
            values = entries[:, 0].copy()
            values[mark] = exact[start:start + int(mark.sum())]
            start += int(mark.sum())
            for target in targets:
                target.value, below = _order_statistic(values, target.k + 1 - base)
                target.below = base + below


def tail_usable(tail: np.ndarray, core: int, k_max: int) -> bool:
    """Whether a trial's tail holds its k_max + 1 smallest negatives: never overflowed, and long
    enough (a state's tail was sized for the pairs of its gallery; an update can outgrow it)."""
    return tail[0, OVERFLOW] == 0.0 and k_max + 1 <= core
