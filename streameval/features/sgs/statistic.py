"""Single-gallery-shot CMC (docs/protocols.md#cuhk03-sgs; classic CUHK03).

Per query q in Q+, each identity j with kept rows I(q) contributes one drawn row; rho counts the
identities whose drawn row comes before q's drawn positive.

* **sampled** (``SgsSampled``): the draws of repeat r are seeded hashes (``draws.hash_words``, tag
  1, words r, query row, pid), so they do not depend on chunking.  ``prepare`` draws, per query
  block, the positive of each repeat (its key); the update adds 1 to counts[q, r] when a row is
  its identity's drawn row for (q, r) and comes before the drawn positive.  It draws only for the
  rows within reach of the query's furthest drawn positive, so nothing of size queries x
  identities x repeats is made.
* **expected** (``SgsExpected``, the limit of infinitely many repeats): counts[a + s, j] = kept rows
  of identity j in slot s (after s of q's positives); then c_j(p_m) = sum_{s <= m} counts[a + s, j]
  rows of j come before positive m, and given p_m is drawn, identity j's draw comes first with
  probability b_j = c_j / n_j(q), independently: CMC_q(k) = mean over positives of
  Pr[sum_j Bernoulli(b_j) <= k - 1], a Poisson-binomial CDF (``expected_cmc``).
"""

from __future__ import annotations

from collections import namedtuple

import numba as nb
import numpy as np

from ...protocols.draws import GAMMA, SGS_DRAW_TAG, hash_words, mix_words
from ...engine.statistic import Field, Statistic
from ...engine.block import (before_key, device_hits, last_positive_limits, negatives_buffers, reach,
                             screen_columns, slotted_negatives, widest, within)

_jit = nb.njit(nogil=True, cache=True)

SgsDraws = namedtuple("SgsDraws", [
    "tagged_seed",  # uint64: the hash state after the seed and tag 1
    "q_class", "q_index", "key_d", "key_g",  # per query: camera class, row; drawn positive per repeat
    "rows", "class_start", "starts", "counts",  # Identities.rows concatenated, each class's start in it
])


_mix = nb.njit(nogil=True, cache=True, inline="always")(mix_words)
_GAMMA = np.uint64(GAMMA)


@nb.njit(nogil=True, cache=True, inline="always")
def _absorb(h, word):
    """One word into the hash state: the step of ``draws.hash_words``."""
    return _mix((h ^ np.uint64(word)) + _GAMMA)


@_jit
def update_sampled(blk, g_identity, draws, counts):
    """counts[i, r] += rows that are their identity's draw for (i, r) and come before the drawn
    positive.  Only rows within reach of the query's furthest drawn positive are drawn for: a row is
    identity j's draw for (i, r) when its ordinal among j's kept rows for the query's camera class
    equals H(seed; 1, r, query row, pid) mod n_j(q)."""
    repeats = counts.shape[1]
    cols = np.empty(blk.dots.shape[1], dtype=np.int64)
    gn_max = widest(blk)
    screen = screen_columns(blk)
    for i in range(blk.dots.shape[0]):
        if blk.pos_off[i + 1] == blk.pos_off[i]:
            continue
        c = draws.q_class[i]
        found = (device_hits(blk, i, cols) if blk.hits.shape[0]
                 else within(blk, i, reach(blk, i, draws.key_d[i].max(), gn_max), screen, cols))
        for k in range(found):
            j = cols[k]  # a kept negative: one of its identity's kept rows
            lo = draws.class_start[c] + draws.starts[c, g_identity[j]]
            n = draws.counts[c, g_identity[j]]
            ordinal = np.searchsorted(draws.rows[lo:lo + n], blk.g_start + j)
            for r in range(repeats):
                h = _absorb(_absorb(_absorb(draws.tagged_seed, r), draws.q_index[i]), blk.g_pid[j])
                if h % np.uint64(n) == np.uint64(ordinal):
                    counts[i, r] += before_key(blk, i, j, draws.key_d[i, r], draws.key_g[i, r])


