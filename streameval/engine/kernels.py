"""Numba kernels: pure, serial, nogil functions over one block of data.

Distances.  A pair's distance is *defined* by ``canonical_distance``: its dot product summed in
float64 in a fixed order (products of the working-precision features), combined with the rows'
float64 terms (``row_terms``) by ``pair_distance``.  It does not depend on chunking or on BLAS.

The GEMM is only an accelerator.  Its dot products (float32 or float64, any summation order) differ
from the canonical ones by at most ``dot_error_bound * |q| |g|`` (Higham's gamma_n bound), which
``distance_window`` turns into a window around each fast distance.  Ranking decisions (is this
negative before that positive) and the minmax range are taken on the fast distance when the whole
window gives the same answer, then on a float64 dot product summed in any order (``refined_dots``,
vectorised; its window is ~1e-13 wide) when its window does, and on the canonical distance
otherwise: exact ties (duplicate images) and near-ties are decided exactly, by the tie rule,
whatever the chunking.  (At D = 2,048 the float32 window leaves a few percent of the negatives near
a positive undecided; the canonical sum, scalar in its fixed order, cost ~2 us each there.)

GOM thresholds are settled the same way with float64 GEMMs.  With float32 GEMMs the rigorous window
is wide enough (~1e-4 relative at D = 2048) that settling every negative near one of the 101
thresholds would cost more than the GEMM, so there a negative is binned by its fast distance
(``bin_error_bound``): only a distance within float32 rounding of a threshold can land one bin off.

Ranking state.  For a query with positives ``p_1 < ... < p_n`` (ordered by ``(distance, gallery
index)``), a negative's *slot* is the number of positives ordered before it (``positives_before``).
With ``slots[a + s]`` the negatives in slot ``s`` (counted by ``statistics.slots``), the j-th positive
has ``n_j = sum_{s<j} slots[a + s]`` negatives before it and rank ``r_j = j + n_j``
(``rank_summaries``).  Slot counts are additive over gallery chunks, which is what lets the gallery
stream.

Precision limits.  A float32 GEMM overflows on rows of huge norm and loses its products to underflow
on rows of tiny norm, both silently.  ``NORM_RANGE`` is the range of nonzero row norms for which the
bound ``dot_error_bound`` holds (derived there); ``graph.load_rows`` refuses a row outside it.

The statistics' chunk updates (``engine/block.py``, ``features/*/statistic.py``) are built from the helpers here.

Start-up.  Kernels are compiled once and cached on disk (``cache=True``).  In a new process the
first kernel call initialises numba's compiler context (~0.15 s, pure Python); loading a cached
entry point then takes a few milliseconds.  Of this module only ``row_terms``, ``pair_distances``,
``distance_range``, ``rank_summaries`` and ``gom_curves`` are called from Python; the ``_inline``
helpers are compiled into their callers.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic


def _versioned_cache() -> None:
    """Put numba's on-disk cache in a folder named after a hash of every kernel module's source.

    numba checks a cached kernel against its own file's time stamp only, but kernels inline helpers
    of other modules (this one's into the features' statistics): after one of those changes alone - a ``git
    pull`` into an editable install - a cached caller would keep the old helper and give wrong
    numbers without a word.  A changed source now means a new folder, so every kernel is compiled
    afresh.  The folder is in NUMBA_CACHE_DIR when the user set it, else in the package's
    __pycache__, else - an install whose package folder cannot be written - in the user's cache
    folder (``_cache_root``); with none writable, numba's own choice is kept."""
    package = Path(__file__).resolve().parent
    digest = hashlib.blake2b(digest_size=8)
    for source in sorted(package.parent.rglob("*.py")):  # every module that may hold or inline a kernel
        text = source.read_bytes()
        if b"numba" in text:
            digest.update(str(source.relative_to(package.parent)).encode() + text)
    root = _cache_root(package, nb.config.CACHE_DIR)
    if root is not None:
        nb.config.CACHE_DIR = str(root / f"numba-{digest.hexdigest()}")


def _cache_root(package: Path, user_choice: str) -> Path | None:
    """The first writable of: the user's NUMBA_CACHE_DIR (``user_choice``; then only it), the
    package's __pycache__, ``$XDG_CACHE_HOME/streameval`` (default ``~/.cache/streameval``)."""
    user_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "streameval"
    for root in [Path(user_choice)] if user_choice else [package / "__pycache__", user_cache]:
        existing = next(folder for folder in (root, *root.parents) if folder.exists())
        if os.access(existing, os.W_OK):
            return root
    return None


