"""``evaluate``: options -> plan -> Dask graph -> metrics.  The one entry point of the engine."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from contextlib import nullcontext

import dask
import numpy as np
from threadpoolctl import threadpool_limits

from . import graph, kernels, metrics
from .cluster import CONNECT_TIMEOUT_S, ClusterOptions, connect
from .errors import OptionError
from .gom import CURVES, GomOptions
from .gom import summarize as summarize_gom
from .plan import DEFAULT_MEMORY_BUDGET, make_plan, parse_bytes
from .progress import Reporter, ThreadedProgress, wait_distributed
from .protocol import Protocol
from .store import Store, open_store, write_store

PRECISIONS = ("float32", "float64")
ARRAY_NAMES = {  # accepted names for in-memory input, long form first
    "query_features": ("query_features", "qf"),
    "query_pids": ("query_pids", "q_pids"),
    "query_camids": ("query_camids", "q_camids"),
    "gallery_features": ("gallery_features", "gf"),
    "gallery_pids": ("gallery_pids", "g_pids"),
    "gallery_camids": ("gallery_camids", "g_camids"),
}


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
    query_block: int | None = None,
    gallery_chunk: int | None = None,
    memory_budget=DEFAULT_MEMORY_BUDGET,
    workers: int | None = None,
    scheduler: str | None = None,
    scheduler_file: str | None = None,
    cluster: str | None = None,
    n_workers: int | None = None,
    threads_per_worker: int | None = None,
    memory_limit: str | None = None,
    connect_timeout: float = CONNECT_TIMEOUT_S,
    storage_options: dict | None = None,
    progress: bool = False,
) -> metrics.Result:
    """Evaluate query against gallery features; return a :class:`~streameval.metrics.Result`.

    ``data`` is a store path or fsspec URL (with ``storage_options``), an opened
    :class:`~streameval.store.Store`, or a mapping of in-memory arrays (``query_features,
    query_pids, query_camids, gallery_features, gallery_pids, gallery_camids``, or the short names
    ``qf, q_pids, q_camids, gf, g_pids, g_camids``).

    GOM open-set metrics (``gom_*`` options, METRICS.md section 4) are computed unless ``no_gom``.

    Where it runs: ``scheduler`` (tcp://host:port), ``scheduler_file`` or ``cluster="local"`` (with
    ``n_workers``, ``threads_per_worker``, ``memory_limit`` as for LocalCluster) run it on a Dask
    cluster (checked first, giving up after ``connect_timeout`` seconds); otherwise an active ``dask.distributed`` Client is used, or else Dask's threaded
    scheduler with ``workers`` threads (default: all cores).  BLAS runs one thread per task.
    ``progress`` draws task progress on stderr.
    """
    started = time.perf_counter()
    store = _as_store(data, storage_options)
    metric = metric or store.default_metric
    if metric not in kernels.METRIC_CODES:
        raise OptionError(f"metric must be one of {', '.join(kernels.METRIC_CODES)}, got {metric!r}")
    if precision not in PRECISIONS:
        raise OptionError(f"precision must be float32 or float64, got {precision!r}")
    if max_rank < 1:
        raise OptionError(f"max_rank must be at least 1, got {max_rank}")
    gom_options = None if no_gom else GomOptions.parse(gom_norm, gom_bins, gom_b, gom_vp)
    scoring = graph.Scoring(
        np.dtype(precision), kernels.METRIC_CODES[metric], Protocol.from_options(protocol, junk_pids), gom_options,
        kernels.dot_error_bound(store.dim, precision), kernels.bin_error_bound(store.dim, precision),
    )
    options = ClusterOptions(scheduler, scheduler_file, cluster, n_workers, threads_per_worker, memory_limit, connect_timeout)
    with connect(options, store) as client:
        client = client or _active_client()
        workers = workers or (sum(client.nthreads().values()) if client else os.cpu_count() or 1)
        plan = make_plan(
            len(store.query), len(store.gallery), store.dim, scoring.dtype.itemsize,
            store.gallery.features.dtype.itemsize, store.gallery.chunk_rows, workers,
            parse_bytes(memory_budget), query_block, gallery_chunk,
        )
        where = client.scheduler.address if client else "threads"
        reporter = Reporter() if progress else None
        blocks, dist_range = _compute(client, graph.build(store.query, store.gallery, plan, scoring), plan, reporter)
    elapsed = time.perf_counter() - started
    per_query = metrics.concat_blocks(blocks, metrics.PER_QUERY_FIELDS)
    n_valid = int((per_query["n_positives"] > 0).sum())
    return metrics.Result(
        n_queries=len(store.query), n_valid_queries=n_valid, n_open_queries=len(store.query) - n_valid,
        n_gallery=len(store.gallery), metric=metric, protocol=protocol, max_rank=max_rank,
        per_query=per_query, **metrics.closed_set(per_query, max_rank),
        gom=None if no_gom else summarize_gom(
            metrics.concat_blocks([b["gom"] for b in blocks], CURVES), per_query["n_positives"], gom_options, dist_range
        ),
        options={"junk_pids": [int(p) for p in scoring.protocol.junk_pids], "precision": precision},
        run={
            "query_block": plan.query_block, "gallery_chunk": plan.gallery_chunk, "workers": plan.workers,
            "scheduler": where,
            "elapsed_s": elapsed, "pairs_per_s": len(store.query) * len(store.gallery) / elapsed,
            "bytes_read": graph.bytes_read(store.query, store.gallery, plan, scoring, blocks),
        },
    )


def _compute(client, built, plan, reporter):
    """Run the graph on the threaded scheduler (BLAS pinned to one thread meanwhile) or the client."""
    if client is None:
        watch = ThreadedProgress(reporter) if reporter else nullcontext()
        try:
            with threadpool_limits(limits=1, user_api="blas"), watch:
                return dask.compute(built, scheduler="threads", num_workers=plan.workers)[0]
        finally:
            graph.release_scratch()
    future = client.compute(built)
    wait_distributed(client, [future], reporter)
    return future.result()


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
    """The active dask.distributed Client, or None (distributed is an optional extra)."""
    try:
        from distributed import default_client
    except ImportError:
        return None
    try:
        return default_client()
    except ValueError:
        return None
