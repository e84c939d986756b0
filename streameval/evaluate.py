"""``evaluate``: options -> plan -> Dask graph -> per-query state -> metrics.  The engine's entry point.

The pieces are shared with incremental updates (``incremental.py``): :func:`session` (where and in
which chunks the graph runs, for the options in ``settings.py``) and :func:`make_result` (per-query
state -> the reported metrics).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import replace

import dask
import numpy as np
from threadpoolctl import threadpool_limits

from . import graph, metrics, scratch, tiny
from .cluster import connect
from .errors import OptionError
from .locking import writing
from .outputs import check_folder
from .plan import check_state_memory, make_plan, parse_bytes
from .progress import (COMPILING, Bar, Phases, Reporter, ThreadedProgress, compile_timer, compile_watch,
                       compute_distributed)
from .state import Positives, QueryState
from .settings import PROTOCOL_OPTIONS, Execution, Settings
from .statistics import StatState
from .store import Store, open_store, write_store

ARRAY_NAMES = {  # accepted names for in-memory input, long form first
    "query_features": ("query_features", "qf"),
    "query_pids": ("query_pids", "q_pids"),
    "query_camids": ("query_camids", "q_camids"),
    "gallery_features": ("gallery_features", "gf"),
    "gallery_pids": ("gallery_pids", "g_pids"),
    "gallery_camids": ("gallery_camids", "g_camids"),
}


class Runner:
    """A connected session: the chunk plan, and the graphs of a run computed on the chosen scheduler
    under one progress bar (``bar``, None without progress).  The run's time is split in ``phases``:
    "setup", "compiling kernels" (``compile_kernels``), then "passes" (the bar's time) from the first
    compute until ``close``, less what numba still compiled meanwhile (``compiled``: also booked as
    "compiling kernels", the bar says "compiling kernels" while it happens)."""

    def __init__(self, client, plan, phases: Phases, bar: Bar | None):
        self.client, self.plan, self.phases, self.bar = client, plan, phases, bar
        self.where = client.scheduler.address if client else "threads"
        self.running = False
        self.compiled = 0.0

    def compile_kernels(self, store: Store, settings: Settings) -> None:
        """Compile (or load from numba's cache) every kernel the run will call, before its passes,
        by a rehearsal on a tiny problem (``rehearse``): a phase of its own."""
        self.phases.lap("setup")
        with self.bar.compiling() if self.bar is not None else nullcontext():
            rehearse(store, settings)
        self.phases.lap(COMPILING)

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
def session(store: Store, settings: Settings, execution: Execution, phases: Phases, label: str = "streameval"):
    """Connect (checked, see ``cluster.connect``), plan the chunks and compile the kernels; yield a
    :class:`Runner` whose progress bar is labelled ``label``.  Closing a cluster we connected to is a
    phase of its own."""
    with connect(execution.cluster, store) as client:
        client = client or _active_client()
        workers = execution.workers or (sum(client.nthreads().values()) if client else os.cpu_count() or 1)
        runner = Runner(client, run_plan(store, settings, execution, workers), phases,
                        _progress_bar(execution.progress, label, workers))
        try:
            runner.compile_kernels(store, settings)
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
    from .features.verification.placement import eligible

    shape = tiny.shape_of(store)
    key = (settings, *shape.items())
    if key in _rehearsed:
        return True
    try:
        tiny_settings = replace(settings, protocol=tiny.without_tables(settings.protocol))
        problem = tiny.tiny_store(tiny_settings.protocol, **shape)
        execution = Execution(query_block=len(problem.query), gallery_chunk=tiny.TINY_CHUNK)
        runner = Runner(None, run_plan(problem, tiny_settings, execution, workers=2), Phases(), None)
        if eligible(tiny_settings):  # the two-pass route's refinement, where the real run's bands miss
            score_all(problem, tiny_settings, runner, bands=False)
        placed, state, read, meta, verified = score_all(problem, tiny_settings, runner)
        make_result(problem, placed, state, runner, read, 1, meta, verification=verified)
    except Exception:  # e.g. a memory check the tiny plan fails: the rehearsal decides no number, and what
        return False  # it could not compile the passes compile (booked as compiling all the same)
    _rehearsed.add(key)
    return True


def run_plan(store: Store, settings: Settings, execution: Execution, workers: int):
    """The chunk plan of evaluating ``store``'s queries against its gallery, the per-query state
    memory of the requested statistics checked against the budget."""
    budget = parse_bytes(execution.memory_budget)
    plan = make_plan(
        len(store.query), len(store.gallery), store.dim, np.dtype(settings.precision).itemsize,
        store.gallery.values.dtype.itemsize, store.gallery.chunk_rows, workers,
        budget, execution.query_block, execution.gallery_chunk,
    )
    if settings.gom is not None:
        check_state_memory(len(store.query), settings.gom.bins + 2, workers, budget, f"--gom-bins {settings.gom.bins}")
    if settings.ranked is not None:
        settings.ranked.check_memory(len(store.query), workers, budget)
    if settings.verification is not None:
        from .features.verification.spec import check_memory

        check_memory(settings.verification, settings.n_trials, workers, budget)
    return plan


def _progress_bar(progress, label: str, workers: int) -> Bar | None:
    """``progress``: False, True (draw on stderr) or a text stream to draw on."""
    if not progress:
        return None
    return Bar(Reporter(label, progress if hasattr(progress, "write") else None), workers=workers)


def evaluate(
    data,
    *,
    metric: str | None = None,
    protocol="market",
    max_rank: int = 50,
    precision: str = "float32",
    no_gom: bool = False,
    gom_norm: str = "minmax",
    gom_bins: int = 100,
    gom_b: int = 3000,
    gom_vp: str = "reference",
    std_ddof: int = 1,
    storage_options: dict | None = None,
    state: str | os.PathLike | None = None,
    overwrite_state: bool = False,
    **options,
) -> metrics.Result:
    """Evaluate query against gallery features; return a :class:`~streameval.metrics.Result`.

    ``data`` is a store path or fsspec URL (with ``storage_options``), an opened
    :class:`~streameval.store.Store`, or a mapping of in-memory arrays (``query_features,
    query_pids, query_camids, gallery_features, gallery_pids, gallery_camids``, or the short names
    ``qf, q_pids, q_camids, gf, g_pids, g_camids``); instead of the features, a query x gallery
    matrix: ``distances`` (smaller is closer) or ``similarity`` (larger is closer), with
    ``query_distances`` (query x query, same kind) for protocols that need it, as a distance store.

    ``protocol``: a preset name (``streameval protocols`` lists them), a .toml / .json protocol
    file, or a ``protocols.Protocol``; its fields can be overridden (docs/protocols.md#4-changing-a-field-from-the-command-line):
    ``junk_pids``, ``denominator``, ``cmc``, ``trials``, ``trial_source``, ``shots``, ``seed``,
    ``sgs_mode``, ``sgs_repeats``, ``camera_rule``, ``direction``.  With trials (or sgs repeats) the
    headline values are the trials' means and ``result.trials`` holds each trial and the spread
    (std with ``std_ddof``).  A protocol with two directions (regdb) gives ``result.directions``.

    GOM open-set metrics (``gom_*`` options, docs/metrics.md#5-open-set-metrics-gom) are computed unless ``no_gom``.

    The other keywords (``EXECUTION_DEFAULTS``) never change a number.  Chunks: ``query_block``
    queries x ``gallery_chunk`` gallery rows per task, by default planned from ``memory_budget``
    (bytes, or a size such as "1GiB" = 2^30 or "4GB" = 4 * 10^9: every size option reads units so).
    Where it runs: ``scheduler`` (tcp://host:port), ``scheduler_file`` or ``cluster="local"`` (with
    ``n_workers``, ``threads_per_worker``, ``memory_limit``, a size, as for LocalCluster) run it on
    a Dask cluster (checked first, giving up after ``connect_timeout`` seconds); otherwise an
    active ``dask.distributed`` Client is used, or else Dask's threaded scheduler with ``workers``
    threads (default: all cores).  BLAS runs one thread per task.
    ``progress`` draws the run's progress on stderr (or on the text stream given): percent of the
    work, the pass under way, elapsed time and ETA.  ``result.run["phases"]`` splits the elapsed time.

    ``state``: also save the per-query state to this directory, so that ``streameval.update`` can
    later score only the gallery rows appended since (an existing state is replaced only with
    ``overwrite_state``).

    ``ranked_list=K``: also keep each query's top-K ranked list (docs/ranked-lists.md, in the same
    pass) of trial ``trial`` (default 0), with the excluded rows before the K-th kept one if
    ``with_junk``; ``result.ranked_lists`` holds the lists of the queries ``queries`` selects
    ("all", "worst:N", "best:N", "ids:3,7"; worst and best by ``sort_by``: "ap", "inp" or "rank"),
    with every positive's rank if ``with_positives`` (docs/ranked-lists.md).

    ``verification=True``: also pair-level verification, ``result.verification``
    (docs/verification.md#definitions): TAR at the FAR targets ``far`` (default 1e-4, 1e-3, 1e-2; exact decimals) with the
    achieved FAR and threshold, the AUC if ``auc``, ROC / DET points at ``hist_bits`` resolution;
    one pass when the tail of smallest negatives fits ``tail_budget`` bytes (default 64 MiB), else
    an exact refinement in further passes (docs/verification.md).

    ``query_variant``, ``gallery_variant``: evaluate these feature variants of the store's sets
    (docs/variants.md) instead of the clean features, e.g. one evaluation of a suite.

    ``open_set=True``: also open-set identification, ``result.open_set`` (docs/open-set.md#definitions,
    in the same pass): DIR at the FPIR targets ``fpir`` (default 0.001, 0.01, 0.1; exact decimals)
    and ranks ``dir_ranks`` (default 1, 5, 10, 20), k rounded as ``fpir_rounding`` ("round": half
    up, as Liao; or "floor") (docs/open-set.md).
    """
    from .openset import request as open_set_request
    from .ranked import request
    from .features.verification.spec import request as verification_request

    phases = Phases()
    overrides = {key: options.pop(key) for key in PROTOCOL_OPTIONS if key in options}
    ranked, selection = request(options)
    open_set = open_set_request(options)
    verification = verification_request(options)
    variants = options.pop("query_variant", None), options.pop("gallery_variant", None)
    execution = Execution.from_options("evaluate", options)
    store = as_store(data, storage_options)
    settings = Settings.parse(store, metric, protocol, max_rank, precision, std_ddof, no_gom=no_gom, gom_norm=gom_norm,
                              gom_bins=gom_bins, gom_b=gom_b, gom_vp=gom_vp, ranked=ranked, open_set=open_set,
                              verification=verification, **overrides)
    store = with_variants(store, settings.protocol, *variants)
    if len(settings.protocol.directions) == 2:
        if state is not None:
            raise OptionError("a state holds one direction: evaluate with direction='v2t' or 't2v' to save one")
        if ranked is not None:
            raise OptionError("ranked lists hold one direction: evaluate with direction='v2t' or 't2v' for them")
        return _both_directions(store, settings, execution, phases)
    store = oriented(store, settings.protocol)
    if selection is not None:
        selection.check(len(store.query))
    if state is not None:
        from .statestore import check_updatable

        if store.holds_distances:
            raise OptionError(f"'{store.path}' holds precomputed distances, which appended rows would change "
                              "(re-ranking): it keeps no state for incremental updates (--state)")
        check_updatable(settings)
        check_folder(state, "state directory")
    with writing(state):  # the state's writer lock, from its check to its save (none without a state)
        if state is not None:
            from .statestore import check_writable

            check_writable(state, overwrite_state)
        with session(store, settings, execution, phases) as runner:
            # a saved state keeps the two-pass route's arrays: no bands
            settings, query_state, read, meta, verified = score_all(store, settings, runner, bands=state is None)
        if state is not None:
            from .statestore import save_state

            save_state(state, store, settings, query_state)
            phases.lap("saving state")
    return make_result(store, settings, query_state, runner, read, len(store.query) * query_state.gallery_rows, meta,
                       selection=selection, verification=verified)


def with_variants(store: Store, protocol, query_variant: str | None, gallery_variant: str | None) -> Store:
    """The store with the named feature variants (docs/variants.md) in place of its clean sets.
    The names are the evaluation's sides: with direction t2v the queries are the store's gallery."""
    if query_variant is None and gallery_variant is None:
        return store
    from .store.variants import CLEAN, variant_set

    if len(protocol.directions) == 2:
        raise OptionError("feature variants are evaluated one direction at a time: set direction 'v2t' or 't2v'")
    chosen = {store_set(protocol, "query"): query_variant or CLEAN, store_set(protocol, "gallery"): gallery_variant or CLEAN}
    return replace(store, **{name: variant_set(store, name, variant) for name, variant in chosen.items()})


def store_set(protocol, side: str) -> str:
    """The store's set that is the evaluation's ``side`` ("query" or "gallery"): with direction
    t2v the queries are the store's gallery."""
    return {"query": "gallery", "gallery": "query"}[side] if protocol.directions == ("t2v",) else side


def oriented(store: Store, protocol) -> Store:
    """The store as the protocol's single direction reads it: ``t2v`` swaps queries and gallery."""
    if protocol.directions == ("t2v",):
        return replace(store, query=store.gallery, gallery=store.query)
    return store


def _both_directions(store: Store, settings: Settings, execution: Execution, phases: Phases) -> metrics.Result:
    """Each direction evaluated on its own; the first one's result (timed from the start, ``phases``)
    holds both under ``directions``."""
    results = {}
    for direction in settings.protocol.directions:
        one = replace(settings, protocol=replace(settings.protocol, directions=(direction,)))
        swapped = oriented(store, one.protocol)
        with session(swapped, one, execution, phases if not results else Phases()) as runner:
            one, query_state, read, meta, verified = score_all(swapped, one, runner)
        results[direction] = make_result(swapped, one, query_state, runner, read,
                                         len(swapped.query) * query_state.gallery_rows, meta, verification=verified)
    first = results[settings.protocol.directions[0]]
    # each direction's per-query arrays too (the JSON shows them with --per-query, as the top level's)
    first.directions = {name: result.to_dict(per_query=True) for name, result in results.items()}
    return first


def score_all(store: Store, settings: Settings, runner: Runner, bands: bool = True):
    """Every pass of a one-direction evaluation on ``runner``: (the settings with verification's
    bands placed if ``bands``, the query state, the bytes read, the metadata, the verification
    section or None)."""
    from .features.verification.placement import place as place_bands
    from .features.verification.report import report as verification_report

    meta = gallery_metadata(store, settings)
    if bands:
        settings = place_bands(store, settings, runner, meta)
    query_state, read, meta = full_state(store, settings, runner, meta)
    return settings, query_state, read, meta, verification_report(store, settings, query_state, runner, meta)


def gallery_metadata(store: Store, settings: Settings) -> graph.Metadata:
    """What every pass reads of the rows' ids: identities, trial membership (``metadata.build``)."""
    from . import metadata

    parts = graph.gallery_parts(store.query, store.gallery, settings.protocol.gallery_includes_queries)
    return metadata.build(store.query, parts, settings.rules)


def full_state(store: Store, settings: Settings, runner: Runner, meta: graph.Metadata | None = None):
    """Every query's state over the whole extended gallery, the bytes the graph read, the metadata
    (``meta`` if given: a stack of query variants takes the clean queries')."""
    parts = graph.gallery_parts(store.query, store.gallery, settings.protocol.gallery_includes_queries)
    meta = gallery_metadata(store, settings) if meta is None else meta
    scoring = settings.scoring(store.dim, meta)
    positives, states, dist_range = runner.compute(graph.build(store.query, parts, runner.plan, scoring, meta))
    query_state = QueryState(Positives.concat(positives), StatState.concat(states), dist_range,
                             graph.extended_rows(parts))
    passes = 2 if settings.minmax else 1
    read = graph.rows_bytes(store.query, len(store.query)) + sum(
        graph.positives_pass_bytes(runner.plan, parts, block, 0, query_state.gallery_rows)
        + passes * graph.rows_bytes(parts[0].fs, query_state.gallery_rows) for block in positives
    )
    return query_state, read, meta


def make_result(store: Store, settings: Settings, state: QueryState, runner: Runner, bytes_read: int, pairs: int,
                meta=None, selection=None, verification=None, **run_facts) -> metrics.Result:
    """Per-query values, closed-set and GOM aggregates of ``state`` per trial, their means when
    there are several, and how the run went: ``pairs`` scored, ``bytes_read``, any other
    ``run_facts``, and the time of each phase of ``runner.phases``, this one ("metrics") included,
    with numba's compiling or loading of kernels the rehearsal did not meet named apart.
    With ranked lists, the lists of the queries ``selection`` (a ``ranked.Selection``) names;
    ``verification``: the section ``verification.report`` made while the session was open (its
    refinement may take further passes); each other feature's section is made here (``Feature.finalise``)."""
    from . import trials
    from .features import REGISTRY
    from .store import read_ids

    meta = meta or graph.Metadata()
    finalising = [feature for feature in REGISTRY
                  if feature.finalise is not None and getattr(settings, feature.name) is not None]
    with compile_timer() as compiling:
        q_cam = read_ids(store.query)[1]
        q_bits = meta.q_bits if meta.q_bits is not None else settings.rules.camera_bits(
            q_cam, settings.protocol.query_cameras)
        norms = graph.normalisations(settings.gom, state.dist_range, settings.n_trials)
        found, extras = trials.entries(state, settings, q_bits, q_cam, meta, norms)
        values, block = trials.headline(found, settings.max_rank, settings.std_ddof)
        sections = {"gom": values["gom"], "verification": verification}
        for feature in (feature for feature in finalising if feature.phase is None):
            sections[feature.name] = feature.finalise(store, settings, state, q_bits, selection)
    runner.phases.lap("metrics", carved={COMPILING: compiling.seconds} if compiling.seconds else None)
    for feature in (feature for feature in finalising if feature.phase is not None):
        sections[feature.name] = feature.finalise(store, settings, state, q_bits, selection)
        runner.phases.lap(feature.phase)
    per_query = found[0]["per_query"] if len(found) == 1 else {
        name: np.stack([entry["per_query"][name] for entry in found]) for name in found[0]["per_query"]}
    cmc = values["cmc"]
    return metrics.Result(
        n_queries=values["n_queries"], n_valid_queries=values["n_valid_queries"],
        n_open_queries=values["n_open_queries"], n_gallery=state.gallery_rows, metric=settings.metric,
        protocol=settings.protocol.name, max_rank=settings.max_rank, per_query=per_query,
        cmc=None if cmc is None else np.asarray(cmc), mAP=values["mAP"], mAP_trapezoid=values["mAP_trapezoid"],
        mINP=values["mINP"], options={"precision": settings.precision, "std_ddof": settings.std_ddof},
        run={
            "query_block": runner.plan.query_block, "gallery_chunk": runner.plan.gallery_chunk,
            "workers": runner.plan.workers, "scheduler": runner.where, "bytes_read": bytes_read,
            **metrics.run_timing(dict(runner.phases.seconds), pairs), **run_facts,
        },
        protocol_record=settings.protocol.to_record(), cmc_flavour=settings.protocol.cmc, cmc_first_hit=values["cmc_first_hit"],
        cmc_sgs_expected=None if extras.get("cmc_sgs_expected") is None else list(map(float, extras["cmc_sgs_expected"])),
        trials=block, warnings=camera_set_warnings(store, settings.protocol, q_cam),
        **{feature.result_field: sections.get(feature.name) for feature in REGISTRY if feature.result_field},
    )


def camera_set_warnings(store: Store, protocol, q_cam: np.ndarray) -> list[str]:
    """A warning for each side whose protocol camera set (query_cameras, gallery_cameras) keeps
    under half of its rows: most likely the store counts cameras otherwise than the protocol (SYSU's
    cameras are 1-6; 0-based ids drop most queries), and the numbers over the few rows kept look
    normal.  The gallery's camera ids are read a chunk at a time, only when it has a camera set."""
    from .store import read_field

    def gallery_chunks():
        fs = store.gallery
        for start in range(0, len(fs), fs.chunk_rows):
            yield np.asarray(read_field(fs, "camids", slice(start, min(start + fs.chunk_rows, len(fs)))))

    warnings = []
    for what, allowed, chunks in (("queries", protocol.query_cameras, lambda: iter([q_cam])),
                                  ("gallery rows", protocol.gallery_cameras, gallery_chunks)):
        if allowed is None:
            continue
        kept, shifted, total, held = 0, 0, 0, np.zeros(0, dtype=np.int64)
        for cams in chunks():
            kept, total = kept + int(np.isin(cams, allowed).sum()), total + cams.shape[0]
            shifted += int(np.isin(cams + 1, allowed).sum())  # as if the store counted cameras from 0
            held = np.union1d(held, cams)
        if 2 * kept < total:
            warnings.append(_camera_set_warning(protocol.name, what, (kept, shifted, total), allowed, held))
    return warnings


def _camera_set_warning(name: str, what: str, counts: tuple, allowed: tuple, held: np.ndarray) -> str:
    kept, shifted, total = counts
    shown = ", ".join(str(c) for c in held[:12]) + (f", ... ({held.shape[0]:,} cameras)" if held.shape[0] > 12 else "")
    field = "query_cameras" if what == "queries" else "gallery_cameras"
    hint = (f"; counted from 1, the store's camera ids would keep {shifted:,} (are they 0-based?)"
            if 2 * shifted >= total else "")
    return (f"protocol '{name}' keeps {kept:,} of {total:,} {what}: its {field} are "
            f"{', '.join(str(c) for c in allowed)}, but the store's {what} have cameras {shown}{hint}")


MATRIX_KINDS = {"distances": "distance", "similarity": "similarity"}  # in-memory matrix key -> distance store kind


def as_store(data, storage_options=None) -> Store:
    """The Store of what ``evaluate``, ``update`` and the suite take: a Store, a path or URL, or
    in-memory arrays (features and ids, or a query x gallery matrix) written to a store in memory."""
    if isinstance(data, Store):
        return data
    if isinstance(data, Mapping):
        if any(key in data for key in MATRIX_KINDS):
            return _matrix_store(data)
        return write_store(_memory_target(), *(pick_array(data, name) for name in ARRAY_NAMES))
    return open_store(data, storage_options=storage_options)


def _matrix_store(arrays: Mapping) -> Store:
    """An in-memory query x gallery matrix (``distances`` or ``similarity``, larger is closer) with
    the ids, optionally ``query_distances`` (query x query, of the same kind), as a distance store
    in memory: evaluated exactly as one written by ``write_distance_store`` or ``convert --distances``."""
    from .store.distances import write_distance_store

    given = [key for key in MATRIX_KINDS if key in arrays]
    features = [key for name in ("query_features", "gallery_features") for key in ARRAY_NAMES[name] if key in arrays]
    if len(given) > 1 or features:
        raise OptionError(f"input arrays hold {' and '.join(given + features)}: give one query x gallery matrix "
                          "(distances or similarity) or the features, not both")
    ids = [pick_array(arrays, name) for name in ARRAY_NAMES if not name.endswith("features")]
    return write_distance_store(_memory_target(), arrays[given[0]], *ids, kind=MATRIX_KINDS[given[0]],
                                query_distances=arrays.get("query_distances"))


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
