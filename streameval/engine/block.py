"""What every statistic's chunk update reads: one block of distances and the rows' metadata.

The scoring pass computes, per query sub-block and gallery chunk, one block of GEMM dot products
and hands every requested statistic the same :data:`Block`.  A Block is a namedtuple, so numba
compiles it as one typed argument.

A pair's fast distance is ``fast_distance`` of its dot product.  Statistics take it where they need
it rather than from a filled block of float64 distances: that block (512 x 4,096 x 8 bytes = 16 MiB,
larger than the caches) cost more to write and read again than the GEMM at D = 256.  A statistic
that looks at pairs within a limit (``within``: rows near a query's last positive) screens the dot
products against the limit turned into a dot product, conservatively, and computes the distance of
the few rows that pass; one that needs every pair's distance (GOM's thresholds) computes a row at a
time into a buffer that stays in cache (``row_distances``).  Statistics that still read a filled
block declare ``reads_distances`` and the pass fills ``dist`` for them only.

Who counts as what (docs/protocols.md#the-kept-set) is decided here, once, for every statistic:

* ``kept_negative``: gallery row j is a kept negative of query i in some trial: another pid, not a
  junk pid, the camera pair not in ``x_any`` (both in ``g_dropped``), and a trial holding
  both (``g_bits & q_bits``, bit t = trial t).  Same-pid rows are never negatives: they are
  positives or excluded (x_same, own copy), which the positives pass decides.
* ``slotted_negatives``: the kept negatives within a statistic's reach with their slot, how many
  of query i's positives (sorted by (distance, gallery index)) come before row j, decided on the
  fast distance when its error window cannot change the answer and on the canonical distance
  otherwise (``kernels`` module docstring): exact in any chunking.

Positives are the superset's (every trial's); ``pos_bits`` says which trials each belongs to.
"""

from __future__ import annotations

import math
from collections import namedtuple

import numba as nb
import numpy as np
from numba.cpython.unsafe.numbers import trailing_zeros  # LLVM's cttz: undefined for 0, never given one

from . import kernels, scratch

_jit = nb.njit(nogil=True, cache=True)
_inline = nb.njit(nogil=True, cache=True, inline="always")

Block = namedtuple("Block", [
    "dots",  # (rows, gallery rows) GEMM dot products (working precision; float64 stored distances)
    "hits",  # uint64 (rows, words): a device's screen of ``dots`` (``screen_terms``), (0, 0) where none screened
    "dist",  # the float64 fast distances of ``dots``, filled only for statistics that declare ``reads_distances``
    "qf", "gf",  # features in the working precision (for canonical distances)
    "qa", "ga", "qn", "gn",  # float64 row terms and norms
    "metric", "c_dot", "c_refine",  # metric code, dot error bounds: the GEMM's, ``kernels.refined_dots``'
    "q_pid", "g_pid",  # int64
    "q_cix", "g_dropped",  # query camera index; uint8 [camera index, column]: 1 = junk pid or x_any
    "q_bits", "g_bits",  # uint64 trial membership
    "g_start",  # global (extended) gallery index of column 0
    "pos_off", "pos_d", "pos_g", "pos_bits",  # the rows' positives: CSR offsets into the other three
])


NOT_SCREENED = np.zeros((0, 0), dtype=np.uint64)  # Block.hits where no device screened the values


@_jit
def fill_distances(dots, qa, ga, metric, out):
    """out[i, j] = the fast distance of pair (i, j) from its GEMM dot product."""
    for i in range(dots.shape[0]):
        qai = qa[i]
        for j in range(dots.shape[1]):
            out[i, j] = kernels.pair_distance(dots[i, j], qai, ga[j], metric)


@_inline
def fast_distance(blk, i, j):
    """The fast distance of pair (i, j): its GEMM dot product combined with the rows' terms."""
    return kernels.pair_distance(blk.dots[i, j], blk.qa[i], blk.ga[j], blk.metric)


@_inline
def row_distances(blk, i, out):
    """out[j] = the fast distance of pair (i, j), for every row j of the chunk."""
    kernels.row_distances(blk.dots, i, blk.qa[i], blk.ga, blk.metric, out)


