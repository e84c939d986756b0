"""From per-query counts to the reported metrics (METRICS.md section 3), last step of the pipeline.

Closed-set metrics average over Q+ (queries with at least one positive):

* ``cmc[k-1]`` (CMC@k) = |{q in Q+ : r_1(q) <= k}| / |Q+|, k = 1..max_rank
* ``mAP``            = mean over Q+ of AP(q) = (1/n) sum_j j / r_j
* ``mAP_trapezoid``  = mean over Q+ of (1/n) sum_j ((j-1)/(r_j-1) + j/r_j) / 2
* ``mINP``           = mean over Q+ of n / r_n

With Q+ empty every closed-set value is None (and the report says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import __version__, kernels
from .choices import RESULT_SCHEMA

PER_QUERY_FIELDS = ("ap", "ap_trapezoid", "inp", "first_hit_rank", "n_positives")


@dataclass
class Result:
    """Everything one evaluation produced.  ``per_query`` arrays are indexed by query position."""

    n_queries: int
    n_valid_queries: int
    n_open_queries: int
    n_gallery: int
    metric: str
    protocol: str
    max_rank: int
    cmc: np.ndarray | None
    mAP: float | None
    mAP_trapezoid: float | None
    mINP: float | None
    per_query: dict
    options: dict = field(default_factory=dict)
    run: dict = field(default_factory=dict)
    gom: dict | None = None

    def rank(self, k: int) -> float | None:
        """CMC@k for an integer 1 <= k <= max_rank; None when no query has a positive (Q+ empty)."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= self.max_rank:
            raise ValueError(f"rank(k) needs an integer k from 1 to max_rank={self.max_rank}, got {k!r}"
                             + ("; evaluate with a larger max_rank" if isinstance(k, (int, np.integer)) and k > 1 else ""))
        return None if self.cmc is None else float(self.cmc[k - 1])

    def __repr__(self) -> str:
        """One line: what was evaluated and the headline numbers (the arrays stay in the fields)."""
        def pct(value):
            return "n/a" if value is None else f"{100 * value:.2f}%"

        head = (f"Result({self.n_queries:,} queries x {self.n_gallery:,} gallery, {self.metric}, {self.protocol}: "
                f"rank-1 {pct(self.rank(1))}, mAP {pct(self.mAP)}, mINP {pct(self.mINP)}")
        if self.gom is not None:
            head += f", MREP {_short(self.gom.get('MREP'))}, MFR {_short(self.gom.get('MFR'))}"
        return head + ")"

    def add_phase(self, name: str, seconds: float) -> None:
        """Count ``seconds`` more of the run (e.g. writing its JSON) as phase ``name`` of ``run``, so
        the elapsed time and the summary's total include it."""
        phases = dict(self.run["phases"])
        phases[name] = phases.get(name, 0.0) + seconds
        self.run.update(run_timing(phases, self.run["pairs"]))

    def _rank_or_none(self, k: int) -> float | None:
        """CMC@k, or None past the computed curve (the JSON's fixed rank keys)."""
        return self.rank(k) if k <= self.max_rank else None

    def to_dict(self, per_query: bool = False) -> dict:
        """JSON-ready dict with the keys of METRICS.md section 5 (plus options and run facts)."""
        out = {
            "result_schema": RESULT_SCHEMA,
            "streameval_version": __version__,
            "n_queries": self.n_queries,
            "n_valid_queries": self.n_valid_queries,
            "n_open_queries": self.n_open_queries,
            "n_gallery": self.n_gallery,
            "metric": self.metric,
            "protocol": self.protocol,
            "max_rank": self.max_rank,
            "cmc": None if self.cmc is None else [float(v) for v in self.cmc],
            "rank1": self._rank_or_none(1),
            "rank5": self._rank_or_none(5),
            "rank10": self._rank_or_none(10),
            "mAP": self.mAP,
            "mAP_trapezoid": self.mAP_trapezoid,
            "mINP": self.mINP,
            "gom": self.gom,
            "options": self.options,
            "run": self.run,
        }
        if per_query:
            out["per_query"] = {name: _json_list(self.per_query[name]) for name in PER_QUERY_FIELDS}
        return out


def run_timing(phases: dict, pairs: int) -> dict:
    """A run's time facts: its ``phases`` (name -> seconds), their sum ``elapsed_s``, and ``pairs``
    scored per second of it."""
    elapsed = sum(phases.values())
    return {"phases": phases, "elapsed_s": elapsed, "pairs": pairs, "pairs_per_s": pairs / elapsed}


def _short(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _json_list(values: np.ndarray) -> list:
    """NaN (open-set queries) becomes null so the JSON stays standard."""
    return [None if isinstance(v, float) and v != v else v for v in values.tolist()]


def query_values(positives, ranks) -> dict:
    """Per-query first-hit rank, AP (both conventions), INP and number of positives, from the counts
    (``state.Positives``, ``state.RankState``); open-set queries get rank -1 and NaN."""
    n = positives.n_queries
    out = {"first_hit_rank": np.empty(n, dtype=np.int64), "ap": np.empty(n), "ap_trapezoid": np.empty(n),
           "inp": np.empty(n)}
    kernels.rank_summaries(positives.offsets, ranks.neg_slots, out["first_hit_rank"], out["ap"], out["ap_trapezoid"],
                           out["inp"])
    out["n_positives"] = positives.counts
    return out


def cmc_curve(first_hit_rank: np.ndarray, max_rank: int) -> np.ndarray:
    """CMC@k for k = 1..max_rank over the given (valid) queries' first-hit ranks."""
    hits = np.bincount(np.minimum(first_hit_rank, max_rank + 1) - 1, minlength=max_rank + 1)[:max_rank]
    return np.cumsum(hits) / first_hit_rank.shape[0]


def closed_set(per_query: dict, max_rank: int) -> dict:
    """Aggregate per-query values over Q+; None everywhere when Q+ is empty."""
    valid = per_query["n_positives"] > 0
    if not valid.any():
        return {"cmc": None, "mAP": None, "mAP_trapezoid": None, "mINP": None}
    return {
        "cmc": cmc_curve(per_query["first_hit_rank"][valid], max_rank),
        "mAP": float(per_query["ap"][valid].mean()),
        "mAP_trapezoid": float(per_query["ap_trapezoid"][valid].mean()),
        "mINP": float(per_query["inp"][valid].mean()),
    }
