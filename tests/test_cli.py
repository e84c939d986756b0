"""The command line end to end: synth, eval (--json FILE / -, --per-query), convert, validate, help,
and bad options (exit 2, no traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from streameval import evaluate, open_store
from streameval.cli import main

SYNTH_ARGS = ["--queries", "60", "--gallery", "500", "--dim", "16", "--ids", "12", "--cams", "3",
              "--junk", "0.1", "--distractors", "0.1", "--open-queries", "0.1", "--seed", "7"]
RESULT_KEYS = ("n_queries", "n_valid_queries", "n_open_queries", "n_gallery", "metric", "protocol", "cmc",
               "rank1", "rank5", "rank10", "mAP", "mAP_trapezoid", "mINP")


def run(*args, ok=True):
    result = CliRunner().invoke(main, [str(a) for a in args])
    if ok:
        assert result.exit_code == 0, (result.exit_code, result.output, result.exception)
    return result


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "synth.zarr"
    result = run("synth", path, *SYNTH_ARGS)
    assert "synth gallery: 500/500 rows (100%)" in result.stderr  # progress, not quiet
    assert "500 gallery rows, dim 16" in result.stdout
    return path


@pytest.fixture(scope="module")
def expected(store_path):
    return evaluate(store_path).to_dict()


def assert_same_result(got: dict, want: dict) -> None:
    for key in RESULT_KEYS:
        assert key in got, key
        assert got[key] == want[key], (key, got[key], want[key])


def test_synth_writes_the_requested_store(store_path):
    store = open_store(store_path)
    assert (len(store.query), len(store.gallery), store.dim) == (60, 500, 16)
    assert store.gallery.features.dtype == np.float32
    pids = store.gallery.pids[:]
    assert (pids == -1).any() and (pids == 0).any()
    assert (store.query.pids[:] > 12).any()


def test_synth_quiet_float16_and_refusal(tmp_path):
    path = tmp_path / "h.zarr"
    result = run("synth", path, "--queries", "5", "--gallery", "40", "--dim", "4", "--ids", "3",
                 "--dtype", "float16", "--chunk-rows", "8", "--metric", "cosine", "-q")
    assert result.stdout == "" and result.stderr == ""
    store = open_store(path)
    assert store.gallery.features.dtype == np.float16 and store.gallery.chunk_rows == 8
    assert store.default_metric == "cosine"
    again = run("synth", path, "--queries", "6", "-q", ok=False)
    assert again.exit_code == 2  # an output that exists is a usage error, refused before any work
    assert again.stderr.strip() == f"error: '{path}' already exists; pass --overwrite to replace it"
    assert len(open_store(path).query) == 5
    run("synth", path, "--queries", "6", "--gallery", "40", "--dim", "4", "--ids", "3", "-q", "--overwrite")
    assert len(open_store(path).query) == 6


def test_synth_noise(tmp_path):
    """--noise is synthesize's noise; a value that is no noise scale is refused before any work."""
    from streameval.tools.synth import synthesize

    small = ["--queries", "8", "--gallery", "40", "--dim", "4", "--ids", "3", "-q"]
    run("synth", tmp_path / "n.zarr", *small, "--noise", "1.7")
    expected = synthesize(tmp_path / "e.zarr", n_query=8, n_gallery=40, dim=4, n_ids=3, n_cams=6, noise=1.7)
    np.testing.assert_array_equal(open_store(tmp_path / "n.zarr").gallery.features[:], expected.gallery.features[:])
    for bad, message in (("-1", "'--noise': must be a finite number >= 0, got -1.0"),
                         ("nan", "'--noise': must be a finite number >= 0, got nan")):
        refused = run("synth", tmp_path / "bad.zarr", *small, "--noise", bad, ok=False)
        assert refused.exit_code == 2
        assert len(refused.stderr.strip().splitlines()) == 1 and refused.stderr.startswith("error: ")
        assert message in refused.stderr
        assert not (tmp_path / "bad.zarr").exists()