# Relative slack of the screen in ``within``: the fast distance's few float64 roundings move it by
# ~1e-15 of the magnitudes involved, the screen's own by as little; 1e-9 lets through a handful of
# extra rows, never drops one.
SCREEN_SLACK = 1e-9
# The screen's test in the dot products' own precision rounds its bound and its terms (a few
# rounding units of |a| + |b| ga each); it is loosened by this many units of that precision.
SCREEN_ROUNDINGS = 8


@_inline
def _screen(blk, i, limit, ga_max, roundings):
    """(sign, a, b) in the dot products' dtype: a pair (i, j) whose fast distance is at most
    ``limit`` has sign * dot >= a + b * ga[j] evaluated in that dtype (``ga[j]`` rounded to it, at
    most ``ga_max``): the float64 bound (``_bound``) loosened by ``roundings`` rounding units of
    |a| + |b| ga_max, so a float32 block is screened at float32's width and never drops a pair."""
    sign, a, b = _bound(blk, i, limit)
    a -= roundings * np.finfo(blk.dots.dtype).eps * (abs(a) + abs(b) * ga_max)
    return blk.dots.dtype.type(sign), blk.dots.dtype.type(a), blk.dots.dtype.type(b)


@_inline
def _bound(blk, i, limit):
    """(sign, a, b): a pair (i, j) whose fast distance is at most ``limit`` has
    sign * dot >= a + b * ga[j].  The fast distance falls as the dot product grows (rises, for a
    stored distance): cosine 1 - dot / (qa ga) <= L iff dot >= (1 - L) qa ga; squared euclidean
    qa + ga - 2 dot <= L iff dot >= (qa - L) / 2 + ga / 2; euclidean as squared with L^2.  Each bound
    is loosened by ``SCREEN_SLACK`` of the terms' magnitude, so rounding never drops a pair."""
    qa = blk.qa[i]
    m = SCREEN_SLACK
    if blk.metric == kernels.PRECOMPUTED:
        return -1.0, -limit - m * abs(limit), 0.0
    if blk.metric == kernels.COSINE:
        return 1.0, 0.0, qa * ((1.0 - limit) - m * (1.0 + abs(limit)))
    if blk.metric == kernels.EUCLIDEAN:
        limit = limit * limit * (1.0 + m) if limit >= 0.0 else -np.inf
    return 1.0, 0.5 * ((1.0 - m) * qa - limit - m * abs(limit)), 0.5 * (1.0 - m)


SCREEN_WORD = 64  # columns screened into one 64-bit word of hits


