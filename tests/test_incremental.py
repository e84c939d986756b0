"""Incremental re-evaluation (``streameval update``) equals a full evaluation after every append.

A hypothesis state machine appends random batches to a store on disk - distractors only, new
positives of existing queries (also of open-set queries), rows far from everything (a new minmax
maximum), copies of query rows (a new minimum) - and after each update checks the result against a
full ``evaluate`` of the store (bit for bit) and against the brute-force reference, for the Market
protocol and for an identity-dedup protocol with camera rules.  Integer-valued features keep every
distance exact, so ties and threshold hits are exercised too.

Then: refusals of states that do not match and of protocols that cannot be updated (trials, sgs
draws, query copies in the gallery), and interruptions (a real process killed in the middle of an
append or of an update) that must leave the previous store and state readable and valid.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest
import zarr
from click.testing import CliRunner
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import streameval
from streameval.cli import main
from streameval.core.errors import OptionError
from streameval.protocols import CameraRelation, Protocol, resolve
from streameval.present.report import summary
from streameval.run.statestore import POINTER, StateError, load_state
from streameval.store import COMMITTED_ATTR, open_group

from cli_checks import one_error_line
from signal_checks import assert_stopped_in_one_line, ctrl_c_at_pause, paused_script, stopped_run
from protocol_reference import reference_protocol
from reference import distance_matrix, reference_evaluate, reference_gom
from result_checks import comparable
from test_engine_vs_reference import TOL, assert_matches_reference
from test_gom_vs_reference import assert_gom_matches

DIM = 4
N_IDS = 6
VMAX = 2  # feature values in [-VMAX, VMAX]: many exact ties
# identity-dedup CMC (SYSU-MM01's) without trials, with a camera pair excluded for every identity and
# the queries of camera 2 left out: every protocol field an update can meet
DEDUP = Protocol(name="dedup-cameras", cmc="identity-dedup", x_any=CameraRelation(pairs=((0, 1),)),
                 query_cameras=(0, 1))


def random_rows(rng, n, pids, cams=3, scale=1):
    return (scale * rng.integers(-VMAX, VMAX + 1, (n, DIM))).astype(np.float32), np.asarray(pids), rng.integers(0, cams, n)


# ------------------------------------------------------------------------------------ state machine


class GrowingGallery(RuleBasedStateMachine):
    """A store that grows batch by batch, its state updated after each append."""

    @initialize(
        seed=st.integers(0, 2**32 - 1), n_query=st.integers(1, 8), n_gallery=st.integers(1, 40),
        norm=st.sampled_from(["minmax", "fixed:0:6", "none", "off"]), metric=st.sampled_from(["euclidean", "sqeuclidean"]),
        chunk_rows=st.integers(1, 16), protocol=st.sampled_from(["market", DEDUP]),
    )
    def start(self, seed, n_query, n_gallery, norm, metric, chunk_rows, protocol):
        self.rng = np.random.default_rng(seed)
        self.dir = tempfile.mkdtemp(prefix="streameval-inc-")
        self.store = os.path.join(self.dir, "s.zarr")
        self.state = os.path.join(self.dir, "state")
        # query pids up to N_IDS + 1: some queries are open-set until an append brings their identity
        self.query = random_rows(self.rng, n_query, self.rng.integers(1, N_IDS + 2, n_query))
        gallery = random_rows(self.rng, n_gallery, self.rng.integers(-1, N_IDS + 1, n_gallery))
        streameval.write_store(self.store, *self.query, *gallery, chunk_rows=chunk_rows)
        gom = {"no_gom": True} if norm == "off" else {"gom_norm": norm, "gom_bins": 10, "gom_b": 5}
        self.options = dict(metric=metric, protocol=protocol, **gom)
        self.result = streameval.evaluate(self.store, state=self.state, **self.options)
        self.appended = False

    def teardown(self):
        shutil.rmtree(getattr(self, "dir", ""), ignore_errors=True)

    def _append(self, features, pids, camids):
        streameval.append_gallery(self.store, features, pids, camids)
        self.appended = True

    @rule(n=st.integers(1, 12))
    def append_distractors(self, n):
        """pid 0 and junk: no new positives."""
        self._append(*random_rows(self.rng, n, self.rng.integers(-1, 1, n)))

    @rule(n=st.integers(1, 6))
    def append_new_positives(self, n):
        """Images of the queries' identities, in any camera (some are same-camera junk)."""
        self._append(*random_rows(self.rng, n, self.rng.choice(self.query[1], n)))

    @rule(scale=st.integers(2, 4))
    def append_far_row(self, scale):
        """A row far from every query: a new global maximum distance."""
        self._append(*random_rows(self.rng, 1, [0], scale=scale * 3))

    @rule(data=st.data())
    def append_query_copy(self, data):
        """A copy of a query row: distance 0, a new global minimum (and a tie of equal rows)."""
        q = data.draw(st.integers(0, len(self.query[1]) - 1))
        pid = data.draw(st.sampled_from([0, int(self.query[1][q])]))
        self._append(self.query[0][q:q + 1], np.array([pid]), np.array([(self.query[2][q] + 1) % 3]))

    @precondition(lambda self: self.appended)
    @rule(gallery_chunk=st.one_of(st.none(), st.integers(1, 30)), query_block=st.one_of(st.none(), st.integers(1, 8)))
    def update(self, gallery_chunk, query_block):
        self.result = streameval.update(self.store, self.state, gallery_chunk=gallery_chunk, query_block=query_block)
        self.appended = False
        assert self.result.run["update"]["rows_added"] > 0

    @precondition(lambda self: not self.appended)
    @invariant()
    def update_equals_full_evaluation(self):
        full = streameval.evaluate(self.store, **self.options)
        assert comparable(self.result) == comparable(full)
        assert load_state(self.state).covers["gallery_rows"] == full.n_gallery

    @precondition(lambda self: not self.appended)
    @invariant()
    def update_equals_reference(self):
        store = streameval.open_store(self.store)
        qf, qp, qc = (np.asarray(a[:]) for a in (store.query.features, store.query.pids, store.query.camids))
        gf, gp, gc = (np.asarray(a[:len(store.gallery)]) for a in
                      (store.gallery.features, store.gallery.pids, store.gallery.camids))
        dist = distance_matrix(qf, gf, self.options["metric"])
        norm = self.options.get("gom_norm")
        norm = (0.0, 6.0) if norm and norm.startswith("fixed") else norm
        if self.options["protocol"] == DEDUP:
            gom = None if norm is None else dict(norm=norm, bins=10, b=5)
            assert_matches_protocol_reference(self.result, reference_protocol(dist, qp, qc, gp, gc, DEDUP, gom=gom))
            return
        ref = reference_evaluate(qf, qp, qc, gf, gp, gc, metric=self.options["metric"])
        assert_matches_reference(self.result, ref, 50)
        if norm is not None:
            assert_gom_matches(self.result.gom, reference_gom(dist, qp, qc, gp, gc, norm=norm, bins=10, b=5))


