"""What a protocol must know about every row before scoring, read from ids alone: drawn trial
masks (docs/protocols.md#5-trials-and-seeds, #the-seeded-hash) and the identities
single-gallery-shot draws pick from (docs/protocols.md#cuhk03-sgs).

Protocols without trials or sgs need none of it (trial bits then come from cameras, chunk by
chunk), so a plain Market evaluation reads no id twice.  Otherwise the ids of every query and
gallery row are read once here, and this is the one place whose memory grows with the gallery's
length (never with queries x gallery): ids 16 bytes a row while the draws are made, trial bits 8
bytes a row for the run, and for sgs the kept rows per query camera, 8 bytes a row each.  Trial and
sgs protocols are those of datasets of tens of thousands of images (SYSU-MM01, VehicleID, CUHK03).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..protocols.rules import Rules, in_relation
from ..store import read_ids


@dataclass(frozen=True)
class Metadata:
    """What the protocol needs to know about all rows before scoring (``metadata.build``): drawn
    trial bits (None: from cameras, per chunk) and the identities sgs draws from (None without sgs)."""

    g_bits: np.ndarray | None = None  # per extended gallery row
    q_bits: np.ndarray | None = None  # per query row
    identities: Identities | None = None


@dataclass(frozen=True)
class Identities:
    """What the draws need about the gallery, from ids only (``graph.metadata``).

    ``pids``: the identities (sorted pid values) with a row some query may keep.  Per query camera
    class c (``q_classes``: the distinct query cameras), ``rows[c]``: the extended gallery rows a
    camera-c query keeps as negatives (in the gallery, not junk, camera pair not in x_any), sorted
    by (identity, row); ``starts[c, j]``, ``counts[c, j]``: identity j's rows in it (n_j(q))."""

    pids: np.ndarray
    q_classes: np.ndarray
    rows: list
    starts: np.ndarray
    counts: np.ndarray

    def identity_index(self, pid: np.ndarray) -> np.ndarray:
        """Index of each pid in ``pids``, -1 for a pid that is not an identity."""
        if self.pids.shape[0] == 0:
            return np.full(np.shape(pid), -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.pids, pid), self.pids.shape[0] - 1)
        return np.where(self.pids[at] == pid, at, -1).astype(np.int64)

    def camera_class(self, q_cam: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.q_classes, q_cam)


def identities(g_pid, g_cam, kept_base, q_cams, excluded_any) -> Identities:
    """``kept_base``: rows in the gallery and not junk; ``excluded_any(c, g_cam)``: whether x_any
    excludes each row for a camera-c query."""
    classes = np.unique(q_cams)
    pids = np.unique(g_pid[kept_base])
    rows, starts, counts = [], [], []
    for c in classes:
        kept = np.flatnonzero(kept_base & ~excluded_any(c, g_cam))
        kept = kept[np.argsort(g_pid[kept], kind="stable")]
        count = np.bincount(np.searchsorted(pids, g_pid[kept]), minlength=pids.shape[0])
        rows.append(kept)
        counts.append(count)
        starts.append(np.cumsum(count) - count)
    shape = (classes.shape[0], pids.shape[0])
    return Identities(pids, classes, rows, np.array(starts, dtype=np.int64).reshape(shape),
                      np.array(counts, dtype=np.int64).reshape(shape))


def needed(rules: Rules) -> bool:
    return rules.protocol.trials is not None or rules.protocol.cmc == "sgs"


def extended_ids(parts: tuple):
    """(pids, camids) of every extended gallery row."""
    ids = [read_ids(part.fs) for part in parts]
    return np.concatenate([pid for pid, _ in ids]), np.concatenate([cam for _, cam in ids])


def build(query, parts: tuple, rules: Rules) -> Metadata:
    """The metadata of ``rules``' protocol over the queries and the extended gallery ``parts``."""
    if not needed(rules):
        return Metadata()
    from ..protocols.draws import trial_bits

    protocol = rules.protocol
    q_pid, q_cam = read_ids(query)
    g_pid, g_cam = extended_ids(parts)
    g_bits = q_bits = None
    if protocol.trials is not None:
        g_bits, q_bits = trial_bits(protocol, g_pid, g_cam, q_pid, q_cam, len(parts[0].fs))
    ident = None
    if protocol.cmc == "sgs":
        in_gallery = rules.camera_bits(g_cam, protocol.gallery_cameras) != 0 if g_bits is None else g_bits != 0
        kept_base = in_gallery & (rules.junk_mask(g_pid) == 0)
        ident = identities(g_pid, g_cam, kept_base, q_cam, lambda c, cams: in_relation(protocol.x_any, c, cams))
    return Metadata(g_bits, q_bits, ident)

