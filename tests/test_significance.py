"""The samples behind confidence intervals and paired tests (docs/significance.md): per metric, the
per-query contributions (or per-trial values) whose mean is the reported value."""

import json

import numpy as np
import pytest

import streameval
from streameval.core.errors import OptionError
from streameval.core.resampling import bootstrap_interval, t_interval
from streameval.run.significance import metric_samples

NQ, NG, DIM, IDS = 48, 260, 8, 10


@pytest.fixture(scope="module")
def arrays() -> dict:
    """Clustered identities, cameras 1-6 (SYSU's), junk (-1) and distractors (0) in the gallery, and
    queries of identities 9, 10 that the gallery lacks (Q-: the zero denominator and MFR see them)."""
    rng = np.random.default_rng(27)
    centres = 2 * rng.standard_normal((IDS + 1, DIM))
    q_pids, g_pids = rng.integers(1, IDS + 1, NQ), rng.integers(-1, IDS - 1, NG)
    return {
        "qf": (centres[q_pids] + rng.standard_normal((NQ, DIM))).astype(np.float32),
        "q_pids": q_pids, "q_camids": rng.integers(1, 7, NQ),
        "gf": (centres[np.maximum(g_pids, 0)] + rng.standard_normal((NG, DIM))).astype(np.float32),
        "g_pids": g_pids, "g_camids": rng.integers(1, 7, NG),
    }


def record_of(arrays, protocol, **options) -> dict:
    """The --per-query JSON of an evaluation, read back as a file would be."""
    result = streameval.evaluate(arrays, protocol=protocol, max_rank=10, progress=False, **options)
    return json.loads(json.dumps(result.to_dict(per_query=True)))


def reported(record: dict, name: str) -> float:
    return record["gom"][name] if name in ("MREP", "MFR") else record[name]


CLOSED = {"mAP", "mAP_trapezoid", "mINP", "rank1", "rank5", "rank10"}
CASES = {  # id: (protocol, options, unit, the metrics with samples)
    "market": ("market", {}, "query", CLOSED | {"MREP", "MFR"}),
    "market-no-gom": ("market", {"no_gom": True}, "query", CLOSED),
    "zero-denominator": ("market", {"denominator": "zero"}, "query", CLOSED | {"MREP", "MFR"}),
    "identity-dedup": ("market", {"cmc": "identity-dedup"}, "query", CLOSED | {"MREP", "MFR"}),
    "query-cameras": ("sysu-all", {"trials": 0}, "query", CLOSED | {"MREP", "MFR"}),  # queries of cameras 3, 6
    "sgs-one-repeat": ("cuhk03-sgs", {"sgs_repeats": 1}, "query", CLOSED | {"MREP", "MFR"}),
    "sgs-expected": ("cuhk03-sgs", {"sgs_mode": "expected"}, "query", CLOSED - {"rank1", "rank5", "rank10"}
                     | {"MREP", "MFR"}),
    "trials": ("sysu-all", {}, "trial", CLOSED | {"MREP", "MFR"}),
    "sgs-repeats": ("cuhk03-sgs", {"no_gom": True}, "trial", CLOSED),
}


@pytest.mark.parametrize("case", CASES)
def test_each_metric_s_samples_average_to_its_reported_value(arrays, case):
    protocol, options, unit, metrics = CASES[case]
    record = record_of(arrays, protocol, **options)
    got_unit, samples = metric_samples(record)
    assert got_unit == unit and set(samples) == metrics
    for name, values in samples.items():
        assert values.dtype == np.float64
        assert values.mean() == pytest.approx(reported(record, name), rel=1e-12, abs=1e-15), name
    if unit == "trial":
        assert all(len(v) == record["trials"]["T"] for v in samples.values())


POOLED = {  # id: (protocol, options, unit with pool_trials)
    "sgs-repeats": ("cuhk03-sgs", {}, "query"),  # the same queries in every repeat
    "gallery-trials": ("sysu-all", {}, "query"),  # gallery draws: the same queries, positives in each
    "query-trials": ("vehicleid", {}, "trial"),  # other queries in each trial: pairs of trials
}


@pytest.mark.parametrize("case", POOLED)
def test_pooled_trials_average_each_query_over_the_trials_to_the_reported_value(arrays, case):
    protocol, options, unit = POOLED[case]
    record = record_of(arrays, protocol, **options)
    got_unit, samples = metric_samples(record, pool_trials=True)
    assert got_unit == unit
    counted = np.asarray(record["per_query"]["counted"])
    for name, values in samples.items():
        assert values.mean() == pytest.approx(reported(record, name), rel=1e-12, abs=1e-15), name
        if unit == "query" and name in ("mAP", "mINP", "rank1"):
            assert len(values) == counted[0].sum()
    if unit == "query":  # the per-query values are each query's mean over the trials
        valid = counted & (np.asarray(record["per_query"]["n_positives"]) > 0)
        ap = np.where(valid, np.asarray(record["per_query"]["ap"], dtype=float), 0.0)
        assert np.allclose(samples["mAP"], ap.mean(axis=0)[counted[0]], rtol=0, atol=1e-15)