def assert_matches_protocol_reference(result, ref: dict) -> None:
    """A result with one trial against ``protocol_reference.reference_protocol``: counts, the
    closed-set values, the protocol's CMC, each query's identity-dedup rank (max_rank + 1 standing
    for any rank beyond the curve), GOM."""
    trial = ref["per_trial"][0]
    for key in ("n_queries", "n_valid_queries", "n_open_queries"):
        assert getattr(result, key) == trial[key], key
    for key in ("mAP", "mAP_trapezoid", "mINP", "cmc"):
        got, want = getattr(result, key), trial[key]
        assert (got is None) == (want is None), key
        if want is not None:
            np.testing.assert_allclose(got, want, rtol=0, atol=TOL, err_msg=key)
    np.testing.assert_array_equal(result.per_query["rho"], np.minimum(trial["per_query"]["rho"], result.max_rank + 1))
    if trial["gom"] is not None:
        assert_gom_matches(result.gom, trial["gom"])


GrowingGallery.TestCase.settings = settings(
    max_examples=25, stateful_step_count=8, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
test_update_equals_full_evaluation = GrowingGallery.TestCase


# ------------------------------------------------------------------------------------ fixed scenarios


def make_store(tmp_path, n_query=20, n_gallery=300, seed=0, name="s.zarr"):
    rng = np.random.default_rng(seed)
    path = tmp_path / name
    query = random_rows(rng, n_query, rng.integers(1, N_IDS + 2, n_query))
    streameval.write_store(path, *query, *random_rows(rng, n_gallery, rng.integers(-1, N_IDS + 1, n_gallery)),
                           chunk_rows=64)
    return str(path), rng, query


def test_distractor_appends_with_fixed_norm_score_only_the_new_rows(tmp_path):
    store, rng, _ = make_store(tmp_path)
    state = tmp_path / "state"
    streameval.evaluate(store, state=state, gom_norm="fixed:0:8")
    streameval.append_gallery(store, *random_rows(rng, 30, np.zeros(30, int)))
    result = streameval.update(store, state)
    facts = result.run["update"]
    assert facts == {"rows_before": 300, "rows_added": 30, "queries_with_new_positives": 0, "queries_rescored": 0,
                     "range_before": None, "range_after": None, "range_moved": False}
    assert comparable(result) == comparable(streameval.evaluate(store, gom_norm="fixed:0:8"))


def test_a_new_extreme_distance_is_detected_and_reported(tmp_path):
    store, rng, _ = make_store(tmp_path)
    state = tmp_path / "state"
    before = streameval.evaluate(store, state=state).gom
    streameval.append_gallery(store, *random_rows(rng, 1, [0], scale=10))
    result = streameval.update(store, state)
    facts = result.run["update"]
    assert facts["range_moved"] and facts["queries_rescored"] == 20
    assert facts["range_before"] == [before["dmin"], before["dmax"]] and facts["range_after"][1] > before["dmax"]
    assert "minmax range moved" in summary(result)
    assert comparable(result) == comparable(streameval.evaluate(store))


def test_nothing_appended_rewrites_nothing(tmp_path):
    store, _, _ = make_store(tmp_path)
    state = tmp_path / "state"
    full = streameval.evaluate(store, state=state)
    version = load_state(state).version
    result = streameval.update(store, state, max_rank=5)
    assert result.run["update"]["rows_added"] == 0 and load_state(state).version == version
    assert result.max_rank == 5 and list(result.cmc) == list(full.cmc[:5]) and result.mAP == full.mAP


def test_report_options_may_change_on_update(tmp_path):
    store, rng, query = make_store(tmp_path)
    state = tmp_path / "state"
    streameval.evaluate(store, state=state, gom_vp="reference", max_rank=50)
    streameval.append_gallery(store, *random_rows(rng, 10, query[1][:10]))
    result = streameval.update(store, state, gom_vp="jaccard", max_rank=7, gom_b=4)
    assert comparable(result) == comparable(streameval.evaluate(store, gom_vp="jaccard", max_rank=7, gom_b=4))


def camera_rows(rng, n, pids, cameras):
    return rng.integers(-VMAX, VMAX + 1, (n, DIM)).astype(np.float32), np.asarray(pids), rng.choice(cameras, n)


def assert_update_matches_reference(store: str, result, protocol, max_rank: int) -> None:
    opened = streameval.open_store(store)
    qf, qp, qc = (np.asarray(a[:]) for a in (opened.query.features, opened.query.pids, opened.query.camids))
    gf, gp, gc = (np.asarray(a[:len(opened.gallery)]) for a in
                  (opened.gallery.features, opened.gallery.pids, opened.gallery.camids))
    ref = reference_protocol(distance_matrix(qf, gf, "euclidean"), qp, qc, gp, gc, protocol, max_rank=max_rank,
                             gom=dict(norm="minmax", bins=10, b=5))
    assert_matches_protocol_reference(result, ref)


@pytest.mark.parametrize("protocol, overrides", [
    ("sysu-all", {"trials": 0}),  # SYSU-MM01's query and gallery cameras and camera rule, one gallery
    (Protocol(name="market-dedup", cmc="identity-dedup"), {}),  # a protocol of the user's
])
def test_identity_dedup_updates_equal_a_full_evaluation(tmp_path, protocol, overrides):
    """A query without new positives keeps its dedup list and merges the new rows' identities into
    it; a query with a new positive before its first is re-scored over the old rows."""
    rng = np.random.default_rng(5)
    store, state = str(tmp_path / "s.zarr"), tmp_path / "state"
    query = camera_rows(rng, 12, rng.integers(1, N_IDS + 1, 12), [3, 6, 1])  # camera 1: not a SYSU query camera
    streameval.write_store(store, *query, *camera_rows(rng, 80, rng.integers(-1, N_IDS + 1, 80), range(1, 7)),
                           chunk_rows=16)
    options = dict(protocol=protocol, max_rank=3, gom_bins=10, gom_b=5, **overrides)  # 3: the lists fill up
    streameval.evaluate(store, state=state, **options)
    copies = np.flatnonzero(query[2] != 1)[:4]  # at distance 0 from their query, in gallery camera 1:
    own_or_new = np.r_[query[1][copies[:2]], 100 + copies[2:]]  # a new first positive, or a new identity first
    batches = [
        camera_rows(rng, 10, rng.integers(N_IDS + 1, N_IDS + 30, 10), range(1, 7)),  # identities of no query
        (query[0][copies], own_or_new, np.ones(4, np.int64)),
        camera_rows(rng, 10, rng.choice(query[1], 10), range(1, 7)),  # the queries' identities
    ]
    for batch in batches:
        streameval.append_gallery(store, *batch)
        result = streameval.update(store, state)
        assert comparable(result) == comparable(streameval.evaluate(store, **options))
        assert_update_matches_reference(store, result, resolve(protocol, **overrides), max_rank=3)
        facts = result.run["update"]
        assert facts["queries_with_new_positives"] >= (2 if batch is batches[1] else 0)
        assert (facts["queries_with_new_positives"] == 0) == (batch is batches[0])


def test_a_trial_without_queries_saves_an_empty_range(tmp_path):
    """No query of the store is on SYSU-MM01's query cameras: the minmax range of the one trial is
    empty (null in the state), and updates still equal a full evaluation."""
    store, rng, _ = make_store(tmp_path)  # cameras 0, 1, 2
    state = tmp_path / "state"
    streameval.evaluate(store, state=state, protocol="sysu-all", trials=0)
    assert zarr.open_group(state / (state / POINTER).read_text().strip()).attrs["dist_range"] == [None]
    streameval.append_gallery(store, *random_rows(rng, 10, rng.integers(1, N_IDS, 10)))
    result = streameval.update(store, state)
    assert result.n_queries == 0 and result.run["update"]["range_after"] is None
    assert comparable(result) == comparable(streameval.evaluate(store, protocol="sysu-all", trials=0))


# ------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("options, message", [
    ({"metric": "cosine"}, r"other options \(metric 'euclidean' -> 'cosine'\)"),
    ({"gom_norm": "fixed:0:3"}, r"other options \(gom.norm 'minmax' -> 'fixed', gom.hi 1.0 -> 3.0\)"),
    ({"no_gom": True}, r"other options \(gom \{.*\} -> None\)"),
    ({"protocol": "none"}, r"other options \(protocol.name 'market' -> 'none', protocol.x_same 'equal' -> 'none'\)"),
    ({"junk_pids": (-1, 0)}, r"other options \(protocol.junk_pids \[-1\] -> \[-1, 0\]\)"),
    ({"denominator": "zero"}, r"other options \(protocol.denominator 'skip' -> 'zero'\)"),
    ({"cmc": "identity-dedup"}, r"other options \(protocol.cmc 'first-hit' -> 'identity-dedup', max_rank None -> 50\)"),
    ({"precision": "float64"}, r"other options \(precision 'float32' -> 'float64'\)"),
])
def test_other_options_are_refused(tmp_path, options, message):
    store, _, _ = make_store(tmp_path)
    state = tmp_path / "state"
    streameval.evaluate(store, state=state)
    with pytest.raises(StateError, match=message):
        streameval.update(store, state, **options)


