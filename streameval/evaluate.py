"""``evaluate``: options -> plan -> Dask graph -> per-query state -> metrics.  The engine's entry point.

The pieces are shared with incremental updates (``incremental.py``): :class:`Settings` (the
options that decide the numbers), :func:`session` (where and in which chunks the graph runs) and
:func:`make_result` (per-query state -> the reported metrics).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import dask
import numpy as np
from threadpoolctl import threadpool_limits

from . import graph, kernels, metrics
from .choices import MAX_RANK_LIMIT, PRECISIONS
from .cluster import CONNECT_TIMEOUT_S, ClusterOptions, connect
from .errors import OptionError
from .gom import GomOptions, query_curves
from .outputs import check_folder
from .gom import summarize as summarize_gom
from .plan import DEFAULT_MEMORY_BUDGET, check_state_memory, make_plan, parse_bytes
from .progress import Bar, Phases, Reporter, ThreadedProgress, compile_timer, compute_distributed
from .protocol import Protocol
from .state import Positives, QueryState, RankState
from .store import Store, open_store, write_store

ARRAY_NAMES = {  # accepted names for in-memory input, long form first
    "query_features": ("query_features", "qf"),
    "query_pids": ("query_pids", "q_pids"),
    "query_camids": ("query_camids", "q_camids"),
    "gallery_features": ("gallery_features", "gf"),
    "gallery_pids": ("gallery_pids", "g_pids"),
    "gallery_camids": ("gallery_camids", "g_camids"),
}


@dataclass(frozen=True)
class Settings:
    """The validated options that decide the numbers (METRICS.md section 5)."""

    metric: str
    protocol: str
    junk_pids: tuple
    precision: str
    max_rank: int
    gom: GomOptions | None

    @classmethod
    def parse(cls, store: Store, metric=None, protocol="market", junk_pids=(-1,), max_rank=50, precision="float32",
              no_gom=False, gom_norm="minmax", gom_bins=100, gom_b=3000, gom_vp="reference") -> "Settings":
        metric = metric or store.default_metric
        if metric not in kernels.METRIC_CODES:
            raise OptionError(f"metric must be one of {', '.join(kernels.METRIC_CODES)}, got {metric!r}")
        if precision not in PRECISIONS:
            raise OptionError(f"precision must be float32 or float64, got {precision!r}")
        if not 1 <= max_rank <= MAX_RANK_LIMIT:
            raise OptionError(f"max_rank must be between 1 and {MAX_RANK_LIMIT:,}, got {max_rank}")
        junk = tuple(int(p) for p in Protocol.from_options(protocol, junk_pids).junk_pids)
        gom = None if no_gom else GomOptions.parse(gom_norm, gom_bins, gom_b, gom_vp)
        return cls(metric, protocol, junk, precision, max_rank, gom)

    def scoring(self, dim: int) -> graph.Scoring:
        return graph.Scoring(
            np.dtype(self.precision), kernels.METRIC_CODES[self.metric], Protocol.from_options(self.protocol, self.junk_pids),
            self.gom, kernels.dot_error_bound(dim, self.precision), kernels.bin_error_bound(dim, self.precision),
        )

    @property
    def minmax(self) -> bool:
        return self.gom is not None and self.gom.norm == "minmax"

    def to_options(self) -> dict:
        """The options as ``evaluate`` keyword arguments (``Settings.parse(store, **them)`` gives them back)."""
        gom = self.gom or GomOptions()
        return {"metric": self.metric, "protocol": self.protocol, "junk_pids": list(self.junk_pids),
                "max_rank": self.max_rank, "precision": self.precision, "no_gom": self.gom is None,
                "gom_norm": gom.spec, "gom_bins": gom.bins, "gom_b": gom.b, "gom_vp": gom.vp}

    def state_key(self) -> dict:
        """The options a saved per-query state depends on (max_rank, B and vp only shape the report)."""
        gom = None if self.gom is None else {"norm": self.gom.norm, "lo": self.gom.lo, "hi": self.gom.hi, "bins": self.gom.bins}
        return {"metric": self.metric, "protocol": self.protocol, "junk_pids": list(self.junk_pids),
                "precision": self.precision, "gom": gom}


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
        cluster = ClusterOptions(o["scheduler"], o["scheduler_file"], o["cluster"], o["n_workers"],
                                 o["threads_per_worker"], o["memory_limit"], o["connect_timeout"])
        return cls(o["query_block"], o["gallery_chunk"], o["memory_budget"], o["workers"], cluster, o["progress"])


EXECUTION_DEFAULTS = {  # where and in which chunks to run: the keywords evaluate and update share
    "query_block": None, "gallery_chunk": None, "memory_budget": DEFAULT_MEMORY_BUDGET, "workers": None,
    "scheduler": None, "scheduler_file": None, "cluster": None, "n_workers": None, "threads_per_worker": None,
    "memory_limit": None, "connect_timeout": CONNECT_TIMEOUT_S, "progress": False,
}


class Runner:
    """A connected session: the chunk plan, and the graphs of a run computed on the chosen scheduler
    under one progress bar (``bar``, None without progress).  The run's time is split in ``phases``:
    "setup" until the first compute, then "passes" (the bar's time) until ``close``."""

    def __init__(self, client, plan, phases: Phases, bar: Bar | None):
        self.client, self.plan, self.phases, self.bar = client, plan, phases, bar
        self.where = client.scheduler.address if client else "threads"
        self.running = False

    def expect(self, pass_name: str, work: int) -> None:
        """Announce the work of a pass a later compute will run (``Bar.expect``)."""
        if self.bar is not None:
            self.bar.expect(pass_name, work)

    def compute(self, built):
        """Run a delayed graph on the threaded scheduler (BLAS pinned to one thread meanwhile) or the client."""
        keys = self.bar.add_graph(built.__dask_graph__()) if self.bar is not None else []
        if not self.running:
            self.running = True
            started = self.phases.lap("setup")
            if self.bar is not None:
                self.bar.start(started)
        if self.client is None:
            watch = ThreadedProgress(self.bar) if self.bar is not None else nullcontext()
            try:
                with threadpool_limits(limits=1, user_api="blas"), watch:
                    # the scheduler itself, not "threads": naming one makes dask import distributed (0.3 s)
                    return dask.compute(built, scheduler=dask.threaded.get, num_workers=self.plan.workers)[0]
            finally:
                graph.release_scratch()
        if self.bar is None:
            return self.client.compute(built).result()
        return compute_distributed(self.client, built, keys, self.bar.finished)

    def close(self, completed: bool) -> None:
        """End the phase under way: the passes (and the bar: its 100% line if ``completed``), or the
        setup if nothing was computed."""
        now = self.phases.lap("passes" if self.running else "setup")
        if self.bar is not None and self.running:
            if completed:
                self.bar.close(now)
            else:
                self.bar.reporter.abandon()


@contextmanager
def session(store: Store, settings: Settings, execution: Execution, phases: Phases, label: str = "streameval"):
    """Connect (checked, see ``cluster.connect``) and plan the chunks; yield a :class:`Runner` whose
    progress bar is labelled ``label``.  Closing a cluster we connected to is a phase of its own."""
    with connect(execution.cluster, store) as client:
        client = client or _active_client()
        workers = execution.workers or (sum(client.nthreads().values()) if client else os.cpu_count() or 1)
        plan = make_plan(
            len(store.query), len(store.gallery), store.dim, np.dtype(settings.precision).itemsize,
            store.gallery.features.dtype.itemsize, store.gallery.chunk_rows, workers,
            parse_bytes(execution.memory_budget), execution.query_block, execution.gallery_chunk,
        )
        if settings.gom is not None:
            check_state_memory(len(store.query), settings.gom.bins + 2, workers, parse_bytes(execution.memory_budget),
                               f"--gom-bins {settings.gom.bins}")
        runner = Runner(client, plan, phases, _progress_bar(execution.progress, label))
        try:
            yield runner
        except BaseException:
            runner.close(completed=False)
            raise
        runner.close(completed=True)
    if execution.cluster.distributed:
        phases.lap("closing cluster")


def _progress_bar(progress, label: str) -> Bar | None:
    """``progress``: False, True (draw on stderr) or a text stream to draw on."""
    if not progress:
        return None
    return Bar(Reporter(label, progress if hasattr(progress, "write") else None))


def evaluate(
    data,
    *,
    metric: str | None = None,
    protocol: str = "market",
    junk_pids=(-1,),
    max_rank: int = 50,
    precision: str = "float32",
    no_gom: bool = False,
    gom_norm: str = "minmax",
    gom_bins: int = 100,
    gom_b: int = 3000,
    gom_vp: str = "reference",
    storage_options: dict | None = None,
    state: str | os.PathLike | None = None,
    overwrite_state: bool = False,
    **execution,
) -> metrics.Result:
    """Evaluate query against gallery features; return a :class:`~streameval.metrics.Result`.

    ``data`` is a store path or fsspec URL (with ``storage_options``), an opened
    :class:`~streameval.store.Store`, or a mapping of in-memory arrays (``query_features,
    query_pids, query_camids, gallery_features, gallery_pids, gallery_camids``, or the short names
    ``qf, q_pids, q_camids, gf, g_pids, g_camids``).

    GOM open-set metrics (``gom_*`` options, METRICS.md section 4) are computed unless ``no_gom``.

    ``execution`` keywords (``EXECUTION_DEFAULTS``) never change a number.  Chunks: ``query_block``
    queries x ``gallery_chunk`` gallery rows per task, by default planned from ``memory_budget``
    (bytes or e.g. "1GiB").  Where it runs: ``scheduler`` (tcp://host:port), ``scheduler_file`` or
    ``cluster="local"`` (with ``n_workers``, ``threads_per_worker``, ``memory_limit`` as for
    LocalCluster) run it on a Dask cluster (checked first, giving up after ``connect_timeout``
    seconds); otherwise an active ``dask.distributed`` Client is used, or else Dask's threaded
    scheduler with ``workers`` threads (default: all cores).  BLAS runs one thread per task.
    ``progress`` draws the run's progress on stderr (or on the text stream given): percent of the
    work, the pass under way, elapsed time and ETA.  ``result.run["phases"]`` splits the elapsed time.

    ``state``: also save the per-query state to this directory, so that ``streameval.update`` can
    later score only the gallery rows appended since (an existing state is replaced only with
    ``overwrite_state``).
    """
    phases = Phases()
    execution = Execution.from_options("evaluate", execution)
    store = _as_store(data, storage_options)
    settings = Settings.parse(store, metric, protocol, junk_pids, max_rank, precision, no_gom, gom_norm, gom_bins,
                              gom_b, gom_vp)
    if state is not None:
        from .statestore import check_writable

        check_folder(state, "state directory")
        check_writable(state, overwrite_state)
    with session(store, settings, execution, phases) as runner:
        query_state, read = full_state(store, settings, runner)
    if state is not None:
        from .statestore import save_state

        save_state(state, store, settings, query_state)
        phases.lap("saving state")
    return make_result(store, settings, query_state, runner, read, len(store.query) * len(store.gallery))


def full_state(store: Store, settings: Settings, runner: Runner) -> tuple[QueryState, int]:
    """Every query's state over the whole gallery, and the bytes the graph read."""
    scoring = settings.scoring(store.dim)
    positives, states, dist_range = runner.compute(graph.build(store.query, store.gallery, runner.plan, scoring))
    query_state = QueryState(Positives.concat(positives), RankState.concat(states), dist_range, len(store.gallery))
    passes = 2 if settings.minmax else 1
    read = graph.rows_bytes(store.query, len(store.query)) + sum(
        graph.positives_pass_bytes(store.gallery, runner.plan, block, 0, len(store.gallery))
        + passes * graph.rows_bytes(store.gallery, len(store.gallery)) for block in positives
    )
    return query_state, read


def make_result(store: Store, settings: Settings, state: QueryState, runner: Runner, bytes_read: int, pairs: int,
                **run_facts) -> metrics.Result:
    """Per-query values, closed-set and GOM aggregates of ``state``, and how the run went: ``pairs``
    scored, ``bytes_read``, any other ``run_facts``, and the time of each phase of ``runner.phases``,
    this one ("metrics") included, with numba's compiling or loading of the metric kernels (outside
    the progress bar) named apart."""
    with compile_timer() as compiling:
        per_query = metrics.query_values(state.positives, state.ranks)
        closed_set = metrics.closed_set(per_query, settings.max_rank)
        gom = None
        if settings.gom is not None:
            curves = query_curves(state.positives, state.ranks, settings.gom,
                                  graph.normalisation(settings.gom, state.dist_range))
            gom = summarize_gom(curves, per_query["n_positives"], settings.gom, state.dist_range)
            if settings.gom.norm == "fixed":
                gom["clipped"] = state.clipping(settings.gom.lo, settings.gom.hi)
    runner.phases.lap("metrics", carved={"compiling kernels": compiling.seconds} if compiling.seconds else None)
    n_valid = int((per_query["n_positives"] > 0).sum())
    return metrics.Result(
        n_queries=len(store.query), n_valid_queries=n_valid, n_open_queries=len(store.query) - n_valid,
        n_gallery=state.gallery_rows, metric=settings.metric, protocol=settings.protocol, max_rank=settings.max_rank,
        per_query=per_query, **closed_set, gom=gom,
        options={"junk_pids": list(settings.junk_pids), "precision": settings.precision},
        run={
            "query_block": runner.plan.query_block, "gallery_chunk": runner.plan.gallery_chunk,
            "workers": runner.plan.workers, "scheduler": runner.where, "bytes_read": bytes_read,
            **metrics.run_timing(dict(runner.phases.seconds), pairs), **run_facts,
        },
    )


def _as_store(data, storage_options=None) -> Store:
    if isinstance(data, Store):
        return data
    if isinstance(data, Mapping):
        return write_store(_memory_target(), *(pick_array(data, name) for name in ARRAY_NAMES))
    return open_store(data, storage_options=storage_options)


def pick_array(arrays: Mapping, name: str):
    for key in ARRAY_NAMES[name]:
        if key in arrays:
            return arrays[key]
    raise OptionError(f"input arrays lack '{name}' (or its short name '{ARRAY_NAMES[name][1]}')")


def _memory_target():
    import zarr.storage

    return zarr.storage.MemoryStore()


def _active_client():
    """The active dask.distributed Client, or None (distributed is an optional extra; without a
    client it is not imported: that alone would take 0.2 s of the run's setup)."""
    if "distributed" not in sys.modules:
        return None
    from distributed import default_client

    try:
        return default_client()
    except ValueError:
        return None