def test_samples_count_the_denominator_s_queries(arrays):
    """skip: Q+ (of the queries the protocol keeps); zero: every kept query, Q- contributing 0;
    MREP over Q+ and MFR over Q- either way."""
    for denominator, counted in (("skip", "n_valid_queries"), ("zero", "n_queries")):
        record = record_of(arrays, "sysu-all", trials=0, denominator=denominator)
        assert 0 < record["n_open_queries"] and record["n_queries"] < NQ  # cameras 3, 6 only; some Q-
        _, samples = metric_samples(record)
        assert all(len(samples[name]) == record[counted] for name in CLOSED)
        assert len(samples["MREP"]) == record["n_valid_queries"] and len(samples["MFR"]) == record["n_open_queries"]
    assert np.count_nonzero(samples["mAP"] == 0) == record["n_open_queries"]


def test_rank_samples_read_the_cmc_flavour_s_rank(arrays):
    record = record_of(arrays, "market", cmc="identity-dedup")
    pq = record["per_query"]
    rho = np.array(pq["rho"])[np.array(pq["counted"])]
    _, samples = metric_samples(record)
    np.testing.assert_array_equal(samples["rank5"], (rho <= 5) & (rho >= 1))
    assert not np.array_equal(rho, np.array(pq["first_hit_rank"])[np.array(pq["counted"])])  # a different rank


def test_gom_areas_are_per_query_and_only_with_gom(arrays):
    with_gom, without = record_of(arrays, "market"), record_of(arrays, "market", no_gom=True)
    assert {"counted", "rep_area", "fr_area"} <= set(with_gom["per_query"])
    assert "counted" in without["per_query"] and not {"rep_area", "fr_area"} & set(without["per_query"])
    open_rows = [n == 0 for n in with_gom["per_query"]["n_positives"]]
    assert [a is None for a in with_gom["per_query"]["rep_area"]] == open_rows
    assert [a is None for a in with_gom["per_query"]["fr_area"]] == [not o for o in open_rows]


def test_a_query_unit_needs_per_query_values(arrays):
    result = streameval.evaluate(arrays, max_rank=10, progress=False)
    with pytest.raises(OptionError, match="written without --per-query; rerun with --per-query"):
        metric_samples(result.to_dict())
    assert metric_samples(streameval.evaluate(arrays, protocol="sysu-all", max_rank=10, progress=False)
                          .to_dict())[0] == "trial"  # per-trial values are always in the JSON


def test_two_directions_are_sampled_one_at_a_time(arrays):
    record = record_of(arrays, "regdb")
    with pytest.raises(OptionError, match="two directions .*v2t, t2v.*directions"):
        metric_samples(record)
    for direction in ("v2t", "t2v"):
        one = record["directions"][direction]
        unit, samples = metric_samples(one)
        assert unit == "query" and samples["mAP"].mean() == pytest.approx(one["mAP"], rel=1e-12)


# ------------------------------------------------------------------------ confidence intervals (--ci)


def without(record: dict, *keys) -> dict:
    return {k: v for k, v in record.items() if k not in keys}


@pytest.mark.parametrize("protocol", ["market", "sysu-all"])
def test_ci_is_the_interval_of_each_metric_s_samples_and_changes_nothing_else(arrays, protocol):
    plain = streameval.evaluate(arrays, protocol=protocol, max_rank=10, progress=False)
    result = streameval.evaluate(arrays, protocol=protocol, max_rank=10, progress=False, ci=0.9, ci_resamples=500,
                                 ci_seed=3)
    assert plain.ci is None and "ci" not in plain.to_dict()
    assert without(result.to_dict(per_query=True), "run", "ci") == without(plain.to_dict(per_query=True), "run")
    assert "confidence intervals" in result.run["phases"]
    unit, samples = metric_samples(plain.to_dict(per_query=True))
    ci = result.to_dict()["ci"]
    assert set(ci["intervals"]) == set(samples) and ci["level"] == 0.9 and ci["unit"] == unit
    for name, values in samples.items():
        want = bootstrap_interval(values, 0.9, 500, 3) if unit == "query" else t_interval(values, 0.9)
        assert ci["intervals"][name] == pytest.approx(list(want), rel=1e-13), name
    if unit == "query":
        assert (ci["method"], ci["resamples"], ci["seed"]) == ("bootstrap over queries (percentile)", 500, 3)
    else:
        assert (ci["method"], ci["resamples"], ci["seed"]) == ("t over trials", None, None)


