"""The values the options take, shared by every layer; importable without numpy (``--help`` is instant)."""

from numbers import Integral

from .errors import OptionError

METRICS = ("euclidean", "sqeuclidean", "cosine")
PRECISIONS = ("float32", "float64")
GOM_VP_MODES = ("reference", "jaccard")
SUMMARY_FORMATS = ("table", "markdown", "csv", "latex")  # --format of eval / update / aggregate

# Upper bounds that keep the per-query state and the curves small (beyond them numbers stop changing
# or memory explodes: a CMC past the gallery is flat, a grid finer than 1e-5 bins nothing new).
MAX_RANK_LIMIT = 100_000
GOM_BINS_LIMIT = 100_000
INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)  # reserved: the fill value that marks a missing id chunk in a store
RESULT_SCHEMA = 1  # of the result JSON: raised when a key changes meaning; readers refuse schemas they do not know


def is_integer(value) -> bool:
    """An integer (numpy's too), not a bool."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def record_values(record, keys: tuple, what: str) -> tuple:
    """The values of ``record`` (a mapping a state or result saved) in the order of ``keys``,
    which must be exactly its keys; ``what`` names it in the error ("a ranked-list record")."""
    if set(record) != set(keys):
        raise OptionError(f"{what} has keys {sorted(record)}, expected {sorted(keys)}")
    return tuple(record[key] for key in keys)
