"""Pair-level verification (docs/verification.md#definitions, #how-it-is-computed; docs/options.md#the-json-result): TAR@FAR, AUC, ROC and DET curves.

Pairs (q, g) with g kept for q (docs/protocols.md#the-kept-set): positive pairs (same identity, label 1, "genuine")
and negative pairs (label 0, "impostor"), pooled over all queries of a trial.  A pair is accepted
at threshold t when d < t.

* :class:`Spec` (``verification``, ``far``, ``auc``, ``tail_budget``, ``hist_bits``): what the
  scoring pass keeps (``statistics.verify.Verify``): per trial a histogram of the negatives, their
  count N- and, when it fits ``tail_budget``, a tail of the smallest ones; it decides a saved
  state's arrays, so it is one of the ``Settings``.
* FAR target x (the decimal as written, exactly: ``fractions.Fraction``): k = floor(x N-).  With
  k < N-, the threshold is n_(k+1), the (k+1)-th smallest negative distance: TAR = #{pos < n_(k+1)} /
  N+, achieved FAR = #{neg < n_(k+1)} / N- <= x.  k = N-: everything is accepted.
* :func:`report` (run while the session is open): selects n_(k+1) exactly, from the tail when it
  holds the k + 1 smallest negatives (one pass), from its band when a pilot placed one around it
  and the band holds it (``bands``: one pass, or one more for a band that counted), else by the
  two-pass refinement: the histogram
  locates the bin holding the (k+1)-th value and the count below it; refinement passes over all
  pairs count that bin's next key bits until its members fit the budget, and a last pass collects
  them.  Entries whose error window could change the selection get their canonical distance
  (``settle``: only those rows are read again).  Returns the ``verification`` section of the result.

Ratios are formed only here, from integer counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from .choices import check_range, is_integer
from .errors import OptionError
from .plan import format_bytes, parse_bytes
from .rates import parse_rates

VERIFY_OPTIONS = ("verification", "far", "auc", "tail_budget", "hist_bits")
CLI_NAMES = {key: "--" + key.replace("_", "-") for key in VERIFY_OPTIONS}
DEFAULT_FAR = ("1e-4", "1e-3", "1e-2")
DEFAULT_TAIL_BUDGET = 64 << 20
DEFAULT_HIST_BITS = 16
RECORD_KEYS = ("far", "auc", "tail_budget", "hist_bits", "core")
LABEL_CONVENTION = (
    "label 1 = positive pair (same identity, kept by the protocol), label 0 = negative pair; a pair is accepted "
    "when its distance is below the threshold; TAR = accepted positive pairs / N+, FAR = accepted negative pairs "
    "/ N-, over all queries' pairs (docs/verification.md#definitions). fast-reid's roc.py labels them the other way round: its "
    "'TPR'(t) is 1 - FAR(t) and its 'FPR'(t) is 1 - TAR(t).")


def k_of(target: str, n_neg: int) -> int:
    """k = floor(x N-) exactly, x as written."""
    return math.floor(Fraction(target) * n_neg)


@dataclass(frozen=True)
class Spec:
    """What the scoring pass keeps for verification.  ``core``: the tail's length L (k_max + 1 for
    the largest number of negative pairs the store can have, queries x extended gallery rows), 0
    when the tail would not fit ``tail_budget``: then the selection takes two passes."""

    far: tuple = DEFAULT_FAR
    auc: bool = False
    tail_budget: int = DEFAULT_TAIL_BUDGET
    hist_bits: int = DEFAULT_HIST_BITS
    core: int | None = None
    bands: object = None  # bands.Bands placed by a pilot for this run (not a saved state's)

    @classmethod
    def parse(cls, value, pair_bound: int | None, n_trials: int) -> "Spec | None":
        """None, or a record (``request``, ``to_record``), checked; ``core`` is sized from
        ``pair_bound`` unless the record holds it (a saved state's)."""
        if value is None:
            return None
        if not isinstance(value, Mapping) or not set(value) <= set(RECORD_KEYS):
            raise OptionError(f"a verification record is {value!r:.80}, expected a mapping of {', '.join(RECORD_KEYS)}")
        budget = parse_bytes(value.get("tail_budget", DEFAULT_TAIL_BUDGET))
        spec = cls(parse_rates(value.get("far", DEFAULT_FAR), "far (--far)", "FAR"), value.get("auc", False), budget,
                   value.get("hist_bits", DEFAULT_HIST_BITS), value.get("core"))
        if not isinstance(spec.auc, bool):
            raise OptionError(f"auc must be true or false, got {spec.auc!r}")
        check_range(budget, "tail_budget", "tail_budget (--tail-budget)")
        check_range(spec.hist_bits, "hist_bits", "hist_bits (--hist-bits)")
        if spec.core is None:
            if pair_bound is None:
                raise OptionError("a verification record without its tail length (core) needs the store")
            return replace(spec, core=spec.sized_core(pair_bound, n_trials))
        if not is_integer(spec.core) or spec.core < 0:
            raise OptionError(f"a verification record's core must be a non-negative integer, got {spec.core!r}")
        return spec

    def sized_core(self, pair_bound: int, n_trials: int) -> int:
        """L = k_max + 1 for N- = ``pair_bound`` (targets below 1; x = 1 accepts everything), or 0
        when the tail's buffer (``statistics.verify.capacity``: 1.5 L entries per trial) would not fit
        the budget."""
        below_one = [x for x in self.far if Fraction(x) < 1]
        if not below_one:
            return 0
        core = k_of(below_one[-1], pair_bound) + 1
        return core if self.tail_bytes(core, n_trials) <= self.tail_budget else 0

    @staticmethod
    def tail_bytes(core: int, n_trials: int) -> int:
        from .statistics.verify import ENTRY_BYTES, capacity

        return n_trials * (capacity(core) + 1) * ENTRY_BYTES

    def to_record(self) -> dict:
        return {"far": list(self.far), "auc": self.auc, "tail_budget": self.tail_budget, "hist_bits": self.hist_bits,
                "core": self.core}

    def statistic(self, n_trials: int, precision: str):
        from .statistics.verify import Verify

        return Verify(n_trials, self.hist_bits, self.core, self.auc, self.exact_bins(precision), self.bands)

    def exact_bins(self, precision: str) -> bool:
        """Whether the scoring pass bins negatives exactly: with float32 GEMMs the error window
        holds a bin edge for ~0.4% of the negatives (Market-like data, 16 bits), whose canonical
        distances would cost more than the rest of verification; the one-pass selections (tail,
        bands) do not need it (GOM's thresholds do the same, ``kernels.bin_error_bound``), the
        two-pass one does (it counts again first if a band misses)."""
        return precision == "float64" or not (self.core or self.bands)


def pair_bound(store, protocol) -> int:
    """An upper bound of N- known before any pass: queries x extended gallery rows, in either
    direction of the store."""
    q, g = len(store.query), len(store.gallery)
    both = protocol.gallery_includes_queries
    return max(q * (g + q * both), g * (q + g * both))


def request(options: dict, saved: dict | None = None) -> dict | None:
    """Take the verification keywords out of ``options``: the Spec record for ``Settings.parse``,
    or None when verification is not asked for.  None values are absent; ``saved``: the record of
    a saved state, which given keywords override (``update``)."""
    given = {key: options.pop(key) for key in VERIFY_OPTIONS if key in options}
    given = {key: value for key, value in given.items() if value is not None}
    enabled = given.pop("verification", False)
    if not isinstance(enabled, bool):
        raise OptionError(f"verification must be true or false, got {enabled!r}")
    if saved is None and not enabled:
        if given:
            raise OptionError(f"{', '.join(CLI_NAMES[key] for key in given)} only go with --verification "
                              "(verification=True)")
        return None
    return {**(saved or {}), **given}


# ----------------------------------------------------------------------------------------- selection


@dataclass
class Target:
    """One (trial, k) to select: n_(k+1) and #{neg < n_(k+1)}, once found."""

    trial: int
    k: int
    value: float | None = None
    below: int | None = None


@dataclass(eq=False)
class Group:
    """Targets of one trial whose (k+1)-th value lies in one key range [prefix << shift, (prefix +
    1) << shift), with ``base`` negatives below it and ``members`` in it."""

    trial: int
    prefix: int
    shift: int
    base: int
    members: int
    targets: list

    @property
    def low(self) -> float:
        from .statistics.verify import key_value

        return key_value(self.prefix << self.shift)

    @property
    def high(self) -> float:
        from .statistics.verify import key_value

        return key_value((self.prefix + 1) << self.shift)


def _groups(targets: list, counts: np.ndarray, prefixes: range, shift: int, base: int) -> list:
    """Targets (of one trial) grouped by the range holding their (k+1)-th value: ``counts`` per
    key range ``prefixes`` (ascending), ``base`` negatives below the first."""
    below = base + np.concatenate([[0], np.cumsum(counts)])
    groups = {}
    for target in targets:
        at = int(np.searchsorted(below, target.k, side="right")) - 1
        if at not in groups:
            groups[at] = Group(target.trial, int(prefixes[at]), shift, int(below[at]), int(counts[at]), [])
        groups[at].targets.append(target)
    return list(groups.values())


def _ambiguous(entries: np.ndarray, ranks: list) -> np.ndarray:
    """Entries whose canonical distance the selection of the ``ranks``-th smallest (1-based) needs:
    those with a window (w > 0) overlapping [r-th smallest lower bound, r-th smallest upper bound].
    The others are certainly below or above the r-th value, on their fast distance's side."""
    d, w = entries[:, 0], entries[:, 1]
    lo, hi = d - w, d + w
    out = np.zeros(d.shape[0], dtype=bool)
    for r in ranks:
        lo_r, hi_r = np.partition(lo, r - 1)[r - 1], np.partition(hi, r - 1)[r - 1]
        out |= (w > 0) & (hi >= lo_r) & (lo <= hi_r)
    return out


def _order_statistic(values: np.ndarray, rank: int) -> tuple[float, int]:
    """(the rank-th smallest value, how many values are below it)."""
    value = float(np.partition(values, rank - 1)[rank - 1])
    return value, int((values < value).sum())


class Selection:
    """Lists of entries (``statistics.verify`` layout rows) with the ranks to read off each, whose
    ambiguous entries are settled together (one read of the rows they need)."""

    def __init__(self):
        self.lists = []  # (entries, base, targets)

    def add(self, entries: np.ndarray, base: int, targets: list) -> None:
        self.lists.append((entries, base, targets))

    def finish(self, settle) -> None:
        marks = [_ambiguous(entries, [t.k + 1 - base for t in targets]) for entries, base, targets in self.lists]
        pairs = np.concatenate([entries[mark][:, 2:4] for (entries, _, _), mark in zip(self.lists, marks)]) \
            if self.lists else np.empty((0, 2))
        exact = settle(pairs[:, 1].astype(np.int64), pairs[:, 0].astype(np.int64)) if pairs.shape[0] else np.empty(0)
        start = 0
        for (entries, base, targets), mark in zip(self.lists, marks):
            values = entries[:, 0].copy()
            values[mark] = exact[start:start + int(mark.sum())]
            start += int(mark.sum())
            for target in targets:
                target.value, below = _order_statistic(values, target.k + 1 - base)
                target.below = base + below


def _tail_usable(tail: np.ndarray, core: int, k_max: int) -> bool:
    """Whether a trial's tail holds its k_max + 1 smallest negatives: never overflowed, and long
    enough (a state's tail was sized for the pairs of its gallery; an update can outgrow it)."""
    from .statistics.verify import OVERFLOW

    return tail[0, OVERFLOW] == 0.0 and k_max + 1 <= core


def select(hist: np.ndarray, exact: bool, tails: np.ndarray | None, core: int, targets: list, spec: Spec, refine,
           settle, banded: tuple = ()) -> tuple:
    """Find every target's value and count below: ``banded`` ones (target, members, count below)
    from their band, the others from the trial's tail when usable, else by the two-pass refinement
    (``refine(groups, capacity, bits)``: one pass over every pair, returning per group its
    sub-histogram over ``bits`` more key bits, or its members with ``capacity``), from an exact
    histogram: one the main pass binned on fast distances is counted again first.  Returns (the
    method, the histograms, per trial whether its histogram is exact)."""
    from .statistics.verify import COUNT, ENTRY_BYTES, SUB_BITS

    selection, groups = Selection(), []
    for target, members, below in banded:
        selection.add(members, below, [target])
    shift = 64 - spec.hist_bits
    exact = [exact] * hist.shape[0]
    recount = []
    for t in range(hist.shape[0]):
        mine = [target for target in targets if target.trial == t]
        if not mine:
            continue
        tail = tails[t] if tails is not None else None
        if tail is not None and _tail_usable(tail, core, max(target.k for target in mine)):
            selection.add(tail[1:int(tail[0, COUNT]) + 1], 0, mine)
        elif exact[t]:
            groups += _groups(mine, hist[t], range(hist.shape[1]), shift, 0)
        else:
            recount.append(Group(t, 0, 64, 0, int(hist[t].sum()), mine))
    if recount:
        hist = hist.copy()
        for group, counts in zip(recount, refine(recount, 0, spec.hist_bits)):
            if counts.sum() != group.members:
                raise RuntimeError(f"the exact histogram counts {counts.sum()} negatives, the pass {group.members}")
            hist[group.trial], exact[group.trial] = counts, True
            groups += _groups(group.targets, counts, range(hist.shape[1]), shift, 0)
    method = "two-pass" if groups else "bands" if banded else "tail"
    while groups:
        for group in [g for g in groups if g.shift == 0]:  # one key: every member equals it
            for target in group.targets:
                target.value, target.below = group.low, group.base
        groups = [g for g in groups if g.shift > 0]
        if not groups:
            break
        if sum(g.members for g in groups) * ENTRY_BYTES <= spec.tail_budget:
            collected = refine(groups, max(g.members for g in groups))
            for group, members in zip(groups, collected):
                if members[0, COUNT] != group.members:
                    raise RuntimeError(f"refinement collected {members[0, COUNT]:.0f} negatives, the histogram "
                                       f"counted {group.members}")
                selection.add(members[1:group.members + 1], group.base, group.targets)
            break
        share = spec.tail_budget // (ENTRY_BYTES * len(groups))
        split = [g for g in groups if g.members > share] or [max(groups, key=lambda g: g.members)]
        bits = min(SUB_BITS, min(g.shift for g in split))
        counts = refine(split, 0, bits)
        kept = [g for g in groups if g not in split]
        for group, sub in zip(split, counts):
            if sub.sum() != group.members:
                raise RuntimeError(f"refinement counted {sub.sum()} negatives, the histogram {group.members}")
            prefixes = range(group.prefix << bits, (group.prefix + 1) << bits)
            kept += _groups(group.targets, sub, prefixes, group.shift - bits, group.base)
        groups = kept
    selection.finish(settle)
    return method, hist, exact


# ------------------------------------------------------------------------------------------ passes


def _refinement(store, settings, state, runner, meta, groups: list, capacity: int, bits: int = 0):
    """One pass over every pair of every query: per group its members (``capacity`` > 0) or its
    sub-histogram over the next ``bits`` key bits."""
    from .statistics.verify import Refine

    stat = Refine([g.trial for g in groups], [g.low for g in groups], [g.high for g in groups],
                  [g.shift - bits for g in groups], bits, capacity)
    merged = _pass(store, settings, state, runner, meta, stat)
    return list(merged.arrays["refine/members" if capacity else "refine/hist"])


def statistic_blocks(store, settings, meta, plan, stat, pass_name: str) -> tuple:
    """What a pass of the statistic ``stat`` alone needs (a refinement, the bands' pilot): its
    Scoring, the gallery parts, its PassContext, and per query block (row selection, delayed Rows)."""
    from . import graph

    scoring = replace(settings.scoring(store.dim, meta), statistics=(stat,))
    parts = graph.gallery_parts(store.query, store.gallery, settings.protocol.gallery_includes_queries)
    run = graph.PassContext(graph.normalisations(None, None, settings.n_trials), meta)
    blocks = [(rows, graph.load_queries(store.query, rows, scoring, meta, pass_name))
              for rows in graph.query_blocks(plan, None, len(store.query))]
    return scoring, parts, run, blocks


def _pass(store, settings, state, runner, meta, stat):
    """The StatState of ``stat`` over every pair of every query (a further pass)."""
    from dask import delayed

    from . import graph
    from .statistics import StatState

    scoring, parts, run, blocks = statistic_blocks(store, settings, meta, runner.plan, stat, "refinement")
    states = [graph.scoring_pass(parts, runner.plan, scoring, graph.block_size(rows), queries,
                                 delayed(state.positives.take(np.arange(rows.start, rows.stop))), run, meta, 0,
                                 graph.extended_rows(parts), "refinement")
              for rows, queries in blocks]
    return StatState.concat(list(runner.compute(delayed(list)(states))))


def _settled(part, rows: np.ndarray, queries, at: np.ndarray, where: np.ndarray, scoring, meta) -> np.ndarray:
    """Canonical distances of the pairs (queries' row ``at``, the part's row ``rows[where]``)."""
    from . import graph, kernels

    chunk = graph.load_rows(part.fs, rows, scoring, meta, part)
    return kernels.pair_distances(queries.features, chunk.features, at, where, queries.terms, chunk.terms,
                                  scoring.metric)


def settle(store, settings, meta, runner, qrows: np.ndarray, grows: np.ndarray) -> np.ndarray:
    """Canonical distances of the pairs (query row, extended gallery row), reading only their rows:
    the query rows once, the gallery rows a store chunk per task (on ``runner``)."""
    from dask import delayed

    from . import graph
    from .progress import read_work, work_key

    scoring = settings.scoring(store.dim, meta)
    queries, at = np.unique(qrows, return_inverse=True)
    loaded = delayed(graph.load_rows)(store.query, queries, scoring, meta,
                                      dask_key_name=work_key("settling", read_work(graph.rows_bytes(store.query,
                                                                                                    queries.size))))
    tasks, places = [], []
    for part in graph.gallery_parts(store.query, store.gallery, settings.protocol.gallery_includes_queries):
        inside = np.flatnonzero((grows >= part.offset) & (grows < part.offset + len(part.fs)))
        rows, where = np.unique(grows[inside] - part.offset, return_inverse=True)
        chunk_of = rows // part.fs.chunk_rows
        for chunk in np.unique(chunk_of):
            mine = np.flatnonzero(chunk_of == chunk)
            pick = np.flatnonzero(np.isin(where, mine))
            tasks.append(delayed(_settled)(part, rows[mine], loaded, at[inside[pick]], where[pick] - mine[0], scoring,
                                           meta, dask_key_name=work_key("settling", read_work(
                                               graph.rows_bytes(part.fs, mine.size)))))
            places.append(inside[pick])
    out = np.empty(qrows.shape[0])
    for place, values in zip(places, runner.compute(delayed(list)(tasks))):
        out[place] = values
    return out


def exact_bins(settings) -> bool:
    """Whether the scoring pass's histograms are exact: distance stores' values are exact."""
    return settings.metric in ("distance", "similarity") or settings.verification.exact_bins(settings.precision)


def _banded(bands, arrays: dict, targets: dict) -> list:
    """(target, its band's members, negatives below the band) of the targets whose band holds their
    value: the band never overflowed and the (k+1)-th smallest is its r-th member, r = k + 1 -
    below in 1..members (every negative below the band is below each member, every other one above:
    the members' distances are canonical)."""
    from .statistics.verify import COUNT, OVERFLOW

    found = []
    for job, key in enumerate(bands.keys):
        members, below = arrays["verify/band"][job], int(arrays["verify/below"][job])
        target, count = targets.get(key), int(members[0, COUNT])
        if (target is not None and bands.capacities[job] and members[0, OVERFLOW] == 0.0
                and 1 <= target.k + 1 - below <= count):
            found.append((target, members[1:count + 1], below))
    return found


def _counted(bands, arrays: dict, targets: dict, budget: int):
    """Collecting bands for a refinement pass (a ``bands.Bands``, or None): those the counting
    jobs single out (``bands.singled_out``), while they fit the budget."""
    from .bands import Bands, singled_out
    from .statistics.verify import ENTRY_BYTES

    room, jobs = budget // ENTRY_BYTES, []
    for key, (low, high, capacity) in singled_out(bands, arrays, {key: t.k for key, t in targets.items()}).items():
        room -= capacity
        if room >= 0:
            jobs.append((key, low, high, capacity))
    return Bands(*(tuple(column) for column in zip(*jobs))) if jobs else None


def report(store, settings, state, runner, meta) -> dict | None:
    """The ``verification`` section of the result (None when not asked for), the selection's
    passes run on ``runner`` (so: while its session is open)."""
    from .statistics.verify import Verify

    spec = settings.verification
    if spec is None:
        return None
    arrays = state.stats.arrays
    hist = arrays["verify/hist"]
    n_neg = hist.sum(axis=1)
    targets = {(t, x): Target(t, k_of(x, int(n_neg[t]))) for t in range(hist.shape[0]) for x in spec.far}
    selecting = {key: target for key, target in targets.items() if target.k < n_neg[target.trial]}
    banded = []
    if spec.bands:
        banded = _banded(spec.bands, arrays, selecting)  # (riding the first pass: they all collected)
        refined = _counted(spec.bands, arrays, selecting, spec.tail_budget) if spec.bands.first is None else None
        if refined:
            stat = Verify(hist.shape[0], spec.hist_bits, 0, False, False, refined, count=False)
            banded += _banded(refined, _pass(store, settings, state, runner, meta, stat).arrays, selecting)
    pending = [target for target in selecting.values() if all(target is not found for found, _, _ in banded)]

    def refine(groups, capacity, bits=0):
        return _refinement(store, settings, state, runner, meta, groups, capacity, bits)

    exact = exact_bins(settings)
    method, hist, exact = select(hist, exact, arrays.get("verify/tail"), spec.core, pending, spec, refine,
                                 lambda q, g: settle(store, settings, meta, runner, q, g), banded)
    trials = [_trial_section(spec, hist[t], exact[t], _trial_positives(state.positives, t), targets, t,
                             arrays["verify/auc"][t] if spec.auc else None) for t in range(hist.shape[0])]
    return _section(spec, method, trials, settings.std_ddof)


# ----------------------------------------------------------------------------------------- reporting


def _trial_positives(positives, t: int) -> np.ndarray:
    return np.sort(positives.dist[((positives.bits >> np.uint64(t)) & np.uint64(1)).astype(bool)])


def _ratio(count: int, total: int) -> float | None:
    return count / total if total else None


def _trial_section(spec: Spec, hist: np.ndarray, exact: bool, pos: np.ndarray, targets: dict, t: int, auc_sum) -> dict:
    n_neg, n_pos = int(hist.sum()), int(pos.shape[0])
    points = []
    for x in spec.far:
        target = targets[(t, x)]
        point = {"far": float(Fraction(x)), "k": target.k}
        if target.k >= n_neg:  # accept everything (x = 1, or no negative pair)
            point.update(threshold=None, accept="all", tar=_ratio(n_pos, n_pos), achieved_far=_ratio(n_neg, n_neg))
        else:
            point.update(threshold=target.value, accept="d < threshold",
                         tar=_ratio(int(np.searchsorted(pos, target.value, side="left")), n_pos),
                         achieved_far=_ratio(target.below, n_neg))
        points.append(point)
    auc = None if auc_sum is None or not n_pos or not n_neg else int(auc_sum) / (2 * n_pos * n_neg)
    return {"n_pos": n_pos, "n_neg": n_neg, "points": points, "auc": auc, "curves": _curves(spec, hist, exact, pos)}


def _curves(spec: Spec, hist: np.ndarray, exact: bool, pos: np.ndarray) -> dict:
    """ROC points at histogram resolution: at each upper edge of a bin holding a pair (and the
    lower edge of the first), TAR and FAR of "accept d < edge" (DET: FAR against 1 - TAR).
    ``exact``: the negatives were binned on canonical distances wherever that mattered (else a
    negative within the GEMM's error of an edge may sit in the next bin)."""
    from .statistics.verify import key_value, keys_of

    shift = np.uint64(64 - spec.hist_bits)
    occupied = hist > 0
    occupied[np.unique(keys_of(pos) >> shift).astype(np.int64)] = True
    bins = np.flatnonzero(occupied)
    out = {"bits": spec.hist_bits, "exact": exact, "threshold": [], "tar": [], "far": []}
    if not bins.size:
        return out
    cut = np.concatenate([[bins[0]], bins + 1])  # bins below each point
    below = np.concatenate([[0], np.cumsum(hist)])[cut]
    thresholds = np.array([key_value(int(b) << (64 - spec.hist_bits)) for b in cut])
    n_neg, n_pos = int(hist.sum()), pos.shape[0]
    out["threshold"] = [float(e) if math.isfinite(e) else None for e in thresholds]
    out["tar"] = [_ratio(int(c), n_pos) for c in np.searchsorted(pos, thresholds, side="left")]
    out["far"] = [_ratio(int(c), n_neg) for c in below]
    return out


def _section(spec: Spec, method: str, trials: list, ddof: int) -> dict:
    """The result's ``verification``: one trial's section as it is; with trials, the means of TAR,
    achieved FAR and AUC at the top, each trial's section under ``per_trial`` and the spread."""
    head = {"label_convention": LABEL_CONVENTION, "far_targets": [float(Fraction(x)) for x in spec.far],
            "method": method}
    if len(trials) == 1:
        return {**head, **trials[0]}
    from .spread import STATS, spread

    stats = {"tar": [spread([s["points"][i]["tar"] for s in trials], ddof) for i in range(len(spec.far))],
             "achieved_far": [spread([s["points"][i]["achieved_far"] for s in trials], ddof)
                              for i in range(len(spec.far))],
             "auc": spread([s["auc"] for s in trials], ddof)}

    def pick(stat):
        return {"tar": [s[stat] for s in stats["tar"]], "achieved_far": [s[stat] for s in stats["achieved_far"]],
                "auc": stats["auc"][stat]}

    points = [{"far": float(Fraction(x)), "k": None, "threshold": None, "accept": "d < threshold",
               "tar": stats["tar"][i]["mean"], "achieved_far": stats["achieved_far"][i]["mean"]}
              for i, x in enumerate(spec.far)]
    return {**head, "n_pos": None, "n_neg": None, "points": points, "auc": stats["auc"]["mean"], "curves": None,
            "per_trial": trials, "T": len(trials), "std_ddof": ddof, **{stat: pick(stat) for stat in STATS}}


def summary_lines(section: dict) -> list[str]:
    """The summary's verification lines."""
    def pct(value):
        return "n/a" if value is None else f"{100 * value:.2f}%"

    trials = section.get("per_trial")
    if trials:
        head = f"  verification ({len(trials)} trials, mean ± std; label 1 = same identity, accept d < threshold)"
    else:
        head = (f"  verification (N+ {section['n_pos']:,}, N- {section['n_neg']:,}; label 1 = same identity, "
                "accept d < threshold)")
    lines = [head]
    for i, point in enumerate(section["points"]):
        text = f"    TAR@FAR={point['far']:g}  {pct(point['tar'])}"
        if trials:
            std = section["std"]["tar"][i]
            text += "" if std is None else f" ± {100 * std:.2f}"
        elif point["accept"] == "all":
            text += "   (accepts every pair)"
        else:
            text += f"   achieved FAR {point['achieved_far']:.3g}, threshold {point['threshold']:.6g}"
        lines.append(text)
    if section["auc"] is not None:
        lines.append(f"    AUC {section['auc']:.6f}")
    return lines


def check_memory(spec: Spec, n_trials: int, workers: int, memory_budget: int) -> None:
    """Refuse a histogram that cannot fit the budget: each worker's chain and the reduction hold one."""
    needed = n_trials * 8 * 2**spec.hist_bits * (workers + 2)
    if needed > memory_budget:
        raise OptionError(f"--hist-bits {spec.hist_bits} needs about {format_bytes(needed)} of histograms for "
                          f"{n_trials} trial(s), more than the memory budget of {format_bytes(memory_budget)}: "
                          "ask for fewer bits or raise --memory-budget")