_versioned_cache()  # before any kernel below or in a statistic is decorated

SQEUCLIDEAN, EUCLIDEAN, COSINE, PRECOMPUTED = 0, 1, 2, 3
# A distance store's values are the distances (similarities negated when read): its "metric".
METRIC_CODES = {"sqeuclidean": SQEUCLIDEAN, "euclidean": EUCLIDEAN, "cosine": COSINE,
                "distance": PRECOMPUTED, "similarity": PRECOMPUTED}
UNIT_ROUNDOFF = {np.dtype(np.float32): 2.0**-24, np.dtype(np.float64): 2.0**-53}
U64 = 2.0**-53
# Absolute error one operation of a dot product may add beyond u |result|: rounding a subnormal
# result, or flushing it to zero where a library sets FTZ - less than the smallest normal number.
UNDERFLOW = {np.dtype(np.float32): 2.0**-126, np.dtype(np.float64): 2.0**-1022}
# Nonzero row norms a GEMM in each working precision takes within ``dot_error_bound``, (lo, hi):
# * float32, hi = 2^63: every partial sum of a dot is at most sum |q_k g_k| (1 + gamma_n) <=
#   |q| |g| (1 + gamma_n) <= 2^126 (1 + gamma_n), a quarter of float32's maximum (~2^128): no
#   overflow (a product is at most |q| |g| too).
# * float32, lo = 2^-40: underflow adds an absolute error per dot that ``dot_error_bound`` covers
#   as a relative term 3 dim UNDERFLOW / lo^2 ~ 3 dim 2^-46, a millionth of the rounding term
#   dim 2^-24; rows of norm ~2^-83 (features scaled by 1e-25) would be all underflow.
# * float64: stored features are float16 or float32 (float64 ones, query expansion's, below 2^-149 are
#   refused), so a nonzero row's norm is at least 2^-149
#   (float32's smallest subnormal) and |q| |g| <= dim * float32max^2 ~ dim 2^256, far below
#   float64's 2^1024: nothing to refuse.  Products of float32 values are exact in float64 (48-bit
#   significands, exponents >= -298), so underflow only touches cancelled sums, covered as above.
NORM_RANGE = {np.dtype(np.float32): (2.0**-40, 2.0**63), np.dtype(np.float64): (2.0**-149, math.inf)}

_jit = nb.njit(nogil=True, cache=True)
_inline = nb.njit(nogil=True, cache=True, inline="always")


def dot_error_bound(dim: int, dtype) -> float:
    """c such that |GEMM dot - canonical dot| <= c |q| |g| for any summation order, for rows whose
    nonzero norms are in ``NORM_RANGE[dtype]`` (a zero row's dots are exact zeros).

    Both are sums of ``dim`` products: gamma_n = n u / (1 - n u) bounds each one's rounding error
    relative to sum |q_k g_k| <= |q| |g| (u of the GEMM's dtype, and of float64 for the canonical
    sum).  Underflow adds to each an absolute error below 2 dim ``UNDERFLOW`` (one per product and
    addition, whatever the order), plus, where a library reads float32 inputs below the normal range
    as zero (DAZ), at most 2^-126 sum_k (|q_k| + |g_k|) <= 2^-126 sqrt(dim) (|q| + |g|).  For norms
    of at least lo = ``NORM_RANGE[dtype][0]`` <= 1/2 all of it is below 3 dim UNDERFLOW / lo^2 times
    |q| |g|: the last term.
    """
    dtype = np.dtype(dtype)

    def gamma(u):
        return dim * u / (1.0 - dim * u)

    underflow = 3.0 * dim * (UNDERFLOW[dtype] + UNDERFLOW[np.dtype(np.float64)]) / NORM_RANGE[dtype][0] ** 2
    return gamma(UNIT_ROUNDOFF[dtype]) + gamma(U64) + underflow


def first_out_of_range(norms: np.ndarray, dtype) -> int | None:
    """Index of the first nonzero norm outside ``NORM_RANGE[dtype]``, or None."""
    lo, hi = NORM_RANGE[np.dtype(dtype)]
    bad = np.flatnonzero((norms != 0.0) & ((norms < lo) | (norms > hi)))
    return int(bad[0]) if bad.size else None


def bin_error_bound(dim: int, dtype) -> float:
    """The window used for GOM thresholds: rigorous for float64 GEMMs, none for float32 (see above)."""
    return dot_error_bound(dim, dtype) if np.dtype(dtype) == np.float64 else 0.0


