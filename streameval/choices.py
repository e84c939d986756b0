"""The values the options take, shared by every layer; importable without numpy (``--help`` is instant)."""

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
