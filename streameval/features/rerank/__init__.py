"""k-reciprocal re-ranking and average query expansion (docs/reranking.md): the run's distances
replaced by re-ranked ones, computed out of core from one U x U kNN pass."""

from __future__ import annotations

from ..feature import Feature, Flag


class Rerank(Feature):
    name, result_field, help_section = "rerank", "rerank", "Re-ranking"
    flags = (
        Flag("--rerank", "Evaluate k-reciprocal re-ranked distances (Zhong et al. 2017), exactly and out of core, as "
             "this codebase's +RK computes them (docs/reranking.md).", ("matlab", "torchreid", "layumi", "fastreid")),
        Flag("--rerank-k1", "--rerank: k1, the k-reciprocal neighbours (default 20).", "count"),
        Flag("--rerank-k2", "--rerank: k2, the neighbours V is averaged over (default 6; 1: none).", "count"),
        Flag("--rerank-lambda", "--rerank: the weight of the original distance (default 0.3).", "count"),
        Flag("--qe", "Average query expansion (fast-reid's aqe) of queries and gallery before the evaluation "
             "(and the re-ranking) (docs/reranking.md#average-query-expansion---qe-aqe).", ("aqe",)),
        Flag("--qe-k", "--qe: neighbours averaged (default 5).", "count"),
        Flag("--qe-alpha", "--qe: similarity exponent (default 3).", "count"),
        Flag("--qe-times", "--qe: rounds (default 1).", "count"),
        Flag("--knn-cache", "--rerank: keep the kNN pass's lists in this folder and reuse them for other k1 (up to "
             "the cached one), k2, lambda and flavours of the same base distance.", "path"),
    )

    def parse(self, base, store, options: dict):
        from .spec import Spec

        return Spec.parse(options.pop("rerank", None), base.metric)

    def state_key(self, settings) -> dict:
        return {} if settings.rerank is None else {"rerank": settings.rerank.to_record()}

    def prepare_run(self, store, settings, runner, temporary):
        """(store, settings) for the passes: the expanded features' store, the re-ranked distances."""
        if settings.rerank is None:
            return store, settings
        from .run import prepare_run

        return prepare_run(store, settings, runner, temporary)

    def block_source(self, spec, default):
        return default if spec is None or spec.distances is None else spec.distances

    def finalise(self, store, settings, state, q_bits, selection):
        return settings.rerank.section()

    def summary_lines(self, section) -> list[str]:
        if section.get("flavour") is None:
            return [f"  query expansion: aqe k {section['qe']['k']}, alpha {section['qe']['alpha']:g}, "
                    f"{section['qe']['times']} round(s)"]
        return [f"  re-ranked: {section['flavour']} (k1 {section['k1']}, k2 {section['k2']}, lambda "
                f"{section['lambda']:g}; |R*| mean {section['rstar_mean']:.1f}, candidates with J < 1: "
                f"{section['candidates']:,})"]
