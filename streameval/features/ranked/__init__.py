"""Ranked lists (docs/ranked-lists.md): each query's top-K kept in the scoring pass, written as
files beside the result."""

from __future__ import annotations

from ..feature import Feature, Flag


class Ranked(Feature):
    name, result_field, phase, help_section = "ranked", "ranked_lists", "ranked lists", "Ranked lists"
    flags = (
        Flag("--ranked-list", "Also write each query's top-K gallery rows in ranking order, marked positive / "
             "negative (and junk), computed in the same pass (docs/ranked-lists.md).", "count", "K"),
        Flag("--ranked-out", "Where the ranked lists go: a JSON-lines file, a zarr group if it ends in .zarr, or a "
             "plain CSV of file names (one line per listed item) if it ends in .csv. Default: next to --json, as "
             "<json stem>.ranked.jsonl.", "path"),
        Flag("--queries", "Whose ranked lists are written (default all); worst/best leave out queries without "
             "positives.", metavar="worst:N|best:N|ids:LIST|all"),
        Flag("--sort-by", "What worst and best are judged by: AP (default), INP or the first hit's rank.",
             ("ap", "inp", "rank")),
        Flag("--with-junk", "Show the rows the protocol excludes (junk) in place when they come before the K-th "
             "kept row.", "flag"),
        Flag("--with-positives", "Add every positive of each query with its rank and distance.", "flag"),
        Flag("--trial", "With trials: the trial whose ranked lists are written (default 0).", "count"),
    )

    def parse(self, base, store, options: dict):
        from .finalise import Spec

        return Spec.parse(options.pop("ranked", None), base.n_trials)

    def statistics(self, settings, meta, dim: int) -> tuple:
        return () if settings.ranked is None else (settings.ranked.statistic(),)

    def state_key(self, settings) -> dict:
        return {} if settings.ranked is None else {"ranked": settings.ranked.to_record()}

    def finalise(self, store, settings, state, q_bits, selection):
        from .finalise import finalise

        return finalise(store, settings, state, q_bits, selection)
