"""Protocols as data (docs/protocols.md): the presets are the records the spec
describes, a record survives JSON, user files parse to the record they state, every bad or
contradictory field is refused naming it, the overrides change exactly what they name, and
``streameval protocols`` lists the presets at once, without the engine's libraries.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from streameval.core.errors import OptionError
from streameval.protocols import (PRESETS, CameraRelation, Protocol, SgsSpec, TrialSpec, presets_table,
                                  resolve)

from cli_checks import cli, one_error_line

DOCS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "protocols.md"

MARKET = {
    "name": "market", "junk_pids": [-1], "x_same": "equal", "x_any": "none", "gallery_includes_queries": False,
    "cmc": "first-hit", "sgs": None, "reference_ap": "rectangle", "denominator": "skip", "trials": None,
    "query_cameras": None, "gallery_cameras": None, "directions": [], "draw_version": None,
}
SYSU_TRIALS = {"count": 10, "source": "draw", "path": None, "group": "pid-camera", "shots": 1, "seed": 0,
               "queries": "all", "cameras": [1, 2, 4, 5]}
# docs/protocols.md#2-the-presets, preset by preset: the fields that differ from market's
PRESET_FIELDS = {
    "market": {},
    "none": {"x_same": "none"},
    "cuhk03-sgs": {"cmc": "sgs", "sgs": {"mode": "sampled", "repeats": 10, "seed": 0, "camera_rule": "same-id-same-cam"},
                   "draw_version": 1},
    "sysu-all": {"x_any": [[3, 2]], "cmc": "identity-dedup", "trials": SYSU_TRIALS, "query_cameras": [3, 6],
                 "gallery_cameras": [1, 2, 4, 5], "draw_version": 1},
    "sysu-indoor": {"x_any": [[3, 2]], "cmc": "identity-dedup", "trials": {**SYSU_TRIALS, "cameras": [1, 2]},
                    "query_cameras": [3, 6], "gallery_cameras": [1, 2], "draw_version": 1},
    "regdb": {"x_same": "none", "directions": ["v2t", "t2v"]},
    "vehicleid": {"x_same": "none", "gallery_includes_queries": True, "draw_version": 1,
                  "trials": {"count": 10, "source": "draw", "path": None, "group": "pid", "shots": 1, "seed": 0,
                             "queries": "not-in-gallery", "cameras": []}},
    "mars": {"gallery_includes_queries": True, "reference_ap": "trapezoid"},
}
ALIASES = {"duke": "market", "msmt17": "market", "cuhk03-np": "market", "veri776": "market", "last": "none"}

SECTION_1_9_TOML = """\
name = "ir-to-rgb-lab"
junk_pids = [-1]
x_same = "equal"
x_any = [[3, 2]]
cmc = "identity-dedup"
[trials]
count = 10
source = "draw"      # "draw", "official:PATH", "mangye16-random"
group = "pid-camera" # draw groups: "pid" or "pid-camera"
shots = 1
seed = 0
"""
SECTION_1_9_RECORD = {**MARKET, "name": "ir-to-rgb-lab", "x_any": [[3, 2]], "cmc": "identity-dedup",
                      "trials": {**SYSU_TRIALS, "cameras": []}, "draw_version": 1}


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def refused(match: str, call, *args, **kwargs) -> str:
    with pytest.raises(OptionError, match=match) as info:
        call(*args, **kwargs)
    return str(info.value)


# --- presets --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PRESET_FIELDS)
def test_each_preset_is_the_record_of_section_1_8(name):
    assert resolve(name).to_record() == {**MARKET, "name": name, **PRESET_FIELDS[name]}


def test_every_preset_is_listed_and_described():
    assert [row[0] for row in presets_table()] == list(PRESET_FIELDS)
    for name, aliases, reproduces, reference in presets_table():
        assert reproduces and "\n" not in reproduces and reference and "\n" not in reference, name
        assert PRESETS[name].aliases == aliases


@pytest.mark.parametrize("alias", ALIASES)
def test_an_alias_resolves_to_its_presets_record(alias):
    assert resolve(alias) == resolve(ALIASES[alias])
    assert resolve(alias).name == ALIASES[alias]


ROUND_TRIPS = [resolve(name) for name in PRESET_FIELDS] + [
    resolve("cuhk03-sgs", camera_rule="separate-cameras", sgs_mode="both", seed=-7),
    Protocol(name="lab", junk_pids=(-1, 0), x_same=[[1, 2]], x_any=[[3, 2], [6, 5]], denominator="zero",
             trials={"count": 64, "source": "official:/data/perm.csv", "shots": 10, "seed": (1 << 63) - 1},
             query_cameras=(3, 6), gallery_cameras=(1, 2, 4, 5)),
]


@pytest.mark.parametrize("protocol", ROUND_TRIPS, ids=lambda p: p.name)
def test_records_round_trip_through_json(protocol):
    text = json.dumps(protocol.to_record())
    assert Protocol.from_record(json.loads(text)) == protocol
    assert json.dumps(Protocol.from_record(json.loads(text)).to_record()) == text  # same key order


def test_a_protocol_is_checked_again_when_resolved():
    assert resolve(resolve("sysu-all")) == resolve("sysu-all")


# --- the record: canonical form, draw_version -----------------------------------------------------


def test_fields_take_their_record_forms_and_are_made_canonical():
    protocol = Protocol(name="p", junk_pids=[5, -1, 5], x_same="none", x_any=[[3, 2], (1, 1), [3, 2]],
                        query_cameras=[6, 3], directions=["t2v", "v2t"], trials={"count": 2})
    assert protocol.junk_pids == (-1, 5)
    assert protocol.x_same == CameraRelation() and protocol.x_any == CameraRelation(pairs=((1, 1), (3, 2)))
    assert protocol.query_cameras == (3, 6) and protocol.directions == ("v2t", "t2v")
    assert protocol.trials == TrialSpec(count=2)
    assert Protocol(name="p", trials=TrialSpec(count=2, source="official:t.csv")).trials.path == "t.csv"


def test_pairs_are_ordered():
    assert Protocol(name="p", x_any=[[3, 2]]) != Protocol(name="p", x_any=[[2, 3]])


def test_draw_version_is_recorded_only_when_the_seeded_hash_picks_rows():
    sgs = resolve("cuhk03-sgs")
    assert [resolve("cuhk03-sgs", sgs_mode=mode).to_record()["draw_version"] for mode in ("sampled", "both", "expected")] \
        == [1, 1, None]
    assert resolve("sysu-all", trial_source="mangye16-random").to_record()["draw_version"] is None
    assert resolve("market", trials=3).to_record()["draw_version"] == 1
    record = sgs.to_record()
    for other in (2, None, True):
        message = refused("draw_version", Protocol.from_record, {**record, "draw_version": other})
        assert "other rows" in message
    del record["draw_version"]  # a hand-written record need not state it
    assert Protocol.from_record(record) == sgs


@pytest.mark.parametrize(("fields", "key"), [
    ({"junk_pids": [1 << 63]}, "junk_pids"),
    ({"junk_pids": [-(1 << 63)]}, "junk_pids"),  # reserved: marks a missing id chunk
    ({"junk_pids": "-1"}, "junk_pids"),
    ({"junk_pids": [1.0]}, "junk_pids"),
    ({"x_same": "same"}, "x_same"),
    ({"x_any": [[3, 2, 1]]}, "x_any"),
    ({"x_any": [["3", 2]]}, "x_any"),
    ({"x_same": CameraRelation(equal=True, pairs=((3, 2),))}, "x_same"),
    ({"gallery_includes_queries": 1}, "gallery_includes_queries"),
    ({"cmc": "second-hit"}, "cmc"),
    ({"reference_ap": "midpoint"}, "reference_ap"),
    ({"denominator": "all"}, "denominator"),
    ({"trials": {"count": 0}}, "trials.count"),
    ({"trials": {"count": 65}}, "trials.count"),
    ({"trials": {"count": True}}, "trials.count"),
    ({"trials": {"count": 10.0}}, "trials.count"),
    ({"trials": {"shots": 1}}, "trials.count"),  # required
    ({"trials": {"count": 2, "shots": 0}}, "trials.shots"),
    ({"trials": {"count": 2, "seed": 1 << 63}}, "trials.seed"),
    ({"trials": {"count": 2, "source": "random"}}, "trials.source"),
    ({"trials": {"count": 2, "source": "official"}}, "trials.path"),
    ({"trials": {"count": 2, "path": "t.csv"}}, "trials.path"),
    ({"trials": {"count": 2, "source": "official:a.csv", "path": "b.csv"}}, "trials.source"),
    ({"trials": {"count": 2, "group": "camera"}}, "trials.group"),
    ({"trials": {"count": 2, "queries": "some"}}, "trials.queries"),
    ({"trials": {"count": 2, "queries": "not-in-gallery"}}, "trials.queries"),
    ({"trials": {"count": 2, "source": "mangye16-random"}}, "trials.cameras"),
    ({"trials": {"count": 2, "source": "mangye16-random", "cameras": [1, 2], "shots": 10}}, "trials.shots"),
    ({"trials": {"count": 2, "cameras": [1, 1]}}, "trials.cameras"),
    ({"trials": {"count": 2, "cameras": [1, 3]}, "gallery_cameras": [1, 2]}, "trials.cameras"),
    ({"trials": {"count": 2, "colour": 1}}, "trials.colour"),
    ({"trials": 10}, "trials"),
    ({"cmc": "sgs"}, "sgs"),
    ({"sgs": {}}, "sgs"),  # an sgs table without cmc sgs (docs/protocols.md#3-your-own-protocol-file)
    ({"cmc": "sgs", "sgs": {"mode": "mean"}}, "sgs.mode"),
    ({"cmc": "sgs", "sgs": {"repeats": 0}}, "sgs.repeats"),
    ({"cmc": "sgs", "sgs": {"repeats": 100_001}}, "sgs.repeats"),
    ({"cmc": "sgs", "sgs": {"camera_rule": "separate-cameras"}}, "sgs.camera_rule"),  # x_same/x_any disagree
    ({"cmc": "sgs", "sgs": {}, "trials": {"count": 2}}, "trials"),
    ({"query_cameras": []}, "query_cameras"),
    ({"gallery_cameras": 1}, "gallery_cameras"),
    ({"directions": ["v2v"]}, "directions"),
    ({"name": ""}, "name"),
    ({"name": "two\nlines"}, "name"),
])
def test_a_bad_or_contradictory_field_is_refused_naming_it(fields, key):
    message = refused(re.escape(key), Protocol, **{"name": "p", **fields})
    assert message.startswith(key) or f" {key} " in message or f"field {key} " in message, message


def test_a_record_with_an_unknown_or_missing_key_is_refused():
    assert "colour" in refused("unknown field colour", Protocol.from_record, {**MARKET, "colour": "red"})
    refused("name is required", Protocol.from_record, {"cmc": "first-hit"})
    refused("table of fields", Protocol.from_record, ["market"])


# --- user files (docs/protocols.md#3-your-own-protocol-file) --------------------------------------


def test_the_section_1_9_example_parses_as_toml_and_as_json(tmp_path):
    toml = write(tmp_path, "lab.toml", SECTION_1_9_TOML)
    assert resolve(str(toml)).to_record() == SECTION_1_9_RECORD
    as_json = {key: value for key, value in SECTION_1_9_RECORD.items() if key != "draw_version"}
    assert resolve(write(tmp_path, "lab.json", json.dumps(as_json))).to_record() == SECTION_1_9_RECORD


def test_the_docs_example_is_the_section_1_9_example(tmp_path):
    example = re.search(r"```toml\n(.*?)```", DOCS_PAGE.read_text(), re.S).group(1)
    assert resolve(write(tmp_path, "lab.toml", example)).to_record() == SECTION_1_9_RECORD


def test_missing_fields_take_markets_values_and_the_name_the_files_stem(tmp_path):
    assert resolve(write(tmp_path, "mine.toml", "")).to_record() == {**MARKET, "name": "mine"}
    assert resolve(write(tmp_path, "mine.json", '{"denominator": "zero"}')).to_record() == \
        {**MARKET, "name": "mine", "denominator": "zero"}


def test_a_shown_record_is_a_protocol_file(tmp_path):
    for name in PRESET_FIELDS:
        shown = write(tmp_path, f"{name}.json", json.dumps(resolve(name).to_record()))
        assert resolve(shown) == resolve(name)


def test_an_official_table_named_in_a_file_is_found_beside_it(tmp_path, monkeypatch):
    write(tmp_path, "perm.csv", "trial,camera,pid,numbers\n")
    path = write(tmp_path, "sysu.toml", '[trials]\ncount = 10\nsource = "official:perm.csv"\n')
    monkeypatch.chdir("/")
    assert resolve(path).trials.path == str(tmp_path / "perm.csv")
    (tmp_path / "perm.csv").unlink()
    refused("trials.path: the official trial table .*perm.csv' is not a file", resolve, path)


@pytest.fixture(scope="module")
def small_store(tmp_path_factory) -> str:
    from streameval.tools.synth import synthesize

    path = tmp_path_factory.mktemp("protocol-store") / "s.zarr"
    synthesize(path, n_query=10, n_gallery=40, dim=4, n_ids=5, n_cams=2, seed=1)
    return str(path)


@pytest.mark.parametrize("table", ["../../../../../../../../etc/passwd", "/etc/passwd", "tables/../../outside.csv"])
def test_a_protocol_file_names_no_table_outside_its_folder(tmp_path, small_store, table):
    """A shared protocol file cannot make streameval read (and print) another file: its table is in
    the file's folder or below it."""
    folder = tmp_path / "shared"
    folder.mkdir()
    (tmp_path / "outside.csv").write_text("trial,camera,pid,images\n")
    path = write(folder, "lab.toml", f'[trials]\ncount = 2\nsource = "official:{table}"\n')
    refused(re.escape(f"protocol file '{path}': trials.path '{table}' is outside the protocol file's folder"),
            resolve, path)
    result = cli("eval", small_store, "-q", "--no-gom", "--protocol", path, code=2)
    assert "is outside the protocol file's folder" in one_error_line(result) and "root:" not in result.output


