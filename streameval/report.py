"""Human-readable summaries for the terminal."""

from __future__ import annotations

from .metrics import Result
from .store import Store


def _pct(value) -> str:
    return "n/a" if value is None else f"{100 * value:6.2f}%"


def summary(result: Result, label: str = "") -> str:
    """A short table: counts, CMC ranks, mAP (both conventions), mINP, and how the run went."""
    run = result.run
    lines = [
        f"streameval {label}".rstrip(),
        f"  queries {_count(result.n_queries)} ({_count(result.n_valid_queries)} with positives, "
        f"{_count(result.n_open_queries)} open-set)   gallery {result.n_gallery:,}",
        f"  metric {result.metric}   protocol {result.protocol}   precision {result.options.get('precision')}"
        + (f"   CMC {result.cmc_flavour}" if result.cmc_flavour != "first-hit" else ""),
    ]
    if result.n_valid_queries == 0:
        lines.append("  no query has a positive in the gallery: closed-set metrics are undefined")
    else:
        ranks = sorted({k for k in (1, 5, 10, 20) if k <= result.max_rank} | {result.max_rank})
        lines += [
            "  " + "  ".join(f"{'R' + str(k):>7}" for k in ranks),
            "  " + "  ".join(f"{_pct(result.rank(k)):>7}" for k in ranks),
            f"  mAP {_pct(result.mAP)}   mAP (trapezoid) {_pct(result.mAP_trapezoid)}   mINP {_pct(result.mINP)}",
        ]
    if result.trials is not None:
        lines += _trial_lines(result.trials)
    if result.gom is not None:
        lines += _gom_lines(result.gom)
    if result.directions:
        lines += [f"  direction {name}: rank-1 {_pct(d['rank1'])}   mAP {_pct(d['mAP'])}   mINP {_pct(d['mINP'])}"
                  for name, d in result.directions.items()]
    if run.get("update"):
        lines.append(_update_line(run["update"], result.n_queries))
    if run:
        lines += [
            f"  {run['pairs_per_s'] / 1e6:,.1f} M pairs/s   read {run['bytes_read'] / 2**20:,.1f} MiB   blocks "
            f"{run['query_block']:,} x {run['gallery_chunk']:,}   {run['workers']} workers on {run['scheduler']}",
            phases_line(run["phases"]),
        ]
    return "\n".join(lines)


def _count(value) -> str:
    """A count, or a mean count over trials."""
    return f"{value:,}" if float(value).is_integer() else f"{value:,.1f}"


def _trial_lines(trials: dict) -> list[str]:
    """The headline values are means over the trials: say so, with their spread."""
    def pm(name):
        mean, std = trials["mean"][name], trials["std"][name]
        if mean is None:
            return f"{name} n/a"
        return f"{name} {_pct(mean).strip()}" + ("" if std is None else f" +- {100 * std:.2f}")

    return [f"  means over {trials['T']} trials (std ddof {trials['std_ddof']}): "
            + "   ".join(pm(name) for name in ("rank1", "rank5", "rank10", "mAP", "mINP"))]


PHASE_NOTES = {"passes": "passes (the bar)"}


def phases_line(phases: dict) -> str:
    """The line "20.52 s = 0.41 s setup + 19.80 s passes (the bar) + ...": every part printed as the
    bar prints its time, and the total as the sum of the parts printed, so the line adds up exactly."""
    hundredths = [int(round(float(f"{seconds:.2f}") * 100)) for seconds in phases.values()]
    parts = " + ".join(f"{h / 100:.2f} s {PHASE_NOTES.get(name, name)}" for name, h in zip(phases, hundredths))
    return f"  {sum(hundredths) / 100:.2f} s = {parts}"


def _update_line(update: dict, n_queries: int) -> str:
    """What an incremental update scored, and why it re-scored old rows."""
    if update["rows_added"] == 0:
        return f"  update: no gallery rows added since the state ({update['rows_before']:,} rows); nothing scored"
    line = f"  update: +{update['rows_added']:,} gallery rows (had {update['rows_before']:,}); "
    if update["range_moved"]:
        before, after = update["range_before"], update["range_after"]
        return line + (f"the minmax range moved from [{before[0]:.6g}, {before[1]:.6g}] to [{after[0]:.6g}, "
                       f"{after[1]:.6g}], moving every GOM threshold: all {n_queries:,} queries re-scored over the old rows")
    if update["queries_rescored"]:
        return line + f"{update['queries_rescored']:,} queries with new positives re-scored over the old rows"
    return line + "no new positives: only the new rows scored"


def _num(value, fmt=".4f") -> str:
    return "n/a" if value is None else format(value, fmt)


def _gom_lines(gom: dict) -> list[str]:
    norm = gom["normalisation"]
    if gom["dmin"] is not None:
        norm += f" [{gom['dmin']:.4g}, {gom['dmax']:.4g}]"
    lines = [f"  GOM ({norm}, {gom['bins']} bins, vp {gom['vp']}, B {gom['B']})"]
    if gom["mReP"] is None:
        lines.append("    no query with positives: mReP/mRP/mVP are undefined")
    else:
        lines.append(f"    mReP_max {_num(gom['mReP_max'])} at tau {_num(gom['tau_max'], '.2f')}   "
                     f"MREP {_num(gom['MREP'])}   mVP_max {_num(gom['mVP_max'])}")
    if gom["mFR"] is None:
        lines.append("    no open-set query (without positives): mFR/MFR/tau_nz are undefined")
    else:
        lines.append(f"    MFR {_num(gom['MFR'])}   tau_nz {_num(gom['tau_nz'], '.2f')}")
    clipped = gom.get("clipped")  # fixed normalisation only
    if clipped and (clipped["below"] or clipped["above"]):
        below, above = clipped["below"], clipped["above"]
        lines.append(f"    warning: {below + above:,} of {clipped['pairs']:,} distances fall outside {gom['normalisation']} "
                     f"({below:,} below, {above:,} above) and were clipped to its ends (observed: "
                     f"[{clipped['observed_min']:.4g}, {clipped['observed_max']:.4g}]); widen it or use minmax")
    return lines


def store_summary(store: Store) -> str:
    g = store.gallery
    return (
        f"{store.path}: {len(store.query):,} queries, {len(g):,} gallery rows, dim {store.dim}, "
        f"{g.features.dtype}, {g.chunk_rows:,} rows per chunk, default metric {store.default_metric}"
    )
