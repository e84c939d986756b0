"""The options of a run: :class:`Settings` (what decides the numbers) and :class:`Execution`
(where and in which chunks the graph runs, which never changes a number)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from . import graph, kernels
from .choices import PRECISIONS, check_range
from .cluster import CONNECT_TIMEOUT_S, ClusterOptions
from .errors import OptionError
from .gom import GomOptions
from .plan import DEFAULT_MEMORY_BUDGET, parse_bytes
from .protocol import Rules
from .protocols.record import Protocol
from .sources import block_source
from .store import Store

PROTOCOL_OPTIONS = ("junk_pids", "denominator", "cmc", "trials", "trial_source", "shots", "seed", "sgs_mode",
                    "sgs_repeats", "camera_rule", "direction")  # protocols.resolve's overrides


@dataclass(frozen=True)
class Settings:
    """The validated options that decide the numbers (docs/options.md, docs/protocols.md#4-changing-a-field-from-the-command-line)."""

    metric: str
    protocol: Protocol
    precision: str
    max_rank: int
    gom: GomOptions | None
    std_ddof: int = 1
    ranked: object = None  # ranked.Spec: the top-k lists the pass keeps (None: no ranked lists)
    open_set: object = None  # openset.Spec: DIR@FPIR targets and ranks (None: no open-set identification)
    verification: object = None  # verification.Spec: TAR@FAR, AUC, ROC (None: no pair-level verification)

    @classmethod
    def parse(cls, store: Store, metric=None, protocol="market", max_rank=50, precision="float32", no_gom=False,
              gom_norm="minmax", gom_bins=100, gom_b=3000, gom_vp="reference", std_ddof=1, ranked=None,
              open_set=None, verification=None, **overrides) -> "Settings":
        from .openset import Spec as OpenSetSpec
        from .protocols import resolve
        from .ranked import Spec

        unknown = sorted(set(overrides) - set(PROTOCOL_OPTIONS))
        if unknown:
            raise TypeError(f"unexpected keyword argument(s): {', '.join(unknown)}")
        stored = store is not None and store.holds_distances  # (no store: a saved state's recorded options)
        if stored:
            metric, precision = stored_metric(store, metric), "float64"
        metric = metric or store.default_metric
        if metric not in kernels.METRIC_CODES:
            raise OptionError(f"metric must be one of {', '.join(kernels.METRIC_CODES)}, got {metric!r}")
        if precision not in PRECISIONS:
            raise OptionError(f"precision must be float32 or float64, got {precision!r}")
        max_rank = check_range(max_rank, "max_rank")
        if std_ddof not in (0, 1):
            raise OptionError(f"std_ddof must be 1 (sample standard deviation) or 0, got {std_ddof!r}")
        if isinstance(protocol, Mapping):  # a resolved record, as results and states hold it
            protocol = Protocol.from_record(protocol)
        resolved = resolve(protocol, **{k: v for k, v in overrides.items() if v is not None})
        if store is not None and not store.cameras and resolved.camera_fields:
            from .io import NO_CAMERAS_HINT

            raise OptionError(f"'{store.path}' has no camera ids (its input had none), but protocol '{resolved.name}' "
                              f"uses them ({', '.join(resolved.camera_fields)}): {NO_CAMERAS_HINT}")
        if stored:
            check_stored_protocol(store, resolved)
        gom = None if no_gom else GomOptions.parse(gom_norm, gom_bins, gom_b, gom_vp)
        ranked = Spec.parse(ranked, Rules.of(resolved).n_trials)
        from .verification import Spec as VerificationSpec, pair_bound

        verification = VerificationSpec.parse(verification, None if store is None else pair_bound(store, resolved),
                                              Rules.of(resolved).n_trials)
        return cls(metric, resolved, precision, max_rank, gom, std_ddof, ranked,
                   open_set=OpenSetSpec.parse(open_set, max_rank), verification=verification)

    @property
    def rules(self) -> Rules:
        return Rules.of(self.protocol)

    @property
    def n_trials(self) -> int:
        return self.rules.n_trials

    def statistics(self, meta, dim: int) -> tuple:
        """The statistics the scoring pass counts for these settings."""
        from .statistics.dedup import Dedup
        from .statistics.gom_hist import GomHist
        from .statistics.sgs import SgsExpected, SgsSampled
        from .statistics.slots import Slots

        stats = [Slots(self.n_trials)]
        if self.gom is not None:
            stats.append(GomHist(self.n_trials, self.gom.bins, self.gom.norm == "fixed",
                                 kernels.bin_error_bound(dim, self.precision)))
        if self.protocol.cmc == "identity-dedup":
            stats.append(Dedup(self.n_trials, self.max_rank))
        sgs = self.protocol.sgs
        if sgs is not None and sgs.mode in ("sampled", "both"):
            stats.append(SgsSampled(sgs.repeats, sgs.seed))
        if sgs is not None and sgs.mode in ("expected", "both"):
            stats.append(SgsExpected(meta.identities.pids.shape[0]))
        if self.ranked is not None:
            stats.append(self.ranked.statistic())
        if self.open_set is not None:
            from .statistics.nearest import Nearest

            stats.append(Nearest(self.n_trials))
        if self.verification is not None:
            stats.append(self.verification.statistic(self.n_trials, self.precision))
        return tuple(stats)

    def scoring(self, dim: int, meta) -> graph.Scoring:
        return graph.Scoring(np.dtype(self.precision), block_source(self.metric, dim, self.precision), self.rules,
                             self.gom, self.statistics(meta, dim), first=self.first_statistics())

    def first_statistics(self) -> tuple:
        """The statistics riding minmax GOM normalisation's first pass: verification's counting
        bands when they do (``bands.Bands.first``)."""
        bands = None if self.verification is None else self.verification.bands
        if bands is None or bands.first is None:
            return ()
        from .statistics.verify import Verify

        return (Verify(self.n_trials, self.verification.hist_bits, 0, False, False, bands.first),)

    @property
    def minmax(self) -> bool:
        return self.gom is not None and self.gom.norm == "minmax"

    def to_options(self) -> dict:
        """The options as ``evaluate`` keyword arguments (``Settings.parse(store, **them)`` gives them back)."""
        gom = self.gom or GomOptions()
        return {"metric": self.metric, "protocol": self.protocol.to_record(), "max_rank": self.max_rank,
                "precision": self.precision, "no_gom": self.gom is None, "gom_norm": gom.spec, "gom_bins": gom.bins,
                "gom_b": gom.b, "gom_vp": gom.vp, "std_ddof": self.std_ddof,
                **({} if self.ranked is None else {"ranked": self.ranked.to_record()}),
                **({} if self.open_set is None else {"open_set": self.open_set.to_record()}),
                **({} if self.verification is None else {"verification": self.verification.to_record()})}

    def state_key(self) -> dict:
        """The options a saved per-query state depends on (B, vp and, unless the identity-dedup
        state is as long as it, max_rank only shape the report)."""
        gom = None if self.gom is None else {"norm": self.gom.norm, "lo": self.gom.lo, "hi": self.gom.hi, "bins": self.gom.bins}
        key = {"metric": self.metric, "protocol": self.protocol.to_record(), "precision": self.precision, "gom": gom}
        if self.protocol.cmc == "identity-dedup":
            key["max_rank"] = self.max_rank
        if self.ranked is not None:
            key["ranked"] = self.ranked.to_record()
        if self.open_set is not None:  # the nearest-item state; targets and ranks only shape the report
            key["open_set"] = True
        if self.verification is not None:  # the arrays; FAR targets and the refinement's budget only shape the report
            key["verification"] = {name: self.verification.to_record()[name] for name in ("hist_bits", "core", "auc")}
        return key


@dataclass(frozen=True)
class Execution:
    """Where and in which chunks the graph runs; never changes a number."""

    query_block: int | None = None
    gallery_chunk: int | None = None
    memory_budget: object = DEFAULT_MEMORY_BUDGET
    workers: int | None = None
    cluster: ClusterOptions = ClusterOptions()
    progress: object = False  # False, True (draw on stderr) or a text stream to draw on

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
        return cls(o["query_block"], o["gallery_chunk"], o["memory_budget"], o["workers"], cluster, o["progress"])


EXECUTION_DEFAULTS = {  # where and in which chunks to run: the keywords evaluate and update share
    "query_block": None, "gallery_chunk": None, "memory_budget": DEFAULT_MEMORY_BUDGET, "workers": None,
    "scheduler": None, "scheduler_file": None, "cluster": None, "n_workers": None, "threads_per_worker": None,
    "memory_limit": None, "connect_timeout": CONNECT_TIMEOUT_S, "progress": False,
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
