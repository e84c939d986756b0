"""Verification's bands (docs/verification.md#definitions): the exact (k+1)-th smallest negative distance in the
scoring pass itself when a tail of the k+1 smallest would not fit its budget (``tail_budget``).

* A **pilot** scores every query against a sample of the gallery: ``RANGES`` runs of consecutive
  rows spread over it, each with a tail of its smallest negatives (``statistics.verify``), whose
  fast distances give, for any t below the tail's reach, the run's exact count of negatives below t.
* **Placing.** Per trial and FAR target x, the share F(t) of negatives below t is estimated with
  its standard error from the spread between the runs (a ratio estimator: the runs are clusters of
  pairs), and a band [low, high) placed with F(low) + z SE < x < F(high) - z SE (``band_edges``).
* **The scoring pass** counts, per band, the negatives certainly below it and collects its members
  with their canonical distances (``statistics.verify._band_pair``): the (k+1)-th smallest is exact
  whenever it falls in the band (``verification._banded``).  A band the pilot misplaced, or one
  that outgrew its capacity, costs time, not exactness: its target takes the two-pass route.

Only where no state is saved: a saved state's verification arrays are the two-pass route's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

Z = 5.0  # standard errors between a band's edge and the estimate of its target
SPREAD = 3.0  # assumed spread, between gallery rows, of a row's share of negatives below a target x, over x
RANGES = 16  # runs of consecutive gallery rows the pilot scores (each one a pass of its own: few)
MIN_ROWS = 2048  # gallery rows the pilot scores at least
ONE_PASS_SHARE = 0.15  # the most of the gallery a pilot scores so that every band can collect in one pass
COUNT_SHARE = 0.01  # else: enough to place ranges whose counts single out a band for a refinement pass
REACH = 3.0  # the pilot's tails hold REACH x the largest target's share of each run's negatives
PILOT_BYTES = 24  # what the pilot holds per pair in its tails: 8 sorted, up to 16 in the tails being filled
COLLECT_SHARE = 1.0  # of the tail budget, what collecting bands may take (the rest count)
GRID = 1 << 16  # candidate edges, spread evenly over the pilot's pooled distances


@dataclass(frozen=True)
class Bands:
    """Per job (a trial and a FAR target as written, sorted by trial): the band [low, high) and
    the most members the scoring pass keeps (0: it counts).  ``first``: with minmax GOM
    normalisation, whose first pass reads every pair anyway, the counting jobs ride it (a Bands of
    their own) and the jobs of the same keys here collect what their counts single out
    (``singled_out``: their edges come from the first pass, these are the pilot's)."""

    keys: tuple
    lows: tuple
    highs: tuple
    capacities: tuple
    first: "Bands | None" = None


def eligible(settings) -> bool:
    """Whether verification takes the two-pass route with the scoring pass the bands need: fast
    distances (float32 GEMMs, not a distance store), no AUC, no tail."""
    spec = settings.verification
    return (spec is not None and not spec.core and not spec.auc and spec.bands is None
            and settings.precision == "float32" and settings.metric not in ("distance", "similarity"))


def place(store, settings, runner, meta):
    """``settings`` with bands placed by a pilot run on ``runner``, when ``eligible`` and the bands
    fit the tail budget; else ``settings`` as given."""
    from . import graph
    from .statistics.verify import ENTRY_BYTES

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
    samples = runner.compute(_pilot(store, settings, runner.plan, meta, ranges, core))
    scale = rows / sum(b - a for a, b in ranges)
    jobs = []  # (capacity, trial, x, low, high, lowest sampled)
    for t in range(settings.n_trials):
        sorted_d, negatives, limits = zip(*[sample[t] for sample in samples])
        for x, rate in zip(far, rates):
            edges = band_edges(sorted_d, negatives, limits, rate)
            if edges is not None and edges[0] < edges[1]:
                jobs.append((math.ceil(edges[2] * sum(negatives) * scale) + 64, t, x, *edges[:2], edges[3]))
    if not jobs:
        return settings
    room = COLLECT_SHARE * spec.tail_budget // ENTRY_BYTES
    placed = []
    for capacity, t, x, low, high, lowest in sorted(jobs):  # the smallest bands collect while they fit the budget,
        room -= capacity  # the others count (and a refinement pass collects the few members their counts single out)
        placed.append((t, x, low, high, capacity) if room >= 0 else (t, x, max(low, lowest), high, 0))
    placed.sort(key=lambda job: job[0])
    bands = Bands(*zip(*[((t, x), low, high, capacity) for t, x, low, high, capacity in placed]))
    if settings.minmax and not all(bands.capacities):
        bands = _riding_the_first_pass(bands, spec.tail_budget // ENTRY_BYTES - sum(bands.capacities))
    return replace(settings, verification=replace(spec, bands=bands))


def _riding_the_first_pass(bands: Bands, room: int) -> Bands:
    """``bands`` with its counting jobs moved to the first pass, and collecting the bands their
    counts single out in the scoring pass, each with the budget's ``room`` for a buffer (only what
    they hold takes memory; their capacities, set from the counts, share it: ``Verify.after_first``)."""
    counting = [job for job, capacity in enumerate(bands.capacities) if not capacity]
    first = Bands(*(tuple(column[job] for job in counting) for column in (bands.keys, bands.lows, bands.highs,
                                                                          bands.capacities)))
    return replace(bands, capacities=tuple(capacity or max(room, 1) for capacity in bands.capacities), first=first)


def singled_out(bands: Bands, arrays: dict, ks: dict) -> dict:
    """Per counting job of ``bands`` whose counts (``arrays``: its state) bracket its target (``ks``:
    key -> k): key -> (low, high, capacity) of the band that collects the (k+1)-th smallest.  The
    fast distances below a fine edge e number at most k and those below a fine edge e' at least
    k + 1, so the canonical ones below e - w at most k and below e' + w at least k + 1 (w: the widest
    window met); the band [e - w, e' + w) is widened by a fine bin for the bins' rounding.  Its
    capacity: the fast counts over it, with room."""
    from .statistics.verify import FINE_BINS, band_jobs

    lows, _, _, scales, _ = band_jobs(bands, 1 + max(t for t, _ in bands.keys))
    out = {}
    for job, key in enumerate(bands.keys):
        k = ks.get(key)
        if bands.capacities[job] or k is None:
            continue
        cum = int(arrays["verify/below"][job]) + np.concatenate([[0], np.cumsum(arrays["verify/fine"][job])])
        if cum[0] > k or cum[-1] < k + 1:  # the pilot misplaced the range
            continue
        margin = 2 * float(arrays["verify/window"][job]) + 1 / scales[job]
        low = lows[job] + (int(np.searchsorted(cum, k, side="right")) - 1) / scales[job] - margin
        high = lows[job] + int(np.searchsorted(cum, k + 1, side="left")) / scales[job] + margin
        first, last = (int(np.clip(math.floor((x - lows[job]) * scales[job]) + shift, 0, FINE_BINS))
                       for x, shift in ((low, 0), (high, 1)))
        out[key] = (low, high, math.ceil(1.25 * (cum[last] - cum[first])) + 1024)
    return out


def sample_rows(rows: int, n_pairs: int, rates: list, budget: int) -> int:
    """Gallery rows for the pilot (every query scored against them).  The estimate's standard
    error at target x is about SPREAD x sqrt(1/s - 1/rows) with s rows sampled (the rows' shares
    differ far more than independent pairs would: the queries are all there); its bands, 2 Z SE of
    the ``n_pairs`` pairs each, should fill half the budget.  When that takes more than
    ONE_PASS_SHARE of the gallery, COUNT_SHARE: the wider ranges then count (``Bands``).  At least
    MIN_ROWS; but never more than the pilot's tails can hold in the budget (PILOT_BYTES for each
    pair below their reach): its memory does not grow with the gallery."""
    from .statistics.verify import ENTRY_BYTES

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
    share ``rate``, or None when the pilot cannot place it.  Run c holds ``negatives[c]`` negatives; ``sorted_d[c]``: its sorted
    fast distances, every one below ``limits[c]`` among them."""
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


def _pilot(store, settings, plan, meta, ranges: list, core: int):
    """Delayed: per range, per trial (its negatives' sorted fast distances below the range tail's
    reach, the range's negatives, that reach)."""
    from dask import delayed

    from . import graph
    from .statistics.verify import Verify
    from .verification import statistic_blocks

    stat = Verify(settings.n_trials, settings.verification.hist_bits, core, False, False)
    scoring, parts, run, blocks = statistic_blocks(store, settings, meta, plan, stat, "pilot")
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
    from .statistics import StatState
    from .statistics.verify import COUNT, OVERFLOW

    arrays = StatState.concat(list(states)).arrays
    out = []
    for tail, hist in zip(arrays["verify/tail"], arrays["verify/hist"]):
        d = np.sort(tail[1:int(tail[0, COUNT]) + 1, 0])
        reach = -math.inf if tail[0, OVERFLOW] else d[core - 1] if d.size >= core else math.inf
        out.append((d[d <= reach] if reach < math.inf else d, int(hist.sum()), reach))
    return out
