"""The values the options take, shared by every layer; importable without numpy (``--help`` is instant)."""

import math
from dataclasses import dataclass
from numbers import Integral, Real

from .errors import OptionError

METRICS = ("euclidean", "sqeuclidean", "cosine")
PRECISIONS = ("float32", "float64")
GOM_VP_MODES = ("reference", "jaccard")
SUMMARY_FORMATS = ("table", "markdown", "csv", "latex")  # --format of eval / update / aggregate
PASTE_FORMATS = SUMMARY_FORMATS[1:]  # --format of compare: its table is one to paste
PAIRED_TESTS = ("t", "wilcoxon", "randomization")  # compare's p-values (core.paired)

# Upper bounds that keep the per-query state and the curves small (beyond them numbers stop changing
# or memory explodes: a CMC past the gallery is flat, a grid finer than 1e-5 bins nothing new).
MAX_RANK_LIMIT = 100_000
GOM_BINS_LIMIT = 100_000
INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)  # reserved: the fill value that marks a missing id chunk in a store
MAX_TRIALS = 64  # a protocol's gallery trials: their masks are bits of one uint64 per row
MAX_SGS_REPEATS = 100_000  # the sampled state is queries x repeats int32
RANKED_LIST_LIMIT = 100_000  # K of --ranked-list: the lists are kept in memory, K entries per query
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


@dataclass(frozen=True)
class Bounds:
    """The values a numeric option takes: integers (or, not ``integer``, finite numbers: never nan
    or inf) from ``low`` to ``high``; ``why`` says where the limit comes from."""

    low: int | float
    high: int | float
    why: str = ""
    integer: bool = True

    def check(self, value, field: str):
        """``value`` as an int (float); an OptionError naming ``field`` when it is not in range."""
        refusal = self.refusal(value)
        if refusal:
            raise OptionError(f"{field} {refusal}")
        return int(value) if self.integer else float(value)

    def refusal(self, value) -> str | None:
        """What is wrong with ``value`` ("must be ..., got ..."), None when it is in range."""
        if self.integer:
            fits = is_integer(value)
        else:
            fits = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
        if fits and self.low <= value <= self.high:
            return None
        return f"must be {self.described()}{self.why}, got {value!r}"

    def described(self) -> str:
        if not self.integer:
            return f"a finite number >= {self.low:g}" if self.high == math.inf else \
                f"a number from {self.low:g} to {self.high:g}"
        kind = {1: "a positive integer", 0: "a non-negative integer"}.get(self.low)
        return f"{kind} up to {self.high:,}" if kind else f"an integer from {self.low:,} to {self.high:,}"


INT64_ROWS = Bounds(1, INT64_MAX, " (rows are 64-bit indices)")
INT64_BYTES = Bounds(1, INT64_MAX, " bytes")
FRACTION = Bounds(0.0, 1.0, integer=False)
TAIL_ENTRY_BYTES = 32  # features.verification.kernels.ENTRY_BYTES: a --tail-budget below it holds no entry
MAX_VARIANT_TRIALS = 1000  # corruption trials of a feature-variant suite (CIL-ReID's protocol uses 10)

# Every numeric option's range, by its keyword name (the CLI's --name with dashes): the command line
# refuses values outside it when it reads them (cli.Bounded), the Python API where the option is
# checked (``check_range``); limits that depend on the store or the machine are checked against
# these sizes before any work (plan.make_plan, synth.check_room, cluster.connect).
RERANK_LIST_LIMIT = 10_000  # neighbours per row: the kNN pass keeps N x (k1 + 1) keys of 16 bytes
RANGES = {
    "max_rank": Bounds(1, MAX_RANK_LIMIT),
    "gom_bins": Bounds(1, GOM_BINS_LIMIT),
    "gom_b": Bounds(1, INT64_MAX, " (a count of returned items)"),
    "trials": Bounds(0, MAX_TRIALS, " (trial masks are bits of one 64-bit word; 0: no trials)"),
    "shots": Bounds(1, INT64_MAX),
    "seed": Bounds(INT64_MIN, INT64_MAX, " (64-bit signed)"),
    "sgs_repeats": Bounds(1, MAX_SGS_REPEATS),
    "query_block": INT64_ROWS,
    "gallery_chunk": INT64_ROWS,
    "chunk_rows": INT64_ROWS,
    "memory_budget": INT64_BYTES,
    "memory_limit": INT64_BYTES,
    "buffer_budget": Bounds(0, INT64_MAX, " bytes"),
    "tail_budget": Bounds(TAIL_ENTRY_BYTES, INT64_MAX, f" bytes ({TAIL_ENTRY_BYTES}: one entry of the tail)"),
    "workers": Bounds(1, INT64_MAX),
    "n_workers": Bounds(1, INT64_MAX),  # and at most this machine's cores (cluster.ClusterOptions)
    "threads_per_worker": Bounds(1, INT64_MAX),
    "connect_timeout": Bounds(0.1, 86_400.0, " seconds (a day)", integer=False),
    "ranked_list": Bounds(1, RANKED_LIST_LIMIT),
    "trial": Bounds(0, MAX_TRIALS - 1),  # and below the protocol's trials (ranked.Spec)
    "hist_bits": Bounds(4, 24),
    "rerank_k1": Bounds(1, RERANK_LIST_LIMIT),
    "rerank_k2": Bounds(1, RERANK_LIST_LIMIT),
    "rerank_lambda": Bounds(0.0, 1.0, integer=False),
    "qe_k": Bounds(1, RERANK_LIST_LIMIT),
    "qe_alpha": Bounds(0.0, 1000.0, integer=False),
    "qe_times": Bounds(1, 100),
    "n_query": INT64_ROWS,
    "n_gallery": INT64_ROWS,
    "dim": Bounds(1, INT64_MAX),
    "n_ids": Bounds(1, INT64_MAX),
    "n_cams": Bounds(1, INT64_MAX),
    "junk_frac": FRACTION,
    "distractor_frac": FRACTION,
    "open_query_frac": FRACTION,
    "noise": Bounds(0.0, math.inf, integer=False),
    "ci": Bounds(0.5, 0.999, " (the confidence level of --ci)", integer=False),
    "ci_resamples": Bounds(100, 10_000_000, " (bootstrap resamples)"),
    "ci_seed": Bounds(0, INT64_MAX, " (numpy.random.default_rng's seed)"),
    "variant_trials": Bounds(1, MAX_VARIANT_TRIALS, " (CIL-ReID's protocol uses 10)"),
    "level": Bounds(0.5, 0.999, " (a confidence level)", integer=False),
    "alpha": Bounds(1e-6, 0.5, " (a significance level)", integer=False),
}


def check_range(value, name: str, field: str | None = None):
    """``value`` of the option ``name`` (a key of RANGES) as a number, or an OptionError naming
    ``field`` (default: ``name``)."""
    return RANGES[name].check(value, field or name)
