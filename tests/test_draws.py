"""Seeded draws and trial masks (docs/protocols.md): the hash against a
scalar transcription and the spec's values, each trial source against an explicit reference."""

import os
import random

import numpy as np
import pytest

from streameval.protocols.draws import (bits_to_masks, eligible_rows, hash_words, load_official_table, mix64,
                                        rows_per_trial, trial_bits, trial_count)
from streameval.core.errors import OptionError
from streameval.protocols.record import Protocol, TrialSpec

MASK = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def scalar_mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def scalar_hash(seed, *words):
    """H(seed; words) of docs/protocols.md#the-seeded-hash, one python int at a time."""
    h = scalar_mix((seed + GAMMA) & MASK)
    for word in words:
        h = scalar_mix(((h ^ (word & MASK)) + GAMMA) & MASK)
    return h


def protocol(count=None, **fields):
    trial_fields = {k: fields.pop(k) for k in ("source", "path", "group", "shots", "seed", "queries", "cameras")
                    if k in fields}
    trials = TrialSpec(count=count, **trial_fields) if count is not None else None
    return Protocol(name="test", trials=trials, **fields)


def trial_rows(bits, T):
    return [set(np.flatnonzero(mask).tolist()) for mask in bits_to_masks(bits, T)]


# --- the hash -------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed, words, value", [
    (0, (), 0xe220a8397b1dcdaf),
    (0, (1, 0, 0, 1), 0x00c3dedf8d7bb611),
    (0, (1, 0, 0, -1), 0x1b5109b7b72dcb35),
    (42, (2, 3, 7), 0x2fdb8f6d67c11e6c),
])
def test_hash_matches_the_spec_values(seed, words, value):
    assert int(hash_words(seed, *words)) == value
    assert scalar_hash(seed, *words) == value


def test_mix_is_splitmix64_finaliser():
    assert int(mix64(GAMMA)) == 0xe220a8397b1dcdaf  # SplitMix64's first output for state 0


def test_vectorised_hash_equals_scalar_hash():
    rng = np.random.default_rng(5)
    extremes = np.array([0, 1, -1, np.iinfo(np.int64).min, np.iinfo(np.int64).max], dtype=np.int64)
    words = np.concatenate([extremes, rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, 200)])
    for seed in (0, -7, 2**63 - 1, -(2**63)):
        got = hash_words(seed, 2, -3, words)
        assert got.dtype == np.uint64 and got.shape == words.shape
        assert got.tolist() == [scalar_hash(seed, 2, -3, int(w)) for w in words]


def test_kernel_hash_steps_equal_the_vectorised_hash():
    """The sgs kernel draws inside numba with the same finaliser: chained, its steps give H."""
    import numba as nb

    from streameval.features.sgs.statistic import _absorb

    @nb.njit
    def two_words(h, a, b):  # as in the kernel: the state stays uint64 between steps
        return _absorb(_absorb(h, a), b)

    extremes = [0, 1, -1, np.iinfo(np.int64).min, np.iinfo(np.int64).max, 12345]
    for seed in (0, -7, 2**63 - 1):
        tagged = hash_words(seed, 1)[()]
        for word in extremes:
            assert int(two_words(tagged, np.int64(3), np.int64(word))) == scalar_hash(seed, 1, 3, word)


def test_hash_broadcasts_and_reads_integer_dtypes_as_twos_complement():
    rows = np.arange(-3, 4, dtype=np.int32)
    trials = np.arange(3, dtype=np.uint64)[:, None]
    got = hash_words(9, 1, trials, rows)
    assert got.shape == (3, 7)
    assert got.tolist() == [[scalar_hash(9, 1, t, r) for r in range(-3, 4)] for t in range(3)]
    assert int(hash_words(0, np.uint64(MASK))) == int(hash_words(0, -1)) == scalar_hash(0, -1)
    with pytest.raises(TypeError):
        hash_words(0, np.array([0.5]))


# --- masks without trials -------------------------------------------------------------------------

def test_eligible_rows():
    cams = np.array([1, 2, 3, 2, 6])
    assert eligible_rows(cams, None).tolist() == [True] * 5
    assert eligible_rows(cams, (2, 6)).tolist() == [False, True, False, True, True]
    assert eligible_rows(cams, ()).tolist() == [False] * 5


