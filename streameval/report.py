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
        f"  queries {result.n_queries:,} ({result.n_valid_queries:,} with positives, "
        f"{result.n_open_queries:,} open-set)   gallery {result.n_gallery:,}",
        f"  metric {result.metric}   protocol {result.protocol}   precision {result.options.get('precision')}",
    ]
    if result.n_valid_queries == 0:
        lines.append("  no query has a positive in the gallery: closed-set metrics are undefined")
    else:
        lines += [
            "  " + "  ".join(f"{'R' + str(k):>7}" for k in (1, 5, 10, 20, result.max_rank)),
            "  " + "  ".join(f"{_pct(result.rank(k)):>7}" for k in (1, 5, 10, 20, result.max_rank)),
            f"  mAP {_pct(result.mAP)}   mAP (trapezoid) {_pct(result.mAP_trapezoid)}   mINP {_pct(result.mINP)}",
        ]
    if run:
        pairs = result.n_queries * result.n_gallery
        lines.append(
            f"  {run['elapsed_s']:.2f} s, {pairs / max(run['elapsed_s'], 1e-9):,.0f} pairs/s   "
            f"blocks {run['query_block']:,} queries x {run['gallery_chunk']:,} gallery rows, {run['workers']} workers"
        )
    return "\n".join(lines)


def store_summary(store: Store) -> str:
    g = store.gallery
    return (
        f"{store.path}: {len(store.query):,} queries, {len(g):,} gallery rows, dim {store.dim}, "
        f"{g.features.dtype}, {g.chunk_rows:,} rows per chunk, default metric {store.default_metric}"
    )
