"""Feature-variant suites (docs/suites.md): every evaluation of a suite equals a separate
evaluation of its (query variant, gallery variant) pair, bit for bit, for several chunkings, both
schedulers and after appends; per setting the spread equals numpy's over the per-trial values;
the plan's presets, files and refusals; the command line end to end.

The suite runs one pass per gallery variant with the query variants stacked (``store.stack``), so
these tests compare that pass against ``evaluate(query_variant=..., gallery_variant=...)``, whose
own numbers the engine-vs-reference tests pin to the brute-force float64 reference; one test also
checks a corrupted pair against that reference directly.  Integer-valued features make ties exact.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import streameval
from streameval.cli import main
from streameval.core.errors import OptionError
from streameval.store import append_gallery, write_store
from streameval.store.variants import variant_names, write_variant
from streameval.suite.plan import FACTORIAL_NOTE, load_suite
from streameval.suite.run import run_suite, update_suite
from streameval.core.spread import spread

from cli_checks import one_error_line
from reference import reference_evaluate

N_QUERY, N_GALLERY, DIM, N_IDS, TRIALS = 30, 120, 6, 8, 2
COMPARED = ("mAP", "mAP_trapezoid", "mINP", "cmc", "cmc_first_hit", "gom", "trials", "open_set", "n_gallery")


def corrupted(rng, clean: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Integer-valued corruption: per row a type (0 noise, 1 zeroed features, 2 shift) and a severity."""
    kind = rng.integers(0, 3, clean.shape[0])
    severity = rng.integers(1, 4, clean.shape[0])
    noise = rng.integers(-1, 2, clean.shape) * severity[:, None]
    out = np.where((kind == 0)[:, None], clean + noise, clean)
    out = np.where((kind == 1)[:, None] & (rng.random(clean.shape) < 0.2 * severity[:, None]), 0, out)
    out = np.where((kind == 2)[:, None], clean + severity[:, None], out)
    return out.astype(np.float32), kind, severity


def ids(rng, n: int, junk: bool) -> tuple[np.ndarray, np.ndarray]:
    pids = rng.integers(-1 if junk else 1, N_IDS + 2, n)  # pids past N_IDS: open-set queries, distractors
    return pids, rng.integers(0, 3, n)


def write_suite_store(path, seed: int = 0, n_gallery: int = N_GALLERY, chunk_rows: int = 32):
    """A store with cil-factorial's variants for TRIALS trials and the clean sets."""
    rng = np.random.default_rng(seed)
    qf = rng.integers(-2, 3, (N_QUERY, DIM)).astype(np.float32)
    gf = rng.integers(-2, 3, (n_gallery, DIM)).astype(np.float32)
    write_store(path, qf, *ids(rng, N_QUERY, False), gf, *ids(rng, n_gallery, True), chunk_rows=chunk_rows)
    for t in range(TRIALS):
        for set_name, clean in (("query", qf), ("gallery", gf)):
            features, kind, severity = corrupted(rng, clean)
            write_variant(path, set_name, f"corrupt-t{t}", features, corruption_type=kind, severity=severity,
                          attrs={"trial": t, "seed": seed, "source": "test"})
    return path


def comparable(result) -> dict:
    out = result.to_dict(per_query=True)
    return {key: out.get(key) for key in (*COMPARED, "per_query")}


def assert_each_equals_its_eval(store, result, **options) -> None:
    for ev, got in zip(result.suite.evaluations, result.results):
        alone = streameval.evaluate(store, query_variant=ev.query, gallery_variant=ev.gallery, **options)
        assert comparable(got) == comparable(alone), ev.name


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return write_suite_store(str(tmp_path_factory.mktemp("suite") / "s.zarr"))


@pytest.mark.parametrize("chunking", [{}, {"query_block": 7, "gallery_chunk": 32}, {"query_block": 64, "gallery_chunk": 96}])
def test_each_evaluation_equals_a_separate_eval_of_its_pair(store, chunking):
    suite = load_suite("cil-factorial", trials=TRIALS)
    result = run_suite(store, suite, **chunking)
    assert [ev.name for ev in result.suite.evaluations] == ["clean", "query-t0", "gallery-t0", "both-t0",
                                                           "query-t1", "gallery-t1", "both-t1"]
    assert result.execution == {"evaluations": 7, "gallery_variants": 3, "gemms": 7,
                                "gallery_passes": result.execution["gallery_passes"]}
    assert_each_equals_its_eval(store, result, max_rank=50, no_gom=True)


