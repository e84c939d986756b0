"""What every statistic's chunk update reads: one block of distances and the rows' metadata.

The scoring pass computes, per query sub-block and gallery chunk, the fast (GEMM) distances once
(``fill_distances``) and hands every requested statistic the same :data:`Block`.  A Block is a
namedtuple, so numba compiles it as one typed argument.

Who counts as what (PROTOCOLS.md section 1.2) is decided here, once, for every statistic:

* ``kept_negative``: gallery row j is a kept negative of query i in some trial: another pid, not a
  junk pid, the camera pair not in ``x_any`` (one lookup in ``any_table``), and a trial holding
  both (``g_bits & q_bits``, bit t = trial t).  Same-pid rows are never negatives: they are
  positives or excluded (x_same, own copy), which the positives pass decides.
* ``slotted_negatives``: the kept negatives within a statistic's reach with their slot, how many
  of query i's positives (sorted by (distance, gallery index)) come before row j, decided on the
  fast distance when its error window cannot change the answer and on the canonical distance
  otherwise (``kernels`` module docstring): exact in any chunking.

Positives are the superset's (every trial's); ``pos_bits`` says which trials each belongs to.
"""

from __future__ import annotations

from collections import namedtuple

import numba as nb
import numpy as np

from .. import kernels

_jit = nb.njit(nogil=True, cache=True)
_inline = nb.njit(nogil=True, cache=True, inline="always")

Block = namedtuple("Block", [
    "dist",  # (rows, gallery rows) float64 fast distances
    "qf", "gf",  # features in the working precision (for canonical distances)
    "qa", "ga", "qn", "gn",  # float64 row terms and norms
    "metric", "c_dot",  # metric code, GEMM dot error bound
    "q_pid", "g_pid", "g_junk",  # int64, int64, uint8 (pid in the junk set)
    "q_cix", "g_cix", "any_table",  # camera indices into the uint8 x_any table (1 = excluded)
    "q_bits", "g_bits",  # uint64 trial membership
    "g_start",  # global (extended) gallery index of column 0
    "pos_off", "pos_d", "pos_g", "pos_bits",  # the rows' positives: CSR offsets into the other three
])


@_jit
def fill_distances(dots, qa, ga, metric, out):
    """out[i, j] = the fast distance of pair (i, j) from its GEMM dot product."""
    for i in range(dots.shape[0]):
        qai = qa[i]
        for j in range(dots.shape[1]):
            out[i, j] = kernels.pair_distance(dots[i, j], qai, ga[j], metric)


@_inline
def kept_negative(blk, i, j):
    """Whether row j is a kept negative of query i in at least one trial (branch-free)."""
    return ((blk.g_pid[j] != blk.q_pid[i]) & (blk.g_junk[j] == 0)
            & (blk.any_table[blk.q_cix[i], blk.g_cix[j]] == 0) & ((blk.g_bits[j] & blk.q_bits[i]) != 0))


@_inline
def reach(blk, i, d):
    """A fast distance beyond which no row of the chunk can come before an item at distance ``d``
    for query i (``kernels.reach_distance``, with the chunk's widest row)."""
    gn_max = blk.gn.max() if blk.gn.shape[0] else 0.0
    return kernels.reach_distance(d, blk.qn[i], gn_max, blk.metric, blk.c_dot)


@_inline
def _slot_bounds(blk, i, j, lo, hi):
    """Query i's positives (pos[lo:hi]) certainly before row j, and possibly before it: the counts
    at the two ends of its fast distance's error window (equal: that is its slot)."""
    d = blk.dist[i, j]
    g = blk.g_start + j
    w = kernels.distance_window(d, blk.qn[i], blk.gn[j], blk.metric, blk.c_dot)
    return (kernels.positives_before(blk.pos_d, blk.pos_g, lo, hi, d - w, g),
            kernels.positives_before(blk.pos_d, blk.pos_g, lo, hi, d + w, g))


@_jit
def slotted_negatives(blk, limits):
    """Every kept negative of the block within its query's limit (fast distance at most
    ``limits[i]``, the statistic's reach), with its slot (query i's positives ordered before it,
    exact): arrays (query, column, slot).

    A slot is decided on the fast distance when its error window cannot change it; the canonical
    distances the others need are computed last, gallery row by gallery row, so each row's features
    come from memory once for all its queries, not once per query between scans of the distance
    block (corrupted features, whose last positives rank ~2,000 rows deep, need ~20,000 a block:
    ~4 us each when read in scan order)."""
    n = 0
    for i in range(blk.dist.shape[0]):  # counted first: arrays grown in the loop cost more than this scan
        for j in range(blk.dist.shape[1]):
            n += (blk.dist[i, j] <= limits[i]) and kept_negative(blk, i, j)
    qi = np.empty(n, dtype=np.int64)
    gj = np.empty(n, dtype=np.int64)
    slot = np.empty(n, dtype=np.int64)
    n = 0
    for i in range(blk.dist.shape[0]):
        limit = limits[i]
        if limit == -np.inf:
            continue
        lo = blk.pos_off[i]
        hi = blk.pos_off[i + 1]
        for j in range(blk.dist.shape[1]):
            if blk.dist[i, j] > limit or not kept_negative(blk, i, j):
                continue
            first, last = _slot_bounds(blk, i, j, lo, hi)
            qi[n] = i
            gj[n] = j
            slot[n] = first if first == last else -1
            n += 1
    pending = np.flatnonzero(slot < 0)
    pending = pending[np.argsort(gj[pending], kind="mergesort")]
    exact = kernels.pair_distances(blk.qf, blk.gf, qi[pending], gj[pending], blk.qa, blk.ga, blk.metric)
    for k in range(pending.shape[0]):
        i = qi[pending[k]]
        slot[pending[k]] = kernels.positives_before(blk.pos_d, blk.pos_g, blk.pos_off[i], blk.pos_off[i + 1],
                                                    exact[k], blk.g_start + gj[pending[k]])
    return qi, gj, slot


@_inline
def before_key(blk, i, j, d_ref, g_ref):
    """Whether row j comes before the item (d_ref, g_ref) for query i (exact)."""
    d = blk.dist[i, j]
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