def test_eval_json_file(store_path, expected, tmp_path):
    out = tmp_path / "result.json"
    result = run("eval", store_path, "--json", out)
    got = json.loads(out.read_text())
    assert_same_result(got, expected)
    assert got["metric"] == "euclidean" and got["protocol"]["name"] == "market"
    assert got["n_queries"] == 60 and got["n_gallery"] == 500
    assert got["n_open_queries"] > 0 and got["n_valid_queries"] + got["n_open_queries"] == 60
    assert len(got["cmc"]) == 50 and got["rank1"] == got["cmc"][0] and got["rank10"] == got["cmc"][9]
    assert 0 < got["mAP"] <= 1 and "per_query" not in got
    assert "mAP" in result.stdout  # the summary table


def test_eval_json_stdout(store_path, expected):
    result = run("eval", store_path, "--json", "-")  # the summary table goes to stderr
    got = json.loads(result.stdout)
    assert_same_result(got, expected)
    assert "mAP" in result.stderr


def test_eval_options_reach_the_engine(store_path):
    result = run("eval", store_path, "--json", "-", "-q", "--metric", "cosine", "--protocol", "none",
                 "--max-rank", "5", "--precision", "float64", "--query-block", "7", "--gallery-chunk", "64",
                 "--memory-budget", "64MiB", "--workers", "2", "--junk-pids", "-1,0")
    got = json.loads(result.stdout)
    want = evaluate(store_path, metric="cosine", protocol="none", max_rank=5, precision="float64",
                    junk_pids=(-1, 0)).to_dict()
    assert_same_result(got, want)
    assert got["options"] == {"precision": "float64", "std_ddof": 1} and got["protocol"]["junk_pids"] == [-1, 0]
    assert got["run"]["query_block"] == 7 and got["run"]["gallery_chunk"] == 64 and got["run"]["workers"] == 2
    assert len(got["cmc"]) == 5 and got["rank10"] is None


def test_eval_per_query(store_path, expected):
    got = json.loads(run("eval", store_path, "--json", "-", "--per-query", "-q").stdout)
    assert_same_result(got, expected)
    per_query = got["per_query"]
    assert set(per_query) == {"ap", "ap_trapezoid", "inp", "first_hit_rank", "n_positives", "counted", "rep_area",
                              "fr_area"}
    assert all(len(v) == 60 for v in per_query.values())
    open_rows = [i for i, n in enumerate(per_query["n_positives"]) if n == 0]
    assert len(open_rows) == got["n_open_queries"]
    assert all(per_query["ap"][i] is None and per_query["first_hit_rank"][i] == -1 for i in open_rows)
    valid_ap = [a for a in per_query["ap"] if a is not None]
    assert np.isclose(np.mean(valid_ap), got["mAP"], rtol=0, atol=1e-12)


def test_eval_refuses_to_overwrite_json(store_path, expected, tmp_path):
    out = tmp_path / "result.json"
    out.write_text("precious\n")
    result = run("eval", store_path, "--json", out, ok=False)
    assert result.exit_code == 2
    assert "exists; pass --overwrite" in result.stderr
    assert "Traceback" not in result.output
    assert out.read_text() == "precious\n"
    run("eval", store_path, "--json", out, "--overwrite", "-q")
    assert_same_result(json.loads(out.read_text()), expected)


@pytest.mark.parametrize("command", [[], ["eval"], ["synth"], ["convert"], ["validate"]])
def test_help(command):
    for flag in ("--help", "-h"):
        result = run(*command, flag)
        usage = result.stdout.splitlines()[0]
        assert usage.startswith("Usage: ") and " ".join(command) in usage
        assert "Options:" in result.stdout and "Traceback" not in result.output


def help_sections(command: str) -> dict:
    """{heading: the long names of the options listed under it}, in the order --help prints them."""
    sections: dict = {}
    for line in run(command, "--help").stdout.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            heading = sections.setdefault(line[:-1], [])
        elif sections and line.startswith("  -"):
            heading.append(next(word.strip(",") for word in line.split() if word.startswith("--")))
    return sections


RESULT_SECTIONS = ["Options", "Metrics", "Protocol", "Open-set & verification", "Ranked lists", "Execution", "Output"]


@pytest.mark.parametrize("command, headings", [
    ("eval", [*RESULT_SECTIONS[:5], "Re-ranking", *RESULT_SECTIONS[5:], "Reading"]), ("update", RESULT_SECTIONS),
    ("suite", ["Options", "Execution", "Output"]), ("suite-update", ["Options", "Execution", "Output"])])
