"""Open-set identification: DIR at FPIR targets and rank points (docs/open-set.md#definitions).

Liao et al. 2014 (BLUFR ``OpenSetROC.m``), extended to multi-shot galleries, junk, camera rules and
trials.  Per trial, from the state of the one scoring pass (nothing of size queries x gallery):

* non-mated queries (no positive in the trial), N_nm of them: score s(q) = the nearest kept row's
  exact distance (``statistics.nearest``; +inf with no kept row: never a false alarm);
* mated queries, N_m: d+(q) = the trial's best positive (the positives pass), and the rank r+(q):
  the first hit's rank (slot counts), or rho under an identity-dedup CMC (sgs protocols use r_1).

For an FPIR target x, k = round(x N_nm) half up (Liao's MATLAB ``round``; ``floor`` on request),
computed exactly from the decimal given (``fractions.Fraction``).  1 <= k < N_nm: threshold
t = s_(k), accept d <= t; k = 0: accept d < s_(1), reporting Liao's threshold (midway between s_(1)
and the largest d+ below it, or s_(1) - sqrt(eps)); k = N_nm: accept everything.  DIR(x, R) = the
share of mated queries accepted with r+ <= R; the achieved FPIR is the share of non-mated queries
accepted (ties at t can lift it above k / N_nm).  Accepting everything gives the closed-set CMC over
the mated queries (``closed_set_limit``), reported in every case and alone when N_nm = 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ...core.choices import record_values
from ...core.errors import OptionError
from ...core.rates import items, parse_rates
from ...core.spread import spread

OPEN_SET_OPTIONS = ("open_set", "fpir", "dir_ranks", "fpir_rounding")
SPEC_KEYS = {"fpir": "fpir", "dir_ranks": "ranks", "fpir_rounding": "rounding"}  # keyword -> Spec field
CLI_NAMES = {key: "--" + key.replace("_", "-") for key in OPEN_SET_OPTIONS}
DEFAULT_FPIR = ("0.001", "0.01", "0.1")
DEFAULT_RANKS = (1, 5, 10, 20)
ROUNDINGS = ("round", "floor")
SQRT_EPS = math.sqrt(np.finfo(np.float64).eps)  # Liao's offset below s_(1) when no mated score lies below it
NO_NON_MATED = ("no non-mated query: DIR@FPIR is undefined; only the closed-set limit (accept all: the CMC over "
                "the mated queries) is reported")
NO_MATED = "no mated query: DIR is undefined (null)"


# ------------------------------------------------------------------------------------------- options


@dataclass(frozen=True)
class Spec:
    """What ``open_set`` reports: the FPIR targets as the decimals given (exact), the DIR ranks, the
    rounding of k.  It changes no state beyond asking for the nearest-item statistic."""

    fpir: tuple = DEFAULT_FPIR
    ranks: tuple = DEFAULT_RANKS
    rounding: str = "round"

    @classmethod
    def parse(cls, value, max_rank: int) -> "Spec | None":
        """None, a Spec, or its record (``to_record``); targets sorted and unique by value, ranks
        sorted and unique, each at most ``max_rank`` (rho, the identity-dedup rank, is only kept
        that far)."""
        if value is None:
            return None
        if isinstance(value, Mapping):
            value = cls(*record_values(value, ("fpir", "ranks", "rounding"), "an open-set record"))
        targets = parse_rates(value.fpir, "fpir (--fpir)", "FPIR")
        ranks = sorted({_rank(item, max_rank) for item in items(value.ranks, "dir_ranks (--dir-ranks)")})
        if not ranks:
            raise OptionError("dir_ranks (--dir-ranks) needs at least one rank")
        if value.rounding not in ROUNDINGS:
            raise OptionError(f"fpir_rounding (--fpir-rounding) must be round or floor, got {value.rounding!r}")
        return cls(targets, tuple(ranks), value.rounding)

    @property
    def targets(self) -> list[Fraction]:
        return [Fraction(text) for text in self.fpir]

    def to_record(self) -> dict:
        return {"fpir": list(self.fpir), "ranks": list(self.ranks), "rounding": self.rounding}

    def count(self, x: Fraction, n: int) -> int:
        """k = round(x n), half up (Liao), or floor(x n): exact."""
        return math.floor(x * n + Fraction(1, 2)) if self.rounding == "round" else math.floor(x * n)


def _rank(item, max_rank: int) -> int:
    try:
        rank = int(str(item).strip()) if not isinstance(item, bool) else None
    except ValueError:
        rank = None
    if rank is None or not 1 <= rank <= max_rank:
        raise OptionError(f"dir_ranks (--dir-ranks) are ranks from 1 to max_rank ({max_rank}), got {item!r}"
                          + ("; raise max_rank (--max-rank)" if rank is not None and rank > max_rank else ""))
    return rank


def request(options: dict, saved: dict | None = None) -> dict | None:
    """Take the open-set keywords out of ``options``: the Spec record for ``Settings.parse``, or
    None when no open-set identification is asked for.  None values are absent; ``saved``: the
    record of a saved state (``update``), which given keywords override; ``open_set=False`` turns it off."""
    given = {key: options.pop(key) for key in OPEN_SET_OPTIONS if key in options}
    given = {key: value for key, value in given.items() if value is not None}
    wanted = given.pop("open_set", saved is not None)
    if not wanted:
        if given:
            raise OptionError(f"{', '.join(CLI_NAMES[key] for key in given)} only go with --open-set (open_set=True)")
        return None
    defaults = {"fpir": DEFAULT_FPIR, "ranks": DEFAULT_RANKS, "rounding": "round"}
    return {**defaults, **(saved or {}), **{SPEC_KEYS[key]: value for key, value in given.items()}}


# ---------------------------------------------------------------------------------------- finalising


def finalise(state, settings, q_bits: np.ndarray) -> dict:
    """The result's ``open_set`` section: one trial's, or with trials the means (headline), each
    trial's section (``per_trial``) and the spread."""
    spec = settings.open_set
    sections = [trial_section(spec, *trial_scores(state, settings, q_bits, t)) for t in range(settings.n_trials)]
    if len(sections) == 1:
        return sections[0]
    return _over_trials(spec, sections, settings.std_ddof)


