"""The named protocols of docs/protocols.md#2-the-presets: each a Protocol record, with its aliases, one
line on the published numbers it reproduces, and the code or paper it follows."""

from __future__ import annotations

from dataclasses import dataclass

from .record import CameraRelation, Protocol, SgsSpec, TrialSpec

NO_CAMERA_RULE = CameraRelation()
SAME_CAMERA = CameraRelation(equal=True)


@dataclass(frozen=True)
class Preset:
    protocol: Protocol  # protocol.name is the canonical name
    aliases: tuple  # other names that resolve to the same record
    reproduces: str  # one line: the published numbers
    reference: str  # owner/repo commit file, or the paper


def _sysu(name: str, search: str, gallery_cameras: tuple) -> Preset:
    """SYSU-MM01 (docs/protocols.md#sysu-all-sysu-indoor): infrared queries from cameras 3 and 6, an RGB gallery drawn
    once per trial (one image per identity and camera), query camera 3 never sees gallery camera 2."""
    protocol = Protocol(
        name=name, x_same=SAME_CAMERA, x_any=CameraRelation(pairs=((3, 2),)), cmc="identity-dedup",
        trials=TrialSpec(count=10, source="draw", group="pid-camera", shots=1, seed=0, cameras=gallery_cameras),
        query_cameras=(3, 6), gallery_cameras=gallery_cameras,
    )
    cameras = ", ".join(str(c) for c in gallery_cameras)
    return Preset(protocol, (), f"SYSU-MM01 {search} (IR cameras 3, 6 -> RGB {cameras}): identity-dedup CMC, mAP, "
                                f"mINP, mean of 10 gallery trials",
                  "wuancong/SYSU-MM01 0499112 evaluation/evaluation_SYSU_MM01.m; "
                  "mangye16/Cross-Modal-Re-ID-baseline e817a26 eval_metrics.py (eval_sysu)")


PRESETS: dict[str, Preset] = {preset.protocol.name: preset for preset in (
    Preset(Protocol(name="market"), ("duke", "msmt17", "cuhk03-np", "veri776"),
           "Market-1501, DukeMTMC-reID, MSMT17, CUHK03-NP, VeRi-776 as torchreid / fast-reid score them",
           "KaiyangZhou/deep-person-reid f8cd150 torchreid/metrics/rank.py (eval_market1501)"),
    Preset(Protocol(name="none", x_same=NO_CAMERA_RULE), ("last",),
           "LaST (its camera id is an image index: nothing excluded) and stores without cameras",
           "shuxjweb/last 805ff08 utils/reid_metric.py"),
    Preset(Protocol(name="cuhk03-sgs", x_same=SAME_CAMERA, cmc="sgs", sgs=SgsSpec()), (),
           "classic CUHK03 Rank-1/5/10/20, single gallery shot, 10 seeded repeats (open-reid: "
           "camera_rule separate-cameras)",
           "KaiyangZhou/deep-person-reid f8cd150 torchreid/metrics/rank.py (eval_cuhk03); "
           "Cysu/open-reid 3293ca7 reid/evaluation_metrics/ranking.py"),
    _sysu("sysu-all", "all-search", (1, 2, 4, 5)),
    _sysu("sysu-indoor", "indoor-search", (1, 2)),
    Preset(Protocol(name="regdb", x_same=NO_CAMERA_RULE, directions=("v2t", "t2v")), (),
           "RegDB visible-to-thermal and thermal-to-visible, one split per run (mean: streameval aggregate)",
           "mangye16/Cross-Modal-Re-ID-baseline e817a26 eval_metrics.py (eval_regdb)"),
    Preset(Protocol(name="vehicleid", x_same=NO_CAMERA_RULE, gallery_includes_queries=True,
                    trials=TrialSpec(count=10, source="draw", group="pid", shots=1, seed=0, queries="not-in-gallery")),
           (), "VehicleID test lists: one gallery image per vehicle, the rest as queries, 10 seeded draws",
           "Liu et al., Deep Relative Distance Learning, CVPR 2016; "
           "JDAI-CV/fast-reid c9bc3ce fastreid/data/datasets/vehicleid.py"),
    Preset(Protocol(name="mars", x_same=SAME_CAMERA, gallery_includes_queries=True, reference_ap="trapezoid"), (),
           "MARS official video protocol: query tracklets appended to the gallery, trapezoid AP",
           "liangzheng06/MARS-evaluation 9cef3e4 utils/evaluation_mars.m"),
)}

ALIASES: dict[str, str] = {alias: name for name, preset in PRESETS.items() for alias in preset.aliases}


def preset(name: str) -> Protocol | None:
    """The preset named ``name`` (or one of its aliases), else None."""
    found = PRESETS.get(ALIASES.get(name, name))
    return found.protocol if found else None


def presets_table() -> list[tuple[str, tuple, str, str]]:
    """(name, aliases, what it reproduces, reference) per preset, in listing order."""
    return [(name, p.aliases, p.reproduces, p.reference) for name, p in PRESETS.items()]
