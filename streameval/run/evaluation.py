"""``evaluate``: the options of one evaluation -> ``Settings`` -> a ``session`` -> the passes and the
result (``pipeline``), each direction on its own for a protocol with two."""

from __future__ import annotations

import os
from dataclasses import replace

from . import result as metrics
from ..core.errors import OptionError
from ..core.locking import writing
from ..core.outputs import check_folder
from .pipeline import as_store, feature_requests, oriented, run_passes, with_variants
from ..core.progress import Phases
from .session import session
from .significance import add_intervals, check_intervals
from .settings import PROTOCOL_OPTIONS, Execution, Settings
from .statestore import check_updatable, check_writable, save_state


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
    ci: float | None = None,
    ci_resamples: int = 10_000,
    ci_seed: int = 0,
    **options,
) -> metrics.Result:
    """Evaluate query against gallery features; return a :class:`~streameval.run.result.Result`.

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
    (bytes, or a size such as "1GiB" = 2^30 or "4GB" = 4 * 10^9: every size option reads units so;
    default 512 MiB a worker, at least 1 GiB and at most a quarter of the machine's memory).
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

    ``ci=LEVEL`` (e.g. 0.95): also each metric's confidence interval, ``result.ci``
    (docs/significance.md#confidence-intervals): the percentile bootstrap over queries with
    ``ci_resamples`` resamples drawn from ``ci_seed``, or with trials the t-interval over them.
    It changes no other number.
    """
    intervals = check_intervals(ci, ci_resamples, ci_seed)
    phases = Phases()
    overrides = {key: options.pop(key) for key in PROTOCOL_OPTIONS if key in options}
    requests, selection = feature_requests(options)
    variants = options.pop("query_variant", None), options.pop("gallery_variant", None)
    execution = Execution.from_options("evaluate", options)
    store = as_store(data, storage_options)
    settings = Settings.parse(store, metric, protocol, max_rank, precision, std_ddof, no_gom=no_gom, gom_norm=gom_norm,
                              gom_bins=gom_bins, gom_b=gom_b, gom_vp=gom_vp, **requests, **overrides)
    store = with_variants(store, settings.protocol, *variants)
    if execution.knn_cache is not None and (settings.rerank is None or settings.rerank.flavour is None):
        raise OptionError("--knn-cache only goes with --rerank (knn_cache with rerank=FLAVOUR)")
    if len(settings.protocol.directions) == 2:
        if state is not None:
            raise OptionError("a state holds one direction: evaluate with direction='v2t' or 't2v' to save one")
        if selection is not None:
            raise OptionError("ranked lists hold one direction: evaluate with direction='v2t' or 't2v' for them")
    if selection is not None:
        selection.check(len(oriented(store, settings.protocol).query))
    if state is not None:
        if store.holds_distances:
            raise OptionError(f"'{store.path}' holds precomputed distances, which appended rows would change "
                              "(re-ranking): it keeps no state for incremental updates (--state)")
        check_updatable(settings)
        check_folder(state, "state directory")
    results, directions = {}, settings.protocol.directions if len(settings.protocol.directions) == 2 else (None,)
    with writing(state):  # the state's writer lock, from its check to its save (none without a state)
        if state is not None:
            check_writable(state, overwrite_state)
        for direction in directions:  # each on its own, the first one timed from the start
            one = settings if direction is None else replace(settings, protocol=replace(settings.protocol,
                                                                                        directions=(direction,)))
            swapped = oriented(store, one.protocol)
            with session(swapped, one, execution, phases if not results else Phases()) as runner:
                passes = run_passes(swapped, one, runner, place=state is None)  # a saved state keeps no bands
            if state is not None:
                save_state(state, swapped, passes.settings, passes.state)
                phases.lap("saving state")
            results[direction] = passes.result(swapped, runner, selection)
    first = results[directions[0]]
    if len(results) == 2:  # each direction's per-query arrays too (the JSON shows them with --per-query)
        first.by_direction = {name: replace(done) for name, done in results.items()}  # copies: no cycle through first
        first.directions = {name: done.to_dict(per_query=True) for name, done in results.items()}
    if intervals is not None:
        add_intervals(first, *intervals)
    return first
