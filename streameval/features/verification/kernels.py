"""Pair-level verification's kernels (docs/verification.md#definitions, #how-it-is-computed): the
kept negative pairs of all queries, per trial, as an additive histogram, a tail of the smallest
ones, the AUC sum, and the windows of the exact selection (``statistic``, ``select``).

Keys and bins.  ``key(d)`` is the order-preserving uint64 of a float64 distance (-0.0 taken as
+0.0; non-negative values get the sign bit set, negative values are bit-inverted), and its top B
bits (``--hist-bits``) are d's bin.  With ``exact_bins`` a negative's bin is decided on its fast
distance d when the whole error window [d - w, d + w] (``kernels.distance_window``) falls in one
bin (both ends' keys agree), and on its canonical distance otherwise.  Without (float32 GEMMs,
one-pass selection) the fast distance decides, as for GOM's thresholds
(``kernels.bin_error_bound``): with float32 windows ~0.4% of Market's negatives straddle an edge,
and their canonical distances would cost more than the rest of verification; the histogram then
only shapes the curves.  The AUC's comparisons with
positive distances are always exact.

The tail (global field ``tail``, one per trial) keeps *entries* (d, w, gallery row, query row): a
fast distance with its window, or an exact distance (w = 0: canonical, or a stored distance).  With
L = its ``core`` length and U a bound with at least L entries' upper bounds d + w at or below it
(near the L-th smallest: placed from a sample, checked), it keeps L entries with upper bounds at
most U and every other entry whose lower bound d - w is below U: whatever it drops has L entries
certainly at or below it, so the L smallest canonical distances of all the negatives it covered
are among its entries (ties by value are interchangeable: a dropped exact entry equal to U is
never needed).  Two tails over disjoint rows merge into their union, compacted the same way: exact
in any order.  Only the entries near a requested order statistic need their canonical distance in
the end (``report.settle``); the pass computes none for the tail, which is what keeps a tail
of a million entries cheap.  A tail without U takes one from its first block's counts when that
block alone holds L negatives (``_seed_bound``), rather than every pair until its buffer fills.
Its buffer holds ``capacity(L)`` entries and is compacted when full;
near-ties at U (many entries within their window of it) can overflow it, which marks the tail
unusable (header flag): the selection then takes windows.

Windows (``statistic``): per job, a trial and a range [low, high): the negatives certainly below it
counted, those inside counted in fine bins and collected as exact entries (canonical distances,
w = 0) up to a capacity.  A row's pairs below its limit (the tail's and the windows' reach) are
found by a vectorised mask; one loop then offers these few to both.

Layout of a list of entries: ``a[0]`` is a header [count, U, overflowed, U known], ``a[1:count+1]``
the entries.  The same layout holds a window's members, without U.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from ...engine import kernels
from ...engine.kernels import SIGN, float_key
from ...core.choices import TAIL_ENTRY_BYTES
from ...engine.block import compact, kept_negative, mask, trial_bit, widest

_jit = nb.njit(nogil=True, cache=True)
_inline = nb.njit(nogil=True, cache=True, inline="always")

ENTRY = 4  # d, w, extended gallery row, query row
ENTRY_BYTES = TAIL_ENTRY_BYTES  # 8 bytes a column; the smallest --tail-budget (choices.RANGES)
assert ENTRY_BYTES == 8 * ENTRY
COUNT, BOUND, OVERFLOW, KNOWN = 0, 1, 2, 3  # header columns
FINE_BITS = 12  # a window's fine bins: 2^12 of them over its key range


def capacity(core: int) -> int:
    """Entries a tail of length ``core`` holds between compactions."""
    return core + max(core // 2, 16)


SAMPLE = 4096  # upper bounds sampled to place a tail's bound before checking it
KEY_LOW_INF, KEY_HIGH_INF = 0x000FFFFFFFFFFFFF, 0xFFF0000000000000  # the keys of -inf and +inf


# --------------------------------------------------------------------------------------------- keys


@_inline
def _key(cell, cell_bits, x):
    """``kernels.float_key`` of float64 ``x`` (``cell``: a 1-element float64 scratch array,
    ``cell_bits`` its uint64 view: numba has no scalar bit cast)."""
    cell[0] = x
    return float_key(cell_bits[0])


def keys_of(values: np.ndarray) -> np.ndarray:
    """``_key`` of each value (numpy)."""
    u = (np.asarray(values, dtype=np.float64) + 0.0).view(np.uint64)
    return np.where(u >> np.uint64(63) == 1, ~u, u | SIGN)


def key_value(key: int) -> float:
    """The float64 whose key is ``key`` (an int in [0, 2^64]): keys beyond the infinities' (NaN
    bit patterns, and 2^64) give the infinity next to them."""
    if key <= KEY_LOW_INF:
        return -math.inf
    if key >= KEY_HIGH_INF:
        return math.inf
    u = key ^ (1 << 63) if key >> 63 else ~key & ((1 << 64) - 1)
    return float(np.array(u, dtype=np.uint64).view(np.float64))


# ------------------------------------------------------------------------------------------ entries


@_inline
def _bound(entries):
    """The tail's bound U: no entry with a lower bound at or above it is needed; -inf once
    overflowed (nothing is added any more), +inf until the first compaction."""
    if entries[0, OVERFLOW] != 0.0:
        return -np.inf
    return entries[0, BOUND] if entries[0, KNOWN] != 0.0 else np.inf


@_inline
def _upper(src, e):
    return src[e, 0] + src[e, 1]


@_jit
def _counts(src, n, bound, counts):
    """Add to ``counts`` the entries of src[1:n+1] with: an upper bound at most U; certainly in the
    core (upper bound below U, or at U with a window; an exact entry equal to U is interchangeable
    with any other); exact and equal to U; a lower bound below U (kept)."""
    for e in range(1, n + 1):
        lo = src[e, 0] - src[e, 1]
        hi = src[e, 0] + src[e, 1]
        counts[0] += hi <= bound
        counts[1] += (hi < bound) | ((hi == bound) & (src[e, 1] > 0.0))
        counts[2] += (src[e, 1] == 0.0) & (src[e, 0] == bound)
        counts[3] += lo < bound


@_jit
def _tail_bound(a, na, b, nb, core, counts):
    """U for the entries of a and b: an upper bound at or above the core-th smallest upper bound
    (then at least ``core`` entries lie at or below it), placed from a sample and checked, else
    exact; ``counts`` (``_counts``) for it."""
    n = na + nb
    m = min(n, SAMPLE)
    if m < n:
        sample = np.empty(m)
        for s in range(m):
            e = (s * n) // m
            sample[s] = _upper(a, 1 + e) if e < na else _upper(b, 1 + e - na)
        expected = core * m / n
        rank = min(m - 1, np.int64(expected * 1.02 + 3.0 * math.sqrt(expected) + 8.0))
        bound = np.partition(sample, rank)[rank]
        counts[:] = 0
        _counts(a, na, bound, counts)
        _counts(b, nb, bound, counts)
        if counts[0] >= core:
            return bound
    upper = np.empty(n)
    upper[:na] = a[1:na + 1, 0] + a[1:na + 1, 1]
    upper[na:] = b[1:nb + 1, 0] + b[1:nb + 1, 1]
    bound = np.partition(upper, core - 1)[core - 1]
    counts[:] = 0
    _counts(a, na, bound, counts)
    _counts(b, nb, bound, counts)
    return bound


@_jit
def _keep(dst, kept, src, n, bound, needed):
    """Append to dst the entries of src[1:n+1] a tail with bound U keeps: those with a lower bound
    below U, and exact entries equal to U while the core needs them.  Returns (kept, needed)."""
    for e in range(1, n + 1):
        keep = src[e, 0] - src[e, 1] < bound
        if (not keep) and (_upper(src, e) == bound) and needed > 0:
            keep = True
            needed -= 1
        if keep:
            kept += 1
            dst[kept] = src[e]
    return kept, needed


@_jit
def _compacted(dst, a, na, b, nb, core):
    """dst = the tail of the entries of a and b (dst may be a itself); False when they would not
    fit dst (near-ties at U: overflowed)."""
    counts = np.zeros(4, np.int64)
    bound = _tail_bound(a, na, b, nb, core, counts)
    needed = core - counts[1]
    if counts[3] + min(max(needed, 0), counts[2]) > dst.shape[0] - 1:
        return False
    kept, needed = _keep(dst, np.int64(0), a, na, bound, needed)
    kept, needed = _keep(dst, kept, b, nb, bound, needed)
    dst[0, COUNT] = kept
    dst[0, BOUND] = bound
    dst[0, KNOWN] = 1.0
    dst[0, OVERFLOW] = 0.0
    return True


@_inline
def _add(entries, core, d, w, g, q):
    """Append an entry to a tail (compacting a full one first); return the tail's new bound."""
    n = np.int64(entries[0, COUNT])
    if n == entries.shape[0] - 1:
        # an int64 zero: a literal 0 would make numba compile every helper below a second time
        if not _compacted(entries, entries, n, entries, np.int64(0), core) or entries[0, COUNT] == n:
            entries[0, OVERFLOW] = 1.0  # near-ties at U fill the buffer: unusable
            return -np.inf
        n = np.int64(entries[0, COUNT])
        if not d - w < _bound(entries):
            return _bound(entries)
    entries[n + 1, 0] = d
    entries[n + 1, 1] = w
    entries[n + 1, 2] = g
    entries[n + 1, 3] = q
    entries[0, COUNT] = n + 1
    return _bound(entries)