def test_a_corrupted_pair_equals_the_brute_force_reference(store):
    opened = streameval.open_store(store)
    from streameval.store import read_rows
    from streameval.store.variants import variant_set

    qf, qp, qc = read_rows(variant_set(opened, "query", "corrupt-t1"), slice(0, N_QUERY), np.float64)
    gf, gp, gc = read_rows(variant_set(opened, "gallery", "corrupt-t1"), slice(0, N_GALLERY), np.float64)
    ref = reference_evaluate(qf, qp, qc, gf, gp, gc, max_rank=20)
    result = run_suite(store, load_suite("cil-factorial", trials=TRIALS, max_rank=20)).results[-1]
    assert result.mAP == pytest.approx(ref["mAP"], abs=1e-12)
    assert result.mINP == pytest.approx(ref["mINP"], abs=1e-12)
    np.testing.assert_allclose(result.cmc, ref["cmc"], atol=1e-12)


def test_open_set_fixed_gom_and_a_protocol_with_trials_and_sgs_split_exactly(store):
    options = {"gom_norm": "fixed:0:12", "no_gom": False, "open_set": True}  # and the GOM summaries in the values
    result = run_suite(store, load_suite("cil-factorial", trials=TRIALS, **options), gallery_chunk=32)
    assert_each_equals_its_eval(store, result, max_rank=50, gom_norm="fixed:0:12", open_set=True, gallery_chunk=32)
    both = result.to_dict()["suite"]["evaluations"][-1]
    assert both["values"]["gom.MREP"] == both["result"]["gom"]["MREP"] is not None
    for protocol in ("sysu-all", "cuhk03-sgs"):
        result = run_suite(store, load_suite("cil-factorial", trials=1, protocol=protocol), query_block=16)
        assert_each_equals_its_eval(store, result, max_rank=50, no_gom=True, protocol=protocol)


def test_with_direction_t2v_the_variant_names_are_the_evaluation_sides(store):
    """t2v takes the store's gallery as the queries: a query variant is the gallery set's."""
    from streameval.store import read_rows
    from streameval.store.variants import variant_set

    opened = streameval.open_store(store)
    qf, qp, qc = read_rows(variant_set(opened, "gallery", "corrupt-t0"), slice(0, N_GALLERY), np.float32)
    gf, gp, gc = read_rows(variant_set(opened, "query", "corrupt-t1"), slice(0, N_QUERY), np.float32)
    swapped = streameval.evaluate({"qf": qf, "q_pids": qp, "q_camids": qc, "gf": gf, "g_pids": gp, "g_camids": gc},
                                  protocol="regdb", direction="v2t", no_gom=True)
    alone = streameval.evaluate(store, protocol="regdb", direction="t2v", query_variant="corrupt-t0",
                                gallery_variant="corrupt-t1", no_gom=True)
    assert comparable(alone) == comparable(swapped) and alone.n_gallery == N_QUERY
    result = run_suite(store, load_suite("cil-factorial", trials=TRIALS, protocol="regdb", direction="t2v"))
    assert_each_equals_its_eval(store, result, max_rank=50, no_gom=True, protocol="regdb", direction="t2v")


def test_a_local_cluster_of_processes_gives_the_threaded_numbers(store):
    pytest.importorskip("distributed")
    suite = load_suite("cil-factorial", trials=TRIALS)
    local = run_suite(store, suite, cluster="local", n_workers=2, threads_per_worker=1, gallery_chunk=32)
    threads = run_suite(store, suite)
    assert [comparable(r) for r in local.results] == [comparable(r) for r in threads.results]


def test_one_progress_bar_over_every_gallery_pass(store):
    import io

    from test_progress import assert_one_honest_bar, log_lines

    out = io.StringIO()
    run_suite(store, load_suite("cil-factorial", trials=TRIALS), progress=out, gallery_chunk=32)
    lines = log_lines(out.getvalue())
    assert_one_honest_bar(lines, ["positives", "scoring"])
    assert not any(rest.startswith("+") for _, rest in lines)  # every pass announced: the work never grew


def test_settings_spread_is_numpys_over_the_trials(store):
    for ddof in (1, 0):
        section = run_suite(store, load_suite("cil-factorial", trials=TRIALS, std_ddof=ddof)).to_dict()["suite"]
        for setting in ("query", "gallery", "both"):
            summary = section["settings"][setting]
            values = [ev["values"] for ev in section["evaluations"] if ev["setting"] == setting]
            assert summary["T"] == TRIALS and summary["trials"] == list(range(TRIALS))
            for metric in section["metrics"]:
                per_trial = np.array([v[metric] for v in values])
                assert summary["per_trial"][metric] == list(per_trial)
                assert summary["mean"][metric] == np.mean(per_trial)
                assert summary["std"][metric] == np.std(per_trial, ddof=ddof)
                assert summary["sem"][metric] == np.std(per_trial, ddof=1) / np.sqrt(TRIALS)  # s / sqrt(T) for either
                assert (summary["min"][metric], summary["max"][metric]) == (per_trial.min(), per_trial.max())
        clean = section["settings"]["clean"]
        assert clean["T"] == 1 and clean["std"]["mAP"] is None and clean["mean"]["mAP"] == section[
            "evaluations"][0]["values"]["mAP"]
        assert section["headline"] == {"setting": "both", "mean": section["settings"]["both"]["mean"],
                                       "std": section["settings"]["both"]["std"]}


