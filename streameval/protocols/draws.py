"""Seeded draws and trial masks (docs/protocols.md).

Every draw goes through one 64-bit hash, ``hash_words`` (H of docs/protocols.md#the-seeded-hash), so it depends on the
seed and the draw's words only: not on chunking, scheduling or platform.

Trial masks are bits: ``trial_bits`` gives a uint64 per extended-gallery row (bit t set = the row is
in trial t's gallery) and a uint64 per query (bit t = the query takes part in trial t).  Without
trials there is one trial (bit 0): the rows whose camera is in ``gallery_cameras`` and the queries
whose camera is in ``query_cameras``.  With trials, every source picks among those eligible rows of
the extended gallery (stored rows, then the query copies when ``gallery_includes_queries``):

* ``draw``: per group (pid, or pid and camera) the ``shots`` rows with the smallest
  (H(seed; 2, t, idx), idx): a seeded permutation's first rows; a smaller group gives all its rows.
* ``mangye16-random``: mangye16's ``process_gallery_sysu``: for trial t, Python's ``random`` seeded
  with t (the protocol's seed is not used, as upstream), pids ascending, for each the cameras of
  ``trials.cameras`` in that order, pairs without rows skipped, ``random.choice`` over the pair's
  rows in ascending index order.  Single-shot only.
* ``official``: a table of fixed permutations (below); trial t takes, per (pid, camera) group of the
  eligible rows, the group's first ``shots`` listed images.

Official trial table (``trials.path``): a UTF-8 CSV file whose first line is the header
``trial,camera,pid,images``, then one line per trial, camera and pid::

    trial,camera,pid,images
    0,1,1,3 1 2
    0,2,1,2 1
    1,1,1,1 3 2
    1,2,1,1 2

* ``trial``: 0-based trial number, below the protocol's T; every trial 0..T-1 needs lines.
* ``camera``, ``pid``: the integers of the store.
* ``images``: the group's images in the trial's order, space separated; an image is named by its
  1-based ordinal within its (pid, camera) group of the gallery, in ascending row order.  A trial
  takes the first ``shots`` of them.
* Every (pid, camera) group of the eligible gallery needs a line in every trial; lines for groups
  the gallery lacks are ignored (one table serves SYSU's all-search and indoor-search modes).
  Blank lines are skipped; a (trial, camera, pid) given twice is an error.

SYSU-MM01's ``rand_perm_cam.mat`` converts line by line: its cell for camera c holds, per pid p, a
matrix whose row t + 1 lists file numbers (``cam<c>/<pid>/<number>.jpg``); that row is the line
``t,c,p,<numbers>``.  SYSU numbers each directory's files 1, 2, ..., so file numbers are the ordinals
when the store holds every image of a (pid, camera) directory in file-number order.
"""

from __future__ import annotations

import csv
import random
import re
from dataclasses import dataclass

import numpy as np

from ..core.errors import OptionError, one_line

GAMMA = 0x9E3779B97F4A7C15
SGS_DRAW_TAG = 1  # words (1, repeat, query row, pid value)
TRIAL_DRAW_TAG = 2  # words (2, trial, extended-gallery row index)
OFFICIAL_HEADER = ("trial", "camera", "pid", "images")

_MASK64 = (1 << 64) - 1
_MIX_MULTIPLIERS = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))
_MIX_SHIFTS = (np.uint64(30), np.uint64(27), np.uint64(31))
_INTEGER = re.compile(r"-?[0-9]+")


def _as_u64(word):
    """A word as uint64: python and numpy integers mod 2^64, int arrays as two's complement."""
    if isinstance(word, (int, np.integer)):
        return np.uint64(int(word) & _MASK64)
    array = np.asarray(word)
    if array.dtype.kind == "u":
        return array.astype(np.uint64)
    if array.dtype.kind == "i":
        return array.astype(np.int64).view(np.uint64)
    raise TypeError(f"hash words must be integers, got dtype {array.dtype}")


def mix_words(z):
    """SplitMix64's finaliser (docs/protocols.md#the-seeded-hash) on uint64 words: numpy arrays here, and the same
    function compiled by numba for draws made inside a kernel (``statistics.sgs``)."""
    z = (z ^ (z >> _MIX_SHIFTS[0])) * _MIX_MULTIPLIERS[0]
    z = (z ^ (z >> _MIX_SHIFTS[1])) * _MIX_MULTIPLIERS[1]
    return z ^ (z >> _MIX_SHIFTS[2])


def mix64(z):
    """SplitMix64's finaliser (docs/protocols.md#the-seeded-hash), elementwise, mod 2^64."""
    with np.errstate(over="ignore"):
        return np.asarray(mix_words(_as_u64(z)), dtype=np.uint64)


def hash_words(seed, *words) -> np.ndarray:
    """H(seed; w_1 .. w_m) of docs/protocols.md#the-seeded-hash, broadcast over array words; a uint64 array (0-d for
    scalar words)."""
    gamma = np.uint64(GAMMA)
    with np.errstate(over="ignore"):
        h = mix64(_as_u64(seed) + gamma)
        for word in words:
            h = mix64((h ^ _as_u64(word)) + gamma)
    return h


