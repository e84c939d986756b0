"""Progress that tells the truth: one bar per run, advancing with the work (pairs scored, bytes
read), naming the pass under way, with an ETA; and a run's elapsed time split into named phases,
the bar's time being one of them.  Real runs (threaded scheduler, a LocalCluster of processes,
incremental updates) feed an in-memory stream."""

from __future__ import annotations

import io
import re
from collections import Counter

import numpy as np
import pytest

import streameval
from streameval.engine import graph
from streameval.core import progress
from streameval.present import report
from streameval.run.settings import Settings
from streameval.engine.plan import Plan
from streameval.core.progress import RANGE_PAIR_OVERHEAD, Bar, Reporter, key_work, pairs_work, read_work, work_key

N_QUERY, N_GALLERY, DIM, CHUNK = 200, 6000, 16, 256
LINE = re.compile(r"(streameval(?: update| suite)?): (\d+)% (.*)")


def random_rows(rng, n, scale=1.0):
    return (scale * rng.standard_normal((n, DIM))).astype(np.float32), rng.integers(1, 40, n), rng.integers(0, 4, n)


def write_problem(path) -> str:
    rng = np.random.default_rng(0)
    streameval.write_store(path, *random_rows(rng, N_QUERY), *random_rows(rng, N_GALLERY), chunk_rows=CHUNK)
    return str(path)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    return write_problem(tmp_path_factory.mktemp("progress") / "s.zarr")


def log_lines(text: str) -> list[tuple[int, str]]:
    """(percent, rest) of every progress line; any other line fails the test."""
    lines = []
    for line in text.splitlines():
        match = LINE.fullmatch(line)
        assert match, f"not a progress line: {line!r}"
        lines.append((int(match.group(2)), match.group(3)))
    return lines


def assert_one_honest_bar(lines, passes) -> None:
    percents = [percent for percent, _ in lines]
    assert percents == sorted(percents), percents  # never goes back
    assert percents.count(100) == 1 and percents[-1] == 100
    assert lines[-1][1].startswith(", ".join(passes) + " in ")
    for name in passes:
        assert any(name in rest for _, rest in lines[:-1]), (name, lines)
    assert any("eta " in rest for percent, rest in lines if percent < 100)


def test_work_of_each_pass_is_pairs_and_bytes(store_path):
    store = streameval.open_store(store_path)
    plan = Plan(query_block=150, gallery_chunk=512, workers=2)  # 2 query blocks, 12 chunks
    settings, meta = Settings.parse(store), graph.Metadata()
    built = graph.build(store.query, (graph.Part(store.gallery, 0),), plan, settings.scoring(DIM, meta), meta)
    work = Counter()
    for key in built.__dask_graph__():
        if (weight := key_work(key)) is not None:
            work[weight[0]] += weight[1]
    gallery_bytes = graph.rows_bytes(store.gallery, N_GALLERY)
    reads = 2 * read_work(gallery_bytes)  # each block reads the gallery
    assert work["scoring"] == pairs_work(N_QUERY, N_GALLERY, DIM) + reads
    assert work["range"] == pairs_work(N_QUERY, N_GALLERY, DIM, RANGE_PAIR_OVERHEAD) + reads  # extremes only
    assert work["range"] < work["scoring"]
    assert work["positives"] == read_work(2 * gallery_bytes + graph.rows_bytes(store.query, N_QUERY))
    assert work["positives"] < 0.1 * sum(work.values())  # reading ids and features, no pairs
    assert set(work) == {"positives", "range", "scoring"}  # merges carry none


def test_threaded_run_draws_one_bar_weighted_by_work(store_path, monkeypatch):
    monkeypatch.setattr(progress, "LOG_STEP", 1)  # a line per percent: every step can be checked
    out = io.StringIO()
    result = streameval.evaluate(store_path, gallery_chunk=CHUNK, progress=out)
    lines = log_lines(out.getvalue())
    assert_one_honest_bar(lines, ["positives", "range", "scoring"])
    assert lines[-2][0] == 99  # every task's work was counted before the end
    # the positives pass only reads: by 10% of the bar it is over (counted in tasks, it was a third)
    assert all(percent < 10 for percent, rest in lines[:-1] if "positives" in rest)
    assert lines[-1][1].endswith(f" in {result.run['phases']['passes']:.2f} s")


