"""streameval: exact out-of-core ReID evaluation (CMC, mAP, mINP) over chunked zarr features.

Layers, each importing only those before it: ``core`` -> ``protocols``, ``store`` (+ ``io``) ->
``engine`` (plan, kernels, block sources, statistics, passes) -> ``features`` (one package per
metric family, in ``features.REGISTRY``) -> ``run`` (settings, the one pipeline, evaluate, update,
saved states) -> ``suite`` -> ``present`` (report, aggregate, plot, show) -> ``cli``.

The public names are imported on first use: ``import streameval`` (and ``streameval --help``) loads
neither numba nor zarr nor dask.
"""

from importlib import import_module

from .core.errors import OptionError, StoreError, StreamevalError

_LAZY = {  # public name -> module that defines it
    "evaluate": "run.evaluation", "update": "run.incremental", "Result": "run.result", "open_store": "store",
    "create_store": "store", "write_store": "store", "append_gallery": "store", "validate_values": "store",
    "write_distance_store": "store.distances", "run_suite": "suite.run", "update_suite": "suite.run",
    "load_suite": "suite.plan", "write_variant": "store.variants", "variant_names": "store.variants",
    "Evaluator": "run.evaluator",
    "compare": "present.compare",
}

__all__ = [*_LAZY, "StreamevalError", "StoreError", "OptionError"]


def __getattr__(name: str):
    if name == "__version__":
        from importlib.metadata import version

        value = version(__name__)  # stated once, in pyproject.toml; the installed metadata carries it
    elif name in _LAZY:
        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
    else:
        raise AttributeError(f"module 'streameval' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | {"__version__"})