@_jit
def merge_tails(a, b, core):
    """Per trial, the tail of the union of two tails over disjoint rows."""
    out = np.zeros_like(a)  # calloc: only the pages written are touched
    for t in range(a.shape[0]):
        na = np.int64(a[t, 0, COUNT])
        nb_ = np.int64(b[t, 0, COUNT])
        if a[t, 0, OVERFLOW] != 0.0 or b[t, 0, OVERFLOW] != 0.0:
            out[t, 0, OVERFLOW] = 1.0
        elif na + nb_ < core:  # no bound yet
            out[t, 1:na + 1] = a[t, 1:na + 1]
            out[t, na + 1:na + nb_ + 1] = b[t, 1:nb_ + 1]
            out[t, 0, COUNT] = na + nb_
        elif not _compacted(out[t], a[t], na, b[t], nb_, core):
            out[t, 0, OVERFLOW] = 1.0
    return out


def copy_entries(a: np.ndarray) -> np.ndarray:
    """A copy of lists of entries (``a[job]``: header and entries): the used part only, the rest
    zeros by calloc (numpy's ``zeros``, not numba's, which writes them): a band's buffer is mostly
    empty, and every chunk task copies its state."""
    out = np.zeros(a.shape, a.dtype)
    for job in range(a.shape[0]):
        used = int(a[job, 0, COUNT]) + 1
        out[job, :used] = a[job, :used]
    return out