def eligible_rows(cameras, allowed) -> np.ndarray:
    """True for rows whose camera is in ``allowed`` (every row when ``allowed`` is None)."""
    cameras = np.asarray(cameras)
    if allowed is None:
        return np.ones(cameras.shape, dtype=bool)
    return np.isin(cameras, np.asarray(allowed, dtype=np.int64))


def trial_count(protocol) -> int:
    """T: the protocol's trials, or 1 without trials."""
    return protocol.trials.count if protocol.trials is not None else 1


def trial_bits(protocol, g_pid, g_cam, q_pid, q_cam, n_stored: int):
    """(gallery bits uint64 per extended-gallery row, query bits uint64 per query row).

    ``g_pid``/``g_cam`` describe the extended gallery: the ``n_stored`` stored rows, then, with
    ``gallery_includes_queries``, the copies of the queries.  ``protocol`` is valid as made
    (``Protocol`` checks T <= 64, mangye16-random's single shot and cameras, and that
    'not-in-gallery' has the query copies).
    """
    g_pid = np.asarray(g_pid, dtype=np.int64)
    g_cam = np.asarray(g_cam, dtype=np.int64)
    g_eligible = eligible_rows(g_cam, protocol.gallery_cameras)
    q_eligible = eligible_rows(q_cam, protocol.query_cameras)
    trials = protocol.trials
    if trials is None:
        return g_eligible.astype(np.uint64), q_eligible.astype(np.uint64)
    rows = np.flatnonzero(g_eligible)
    gallery = np.zeros(g_pid.shape[0], dtype=np.uint64)
    draws = _TRIAL_SOURCES[trials.source](trials, rows, g_pid[rows], g_cam[rows])
    for t, chosen in enumerate(draws):
        gallery[chosen] |= np.uint64(1 << t)
    return gallery, _query_bits(trials, q_eligible, gallery, n_stored)


def bits_to_masks(bits, T: int) -> np.ndarray:
    """bool (T, N): row n is in trial t.  For tests and diagnostics (T x N bytes)."""
    shifts = np.arange(T, dtype=np.uint64)[:, None]
    return ((np.asarray(bits, dtype=np.uint64)[None, :] >> shifts) & np.uint64(1)).astype(bool)


def rows_per_trial(bits, T: int) -> np.ndarray:
    """int64 (T,): how many rows have bit t set."""
    bits = np.asarray(bits, dtype=np.uint64)
    return np.array([np.count_nonzero(bits & np.uint64(1 << t)) for t in range(T)], dtype=np.int64)


def _query_bits(trials, q_eligible, gallery, n_stored):
    """Eligible queries in every trial; with 'not-in-gallery' only where their copy is not drawn."""
    every_trial = np.uint64((1 << trials.count) - 1)
    bits = np.where(q_eligible, every_trial, np.uint64(0))
    if trials.queries == "not-in-gallery":
        bits &= ~gallery[n_stored:n_stored + bits.shape[0]]
    return bits


def _run_starts(*sorted_keys) -> np.ndarray:
    """True where a run of equal keys begins (keys already sorted together)."""
    n = sorted_keys[0].shape[0]
    starts = np.ones(n, dtype=bool)
    if n > 1:
        starts[1:] = np.logical_or.reduce([key[1:] != key[:-1] for key in sorted_keys])
    return starts


def _rank_in_runs(starts: np.ndarray) -> np.ndarray:
    """0-based position of each element within its run."""
    positions = np.arange(starts.shape[0])
    return positions - np.maximum.accumulate(np.where(starts, positions, 0))


def _drawn_trials(trials, rows, pids, cams):
    """Source 'draw' (tag 2): per group the ``shots`` rows with the smallest (hash, idx)."""
    group_keys = (cams, pids) if trials.group == "pid-camera" else (pids,)  # lexsort: last key first
    for t in range(trials.count):
        # For fixed (seed, t), H is one-to-one in idx (xor, add and mix are bijections of 64-bit
        # words), so the spec's tie-break on idx never applies: sorting by the hash is enough.
        hashes = hash_words(trials.seed, TRIAL_DRAW_TAG, t, rows)
        order = np.lexsort((hashes,) + group_keys)
        ranks = _rank_in_runs(_run_starts(*(key[order] for key in group_keys)))
        yield rows[order[ranks < trials.shots]]


def _pair_rows(rows, pids, cams) -> dict:
    """(pid, camera) -> that pair's rows in ascending index order (``rows`` ascending)."""
    order = np.lexsort((rows, cams, pids))
    starts = np.flatnonzero(_run_starts(pids[order], cams[order]))
    sorted_rows = rows[order]
    return {(int(pids[order[s]]), int(cams[order[s]])): part
            for s, part in zip(starts, np.split(sorted_rows, starts[1:]))}