def test_help_lists_the_options_by_section(command, headings):
    sections = help_sections(command)
    assert list(sections) == headings and all(sections.values())
    listed = [name for names in sections.values() for name in names]
    options = [p for p in main.commands[command].params if p.param_type_name == "option"]
    expected = [next(n for n in p.opts + p.secondary_opts if n.startswith("--")) for p in options] + ["--help"]
    assert sorted(listed) == sorted(expected)  # each option once, names unchanged
    where = {name: heading for heading, names in sections.items() for name in names}
    for name, heading in {"--max-rank": "Metrics", "--gom-bins": "Metrics", "--protocol": "Protocol",
                          "--trials": "Protocol", "--fpir": "Open-set & verification", "--far": "Open-set & verification",
                          "--ranked-list": "Ranked lists", "--workers": "Execution", "--json": "Output",
                          "--ranks": "Output", "--key": "Reading", "--convert-to": "Reading",
                          "--state": "Options", "--help": "Options"}.items():
        if name in where and heading in headings:
            assert where[name] == heading, name


def test_version():
    assert "0.1.0" in run("--version").stdout


@pytest.mark.parametrize("args, message", [
    (["eval", "{store}", "--metric", "foo"], "Invalid value for '--metric'"),
    (["eval", "{store}", "--memory-budget", "lots"], "cannot read a memory size from 'lots'"),
    (["eval", "{store}", "--protocol", "cuhk"], "protocol must be a preset"),
    (["eval", "{store}", "--max-rank", "0"], "Invalid value for '--max-rank'"),
    (["eval", "{store}", "--junk-pids", "a,b"], "expected comma-separated integers"),
    (["eval", "{store}", "--workers", "zero"], "Invalid value for '--workers'"),
    (["eval", "{store}", "--precision", "float16"], "Invalid value for '--precision'"),
    (["eval", "{store}", "--bogus"], "No such option"),
    (["eval"], "Missing argument 'STORE'"),
    (["synth", "{tmp}/x.zarr", "--junk", "1.5"], "Invalid value for '--junk'"),
    (["synth", "{tmp}/x.zarr", "--dtype", "float64"], "Invalid value for '--dtype'"),
    (["synth", "{tmp}/x.zarr", "--queries", "0"], "Invalid value for '--queries'"),
    (["synth", "{tmp}/x.zarr", "--junk", "0.6", "--distractors", "0.6"], "junk_frac + distractor_frac"),
    (["convert", "{tmp}/missing.npz", "{tmp}/x.zarr"], "does not exist"),
    (["frobnicate"], "No such command"),
])
def test_bad_options_exit_2_without_traceback(store_path, tmp_path, args, message):
    args = [a.format(store=store_path, tmp=tmp_path) for a in args]
    result = run(*args, ok=False)
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit)
    assert message in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr  # one line
    assert "Traceback" not in result.output
    assert not (tmp_path / "x.zarr").exists()


def _npz_arrays(seed=0):
    rng = np.random.default_rng(seed)
    centres = 2 * rng.standard_normal((9, 10))
    qp, gp = rng.integers(1, 9, 30), rng.integers(1, 9, 200)
    return {
        "qf": (centres[qp] + rng.standard_normal((30, 10))).astype(np.float32), "q_pids": qp,
        "q_camids": rng.integers(0, 3, 30),
        "gf": (centres[gp] + rng.standard_normal((200, 10))).astype(np.float32), "g_pids": gp,
        "g_camids": rng.integers(0, 3, 200),
    }


def test_convert_end_to_end(tmp_path):
    data = _npz_arrays()
    np.savez_compressed(tmp_path / "feats.npz", **data)
    out = tmp_path / "feats.zarr"
    result = run("convert", tmp_path / "feats.npz", out, "--chunk-rows", "64", "--metric", "sqeuclidean")
    assert "30 queries, 200 gallery rows, dim 10, float32, 64 rows per chunk, default metric sqeuclidean" in result.stdout
    assert "ok:" in run("validate", out).stdout
    got = json.loads(run("eval", out, "--json", "-", "-q").stdout)
    assert got["metric"] == "sqeuclidean"
    assert_same_result(got, evaluate(data, metric="sqeuclidean").to_dict())
    # refuses to overwrite (a usage error: exit 2, before reading the input), then replaces with --overwrite
    again = run("convert", tmp_path / "feats.npz", out, ok=False)
    assert again.exit_code == 2 and again.stderr.startswith("error: ") and "already exists" in again.stderr
    run("convert", tmp_path / "feats.npz", out, "--overwrite", "--dtype", "float16")
    assert open_store(out).gallery.features.dtype == np.float16


