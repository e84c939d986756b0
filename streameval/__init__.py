"""streameval: exact out-of-core ReID evaluation (CMC, mAP, mINP) over chunked zarr features.

Data flow, one module per step: ``store`` (zarr schema, validation) -> ``plan`` (chunk sizes) ->
``kernels`` (numba) -> ``graph`` (Dask tasks, tree reduction) -> ``state`` (per-query counts) ->
``metrics`` (ratios, last) -> ``report`` / ``cli``; ``statestore`` + ``incremental`` keep the state
between runs and score only appended gallery rows.

The public names are imported on first use: ``import streameval`` (and ``streameval --help``) loads
neither numba nor zarr nor dask.
"""

import sys
import types
from importlib import import_module

from .errors import OptionError, StoreError, StreamevalError

_LAZY = {  # public name -> module that defines it
    "evaluate": "evaluate", "update": "incremental", "Result": "metrics", "open_store": "store",
    "create_store": "store", "write_store": "store", "append_gallery": "store", "validate_values": "store",
    "write_distance_store": "store.distances", "run_suite": "suite.run", "update_suite": "suite.run",
    "load_suite": "suite.plan", "write_variant": "store.variants", "variant_names": "store.variants",
}

__all__ = [*_LAZY, "StreamevalError", "StoreError", "OptionError"]


class _Package(types.ModuleType):
    """The package module, keeping ``streameval.evaluate`` the function: importing the submodule of
    the same name makes the import system bind the attribute to the module, which would shadow it."""

    def __setattr__(self, name, value):
        if name in _LAZY and isinstance(value, types.ModuleType):
            return  # the submodule stays reachable as sys.modules["streameval.<name>"]
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


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
