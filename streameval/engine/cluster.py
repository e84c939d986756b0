"""Where the graph runs: Dask's threaded scheduler (default), an existing cluster, or a LocalCluster.

Exactly one level of parallelism: Dask runs tasks; inside a task the kernels are serial and BLAS
and numba use one thread.  Worker processes we start get the thread-pinning environment; workers of
an existing cluster are pinned at connection time (``threadpoolctl``, process-wide).

Before any work starts, ``connect`` checks that the scheduler answers, that it and every worker
import streameval, and that every worker can open the store; each failure is one clear
:class:`ClusterError`.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

from ..core.choices import check_range
from ..core.errors import OptionError, StreamevalError
from ..core.extras import require_extra

PIN_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
# The worker processes of a local cluster log only what is critical: they share the user's stderr, and
# Dask's own logs of a run's end (a heartbeat racing the scheduler's close, under load) are tracebacks;
# streameval reports a cluster's failures itself, in one line.  Set before each process starts (its
# logging is configured as it imports distributed), keeping Dask's other pre-spawn variables.
QUIET_WORKERS = {"distributed.nanny.pre-spawn-environ.DASK_LOGGING__DISTRIBUTED": "critical"}
CONNECT_TIMEOUT_S = 15
# What a LocalCluster worker process holds once it has loaded streameval's engine and read a row of
# the store (preflight): measured 134 MiB (64 MiB when started), rounded up.
WORKER_MEMORY = 160 << 20


class ClusterError(StreamevalError):
    """The Dask cluster cannot run the evaluation."""

    exit_code = 4


@dataclass(frozen=True)
class ClusterOptions:
    """``scheduler`` (tcp://host:port) | ``scheduler_file`` | ``cluster='local'`` (+ LocalCluster
    arguments); all None: Dask's threaded scheduler in this process."""

    scheduler: str | None = None
    scheduler_file: str | None = None
    cluster: str | None = None
    n_workers: int | None = None
    threads_per_worker: int | None = None
    memory_limit: int | None = None  # bytes per worker (plan.parse_bytes reads the option)
    connect_timeout: float = CONNECT_TIMEOUT_S

    def __post_init__(self):
        local_only = [name for name in ("n_workers", "threads_per_worker", "memory_limit") if getattr(self, name) is not None]
        if local_only and self.cluster != "local":
            flags = ", ".join("--" + name.replace("_", "-") for name in local_only)
            raise OptionError(f"{flags} configure the workers streameval starts: use with --cluster local "
                              "(an existing cluster's workers are configured where they are started)")
        for name in (*local_only, "connect_timeout"):
            check_range(getattr(self, name), name)

    @property
    def distributed(self) -> bool:
        return any((self.scheduler, self.scheduler_file, self.cluster))


def _check_local_workers(options: ClusterOptions) -> None:
    """Refuse a LocalCluster this machine cannot hold before starting it: a --memory-limit a worker
    cannot run in (Dask would pause and restart it until a connection closed), or more worker
    processes than the memory holds (they would start for minutes, then swap).  Dask pauses a
    worker at the ``pause`` fraction of its limit."""
    import dask

    from .plan import format_bytes, physical_memory

    pause = dask.config.get("distributed.worker.memory.pause", 0.8) or 1.0
    needed = int(WORKER_MEMORY / pause)
    if options.memory_limit is not None and options.memory_limit < needed:
        raise ClusterError(f"--memory-limit {format_bytes(options.memory_limit)} is less than a Dask worker needs to run: "
                           f"at least {format_bytes(needed)} (a worker holds about {format_bytes(WORKER_MEMORY)} with "
                           f"streameval loaded, and Dask pauses it at {pause:.0%} of its limit)")
    memory = physical_memory()
    if options.n_workers is not None and memory is not None and options.n_workers * WORKER_MEMORY > memory:
        raise OptionError(f"--n-workers {options.n_workers:,} needs about "
                          f"{format_bytes(options.n_workers * WORKER_MEMORY)} for its worker processes (about "
                          f"{format_bytes(WORKER_MEMORY)} each), more than this machine's memory "
                          f"({format_bytes(memory)}): use at most {memory // WORKER_MEMORY:,}")


@contextmanager
def connect(options: ClusterOptions, store=None):
    """Yield a checked ``distributed.Client`` for the options, or None for the threaded scheduler."""
    if not options.distributed:
        yield None
        return
    given = [name for name in ("scheduler", "scheduler_file", "cluster") if getattr(options, name)]
    if len(given) > 1:
        raise ClusterError(f"choose one of --scheduler, --scheduler-file, --cluster (got {', '.join(given)})")
    distributed = require_extra("distributed", package="distributed", extra="distributed",
                                purpose="running on a Dask cluster", error=ClusterError)
    cluster = None
    try:
        if options.cluster is not None:
            if options.cluster != "local":
                raise ClusterError(f"--cluster supports 'local', got {options.cluster!r}")
            _check_local_workers(options)
            import dask

            with dask.config.set(QUIET_WORKERS):
                cluster = distributed.LocalCluster(n_workers=options.n_workers, processes=True, env=PIN_ENV,
                                                   threads_per_worker=options.threads_per_worker,
                                                   memory_limit=options.memory_limit or "auto",
                                                   dashboard_address=None)
            client = distributed.Client(cluster)
        else:
            client = _client_for(distributed, options)
    except (ClusterError, OptionError):
        raise
    except Exception as exc:  # failures to start or reach a cluster come in many types
        raise ClusterError(f"cannot start or reach the Dask cluster: {exc}") from None
    try:
        preflight(client, store, options.connect_timeout)
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _client_for(distributed, options: ClusterOptions):
    if options.scheduler_file is not None:
        if not os.path.exists(options.scheduler_file):
            raise ClusterError(f"scheduler file '{options.scheduler_file}' does not exist (start 'dask scheduler --scheduler-file' first)")
        where = f"the scheduler of '{options.scheduler_file}'"
        kwargs = {"scheduler_file": options.scheduler_file}
    else:
        where = options.scheduler
        kwargs = {"address": options.scheduler}
    try:
        return distributed.Client(timeout=options.connect_timeout, **kwargs)
    except Exception as exc:
        raise ClusterError(f"cannot reach the Dask scheduler at {where} within {options.connect_timeout:g} s: {exc}") from None


def _streameval_version():
    import streameval

    return streameval.__version__


def _read_on_worker(store):
    """Read the first row of each set exactly as tasks will (the pickled arrays); None when fine."""
    from streameval.store import read_ids

    try:
        for feature_set in (store.query, store.gallery):
            feature_set.values[0:1]
            read_ids(feature_set, 0, 1)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _pin_threads():
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1)
    return True


def preflight(client, store=None, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Fail before any work: no workers, streameval missing on scheduler or workers, unreadable store."""
    try:
        client.wait_for_workers(1, timeout=timeout)
    except Exception:
        raise ClusterError(f"the Dask scheduler at {client.scheduler.address} has no workers") from None
    try:
        client.run_on_scheduler(_streameval_version)
    except Exception as exc:
        raise ClusterError(f"the Dask scheduler cannot import streameval ({exc}); install it where the scheduler runs") from None
    try:
        client.run(_streameval_version)
    except Exception as exc:
        raise ClusterError(f"a Dask worker cannot import streameval ({exc}); install it on every worker") from None
    if store is not None:
        failures = {w: err for w, err in client.run(_read_on_worker, store).items() if err}
        if failures:
            worker, err = next(iter(failures.items()))
            raise ClusterError(f"{len(failures)} worker(s) cannot read the store '{store.path}', e.g. {worker}: {err}")
    client.run(_pin_threads)
