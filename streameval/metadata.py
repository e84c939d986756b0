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

import numpy as np

from .graph import Metadata
from .protocol import Rules, in_relation
from .store import read_ids


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
    from .draws import trial_bits
    from .statistics.sgs import identities

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