def _mangye16_trials(trials, rows, pids, cams):
    """Source 'mangye16-random': upstream's loop, ``random.seed(trial)`` then one
    ``random.choice`` per (pid, camera) pair with images, pids ascending, cameras in order."""
    pairs = _pair_rows(rows, pids, cams)
    walk = [pairs[(pid, cam)].tolist() for pid in sorted({pid for pid, _ in pairs})
            for cam in trials.cameras if (pid, cam) in pairs]
    for t in range(trials.count):
        rng = random.Random(t)
        yield np.array([rng.choice(pair) for pair in walk], dtype=np.int64)


@dataclass(frozen=True)
class OfficialEntry:
    images: tuple  # 1-based ordinals within the (pid, camera) group, the trial's order
    line: int


@dataclass(frozen=True)
class OfficialTable:
    path: str
    entries: dict  # (trial, camera, pid) -> OfficialEntry


def load_official_table(path) -> OfficialTable:
    """Parse an official trial table (format in the module docstring); OptionError names the file
    and line of any fault."""
    entries = {}
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.reader(handle)
            header = None
            for fields in reader:
                fields = [field.strip() for field in fields]
                if not any(fields):
                    continue
                where = f"{path} line {reader.line_num}"
                if header is None:
                    header = _check_header(fields, where)
                    continue
                key, entry = _parse_entry(fields, where, reader.line_num)
                if key in entries:
                    raise OptionError(f"{where}: trial {key[0]}, camera {key[1]}, pid {key[2]} "
                                      f"already given on line {entries[key].line}")
                entries[key] = entry
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise OptionError(f"cannot read the official trial table {path}: {one_line(exc)}") from None
    if header is None:
        raise OptionError(f"{path}: the official trial table is empty; "
                          f"its first line must be {','.join(OFFICIAL_HEADER)}")
    return OfficialTable(path=str(path), entries=entries)


def _check_header(fields, where):
    """The first line must be the header: a file that is not a trial table (say, one a protocol file
    points at) is refused here, its text never echoed in the message."""
    if tuple(fields) != OFFICIAL_HEADER:
        raise OptionError(f"{where}: the header must be {','.join(OFFICIAL_HEADER)}; this is not an official trial table")
    return tuple(fields)


def _parse_entry(fields, where, line):
    if len(fields) != len(OFFICIAL_HEADER):
        raise OptionError(f"{where}: expected {len(OFFICIAL_HEADER)} fields "
                          f"({','.join(OFFICIAL_HEADER)}), got {len(fields)}")
    trial, camera, pid = (_parse_int(text, name, where) for text, name in zip(fields[:3], OFFICIAL_HEADER))
    if trial < 0:
        raise OptionError(f"{where}: trial must be 0 or more (0-based), got {trial}")
    images = tuple(_parse_int(text, "image", where) for text in fields[3].split())
    if not images:
        raise OptionError(f"{where}: no images listed")
    if min(images) < 1:
        raise OptionError(f"{where}: images are 1-based ordinals, got {min(images)}")
    if len(set(images)) != len(images):
        raise OptionError(f"{where}: an image is listed twice")
    return (trial, camera, pid), OfficialEntry(images=images, line=line)


def _parse_int(text, name, where) -> int:
    if not _INTEGER.fullmatch(text):
        raise OptionError(f"{where}: {name} must be an integer, got {text!r}")
    return int(text)


def _official_trials(trials, rows, pids, cams):
    """Source 'official': per trial and (pid, camera) group, the table's first ``shots`` images."""
    table = load_official_table(trials.path)
    _check_trial_numbers(table, trials.count)
    groups = _pair_rows(rows, pids, cams)
    for t in range(trials.count):
        chosen = [group[_listed_ordinals(table, t, pid, cam, group.shape[0])[:trials.shots] - 1]
                  for (pid, cam), group in groups.items()]
        yield np.concatenate(chosen) if chosen else np.empty(0, dtype=np.int64)


def _check_trial_numbers(table, T):
    for (trial, _, _), entry in table.entries.items():
        if trial >= T:
            raise OptionError(f"{table.path} line {entry.line}: trial {trial}, but the protocol has "
                              f"{T} trials (0..{T - 1})")
    missing = sorted(set(range(T)) - {trial for trial, _, _ in table.entries})
    if missing:
        raise OptionError(f"{table.path}: no line for trial {missing[0]}; the protocol has {T} trials (0..{T - 1})")


def _listed_ordinals(table, t, pid, cam, group_size) -> np.ndarray:
    """The table's images for a gallery group in trial t, checked against the group's size."""
    entry = table.entries.get((t, cam, pid))
    if entry is None:
        raise OptionError(f"{table.path}: trial {t} has no line for pid {pid} camera {cam}, which the gallery holds")
    if max(entry.images) > group_size:
        raise OptionError(f"{table.path} line {entry.line}: image {max(entry.images)} of pid {pid} camera "
                          f"{cam}, but the gallery holds {group_size} images of that pid and camera")
    return np.asarray(entry.images, dtype=np.int64)


_TRIAL_SOURCES = {"draw": _drawn_trials, "mangye16-random": _mangye16_trials, "official": _official_trials}