def entries_problem(entries: np.ndarray, gallery_rows: int, n_queries: int) -> str | None:
    """What is wrong with tails read back from a saved state, or None."""
    header = entries[:, 0]
    count = header[:, COUNT]
    capacity = entries.shape[1] - 1
    if not (np.isfinite(header).all() and (count == np.floor(count)).all() and (count >= 0).all()
            and (count <= capacity).all() and np.isin(header[:, [OVERFLOW, KNOWN]], (0.0, 1.0)).all()):
        return "has a malformed header (count, bound, flags)"
    for t in range(entries.shape[0]):
        rows = entries[t, 1:int(count[t]) + 1]
        d, w, g, q = rows.T
        if not (np.isfinite(d).all() and (w >= 0).all() and np.isfinite(w).all() and (g == np.floor(g)).all()
                and ((g >= 0) & (g < gallery_rows)).all() and (q == np.floor(q)).all()
                and ((q >= 0) & (q < n_queries)).all()):
            return "holds an entry that is not (distance, window, gallery row, query row)"
    return None


# ------------------------------------------------------------------------------- pooled positives


@_inline
def _bucket(x, lo, scale, m):
    """A bucket of a sorted positive list: monotone in x, so positives in lower buckets are below x."""
    return np.int64(min(max((x - lo) * scale, 0.0), m - 1.0))


