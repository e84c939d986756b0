"""``streameval compare`` and ``streameval.compare`` (docs/significance.md#comparing-runs): every run
against the first, per metric, on paired per-query (or per-trial) values."""

import json
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

import streameval
from streameval.core.errors import OptionError, StreamevalError
from streameval.core.paired import holm
from streameval.run.significance import metric_samples

from cli_checks import cli, one_error_line

NQ, NG, DIM, IDS = 60, 300, 8, 12
RESAMPLES = 500


@pytest.fixture(scope="module")
def ids() -> dict:
    """Identities 1-12, cameras 1-6, junk (-1) and distractors (0) in the gallery; queries of
    identities 11 and 12 have no positive (Q-: MFR)."""
    rng = np.random.default_rng(270)
    return {"q_pids": rng.integers(1, IDS + 1, NQ), "q_camids": rng.integers(1, 7, NQ),
            "g_pids": rng.integers(-1, IDS - 1, NG), "g_camids": rng.integers(1, 7, NG)}


def model(ids: dict, noise: float, seed: int) -> dict:
    """A model's features of the same images: identity centres plus noise (more noise, a weaker model)."""
    rng = np.random.default_rng(seed)
    centres = 2 * np.random.default_rng(0).standard_normal((IDS + 1, DIM))
    return {**ids,
            "qf": (centres[ids["q_pids"]] + noise * rng.standard_normal((NQ, DIM))).astype(np.float32),
            "gf": (centres[np.maximum(ids["g_pids"], 0)] + noise * rng.standard_normal((NG, DIM))).astype(np.float32)}


def run(data, **options):
    return streameval.evaluate(data, progress=False, **{"max_rank": 10, **options})


@pytest.fixture(scope="module")
def results(ids) -> list:
    """A baseline, a noisier model, a slightly noisier one."""
    return [run(model(ids, noise, seed)) for noise, seed in ((1.0, 1), (1.6, 2), (1.1, 3))]


@pytest.fixture(scope="module")
def files(results, tmp_path_factory) -> list:
    folder = tmp_path_factory.mktemp("runs")
    paths = []
    for name, result in zip(("base", "noisy", "close"), results):
        paths.append(folder / f"{name}.json")
        paths[-1].write_text(json.dumps(result.to_dict(per_query=True)))
    return paths


@pytest.fixture(scope="module")
def compared(files):
    return streameval.compare(files, resamples=RESAMPLES)


def test_p_values_are_scipy_s_on_the_same_per_query_values(compared, results):
    samples = [metric_samples(result.to_dict(per_query=True))[1] for result in results]
    found = compared.to_dict()
    assert set(found["metrics"]) == {"mAP", "mAP_trapezoid", "mINP", "rank1", "rank5", "rank10", "MREP", "MFR"}
    for name, metric in found["metrics"].items():
        baseline = samples[0][name]
        assert metric["unit"] == "query" and metric["n"] == len(baseline)
        for label, values in zip(("noisy", "close"), (samples[1][name], samples[2][name])):
            one = metric["runs"][label]
            assert one["delta"] == pytest.approx((values - baseline).mean(), rel=0, abs=1e-15)
            if np.any(values != baseline):
                assert one["p"]["t"] == pytest.approx(stats.ttest_rel(values, baseline).pvalue, rel=1e-12, abs=1e-300)
                assert one["p"]["wilcoxon"] == pytest.approx(stats.wilcoxon(values, baseline).pvalue, rel=1e-12,
                                                             abs=1e-300)
            lo, hi = one["ci"]
            assert lo <= one["delta"] <= hi


def test_values_are_the_reported_ones_and_the_noisier_model_is_significantly_worse(compared, results):
    metrics = compared.to_dict()["metrics"]
    for label, result in zip(("base", "noisy", "close"), results):
        assert metrics["mAP"]["values"][label] == pytest.approx(result.mAP, rel=1e-12)
        assert metrics["rank1"]["values"][label] == pytest.approx(result.rank(1), rel=1e-12)
        assert metrics["MFR"]["values"][label] == pytest.approx(result.gom["MFR"], rel=1e-12)
    noisy = metrics["mAP"]["runs"]["noisy"]
    assert noisy["delta"] < 0 and noisy["ci"][1] < 0 and max(noisy["p_corrected"].values()) < 0.01


