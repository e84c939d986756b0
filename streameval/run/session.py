"""Where and in which chunks a run's graphs are computed: :func:`session` connects (``cluster``),
plans the chunks within the memory budget (:func:`run_plan`: one account of the tasks and the
statistics' states, :func:`check_memory`) and compiles the kernels by a rehearsal
(:func:`rehearse`), yielding a :class:`Runner`."""

from __future__ import annotations

import math
import os
import sys
from contextlib import contextmanager, nullcontext
from dataclasses import replace

import dask
import numpy as np
from threadpoolctl import threadpool_limits

from ..engine import scratch, tiny
from ..engine.cluster import connect
from ..engine.device import open_where_run
from ..core.errors import OptionError
from .pipeline import gallery_metadata, run_passes
from ..engine.plan import format_bytes, make_plan, resolve_budget
from ..core.progress import (COMPILING, Bar, Phases, Reporter, ThreadedProgress, compile_timer, compile_watch,
                             compute_distributed)
from .settings import Execution, Settings
from ..store import Store


class Runner:
    """A connected session: the chunk plan, the gallery metadata every pass reads (``meta``), and the
    graphs of a run computed on the chosen scheduler under one progress bar (``bar``, None without
    progress).  The run's time is split in ``phases``: "setup", "compiling kernels"
    (the session's rehearsal), then "passes" (the bar's time) from the first compute until ``close``, less
    what numba still compiled meanwhile (``compiled``: also booked as "compiling kernels", the bar
    says "compiling kernels" while it happens)."""

    def __init__(self, client, plan, phases: Phases, bar: Bar | None, meta=None, knn_cache=None, device=None,
                 devices: str = "cpu"):
        self.client, self.plan, self.phases, self.bar, self.meta = client, plan, phases, bar, meta
        self.knn_cache = knn_cache  # where the kNN pass's lists are kept and reused (--knn-cache), if anywhere
        self.device = device  # where the GEMMs run (``Execution.device``): None, the CPU path
        self.devices = devices  # those devices as the result reports them (``device.open_where_run``)
        self.where = client.scheduler.address if client else "threads"
        self.running = False
        self.compiled = 0.0

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
        with compile_timer() as compiling, compile_watch(self.bar):
            done = self._run(built, keys)
        self.compiled += compiling.seconds  # (the timer adds up as its block ends)
        return done

    def _run(self, built, keys: list):
        if self.client is None:
            watch = ThreadedProgress(self.bar) if self.bar is not None else nullcontext()
            try:
                with threadpool_limits(limits=1, user_api="blas"), watch:
                    # the scheduler itself, not "threads": naming one makes dask import distributed (0.3 s)
                    return dask.compute(built, scheduler=dask.threaded.get, num_workers=self.plan.workers)[0]
            finally:
                scratch.release()
        if self.bar is None:
            return self.client.compute(built).result()
        return compute_distributed(self.client, built, keys, self.bar.finished)

    def close(self, completed: bool) -> None:
        """End the phase under way: the passes (and the bar: its 100% line if ``completed``), or the
        setup if nothing was computed."""
        now = self.phases.lap("passes" if self.running else "setup",
                              carved={COMPILING: self.compiled} if self.compiled else None)
        if self.bar is not None and self.running:
            if completed:
                self.bar.close(now)
            else:
                self.bar.reporter.abandon()


@contextmanager
def session(store: Store, settings: Settings, execution: Execution, phases: Phases, label: str = "streameval",
            meta=None):
    """Connect (checked, see ``cluster.connect``), open the device where the GEMMs run
    (``device.open_where_run``), read the gallery metadata (``meta`` if given: a
    suite's stacked variants take the clean rows'), plan the chunks and compile (or load from numba's
    cache) every kernel the run will call by a rehearsal (``rehearse``), a phase of its own; yield a
    :class:`Runner` whose progress bar is labelled ``label``.  Closing a cluster we connected to is a
    phase of its own too."""
    with connect(execution.cluster, store) as client:
        client = client or _active_client()
        devices = "cpu" if execution.device is None else open_where_run(client, execution.device,
                                                                        np.dtype(settings.precision))
        workers = execution.workers or (sum(client.nthreads().values()) if client else os.cpu_count() or 1)
        meta = gallery_metadata(store, settings) if meta is None else meta
        shown = execution.progress  # False, True (draw on stderr) or a text stream to draw on
        bar = Bar(Reporter(label, shown if hasattr(shown, "write") else None), workers=workers) if shown else None
        runner = Runner(client, run_plan(store, settings, execution, workers, meta), phases, bar, meta,
                        execution.knn_cache, execution.device, devices)
        try:
            phases.lap("setup")
            with bar.compiling() if bar is not None else nullcontext():
                rehearse(store, settings)
            phases.lap(COMPILING)
            yield runner
        except BaseException:
            runner.close(completed=False)
            raise
        runner.close(completed=True)
    if execution.cluster.distributed:
        phases.lap("closing cluster")