def test_convert_bad_input_exits_3(tmp_path):
    data = _npz_arrays()
    del data["g_camids"]
    np.savez(tmp_path / "bad.npz", **data)
    result = run("convert", tmp_path / "bad.npz", tmp_path / "out.zarr", ok=False)
    assert result.exit_code == 3
    assert result.stderr.strip().splitlines() == [
        f"error: '{tmp_path / 'bad.npz'}': input arrays lack 'gallery_camids' (or its short name 'g_camids'); "
        "it holds: g_pids (200,) int64, gf (200, 10) float32, q_camids (30,) int64, q_pids (30,) int64, "
        "qf (30, 10) float32; name it with --key g_camids=NAME"
    ]
    assert not (tmp_path / "out.zarr").exists()


def test_real_processes_synth_then_eval(tmp_path):
    """The installed entry point, as a user runs it: stdout of --json - is pure JSON."""
    cli = [sys.executable, "-m", "streameval.cli"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    path = tmp_path / "p.zarr"
    synth = subprocess.run(cli + ["synth", str(path), *SYNTH_ARGS, "-q"], capture_output=True, text=True,
                           timeout=120, stdin=subprocess.DEVNULL, env=env)
    assert synth.returncode == 0, synth.stderr
    proc = subprocess.run(cli + ["eval", str(path), "--json", "-", "--workers", "2"], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL, env=env)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert_same_result(got, evaluate(path).to_dict())
    assert "mAP" in proc.stderr and "Traceback" not in proc.stderr


GOM_KEYS = ("tau", "mRP", "mVP", "mReP", "mFR", "mReP_max", "tau_max", "mVP_max", "MREP", "MFR", "tau_nz",
            "B", "normalisation", "dmin", "dmax")


def test_eval_json_holds_gom_and_matches_the_api(store_path):
    got = json.loads(run("eval", store_path, "--json", "-", "-q", "--gom-bins", "20", "--gom-b", "50").stdout)
    want = evaluate(store_path, gom_bins=20, gom_b=50).to_dict()
    for key in GOM_KEYS:
        assert got["gom"][key] == want["gom"][key], key
    assert len(got["gom"]["tau"]) == 21 and got["gom"]["B"] == 50 and got["gom"]["normalisation"] == "minmax"
    assert got["gom"]["mFR"] is not None and got["gom"]["mReP"] is not None  # the store mixes Q+ and Q-
    no_gom = json.loads(run("eval", store_path, "--json", "-", "-q", "--no-gom").stdout)
    assert no_gom["gom"] is None and no_gom["mAP"] == got["mAP"]


def test_eval_summary_names_gom_time_rate_and_bytes(store_path):
    result = run("eval", store_path, "--gom-norm", "fixed:0:20")
    out = result.stdout
    assert "GOM (fixed:0:20" in out and "mReP_max" in out and "MFR" in out
    assert "pairs/s" in out and "MiB" in out
    assert "streameval: 100%" in result.stderr  # non-interactive progress lines


def test_bad_gom_options_exit_2(store_path):
    for args in (["--gom-norm", "fixed:2:1"], ["--gom-norm", "maxmin"], ["--gom-bins", "0"], ["--gom-vp", "x"]):
        result = run("eval", store_path, "-q", *args, ok=False)
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output


def test_plot_draws_a_png_and_refuses_to_overwrite(store_path, tmp_path):
    result_json = tmp_path / "result.json"
    run("eval", store_path, "-q", "--json", result_json)
    png = tmp_path / "curves.png"
    run("plot", result_json, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    before = png.stat().st_mtime_ns
    refused = run("plot", result_json, png, ok=False)
    assert refused.exit_code == 2 and png.stat().st_mtime_ns == before
    not_json = tmp_path / "bad.json"
    not_json.write_text("{}")
    bad = run("plot", not_json, tmp_path / "x.png", ok=False)
    assert bad.exit_code == 3 and "not a streameval result" in bad.output


def test_storage_options_are_parsed_and_typed():
    from streameval.cli import _key_values

    assert _key_values(None, None, ("anon=true", "retries=3", "endpoint_url=http://x")) == {
        "anon": True, "retries": 3, "endpoint_url": "http://x"}
