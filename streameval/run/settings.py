"""The options of a run: :class:`Settings` (what decides the numbers) and :class:`Execution`
(where and in which chunks the graph runs, which never changes a number)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from ..engine import graph, kernels
from ..core.choices import PRECISIONS, check_range
from ..engine.cluster import CONNECT_TIMEOUT_S, ClusterOptions
from ..core.errors import OptionError
from ..features import REGISTRY
from ..engine.plan import parse_bytes
from ..protocols.rules import Rules
from ..protocols.record import Protocol
from ..engine.device import parse_device
from ..engine.sources import block_source
from ..store import Store

PROTOCOL_OPTIONS = ("junk_pids", "denominator", "cmc", "trials", "trial_source", "shots", "seed", "sgs_mode",
                    "sgs_repeats", "camera_rule", "direction")  # protocols.resolve's overrides


@dataclass(frozen=True)
class Settings:
    """The validated options that decide the numbers (docs/options.md, docs/protocols.md#4-changing-a-field-from-the-command-line)."""

    metric: str
    protocol: Protocol
    precision: str
    max_rank: int
    std_ddof: int = 1
    # each feature's Spec, None when off (features.REGISTRY: its parse, statistics, options, state key)
    gom: object = None  # gom.GomOptions: GOM's thresholds
    ranked: object = None  # ranked.Spec: the top-k lists the pass keeps
    open_set: object = None  # openset.Spec: DIR@FPIR targets and ranks
    verification: object = None  # verification.Spec: TAR@FAR, AUC, ROC
    rerank: object = None  # rerank.Spec: re-ranking and query expansion, then the re-ranked distances

    @classmethod
    def parse(cls, store: Store, metric=None, protocol="market", max_rank=50, precision="float32", std_ddof=1,
              **options) -> "Settings":
        """``options``: the features' keywords (``Feature.parse``) and the protocol's overrides."""
        from ..protocols import resolve

        overrides = {key: options.pop(key) for key in PROTOCOL_OPTIONS if key in options}
        stored = store is not None and store.holds_distances  # (no store: a saved state's recorded options)
        if stored:
            metric, precision = stored_metric(store, metric), "float64"
        metric = metric or store.default_metric
        if metric not in kernels.METRIC_CODES:
            raise OptionError(f"metric must be one of {', '.join(kernels.METRIC_CODES)}, got {metric!r}")
        if precision not in PRECISIONS:
            raise OptionError(f"precision must be float32 or float64, got {precision!r}")
        if precision == "float32" and store is not None and store.query.features is not None and \
                store.query.features.dtype == np.float64:
            raise OptionError(f"'{store.path}' holds float64 features, which float32 GEMMs would round: evaluate "
                              "with --precision float64 (precision='float64')")
        max_rank = check_range(max_rank, "max_rank")
        if std_ddof not in (0, 1):
            raise OptionError(f"std_ddof must be 1 (sample standard deviation) or 0, got {std_ddof!r}")
        if isinstance(protocol, Mapping):  # a resolved record, as results and states hold it
            protocol = Protocol.from_record(protocol)
        resolved = resolve(protocol, **{k: v for k, v in overrides.items() if v is not None})
        if store is not None and not store.cameras and resolved.camera_fields:
            from ..io import NO_CAMERAS_HINT

            raise OptionError(f"'{store.path}' has no camera ids (its input had none), but protocol '{resolved.name}' "
                              f"uses them ({', '.join(resolved.camera_fields)}): {NO_CAMERAS_HINT}")
        if stored:
            check_stored_protocol(store, resolved)
        base = cls(metric, resolved, precision, max_rank, std_ddof)
        specs = {feature.name: feature.parse(base, store, options) for feature in REGISTRY if feature.setting}
        if options:
            raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(options))}")
        return replace(base, **specs)

    @property
    def rules(self) -> Rules:
        return Rules.of(self.protocol)

    @property
    def n_trials(self) -> int:
        return self.rules.n_trials

    def statistics(self, meta, dim: int) -> tuple:
        """The statistics the scoring pass counts for these settings."""
        from ..features.closed_set.slots import Slots

        return (Slots(self.n_trials), *(stat for feature in REGISTRY for stat in feature.statistics(self, meta, dim)))

    def scoring(self, dim: int, meta, device: str | None = None) -> graph.Scoring:
        """What the passes score with, the GEMMs on ``device`` (``Execution.device``)."""
        source = block_source(self.metric, dim, self.precision, device)
        for feature in filter(lambda feature: feature.setting, REGISTRY):
            source = feature.block_source(getattr(self, feature.name), source)
        return graph.Scoring(np.dtype(self.precision), source, self.rules, self.gom, self.statistics(meta, dim))

    @property
    def minmax(self) -> bool:
        return self.gom is not None and self.gom.norm == "minmax"

    def to_options(self) -> dict:
        """The options as ``evaluate`` keyword arguments (``Settings.parse(store, **them)`` gives them back)."""
        options = {"metric": self.metric, "protocol": self.protocol.to_record(), "max_rank": self.max_rank,
                   "precision": self.precision, "std_ddof": self.std_ddof}
        for feature in filter(lambda feature: feature.setting, REGISTRY):
            options.update(feature.to_options(getattr(self, feature.name)))
        return options

    def state_key(self) -> dict:
        """The options a saved per-query state depends on (max_rank, say, only shapes the report)."""
        key = {"metric": self.metric, "protocol": self.protocol.to_record(), "precision": self.precision}
        for feature in REGISTRY:
            key.update(feature.state_key(self))
        return key