def test_a_file_that_is_not_a_trial_table_is_refused_without_its_text(tmp_path, small_store):
    write(tmp_path, "notes.csv", "SECRET-TOKEN-123,hunter2\n0,1,1,1\n")
    path = write(tmp_path, "lab.toml", '[trials]\ncount = 2\nsource = "official:notes.csv"\n')
    result = cli("eval", small_store, "-q", "--no-gom", "--protocol", path, code=2)
    line = one_error_line(result)
    assert f"{tmp_path / 'notes.csv'} line 1: the header must be trial,camera,pid,images" in line, line
    assert "SECRET" not in result.output and "hunter2" not in result.output


@pytest.mark.parametrize(("name", "text", "key"), [
    ("a.toml", 'colour = "red"\n', "colour"),
    ("a.toml", "[trials]\ncount = 10\nshuffle = true\n", "trials.shuffle"),
    ("a.toml", 'cmc = "second-hit"\n', "cmc"),
    ("a.toml", "[sgs]\nrepeats = 10\n", "sgs"),  # sgs table without cmc = "sgs"
    ("a.json", '{"x_any": [[3, 2]], "trials": {"count": 10, "queries": "not-in-gallery"}}', "trials.queries"),
    ("a.json", '{"junk_pids": [-1.5]}', "junk_pids"),
])
def test_a_bad_file_is_refused_naming_the_file_and_the_key(tmp_path, name, text, key):
    message = refused(re.escape(key), resolve, write(tmp_path, name, text))
    assert message.startswith(f"protocol file '{tmp_path / name}': ")


