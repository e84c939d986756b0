"""Compiling the kernels a run needs before it runs, so that its passes time only their work.

numba compiles a kernel for each combination of argument types it is called with (working
precision, the statistics an evaluation counts, their options), the first time it meets it; the
result goes to numba's on-disk cache (``kernels._versioned_cache``), from which later processes
load it in milliseconds.  A first run would compile in the middle of its passes, its progress bar
standing still.  Instead ``rehearse`` first evaluates a tiny in-memory problem shaped like the
real one (``tiny_store``: the same stored dtype, dimension and kind of store, ids that give every
kind of row the protocol knows) with the run's own settings: every specialisation the real passes
call is compiled or loaded there, which the run books as its phase "compiling kernels".  Nothing
here names a kernel or a signature: the rehearsal runs the same code as the real run.

Routes chosen by size (verification's tail, bands or two-pass refinement; see ``verification``)
follow the settings, which carry the real run's sizes, but a route that depends on the data may
still compile later: the runner books that too (``evaluate.Runner``).

``warm_up`` (``streameval warmup``) evaluates a tiny problem with each of a few option sets
(``COMMON_RUNS`` by default), so that after an install even the first evaluation loads its kernels
from the cache.  Which metric does not matter (it is a number the kernels read at run time), nor
does the stored dtype (features are upcast to the working precision before any kernel sees them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

TINY_IDENTITIES = 3  # identities with queries and gallery rows on every camera
GALLERY_SHOTS = 2  # gallery rows per identity and camera (trials draw among them)
TINY_CHUNK = 16  # gallery rows per chunk: two chunks, so two chains of tasks run and their states merge
DEFAULT_CAMERAS = (1, 2, 3)
OPEN_PID, DISTRACTOR_PID = 1001, 1002  # a query identity absent from the gallery; gallery rows of no query
WARMUP_DIM = 64  # features of the problem ``warm_up`` evaluates (any dimension compiles the same kernels)
COMMON_RUNS = (  # what ``streameval warmup`` compiles without options: (as eval's options, evaluate keywords)
    ("(default)", {}),
    ("--no-gom", {"no_gom": True}),
    ("--open-set --verification", {"open_set": True, "verification": True}),
    ("--open-set --verification --auc", {"open_set": True, "verification": True, "auc": True}),
)


@dataclass(frozen=True)
class Warmed:
    """What ``warm_up`` did for one option set: kernel specialisations compiled and loaded from
    numba's cache (top-level and nested ones alike), the names of the kernels, and the time."""

    label: str
    compiled: int
    loaded: int
    kernels: tuple
    seconds: float


def warm_up(option_sets=COMMON_RUNS):
    """Evaluate a tiny problem with each (label, evaluate keywords) of ``option_sets``: its kernels
    are compiled into numba's on-disk cache (``cache_folder``).  Yields a :class:`Warmed` as each
    is done."""
    from .evaluate import evaluate
    from .protocols import resolve

    template = tiny_store(resolve("market"), dim=WARMUP_DIM)
    for label, options in option_sets:
        before, started = _cache_counts(), time.perf_counter()
        evaluate(template, workers=2, **options)
        seconds = time.perf_counter() - started
        new = {kernel: [now - then for now, then in zip(counts, before.get(kernel, (0, 0)))]
               for kernel, counts in _cache_counts().items()}
        yield Warmed(label, sum(c for c, _ in new.values()), sum(h for _, h in new.values()),
                     tuple(sorted(k.py_func.__name__ for k, (c, _) in new.items() if c)), seconds)


def cache_folder() -> str:
    """Where numba keeps the compiled kernels (``kernels._versioned_cache``)."""
    import numba

    from . import kernels  # noqa: F401  (sets the folder)

    return numba.config.CACHE_DIR


_rehearsed: set = set()  # what this process rehearsed already: its kernels are in memory