@_inline
def pair_distance(dot, qa, ga, metric):
    """Distance of one pair from its dot product and the two rows' float64 terms (a stored
    distance is its own "dot product")."""
    dot = np.float64(dot)
    if metric == PRECOMPUTED:
        return dot
    if metric == COSINE:
        return 1.0 - dot / (qa * ga)
    d = max(qa + ga - 2.0 * dot, 0.0)
    if metric == EUCLIDEAN:
        d = math.sqrt(d)
    return d


@_inline
def canonical_distance(qf, gf, i, j, qa, ga, metric):
    """The distance of (qf[i], gf[j]).

    Its dot product is summed in float64 in a fixed order that pipelines well: four partial sums
    over k = 0, 1, 2, 3 (mod 4), added as (s0 + s1) + (s2 + s3), then the tail.

    For stored distances (``PRECOMPUTED``) the scoring pass hands the block of stored distances as
    ``qf``: the pair's value is exact as read.
    """
    if metric == PRECOMPUTED:
        return np.float64(qf[i, j])
    dim = qf.shape[1]
    full = dim - dim % 4
    s0 = 0.0
    s1 = 0.0
    s2 = 0.0
    s3 = 0.0
    for k in range(0, full, 4):
        s0 += np.float64(qf[i, k]) * np.float64(gf[j, k])
        s1 += np.float64(qf[i, k + 1]) * np.float64(gf[j, k + 1])
        s2 += np.float64(qf[i, k + 2]) * np.float64(gf[j, k + 2])
        s3 += np.float64(qf[i, k + 3]) * np.float64(gf[j, k + 3])
    dot = (s0 + s1) + (s2 + s3)
    for k in range(full, dim):
        dot += np.float64(qf[i, k]) * np.float64(gf[j, k])
    return pair_distance(dot, qa, ga, metric)


@_inline
def distance_window(d, qn, gn, metric, c_dot):
    """Half-width w with |fast distance - canonical distance| <= w, for fast distance ``d``.

    qn, gn: the rows' norms.  Includes a few float64 roundings of the combination itself.  A stored
    distance has no window: it is exact as read.
    """
    if metric == PRECOMPUTED:
        return 0.0
    if metric == COSINE:
        return c_dot + 4.0 * U64
    ds = 2.0 * c_dot * qn * gn + 4.0 * U64 * (qn + gn) * (qn + gn)
    if metric == SQEUCLIDEAN:
        return ds
    w = math.sqrt(ds)  # |sqrt(a) - sqrt(b)| <= sqrt(|a - b|), and <= |a - b| / sqrt(a)
    if d > 0.0:
        w = min(w, ds / d * (1.0 + 1e-12))
    return w + 4.0 * U64 * d


@_inline
def reach_distance(d, qn, gn_max, metric, c_dot):
    """A fast distance beyond which no row (norm at most ``gn_max``) of a query of norm ``qn`` has
    a canonical distance at or below ``d``: ``d`` plus the window at ``d``, plus 8 units in the last
    place.  A row at fast distance d' > d has a window no wider, but for the rounding term 4u d'
    that the margin covers.  (The window at distance 0 is far wider for euclidean distances: the
    square root of the squared distance's error.)"""
    x = d + distance_window(d, qn, gn_max, metric, c_dot)
    return x + 8.0 * U64 * abs(x)


TERM_ROWS = 8  # rows summed side by side in ``row_terms``


@_jit
def row_terms(x, metric):
    """Per-row float64 term: the squared norm (euclidean metrics) or the norm (cosine).

    Summed in float64 in a fixed order (k = 0, 1, ...), so a row's term does not depend on the chunk
    it is read in.  ``TERM_ROWS`` rows are summed side by side: one row's sum is a chain of dependent
    additions, several rows' chains overlap (~3x faster, the same bits).
    """
    n = x.shape[0]
    out = np.empty(n, dtype=np.float64)
    acc = np.empty(TERM_ROWS)
    row = np.empty(TERM_ROWS, dtype=np.int64)
    for r0 in range(0, n, TERM_ROWS):
        for lane in range(TERM_ROWS):
            row[lane] = min(r0 + lane, n - 1)  # the last group repeats the last row rather than a shorter loop
        acc[:] = 0.0
        for k in range(x.shape[1]):
            for lane in range(TERM_ROWS):
                v = np.float64(x[row[lane], k])
                acc[lane] += v * v
        m = min(TERM_ROWS, n - r0)
        out[r0:r0 + m] = np.sqrt(acc[:m]) if metric == COSINE else acc[:m]
    return out