@_jit
def update_expected(blk, g_identity, counts, qi, gj, slot):
    """counts[a + s, j] += kept rows of identity j in slot s (before the query's last positive)."""
    for k in range(slotted_negatives(blk, last_positive_limits(blk), qi, gj, slot)):
        lo = blk.pos_off[qi[k]]
        if slot[k] < blk.pos_off[qi[k] + 1] - lo:  # a kept negative's pid is an identity
            counts[lo + slot[k], g_identity[gj[k]]] += 1


class SgsSampled(Statistic):
    name = "sgs_sampled"

    def __init__(self, repeats: int, seed: int):
        self.repeats, self.seed = repeats, seed
        self.fields = {"counts": Field("query", np.int64, (repeats,))}

    def prepare(self, meta, queries, positives):
        """Per query of the block: its camera class and row, and the drawn positive's distance and
        row per repeat (queries, R); the other identities are drawn inside the update."""
        ident = meta.identities
        n_q, n_r = len(queries.pids), self.repeats
        repeat = np.arange(n_r, dtype=np.int64)
        key_d = np.zeros((n_q, n_r))
        key_g = np.zeros((n_q, n_r), dtype=np.int64)
        for i in np.flatnonzero(positives.counts > 0):
            lo, hi = positives.offsets[i], positives.offsets[i + 1]
            by_row = lo + np.argsort(positives.gidx[lo:hi], kind="stable")  # draws index rows by gallery index
            pick = by_row[(hash_words(self.seed, SGS_DRAW_TAG, repeat, queries.index[i], queries.pids[i])
                           % np.uint64(hi - lo)).astype(np.int64)]
            key_d[i], key_g[i] = positives.dist[pick], positives.gidx[pick]
        rows = ident.rows
        return SgsDraws(hash_words(self.seed, SGS_DRAW_TAG)[()], ident.camera_class(queries.camids),
                        np.asarray(queries.index, dtype=np.int64), key_d, key_g,
                        np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64),
                        np.cumsum([0] + [r.shape[0] for r in rows]).astype(np.int64), ident.starts, ident.counts)

    def limits(self, blk):
        return last_positive_limits(blk)  # the drawn positives' reach is at most the last one's

    def update(self, blk, rows: slice, state: dict, aux, run) -> None:
        draws = aux._replace(q_class=aux.q_class[rows], q_index=aux.q_index[rows],
                             key_d=aux.key_d[rows], key_g=aux.key_g[rows])
        update_sampled(blk, run.meta.identities.identity_index(blk.g_pid), draws, state["counts"])


class SgsExpected(Statistic):
    name = "sgs_expected"

    def __init__(self, n_identities: int):
        self.fields = {"counts": Field("positive", np.int64, (n_identities,))}

    def limits(self, blk):
        return last_positive_limits(blk)

    def update(self, blk, rows: slice, state: dict, aux, run) -> None:
        update_expected(blk, run.meta.identities.identity_index(blk.g_pid), state["counts"], *negatives_buffers(blk))


@_jit
def expected_cmc(pos_off, counts, n_identity, max_rank, out):
    """out[q, k - 1] = CMC_q(k) of sgs expected for each query with positives (rows of the others
    are left as they are).  ``n_identity[q, j]``: n_j(q).

    For positive m of q, identities with c_j rows before it are drawn first with probability
    b_j = c_j / n_j; the distribution of how many are (truncated at max_rank: the last cell holds
    "max_rank or more") is built one identity at a time.
    """
    n_j = counts.shape[1]
    before = np.zeros(n_j, dtype=np.int64)
    prob = np.zeros(max_rank + 1)
    for q in range(pos_off.shape[0] - 1):
        lo = pos_off[q]
        n = pos_off[q + 1] - lo
        if n == 0:
            continue
        before[:] = 0
        out[q, :] = 0.0
        for m in range(n):
            before += counts[lo + m]
            prob[:] = 0.0
            prob[0] = 1.0
            for j in range(n_j):
                if before[j] > 0:
                    b = before[j] / n_identity[q, j]
                    for k in range(max_rank, 0, -1):
                        prob[k] = prob[k] * (1.0 - b) + prob[k - 1] * b
                    prob[0] *= 1.0 - b
            cdf = 0.0
            for k in range(max_rank):
                cdf += prob[k]
                out[q, k] += cdf / n
