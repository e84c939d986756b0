"""Placing verification's windows (``statistic.Windows``) before the scoring pass, from a pilot:
the exact (k+1)-th smallest negative distance in the scoring pass itself when a tail of the k+1
smallest would not fit its budget (``tail_budget``).

* A **pilot** scores every query against a sample of the gallery: ``RANGES`` runs of consecutive
  rows spread over it, each with a tail of its smallest negatives (``kernels``), whose
  fast distances give, for any t below the tail's reach, the run's exact count of negatives below t.
* **Placing.** Per trial and FAR target x, the share F(t) of negatives below t is estimated with
  its standard error from the spread between the runs (a ratio estimator: the runs are clusters of
  pairs), and a window [low, high) placed with F(low) + z SE < x < F(high) - z SE (``band_edges``).
* **The scoring pass** counts, per window, the negatives below it and its members (``statistic``):
  the (k+1)-th smallest is exact whenever it falls in the window.  A window the pilot misplaced,
  or one that outgrew its capacity, costs a pass, not exactness (``select``).

Only where no state is saved: a saved state keeps the histogram and tails only.
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

import numpy as np

from .kernels import COUNT, ENTRY_BYTES, OVERFLOW, keys_of
from .statistic import Verify, Windows

Z = 5.0  # standard errors between a band's edge and the estimate of its target
SPREAD = 3.0  # assumed spread, between gallery rows, of a row's share of negatives below a target x, over x
RANGES = 16  # runs of consecutive gallery rows the pilot scores (each one a pass of its own: few)
MIN_ROWS = 2048  # gallery rows the pilot scores at least
ONE_PASS_SHARE = 0.15  # the most of the gallery a pilot scores so that every window can collect in one pass
COUNT_SHARE = 0.01  # else: enough to place windows whose counts place one for one more pass
REACH = 3.0  # the pilot's tails hold REACH x the largest target's share of each run's negatives
PILOT_BYTES = 24  # what the pilot holds per pair in its tails: 8 sorted, up to 16 in the tails being filled
GRID = 1 << 16  # candidate edges, spread evenly over the pilot's pooled distances


def eligible(settings) -> bool:
    """Whether the pilot places windows: verification without a tail, with the scoring pass they need: fast
    distances (float32 GEMMs, not a distance store), no AUC, no tail."""
    spec = settings.verification
    return (spec is not None and not spec.core and not spec.auc and spec.windows is None
            and settings.precision == "float32" and settings.metric not in ("distance", "similarity"))


def place(store, settings, runner, meta):
    """``settings`` with windows placed by a pilot run on ``runner``, when ``eligible``; else
    ``settings`` as given.  The narrowest windows collect while they fit the tail budget; the others
    count (capacity 0, from the lowest distance sampled on): their fine counts place a window for one
    more pass."""
    from ...engine import graph

    spec = settings.verification
    if not eligible(settings):
        return settings
    far = [x for x in spec.far if Fraction(x) < 1]
    if not far:
        return settings
    n_queries = len(store.query)
    rows = graph.extended_rows(graph.gallery_parts(store.query, store.gallery,
                                                   settings.protocol.gallery_includes_queries))
    rates = [float(Fraction(x)) for x in far]
    ranges = sample_ranges(rows, sample_rows(rows, n_queries * rows, rates, spec.tail_budget))
    if not ranges:
        return settings
    longest = max(b - a for a, b in ranges)
    core = min(n_queries * longest, math.ceil(REACH * max(rates) * n_queries * longest) + 64)
    samples = runner.compute(_pilot(store, settings, runner, meta, ranges, core))
    scale = rows / sum(b - a for a, b in ranges)
    jobs = []  # (capacity, trial, low, high, lowest sampled)
    for t in range(settings.n_trials):
        sorted_d, negatives, limits = zip(*[sample[t] for sample in samples])
        for rate in rates:
            edges = band_edges(sorted_d, negatives, limits, rate)
            if edges is not None and edges[0] < edges[1]:
                jobs.append((math.ceil(edges[2] * sum(negatives) * scale) + 64, t, *edges[:2], edges[3]))
    room, placed = spec.tail_budget // ENTRY_BYTES, []
    for capacity, t, low, high, lowest in sorted(jobs):
        room -= capacity
        placed.append((t, low, high, capacity) if room >= 0 else (t, max(low, lowest), high, 0))
    windows = Windows.of((t, *(int(k) for k in keys_of([low, high])), capacity) for t, low, high, capacity in placed)
    return replace(settings, verification=replace(spec, windows=windows)) if windows else settings


def sample_rows(rows: int, n_pairs: int, rates: list, budget: int) -> int:
    """Gallery rows for the pilot (every query scored against them).  The estimate's standard
    error at target x is about SPREAD x sqrt(1/s - 1/rows) with s rows sampled (the rows' shares
    differ far more than independent pairs would: the queries are all there); its bands, 2 Z SE of
    the ``n_pairs`` pairs each, should fill half the budget.  When that takes more than
    ONE_PASS_SHARE of the gallery, COUNT_SHARE: the wider windows then count (``place``).  At least
    MIN_ROWS; but never more than the pilot's tails can hold in the budget (PILOT_BYTES for each
    pair below their reach): its memory does not grow with the gallery."""
    x = budget / ENTRY_BYTES / 2 / (2 * Z * n_pairs * SPREAD * sum(rates))
    one_pass = 1 / (x * x + 1 / rows)
    share = one_pass if one_pass <= ONE_PASS_SHARE * rows else COUNT_SHARE * rows
    held = budget / (PILOT_BYTES * REACH * max(rates) * (n_pairs / rows))
    return int(min(rows, max(share, MIN_ROWS), held))


def sample_ranges(rows: int, sample_rows: int) -> list:
    """Up to RANGES disjoint runs of consecutive extended gallery rows, ``sample_rows`` in all,
    centred on evenly spaced points."""
    n = min(RANGES, sample_rows, rows)
    if n < 2:
        return []
    length = sample_rows // n
    starts = [min(rows - length, max(0, (2 * c + 1) * rows // (2 * n) - length // 2)) for c in range(n)]
    return [(a, a + length) for a in starts]


def band_edges(sorted_d: tuple, negatives: tuple, limits: tuple, rate: float, z: float = Z):
    """(low, high, F(high) - F(low) + 2 SE, the lowest distance sampled) of the band for target
    share ``rate``, or None when the pilot cannot place it.  Run c holds ``negatives[c]`` negatives;
    ``sorted_d[c]``: its sorted fast distances, every one below ``limits[c]`` among them."""
    runs = len(sorted_d)
    total = sum(negatives)
    limit = min(limits)
    pooled = np.sort(np.concatenate(sorted_d))
    pooled = pooled[pooled <= limit]
    if runs < 2 or not total or not pooled.size:
        return None
    grid = np.unique(pooled[np.linspace(0, pooled.size - 1, min(GRID, pooled.size)).astype(np.int64)])
    counts = np.stack([np.searchsorted(d, grid, side="left") for d in sorted_d]).astype(np.float64)
    share = counts.sum(axis=0) / total
    spread = (counts - share * np.asarray(negatives, np.float64)[:, None]) ** 2
    se = np.sqrt(np.maximum(runs / (runs - 1) * spread.sum(axis=0) / total**2,
                            (share * (1 - share) + 1 / total) / total))
    above = np.flatnonzero(share - z * se > rate)
    if not above.size:
        return None
    high = above[0]
    fits = share + z * se < rate
    first_miss = int(np.argmin(fits)) if not fits.all() else fits.size
    low = first_miss - 1
    low_value, low_share, low_se = (grid[low], share[low], se[low]) if low >= 0 else (-math.inf, 0.0, 0.0)
    return (float(low_value), float(grid[high]), float(share[high] - low_share + 2 * max(se[high], low_se)),
            float(grid[0]))


def statistic_blocks(store, settings, meta, runner, stat, pass_name: str) -> tuple:
    """What a pass of the statistic ``stat`` alone needs (the pilot, the selection's further
    passes): its Scoring, the gallery parts, its PassContext, and per query block (row selection,
    delayed Rows)."""
    from ...engine import graph
    from ...engine.ranges import normalisations

    scoring = replace(settings.scoring(store.dim, meta, runner.device), statistics=(stat,))
    parts = graph.gallery_parts(store.query, store.gallery, settings.protocol.gallery_includes_queries)
    run = graph.PassContext(normalisations(None, None, settings.n_trials), meta)
    blocks = [(rows, graph.load_queries(store.query, rows, scoring, meta, pass_name))
              for rows in graph.query_blocks(runner.plan, None, len(store.query))]
    return scoring, parts, run, blocks


def _pilot(store, settings, runner, meta, ranges: list, core: int):
    """Delayed: per range, per trial (its negatives' sorted fast distances below the range tail's
    reach, the range's negatives, that reach)."""
    from dask import delayed

    from ...engine import graph

    stat = Verify(settings.n_trials, settings.verification.hist_bits, core, False, False)
    scoring, parts, run, blocks = statistic_blocks(store, settings, meta, runner, stat, "pilot")
    plan = runner.plan
    out = []
    for start, stop in ranges:  # (the query blocks are read once: every range shares them)
        states = [graph.scoring_pass(parts, plan, scoring, graph.block_size(rows), queries,
                                     graph.collect_positives(graph.block_size(rows), settings.n_trials), run, meta,
                                     start, stop, "pilot") for rows, queries in blocks]
        out.append(delayed(_range_sample)(core, *states))
    return delayed(list)(out)


def _range_sample(core: int, *states) -> list:
    """Per trial (sorted fast distances, negatives, reach) of one range's states: its tail holds
    every negative below the core-th smallest fast distance among its entries, or all of them if
    it holds fewer than ``core`` (an overflowed tail: none, reach -inf)."""
    from ...engine.statistic import StatState

    arrays = StatState.concat(list(states)).arrays
    out = []
    for tail, hist in zip(arrays["verify/tail"], arrays["verify/hist"]):
        d = np.sort(tail[1:int(tail[0, COUNT]) + 1, 0])
        reach = -math.inf if tail[0, OVERFLOW] else d[core - 1] if d.size >= core else math.inf
        out.append((d[d <= reach] if reach < math.inf else d, int(hist.sum()), reach))
    return out