def test_phases_add_up_to_the_elapsed_time_and_the_summary_says_so(store_path, tmp_path):
    out = io.StringIO()
    result = streameval.evaluate(store_path, gallery_chunk=CHUNK, progress=out, state=tmp_path / "state")
    phases = result.run["phases"]
    assert list(phases) == ["setup", "compiling kernels", "passes", "saving state", "metrics"]
    assert result.run["elapsed_s"] == sum(phases.values()) and all(s >= 0 for s in phases.values())
    bar_seconds = re.search(r" in (\d+\.\d\d) s$", out.getvalue().splitlines()[-1]).group(1)

    result.add_phase("writing JSON", 0.25)
    assert result.run["elapsed_s"] == pytest.approx(sum(phases.values()) + 0.25)
    assert result.run["pairs_per_s"] == result.run["pairs"] / result.run["elapsed_s"]
    line = report.summary(result).splitlines()[-1]
    total, parts = re.fullmatch(r"  (\d+\.\d\d) s = (.*)", line).groups()
    seconds = dict(reversed(re.fullmatch(r"(\d+\.\d\d) s (.+)", part).groups()) for part in parts.split(" + "))
    assert list(seconds) == [*(report.PHASE_NOTES.get(name, name) for name in phases), "writing JSON"]
    assert seconds["passes (the bar)"] == bar_seconds  # what the bar showed, plus named remainders
    assert seconds["writing JSON"] == "0.25"
    assert sum(round(100 * float(value)) for value in seconds.values()) == round(100 * float(total))
    # each part is printed to the hundredth, as the bar prints its time: the total is their sum
    assert float(total) == pytest.approx(result.run["elapsed_s"], abs=0.005 * len(seconds))


def test_update_draws_one_bar_over_both_computes(tmp_path):
    store, state = write_problem(tmp_path / "u.zarr"), tmp_path / "u.state"
    streameval.evaluate(store, state=state)
    rng = np.random.default_rng(1)
    streameval.append_gallery(store, *random_rows(rng, 1000, scale=10.0))  # new positives, a new maximum distance
    out = io.StringIO()
    result = streameval.update(store, state, gallery_chunk=CHUNK, progress=out)
    assert result.run["update"]["queries_rescored"] == N_QUERY
    lines = log_lines(out.getvalue())
    assert all(line.startswith("streameval update: ") for line in out.getvalue().splitlines())
    assert_one_honest_bar(lines, ["positives", "range", "scoring", "rescoring"])
    note = [(percent, rest) for percent, rest in lines if rest.startswith("+rescoring: the work left grew")]
    assert len(note) == 1 and 0 < note[0][0] < 100  # the total grew once, after the first compute, and said so
    phases = result.run["phases"]
    assert list(phases) == ["setup", "loading state", "compiling kernels", "passes", "saving state", "metrics"]
    assert result.run["elapsed_s"] == sum(phases.values())


def test_bar_grows_without_going_back_and_gives_an_eta_from_the_work_rate():
    now = [0.0]
    out = io.StringIO()
    bar = Bar(Reporter("t", out), clock=lambda: now[0])
    bar.expect("scoring", 100)
    first = {name: work_key(name, work) for name, work in (("positives", 10), ("range", 90))}
    assert sorted(bar.add_graph([*first.values(), "merge-abc"])) == sorted(first.values())
    bar.start(now[0])
    now[0] = 1.0
    bar.finished(first["positives"])
    now[0] = 2.0
    bar.finished(first["range"])
    second = {name: work_key(name, work) for name, work in (("scoring", 100), ("rescoring", 300))}
    bar.add_graph(second.values())
    now[0] = 4.0
    bar.finished(second["scoring"])
    bar.finished("merge-abc")  # no work: nothing drawn
    bar.finished(second["rescoring"])
    now[0] = 10.0
    bar.close(now[0])
    assert out.getvalue().splitlines() == [
        "t: 0% positives, 0.0 s, eta estimating",
        # 100 of 200 units in 2 s, the rest (scoring) taken to cost as much: but it has not run yet
        "t: 50% scoring, 2.0 s, eta estimating",
        "t: 50% +rescoring: the work left grew 4.0x (the rest of the bar covers it)",
        # 50 + 50 * 100/400 (scoring and rescoring taken to cost the same); rescoring not run yet
        "t: 62% rescoring, 4.0 s, eta estimating",
        "t: 99% rescoring, 4.0 s, eta 0 s",  # all counted; 100 only when the run's passes are over
        "t: 100% positives, range, scoring, rescoring in 10.00 s",
    ]


def fake_run(passes, workers: int = 1):
    """A Bar fed tasks finishing on a fake clock: ``passes`` lists (pass, work a task, tasks, seconds
    a task), run one pass after the other on ``workers`` workers (their tasks finish together).
    Returns the bar, its drawing, and its ETA and fraction after each task."""
    now = [0.0]
    out = io.StringIO()
    bar = Bar(Reporter("t", out), clock=lambda: now[0], workers=workers)
    keys = {name: [work_key(name, work) for _ in range(count)] for name, work, count, _ in passes}
    bar.add_graph([key for named in keys.values() for key in named])
    bar.start(now[0])
    etas, fractions = [], []
    for name, _, _, seconds in passes:
        for i, key in enumerate(keys[name]):
            now[0] += seconds if i % workers == 0 else 0.0
            bar.finished(key)
            etas.append(bar.eta())
            fractions.append(bar.fraction)
    return bar, out.getvalue(), etas, fractions