def trial_scores(state, settings, q_bits: np.ndarray, t: int) -> tuple:
    """Trial t's (non-mated scores s, mated scores d+, mated ranks r+), in query order."""
    from ..dedup.statistic import dedup_ranks
    from ..closed_set.slots import restrict

    positives, slots = restrict(state.positives, state.stats.arrays["slots/counts"], t)
    in_trial = ((q_bits >> np.uint64(t)) & np.uint64(1)).astype(bool)
    mated = positives.counts > 0  # a trial's positive is in its queries
    first = positives.offsets[:-1][mated]
    if settings.protocol.cmc == "identity-dedup":
        ranks = dedup_ranks(state.stats.arrays["dedup/held"], t)[mated]
    else:
        ranks = 1 + slots[first]  # the first hit: 1 + the negatives before the best positive
    nearest = state.stats.arrays["nearest/dist"][:, t]
    return nearest[in_trial & ~mated], positives.dist[first], ranks


def trial_section(spec: Spec, s: np.ndarray, d: np.ndarray, r: np.ndarray) -> dict:
    """DIR at every target and rank from one trial's scores (see the module docstring)."""
    s = np.sort(s)
    n_nm, n_m = s.shape[0], d.shape[0]
    points = [_point(spec, x, s, d, r) for x in spec.targets] if n_nm else []
    notes = ([] if n_nm else [NO_NON_MATED]) + ([] if n_m else [NO_MATED])
    return {"fpir_targets": [float(x) for x in spec.targets], "ranks": list(spec.ranks), "rounding": spec.rounding,
            "n_mated": n_m, "n_non_mated": n_nm, "points": points,
            "closed_set_limit": _dir(spec, np.ones(n_m, dtype=bool), r), "note": "; ".join(notes) or None}