@_jit
def _hints(values, lo, scale, m, out):
    """out[b] = number of ``values`` (sorted) in buckets below b, b = 0..m."""
    v = 0
    for b in range(m + 1):
        while v < values.shape[0] and _bucket(values[v], lo, scale, m) < b:
            v += 1
        out[b] = v


@_inline
def _count(pos, hints, lo, scale, m, x, inclusive):
    """Number of positives ``pos`` (sorted) below x (at most x when ``inclusive``), exactly."""
    b = _bucket(x, lo, scale, m)
    i = hints[b]
    end = hints[b + 1]
    while i < end and ((pos[i] < x) | (inclusive & (pos[i] == x))):
        i += 1
    return i


def pool_positives(positives, n_trials: int) -> tuple:
    """Every positive distance of each trial, sorted, with bucket hints for ``_count``: (values,
    value offsets per trial, lo, scale, buckets per trial, hints, hint offsets)."""
    values, offsets, lows, scales, sizes, hints, hint_offsets = [], [0], [], [], [], [], [0]
    for t in range(n_trials):
        v = np.sort(positives.dist[((positives.bits >> np.uint64(t)) & np.uint64(1)).astype(bool)])
        m = int(min(max(4 * v.shape[0], 1), 1 << 22))
        lo = float(v[0]) if v.size else 0.0
        span = float(v[-1]) - lo if v.size else 0.0
        scale = m / span if span > 0 and math.isfinite(m / span) else 0.0
        h = np.empty(m + 1, dtype=np.int64)
        _hints(v, lo, scale, m, h)
        values.append(v), lows.append(lo), scales.append(scale), sizes.append(m), hints.append(h)
        offsets.append(offsets[-1] + v.shape[0])
        hint_offsets.append(hint_offsets[-1] + m + 1)
    return (np.concatenate(values), np.array(offsets, np.int64), np.array(lows), np.array(scales),
            np.array(sizes, np.int64), np.concatenate(hints), np.array(hint_offsets, np.int64))


NO_POOL = (np.empty(0), np.zeros(1, np.int64), np.empty(0), np.empty(0), np.empty(0, np.int64),
           np.zeros(0, np.int64), np.zeros(1, np.int64))


@_inline
def _positives(pool, t, x, inclusive):
    """Number of trial t's positive distances below x (at most x when ``inclusive``)."""
    values, offsets, lows, scales, sizes, hints, hint_offsets = pool
    return _count(values[offsets[t]:offsets[t + 1]], hints[hint_offsets[t]:hint_offsets[t + 1]], lows[t], scales[t],
                  sizes[t], x, inclusive)


# ------------------------------------------------------------------------------------ main pass


@_inline
def _canonical(blk, i, j):
    return kernels.canonical_distance(blk.qf, blk.gf, i, j, blk.qa[i], blk.ga[j], blk.metric)


@_inline
def _limit(blk, i, bound, gn_max):
    """A fast distance past which no pair of row i has a lower bound below ``bound`` (its window
    shrinks or stays as the distance grows: twice the widest window at ``bound``, as topk's reach)."""
    return bound + 2.0 * kernels.distance_window(bound, blk.qn[i], gn_max, blk.metric, blk.c_dot)


@_jit
def _trial_columns(blk, t, out):
    """out[x, j] = 1 where column j is a kept negative in trial t of any query with camera index x
    and another pid (not junk, the camera pair allowed, j in the trial)."""
    for x in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[x, j] = (blk.g_dropped[x, j] == 0) & (trial_bit(blk.g_bits[j], t) != 0)