@pytest.mark.parametrize(("name", "text", "where"), [
    ("a.toml", 'cmc = "first-hit"\nx_same = equal\n', "line 2"),  # an unquoted string
    ("a.toml", "[trials]\ncount = 10\n[trials]\n", "line 3"),  # a table twice
    ("a.json", '{\n  "cmc": "first-hit",\n}', "line 3"),
    ("a.json", "[]", "top level must be a table"),
])
def test_a_file_the_parser_refuses_names_the_file_and_the_line(tmp_path, name, text, where):
    assert where in refused(re.escape(str(tmp_path / name)), resolve, write(tmp_path, name, text))


def test_a_file_that_cannot_be_read_is_an_option_error(tmp_path):
    refused("does not exist", resolve, str(tmp_path / "missing.toml"))
    (tmp_path / "latin.toml").write_bytes(b"name = '\xe9'")
    refused("not UTF-8", resolve, tmp_path / "latin.toml")
    refused("preset .* or a .toml / .json protocol file, got 'market.yaml'", resolve, "market.yaml")
    refused("got 42", resolve, 42)


# --- overrides (docs/protocols.md#4-changing-a-field-from-the-command-line) -----------------------


def test_overrides_change_exactly_the_field_they_name():
    market = resolve("market")
    assert resolve("market", junk_pids=(0, -1)) == replace(market, junk_pids=(-1, 0))
    assert resolve("market", denominator="zero") == replace(market, denominator="zero")
    assert resolve("market", cmc="identity-dedup") == replace(market, cmc="identity-dedup")
    assert resolve("sysu-all", cmc="first-hit").cmc == "first-hit"
    assert resolve("regdb", direction="t2v").directions == ("t2v",)
    assert resolve("regdb", direction="both").directions == ("v2t", "t2v")


