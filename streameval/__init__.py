"""streameval: exact out-of-core ReID evaluation (CMC, mAP, mINP) over chunked zarr features.

Data flow, one module per step: ``store`` (zarr schema, validation) -> ``plan`` (chunk sizes) ->
``kernels`` (numba) -> ``graph`` (Dask tasks, tree reduction) -> ``state`` (per-query counts) ->
``metrics`` (ratios, last) -> ``report`` / ``cli``; ``statestore`` + ``incremental`` keep the state
between runs and score only appended gallery rows.
"""

from .errors import OptionError, StoreError, StreamevalError
from .evaluate import evaluate
from .incremental import update
from .metrics import Result
from .store import append_gallery, create_store, open_store, validate_values, write_store

__all__ = [
    "evaluate", "update", "Result", "open_store", "create_store", "write_store", "append_gallery", "validate_values",
    "StreamevalError", "StoreError", "OptionError",
]
__version__ = "0.1.0"
