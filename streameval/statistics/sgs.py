"""Single-gallery-shot CMC (PROTOCOLS.md section 1.8.3; classic CUHK03).

Per query q in Q+, each identity j with kept rows I(q) contributes one drawn row; rho counts the
identities whose drawn row comes before q's drawn positive.

* **sampled** (``SgsSampled``): the draws of repeat r are seeded hashes (``draws.hash_words``, tag
  1, words r, query row, pid), so they do not depend on chunking.  ``prepare`` draws, per query
  block, every identity's row and the positive (its key), and the update adds 1 to counts[q, r]
  when a row is its identity's drawn row for (q, r) and comes before the drawn positive.
* **expected** (``SgsExpected``, the limit of infinitely many repeats): counts[a + s, j] = kept rows
  of identity j in slot s (after s of q's positives); then c_j(p_m) = sum_{s <= m} counts[a + s, j]
  rows of j come before positive m, and given p_m is drawn, identity j's draw comes first with
  probability b_j = c_j / n_j(q), independently: CMC_q(k) = mean over positives of
  Pr[sum_j Bernoulli(b_j) <= k - 1], a Poisson-binomial CDF (``expected_cmc``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from . import Field, Statistic
from .block import before_key, kept_negative, negative_slot, reach

_jit = nb.njit(nogil=True, cache=True)


@dataclass(frozen=True)
class Identities:
    """What the draws need about the gallery, from ids only (``graph.metadata``).

    ``pids``: the identities (sorted pid values) with a row some query may keep.  Per query camera
    class c (``q_classes``: the distinct query cameras), ``rows[c]``: the extended gallery rows a
    camera-c query keeps as negatives (in the gallery, not junk, camera pair not in x_any), sorted
    by (identity, row); ``starts[c, j]``, ``counts[c, j]``: identity j's rows in it (n_j(q))."""

    pids: np.ndarray
    q_classes: np.ndarray
    rows: list
    starts: np.ndarray
    counts: np.ndarray

    def identity_index(self, pid: np.ndarray) -> np.ndarray:
        """Index of each pid in ``pids``, -1 for a pid that is not an identity."""
        if self.pids.shape[0] == 0:
            return np.full(np.shape(pid), -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.pids, pid), self.pids.shape[0] - 1)
        return np.where(self.pids[at] == pid, at, -1).astype(np.int64)

    def camera_class(self, q_cam: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.q_classes, q_cam)


def identities(g_pid, g_cam, kept_base, q_cams, excluded_any) -> Identities:
    """``kept_base``: rows in the gallery and not junk; ``excluded_any(c, g_cam)``: whether x_any
    excludes each row for a camera-c query."""
    classes = np.unique(q_cams)
    pids = np.unique(g_pid[kept_base])
    rows, starts, counts = [], [], []
    for c in classes:
        kept = np.flatnonzero(kept_base & ~excluded_any(c, g_cam))
        kept = kept[np.argsort(g_pid[kept], kind="stable")]
        count = np.bincount(np.searchsorted(pids, g_pid[kept]), minlength=pids.shape[0])
        rows.append(kept)
        counts.append(count)
        starts.append(np.cumsum(count) - count)
    shape = (classes.shape[0], pids.shape[0])
    return Identities(pids, classes, rows, np.array(starts, dtype=np.int64).reshape(shape),
                      np.array(counts, dtype=np.int64).reshape(shape))


@_jit
def update_sampled(blk, g_identity, drawn, key_d, key_g, counts):
    """counts[i, r] += rows that are their identity's draw for (i, r) and come before the drawn
    positive (key_d[i, r], key_g[i, r])."""
    repeats = counts.shape[1]
    for i in range(blk.dist.shape[0]):
        if blk.pos_off[i + 1] == blk.pos_off[i]:
            continue
        limit = reach(blk, i, key_d[i].max())  # the furthest drawn positive bounds every comparison
        for j in range(blk.dist.shape[1]):
            if blk.dist[i, j] > limit:
                continue
            if kept_negative(blk, i, j):  # a kept negative's pid is an identity
                row = blk.g_start + j
                for r in range(repeats):
                    if drawn[i, g_identity[j], r] == row:
                        counts[i, r] += before_key(blk, i, j, key_d[i, r], key_g[i, r])


@_jit
def update_expected(blk, g_identity, counts):
    """counts[a + s, j] += kept rows of identity j in slot s (before the query's last positive)."""
    for i in range(blk.dist.shape[0]):
        lo = blk.pos_off[i]
        hi = blk.pos_off[i + 1]
        if hi == lo:
            continue
        limit = reach(blk, i, blk.pos_d[hi - 1])
        for j in range(blk.dist.shape[1]):
            if blk.dist[i, j] > limit:
                continue
            slot = negative_slot(blk, i, j)
            if slot < hi - lo:  # a kept negative's pid is an identity
                counts[lo + slot, g_identity[j]] += 1


class SgsSampled(Statistic):
    name = "sgs_sampled"

    def __init__(self, repeats: int, seed: int):
        self.repeats, self.seed = repeats, seed
        self.fields = {"counts": Field("query", np.int64, (repeats,))}

    def prepare(self, meta, queries, positives):
        """Per query of the block: every identity's drawn row per repeat (queries, J, R; -1 for
        none), and the drawn positive's distance and row (queries, R)."""
        from ..draws import hash_words

        ident = meta.identities
        n_q, n_r = len(queries.pids), self.repeats
        repeat = np.arange(n_r, dtype=np.int64)
        classes = ident.camera_class(queries.camids)
        drawn = np.full((n_q, ident.pids.shape[0], n_r), -1, dtype=np.int64)
        for c in range(ident.q_classes.shape[0]):
            mine = np.flatnonzero(classes == c)
            have = np.flatnonzero(ident.counts[c] > 0)
            if mine.size == 0 or have.size == 0:
                continue
            words = (repeat[None, None, :], queries.index[mine][:, None, None], ident.pids[have][None, :, None])
            u = hash_words(self.seed, 1, *words) % ident.counts[c][have][None, :, None].astype(np.uint64)
            drawn[mine[:, None, None], have[None, :, None], repeat] = \
                ident.rows[c][ident.starts[c][have][None, :, None] + u.astype(np.int64)]
        key_d = np.zeros((n_q, n_r))
        key_g = np.zeros((n_q, n_r), dtype=np.int64)
        for i in np.flatnonzero(positives.counts > 0):
            lo, hi = positives.offsets[i], positives.offsets[i + 1]
            by_row = lo + np.argsort(positives.gidx[lo:hi], kind="stable")  # draws index rows by gallery index
            pick = by_row[(hash_words(self.seed, 1, repeat, queries.index[i], queries.pids[i])
                           % np.uint64(hi - lo)).astype(np.int64)]
            key_d[i], key_g[i] = positives.dist[pick], positives.gidx[pick]
        return drawn, key_d, key_g

    def update(self, blk, rows: slice, state: dict, aux, run) -> None:
        drawn, key_d, key_g = aux
        g_identity = run.meta.identities.identity_index(blk.g_pid)
        update_sampled(blk, g_identity, drawn[rows], key_d[rows], key_g[rows], state["counts"])


class SgsExpected(Statistic):
    name = "sgs_expected"

    def __init__(self, n_identities: int):
        self.fields = {"counts": Field("positive", np.int64, (n_identities,))}

    def update(self, blk, rows: slice, state: dict, aux, run) -> None:
        update_expected(blk, run.meta.identities.identity_index(blk.g_pid), state["counts"])


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