def test_holm_corrects_over_the_compared_runs_of_each_metric(compared):
    for metric in compared.to_dict()["metrics"].values():
        for test in ("t", "wilcoxon", "randomization"):
            raw = [metric["runs"][label]["p"][test] for label in ("noisy", "close")]
            corrected = [metric["runs"][label]["p_corrected"][test] for label in ("noisy", "close")]
            assert corrected == holm(raw).tolist()
            assert all(c >= r for c, r in zip(corrected, raw))


def test_results_and_paths_mixed_give_the_same_comparison(results, files, compared):
    mixed = streameval.compare([results[0], files[1], results[2]], labels=["base", "noisy", "close"],
                               resamples=RESAMPLES)
    assert mixed.to_dict()["metrics"] == compared.to_dict()["metrics"]
    assert [run["file"] for run in mixed.to_dict()["runs"]] == [None, str(files[1]), None]


def test_the_randomization_p_of_a_seed_is_reproducible(files, compared):
    again = streameval.compare(files, resamples=RESAMPLES).to_dict()
    assert again == compared.to_dict()
    other = streameval.compare(files, resamples=RESAMPLES, seed=1).to_dict()["metrics"]["mAP"]["runs"]["close"]
    assert other["p"]["t"] == compared.to_dict()["metrics"]["mAP"]["runs"]["close"]["p"]["t"]
    assert other["ci"] != compared.to_dict()["metrics"]["mAP"]["runs"]["close"]["ci"]


def test_metrics_choose_the_columns(files):
    found = streameval.compare(files, metrics="rank1,mAP", resamples=RESAMPLES)
    assert list(found.to_dict()["metrics"]) == ["rank1", "mAP"]
    with pytest.raises(OptionError, match="metrics 'nope': the baseline has values of mAP, mAP_trapezoid"):
        streameval.compare(files, metrics=["mAP", "nope"])


def test_the_table_marks_the_values_whose_corrected_p_is_below_alpha(compared):
    metrics = compared.to_dict()["metrics"]
    table = compared.table("markdown", test="randomization", alpha=0.05)
    lines = table.splitlines()
    assert lines[0] == ("| Run | mAP (%) | mAP_trapezoid (%) | mINP (%) | Rank-1 (%) | Rank-5 (%) | Rank-10 (%) | MREP "
                        "| MFR |")
    assert lines[2].startswith("| base (baseline) | ") and "*" not in lines[2]
    for line, label in zip(lines[3:5], ("noisy", "close")):
        cells = [cell.strip() for cell in line.strip("|").split("|")][1:]
        for cell, (name, metric) in zip(cells, metrics.items()):
            value = metric["values"][label]
            shown = f"{100 * value:.2f}" if name not in ("MREP", "MFR") else f"{value:.4f}"
            marked = metric["runs"][label]["p_corrected"]["randomization"] < 0.05
            assert cell == shown + ("*" if marked else "")
    assert "*" in lines[3]  # the noisy model is significantly worse somewhere
    assert lines[-1] == ("\\* paired randomization test p < 0.05 against base, Holm-corrected over the 2 compared "
                         "runs of each metric; paired over queries")


def test_csv_keeps_numbers_and_latex_marks_with_a_superscript(compared):
    rows = compared.table("csv", test="t").splitlines()
    assert rows[0].startswith("Run,mAP (%),mAP p (t; Holm),mAP_trapezoid (%),")
    noisy = rows[2].split(",")
    p = compared.to_dict()["metrics"]["mAP"]["runs"]["noisy"]["p_corrected"]["t"]
    assert noisy[0] == "noisy" and float(noisy[2]) == pytest.approx(p, rel=1e-2) and "*" not in rows[2]
    latex = compared.table("latex", test="t")
    assert "$^{*}$" in latex and latex.splitlines()[-1].startswith("% * paired t-test p < 0.05")