def test_trial_overrides():
    sysu = resolve("sysu-all")
    assert resolve("sysu-all", trials=0) == replace(sysu, trials=None)
    assert resolve("market", trials=0) == resolve("market")
    assert resolve("sysu-all", trials=3, shots=10, seed=-5).trials == replace(sysu.trials, count=3, shots=10, seed=-5)
    assert resolve("market", trials=4).trials == TrialSpec(count=4, source="draw", group="pid-camera", shots=1, seed=0)
    assert resolve("sysu-indoor", trial_source="mangye16-random").trials == \
        replace(resolve("sysu-indoor").trials, source="mangye16-random")
    assert resolve("vehicleid", seed=3).trials.seed == 3


def test_an_official_trial_source_is_a_file(tmp_path, monkeypatch):
    write(tmp_path, "perm.csv", "trial,camera,pid,numbers\n")
    monkeypatch.chdir(tmp_path)
    trials = resolve("sysu-all", trial_source="official:perm.csv", shots=10).trials
    assert (trials.source, trials.path, trials.shots) == ("official", str(tmp_path / "perm.csv"), 10)
    back = resolve(resolve("sysu-all", trial_source="official:perm.csv"), trial_source="draw").trials
    assert (back.source, back.path) == ("draw", None)
    refused("is not a file", resolve, "sysu-all", trial_source="official:nothing.csv")
    refused("trial_source official:PATH needs the path", resolve, "sysu-all", trial_source="official:")


