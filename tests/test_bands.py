"""Placing verification's windows from a pilot (``features.verification.placement``): the sample's
runs, and the band edges a ratio estimator with its between-run standard error gives; and a
window's members kept as a list of pieces along a chain.  (That the windows' selections are exact,
and that a misplaced window only costs passes, is checked against the pairs reference in
test_verification.)"""

from __future__ import annotations

import math

import numpy as np
import pytest

from streameval.features.verification import placement as bands


def runs(rng, n_runs: int, per_run: int, spread: float = 0.0):
    """Runs of negatives: normal distances, each run shifted by its own offset (rows differ)."""
    offsets = rng.normal(0, spread, n_runs)
    return [np.sort(rng.normal(10 + offset, 1, per_run)) for offset in offsets]


@pytest.mark.parametrize("spread", [0.0, 0.3])
def test_band_holds_the_target_quantile_of_the_population(spread):
    """The runs sample a population whose x-quantile is known: the band [low, high) straddles it,
    and its share is the sample's share between the edges plus twice the larger error."""
    rng = np.random.default_rng(0)
    population = runs(rng, 2000, 500, spread)
    everything = np.sort(np.concatenate(population))
    picked = rng.choice(len(population), 32, replace=False)
    sample = tuple(population[c] for c in picked)
    for rate in (1e-3, 1e-2, 0.1):
        low, high, share, lowest = bands.band_edges(sample, tuple(d.size for d in sample), (math.inf,) * 32, rate)
        target = everything[math.floor(rate * everything.size)]
        assert low < target < high, rate
        pooled = np.concatenate(sample)
        between = ((pooled >= low) & (pooled < high)).mean() if math.isfinite(low) else (pooled < high).mean()
        assert share > between
        assert lowest == pooled.min()


def test_a_wider_spread_between_runs_widens_the_band():
    rng = np.random.default_rng(1)
    widths = []
    for spread in (0.0, 0.5):
        sample = tuple(runs(rng, 32, 2000, spread))
        low, high, *_ = bands.band_edges(sample, tuple(d.size for d in sample), (math.inf,) * 32, 0.01)
        widths.append(high - low)
    assert widths[1] > 2 * widths[0]


def test_no_band_beyond_the_pilot_tails_reach():
    """A run's tail holds its negatives below its reach only: a band whose high edge would lie
    beyond the smallest reach cannot be placed."""
    rng = np.random.default_rng(2)
    sample = tuple(runs(rng, 32, 2000))
    reach = tuple(float(d[20]) for d in sample)  # ~1% of each run
    kept = tuple(d[d <= r] for d, r in zip(sample, reach))
    negatives = tuple(d.size for d in sample)
    assert bands.band_edges(kept, negatives, reach, 0.1) is None
    assert bands.band_edges(kept, negatives, reach, 0.001) is not None


def test_the_pilot_samples_disjoint_runs_spread_over_the_gallery():
    for rows, sample in ((2_000_000, 20_000), (50_000, 2048), (40, 40), (1000, 5000)):
        ranges = bands.sample_ranges(rows, min(sample, rows))
        assert 2 <= len(ranges) <= bands.RANGES
        assert all(0 <= a < b <= rows for a, b in ranges)
        assert all(b <= c for (_, b), (c, _) in zip(ranges, ranges[1:]))
        assert sum(b - a for a, b in ranges) <= min(sample, rows)
        assert ranges[0][0] < rows / len(ranges) and ranges[-1][1] > rows - rows / len(ranges)


def test_the_pilot_size():
    """At least MIN_ROWS (or the gallery); the one-pass size when it is a small share of the
    gallery, else COUNT_SHARE of it; and never more than its tails hold in the budget, however long
    the gallery."""
    budget, rates = 64 << 20, [1e-4, 1e-3, 1e-2]
    assert bands.sample_rows(40, 40 * 30, rates, budget) == 40
    small = bands.sample_rows(400_000, 100 * 400_000, rates, budget)
    assert bands.MIN_ROWS <= small <= bands.ONE_PASS_SHARE * 400_000
    assert bands.sample_rows(2_000_000, 1000 * 2_000_000, rates, budget) == bands.COUNT_SHARE * 2_000_000
    held = int(budget / (bands.PILOT_BYTES * bands.REACH * 1e-2 * 10_000))
    for rows in (2_000_000, 20_000_000, 200_000_000):
        assert bands.sample_rows(rows, 10_000 * rows, rates, budget) == held


def test_a_chain_keeps_members_as_pieces_and_merges_concatenate_them():
    """A chain of chunk tasks (``StatState.copy``) hands a window's members on as a list of pieces,
    not copies of the growing list: a task's piece never reaches its predecessor's state; merged,
    the state holds every task's members once (``members`` joins a job's)."""
    from streameval.features.verification.kernels import COUNT, ENTRY
    from streameval.features.verification.statistic import Verify, Windows, members
    from streameval.engine.statistic import StatState

    stat = Verify(1, 4, 0, False, False, Windows.of([(0, 0, 1 << 63, 40), (0, 1 << 63, 1 << 64, 40)]), count=False)
    rng = np.random.default_rng(1)
    state, added = StatState.empty((stat,), 3, 0), {0: [], 1: []}
    for task in range(5):
        before, state = state, state.copy()
        piece = np.zeros((2, 5, ENTRY))
        for job in (0, 1):
            rows = rng.random((int(rng.integers(0, 5)), ENTRY))
            piece[job, 1:len(rows) + 1], piece[job, 0, COUNT] = rows, len(rows)
            added[job].extend(map(tuple, rows))
        state.arrays["verify/members"].append(piece)
        assert len(before.arrays["verify/members"]) == task and len(state.arrays["verify/members"]) == task + 1
    other = StatState.empty((stat,), 3, 0)
    other.arrays["verify/members"].append(np.ones((2, 3, ENTRY)))
    other.arrays["verify/members"][0][:, 0, COUNT] = 2
    merged = StatState.merge(state, other)
    for job in (0, 1):
        got = members(merged.arrays["verify/members"], job)
        assert sorted(map(tuple, got)) == sorted(added[job] + [(1.0,) * ENTRY] * 2)