@pytest.mark.parametrize("args, why", [
    (["--protocol", "sysu-all"], "its trials are drawn from the whole gallery"),
    (["--protocol", "vehicleid"], "its trials are drawn from the whole gallery"),
    (["--protocol", "cuhk03-sgs"], "its single-gallery-shot CMC draws one row per identity"),
    (["--protocol", "mars"], "its gallery includes the queries' copies"),
    (["--protocol", "regdb", "--direction", "t2v"], "direction t2v takes the store's gallery as the queries"),
])
def test_eval_state_refuses_a_protocol_an_update_could_not_extend(tmp_path, args, why):
    store, _, _ = make_store(tmp_path)
    state = tmp_path / "state"
    line = one_error_line(invoke("eval", store, "--state", state, "-q", *args, code=2))
    assert line.startswith("error: protocol '") and "keeps no state for incremental updates" in line, line
    assert why in line, line
    assert not state.exists()


def test_update_refuses_a_protocol_it_could_not_extend(tmp_path):
    store, _, _ = make_store(tmp_path)
    state = tmp_path / "state"
    streameval.evaluate(store, state=state, protocol="sysu-all", trials=0)
    with pytest.raises(OptionError, match="protocol 'sysu-all' keeps no state .*: its trials are drawn"):
        streameval.update(store, state, trials=2)
    with pytest.raises(OptionError, match="protocol 'mars' keeps no state .*: its gallery includes the queries"):
        streameval.update(store, state, protocol="mars")
    assert load_state(state).options["protocol"] == resolve("sysu-all", trials=0).to_record()