def test_ci_of_two_directions_is_per_direction(arrays):
    result = streameval.evaluate(arrays, protocol="regdb", max_rank=10, progress=False, ci=0.95, ci_resamples=200)
    for name, one in result.directions.items():
        want = bootstrap_interval(metric_samples(one)[1]["mAP"], 0.95, 200, 0)
        assert one["ci"]["intervals"]["mAP"] == pytest.approx(list(want), rel=1e-13), name
    assert result.ci == result.directions["v2t"]["ci"]  # the result's values are its first direction's


@pytest.mark.parametrize("options, message", [
    ({"ci": 1.0}, "ci must be a number from 0.5 to 0.999"),
    ({"ci": float("nan")}, "ci must be a number"),
    ({"ci": 0.95, "ci_resamples": 10}, "ci_resamples must be an integer from 100 to"),
    ({"ci": 0.95, "ci_seed": -1}, "ci_seed must be a non-negative integer"),
])
def test_ci_options_are_checked_before_any_work(options, message):
    with pytest.raises(OptionError, match=message):
        streameval.evaluate("/nonexistent/store.zarr", **options)  # the store would fail next


@pytest.fixture(scope="module")
def store(arrays, tmp_path_factory):
    from streameval.store import write_store

    path = tmp_path_factory.mktemp("ci") / "s.zarr"
    write_store(path, arrays["qf"], arrays["q_pids"], arrays["q_camids"], arrays["gf"], arrays["g_pids"],
                arrays["g_camids"])
    return str(path)


def test_ci_is_not_part_of_a_saved_state(store, tmp_path):
    state = tmp_path / "state"
    saved = streameval.evaluate(store, max_rank=10, state=state, ci=0.95, ci_resamples=200, progress=False)
    assert streameval.update(store, state, progress=False).ci is None  # no --ci now: none, and no refusal
    again = streameval.update(store, state, ci=0.8, ci_resamples=200, progress=False)
    assert again.ci == streameval.evaluate(store, max_rank=10, ci=0.8, ci_resamples=200, progress=False).ci
    assert again.ci != saved.ci


def test_cli_ci_in_the_json_and_as_half_widths_in_the_tables(store):
    from cli_checks import cli

    want = streameval.evaluate(store, ci=0.9, ci_resamples=300, progress=False).ci
    got = json.loads(cli("eval", store, "--json", "-", "-q", "--ci", "0.9", "--ci-resamples", "300").stdout)
    assert got["ci"] == want
    half = {name: (hi - lo) / 2 for name, (lo, hi) in want["intervals"].items()}
    table = cli("eval", store, "--ci", "0.9", "--ci-resamples", "300").stdout
    assert "90% confidence intervals, bootstrap over queries (percentile), 300 resamples, seed 0:" in table
    assert f"mAP {100 * got['mAP']:.2f}% +- {100 * half['mAP']:.2f}" in table
    assert f"MREP {got['gom']['MREP']:.4f} +- {half['MREP']:.4f}" in table
    markdown = cli("eval", store, "--ci", "0.9", "--ci-resamples", "300", "--format", "markdown").stdout
    row = markdown.splitlines()[2]
    assert "(± 90% CI)" in row and f"| {100 * got['rank1']:.2f} ± {100 * half['rank1']:.2f} |" in row
    assert f"| {100 * got['mINP']:.2f} ± {100 * half['mINP']:.2f} |" in row
    csv = cli("eval", store, "--ci", "0.9", "--ci-resamples", "300", "--format", "csv").stdout
    assert "mAP (%),mAP CI half width (%)" in csv.splitlines()[0]
    assert "std" not in csv and "confidence" not in cli("eval", store).stdout  # no --ci: no interval


def test_aggregate_tables_show_each_run_s_interval_and_the_std_over_runs(store, tmp_path):
    from cli_checks import cli

    files = []
    for seed in (0, 1):
        path = tmp_path / f"run{seed}.json"
        cli("eval", store, "--json", path, "-q", "--ci", "0.95", "--ci-resamples", "200", "--ci-seed", seed)
        files.append(path)
    runs = [json.loads(f.read_text()) for f in files]
    lines = cli("aggregate", *files, "--format", "markdown").stdout.splitlines()
    for line, run in zip(lines[2:4], runs):
        lo, hi = run["ci"]["intervals"]["mAP"]
        assert "(± 95% CI)" in line and f"{100 * run['mAP']:.2f} ± {100 * (hi - lo) / 2:.2f}" in line
    assert "mean ± std (2 runs)" in lines[4]
    header = cli("aggregate", *files, "--format", "csv").stdout.splitlines()[0]
    assert "mAP std or CI half width (%)" in header