def test_without_std_ddof_the_spread_is_the_sample_std(store):
    """docs/suites.md#the-result-json: std over the trials with ddof 1 unless the suite says otherwise."""
    section = run_suite(store, load_suite("cil-factorial", trials=TRIALS)).to_dict()["suite"]
    assert section["std_ddof"] == 1
    spread_seen = False
    for setting in ("query", "gallery", "both"):
        summary = section["settings"][setting]
        for metric in section["metrics"]:
            per_trial = np.array(summary["per_trial"][metric])
            assert summary["std"][metric] == np.std(per_trial, ddof=1)
            spread_seen |= summary["std"][metric] > 0
    assert spread_seen  # (with equal trials ddof 0 and 1 would agree)


def test_v8_spread_and_query_breakdown(store):
    v8 = spread([0.30, 0.28, 0.26], 1)
    assert v8["mean"] == pytest.approx(0.28) and v8["std"] == pytest.approx(0.02)
    assert spread([0.30, 0.28, 0.26], 0)["std"] == pytest.approx(0.0163, abs=5e-5)
    assert spread([0.5], 1)["std"] is None
    result = run_suite(store, load_suite("cil-factorial", trials=TRIALS))
    breakdown = result.to_dict()["suite"]["breakdown"]["query"]
    opened = streameval.open_store(store)
    from streameval.store.variants import variant_columns

    by_type, by_both = {}, {}
    for ev, r in zip(result.suite.evaluations, result.results):
        if ev.setting != "query":
            continue
        columns = variant_columns(opened, "query", ev.query)
        for q in np.flatnonzero(r.per_query["n_positives"] > 0):
            values = (r.per_query["ap"][q], r.per_query["inp"][q], r.per_query["first_hit_rank"][q])
            by_type.setdefault(str(columns["corruption_type"][q]), []).append(values)
            by_both.setdefault(f"{columns['corruption_type'][q]}/{columns['severity'][q]}", []).append(values)
    for expected, got in ((by_type, breakdown["by_type"]), (by_both, breakdown["by_type_severity"])):
        assert set(got) == set(expected)
        for key, rows in expected.items():
            ap, inp, rank = np.array(rows).T
            assert got[key] == {"n": len(rows), "mINP": inp.mean(), "mAP": ap.mean(), "R1": (rank <= 1).mean()}


def test_identical_values_spread_exactly_zero_and_counts_stay_integers():
    assert np.std([0.7] * 3, ddof=1) > 0  # numpy's mean rounds, leaving a residue ...
    same = spread([0.7] * 3, 1)
    assert same["std"] == 0.0 and same["sem"] == 0.0 and same["min"] == same["max"] == 0.7  # ... spread's does not
    assert spread([[0.1, 0.7], [0.1, 0.7], [0.1, 0.9]], 0)["std"][0] == 0.0  # point by point
    counts = spread([301, 301, 301], 1)
    assert counts["mean"] == 301 and isinstance(counts["mean"], int) and isinstance(counts["max"], int)
    assert spread([301, 302], 1)["mean"] == 301.5