@_inline
def _row_negatives(blk, i, columns, out):
    """out[j] = 1 where column j is a kept negative of query i (``columns``: its camera's row of
    ``_trial_columns``); branch-free, so the loop vectorises."""
    qp = blk.q_pid[i]
    for j in range(out.shape[0]):
        out[j] = columns[j] & (blk.g_pid[j] != qp)


LANES = 4  # interleaved sub-histograms: consecutive pairs in one bin would wait on each other's increment
LANE_BINS = 1 << 16  # beyond this many bins (--hist-bits over 16) one histogram: the lanes would not fit
# the caches (or the memory budget ``check_memory`` counts), and the pairs rarely share a bin


@_inline
def _count_row(blk, i, negative, sh, sub):
    """Row i's kept negatives (``negative``) into the interleaved sub-histograms on their fast
    distances."""
    row = blk.dist[i].view(np.uint64)
    n = row.shape[0]
    m = n - n % LANES
    lane = sub.shape[0] - 1  # LANES or 1 sub-histograms
    for j0 in range(0, m, LANES):
        for k in range(LANES):
            sub[k & lane, float_key(row[j0 + k]) >> sh] += negative[j0 + k]
    for j in range(m, n):
        sub[0, float_key(row[j]) >> sh] += negative[j]


@_inline
def _near_columns(blk, i, negative, limit, hit, near):
    """The columns of row i's kept negatives below ``limit`` into ``near``, how many returned.  They
    are few: a vectorised mask (``hit``, zero-padded to whole 8-byte words), then a compaction that
    skips its empty words, instead of a loop that compares and appends column by column."""
    row = blk.dist[i]
    for j in range(row.shape[0]):
        hit[j] = negative[j] & (row[j] < limit)
    return compact(hit, near)


@_jit
def _offer_row(blk, i, near, found, q, tail, core, bound, windows, first, last, below, taken, fine, members, cell):
    """Row i's pairs ``near[:found]`` (below its limit) to the trial's windows (jobs first..last-1 of
    ``windows``: lows, highs, the lows' keys, the fine bins' key shifts, capacities) and its tail
    (``bound``: its bound, -inf for none); returns the tail's bound.

    A window counts a pair below it when certainly so, else the pair's canonical distance decides
    between below, inside and above.  Inside, it counts the pair in its fine bin (the canonical
    distance's key, shifted) and collects it as an exact member (w = 0, into this task's buffer)
    while ``taken`` (counted over the chain) is below the capacity; once it is not, a pair whose
    whole error window lies in one fine bin is counted there without its canonical distance.  (One
    loop, no helper: each call of a helper taking the arrays would cost their reference counts, more
    than the pair's work.)"""
    lows, highs, klows, shifts, capacities = windows[:5]
    cell_bits = cell.view(np.uint64)
    last_bin = np.uint64(fine.shape[1] - 1)
    for e in range(found):
        j = near[e]
        d = blk.dist[i, j]
        w = kernels.distance_window(d, blk.qn[i], blk.gn[j], blk.metric, blk.c_dot)
        exact = np.nan  # the canonical distance, once needed
        for b in range(first, last):
            if d + w < lows[b]:
                below[b] += 1
            elif d - w < highs[b]:
                if taken[b] >= capacities[b] and lows[b] <= d - w and d + w < highs[b]:  # not collecting: the
                    sh = np.uint64(shifts[b])  # fine bin from the fast distance when its window lies in one
                    sub = (_key(cell, cell_bits, d - w) - klows[b]) >> sh
                    if sub == (_key(cell, cell_bits, d + w) - klows[b]) >> sh:
                        fine[b, np.int64(min(sub, last_bin))] += 1
                        continue
                if exact != exact:
                    exact = _canonical(blk, i, j)
                if exact < lows[b]:
                    below[b] += 1
                elif exact < highs[b]:
                    fine[b, np.int64(min((_key(cell, cell_bits, exact) - klows[b]) >> np.uint64(shifts[b]),
                                         last_bin))] += 1
                    if taken[b] < capacities[b]:
                        n = np.int64(members[b, 0, COUNT]) + 1
                        members[b, n, 0] = exact
                        members[b, n, 1] = 0.0
                        members[b, n, 2] = np.float64(blk.g_start + j)
                        members[b, n, 3] = q
                        members[b, 0, COUNT] = n
                        taken[b] += 1
        if d - w < bound:
            bound = _add(tail, core, d, w, np.float64(blk.g_start + j), q)
    return bound