@_jit
def screen_columns(blk):
    """(kind, columns, ga_max, hit_words) for ``within``: the block's query rows grouped by what
    decides which gallery rows they may count as negatives apart from the pid (camera index, trial
    bits): kind[i] is row i's group, and columns[kind[i], j] is ``ga[j]`` (in the dot products'
    dtype), or NaN where row j is never a negative of such a query (junk, camera pair in x_any, no
    common trial); ga_max the largest ``ga``.  Built once a block (a group per camera and trial set
    present, usually a handful), so the screen reads one float per pair instead of testing camera,
    junk and trials; a NaN fails every comparison.  ``hit_words``: room for a row's words of hits."""
    n_rows = blk.dots.shape[0]
    kind = np.empty(n_rows, dtype=np.int64)
    cix = np.zeros(n_rows, dtype=np.int64)  # of each group; zeroed: the search reads one past the last
    bits = np.zeros(n_rows, dtype=np.uint64)
    n_kinds = 0
    for i in range(n_rows):
        k = 0
        while (k < n_kinds) and ((cix[k] != blk.q_cix[i]) | (bits[k] != blk.q_bits[i])):
            k += 1
        cix[k] = blk.q_cix[i]
        bits[k] = blk.q_bits[i]
        n_kinds = max(n_kinds, k + 1)
        kind[i] = k
    columns = np.empty((n_kinds, blk.dots.shape[1]), dtype=blk.dots.dtype)
    for k in range(n_kinds):
        dropped = blk.g_dropped[cix[k]]
        for j in range(columns.shape[1]):
            kept = (dropped[j] == 0) & ((blk.g_bits[j] & bits[k]) != 0)
            columns[k, j] = blk.ga[j] if kept else np.nan
    hit_words = np.empty(blk.dots.shape[1] // SCREEN_WORD, dtype=np.uint64)  # ``within``'s, a row at a time
    return kind, columns, blk.ga.max() if blk.ga.shape[0] else 0.0, hit_words


# A device's screen (``screen_terms``) is loosened by twice the rounding units of ``within``'s: a row
# that passes within's screen passes the device's too, whatever order the device rounds in (a fused
# multiply-add included; tests/test_block.py).
DEVICE_SCREEN_ROUNDINGS = 2 * SCREEN_ROUNDINGS


@_jit
def screen_terms(blk, limits):
    """What a device needs to screen the block's dot products as ``within`` does, for query row i
    at ``limits[i]`` or nearer, but looser (``DEVICE_SCREEN_ROUNDINGS``): pair (i, j) passes when
    sign * dot >= low[i] + slope[i] * columns[kind[i], j] (``screen_columns``: NaN where row j is
    never a negative of row i's group).  Returns (kind, columns, low, slope, sign)."""
    kind, columns, ga_max, _ = screen_columns(blk)
    low = np.empty(blk.dots.shape[0], dtype=blk.dots.dtype)
    slope = np.empty(blk.dots.shape[0], dtype=blk.dots.dtype)
    sign = blk.dots.dtype.type(1.0)
    for i in range(blk.dots.shape[0]):
        sign, low[i], slope[i] = _screen(blk, i, limits[i], ga_max, DEVICE_SCREEN_ROUNDINGS)
    return kind, columns, low, slope, sign


@_jit
def spread_hits(hit_words, values, dots):
    """dots[i, j] = the next of ``values`` for each set bit j (``within``'s words) of row i's
    ``hit_words[i]``, in row-major order: a device's screened dot products put in place."""
    k = 0
    for i in range(hit_words.shape[0]):
        for w in range(hit_words.shape[1]):
            hits = hit_words[i, w]
            while hits != 0:
                dots[i, w * SCREEN_WORD + np.int64(trailing_zeros(hits))] = values[k]
                k += 1
                hits &= hits - np.uint64(1)


@_inline
def last_positive_limits(blk):
    """Per query row, the reach of its last positive (-inf for a query without one): no row
    beyond it changes the query's ranks."""
    limits = np.full(blk.dots.shape[0], -np.inf)
    gn_max = widest(blk)
    for i in range(blk.dots.shape[0]):
        hi = blk.pos_off[i + 1]
        if hi > blk.pos_off[i]:
            limits[i] = reach(blk, i, blk.pos_d[hi - 1], gn_max)
    return limits


@_inline
def within(blk, i, limit, screen, cols):
    """cols[:n] = the kept negatives j (ascending) of query i whose fast distance may be at most
    ``limit``; returns n (``cols``: an entry per column of the block).  A screen of the dot products
    (``_screen``: a multiply-add and a compare a pair in the dot products' precision, against the
    block's ``screen_columns``), 64 columns at a time into a word of hit bits (a loop that
    vectorises: float32 lanes for a float32 block), whose set bits are listed lowest first, each
    with the pid test (a row of the query's pid is a positive or excluded, never a negative).  Every
    kept negative within the limit is listed, with at most a few just beyond it, so a caller
    decides each listed row exactly.  A byte mask compacted after the scan cost a third more on
    corrupted features (~3% of pairs within reach); listing each word's hits as it was made, ~20%
    more there than screening the row into words first and listing them after.  (A block a device
    screened is listed by ``device_hits`` instead.)  The screen asks
    the CPU for the next row's words as it goes (a block of dot products is past L2): 0.33 -> 0.25
    ns a pair on corrupted features, 0.24 -> 0.17 on clean ones."""
    dots = blk.dots[i]
    kind, columns, ga_max, hit_words = screen
    sign, a, b = _screen(blk, i, limit, ga_max, SCREEN_ROUNDINGS)
    kept_ga = columns[kind[i]]
    q_pid = blk.q_pid[i]
    n_cols = dots.shape[0]
    words = n_cols - n_cols % SCREEN_WORD
    next_row = (i + 1) * blk.dots.strides[0]
    word_bytes = SCREEN_WORD * blk.dots.itemsize
    for w in range(words // SCREEN_WORD):  # the screen first: it streams the row from memory
        first = w * SCREEN_WORD
        kernels.prefetch(blk.dots, next_row + w * word_bytes, next_row + (w + 1) * word_bytes)
        hits = np.uint64(0)
        for t in range(SCREEN_WORD):  # a constant count: the loop vectorises (False for a limit of -inf or NaN)
            hits |= np.uint64(sign * dots[first + t] >= a + b * kept_ga[first + t]) << np.uint64(t)
        hit_words[w] = hits
    n = _listed(hit_words, words // SCREEN_WORD, blk.g_pid, q_pid, cols)  # then the hits, from words in L1
    for j in range(words, n_cols):  # the last columns, fewer than a word
        cols[n] = j
        n += (sign * dots[j] >= a + b * kept_ga[j]) & (blk.g_pid[j] != q_pid)
    return n


@_inline
def device_hits(blk, i, cols):
    """``within`` for a block a device screened (``blk.hits``: ``screen_terms``, looser, for limits
    at least the caller's): cols[:n] = the columns of row i's hits, lowest first, but those of the
    query's pid; returns n.  Every row within's screen would list, and maybe more beyond the
    limit, which the caller decides as any other.  It asks the CPU for the dot products of the
    next row's hits: a device's block is past the caches, its hits scattered in it (the slots'
    update took 3.2 ms a 512 x 4,096 block read cold, 2.0 ms so, on captured blocks of 2,000 x
    1,000,000 x 256 with ~46 hits a row; 2.2 ms after ``within``'s scan of the row).  The callers
    choose between the two a row at a time: that choice inside within cost the CPU path's update
    2-6% on captured bench blocks (it changes how the screen's loop compiles), in the caller ~1%; a
    choice once a block compiled the caller's row work twice (+1.2 s at a first run)."""
    _prefetch_hits(blk, min(i + 1, blk.hits.shape[0] - 1))
    return _listed(blk.hits[i], blk.hits.shape[1], blk.g_pid, blk.q_pid[i], cols)


@_inline
def _prefetch_hits(blk, i):
    """Ask the CPU for the cache lines of row i's hits in ``blk.dots``."""
    row = i * blk.dots.strides[0]
    for w in range(blk.hits.shape[1]):
        hits = blk.hits[i, w]
        while hits != 0:
            at = row + (w * SCREEN_WORD + np.int64(trailing_zeros(hits))) * blk.dots.itemsize
            kernels.prefetch(blk.dots, at, at + 1)
            hits &= hits - np.uint64(1)


@_inline
def _listed(hit_words, n_words, g_pid, q_pid, cols):
    """cols[:n] = the columns of the set bits of hit_words[:n_words], lowest first, but those of pid
    ``q_pid``; returns n."""
    n = 0
    for w in range(n_words):
        hits = hit_words[w]
        while hits != 0:
            j = w * SCREEN_WORD + np.int64(trailing_zeros(hits))
            cols[n] = j
            n += g_pid[j] != q_pid
            hits &= hits - np.uint64(1)
    return n


@_inline
def mask(n_cols):
    """A zeroed mask for ``compact`` over ``n_cols`` columns, padded to whole 8-byte words (a
    column list it fills needs as many entries)."""
    return np.zeros(n_cols + (-n_cols) % 8, dtype=np.uint8)


@_inline
def compact(hit, cols):
    """cols[:n] = the positions of the nonzero bytes of ``hit`` (0 or 1, zero-padded to whole 8-byte
    words: ``mask``), ascending; returns n.  A word costs one step per set byte, found as its
    lowest set bit (little-endian: byte b of a word is its bits 8b..8b+7), so a sparse mask costs a
    read of it, and a dense one a step per hit rather than eight per word.  Only set positions are
    written: ``cols`` may be as long as the unpadded mask."""
    words = hit.view(np.uint64)
    n = 0
    for w in range(words.shape[0]):
        bits = words[w]
        while bits != 0:
            cols[n] = 8 * w + (np.int64(trailing_zeros(bits)) >> 3)
            n += 1
            bits &= bits - np.uint64(1)
    return n


@_inline
def kept_negative(blk, i, j):
    """Whether row j is a kept negative of query i in at least one trial (branch-free)."""
    return ((blk.g_pid[j] != blk.q_pid[i]) & (blk.g_dropped[blk.q_cix[i], j] == 0)
            & ((blk.g_bits[j] & blk.q_bits[i]) != 0))


@_inline
def kept_bits(blk, i, out):
    """out[j] = the trials in which row j is a kept negative of query i (0: none), for every row
    (contiguous loads only, so the loop vectorises)."""
    qp = blk.q_pid[i]
    qb = blk.q_bits[i]
    dropped = blk.g_dropped[blk.q_cix[i]]
    for j in range(out.shape[0]):
        out[j] = (blk.g_bits[j] & qb) * np.uint64((blk.g_pid[j] != qp) & (dropped[j] == 0))


def dropped_columns(g_junk: np.ndarray, g_cix: np.ndarray, any_table: np.ndarray) -> np.ndarray:
    """Block.g_dropped from the rows' junk flags and ``protocol.camera_table``: per query camera
    index, the rows a query of that camera never counts as negatives whatever their pid (junk, or
    the camera pair in x_any).  One contiguous row per query for ``kept_negative``: a lookup in the
    camera table per pair stopped its loops from vectorising."""
    return np.ascontiguousarray(any_table[:, g_cix] | g_junk[None, :])


@_inline
def reach(blk, i, d, gn_max):
    """A fast distance beyond which no row of the chunk can come before an item at distance ``d``
    for query i (``kernels.reach_distance``, with the chunk's widest row: ``widest``)."""
    return kernels.reach_distance(d, blk.qn[i], gn_max, blk.metric, blk.c_dot)


@_inline
def widest(blk):
    """The chunk's largest row norm (taken once a block: a row loop taking it cost a scan of the
    chunk per query)."""
    return blk.gn.max() if blk.gn.shape[0] else 0.0


@_inline
def _slot(blk, i, j, d, w, lo, hi):
    """Row j's slot among query i's positives (pos[lo:hi]) when no distance in [d - w, d + w] (its
    distance and error window) can change it, else -1 (``_slot_among``, searching them all)."""
    return _slot_among(blk, i, j, d, w, lo, hi, lo, hi)


@_inline
def _slot_among(blk, i, j, d, w, lo, hi, start, stop):
    """``_slot`` searching pos[start:stop] only, where every positive of pos[lo:start] is below
    d - w and every one of pos[stop:hi] above it: the positives before the window's low end,
    unless the next one is before its high end."""
    g = blk.g_start + j
    m = start + kernels.positives_before(blk.pos_d, blk.pos_g, start, stop, d - w, g)
    following = max(min(m, hi - 1), 0)  # read when there is a next positive only (branch-free)
    high = d + w
    straddled = (m < hi) & ((blk.pos_d[following] < high) | ((blk.pos_d[following] == high) & (blk.pos_g[following] < g)))
    first = m - lo
    return first - (first + 1) * np.int64(straddled)


BUCKETS_PER_POSITIVE = 8
MAX_BUCKETS = 4096


@_inline
def _bucket(x, x0, scale, buckets):
    """Index in a slot table of distance ``x``: 0 below the first positive's bucket, then
    floor((x - x0) scale) + 1 up to ``buckets`` + 1.  Non-decreasing in ``x`` (each step rounds
    monotonically), which is all the table relies on."""
    v = min(max((x - x0) * scale, -1.0), np.float64(buckets))
    return np.int64(math.floor(v)) + 1


@_inline
def _buckets(n_positives):
    """Buckets of a slot table (``_slot_table``) for ``n_positives`` positives."""
    return min(BUCKETS_PER_POSITIVE * n_positives, MAX_BUCKETS)


@_inline
def _slot_table(pos_d, lo, hi, table):
    """Fill ``table`` for the positives pos[lo:hi]: table[b] = the positives in buckets before b
    (``_bucket``), for b up to the last bucket + 1.  The bucket is non-decreasing in the distance,
    so the positives of buckets before an item's are below it and those of later buckets above: an
    item whose window [d - w, d + w] runs from bucket a to bucket b with table[a] == table[b + 1]
    has no positive in between, and table[a] is its slot, ties and all; otherwise its slot is
    decided among bucket a's positives alone, pos[lo + table[a]:lo + table[a + 1]].  (With ~4,200
    positives the cap of buckets leaves about one a bucket: searching them all, cold in the cache,
    the slots' update took 12.4 ms a 512 x 4,096 block of 2,000 x 1,000,000 x 64 with ~350 rows
    within a query's reach; 11.1 ms so.)  Returns (x0, scale, buckets)."""
    x0 = pos_d[lo]
    span = pos_d[hi - 1] - x0
    buckets = _buckets(hi - lo)
    scale = buckets / span if span > 0.0 else 0.0
    table[:buckets + 3] = 0
    for p in range(lo, hi):
        table[_bucket(pos_d[p], x0, scale, buckets) + 1] += 1
    for b in range(1, buckets + 3):
        table[b] += table[b - 1]
    return x0, scale, buckets


@_jit
def slotted_negatives(blk, limits, qi, gj, slot):
    """Every kept negative of the block within its query's limit (fast distance at most
    ``limits[i]``, the statistic's reach; ``within`` may add a few rows just beyond it), with its
    slot (query i's positives ordered before it, exact): into (query, column, slot) arrays
    ``negatives_buffers``; returns their number.

    A slot is decided on the fast distance when its error window cannot change it: from a table of
    the query's positives by distance bucket (``_slot_table``), or where a positive shares the
    window's buckets by a search among them (``_slot``).  Those still open are decided last, gallery
    row by gallery row, on a float64 dot product (``_refine_slots``) and, for the ties within its
    window, the canonical distance, so each row's features come from memory once for all its
    queries, not once per query between scans of the block (corrupted features, whose last
    positives rank ~2,000 rows deep, need ~20,000 a block: ~4 us each when read in scan order)."""
    cols = np.empty(blk.dots.shape[1], dtype=np.int64)
    table = np.empty(MAX_BUCKETS + 3, dtype=np.int64)
    screen = screen_columns(blk)
    screened = blk.hits.shape[0] > 0  # by a device
    n = 0
    for i in range(blk.dots.shape[0]):
        found = device_hits(blk, i, cols) if screened else within(blk, i, limits[i], screen, cols)
        n = _row_slots(blk, i, found, cols, table, n, qi, gj, slot)
    pending = np.flatnonzero(slot[:n] < 0)
    pending = pending[np.argsort(gj[pending], kind="mergesort")]
    if blk.metric != kernels.PRECOMPUTED:  # a stored distance is exact: nothing is left pending
        pending = _refine_slots(blk, qi, gj, slot, pending)
    exact = kernels.pair_distances(blk.qf, blk.gf, qi[pending], gj[pending], blk.qa, blk.ga, blk.metric)
    for k in range(pending.shape[0]):
        i = qi[pending[k]]
        slot[pending[k]] = kernels.positives_before(blk.pos_d, blk.pos_g, blk.pos_off[i], blk.pos_off[i + 1],
                                                    exact[k], blk.g_start + gj[pending[k]])
    return n


@_inline
def _refine_slots(blk, qi, gj, slot, pending):
    """Decide the pending slots on ``kernels.refined_dots``'s distances and their narrow window;
    returns the entries still pending (ties and near-ties within ~1e-13: the canonical distance
    decides them)."""
    dots = kernels.refined_dots(blk.qf, blk.gf, qi[pending], gj[pending])
    for k in range(pending.shape[0]):
        i = qi[pending[k]]
        j = gj[pending[k]]
        d = kernels.pair_distance(dots[k], blk.qa[i], blk.ga[j], blk.metric)
        w = kernels.distance_window(d, blk.qn[i], blk.gn[j], blk.metric, blk.c_refine)
        slot[pending[k]] = _slot(blk, i, j, d, w, blk.pos_off[i], blk.pos_off[i + 1])
    return pending[slot[pending] < 0]


def negatives_buffers(blk) -> tuple:
    """This thread's (query, column, slot) arrays for ``slotted_negatives``, with room for every pair
    of the block: only what it finds is written, and reused buffers spare a page fault per 4 KiB
    of fresh memory (``scratch``)."""
    return tuple(scratch.buffer(f"negatives-{name}", np.int64, (blk.dots.size,)) for name in ("query", "column", "slot"))


@_inline
def _row_slots(blk, i, found, cols, table, n, qi, gj, slot):
    """Query i's kept negatives cols[:found] with their slots (-1: a finer distance decides) into
    (qi, gj, slot) from entry n on; returns the entries' new count.  Each slot from a table of the
    query's positives (``_slot_table``), or where its rows' searches among them cost less than the
    table (``_searched``), by a search (``_slot``)."""
    if found > 0:
        lo = blk.pos_off[i]
        hi = blk.pos_off[i + 1]
        if _searched(found, hi - lo):
            for k in range(found):
                d, w = _entry(blk, i, cols[k], n + k, qi, gj)
                slot[n + k] = _slot(blk, i, cols[k], d, w, lo, hi)
        else:
            x0, scale, buckets = _slot_table(blk.pos_d, lo, hi, table)
            for k in range(found):
                d, w = _entry(blk, i, cols[k], n + k, qi, gj)
                a = _bucket(d - w, x0, scale, buckets)
                first = table[a]
                clear = first == table[_bucket(d + w, x0, scale, buckets) + 1]  # no positive in the window's buckets
                slot[n + k] = first if clear else _slot_among(blk, i, cols[k], d, w, lo, hi, lo + first, lo + table[a + 1])
    return n + found


@_inline
def _entry(blk, i, j, at, qi, gj):
    """Entry ``at`` of (qi, gj) made the pair (i, j); returns its fast distance and window."""
    qi[at] = i
    gj[at] = j
    d = fast_distance(blk, i, j)
    return d, kernels.distance_window(d, blk.qn[i], blk.gn[j], blk.metric, blk.c_dot)


# A step of a search among a query's positives costs about as much as this many buckets of its slot
# table (captured blocks of 2,000 x 1,000,000 x 256, ~830 positives a query, ~46 of its negatives
# within reach a block: the slots' update took 2.2 ms a block searching, 3.2 ms with a table each)
SEARCH_STEP_BUCKETS = 4


@_inline
def _searched(found, n_positives):
    """Whether ``found`` rows' searches among ``n_positives`` cost less than a table of them."""
    steps = 0  # of a search: the bit length of n_positives
    while n_positives >> steps:
        steps += 1
    return found * steps * SEARCH_STEP_BUCKETS < _buckets(n_positives)


@_inline
def before_key(blk, i, j, d_ref, g_ref):
    """Whether row j comes before the item (d_ref, g_ref) for query i (exact)."""
    d = fast_distance(blk, i, j)
    g = blk.g_start + j
    w = kernels.distance_window(d, blk.qn[i], blk.gn[j], blk.metric, blk.c_dot)
    low = (d - w < d_ref) | ((d - w == d_ref) & (g < g_ref))
    high = (d + w < d_ref) | ((d + w == d_ref) & (g < g_ref))
    if low == high:
        return low
    exact = kernels.canonical_distance(blk.qf, blk.gf, i, j, blk.qa[i], blk.ga[j], blk.metric)
    return (exact < d_ref) | ((exact == d_ref) & (g < g_ref))


@_inline
def trial_bit(bits, t):
    return np.int64((bits >> np.uint64(t)) & np.uint64(1))
