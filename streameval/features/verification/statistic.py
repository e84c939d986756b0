"""Verification's statistic: what a pass keeps of the kept negative pairs (``kernels`` for the
layouts), and the windows it counts and collects them in.

A **window** is the one primitive of the selection: per job, a trial and a key range [low, high)
of distances (``kernels.keys_of``), in which the pass counts the negatives certainly below it
(``below``: canonical distance below ``low``), counts those inside in fine bins (the top
``FINE_BITS`` bits of their canonical distance's key offset within the range) and collects them as
exact members (canonical distance, w = 0) up to the job's capacity.  The (k+1)-th smallest is the
(k + 1 - below)-th member whenever that rank lies in 1 .. inside and every member was collected;
else the fine counts place a narrower window for one more pass (``select``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...engine.statistic import Field, Statistic
from .kernels import (COUNT, ENTRY, FINE_BITS, capacity, copy_entries, key_value, merge_tails,
                      pool_positives, NO_POOL, update_verify, update_verify_fast)


@dataclass(frozen=True)
class Windows:
    """Per job (sorted by trial): its trial, key range [klow, khigh) (khigh up to 2^64) and the most
    members a pass collects (0: it counts only)."""

    trials: tuple
    klows: tuple
    khighs: tuple
    capacities: tuple

    @classmethod
    def of(cls, jobs) -> "Windows | None":
        """From (trial, klow, khigh, capacity) jobs; None for none."""
        jobs = sorted(jobs)
        return cls(*(tuple(int(x) for x in column) for column in zip(*jobs))) if jobs else None

    def __len__(self) -> int:
        return len(self.trials)

    def shift(self, job: int) -> int:
        """Key bits below a fine bin: the range spans at most 2^FINE_BITS bins."""
        return max(0, (self.khighs[job] - self.klows[job] - 1).bit_length() - FINE_BITS)

    def arrays(self, n_trials: int) -> tuple:
        """The kernel's view: lows, highs, the lows' keys, the fine bins' shifts, capacities, and per
        trial t the first job (trial t's jobs are job_first[t]:job_first[t + 1])."""
        return (np.array([key_value(k) for k in self.klows], np.float64),
                np.array([key_value(k) for k in self.khighs], np.float64),
                np.array(self.klows, np.uint64), np.array([self.shift(j) for j in range(len(self))], np.int64),
                np.array(self.capacities, np.int64),
                np.searchsorted(np.array(self.trials, np.int64), np.arange(n_trials + 1)).astype(np.int64))


def no_windows(n_trials: int) -> tuple:
    empty = np.empty(0)
    return (empty, empty, empty.astype(np.uint64), empty.astype(np.int64), empty.astype(np.int64),
            np.zeros(n_trials + 1, np.int64))


class Verify(Statistic):
    """Fields (all global): per trial ``hist`` (with ``count``: kept negatives per bin of the top
    ``bits`` key bits; ``exact_bins``: decided on the canonical distance where the window could
    change the bin, else on the fast one), ``tail`` (with ``core`` > 0: the tail of the ``core``
    smallest), ``auc`` (with ``auc``: sum over negatives of 2 #{pos < d} + #{pos = d}); per job of
    ``windows``: ``below``, ``fine``, ``taken`` (members collected) and ``members`` (a list of
    pieces, each a task's collected members in the tail's layout, concatenated when states merge)."""

    name = "verify"
    reads_distances = True

    def __init__(self, n_trials: int, bits: int, core: int, auc: bool, exact_bins: bool,
                 windows: Windows | None = None, count: bool = True):
        self.n_trials, self.bits, self.core, self.pools, self.exact_bins = n_trials, bits, core, auc, exact_bins
        self.count, self.windows = count, windows
        self.jobs = windows.arrays(n_trials) if windows else no_windows(n_trials)
        self.fields = {}
        if count:
            self.fields["hist"] = Field("global", np.int64, (n_trials, 2**bits))
        if core:
            self.fields["tail"] = Field("global", np.float64, (n_trials, capacity(core) + 1, ENTRY), 0.0, "own")
        if auc:
            self.fields["auc"] = Field("global", np.int64, (n_trials,))
        if windows:
            n = len(windows)
            self.fields.update(below=Field("global", np.int64, (n,)), taken=Field("global", np.int64, (n,)),
                               fine=Field("global", np.int64, (n, 1 << FINE_BITS)),
                               # (a chain's pieces hold at most the largest capacity per job, and a header each)
                               members=Field("global", np.float64, (n, max(windows.capacities) + 1, ENTRY), 0.0,
                                             "list"))

    def prepare(self, meta, queries, positives):
        return queries.index

    def pool(self, positives):
        return pool_positives(positives, self.n_trials)

    def update(self, blk, rows: slice, state: dict, aux, run) -> None:
        hist = state.get("hist", np.zeros((self.n_trials, 1), np.int64))
        tails = state.get("tail", np.zeros((self.n_trials, 1, ENTRY)))
        if self.exact_bins or self.pools:  # (no windows: the selection's further passes take the other kernel)
            auc = state.get("auc", np.zeros(0, np.int64))
            pool = run.pooled[self.name] if self.pools else NO_POOL
            update_verify(blk, aux[rows], 64 - self.bits, self.exact_bins, hist, tails, self.core, auc, pool)
            return
        if not self.windows:
            update_verify_fast(blk, aux[rows], 64 - self.bits, hist, tails, self.core, self.jobs, np.zeros(0, np.int64),
                               np.zeros(0, np.int64), np.zeros((0, 1), np.int64), np.zeros((0, 1, ENTRY)), self.count)
            return
        room = max(0, int((self.jobs[4] - state["taken"]).max()))
        buffer = np.zeros((len(self.windows), room + 1, ENTRY))  # calloc: only the pages written are touched
        update_verify_fast(blk, aux[rows], 64 - self.bits, hist, tails, self.core, self.jobs, state["below"],
                           state["taken"], state["fine"], buffer, self.count)
        used = int(buffer[:, 0, COUNT].max())
        if used:
            state["members"].append(buffer[:, :used + 1].copy())

    def merge_own(self, key: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return merge_tails(a, b, self.core)

    def copy_own(self, key: str, a: np.ndarray) -> np.ndarray:
        return copy_entries(a)


def members(pieces: list, job: int) -> np.ndarray:
    """A window's collected members (entries), from every piece."""
    found = [piece[job, 1:int(piece[job, 0, COUNT]) + 1] for piece in pieces]
    return np.concatenate(found) if found else np.empty((0, ENTRY))