def rehearse(store, settings) -> bool:
    """Evaluate a tiny problem shaped like ``store`` with ``settings`` (one direction, as the
    session runs it): every kernel the real run calls is compiled or loaded from numba's cache.
    False when the rehearsal cannot run for these settings (then the passes compile, and say so)."""
    from .bands import eligible
    from .evaluate import Execution, Phases, Runner, make_result, run_plan, score_all

    shape = shape_of(store)
    key = (settings, *shape.items())
    if key in _rehearsed:
        return True
    try:
        tiny_settings = replace(settings, protocol=_without_tables(settings.protocol))
        tiny = tiny_store(tiny_settings.protocol, **shape)
        execution = Execution(query_block=len(tiny.query), gallery_chunk=TINY_CHUNK)
        runner = Runner(None, run_plan(tiny, tiny_settings, execution, workers=2), Phases(), None)
        if eligible(tiny_settings):  # the two-pass route's refinement, where the real run's bands miss
            score_all(tiny, tiny_settings, runner, bands=False)
        placed, state, read, meta, verified = score_all(tiny, tiny_settings, runner)
        make_result(tiny, placed, state, runner, read, 1, meta, verification=verified)
    except Exception:  # e.g. a memory check the tiny plan fails: the rehearsal decides no number, and what
        return False  # it could not compile the passes compile (booked as compiling all the same)
    _rehearsed.add(key)
    return True


def _without_tables(protocol):
    """The protocol with official trial tables (sized for the real store) replaced by draws: the
    trial bits have the same type either way."""
    trials = protocol.trials
    if trials is None or trials.source != "official":
        return protocol
    return replace(protocol, trials=replace(trials, source="draw", path=None))


def shape_of(store) -> dict:
    """What ``tiny_store`` copies of a store: its kind, stored dtype and dimension, whether a
    distance store has query x query distances, its default metric."""
    if store.holds_distances:
        return {"kind": store.kind, "dtype": store.gallery.distances.dtype,
                "query_distances": store.query.distances is not None}
    return {"dtype": store.query.features.dtype, "dim": store.dim, "default_metric": store.default_metric}


def tiny_store(protocol, kind: str = "features", dtype=np.float32, dim: int = 0, query_distances: bool = False,
               default_metric: str = "euclidean"):
    """An in-memory store (``shape_of`` a real one) with ``TINY_IDENTITIES`` identities queried from
    every query camera of ``protocol`` and ``GALLERY_SHOTS`` gallery rows on every gallery camera,
    a query absent from the gallery (open-set), gallery rows of no query and of a junk pid."""
    import zarr.storage

    from .store import write_store
    from .store.distances import write_distance_store

    q_cams, g_cams = _cameras(protocol)
    ids = range(1, TINY_IDENTITIES + 1)
    q_pids = [pid for pid in ids for _ in q_cams] + [OPEN_PID]
    q_camids = [cam for _ in ids for cam in q_cams] + [q_cams[0]]
    others = [DISTRACTOR_PID, *protocol.junk_pids[:1]]
    g_pids = [pid for pid in [*ids, *others] for _ in g_cams for _ in range(GALLERY_SHOTS)]
    g_camids = [cam for _ in [*ids, *others] for cam in g_cams for _ in range(GALLERY_SHOTS)]
    rng = np.random.default_rng(0)
    target = zarr.storage.MemoryStore()
    if kind != "features":
        q_by_q = rng.random((len(q_pids),) * 2).astype(dtype) if query_distances else None
        return write_distance_store(target, rng.random((len(q_pids), len(g_pids))).astype(dtype), q_pids, q_camids,
                                    g_pids, g_camids, kind=kind, query_distances=q_by_q, chunk_rows=TINY_CHUNK)
    features = [rng.standard_normal((len(pids), dim)).astype(dtype) for pids in (q_pids, g_pids)]
    return write_store(target, features[0], q_pids, q_camids, features[1], g_pids, g_camids,
                       dtype=str(np.dtype(dtype)), chunk_rows=TINY_CHUNK, default_metric=default_metric)


def _cameras(protocol) -> tuple:
    """(query cameras, gallery cameras) of the tiny problem: those the protocol allows, among the
    cameras it names anywhere (or a few)."""
    named = set(protocol.query_cameras or ()) | set(protocol.gallery_cameras or ())
    for relation in (protocol.x_same, protocol.x_any):
        named |= {cam for pair in relation.pairs for cam in pair}
    if protocol.trials is not None:
        named |= set(protocol.trials.cameras)
    named = tuple(sorted(named)) or DEFAULT_CAMERAS
    return tuple(protocol.query_cameras or named), tuple(protocol.gallery_cameras or named)




def _cache_counts() -> dict:
    """Every streameval kernel (numba dispatcher) imported so far -> (specialisations compiled,
    loaded from the cache) in this process."""
    import sys

    from numba.core.dispatcher import Dispatcher

    counts = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("streameval.") and module is not None:
            for value in vars(module).values():
                if isinstance(value, Dispatcher) and value.py_func.__module__ == name:
                    stats = value.stats
                    counts[value] = (sum(stats.cache_misses.values()), sum(stats.cache_hits.values()))
    return counts