@dataclass(frozen=True)
class Execution:
    """Where and in which chunks the graph runs; never changes a number."""

    query_block: int | None = None
    gallery_chunk: int | None = None
    memory_budget: object = None  # a size (``plan.parse_bytes``); None: ``plan.default_memory_budget``
    workers: int | None = None
    cluster: ClusterOptions = ClusterOptions()
    progress: object = False  # False, True (draw on stderr) or a text stream to draw on
    knn_cache: str | None = None  # re-ranking's kNN lists kept and reused here (features/rerank/cache.py)
    device: str | None = None  # where the GEMMs run (engine/device.py): None, the CPU path

    @classmethod
    def from_options(cls, caller: str, options: dict) -> "Execution":
        """From the execution keywords of ``evaluate`` / ``update`` (``EXECUTION_DEFAULTS``)."""
        unknown = sorted(set(options) - set(EXECUTION_DEFAULTS))
        if unknown:
            raise TypeError(f"{caller}() got unexpected keyword argument(s): {', '.join(unknown)}")
        o = {**EXECUTION_DEFAULTS, **options}
        memory_limit = None if o["memory_limit"] is None else parse_bytes(o["memory_limit"])  # Dask gets bytes
        cluster = ClusterOptions(o["scheduler"], o["scheduler_file"], o["cluster"], o["n_workers"],
                                 o["threads_per_worker"], memory_limit, o["connect_timeout"])
        return cls(o["query_block"], o["gallery_chunk"], o["memory_budget"], o["workers"], cluster, o["progress"],
                   o["knn_cache"], parse_device(o["device"]))


EXECUTION_DEFAULTS = {  # where and in which chunks to run: the keywords evaluate and update share
    "query_block": None, "gallery_chunk": None, "memory_budget": None, "workers": None,
    "scheduler": None, "scheduler_file": None, "cluster": None, "n_workers": None, "threads_per_worker": None,
    "memory_limit": None, "connect_timeout": CONNECT_TIMEOUT_S, "progress": False, "knn_cache": None,
    "device": None,
}


def stored_metric(store: Store, metric) -> str:
    """A distance store's "metric": its kind (the stored values are the distances)."""
    if metric not in (None, store.kind):
        raise OptionError(f"'{store.path}' holds precomputed {store.kind}s: --metric {metric} does not apply "
                          "(leave it out)")
    return store.kind


def check_stored_protocol(store: Store, protocol) -> None:
    """What a distance store holds is enough for the protocol."""
    if protocol.gallery_includes_queries and store.query.distances is None:
        raise OptionError(f"protocol '{protocol.name}' includes the queries in the gallery, but '{store.path}' has no "
                          "query x query distances (write them with query_distances=...)")
    if "t2v" in protocol.directions:
        raise OptionError(f"'{store.path}' holds query x gallery distances for one direction; evaluate direction "
                          "t2v from a distance store of its own (--direction v2t here)")