def test_plans_presets_and_files(tmp_path):
    upstream = load_suite("cil-upstream", trials=3)
    assert len(upstream.evaluations) == 10 and len(upstream.groups()) == 7  # 1 + 3T evaluations, 1 + 2T galleries
    assert ("both-t2", ["both-t2"]) in upstream.groups()
    factorial = load_suite("cil-factorial")
    assert len(factorial.evaluations) == 31 and len(factorial.groups()) == 11 and factorial.note == FACTORIAL_NOTE
    assert factorial.groups()[0] == ("clean", ["clean"] + [f"corrupt-t{t}" for t in range(10)])
    path = tmp_path / "mine.toml"
    path.write_text('protocol = "market"\nheadline_setting = "query"\n[options]\nmax_rank = 10\n'
                    '[[evaluation]]\nquery = "corrupt-t0"\n[[evaluation]]\nquery = "corrupt-t0"\n'
                    '[[evaluation]]\nname = "mixed"\nquery = "corrupt-t0"\ngallery = "corrupt-t1"\ntrial = 1\n')
    mine = load_suite(str(path))
    assert [(e.name, e.setting, e.query, e.gallery) for e in mine.evaluations] == [
        ("query", "query", "corrupt-t0", "clean"), ("mixed", "both", "corrupt-t0", "corrupt-t1")]  # listed twice: once
    assert mine.options["max_rank"] == 10 and mine.headline_setting == "query"
    bad = {"empty.toml": 'protocol = "market"\n', "key.toml": 'plans = "x"\n',
           "twice.json": json.dumps({"evaluation": [{"name": "a", "query": "x"}, {"name": "a", "gallery": "y"}]})}
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(OptionError):
            load_suite(str(tmp_path / name))
    with pytest.raises(OptionError, match="preset"):
        load_suite("cil-nothing")


@pytest.mark.parametrize("options, words", [
    ({"verification": True}, "verification"), ({"no_gom": False}, "minmax"), ({"ranked_list": 3}, "ranked lists"),
    ({"protocol": "mars"}, "includes the queries")])
def test_what_a_stacked_pass_cannot_give_is_refused(store, options, words):
    with pytest.raises(OptionError, match=words):
        run_suite(store, load_suite("cil-factorial", trials=1, **options))


def test_a_missing_variant_is_refused_before_any_work(store):
    with pytest.raises(streameval.StoreError, match="corrupt-t2"):
        run_suite(store, load_suite("cil-factorial", trials=3))


def test_update_after_appends_to_every_gallery_variant_equals_a_full_suite(tmp_path):
    path = write_suite_store(str(tmp_path / "s.zarr"), seed=3, n_gallery=80)
    suite = load_suite("cil-factorial", trials=TRIALS, gom_norm="fixed:0:12", no_gom=False)
    run_suite(path, suite, state=str(tmp_path / "state"), gallery_chunk=32)
    rng = np.random.default_rng(9)
    for batch in range(2):
        n = 25
        gf = rng.integers(-2, 3, (n, DIM)).astype(np.float32)
        variants = {}
        for t in range(TRIALS):
            features, kind, severity = corrupted(rng, gf)
            variants[f"corrupt-t{t}"] = {"features": features, "corruption_type": kind, "severity": severity}
        append_gallery(path, gf, *ids(rng, n, True), variants=variants)
        updated = update_suite(path, str(tmp_path / "state"), gallery_chunk=32)
        full = run_suite(path, suite)
        assert [comparable(r) for r in updated.results] == [comparable(r) for r in full.results]
        assert updated.results[0].n_gallery == 80 + n * (batch + 1)
        assert set(updated.execution["update"]) == {"clean", "corrupt-t0", "corrupt-t1"}
    assert variant_names(streameval.open_store(path), "gallery") == ["clean", "corrupt-t0", "corrupt-t1"]


def test_the_command_line_end_to_end(store, tmp_path):
    out = tmp_path / "suite.json"
    run = CliRunner().invoke(main, ["suite", store, "cil-factorial", "--trials", str(TRIALS), "--json", str(out),
                                    "--format", "csv", "--per-evaluation", "--plot", str(tmp_path / "s.png")])
    assert run.exit_code == 0, run.output
    section = json.loads(out.read_text())["suite"]
    assert section["plan"] == "cil-factorial" and section["note"] == FACTORIAL_NOTE
    assert [ev["name"] for ev in section["evaluations"]][:2] == ["clean", "query-t0"]
    alone = streameval.evaluate(store, query_variant="corrupt-t1", gallery_variant="corrupt-t1", no_gom=True)
    assert section["evaluations"][-1]["values"]["mAP"] == alone.mAP
    assert (tmp_path / "s.png").stat().st_size > 1000
    assert "type, severity" not in run.stdout
    severity = CliRunner().invoke(main, ["suite", store, "cil-factorial", "--trials", "1", "--by-severity"])
    assert severity.exit_code == 0 and "type, severity" in severity.stdout
    again = CliRunner().invoke(main, ["suite", store, "cil-factorial", "--json", str(out)])
    assert "exists" in one_error_line(again) and again.exit_code == 2
    missing = CliRunner().invoke(main, ["suite", store, "cil-upstream", "--trials", "1"])
    assert "query-t0" in one_error_line(missing) and missing.exit_code == 3
    gom = CliRunner().invoke(main, ["suite", store, "cil-factorial", "--gom-norm", "minmax"])
    assert "minmax" in one_error_line(gom) and gom.exit_code == 2
