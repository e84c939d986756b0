"""The paired tests behind ``streameval compare`` (docs/significance.md#comparing-runs): delta and its
bootstrap interval, the t, Wilcoxon and randomization p-values, and Holm's correction."""

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from streameval.core import paired
from streameval.core.paired import holm, paired_tests, randomization_p
from streameval.core.resampling import bootstrap_interval


def pair(n: int, shift: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A baseline of per-query values in [0, 1] and a run shifted by ``shift`` plus noise."""
    rng = np.random.default_rng(seed)
    baseline = rng.beta(2, 5, n)
    return baseline, np.clip(baseline + shift + 0.1 * rng.standard_normal(n), 0, 1)


def test_delta_and_its_interval_are_the_mean_and_the_bootstrap_of_the_differences():
    baseline, other = pair(40, 0.03, 1)
    found = paired_tests(baseline, other, level=0.9, resamples=500, seed=7)
    assert found["delta"] == (other - baseline).mean()  # positive: the run is above the baseline
    assert found["ci"] == bootstrap_interval(other - baseline, 0.9, 500, 7).tolist()


@pytest.mark.parametrize("n, shift, seed", [(12, 0.0, 2), (60, 0.02, 3), (300, 0.01, 4)])
def test_t_and_wilcoxon_are_scipy_s(n, shift, seed):
    baseline, other = pair(n, shift, seed)
    p = paired_tests(baseline, other, resamples=200)["p"]
    assert p["t"] == pytest.approx(stats.ttest_rel(other, baseline).pvalue, rel=1e-12, abs=1e-300)
    assert p["wilcoxon"] == pytest.approx(stats.wilcoxon(other, baseline).pvalue, rel=1e-12, abs=1e-300)


def test_runs_equal_on_every_unit_have_p_one_and_a_zero_interval():
    """scipy's t-test says NaN there (its Wilcoxon 1.0 with a warning): the documented 1.0 instead."""
    values = np.linspace(0, 1, 9)
    assert paired_tests(values, values.copy(), resamples=100) == {
        "delta": 0.0, "ci": [0.0, 0.0], "p": {"t": 1.0, "wilcoxon": 1.0, "randomization": 1.0}}


def test_one_unit_has_no_t_p_value():
    p = paired_tests([0.2], [0.5], resamples=100)["p"]
    assert math.isnan(p["t"]) and p["wilcoxon"] == 1.0 and p["randomization"] == 1.0


def exact_randomization_p(d: np.ndarray) -> float:
    """Over all 2^n sign vectors: the share whose |sum| is at least the observed one."""
    signs = np.array(list(itertools.product((-1.0, 1.0), repeat=len(d))))
    sums = np.abs(signs @ d)
    return float(np.mean(sums >= abs(d.sum()) * (1 - 1e-12)))


@pytest.mark.parametrize("seed", [5, 6])
def test_randomization_p_is_within_monte_carlo_error_of_the_exact_enumeration(seed):
    d = np.random.default_rng(seed).normal(0.35, 1.0, 12)
    exact = exact_randomization_p(d)
    assert 0.02 < exact < 0.5  # a case where the test has something to say
    resamples = 20_000
    got = randomization_p(d, resamples, seed=11)
    sigma = math.sqrt(exact * (1 - exact) / resamples)
    assert abs(got - exact) <= 4 * sigma + 1 / (resamples + 1), (got, exact)


def test_randomization_p_of_a_seed_is_reproducible_and_independent_of_the_batch(monkeypatch):
    d = np.random.default_rng(8).normal(0.1, 1.0, 50)
    first = randomization_p(d, 3000, seed=3)
    assert randomization_p(d, 3000, seed=3) == first
    assert randomization_p(d, 3000, seed=4) != first  # the seed draws the signs
    monkeypatch.setattr(paired, "INDEX_BUDGET", 8 * 50 * 7)  # 7 sign vectors at a time
    assert randomization_p(d, 3000, seed=3) == first
    count = round(first * 3001) - 1  # p = (1 + count) / (1 + R): the observed signs count once
    assert first == (1 + count) / 3001 and 0 <= count <= 3000


def test_the_paired_interval_covers_a_known_difference_at_its_level():
    """Coverage check (seeded): 200 sets of 60 paired values, run = baseline + 0.05 + N(0, 0.1^2)
    (not clipped: the true mean difference is exactly 0.05); the 95% percentile bootstrap interval
    of the delta holds 0.05 in 95% +- 5% of the sets."""
    hits = 0
    for seed in range(200):
        rng = np.random.default_rng(1000 + seed)
        baseline = rng.beta(2, 5, 60)
        other = baseline + 0.05 + 0.1 * rng.standard_normal(60)
        lo, hi = bootstrap_interval(other - baseline, 0.95, 1000, seed)
        hits += lo <= 0.05 <= hi
    assert 0.90 <= hits / 200 <= 1.0


def holm_reference(p: list) -> list:
    """Holm (1979) written out: walk the p-values in ascending order, multiply the i-th (0-based)
    by m - i, keep the running maximum, cap at 1; NaN is not in the family."""
    family = sorted((value, i) for i, value in enumerate(p) if not math.isnan(value))
    out, running = [math.nan] * len(p), 0.0
    for rank, (value, i) in enumerate(family):
        running = max(running, min(1.0, (len(family) - rank) * value))
        out[i] = running
    return out


@pytest.mark.parametrize("p", [
    [0.01, 0.04, 0.03, 0.005],
    [0.5, 0.2, 0.9],
    [0.04],
    [0.01, math.nan, 0.02, 0.02, 0.3],
    list(np.random.default_rng(9).uniform(0, 0.2, 15)),
])
def test_holm_equals_the_step_down_written_out(p):
    assert holm(p).tolist() == pytest.approx(holm_reference(p), nan_ok=True, rel=1e-15)


def test_holm_by_hand():
    assert holm([0.01, 0.04, 0.03, 0.005]).tolist() == pytest.approx([0.03, 0.06, 0.06, 0.02], rel=1e-15)


def test_randomization_is_exact_where_few_rank_k_values_differ():
    """Three of 500 queries lose their rank-1 hit, none gains one: under the null each of the three
    is as likely a gain, so the exact p is P(all three agree) = 2 / 8.  The t-test's and Wilcoxon's
    normal approximations say 0.08 here: why randomization marks the table by default."""
    d = np.zeros(500)
    d[[10, 200, 333]] = -1.0
    resamples = 20_000
    got = randomization_p(d, resamples, seed=0)
    assert abs(got - 0.25) <= 4 * math.sqrt(0.25 * 0.75 / resamples) + 1 / (resamples + 1)
    p = paired_tests(np.zeros(500), d, resamples=200)["p"]
    assert p["t"] < 0.1 and p["wilcoxon"] < 0.1


def test_sums_equal_but_for_rounding_count_as_ties():
    """d = (0.1, 0.2, -0.3, 0.5): flipping the first three leaves the sum at 0.5 exactly, but in
    floating point one order gives 0.5000000000000001 and the other 0.49999999999999994.  The exact
    p-value, counted on the integers 10 d, must still come out."""
    tenths = np.array([1, 2, -3, 5])
    signs = np.array(list(itertools.product((-1, 1), repeat=4)))
    exact = float(np.mean(np.abs(signs @ tenths) >= abs(tenths.sum())))
    resamples = 20_000
    got = randomization_p(tenths / 10, resamples, seed=1)
    assert abs(got - exact) <= 4 * math.sqrt(exact * (1 - exact) / resamples) + 1 / (resamples + 1), (got, exact)


def test_pairs_tested_together_equal_each_tested_alone():
    """compare tests every (metric, run) pair over as many units in one call: the same draws."""
    pairs = [pair(80, shift, seed) for shift, seed in ((0.0, 20), (0.03, 21), (-0.02, 22))]
    together = paired_tests(np.stack([b for b, _ in pairs], 1), np.stack([o for _, o in pairs], 1), 0.9, 700, 5)
    assert together == [paired_tests(b, o, 0.9, 700, 5) for b, o in pairs]