def test_other_queries_are_refused(tmp_path):
    store, _, _ = make_store(tmp_path)
    other, _, _ = make_store(tmp_path, seed=1, name="other.zarr")
    state = tmp_path / "state"
    streameval.evaluate(store, state=state)
    with pytest.raises(StateError, match="other queries"):
        streameval.update(other, state)


def test_a_gallery_that_shrank_is_refused(tmp_path):
    store, _, _ = make_store(tmp_path)
    state = tmp_path / "state"
    streameval.evaluate(store, state=state)
    zarr.open_group(store, mode="r+").attrs[COMMITTED_ATTR] = 250  # as if truncated
    with pytest.raises(StateError, match="covers 300 gallery rows but .* has 250: the gallery shrank"):
        streameval.update(store, state)


@pytest.mark.parametrize("how", ["recreated", "edited"])
def test_a_rewritten_gallery_is_refused(tmp_path, how):
    store, rng, query = make_store(tmp_path)
    state = tmp_path / "state"
    streameval.evaluate(store, state=state)
    if how == "recreated":  # same queries, same size, new data: a new store uid
        gallery = random_rows(rng, 300, rng.integers(1, N_IDS + 1, 300))
        streameval.write_store(store, *query, *gallery, chunk_rows=64, overwrite=True)
    else:  # edited in place behind streameval's back: the sampled rows differ
        features = open_group(store, mode="r+")["gallery/features"]
        features[0] = features[0] + 1
    streameval.append_gallery(store, *random_rows(rng, 5, np.zeros(5, int)))
    with pytest.raises(StateError, match="was rewritten"):
        streameval.update(store, state)


