"""The engine's shared pieces the statistics stand on: the screen (engine/block.py: ``within`` lists
every kept negative of a query whose fast distance is at most a limit, in the dot products' own
precision, float32 lanes for a float32 GEMM block loosened by its rounding units, 64 columns a word
of hit bits; ``compact`` turns the other screens' masks into positions), and the positives' order
(by query, distance, gallery index)."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streameval.engine import block, kernels
from streameval.engine.state import Positives
from streameval.features.closed_set.slots import update_slots

METRICS = ("cosine", "euclidean", "sqeuclidean")


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300), density=st.sampled_from([0.0, 0.02, 0.3, 0.9, 1.0]), seed=st.integers(0, 2**32 - 1))
def test_compact_lists_the_set_positions_in_order(n, density, seed):
    hit = block.mask(n)
    hit[:n] = np.random.default_rng(seed).random(n) < density
    cols = np.full(n, -1, dtype=np.int64)  # as long as the unpadded mask: nothing may be written past it
    found = block.compact(hit, cols)
    np.testing.assert_array_equal(cols[:found], np.flatnonzero(hit))


def features_block(qf: np.ndarray, gf: np.ndarray, metric: str, q_pid: np.ndarray, g_pid: np.ndarray):
    """A Block of every query against every gallery row, no junk, cameras or trials to drop."""
    code = kernels.METRIC_CODES[metric]
    qa, ga = kernels.row_terms(qf, code), kernels.row_terms(gf, code)
    qn, gn = (qa, ga) if code == kernels.COSINE else (np.sqrt(qa), np.sqrt(ga))
    nq, ng = qf.shape[0], gf.shape[0]
    empty_i, empty_f = np.zeros(1, np.int64), np.zeros(0)
    return block.Block(
        qf @ gf.T, block.NOT_SCREENED, np.zeros((0, 0)), qf, gf, qa, ga, qn, gn, code,
        kernels.dot_error_bound(qf.shape[1], qf.dtype), kernels.dot_error_bound(qf.shape[1], np.float64),
        q_pid, g_pid, np.zeros(nq, np.int64), np.zeros((1, ng), np.uint8), np.ones(nq, np.uint64),
        np.ones(ng, np.uint64), 0, np.zeros(nq + 1, np.int64), empty_f, empty_i[:0], empty_f.astype(np.uint64))


def screen_problem(rng, metric: str, dtype, scale: float, n_rows: int):
    """A Block of 9 queries against ``n_rows`` gallery rows of 16 features at ``scale``, the second
    half of the rows copies of the first (ties at a screen's edge), pids 0-3."""
    gf = (scale * rng.standard_normal((n_rows, 16))).astype(dtype)
    gf[n_rows // 2:2 * (n_rows // 2)] = gf[:n_rows // 2]
    qf = (scale * rng.standard_normal((9, 16))).astype(dtype)
    return features_block(qf, gf, metric, rng.integers(0, 4, 9), rng.integers(0, 4, n_rows))


@settings(max_examples=40, deadline=None)
@given(metric=st.sampled_from(METRICS), dtype=st.sampled_from([np.float32, np.float64]),
       scale=st.sampled_from([1e-3, 1.0, 1e3]), n_rows=st.sampled_from([2, 63, 64, 70, 128, 131]),
       seed=st.integers(0, 2**32 - 1))
def test_the_screen_lists_every_kept_negative_at_most_the_limit(metric, dtype, scale, n_rows, seed):
    """Limits at rows' own fast distances (the screen's edge: a row at its limit must be listed),
    duplicated gallery rows (ties at the edge), features at several scales, rows in whole words of
    64 and past them; rows of the query's pid are never listed; anything listed beyond the limit is
    within a hair of it; listed in ascending order."""
    rng = np.random.default_rng(seed)
    blk = screen_problem(rng, metric, dtype, scale, n_rows)
    q_pid, g_pid = blk.q_pid, blk.g_pid
    screen = block.screen_columns(blk)
    cols = np.empty(n_rows, dtype=np.int64)
    for i in range(9):
        fast = np.array([block.fast_distance(blk, i, j) for j in range(n_rows)])
        for limit in (*fast[rng.integers(0, n_rows, 4)], -np.inf, np.inf):
            listed = cols[:block.within(blk, i, limit, screen, cols)]
            negative = g_pid != q_pid[i]
            assert set(np.flatnonzero(negative & (fast <= limit))) <= set(listed)
            assert negative[listed].all() and (np.diff(listed) > 0).all()
            if np.isfinite(limit):
                assert (fast[listed] <= limit + 1e-5 * (abs(limit) + scale * scale * 16)).all()


def device_words(passed: np.ndarray) -> np.ndarray:
    """A device's screen as ``Block.hits``: 64-column words of bits, zero-padded (``sources.packed_bits``)."""
    n_rows, n_cols = passed.shape
    padded = np.zeros((n_rows, -(-n_cols // block.SCREEN_WORD) * block.SCREEN_WORD), dtype=bool)
    padded[:, :n_cols] = passed
    return np.packbits(padded, axis=1, bitorder="little").view(np.uint64)


@settings(max_examples=40, deadline=None)
@given(metric=st.sampled_from(METRICS), dtype=st.sampled_from([np.float32, np.float64]),
       scale=st.sampled_from([1e-3, 1.0, 1e3]), n_rows=st.sampled_from([2, 63, 64, 70, 128, 131]),
       fused=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_a_devices_screen_lists_every_row_the_hosts_screen_lists(metric, dtype, scale, n_rows, fused, seed):
    """``screen_terms`` evaluated as a device may (in the dot products' precision, rounding after
    the product and the sum, or once, as a fused multiply-add) at limits on rows' own fast
    distances: ``device_hits`` lists every row ``within`` lists, so every kept negative at most the
    limit, never one of the query's pid, in ascending order."""
    rng = np.random.default_rng(seed)
    blk = screen_problem(rng, metric, dtype, scale, n_rows)
    q_pid, g_pid = blk.q_pid, blk.g_pid
    fast = np.array([[block.fast_distance(blk, i, j) for j in range(n_rows)] for i in range(9)])
    limits = fast[np.arange(9), rng.integers(0, n_rows, 9)]
    limits[0] = -np.inf  # a query without positives
    kind, columns, low, slope, sign = block.screen_terms(blk, limits)
    if fused:  # the product exact in float64, one rounding of the sum (float32 features)
        threshold = (low.astype(np.float64)[:, None] + slope.astype(np.float64)[:, None] * columns[kind]).astype(dtype)
    else:
        threshold = low[:, None] + slope[:, None] * columns[kind]
    screened = blk._replace(hits=device_words(sign * blk.dots >= threshold))
    screen = block.screen_columns(blk)
    cols, device_cols = np.empty(n_rows, dtype=np.int64), np.empty(n_rows, dtype=np.int64)
    for i in range(9):
        listed = cols[:block.within(blk, i, limits[i], screen, cols)]
        from_device = device_cols[:block.device_hits(screened, i, device_cols)]
        assert set(listed) <= set(from_device)
        assert (g_pid[from_device] != q_pid[i]).all() and (np.diff(from_device) > 0).all()


@settings(max_examples=60, deadline=None)
@given(n_queries=st.integers(1, 30), n_pairs=st.integers(0, 600), levels=st.sampled_from([1, 3, 1000]),
       n_parts=st.integers(1, 5), in_gallery_order=st.booleans(), seed=st.integers(0, 2**32 - 1))
@example(n_queries=1, n_pairs=400, levels=3, n_parts=1, in_gallery_order=False, seed=1)  # one query's 400: radix
@example(n_queries=1, n_pairs=400, levels=1000, n_parts=2, in_gallery_order=True, seed=3)  # the same, in order
@example(n_queries=30, n_pairs=400, levels=3, n_parts=3, in_gallery_order=False, seed=2)  # ~13 a query: insertion
def test_positives_are_sorted_by_query_then_distance_then_gallery_index(n_queries, n_pairs, levels, n_parts,
                                                                          in_gallery_order, seed):
    """As a lexsort of the three keys orders them, however the pairs come in parts (a gallery
    chunk's each, some empty), in gallery order (as the positives pass gives them) or not; few
    distance levels make ties the index breaks, negative distances and -0.0 (a negated inner
    product) included (a query's pairs sorted by insertion up to ``kernels.INSERTION_SORT_MAX``,
    by a radix sort above)."""
    rng = np.random.default_rng(seed)
    qrows = rng.integers(0, n_queries, n_pairs)
    gidx = rng.permutation(3 * n_pairs)[:n_pairs].astype(np.int64)
    if in_gallery_order:
        gidx.sort()
    dist = (rng.integers(0, levels, n_pairs) - levels // 2) / 7.0
    dist[rng.random(n_pairs) < 0.1] = -0.0
    bits = rng.integers(1, 4, n_pairs).astype(np.uint64)
    cuts = np.sort(rng.integers(0, n_pairs + 1, n_parts - 1))
    parts = [(qrows[a:b], gidx[a:b], dist[a:b], bits[a:b]) for a, b in zip([0, *cuts], [*cuts, n_pairs])]
    got = Positives.from_parts(n_queries, parts, np.zeros((n_queries, 1), np.int64))
    order = np.lexsort((gidx, dist, qrows))  # -0.0 == 0.0: ties the index breaks
    np.testing.assert_array_equal(got.gidx, gidx[order])
    np.testing.assert_array_equal(got.dist, dist[order])
    np.testing.assert_array_equal(got.bits, bits[order])
    np.testing.assert_array_equal(got.counts, np.bincount(qrows, minlength=n_queries))


@settings(max_examples=60, deadline=None)
@given(metric=st.sampled_from(METRICS), n_rows=st.sampled_from([5, 64, 131, 700]), n_trials=st.integers(1, 3),
       levels=st.sampled_from([2, 5, 1000]), n_ids=st.sampled_from([2, 4, 40]), screened=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_slots_count_each_kept_negative_in_its_slot_and_trials(metric, n_rows, n_trials, levels, n_ids, screened,
                                                              seed):
    """``update_slots`` (the negatives within reach listed with their slots, then counted) against
    the brute force on canonical distances: counts[a + s, t] = trial-t negatives of the query with s
    of its positives before them (by distance, then gallery index), those after its last positive
    left out.  Few feature levels make ties (several positives in a bucket of the slot table); a
    float32 GEMM's window leaves some pairs open.  Few identities give many positives a query and
    few negatives (a search among the positives), many the reverse (a table of them); ``screened``:
    the rows listed from a device's screen (``device_hits``) at the positives' reach."""
    rng = np.random.default_rng(seed)
    nq, dim = 12, 8
    qf = rng.integers(-levels, levels + 1, (nq, dim)).astype(np.float32) / levels
    gf = rng.integers(-levels, levels + 1, (n_rows, dim)).astype(np.float32) / levels
    q_pid, g_pid = rng.integers(0, n_ids, nq), rng.integers(0, n_ids, n_rows)
    q_bits = rng.integers(1, 2**n_trials, nq).astype(np.uint64)
    g_bits = rng.integers(0, 2**n_trials, n_rows).astype(np.uint64)
    blk = features_block(qf, gf, metric, q_pid, g_pid)
    exact = np.array([[kernels.canonical_distance(qf, gf, i, j, blk.qa[i], blk.ga[j], blk.metric) for j in range(n_rows)]
                      for i in range(nq)])
    qrows, grows = np.nonzero(q_pid[:, None] == g_pid[None, :])
    positives = Positives.from_pairs(nq, qrows, grows, exact[qrows, grows], q_bits[qrows] & g_bits[grows],
                                     np.zeros((nq, 1), np.int64))
    offsets, pos_g = positives.offsets, positives.gidx
    blk = blk._replace(q_bits=q_bits, g_bits=g_bits, pos_off=offsets, pos_d=positives.dist, pos_g=pos_g,
                       pos_bits=positives.bits)
    if screened:
        kind, columns, low, slope, sign = block.screen_terms(blk, block.last_positive_limits(blk))
        blk = blk._replace(hits=device_words(sign * blk.dots >= low[:, None] + slope[:, None] * columns[kind]))
    counts = np.zeros((len(pos_g), n_trials), dtype=np.int64)
    update_slots(blk, counts, *block.negatives_buffers(blk))
    expected = np.zeros_like(counts)
    for i in range(nq):
        lo, hi = offsets[i], offsets[i + 1]
        pos = pos_g[lo:hi]
        for j in np.flatnonzero(g_pid != q_pid[i]):
            before = int(((exact[i, pos] < exact[i, j]) | ((exact[i, pos] == exact[i, j]) & (pos < j))).sum())
            for t in range(n_trials):
                if before < hi - lo and (int(g_bits[j] & q_bits[i]) >> t) & 1:
                    expected[lo + before, t] += 1
    np.testing.assert_array_equal(counts, expected)