def test_without_trials_one_trial_of_the_eligible_rows_and_queries():
    p = protocol(gallery_cameras=(1, 2), query_cameras=(3,))
    g, q = trial_bits(p, [5, 5, 6, 7], [1, 4, 2, 1], [5, 6, 7], [3, 6, 3], 4)
    assert trial_count(p) == 1
    assert g.dtype == q.dtype == np.uint64
    assert g.tolist() == [1, 0, 1, 1] and q.tolist() == [1, 0, 1]
    g, q = trial_bits(protocol(), [5, 5], [1, 4], [5], [3], 2)
    assert g.tolist() == [1, 1] and q.tolist() == [1]


# --- source draw ----------------------------------------------------------------------------------

def test_trial_draw_spec_vector():
    p = protocol(count=2, group="pid", shots=1, seed=0)
    g, q = trial_bits(p, [1, 1, 2, 2, 2, 3], [0] * 6, [1, 2], [0, 0], 6)
    assert trial_rows(g, 2) == [{1, 2, 5}, {1, 3, 5}]
    assert q.tolist() == [3, 3]  # queries "all": every trial


def reference_draw(pids, cams, eligible, T, group, shots, seed):
    """Section 1.6 tag 2 spelled out: per trial and group, sort the group's rows by (H, idx)."""
    masks = np.zeros((T, len(pids)), dtype=bool)
    groups = {}
    for idx in np.flatnonzero(eligible):
        key = (pids[idx],) if group == "pid" else (pids[idx], cams[idx])
        groups.setdefault(key, []).append(int(idx))
    for t in range(T):
        for members in groups.values():
            for idx in sorted(members, key=lambda i: (scalar_hash(seed, 2, t, i), i))[:shots]:
                masks[t, idx] = True
    return masks


@pytest.mark.parametrize("group", ["pid", "pid-camera"])
@pytest.mark.parametrize("shots", [1, 2, 10])
def test_draw_equals_reference(group, shots):
    rng = np.random.default_rng(shots)
    n = 300
    pids = rng.integers(0, 40, n)
    cams = rng.integers(1, 6, n)
    p = protocol(count=5, group=group, shots=shots, seed=-11, gallery_cameras=(1, 2, 4))
    g, _ = trial_bits(p, pids, cams, [], [], n)
    want = reference_draw(pids, cams, eligible_rows(cams, (1, 2, 4)), 5, group, shots, -11)
    assert np.array_equal(bits_to_masks(g, 5), want)
    assert rows_per_trial(g, 5).tolist() == want.sum(axis=1).tolist()


def test_groups_smaller_than_shots_give_all_their_rows():
    p = protocol(count=3, group="pid-camera", shots=3)
    pids, cams = [1, 1, 1, 1, 2, 2], [1, 1, 2, 2, 1, 1]
    g, _ = trial_bits(p, pids, cams, [], [], 6)
    assert trial_rows(g, 3) == [set(range(6))] * 3
    g, _ = trial_bits(protocol(count=3, group="pid", shots=3), pids, cams, [], [], 6)
    assert [len(rows) for rows in trial_rows(g, 3)] == [5, 5, 5]  # 3 of pid 1's four, both of pid 2


def test_draw_is_deterministic_and_keyed_by_seed_and_trial():
    rng = np.random.default_rng(1)
    pids = rng.integers(0, 30, 400)
    cams = np.ones(400, dtype=np.int64)

    def bits(**trial_fields):
        return trial_bits(protocol(group="pid", **trial_fields), pids, cams, [], [], 400)[0]

    first = bits(count=8, seed=3)
    assert np.array_equal(first, bits(count=8, seed=3))
    # trial t's gallery depends on (seed, t) only, not on T
    assert np.array_equal(bits_to_masks(bits(count=3, seed=3), 3), bits_to_masks(first, 8)[:3])
    masks = bits_to_masks(first, 8)
    assert len({m.tobytes() for m in masks}) == 8
    assert not np.array_equal(bits_to_masks(bits(count=8, seed=4), 8), masks)


def test_a_groups_draw_ignores_the_other_rows():
    """Rows of other identities (another chunk, another camera filter) do not move a group's draw."""
    pids = np.array([4, 9, 4, 7, 4, 9, 4])
    cams = np.ones(7, dtype=np.int64)
    alone = np.where(pids == 4, pids, 100 + np.arange(7))  # every other row its own pid
    full, _ = trial_bits(protocol(count=6, group="pid"), pids, cams, [], [], 7)
    solo, _ = trial_bits(protocol(count=6, group="pid"), alone, cams, [], [], 7)
    pid4 = pids == 4
    assert np.array_equal(full[pid4], solo[pid4])


def test_all_64_trials():
    pids = np.repeat(np.arange(20), 3)
    g, q = trial_bits(protocol(count=64, group="pid"), pids, np.ones(60), [0], [1], 60)
    assert rows_per_trial(g, 64).tolist() == [20] * 64
    assert int(q[0]) == MASK


