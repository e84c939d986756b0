"""Compiling the kernels a run needs before it runs, so that its passes time only their work.

numba compiles a kernel for each combination of argument types it is called with (working
precision, the statistics an evaluation counts, their options), the first time it meets it; the
result goes to numba's on-disk cache (``kernels._versioned_cache``), from which later processes
load it in milliseconds.  A first run would compile in the middle of its passes, its progress bar
standing still.  Instead ``session.rehearse`` first evaluates a tiny in-memory problem shaped like
the real one (``tiny.tiny_store``) with the run's own settings: every specialisation the real passes
call is compiled or loaded there, which the run books as its phase "compiling kernels".  Nothing
here names a kernel or a signature: the rehearsal runs the same code as the real run.

Routes chosen by size (verification's tail, a pilot's windows or the histogram's; see
``features.verification``)
follow the settings, which carry the real run's sizes, but a route that depends on the data may
still compile later: the runner books that too (``session.Runner``).

``warm_up`` (``streameval warmup``) evaluates a tiny problem with each of a few option sets
(``COMMON_RUNS`` by default), so that after an install even the first evaluation loads its kernels
from the cache.  Which metric does not matter (it is a number the kernels read at run time), nor
does the stored dtype (features are upcast to the working precision before any kernel sees them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

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
    from .evaluation import evaluate
    from ..protocols import resolve
    from ..engine.tiny import tiny_store

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

    from ..engine import kernels  # noqa: F401  (sets the folder)

    return numba.config.CACHE_DIR


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
