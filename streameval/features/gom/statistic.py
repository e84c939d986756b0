"""GOM threshold histograms (docs/metrics.md#5-open-set-metrics-gom): per query and trial, its negatives counted by
the first threshold tau_k that returns them (k = N + 1: never).  Additive over gallery rows.

With ``fixed`` normalisation two diagnostics ride along (``clipping``): the negatives
(of any trial) whose d~ was clipped below LO / above HI, and each query's min / max canonical
distance over all its pairs (what ``minmax`` would take).

Bins are decided on the fast distance unless its window (``c_bins``, ``kernels.bin_error_bound``)
straddles a threshold or LO / HI; then on the canonical distance.  Without windows (float32 GEMMs,
stored and re-ranked values) and with an affine normalisation, a pair's bin is read off its
position on the grid, found without dividing (``_keyed_bins``), the fast distance taken only near
a threshold: the same bins.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from ...engine import kernels
from ...engine.kernels import U64, canonical_distance, clip_side, distance_key, distance_window, normalise, threshold_bin
from ...engine.statistic import Field, Statistic
from ...engine.block import compact, fast_distance, kept_bits, mask, row_distances, trial_bit, widest

_jit = nb.njit(nogil=True, cache=True)
_inline = nb.njit(nogil=True, cache=True, inline="always")


@_inline
def _row_bins(blk, i, c_bins, norm_mode, lo, span, n_bins, sides, dist, bins, hit, cols):
    """bins[j]: the threshold that first returns row j of query i; ``dist`` (row i's distances,
    a copy) gets the canonical distance where that decided the bin.  The bins of both ends of each
    window in a loop that vectorises, flagging in ``hit`` (a ``mask``) the rows whose window
    straddles a threshold (or LO / HI); then the canonical distance of the flagged ones."""
    for j in range(dist.shape[0]):
        w = distance_window(dist[j], blk.qn[i], blk.gn[j], blk.metric, c_bins)
        k = threshold_bin(normalise(dist[j] - w, norm_mode, lo, span), n_bins)
        straddles = k != threshold_bin(normalise(dist[j] + w, norm_mode, lo, span), n_bins)
        clipped = sides & (clip_side(dist[j] - w, lo, span) != clip_side(dist[j] + w, lo, span))
        hit[j] = straddles | clipped
        bins[j] = k
    for m in range(compact(hit, cols)):
        j = cols[m]
        dist[j] = canonical_distance(blk.qf, blk.gf, i, j, blk.qa[i], blk.ga[j], blk.metric)
        bins[j] = threshold_bin(normalise(dist[j], norm_mode, lo, span), n_bins)


# Spans below this are binned from the fast distance: n_bins / span stays far from overflow above it.
KEYED_SPAN = 1e-100


@_inline
def keyed_margin(metric, lo, span, n_bins):
    """How far (in bins) ``_keyed_bins``' position t of a pair may be from N d~ of its fast distance:
    the key's error and ~10 roundings of the terms' size (``size`` bounds |key| + |lo| for a pair in
    the range) over the span, the grid's own rounding (k / N against the grid value k (1 / N)) and t's,
    generously counted."""
    key_error = kernels.key_error(metric)
    size = 2.0 * abs(lo) + span + key_error
    return n_bins * ((key_error + 32.0 * U64 * size) / span + 16.0 * U64)


@_inline
def _keyed_bin(key, j, lo, scale, top, margin, dist, bins, hit):
    """``_keyed_bins`` for the pair (of column j) of this key."""
    dist[j] = key
    t = (key - lo) * scale
    k = math.ceil(t)
    hit[j] = (k - t < margin) | (t - (k - 1.0) < margin) | (t < margin) | (t > top)
    bins[j] = np.int64(k) if (t > 0.0) & (t < top) else 0  # (one outside is binned after)


@_inline
def _keyed_bins(blk, i, inv_ga, lo, span, n_bins, margin, dist, bins, hit, cols):
    """bins[j] of a row without windows under affine normalisation, without a division per pair:
    the pair's position t = (``distance_key`` - lo) N / span on the grid, binned as ceil(t) unless
    t is within ``margin`` of a grid point or of the range's ends; those few pairs are binned from
    their fast distance, as the other path bins every pair.  dist[j]: the key, or where the fast
    distance was taken, that: within ``kernels.key_error`` of the fast distance, and on the same
    side of LO and HI (a key whose t is inside the margins is strictly between them)."""
    qa = blk.qa[i]
    inv_qa = kernels.inverse(qa)
    scale = n_bins / span
    if blk.metric == kernels.COSINE:  # a loop per metric: a test of it inside kept the loop scalar
        for j in range(bins.shape[0]):
            _keyed_bin(distance_key(blk.dots[i, j], qa, blk.ga[j], inv_qa, inv_ga[j], kernels.COSINE), j, lo, scale,
                       n_bins - margin, margin, dist, bins, hit)
    elif blk.metric == kernels.PRECOMPUTED:
        for j in range(bins.shape[0]):
            _keyed_bin(np.float64(blk.dots[i, j]), j, lo, scale, n_bins - margin, margin, dist, bins, hit)
    else:
        for j in range(bins.shape[0]):
            _keyed_bin(kernels.pair_distance(blk.dots[i, j], qa, blk.ga[j], blk.metric), j, lo, scale,
                       n_bins - margin, margin, dist, bins, hit)
    for m in range(compact(hit, cols)):
        j = cols[m]
        dist[j] = fast_distance(blk, i, j)
        bins[j] = threshold_bin(normalise(dist[j], kernels.NORM_AFFINE, lo, span), n_bins)


@_inline
def _count_clipped(kept, dist, lo, span, clipped):
    """Add a row's negatives (nonzero ``kept``: ``kept_bits``) below LO and above HI
    (``clip_side``), and all of them, to ``clipped``."""
    below = 0
    above = 0
    negatives = 0
    for j in range(dist.shape[0]):
        negative = kept[j] != 0
        side = clip_side(dist[j], lo, span)
        below += negative & (side < 0)
        above += negative & (side > 0)
        negatives += negative
    clipped[0] += below
    clipped[1] += above
    clipped[2] += negatives


@_inline
def _settle_extremes(blk, i, dist, gn_max, slack, low_out, high_out):
    """Lower ``low_out[i]`` / raise ``high_out[i]`` to row i's canonical min / max distance.

    The pair with the canonical minimum has a fast distance within its window of it, hence within
    two windows of the fast minimum: those pairs are settled canonically, unless none of them can
    lower the minimum so far (the same for the maximum).  ``reach`` bounds every window involved: a
    window shrinks as the fast distance grows (but for its 4u d term, bounded at the row's
    maximum), so the one at the fast minimum with the largest gallery norm is the widest.  ``dist``
    may be up to ``slack`` from the fast distances (``_keyed_bins``' keys): reach takes it too.
    """
    low, high = kernels._extremes(dist)
    reach = distance_window(low, blk.qn[i], gn_max, blk.metric, blk.c_dot) + 4.0 * U64 * high + slack
    if low - reach < low_out[i]:
        for j in range(dist.shape[0]):
            if dist[j] <= low + 2.0 * reach:
                low_out[i] = min(low_out[i], canonical_distance(blk.qf, blk.gf, i, j, blk.qa[i], blk.ga[j], blk.metric))
    if high + reach > high_out[i]:
        for j in range(dist.shape[0]):
            if dist[j] >= high - 2.0 * reach:
                high_out[i] = max(high_out[i], canonical_distance(blk.qf, blk.gf, i, j, blk.qa[i], blk.ga[j], blk.metric))


LANES = 4  # interleaved sub-histograms: consecutive pairs in one bin would wait on each other's increment


@_jit
def update_hist(blk, c_bins, norm_mode, lo, span, n_bins, t_first, t_stop, hist, clipped, range_low, range_high):
    """hist[i, t, k] += trial-t negatives of query i first returned at tau_k, for trials
    [t_first, t_stop) (those sharing this normalisation); with fixed normalisation (``clipped``
    has rows) also the clipping diagnostics.

    A row at a time: its distances and bins in loops that vectorise, the trial bits of its kept
    negatives, then per trial a count into ``LANES`` sub-histograms added into ``hist``."""
    n_rows, n_cols = blk.dots.shape
    dist = np.empty(n_cols, dtype=np.float64)
    bins = np.empty(n_cols, dtype=np.int64)
    windowless = (c_bins == 0.0) | (blk.metric == kernels.PRECOMPUTED)  # stored and re-ranked values are exact
    keyed = windowless & (norm_mode == kernels.NORM_AFFINE) & (span >= KEYED_SPAN)
    slack = kernels.key_error(blk.metric) if keyed else 0.0  # of ``dist``: keys
    inv_ga = 1.0 / blk.ga
    margin = keyed_margin(blk.metric, lo, span, n_bins) if keyed else 0.0
    hit = mask(n_cols)
    cols = np.empty(hit.shape[0], dtype=np.int64)
    kept = np.empty(n_cols, dtype=np.uint64)
    lanes = np.zeros((LANES, hist.shape[2]), dtype=np.int64)
    sides = clipped.shape[0] > 0
    gn_max = widest(blk)  # once a block: a row loop taking it scanned the chunk per query
    for i in range(n_rows):
        if keyed:
            _keyed_bins(blk, i, inv_ga, lo, span, n_bins, margin, dist, bins, hit, cols)
        elif windowless:
            row_distances(blk, i, dist)
            for j in range(n_cols):
                bins[j] = threshold_bin(normalise(dist[j], norm_mode, lo, span), n_bins)
        else:
            row_distances(blk, i, dist)
            _row_bins(blk, i, c_bins, norm_mode, lo, span, n_bins, sides, dist, bins, hit, cols)
        kept_bits(blk, i, kept)
        for t in range(t_first, t_stop):
            _count_lanes(bins, kept, t, lanes)
            for k in range(hist.shape[2]):
                hist[i, t, k] += lanes[0, k] + lanes[1, k] + lanes[2, k] + lanes[3, k]
            lanes[:] = 0
        if sides and n_cols:
            _count_clipped(kept, dist, lo, span, clipped[i])
            _settle_extremes(blk, i, dist, gn_max, slack, range_low, range_high)


@_inline
def _count_lanes(bins, kept, t, lanes):
    """lanes[j % LANES, bins[j]] += 1 for the rows j whose ``kept`` bits hold trial t."""
    m = bins.shape[0] - bins.shape[0] % LANES
    for j0 in range(0, m, LANES):
        for k in range(LANES):
            lanes[k, bins[j0 + k]] += trial_bit(kept[j0 + k], t)
    for j in range(m, bins.shape[0]):
        lanes[0, bins[j]] += trial_bit(kept[j], t)


class GomHist(Statistic):
    name = "gom"

    def __init__(self, n_trials: int, bins: int, fixed: bool, c_bins: float):
        rows = 1 if fixed else 0  # the clipping diagnostics only exist with fixed normalisation
        self.fields = {
            "hist": Field("query", np.int64, (n_trials, bins + 2)),
            "clipped": Field("query", np.int64, (3 * rows,)),  # below LO, above HI, negatives
            "range_low": Field("query", np.float64, (rows,), np.inf, "min"),
            "range_high": Field("query", np.float64, (rows,), -np.inf, "max"),
        }
        self.bins, self.fixed, self.c_bins = bins, fixed, c_bins
        self.option = ("--gom-bins", bins, "bins", 8 * n_trials, "query")  # a histogram column per trial

    def update(self, blk, rows: slice, state: dict, aux, run) -> None:
        clipped = state["clipped"] if self.fixed else np.empty((0, 3), np.int64)
        low = state["range_low"][:, 0] if self.fixed else np.empty(0)
        high = state["range_high"][:, 0] if self.fixed else np.empty(0)
        n_trials = len(run.norms)
        shared = all(norm == run.norms[0] for norm in run.norms)  # minmax with trials: one range per trial
        for t_first, t_stop in [(0, n_trials)] if shared else [(t, t + 1) for t in range(n_trials)]:
            norm = run.norms[t_first]
            update_hist(blk, self.c_bins, norm.mode, norm.lo, norm.span, self.bins, t_first, t_stop, state["hist"],
                        clipped, low, high)
            clipped, low, high = clipped[:0], low[:0], high[:0]  # the diagnostics once


def clipping(state, lo: float, hi: float) -> dict:
    """What fixed GOM normalisation to [lo, hi] clipped, from a ``state.QueryState``: the pairs GOM
    thresholds (positives, from their exact distances, and negatives of any trial; junk is not
    thresholded) below LO and above HI, out of ``pairs``, and the range of all pairs' distances, the
    one minmax would take (None without pairs)."""
    lo, span = float(lo), float(hi) - float(lo)
    dist = state.positives.dist
    arrays = state.stats.arrays
    low = arrays["gom/range_low"].min(initial=np.inf)
    high = arrays["gom/range_high"].max(initial=-np.inf)
    return {
        "below": int(arrays["gom/clipped"][:, 0].sum() + (dist < lo).sum()),  # as kernels.clip_side
        "above": int(arrays["gom/clipped"][:, 1].sum() + (dist - lo > span).sum()),
        "pairs": int(arrays["gom/clipped"][:, 2].sum() + dist.shape[0]),
        "observed_min": float(low) if low <= high else None,
        "observed_max": float(high) if low <= high else None,
    }