@_inline
def _key_float(key):
    """The float64 whose key is ``key`` (``key_value`` in numba; NaN past the infinities)."""
    cell = np.empty(1, np.uint64)
    cell[0] = key ^ SIGN if key >> np.uint64(63) else ~key
    return cell.view(np.float64)[0]


@_inline
def _peak_upper(d, qn, gn, metric, c_dot):
    """An upper bound of d' + w(d') over fast distances d' in [0, d] (norms at most qn, gn): d' +
    w(d') rises up to the square root of the squared distance's error (the euclidean window's
    widest) and is convex past it, so its maximum is at one of the two points."""
    s = kernels.distance_window(0.0, qn, gn, metric, c_dot)  # euclidean: the square root of the error
    x = max(d + kernels.distance_window(d, qn, gn, metric, c_dot),
            min(d, s) + kernels.distance_window(min(d, s), qn, gn, metric, c_dot))
    return x + 8.0 * kernels.U64 * abs(x)


@_jit
def _seed_bound(entries, counts, sh, core, qn_max, gn_max, metric, c_dot):
    """Give a tail without a bound one from the block's own histogram when the block alone has
    ``core`` negatives: they all have fast distances below the edge E where the cumulative count
    reaches ``core``, so upper bounds at most ``_peak_upper(E)``: every later pair whose lower
    bound is at or above it is skipped, instead of filling and compacting the buffer first."""
    if entries[0, KNOWN] != 0.0 or entries[0, OVERFLOW] != 0.0 or counts.sum() < core:
        return
    total = 0
    for b in range(counts.shape[0]):
        total += counts[b]
        if total >= core:
            edge = _key_float(np.uint64(b + 1) << np.uint64(sh)) if b + 1 < counts.shape[0] else np.inf
            if edge < np.inf:  # (NaN past the key of +inf)
                entries[0, BOUND] = _peak_upper(edge, qn_max, gn_max, metric, c_dot)
                entries[0, KNOWN] = 1.0
            return


@_jit
def update_verify_fast(blk, qrows, shift, hist, tails, core, windows, below, taken, fine, members, count):
    """``update_verify`` without exact bins and AUC: kept negatives per trial into the histogram
    on their fast distances (a row at a time: its negatives masked first, then counted into
    interleaved sub-histograms), and those below the row's limit into the tails and the windows
    (``Windows.arrays``; jobs of trial t: ``job_first[t]:job_first[t + 1]``) after the row's scan.
    A tail without a bound gets one from the block's counts first (``_seed_bound``), then takes
    the block's pairs in a second scan.  Without ``count`` (a further pass) no histogram."""
    highs, job_first = windows[1], windows[5]
    cell = np.empty(1)
    sh = np.uint64(shift)
    n_rows, n = blk.dist.shape
    gn_max = blk.gn.max() if n else 0.0
    qn_max = blk.qn.max() if n_rows else 0.0
    columns = np.empty((blk.g_dropped.shape[0], n), np.uint8)
    negative = np.empty(n, np.uint8)
    hit = mask(n)
    near = np.empty(hit.shape[0], np.int64)
    sub = np.zeros((LANES if hist.shape[1] <= LANE_BINS else 1, hist.shape[1] if count else 1), np.int64)
    no_tail = np.zeros((1, ENTRY))
    for t in range(hist.shape[0]):
        _trial_columns(blk, t, columns)
        has_tail = tails.shape[1] > 1
        tail = tails[t] if has_tail else no_tail
        seeding = has_tail and count and tail[0, KNOWN] == 0.0
        bound = _bound(tail) if has_tail and not seeding else -np.inf
        first, last = job_first[t], job_first[t + 1]
        reach = highs[first:last].max() if last > first else -np.inf
        for scan in range(2 if seeding else 1):  # seeding: count, seed the bound, then offer
            if scan:
                _seed_bound(tail, sub.sum(axis=0), shift, core, qn_max, gn_max, blk.metric, blk.c_dot)
                bound = _bound(tail)
                first = last  # the windows had the block's pairs
                reach = -np.inf
            for i in range(n_rows):
                if trial_bit(blk.q_bits[i], t) == 0:
                    continue
                _row_negatives(blk, i, columns[blk.q_cix[i]], negative)
                if count and not scan:
                    _count_row(blk, i, negative, sh, sub)
                limit = max(_limit(blk, i, bound, gn_max), _limit(blk, i, reach, gn_max))
                found = _near_columns(blk, i, negative, limit, hit, near) if limit > -np.inf else 0
                if found:
                    bound = _offer_row(blk, i, near, found, np.float64(qrows[i]), tail, core, bound, windows, first,
                                       last, below, taken, fine, members, cell)
        if count:
            hist[t] += sub.sum(axis=0)
            sub[:] = 0


