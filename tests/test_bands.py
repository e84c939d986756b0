"""Placing verification's bands from a pilot (``streameval.bands``): the sample's runs, and the band
edges a ratio estimator with its between-run standard error gives.  (That the bands' selections
are exact, and that a misplaced band falls back to the two-pass route, is checked against the
pairs reference in test_verification.)"""

from __future__ import annotations

import math

import numpy as np
import pytest

from streameval import bands


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


def _filled_entries(buffer, job, rows):
    """Append ``rows`` (entries) to job ``job`` of a members buffer, as the kernel does."""
    from streameval.statistics.verify import COUNT

    n = int(buffer[job, 0, COUNT])
    buffer[job, n + 1:n + 1 + len(rows)] = rows
    buffer[job, 0, COUNT] = n + len(rows)


def test_a_chain_keeps_members_as_pieces_and_joins_them():
    """A chain of chunk tasks (``StatState.copy``) hands members on as pieces, not copies of the
    growing list; settled or merged, the state holds every task's members once."""
    from streameval.statistics import StatState
    from streameval.statistics.verify import COUNT, OVERFLOW, Refine

    stat = Refine([0, 0], [0.0, 1.0], [1.0, 2.0], [0, 0], 0, capacity=40)
    rng = np.random.default_rng(1)
    state, added = StatState.empty((stat,), 3, 0), {0: [], 1: []}
    for _ in range(5):
        state = state.copy()
        assert state.arrays["refine/members"][:, 0, COUNT].sum() == 0  # each task fills a fresh buffer
        for job in (0, 1):
            rows = rng.random((int(rng.integers(0, 5)), 4))
            _filled_entries(state.arrays["refine/members"], job, rows)
            added[job].extend(map(tuple, rows))
    assert len(state.pieces["refine/members"]) == 4
    other = StatState.empty((stat,), 3, 0).copy()
    _filled_entries(other.arrays["refine/members"], 1, np.ones((2, 4)))
    for joined, extra in ((state.settled(), []), (StatState.merge(state, other), [(1.0,) * 4] * 2)):
        members = joined.arrays["refine/members"]
        assert not joined.pieces and (members[:, 0, OVERFLOW] == 0).all()
        for job in (0, 1):
            got = members[job, 1:int(members[job, 0, COUNT]) + 1]
            want = added[job] + (extra if job == 1 else [])
            assert sorted(map(tuple, got)) == sorted(want)


def test_pieces_keep_what_a_task_collected_and_its_overflow_flag():
    """A task's buffer becomes a piece trimmed to its members, or none when it holds nothing; an
    overflow flag is kept, and joining marks the job overflowed (the members a chain collects are
    bounded by the kernel: test_verification)."""
    from streameval.statistics.verify import COUNT, ENTRY, OVERFLOW, join_members, pile_members

    empty = np.zeros((2, 101, ENTRY))
    assert pile_members((), empty) == ()
    buffer = empty.copy()
    _filled_entries(buffer, 1, np.full((3, ENTRY), 3.0))
    buffer[0, 0, OVERFLOW] = 1.0
    pieces = pile_members(pile_members((), buffer), empty)
    assert len(pieces) == 1 and pieces[0].shape == (2, 4, ENTRY) and (pieces[0] == buffer[:, :4]).all()
    joined = join_members(empty, pieces * 2, np.array([100, 100]))
    assert joined[0, 0, OVERFLOW] == 1.0 and joined[1, 0, OVERFLOW] == 0.0
    assert joined[1, 0, COUNT] == 6 and (joined[1, 1:7] == 3.0).all()
    assert join_members(empty, pieces * 2, np.array([100, 5]))[1, 0, OVERFLOW] == 1.0  # past the capacity