ISSUE_RUN = [("positives", 10, 1, 0.1), ("range", 100, 10, 0.2), ("scoring", 100, 10, 2.6)]


def test_the_eta_weighs_each_pass_by_its_measured_cost():
    """A quick range pass (10 tasks of 0.2 s) before a scoring pass of the same work that takes 13x
    longer (10 tasks of 2.6 s): no ETA while the scoring's cost is unknown (measured after 2 of its
    tasks), then the time truly left; from then on the bar advances in proportion to time."""
    _, drawn, etas, fractions = fake_run(ISSUE_RUN)
    assert etas[:12] == [None] * 12  # scoring not yet run, or too little of it
    assert etas[12:] == pytest.approx([2.6 * n for n in range(8, -1, -1)], abs=1e-9)
    assert "eta estimating" in drawn and not re.search(r"(positives|range), \d+\.\d s, eta \d", drawn)
    assert any(re.fullmatch(r"t: \d+% scoring, \d+\.\d s, eta (1[0-9]|20) s", line) for line in drawn.splitlines())
    assert fractions == sorted(fractions) and fractions[-1] == pytest.approx(1)
    steps = np.diff(fractions[11:])  # the scoring's cost known: equal time, equal steps of the bar
    assert steps == pytest.approx(np.full(9, steps[0]))


def test_a_pass_started_on_several_workers_is_measured_after_rounds_of_them():
    """Two workers, their tasks finishing in pairs: the first of a pair books the round's time (its
    cost looks twice what it is).  Measured after 2 rounds or half the pass, the cost a task is the
    rounds' time over the tasks done: 1.3 s at the end of a round, at most (workers - 1) / tasks
    done above it within one."""
    _, _, etas, _ = fake_run(ISSUE_RUN, workers=2)
    assert etas[:14] == [None] * 14  # scoring measured after min(2 * 2, 10 / 2) = 4 tasks
    for done, eta in zip(range(4, 11), etas[14:], strict=True):
        assert eta == pytest.approx((10 - done) * 2.6 * (done + done % 2) / 2 / done)
        assert eta <= (10 - done) * 1.3 * (1 + 1 / done) + 1e-9


def test_before_any_cost_is_measured_the_bar_follows_the_work_model():
    """Nothing measured yet (every task so far finished at once): work done over work in all."""
    bar = Bar(Reporter("t", io.StringIO()), clock=lambda: 0.0)
    keys = [work_key("range", 30), work_key("scoring", 70)]
    bar.add_graph(keys)
    bar.start(0.0)
    bar.finished(keys[0])
    assert bar.fraction == pytest.approx(0.3) and bar.eta() is None


def test_live_bar_on_a_terminal(store_path):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out = Terminal()
    streameval.evaluate(store_path, gallery_chunk=CHUNK, progress=out)
    drawings = out.getvalue().split("\r")[1:]
    assert all(d.endswith(progress.CLEAR_LINE) for d in drawings[:-1]) and drawings[-1].endswith("\n")
    assert re.fullmatch(r"streameval \[#{30}\] 100% positives, range, scoring in \d+\.\d\d s\x1b\[K\n", drawings[-1])
    assert re.fullmatch(r"streameval \[\.{30}\]   0% compiling kernels  0\.0 s\x1b\[K", drawings[0])
    assert all(re.fullmatch(r"streameval \[[#.]{30}\] +\d+% [a-z, ]+  \d+\.\d s(  eta (\d+ s|estimating))?\x1b\[K", d)
               for d in drawings[:-1])


def test_keys_name_their_pass_and_work():
    assert key_work(work_key("rescoring", 12345)) == ("rescoring", 12345)
    assert key_work("score_chunk-8c3f6a3e-64f4-4d1e-9d7c-1a2b3c4d5e6f") is None
    assert key_work(("scoring", 3)) is None
    assert pairs_work(2, 3, 4) == 2 * 3 * (4 + progress.PAIR_OVERHEAD) and read_work(5) == 5 * progress.BYTE_COST


def test_local_cluster_of_processes_reports_finished_work(store_path, monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setattr(progress, "LOG_STEP", 1)
    out = io.StringIO()
    result = streameval.evaluate(store_path, gallery_chunk=CHUNK, progress=out, cluster="local", n_workers=2,
                                 threads_per_worker=1)
    lines = log_lines(out.getvalue())
    percents = [percent for percent, _ in lines]
    assert percents == sorted(percents) and percents.count(100) == 1
    assert lines[-2][0] == 99  # the scheduler reported every task with work
    assert lines[-1][1].startswith("positives, range, scoring in ")
    phases = result.run["phases"]
    assert list(phases)[:4] == ["setup", "compiling kernels", "passes", "closing cluster"]
    assert result.run["elapsed_s"] == sum(phases.values())