# --- source mangye16-random -----------------------------------------------------------------------

def upstream_process_gallery_sysu(data_path, mode="all", trial=0):
    """mangye16/Cross-Modal-Re-ID-baseline data_manager.process_gallery_sysu, transcribed."""
    random.seed(trial)
    if mode == "all":
        rgb_cameras = ["cam1", "cam2", "cam4", "cam5"]
    elif mode == "indoor":
        rgb_cameras = ["cam1", "cam2"]
    file_path = os.path.join(data_path, "exp/test_id.txt")
    files_rgb = []
    with open(file_path, "r") as file:
        ids = file.read().splitlines()
        ids = [int(y) for y in ids[0].split(",")]
        ids = ["%04d" % x for x in ids]
    for id in sorted(ids):
        for cam in rgb_cameras:
            img_dir = os.path.join(data_path, cam, id)
            if os.path.isdir(img_dir):
                new_files = sorted([img_dir + "/" + i for i in os.listdir(img_dir)])
                files_rgb.append(random.choice(new_files))
    return files_rgb


@pytest.fixture
def sysu_tree(tmp_path):
    """A small SYSU-like directory tree and the matching store rows (converter order: camera,
    pid, file number), including IR cameras 3 and 6, which the gallery cameras leave out."""
    rng = np.random.default_rng(2)
    test_ids = [3, 12, 7, 40, 25]
    rows = []  # (path, pid, camera)
    for cam in (1, 2, 3, 4, 5, 6):
        for pid in sorted(test_ids):
            count = int(rng.integers(0, 9))  # 0: this identity has no images in this camera
            if count == 0:
                continue
            folder = tmp_path / f"cam{cam}" / f"{pid:04d}"
            folder.mkdir(parents=True)
            for number in range(1, count + 1):
                (folder / f"{number:04d}.jpg").write_bytes(b"")
                rows.append((f"{folder}/{number:04d}.jpg", pid, cam))
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "test_id.txt").write_text(",".join(map(str, test_ids)) + "\n")
    return tmp_path, rows


@pytest.mark.parametrize("mode, gallery_cameras", [("all", (1, 2, 4, 5)), ("indoor", (1, 2))])
def test_mangye16_random_equals_upstreams_loop(sysu_tree, mode, gallery_cameras):
    root, rows = sysu_tree
    row_of = {path: i for i, (path, _, _) in enumerate(rows)}
    pids = [pid for _, pid, _ in rows]
    cams = [cam for _, _, cam in rows]
    p = protocol(count=10, source="mangye16-random", cameras=gallery_cameras, gallery_cameras=gallery_cameras)
    state = random.getstate()
    try:
        want = [{row_of[path] for path in upstream_process_gallery_sysu(str(root), mode, trial)}
                for trial in range(10)]
    finally:
        random.setstate(state)
    g, _ = trial_bits(p, pids, cams, [], [], len(rows))
    assert trial_rows(g, 10) == want
    assert len({frozenset(rows) for rows in want}) > 1  # the trials differ


# --- source official ------------------------------------------------------------------------------

# groups (pid, camera): (1, 1) rows 0, 2, 4 = images 1, 2, 3; (1, 2) row 1; (2, 1) row 3; (2, 2) row 5
OFFICIAL_PIDS = [1, 1, 1, 2, 1, 2]
OFFICIAL_CAMS = [1, 2, 1, 1, 1, 2]
OFFICIAL_TABLE = """trial,camera,pid,images
0,1,1,3 1 2
0,2,1,1
0,1,2,1
0,2,2,1
0,4,1,5 2

1,1,1,"2 3 1"
1,2,1,1
1,1,2,1
1,2,2,1
"""


def official(tmp_path, text, count=2, **fields):
    path = tmp_path / "perm.csv"
    path.write_text(text)
    p = protocol(count=count, source="official", path=str(path), **fields)
    return trial_bits(p, OFFICIAL_PIDS, OFFICIAL_CAMS, [], [], 6)[0]


@pytest.mark.parametrize("shots, want", [
    (1, [{4, 1, 3, 5}, {2, 1, 3, 5}]),
    (2, [{4, 0, 1, 3, 5}, {2, 4, 1, 3, 5}]),
    (5, [set(range(6))] * 2),  # fewer images listed than shots: all listed
])
def test_official_table_trials(tmp_path, shots, want):
    assert trial_rows(official(tmp_path, OFFICIAL_TABLE, shots=shots), 2) == want