def test_sgs_overrides():
    sgs = resolve("cuhk03-sgs")
    assert resolve("cuhk03-sgs", sgs_mode="both", sgs_repeats=2000, seed=9).sgs == \
        SgsSpec(mode="both", repeats=2000, seed=9, camera_rule="same-id-same-cam")
    separate = resolve("cuhk03-sgs", camera_rule="separate-cameras")
    assert separate == replace(sgs, x_same=CameraRelation(), x_any=CameraRelation(equal=True),
                               sgs=replace(sgs.sgs, camera_rule="separate-cameras"))
    assert resolve(separate, camera_rule="same-id-same-cam") == sgs


@pytest.mark.parametrize(("spec", "overrides", "named"), [
    ("market", {"sgs_mode": "expected"}, "sgs_mode does not apply"),
    ("sysu-all", {"sgs_repeats": 5}, "sgs_repeats does not apply"),
    ("market", {"camera_rule": "separate-cameras"}, "camera_rule does not apply"),
    ("market", {"trial_source": "draw"}, "trial_source does not apply"),
    ("sysu-all", {"trials": 0, "shots": 10}, "shots does not apply"),
    ("market", {"seed": 1}, "seed does not apply"),
    ("cuhk03-sgs", {"sgs_mode": "expected", "seed": 1}, "seed does not apply"),
    ("sysu-all", {"trial_source": "mangye16-random", "seed": 1}, "seed does not apply"),
    ("market", {"direction": "v2t"}, "direction does not apply"),
    ("market", {"cmc": "sgs"}, "cmc 'sgs'"),
    ("cuhk03-sgs", {"cmc": "first-hit"}, "cmc 'first-hit'"),
    ("cuhk03-sgs", {"trials": 10}, "trials: not combined"),
    ("market", {"trials": 65}, "trials must be a non-negative integer up to 64"),
    ("market", {"trials": -1}, "trials must be a non-negative integer up to 64"),
    ("market", {"trials": "ten"}, "trials must be an integer"),
    ("sysu-all", {"trial_source": "matlab"}, "trial_source must be"),
    ("sysu-all", {"trial_source": "mangye16-random", "shots": 10}, "trials.shots must be 1"),
    ("sysu-all", {"shots": 0}, "trials.shots must be a positive integer up to"),
    ("cuhk03-sgs", {"sgs_mode": "mean"}, "sgs.mode must be"),
    ("cuhk03-sgs", {"camera_rule": "open-reid"}, "camera_rule must be"),
    ("regdb", {"direction": "x2y"}, "direction must be"),
    ("market", {"junk_pids": [1 << 64]}, "junk_pids must be"),
    ("market", {"denominator": "none"}, "denominator must be"),
])
def test_an_override_that_does_not_apply_or_is_bad_is_refused_naming_it(spec, overrides, named):
    refused(re.escape(named), resolve, spec, **overrides)