# Pairs ahead whose rows ``pair_distances`` asks the CPU to fetch: listed pairs read rows scattered
# over a chunk and the query block (tens of MiB, past L2), and the sum over a row waits on each of
# its cache lines in turn.  Fetched ahead, pairs in the positives pass's order (by identity) took 96
# instead of 175 ns at D = 256, as many as pairs read in scan order.
PREFETCH_AHEAD = 6
CACHE_LINE = 64


@_jit
def pair_distances(qf, gf, qrows, grows, qa, ga, metric):
    """Canonical distances of the listed pairs (qf[qrows[k]], gf[grows[k]])."""
    n = qrows.shape[0]
    out = np.empty(n, dtype=np.float64)
    fetched = metric != PRECOMPUTED  # a stored distance is one value of a long row
    for k in range(n):
        if fetched & (k + PREFETCH_AHEAD < n):
            _prefetch_row(qf, qrows[k + PREFETCH_AHEAD])
            _prefetch_row(gf, grows[k + PREFETCH_AHEAD])
        out[k] = canonical_distance(qf, gf, qrows[k], grows[k], qa[qrows[k]], ga[grows[k]], metric)
    return out


@_inline
def _prefetch_row(x, row):
    """Ask the CPU to bring row ``row`` of the 2-d array ``x`` (contiguous rows) into its caches."""
    prefetch(x, row * x.strides[0], row * x.strides[0] + x.shape[1] * x.itemsize)


@_inline
def prefetch(x, start, stop):
    """Ask the CPU to bring bytes [start, stop) of array ``x``'s data into its caches, a line at a
    time (``_prefetch``: past the data, a hint that does nothing)."""
    for offset in range(start, stop, CACHE_LINE):
        _prefetch(x, offset)


