"""Verification's report (docs/verification.md#how-it-is-computed, #in-the-result-json): TAR@FAR,
AUC, ROC and DET curves, and the passes the exact selection takes (``select``): one loop, place,
pass, resolve.

:func:`report` (run while the session is open) resolves each target from its trial's tail when it
holds the k + 1 smallest negatives, or from the scoring pass's windows (placed by a pilot:
``placement``), else from windows each further pass counts: placed on an exact histogram's bin,
or first around a bin of one binned on fast distances.  Only the tail's entries near a selected
value get their canonical distance (``settle``: only those rows are read again).  Ratios are
formed only here, from integer counts.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ...core.rates import k_of
from .spec import LABEL_CONVENTION, Spec
from .select import KEYS, Selection, Target, guess, place, resolve, tail_usable


def report(store, settings, state, runner, meta) -> dict | None:
    """The ``verification`` section of the result (None when not asked for), the selection's
    passes run on ``runner`` (so: while its session is open)."""
    spec = settings.verification
    if spec is None:
        return None
    arrays = state.stats.arrays
    hist = arrays["verify/hist"]
    n_neg = hist.sum(axis=1)
    targets = {(t, x): Target(t, k_of(x, int(n_neg[t])), int(n_neg[t])) for t in range(hist.shape[0]) for x in spec.far}
    pending = [target for target in targets.values() if target.k < target.top]
    selection, tails, exact = Selection(), arrays.get("verify/tail"), exact_bins(settings)
    for t in range(hist.shape[0]):
        mine = [target for target in pending if target.trial == t]
        if mine and tails is not None and tail_usable(tails[t], spec.core, max(target.k for target in mine)):
            selection.add(tails[t, 1:int(tails[t, 0, 0]) + 1], 0, mine)
            pending = [target for target in pending if target.trial != t]
    method = "bands" if spec.windows else "two-pass" if pending else "tail"
    shift = 64 - spec.hist_bits
    for target in pending:
        if exact:
            target.narrow(0, KEYS, shift, 0, hist[target.trial])
        else:
            target.guess = guess(target, hist[target.trial], shift)
    pending = [target for target in pending if target.value is None]
    if spec.windows:
        pending = resolve(spec.windows, arrays, pending, selection)
    while pending:
        windows = place(pending, spec.tail_budget)
        pending = resolve(windows, _pass(store, settings, state, runner, meta, windows).arrays, pending, selection)
    selection.finish(lambda q, g: settle(store, settings, meta, runner, q, g))
    trials = [_trial_section(spec, hist[t], exact, _trial_positives(state.positives, t), targets, t,
                             arrays["verify/auc"][t] if spec.auc else None) for t in range(hist.shape[0])]
    return _section(spec, method, trials, settings.std_ddof)


def _pass(store, settings, state, runner, meta, windows):
    """The state of ``windows`` counted over every pair of every query (a further pass)."""
    from dask import delayed

    from ...engine import graph
    from ...engine.statistic import StatState
    from .placement import statistic_blocks
    from .statistic import Verify

    stat = Verify(settings.n_trials, settings.verification.hist_bits, 0, False, False, windows, count=False)
    scoring, parts, run, blocks = statistic_blocks(store, settings, meta, runner, stat, "refinement")
    states = [graph.scoring_pass(parts, runner.plan, scoring, graph.block_size(rows), queries,
                                 delayed(state.positives.take(np.arange(rows.start, rows.stop))), run, meta, 0,
                                 graph.extended_rows(parts), "refinement")
              for rows, queries in blocks]
    return StatState.concat(list(runner.compute(delayed(list)(states))))


def _settled(part, rows: np.ndarray, queries, at: np.ndarray, where: np.ndarray, scoring, meta) -> np.ndarray:
    """Canonical distances of the pairs (queries' row ``at``, the part's row ``rows[where]``)."""
    from ...engine import graph, kernels

    chunk = graph.load_rows(part.fs, rows, scoring, meta, part)
    return kernels.pair_distances(queries.features, chunk.features, at, where, queries.terms, chunk.terms,
                                  scoring.metric)


def settle(store, settings, meta, runner, qrows: np.ndarray, grows: np.ndarray) -> np.ndarray:
    """Canonical distances of the pairs (query row, extended gallery row), reading only their rows:
    the query rows once, the gallery rows a store chunk per task (on ``runner``)."""
    from dask import delayed

    from ...engine import graph
    from ...core.progress import read_work, work_key

    scoring = settings.scoring(store.dim, meta, runner.device)
    queries, at = np.unique(qrows, return_inverse=True)
    loaded = graph.task(graph.load_rows, store.query, queries, scoring, meta,
                        dask_key_name=work_key("settling", read_work(graph.rows_bytes(store.query, queries.size))))
    tasks, places = [], []
    for part in graph.gallery_parts(store.query, store.gallery, settings.protocol.gallery_includes_queries):
        inside = np.flatnonzero((grows >= part.offset) & (grows < part.offset + len(part.fs)))
        rows, where = np.unique(grows[inside] - part.offset, return_inverse=True)
        chunk_of = rows // part.fs.chunk_rows
        for chunk in np.unique(chunk_of):
            mine = np.flatnonzero(chunk_of == chunk)
            pick = np.flatnonzero(np.isin(where, mine))
            tasks.append(graph.task(_settled, part, rows[mine], loaded, at[inside[pick]], where[pick] - mine[0], scoring,
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
    from .kernels import key_value, keys_of

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
    from ...core.spread import STATS, spread

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