def test_trials_over_the_same_queries_pair_each_querys_mean_over_the_trials(ids):
    """sysu-all's gallery trials count the same queries in each trial: the pairs are queries, each
    query's contribution averaged over the trials (whose mean is the trials' mean of means)."""
    runs = [run(model(ids, noise, seed), protocol="sysu-all", trials=6) for noise, seed in ((1.0, 1), (1.4, 2))]
    comparison = streameval.compare(runs, resamples=RESAMPLES)
    found = comparison.to_dict()
    assert found["unit"] == "query"
    assert comparison.table().splitlines()[-1] == "\\* paired randomization test p < 0.05 against run 1; paired over queries"

    def pooled_ap(result):
        pq = result.per_query
        counted = pq["counted"][0]
        return np.where(pq["counted"] & (pq["n_positives"] > 0), pq["ap"], 0.0).mean(axis=0)[counted]

    a, b = pooled_ap(runs[0]), pooled_ap(runs[1])
    assert a.mean() == pytest.approx(runs[0].mAP, rel=1e-12) and b.mean() == pytest.approx(runs[1].mAP, rel=1e-12)
    mAP = found["metrics"]["mAP"]
    assert mAP["n"] == len(a) and mAP["runs"]["run 2"]["p"]["t"] == pytest.approx(stats.ttest_rel(b, a).pvalue, rel=1e-12)


def test_trials_over_other_queries_are_compared_trial_by_trial(ids):
    """vehicleid draws other queries in each trial: the pairs are trials (trial t of each run draws the same)."""
    runs = [run(model(ids, noise, seed), protocol="vehicleid") for noise, seed in ((1.0, 1), (1.4, 2))]
    comparison = streameval.compare(runs, resamples=RESAMPLES)
    found = comparison.to_dict()
    assert found["unit"] == "trial"
    # one compared run: no correction to speak of
    assert comparison.table().splitlines()[-1] == "\\* paired randomization test p < 0.05 against run 1; paired over trials"
    mAP = found["metrics"]["mAP"]
    a, b = (np.array([trial["mAP"] for trial in r.trials["per_trial"]]) for r in runs)
    assert mAP["n"] == 10 and mAP["runs"]["run 2"]["p"]["t"] == pytest.approx(stats.ttest_rel(b, a).pvalue, rel=1e-12)


def test_trials_without_per_query_values_are_compared_trial_by_trial(ids, tmp_path):
    """A run with trials written without --per-query still has its per-trial values: every run is
    then paired over trials, the others too."""
    runs = [run(model(ids, noise, seed), protocol="sysu-all", trials=6) for noise, seed in ((1.0, 1), (1.4, 2))]
    (tmp_path / "a.json").write_text(json.dumps(runs[0].to_dict()))
    comparison = streameval.compare([tmp_path / "a.json", runs[1]], resamples=RESAMPLES)
    assert comparison.to_dict()["unit"] == "trial" and comparison.to_dict()["metrics"]["mAP"]["n"] == 6


# ------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("change, field", [
    ({"metric": "cosine"}, "metric"),
    ({"denominator": "zero"}, "protocol.denominator"),
    ({"precision": "float64"}, "precision"),
    ({"max_rank": 20}, "max_rank"),
    ({"gom_bins": 50}, "gom.bins"),
])
def test_runs_with_other_settings_are_refused_naming_the_field(ids, results, change, field):
    other = run(model(ids, 1.6, 2), **change)
    with pytest.raises(StreamevalError, match=f"differ in options that decide the numbers: {field} "):
        streameval.compare([results[0], other])


def test_runs_over_another_gallery_or_other_queries_are_refused(ids, results):
    data = model(ids, 1.6, 2)
    fewer = {**data, "gf": data["gf"][:-1], "g_pids": data["g_pids"][:-1], "g_camids": data["g_camids"][:-1]}
    with pytest.raises(StreamevalError, match="not score the same queries and gallery: n_gallery is 300 in run 1 "
                                              "and 299 in run 2"):
        streameval.compare([results[0], run(fewer)])
    moved = {**data, "q_pids": np.roll(data["q_pids"], 1)}  # the same counts, other queries
    with pytest.raises(StreamevalError, match=r"per_query\.(counted|n_positives) differs between run 1 and run 2"):
        streameval.compare([results[0], run(moved)])