@intrinsic
def _prefetch(typingctx, x, offset):
    """LLVM's prefetch of the cache line at byte ``offset`` of array ``x``'s data (a read, kept in
    every cache level): a hint, which never faults and does nothing where the CPU has no such
    instruction."""
    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        address = builder.gep(builder.bitcast(data, ir.IntType(8).as_pointer()), [args[1]])
        i32 = ir.IntType(32)
        prefetch = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [address.type, i32, i32, i32]), "llvm.prefetch.p0")
        builder.call(prefetch, [address, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(x, types.int64), codegen


@nb.njit(nogil=True, cache=True, fastmath=True)
def refined_dots(qf, gf, qrows, grows):
    """float64 dot products of the listed pairs (qf[qrows[k]], gf[grows[k]]), summed in whatever
    order the compiler vectorises best (``fastmath``): within ``dot_error_bound(dim, float64)``
    |q| |g| of the canonical ones, which holds for any order.  Several times cheaper than
    ``pair_distances``, whose fixed order runs scalar: a ranking decision the GEMM's float32 window
    leaves open is almost always closed by this window (1e-13 wide instead of 1e-4 at D = 2,048)."""
    out = np.empty(qrows.shape[0], dtype=np.float64)
    for k in range(qrows.shape[0]):
        out[k] = _any_order_dot(qf[qrows[k]], gf[grows[k]])
    return out


@nb.njit(nogil=True, cache=True, fastmath=True)
def refined_row_dots(qf, gf, i, grows, out):
    """``refined_dots`` of the pairs (qf[i], gf[grows[k]]) into ``out`` (no allocation: the kNN
    pass asks per row)."""
    for k in range(grows.shape[0]):
        out[k] = _any_order_dot(qf[i], gf[grows[k]])


@_inline
def _any_order_dot(q, g):
    """The float64 dot product of two rows, summed in the order the caller's ``fastmath`` picks."""
    acc = 0.0
    for m in range(q.shape[0]):
        acc += np.float64(q[m]) * np.float64(g[m])
    return acc


# Sorted lists of keys (distance, row) and the max-heap of their bounds: the ranked lists' and the
# kNN pass's top-k.
@_inline
def key_before(d, g, d_ref, g_ref):
    """Whether key (d, g) comes before (d_ref, g_ref): by distance, ties by row."""
    return (d < d_ref) | ((d == d_ref) & (g < g_ref))


@_inline
def insert_key(keys, d, g):
    """Put (d, g) into the sorted list ``keys`` if it comes before its last entry (which drops out)."""
    m = keys.shape[0] - 1
    if not key_before(d, g, keys[m, 0], keys[m, 1]):
        return
    while m > 0 and key_before(d, g, keys[m - 1, 0], keys[m - 1, 1]):
        keys[m, 0] = keys[m - 1, 0]
        keys[m, 1] = keys[m - 1, 1]
        m -= 1
    keys[m, 0] = d
    keys[m, 1] = g


@_inline
def push_bound(heap, value):
    """Put ``value`` into the max-heap ``heap`` of the k smallest bounds if it is below the largest
    (the root, which drops out): O(log k) where a sorted insertion costs O(k)."""
    if not value < heap[0]:
        return
    n = heap.shape[0]
    m = 0
    while True:
        child = 2 * m + 1
        if child >= n:
            break
        if child + 1 < n and heap[child + 1] > heap[child]:
            child += 1
        if not heap[child] > value:
            break
        heap[m] = heap[child]
        m = child
    heap[m] = value


@_jit
def merge_smallest(a, b):
    """Per query, the k smallest keys of the union of lists ``a`` and ``b`` (over disjoint rows)."""
    out = np.empty_like(a)
    k = a.shape[1]
    for i in range(a.shape[0]):
        x = 0
        y = 0
        for m in range(k):
            if key_before(b[i, y, 0], b[i, y, 1], a[i, x, 0], a[i, x, 1]):
                out[i, m, 0] = b[i, y, 0]
                out[i, m, 1] = b[i, y, 1]
                y += 1
            else:
                out[i, m, 0] = a[i, x, 0]
                out[i, m, 1] = a[i, x, 1]
                x += 1
    return out


@_inline
def positives_before(pos_d, pos_g, lo, hi, d, g):
    """Number of positives in pos[lo:hi] ordered before the item (d, g): a lower bound search."""
    start = lo
    while lo < hi:
        mid = (lo + hi) >> 1
        before = (pos_d[mid] < d) | ((pos_d[mid] == d) & (pos_g[mid] < g))
        lo = mid + 1 if before else lo
        hi = hi if before else mid
    return lo - start


@_jit
def place_by_query(qrows, dist, gidx, bits, fill, out_dist, out_gidx, out_bits):
    """Each pair's keys and trial bits at its query's next free entry (``fill[query]``, advanced):
    the placement of a counting sort by query, part after part of the pairs, straight into the
    outputs.  Concatenating the parts, sorting a permutation and gathering three columns through it
    took 8.7 s to collect 42,000,000 positives in 611 parts (best of five, where nothing else runs),
    this and ``sort_each_query`` 1.0 s (3.0 s with a heapsort)."""
    for k in range(qrows.shape[0]):
        at = fill[qrows[k]]
        out_dist[at] = dist[k]
        out_gidx[at] = gidx[k]
        out_bits[at] = bits[k]
        fill[qrows[k]] = at + 1


@_jit
def sort_each_query(offsets, dist, gidx, bits):
    """Sort each query's entries (``offsets``) in place by (distance, gallery index), carrying
    ``bits``: tens of entries a query typically, thousands in a large gallery with few identities.
    Up to ``INSERTION_SORT_MAX`` entries by insertion, more by a radix sort (``_radix_sort``). A
    heapsort in its place took 2.6 s for 10,000 queries x 4,200 positives (the radix 0.5 s), a
    serial step before any scoring task starts, but compiled in 0.8 s where this takes 1.7 s, once;
    a lexsort of all pairs on three keys ~0.1 s for 10,000 queries x 50 positives."""
    largest = 0
    for q in range(offsets.shape[0] - 1):
        largest = max(largest, offsets[q + 1] - offsets[q])
    keys, order = np.empty((2, largest), np.uint64), np.empty((2, largest), np.int64)
    counts = np.empty(RADIX, np.int64)
    dist_bits = dist.view(np.uint64)
    for q in range(offsets.shape[0] - 1):
        lo, hi = offsets[q], offsets[q + 1]
        if hi - lo <= INSERTION_SORT_MAX:
            _insertion_sort(dist[lo:hi], gidx[lo:hi], bits[lo:hi])
        else:
            _radix_sort(dist_bits[lo:hi], gidx[lo:hi], bits[lo:hi], keys, order, counts)


INSERTION_SORT_MAX = 64  # up to this many a query's pairs sort by insertion, faster than the radix's passes
RADIX_BITS = 8  # a pass's digit: its 256 counts and the query's keys stay in the first-level cache
RADIX = 1 << RADIX_BITS
SIGN = np.uint64(1 << 63)  # a float64's sign bit


@_inline
def _insertion_sort(dist, gidx, pairs):
    """Sort the entries of ``dist``, ``gidx`` and ``pairs`` in place by (distance, gallery index):
    quadratic, but an entry's compares all go one way until its place (one mispredicted branch an
    entry)."""
    for k in range(1, pairs.shape[0]):
        d, g, p = dist[k], gidx[k], pairs[k]
        m = k
        while (m > 0) and ((dist[m - 1] > d) | ((dist[m - 1] == d) & (gidx[m - 1] > g))):
            dist[m], gidx[m], pairs[m] = dist[m - 1], gidx[m - 1], pairs[m - 1]
            m -= 1
        dist[m], gidx[m], pairs[m] = d, g, p


@_inline
def _radix_sort(dist_bits, gidx, pairs, keys, order, counts):
    """Sort the entries in place by (distance, gallery index), the distances given as their float64
    bits (``dist_bits``, a view of them): a least-significant-digit radix sort,
    stable, of the entries' numbers (``order``) by gallery index unless they come in its order (as
    the positives' parts do, gallery chunk after chunk), then by the distance's bits ordered as the
    floats are (``float_key``); then the three columns gathered. ``keys``, ``order``: two rows
    of at least the entries' count, ``counts``: ``RADIX``."""
    n = dist_bits.shape[0]
    for k in range(n):
        order[0, k] = k
    src = 0
    if not _ascending(gidx):
        for k in range(n):
            keys[0, k] = np.uint64(gidx[k])
        src = _radix_passes(keys, order, n, counts, 0)
    for k in range(n):
        keys[src, k] = float_key(dist_bits[order[src, k]])
    src = _radix_passes(keys, order, n, counts, src)
    for column in (dist_bits, gidx.view(np.uint64), pairs):  # as uint64: one compiled gather
        _gather(column, order[src], keys[1 - src])


@_inline
def _ascending(values):
    for k in range(1, values.shape[0]):
        if values[k] < values[k - 1]:
            return False
    return True


@_inline
def float_key(u):
    """The order-preserving key of a float64 given as its bits ``u``: a uint64 ordered as the
    floats are (a positive's sign bit set, a negative's bits all flipped), -0.0 taken as +0.0."""
    u ^= SIGN * np.uint64(u == SIGN)
    return u ^ ((np.uint64(0) - (u >> np.uint64(63))) | SIGN)


@_inline
def _radix_passes(keys, order, n, counts, src):
    """Stable counting-sort passes of the first ``n`` keys and entry numbers of row ``src``, a digit
    at a time from the lowest, up to the highest bit any two keys differ in; returns the row that
    holds the result."""
    spread = np.uint64(0)
    for k in range(n):
        spread |= keys[src, k] ^ keys[src, 0]
    shift = 0
    while shift < 64 and (spread >> np.uint64(shift)) != 0:
        counts[:] = 0
        for k in range(n):
            counts[(keys[src, k] >> np.uint64(shift)) & np.uint64(RADIX - 1)] += 1
        total = 0
        for b in range(RADIX):
            total, counts[b] = total + counts[b], total
        dst = 1 - src
        for k in range(n):
            digit = (keys[src, k] >> np.uint64(shift)) & np.uint64(RADIX - 1)
            at = counts[digit]
            keys[dst, at], order[dst, at] = keys[src, k], order[src, k]
            counts[digit] = at + 1
        src = dst
        shift += RADIX_BITS
    return src


@_jit
def _gather(values, order, held):
    """values[:] = values[order], through ``held`` (a row of the keys, free by now)."""
    for k in range(values.shape[0]):
        held[k] = values[order[k]]
    for k in range(values.shape[0]):
        values[k] = held[k]


NORM_NONE, NORM_AFFINE = 0, 1


@_inline
def normalise(d, norm_mode, lo, span):
    """GOM's d~: ``d`` itself (mode none) or ``(d - lo) / span`` clipped to [0, 1] (minmax, fixed).

    A zero span (every distance equal) maps everything to 0.
    """
    if norm_mode == NORM_NONE:
        return d
    if span == 0.0:
        return 0.0
    return min(max((d - lo) / span, 0.0), 1.0)


@_inline
def threshold_bin(dn, n_bins):
    """Smallest i with ``dn <= tau_i = i * (1/N)``; N + 1 when no threshold returns the item.

    The estimate ceil(dn * N) is at most one off; it is corrected against the grid values computed
    exactly as the grid is defined, so a distance equal to a grid value lands at that threshold.
    Branch-free, so row loops over it vectorise.
    """
    step = 1.0 / n_bins
    k = np.int64(math.ceil(min(max(dn, 0.0), 2.0) * n_bins))
    k = min(k, n_bins + 1)
    k -= np.int64((k > 0) & (dn <= (k - 1) * step))
    k += np.int64((k <= n_bins) & (dn > k * step))
    return k


@_inline
def clip_side(d, lo, span):
    """-1 when affine normalisation clips ``d`` up to 0 (below LO), 1 when down to 1 (above HI), else 0.

    Without the division: for x = d - lo (rounded) and span > 0, the rounded x / span is > 1 exactly
    when x > span (a double above span is at least span (1 + 2^-52 / m), m in [1, 2), whose quotient
    rounds above 1) and < 0 exactly when d < lo.
    """
    return np.int64(d - lo > span) - np.int64(d < lo)


_MAGNITUDE = np.int64(0x7FFF_FFFF_FFFF_FFFF)


@_inline
def _ordered(bits):
    """The int64 ordered as the float64 with these bits (its magnitude bits flipped when negative;
    -0.0 just below +0.0), and back: the map is its own inverse."""
    return bits ^ ((bits >> np.int64(63)) & _MAGNITUDE)


@_jit
def _extremes(x):
    """(min, max) of ``x`` (no NaN), compared as ordered integers: numba's float min and max keep
    NaN semantics that stop the loop from vectorising (~0.5 ns an item against ~0.05)."""
    bits = x.view(np.int64)
    low = _MAGNITUDE
    high = -_MAGNITUDE - np.int64(1)
    for j in range(bits.shape[0]):
        key = _ordered(bits[j])
        low = min(low, key)
        high = max(high, key)
    if bits.shape[0] == 0:
        return np.inf, -np.inf
    out = np.empty(2, np.int64)
    out[0] = _ordered(low)
    out[1] = _ordered(high)
    values = out.view(np.float64)
    return values[0], values[1]


# |cosine distance key - fast distance| (``distance_key``): a quotient of magnitude at most ~1 rounded four
# times instead of twice, and 1 minus it rounded in both: ~10 units in the last place of 1 at most.
COSINE_KEY_ERROR = 16.0 * U64


@_jit
def distance_range(dots, qf, gf, qa, ga, qn, gn, metric, c_dot):
    """Canonical (min, max) distance over a block of GEMM dot products ``dots``: the first GOM pass
    of ``minmax`` normalisation.

    The extremes are found on keys (``distance_key``, a row at a time, in a buffer that stays in
    cache) within ``slack`` of the fast distances, then settled canonically among the pairs within
    two windows and slacks of them (``reach``: no pair's window is wider), visiting only rows that
    reach them.
    """
    nq, ng = dots.shape
    if nq == 0 or ng == 0:
        return np.inf, -np.inf
    row = np.empty(ng)
    row_low = np.empty(nq)
    row_high = np.empty(nq)
    inv_ga = 1.0 / ga
    for i in range(nq):
        _range_keys(dots, i, qa[i], ga, inv_ga, metric, metric == EUCLIDEAN, row)
        row_low[i], row_high[i] = _extremes(row)
    if metric == EUCLIDEAN:  # the root of the extreme squares: the extreme distances (the root is monotone)
        row_low, row_high = np.sqrt(row_low), np.sqrt(row_high)
    slack = key_error(metric)
    gn_max = gn.max()
    reach = 0.0
    for i in range(nq):
        reach = max(reach, distance_window(0.0, qn[i], gn_max, metric, c_dot) + slack)
    fast_low = row_low.min() + 2.0 * reach
    fast_high = row_high.max() - 2.0 * reach
    low = np.inf
    high = -np.inf
    for i in range(nq):
        if (row_low[i] > fast_low) & (row_high[i] < fast_high):
            continue
        _range_keys(dots, i, qa[i], ga, inv_ga, metric, False, row)
        for j in range(ng):
            if (row[j] <= fast_low) | (row[j] >= fast_high):
                exact = canonical_distance(qf, gf, i, j, qa[i], ga[j], metric)
                low = min(low, exact)
                high = max(high, exact)
    return low, high


@_inline
def _range_keys(dots, i, qa, ga, inv_ga, metric, squared, out):
    """out[j]: the key ``distance_range`` ranks pair (i, j) by: ``distance_key``, or with ``squared``
    the squared euclidean distance (a root per pair saved: the extremes' roots are the extremes)."""
    inv_qa = inverse(qa)
    key_metric = SQEUCLIDEAN if squared else metric
    for j in range(out.shape[0]):
        out[j] = distance_key(dots[i, j], qa, ga[j], inv_qa, inv_ga[j], key_metric)


@_inline
def distance_key(dot, qa, ga, inv_qa, inv_ga, metric):
    """A pair's fast distance, but for cosine 1 - dot (1 / ga) (1 / qa): two products where the fast
    distance divides, within ``key_error`` of it."""
    if metric == COSINE:
        return 1.0 - np.float64(dot) * inv_ga * inv_qa
    return pair_distance(dot, qa, ga, metric)


@_inline
def inverse(x):
    """1 / x, infinite at 0 (a zero row's term, or a stored distance's, which no key divides by)."""
    return 1.0 / x if x != 0.0 else np.inf


@_inline
def key_error(metric):
    """The most ``distance_key`` is from the fast distance."""
    return COSINE_KEY_ERROR if metric == COSINE else 0.0


@_inline
def row_distances(dots, i, qa, ga, metric, out):
    """out[j] = the fast distance of pair (i, j) of a block of dot products."""
    for j in range(out.shape[0]):
        out[j] = pair_distance(dots[i, j], qa, ga[j], metric)


@_jit
def rank_summaries(pos_off, neg_slots, first_rank, ap, ap_trapezoid, inp):
    """Per-query first-hit rank, AP (rectangle and trapezoid) and INP from the slot counts.

    AP = (1/n) sum_j j / r_j;  AP_trapezoid = (1/n) sum_j ((j-1)/(r_j-1) + j/r_j) / 2, the first term
    being 1 when r_j = 1;  INP = n / r_n.  Queries without positives get rank -1 and NaN.
    """
    for q in range(pos_off.shape[0] - 1):
        lo = pos_off[q]
        n = pos_off[q + 1] - lo
        if n == 0:
            first_rank[q] = -1
            ap[q] = np.nan
            ap_trapezoid[q] = np.nan
            inp[q] = np.nan
            continue
        negatives_before = 0
        rect = 0.0
        trap = 0.0
        rank = 0
        for j in range(1, n + 1):
            negatives_before += neg_slots[lo + j - 1]
            rank = j + negatives_before
            precision = j / rank
            previous = 1.0 if rank == 1 else (j - 1) / (rank - 1)
            rect += precision
            trap += 0.5 * (previous + precision)
            if j == 1:
                first_rank[q] = rank
        ap[q] = rect / n
        ap_trapezoid[q] = trap / n
        inp[q] = n / rank


@_jit
def gom_curves(pos_off, pos_d, neg_slots, neg_hist, junk, tau, norm_mode, lo, span, vp_jaccard, b_cap,
               rp, vp, rep, fr):
    """Each query's GOM curves (docs/metrics.md#53-per-query-quantities) over the grid ``tau``, one row per query.

    Per query: R_tau = returned non-junk items (negatives from ``neg_hist``, positives from their
    exact distances) plus its ``junk`` items when tau >= 1; TP_tau = returned positives, a prefix of
    the positives since they are sorted by distance.  Q+ rows get RP, VP, ReP; Q- rows FR (the
    other curves of a row are left untouched).

    RP_tau = (1/TP) sum_{j<=TP} j / r_j (0 when TP = 0);
    VP_tau = TP / (min(R_tau, r_n) - TP + n)   (reference) or TP / (R_tau - TP + n) (jaccard);
    ReP_tau = sqrt(RP_tau * VP_tau);  FR_tau = min(R_tau, B) / B.
    """
    n_tau = tau.shape[0]
    returned = np.empty(n_tau + 1, dtype=np.int64)
    for q in range(pos_off.shape[0] - 1):
        first = pos_off[q]
        n = pos_off[q + 1] - first
        returned[:] = neg_hist[q, : n_tau + 1]
        for p in range(first, first + n):
            returned[threshold_bin(normalise(pos_d[p], norm_mode, lo, span), n_tau - 1)] += 1
        for t in range(1, n_tau):
            returned[t] += returned[t - 1]
        for t in range(n_tau):
            if tau[t] >= 1.0:
                returned[t] += junk[q]
        if n == 0:
            for t in range(n_tau):
                fr[q, t] = min(returned[t], b_cap) / b_cap
            continue
        last_rank = n + neg_slots[first: first + n].sum()
        tp = 0
        negatives_before = 0
        precision_sum = 0.0
        for t in range(n_tau):
            while tp < n and threshold_bin(normalise(pos_d[first + tp], norm_mode, lo, span), n_tau - 1) <= t:
                negatives_before += neg_slots[first + tp]
                tp += 1
                precision_sum += tp / (tp + negatives_before)
            cap = returned[t] if vp_jaccard else min(returned[t], last_rank)
            rp[q, t] = precision_sum / tp if tp > 0 else 0.0
            vp[q, t] = tp / (cap - tp + n)
            rep[q, t] = math.sqrt(rp[q, t] * vp[q, t])
