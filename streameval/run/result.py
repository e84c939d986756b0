"""What one evaluation produced: :class:`Result` (its values, per query and per trial, and how the
run went) and its dictionary for JSON.  The closed-set values are computed in ``features/closed_set/metrics.py``."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import __version__
from ..core.choices import RESULT_SCHEMA



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
    protocol_record: dict | None = None  # the resolved protocol (docs/protocols.md)
    cmc_flavour: str = "first-hit"
    cmc_first_hit: list | None = None  # when the flavour is another
    cmc_sgs_expected: list | None = None  # sgs mode both
    trials: dict | None = None  # per trial (or sgs repeat) values and their spread; headline = means
    directions: dict | None = None  # regdb: each direction's result (to_dict(per_query=True) of each)
    ranked_lists: object = None  # ranked.RankedLists with ranked_list=K: records, worst and best queries
    open_set: dict | None = None  # with open_set=True: DIR@FPIR (docs/options.md#the-json-result, features/open_set/)
    verification: dict | None = None  # with verification=True: TAR@FAR, AUC, ROC (docs/options.md#the-json-result, features/verification/)
    rerank: dict | None = None  # with rerank / qe: how the distances were re-ranked (docs/reranking.md, features/rerank/)
    warnings: list = field(default_factory=list)  # what the numbers may hide, e.g. a protocol keeping few queries
    # the queries' ids from the store, for per-query exports (not in the JSON): "pid", "camid" (int64, (Q,)),
    # "path" (list of str, or None without stored paths), "in_trial" (bool (T, Q) with trials, else None)
    queries: dict | None = None
    by_direction: dict | None = None  # regdb: each direction's Result (its per_query and queries), for exports
    ci: dict | None = None  # with ci=LEVEL: each metric's confidence interval (docs/significance.md#confidence-intervals)

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

    def to_pandas(self):
        """The per-query table (one row per query; per trial and query with trials, per direction
        and query for regdb) as a pandas DataFrame: the columns of ``streameval eval --per-query-out``
        (docs/options.md#per-query-table).  Needs pandas (``pip install pandas``)."""
        from .per_query import to_pandas

        return to_pandas(self)

    def _rank_or_none(self, k: int) -> float | None:
        """CMC@k, or None past the computed curve (the JSON's fixed rank keys)."""
        return self.rank(k) if k <= self.max_rank else None

    def _directions(self, per_query: bool) -> dict | None:
        """Each direction's section, its per-query arrays only when the top level's are asked for."""
        if self.directions is None or per_query:
            return self.directions
        return {name: {k: v for k, v in d.items() if k != "per_query"} for name, d in self.directions.items()}

    def to_dict(self, per_query: bool = False) -> dict:
        """JSON-ready dict with the keys of docs/options.md (plus options and run facts)."""
        out = {
            "result_schema": RESULT_SCHEMA,
            "streameval_version": __version__,
            "n_queries": self.n_queries,
            "n_valid_queries": self.n_valid_queries,
            "n_open_queries": self.n_open_queries,
            "n_gallery": self.n_gallery,
            "metric": self.metric,
            "protocol": self.protocol_record or {"name": self.protocol},
            "max_rank": self.max_rank,
            "cmc_flavour": self.cmc_flavour,
            "cmc": None if self.cmc is None else [float(v) for v in self.cmc],
            "rank1": self._rank_or_none(1),
            "rank5": self._rank_or_none(5),
            "rank10": self._rank_or_none(10),
            "mAP": self.mAP,
            "mAP_trapezoid": self.mAP_trapezoid,
            "mINP": self.mINP,
            "cmc_first_hit": self.cmc_first_hit,
            "cmc_sgs_expected": self.cmc_sgs_expected,
            "gom": self.gom,
            "trials": self.trials,
            "directions": self._directions(per_query),
            "options": self.options,
            "run": self.run,
        }
        if per_query:
            out["per_query"] = {name: _json_list(values) for name, values in self.per_query.items()}
        if self.ranked_lists is not None:
            out["ranked_list"] = self.ranked_lists.section()
        if self.open_set is not None:
            out["open_set"] = self.open_set
        if self.verification is not None:
            out["verification"] = self.verification
        if self.rerank is not None:
            out["rerank"] = self.rerank
        if self.warnings:
            out["warnings"] = list(self.warnings)
        if self.ci is not None:
            out["ci"] = self.ci
        return out


def run_timing(phases: dict, pairs: int) -> dict:
    """A run's time facts: its ``phases`` (name -> seconds), their sum ``elapsed_s``, and ``pairs``
    scored per second of it."""
    elapsed = sum(phases.values())
    return {"phases": phases, "elapsed_s": elapsed, "pairs": pairs, "pairs_per_s": pairs / elapsed}


def _short(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _json_list(values: np.ndarray):
    """NaN (open-set queries) becomes null so the JSON stays standard (per trial: a list per trial)."""
    if values.ndim > 1:
        return [_json_list(row) for row in values]
    return [None if isinstance(v, float) and v != v else v for v in values.tolist()]