def test_eval_refuses_to_replace_a_state_or_a_foreign_directory(tmp_path):
    store, _, _ = make_store(tmp_path)
    state = tmp_path / "state"
    streameval.evaluate(store, state=state)
    with pytest.raises(OptionError, match="already exists; pass --overwrite"):  # as for every output
        streameval.evaluate(store, state=state)
    streameval.evaluate(store, state=state, overwrite_state=True)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(StateError, match="not a streameval state"):
        streameval.evaluate(store, state=mine, overwrite_state=True)
    assert (mine / "notes.txt").read_text() == "keep me"
    with pytest.raises(StateError, match="no state at"):
        streameval.update(store, tmp_path / "nowhere")


# -------------------------------------------------------------------------------------- interruptions


CRASH = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import streameval, streameval.run.statestore, streameval.store.writing
    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)
    what, store, state = sys.argv[1:4]
    if what == "update":  # killed once the new version is written, before it is made live
        streameval.run.statestore._sync_tree = die
        streameval.update(store, state)
    else:  # append: killed after the first batch of rows is written, before the commit
        real = streameval.store.writing.write_rows
        def write_then_die(*args):
            real(*args)
            die()
        streameval.store.writing.write_rows = write_then_die
        rng = np.random.default_rng(0)
        streameval.append_gallery(store, rng.integers(-2, 3, (40, 4)).astype(np.float32),
                                  np.full(40, 3), np.zeros(40, np.int64))