def test_a_result_without_per_query_values_is_named(results, files, tmp_path):
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(results[1].to_dict()))
    with pytest.raises(OptionError, match=f"'{bare}': this result was written without --per-query"):
        streameval.compare([files[0], bare])


def test_one_run_or_a_foreign_object_is_refused(files):
    with pytest.raises(OptionError, match="two runs or more"):
        streameval.compare(files[:1])
    with pytest.raises(OptionError, match="Result objects or paths of result JSON files, got int"):
        streameval.compare([files[0], 3])
    with pytest.raises(OptionError, match="a list of runs"):
        streameval.compare(str(files[0]))


# ------------------------------------------------------------------------------- command line


def test_the_command_compares_files_written_by_eval(ids, tmp_path):
    """Real processes: two stores evaluated with --per-query --json, then compared."""
    exe = [sys.executable, "-m", "streameval.cli"]
    paths = []
    for name, (noise, seed) in (("base", (1.0, 1)), ("noisy", (1.6, 2))):
        data = model(ids, noise, seed)
        streameval.write_store(tmp_path / f"{name}.zarr", data["qf"], data["q_pids"], data["q_camids"], data["gf"],
                               data["g_pids"], data["g_camids"])
        paths.append(tmp_path / f"{name}.json")
        subprocess.run(exe + ["eval", tmp_path / f"{name}.zarr", "--max-rank", "10", "--per-query", "--json",
                              paths[-1], "-q"], check=True)
    out = tmp_path / "cmp.json"
    done = subprocess.run(exe + ["compare", *paths, "--resamples", "500", "--json", out, "--metrics", "mAP,rank1"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    expected = streameval.compare(paths, metrics=["mAP", "rank1"], resamples=500)
    assert json.loads(out.read_text()) == json.loads(json.dumps(expected.to_dict()))
    assert done.stdout == expected.table() + "\n"
    again = subprocess.run(exe + ["compare", *paths, "--json", out], capture_output=True, text=True)
    assert again.returncode == 2 and again.stderr == f"error: '{out}' exists; pass --overwrite to replace it\n"


def test_the_command_names_a_file_without_per_query_values(files, results, tmp_path):
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(results[1].to_dict()))
    line = one_error_line(cli("compare", files[0], bare, code=2))
    assert line == f"error: '{bare}': this result was written without --per-query; rerun with --per-query"


@pytest.mark.parametrize("args, says", [
    (["--alpha", "0"], "'--alpha': must be a number from 1e-06 to 0.5 (a significance level), got 0.0"),
    (["--level", "nan"], "'--level': must be a number from 0.5 to 0.999 (a confidence level), got nan"),
    (["--resamples", "10"], "'--resamples': must be an integer from 100 to 10,000,000"),
    (["--test", "z"], "'--test': 'z' is not one of 't', 'wilcoxon', 'randomization'"),
])
def test_the_command_refuses_bad_values_at_once(files, args, says):
    assert says in one_error_line(cli("compare", *files, *args, code=2))


def test_the_command_prints_the_table_as_asked(files):
    shown = cli("compare", *files, "--resamples", "500", "--format", "latex", "--test", "wilcoxon", "--alpha", "0.01")
    assert shown.stdout == streameval.compare(files, resamples=500).table("latex", "wilcoxon", 0.01) + "\n"


def test_json_on_stdout_puts_the_table_on_stderr_and_other_versions_are_a_warning(files, tmp_path):
    record = json.loads(files[1].read_text())
    older = tmp_path / "older.json"
    older.write_text(json.dumps({**record, "streameval_version": "0.0.1"}))
    shown = cli("compare", files[0], older, "--resamples", "200", "--json", "-")
    expected = streameval.compare([files[0], older], resamples=200)
    assert json.loads(shown.stdout) == json.loads(json.dumps(expected.to_dict()))
    assert expected.to_dict()["warnings"] == [expected.warnings[0]]
    assert shown.stderr == (f"warning: {expected.warnings[0]}\n" + expected.table() + "\n")
    assert "different streameval versions" in expected.warnings[0]