def _point(spec: Spec, x: Fraction, s: np.ndarray, d: np.ndarray, r: np.ndarray) -> dict:
    """One FPIR target: k, the threshold and its rule, the achieved FPIR, DIR per rank."""
    n_nm = s.shape[0]
    k = spec.count(x, n_nm)
    threshold, accept = None, "all"
    if k == 0 and s[0] < np.inf:  # no false alarm: strictly below the smallest non-mated score
        threshold, accept = liao_threshold(s[0], d), "d < threshold"
        accepted, alarms = d < s[0], 0
    elif k < n_nm and s[k - 1] < np.inf:
        threshold, accept = float(s[k - 1]), "d <= threshold"
        accepted, alarms = d <= s[k - 1], int(np.searchsorted(s, s[k - 1], side="right"))
    else:  # k = N_nm, or a threshold beyond every finite score: everything is accepted
        accepted, alarms = np.ones(d.shape[0], dtype=bool), int(np.isfinite(s).sum())
    return {"fpir": float(x), "k": k, "threshold": threshold, "accept": accept, "achieved_fpir": alarms / n_nm,
            "dir": _dir(spec, accepted, r)}


def liao_threshold(s1: float, d: np.ndarray) -> float:
    """The threshold Liao reports at FPIR 0: midway between s_(1) and the largest mated score below
    it (s_(1) itself when no double lies strictly between them, so that "d < threshold" still
    accepts that score), or s_(1) - sqrt(eps) when no mated score lies below."""
    below = d[d < s1]
    if not below.size:
        return float(s1 - SQRT_EPS)
    a = float(below.max())
    middle = (a + s1) / 2
    return float(middle if a < middle else s1)


def _dir(spec: Spec, accepted: np.ndarray, r: np.ndarray) -> dict:
    """DIR per rank: mated queries accepted with r+ <= R, over N_m (null without mated queries)."""
    n_m = r.shape[0]
    return {str(rank): (int((accepted & (r <= rank)).sum()) / n_m if n_m else None) for rank in spec.ranks}


def _over_trials(spec: Spec, sections: list, ddof: int) -> dict:
    """Trials: the headline section holds the means over the trials (k and thresholds differ by
    trial: see ``per_trial``), plus ``per_trial``, ``mean`` and ``std`` of each number."""
    stats = {stat: _statistic(spec, sections, ddof, stat) for stat in ("mean", "std")}
    mean = stats["mean"]
    points = [{"fpir": p["fpir"], "k": None, "threshold": None, "accept": None, "achieved_fpir": p["achieved_fpir"],
               "dir": p["dir"]} for p in mean["points"]]
    return {"fpir_targets": [float(x) for x in spec.targets], "ranks": list(spec.ranks), "rounding": spec.rounding,
            "n_mated": mean["n_mated"], "n_non_mated": mean["n_non_mated"], "points": points,
            "closed_set_limit": mean["closed_set_limit"], "note": _trials_note(sections), "T": len(sections),
            "std_ddof": ddof, "per_trial": sections, **stats}


def _statistic(spec: Spec, sections: list, ddof: int, stat: str) -> dict:
    """``stat`` ("mean" or "std", ``spread.spread``) of each number over the trials that have it."""
    def over(values):
        return spread(values, ddof)[stat]

    ranks = [str(rank) for rank in spec.ranks]
    points = []
    for i, x in enumerate(spec.targets):
        present = [s["points"][i] for s in sections if s["points"]]  # trials with non-mated queries
        if present:
            points.append({"fpir": float(x), "achieved_fpir": over([p["achieved_fpir"] for p in present]),
                           "dir": {rank: over([p["dir"][rank] for p in present]) for rank in ranks}})
    limit = {rank: over([s["closed_set_limit"][rank] for s in sections]) for rank in ranks}
    counts = {key: over([s[key] for s in sections]) for key in ("n_mated", "n_non_mated")}
    return {**counts, "points": points, "closed_set_limit": limit}


def _trials_note(sections: list) -> str | None:
    """Each trial's note, naming the trials it applies to (None when no trial has one)."""
    by_note: dict = {}
    for t, section in enumerate(sections):
        if section["note"]:
            by_note.setdefault(section["note"], []).append(t)
    return "; ".join(f"trial{'s' if len(ts) > 1 else ''} {', '.join(map(str, ts))}: {note}"
                     for note, ts in by_note.items()) or None