""")


def crash(*args):
    done = subprocess.run([sys.executable, "-c", CRASH, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr


def test_update_killed_before_the_swap_leaves_the_previous_state(tmp_path):
    store, rng, query = make_store(tmp_path)
    state = tmp_path / "state"
    streameval.evaluate(store, state=state)
    before = load_state(state)
    streameval.append_gallery(store, *random_rows(rng, 20, query[1][:20]))
    crash("update", store, state)
    assert len([name for name in os.listdir(state) if name.endswith(".zarr")]) == 2  # the dead one's leftover
    after = load_state(state)
    assert after.version == before.version and after.covers == before.covers
    np.testing.assert_array_equal(after.query_state.stats.arrays["gom/hist"], before.query_state.stats.arrays["gom/hist"])
    result = streameval.update(store, state)  # picks up where the previous state was, cleans up
    assert comparable(result) == comparable(streameval.evaluate(store))
    assert sorted(os.listdir(state)) == [POINTER, load_state(state).version]


def test_append_killed_mid_write_leaves_the_store_and_state_consistent(tmp_path):
    store, rng, _ = make_store(tmp_path)
    state = tmp_path / "state"
    full = streameval.evaluate(store, state=state)
    crash("append", store, state)
    opened = streameval.open_store(store)
    assert len(opened.gallery) == 300 and opened.gallery.features.shape[0] == 340  # an uncommitted tail
    result = streameval.update(store, state)
    assert result.run["update"]["rows_added"] == 0 and comparable(result) == comparable(full)
    streameval.append_gallery(store, *random_rows(rng, 10, np.zeros(10, int)))  # replaces the tail
    assert comparable(streameval.update(store, state)) == comparable(streameval.evaluate(store))


def test_update_interrupted_by_ctrl_c_keeps_the_state(tmp_path):
    """A real SIGINT while the new version is being made durable, before the swap."""
    store, rng, _ = make_store(tmp_path)
    state = tmp_path / "state"
    full = comparable(streameval.evaluate(store, state=state))
    streameval.append_gallery(store, *random_rows(rng, 20, np.zeros(20, int)))
    ctrl_c_at_pause(paused_script("streameval.run.statestore", "_sync_tree", "streameval.update(*sys.argv[1:3])"),
                    store, state)
    assert load_state(state).covers["gallery_rows"] == 300
    assert comparable(streameval.update(store, state, gallery_chunk=7)) == comparable(streameval.evaluate(store))
    assert full != comparable(streameval.evaluate(store))


@pytest.fixture
def long_update(tmp_path):
    """A store and its state, then appended rows holding new positives: an update whose passes last
    long enough (about a second here) to be stopped while they run."""
    rng = np.random.default_rng(8)
    pids = lambda n: rng.integers(0, 300, n)  # noqa: E731
    store, state = tmp_path / "big.zarr", tmp_path / "big.state"
    streameval.write_store(store, rng.standard_normal((1000, 64)).astype(np.float32), pids(1000),
                           rng.integers(0, 4, 1000), rng.standard_normal((6000, 64)).astype(np.float32), pids(6000),
                           rng.integers(0, 4, 6000))
    before = comparable(streameval.evaluate(store, state=state))
    streameval.append_gallery(store, rng.standard_normal((6000, 64)).astype(np.float32), pids(6000),
                              rng.integers(0, 4, 6000))
    return store, state, before


def test_the_update_command_stopped_by_ctrl_c_mid_pass_keeps_the_state(long_update):
    store, state, before = long_update
    version = load_state(state).version
    code, err = stopped_run(["update", store, "--state", state], "% positives")
    assert_stopped_in_one_line(code, err, [signal.SIGINT])
    kept = load_state(state)
    assert (kept.version, kept.covers["gallery_rows"]) == (version, 6000)
    assert sorted(os.listdir(state)) == [POINTER, version]  # the unfinished version is not left behind
    after = comparable(streameval.update(store, state))  # the kept state takes the update
    assert after == comparable(streameval.evaluate(store)) and after != before


# ------------------------------------------------------------------------------------------------ CLI


def invoke(*args, code=0):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    return result


def test_cli_eval_state_append_update(tmp_path):
    store, rng, query = make_store(tmp_path)
    state = tmp_path / "state"
    invoke("eval", store, "--state", state, "-q")
    features, pids, camids = random_rows(rng, 25, np.r_[np.zeros(20, int), query[1][:5]])
    np.savez(tmp_path / "new.npz", gf=features, g_pids=pids, g_camids=camids)
    assert "appended 25 rows" in invoke("append", store, tmp_path / "new.npz").stdout
    out = invoke("update", store, "--state", state, "--json", tmp_path / "u.json")
    assert "update: +25 gallery rows (had 300)" in out.stdout
    invoke("eval", store, "--json", tmp_path / "f.json", "-q")
    import json

    got, want = (json.loads((tmp_path / name).read_text()) for name in ("u.json", "f.json"))
    assert got.pop("run")["update"]["rows_added"] == 25
    want.pop("run")
    assert got == want


def test_cli_refusals_are_one_line_errors(tmp_path):
    store, rng, _ = make_store(tmp_path)
    state = tmp_path / "state"
    invoke("eval", store, "--state", state, "-q")
    bad = invoke("update", store, "--state", state, "--metric", "cosine", code=3)
    assert bad.stderr.startswith("error: the state at") and "Traceback" not in bad.output
    np.savez(tmp_path / "bad.npz", gf=np.zeros((2, DIM + 1), np.float32), g_pids=[1, 2], g_camids=[0, 0])
    assert "dimension 5 but the store's have 4" in invoke("append", store, tmp_path / "bad.npz", code=3).stderr
    np.savez(tmp_path / "nan.npz", gf=np.full((2, DIM), np.nan, np.float32), g_pids=[1, 2], g_camids=[0, 0])
    assert "non-finite" in invoke("append", store, tmp_path / "nan.npz", code=3).stderr
    assert len(streameval.open_store(store).gallery) == 300
    assert "exists; pass --overwrite" in invoke("eval", store, "--state", state, "-q", code=2).output


def test_unknown_keywords_are_named(tmp_path):
    store, _, _ = make_store(tmp_path)
    with pytest.raises(TypeError, match=r"evaluate\(\) got unexpected keyword argument\(s\): gallery_chunks"):
        streameval.evaluate(store, gallery_chunks=8)
    with pytest.raises(TypeError, match=r"update\(\) got unexpected keyword argument\(s\): metrc"):
        streameval.update(store, tmp_path / "state", metrc="cosine")