_rehearsed: set = set()  # what this process rehearsed already: its kernels are in memory


def rehearse(store, settings) -> bool:
    """Evaluate a tiny problem shaped like ``store`` with ``settings`` (one direction, as the
    session runs it): every kernel the real run calls is compiled or loaded from numba's cache.
    False when the rehearsal cannot run for these settings (then the passes compile, and say so)."""
    from ..features.verification.placement import eligible

    shape = tiny.shape_of(store)
    key = (settings, *shape.items())
    if key in _rehearsed:
        return True
    try:
        tiny_settings = replace(settings, protocol=tiny.without_tables(settings.protocol))
        problem = tiny.tiny_store(tiny_settings.protocol, **shape)
        execution = Execution(query_block=len(problem.query), gallery_chunk=tiny.TINY_CHUNK)
        meta = gallery_metadata(problem, tiny_settings)
        runner = Runner(None, run_plan(problem, tiny_settings, execution, 2, meta), Phases(), None, meta)
        if eligible(tiny_settings):  # the two-pass route's refinement, where the real run's bands miss
            run_passes(problem, tiny_settings, runner, place=False)
        run_passes(problem, tiny_settings, runner).result(problem, runner)
    except Exception:  # e.g. a memory check the tiny plan fails: the rehearsal decides no number, and what
        return False  # it could not compile the passes compile (booked as compiling all the same)
    _rehearsed.add(key)
    return True


def run_plan(store: Store, settings: Settings, execution: Execution, workers: int, meta):
    """The chunk plan of evaluating ``store``'s queries against its gallery, the run's memory
    (``check_memory``) within the budget."""
    budget = resolve_budget(execution.memory_budget, workers)
    plan = make_plan(
        len(store.query), len(store.gallery), store.dim, np.dtype(settings.precision).itemsize,
        store.gallery.values.dtype.itemsize, store.gallery.chunk_rows, workers,
        budget, execution.query_block, execution.gallery_chunk,
    )
    check_memory(store, settings, plan, budget, meta)
    return plan


def check_memory(store: Store, settings: Settings, plan, budget: int, meta) -> None:
    """Refuse, before any work, a run whose memory exceeds ``budget``: one account of the tasks
    (``plan.workers`` at once, each ``plan.task_bytes``) and of every ``Field`` the run's statistics
    declare (its dtype x shape, per row of its axis), times the states the graph holds at once
    (``graph.scoring_pass``): each worker's chain task holds its predecessor's state and the copy it
    adds its chunk to (2 x workers states of a query block), and the query blocks' finished states
    wait to be joined (every query once; a global field once per block).  A positive-axis field is
    counted one row per query: the positives are not known before their pass.  The error names the
    largest part, and what fits of the option that sizes it (``Statistic.option``)."""
    n_query, chains = len(store.query), 2 * plan.workers
    held = {"global": len(plan.query_ranges(n_query)) + chains}
    held["query"] = held["positive"] = n_query + chains * plan.query_block
    parts = [(None, plan.workers * plan.task_bytes)] + [
        (stat, sum(held[spec.axis] * math.prod(spec.shape) * np.dtype(spec.dtype).itemsize
                   for spec in stat.fields.values())) for stat in settings.statistics(meta, store.dim)]
    needed = sum(part for _, part in parts)
    if needed <= budget:
        return
    stat, most = max(parts, key=lambda part: part[1])
    if stat is None:
        largest = f"{plan.workers} task(s) of {plan.query_block:,} queries x {plan.gallery_chunk:,} gallery rows"
        advice = "give a smaller --query-block / --gallery-chunk or raise --memory-budget"
    elif stat.option:
        flag, value, unit, row_bytes, axis = stat.option
        fits = max(0, value - math.ceil((needed - budget) / (row_bytes * held[axis])))
        largest, advice = f"{flag} {value}", f"use at most {fits:,} {unit} or raise --memory-budget"
    else:
        largest, advice = f"the {stat.name} statistic ({', '.join(stat.fields)})", "raise --memory-budget"
    raise OptionError(f"this run needs about {format_bytes(needed)} for {n_query:,} queries on {plan.workers} "
                      f"worker(s), more than the memory budget of {format_bytes(budget)}; the most, "
                      f"{format_bytes(most)}, for {largest}: {advice}")


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