def test_official_table_ignores_groups_outside_the_gallery(tmp_path):
    g = official(tmp_path, OFFICIAL_TABLE, gallery_cameras=(1,))
    assert trial_rows(g, 2) == [{4, 3}, {2, 3}]


def test_load_official_table(tmp_path):
    path = tmp_path / "perm.csv"
    path.write_text(OFFICIAL_TABLE)
    table = load_official_table(path)
    assert table.path == str(path)
    assert len(table.entries) == 9
    assert table.entries[(1, 1, 1)].images == (2, 3, 1)
    assert table.entries[(1, 1, 1)].line == 8


def replace_line(number, new):
    lines = OFFICIAL_TABLE.splitlines()
    lines[number - 1] = new
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text, count, message", [
    ("", 2, "empty"),
    (replace_line(1, "trial,cam,pid,images"), 2, "line 1: the header"),
    (replace_line(3, "0,2,1"), 2, "line 3: expected 4 fields"),
    (replace_line(3, "0,x,1,1"), 2, "line 3: camera must be an integer"),
    (replace_line(3, "-1,2,1,1"), 2, "line 3: trial must be 0 or more"),
    (replace_line(3, "0,2,1,0"), 2, "line 3: images are 1-based"),
    (replace_line(3, "0,2,1,1 1"), 2, "line 3: an image is listed twice"),
    (replace_line(3, "0,2,1,"), 2, "line 3: no images"),
    (replace_line(3, "0,1,1,1"), 2, "line 3: trial 0, camera 1, pid 1 already given on line 2"),
    (replace_line(2, "0,1,1,3 4 1 2"), 2, "line 2: image 4 of pid 1 camera 1, but the gallery holds 3"),
    (OFFICIAL_TABLE + "2,1,1,1\n", 2, "line 12: trial 2, but the protocol has 2 trials"),
    (OFFICIAL_TABLE, 3, "no line for trial 2"),
    (replace_line(11, ""), 2, "trial 1 has no line for pid 2 camera 2"),
])
def test_official_table_errors_name_file_and_line(tmp_path, text, count, message):
    with pytest.raises(OptionError, match=message) as error:
        official(tmp_path, text, count=count)
    assert str(tmp_path / "perm.csv") in str(error.value)
    assert "\n" not in str(error.value) and error.value.exit_code == 2


def test_official_table_unreadable(tmp_path):
    with pytest.raises(OptionError, match="cannot read the official trial table .*missing.csv"):
        load_official_table(tmp_path / "missing.csv")
    path = tmp_path / "binary.csv"
    path.write_bytes(b"trial,camera,pid,images\n0,1,1,\xff\xfe\n")
    with pytest.raises(OptionError, match="cannot read the official trial table"):
        load_official_table(path)


# --- queries --------------------------------------------------------------------------------------

def test_queries_not_in_gallery():
    """VehicleID: the pool is the queries, their copies the gallery; a query takes part in the
    trials whose gallery does not hold its own copy (spec vector's draws: {1, 2, 5}, {1, 3, 5})."""
    p = protocol(count=2, group="pid", queries="not-in-gallery", gallery_includes_queries=True)
    pool = [1, 1, 2, 2, 2, 3]
    g, q = trial_bits(p, pool, [0] * 6, pool, [0] * 6, 0)
    assert trial_rows(g, 2) == [{1, 2, 5}, {1, 3, 5}]
    assert trial_rows(q, 2) == [{0, 3, 4}, {0, 2, 4}]


def test_queries_not_in_gallery_after_stored_rows_and_query_cameras():
    p = protocol(count=2, group="pid", queries="not-in-gallery", gallery_includes_queries=True,
                 query_cameras=(0,))
    pool = [1, 1, 2, 2, 2, 3]
    q_cam = [0, 0, 0, 0, 9, 0]  # query 4 is not eligible; its copy still is a gallery row
    g_pid = [50, 51] + pool  # two stored rows, then the copies at rows 2..7
    g, q = trial_bits(p, g_pid, [0, 0] + q_cam, pool, q_cam, 2)
    copies = [{r - 2 for r in rows if r >= 2} for rows in trial_rows(g, 2)]
    assert trial_rows(q, 2) == [set(range(6)) - copies[t] - {4} for t in range(2)]
    assert {0, 1} <= trial_rows(g, 2)[0]  # single-row pids are in every trial


def test_queries_all_takes_eligible_queries_in_every_trial():
    p = protocol(count=3, group="pid", query_cameras=(3, 6))
    _, q = trial_bits(p, [1, 2], [1, 1], [1, 2, 1], [3, 2, 6], 2)
    assert q.tolist() == [7, 0, 7]