# --- the command: streameval protocols ------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """``streameval ARGS`` in a fresh process; its last stdout line lists the heavy modules it loaded."""
    code = textwrap.dedent("""
        import atexit, json, sys
        atexit.register(lambda: print(json.dumps(sorted(
            m for m in ("numpy", "numba", "zarr", "dask", "distributed", "matplotlib") if m in sys.modules))))
        from streameval.entry import main
        sys.argv = ["streameval", *sys.argv[1:]]
        main()
    """)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def test_streameval_protocols_lists_every_preset_without_the_engines_libraries():
    proc = run_cli("protocols")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    *listing, loaded = proc.stdout.splitlines()
    assert json.loads(loaded) == []
    text = "\n".join(listing)
    for name, aliases, reproduces, reference in presets_table():
        heading = f"{name} (aliases: {', '.join(aliases)})" if aliases else name
        assert f"{heading}\n  reproduces: {reproduces}\n  reference:  {reference}" in text


def test_streameval_protocols_show_prints_the_resolved_record(tmp_path):
    proc = run_cli("protocols", "--show", "last")
    assert proc.returncode == 0, proc.stderr
    assert json.loads("\n".join(proc.stdout.splitlines()[:-1])) == resolve("none").to_record()
    path = write(tmp_path, "lab.toml", SECTION_1_9_TOML)
    proc = run_cli("protocols", "--show", str(path))
    assert json.loads("\n".join(proc.stdout.splitlines()[:-1])) == SECTION_1_9_RECORD


@pytest.mark.parametrize("spec", ["marketplace", "bad.toml"])
def test_streameval_protocols_show_of_a_bad_protocol_is_one_error_line(tmp_path, spec):
    write(tmp_path, "bad.toml", "[trials]\ncount = 100\n")
    proc = run_cli("protocols", "--show", str(tmp_path / spec) if spec.endswith(".toml") else spec)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("error: "), proc.stderr