@_jit
def update_verify(blk, qrows, shift, exact_bins, hist, tails, core, auc, pool):
    """Add the block's kept negatives, per trial, to the histogram (bins on the canonical distance
    where the window straddles an edge if ``exact_bins``, else on the fast distance), the tails
    (only rows below the per-row limit get their window) and the AUC sum."""
    cell = np.empty(1)
    cell_bits = cell.view(np.uint64)
    sh = np.uint64(shift)
    n_trials = hist.shape[0]
    gn_max = widest(blk)
    bounds = np.full(n_trials, -np.inf)
    limits = np.empty(n_trials)
    if tails.shape[1] > 1:
        for t in range(n_trials):
            bounds[t] = _bound(tails[t])
    with_auc = auc.shape[0] > 0
    for i in range(blk.dist.shape[0]):
        if blk.q_bits[i] == 0:
            continue
        qn = blk.qn[i]
        q = np.float64(qrows[i])
        for t in range(n_trials):
            limits[t] = _limit(blk, i, bounds[t], gn_max)
        row = blk.dist[i].view(np.uint64)
        for j in range(blk.dist.shape[1]):
            if not kept_negative(blk, i, j):
                continue
            d = blk.dist[i, j]
            b = float_key(row[j]) >> sh
            w = -1.0  # the window, once needed
            if exact_bins:
                w = kernels.distance_window(d, qn, blk.gn[j], blk.metric, blk.c_dot)
                if _key(cell, cell_bits, d - w) >> sh != _key(cell, cell_bits, d + w) >> sh:  # straddles an edge
                    d = _canonical(blk, i, j)
                    w = 0.0
                    b = _key(cell, cell_bits, d) >> sh
            bits = blk.g_bits[j] & blk.q_bits[i]
            for t in range(n_trials):
                if trial_bit(bits, t) == 0:
                    continue
                hist[t, b] += 1
                if with_auc:  # 2 #{pos < d} + #{pos = d}, on the canonical d when a positive is in the window
                    if w < 0.0:
                        w = kernels.distance_window(d, qn, blk.gn[j], blk.metric, blk.c_dot)
                    below = _positives(pool, t, d - w, False)
                    if below != _positives(pool, t, d + w, True):
                        if w != 0.0:
                            d = _canonical(blk, i, j)
                            w = 0.0
                        below = _positives(pool, t, d, False)
                    auc[t] += below + _positives(pool, t, d, True)
                if d < limits[t]:
                    if w < 0.0:
                        w = kernels.distance_window(d, qn, blk.gn[j], blk.metric, blk.c_dot)
                    if d - w < bounds[t]:
                        bounds[t] = _add(tails[t], core, d, w, np.float64(blk.g_start + j), q)
                        limits[t] = _limit(blk, i, bounds[t], gn_max)


