"""What a suite's run and its update share: its Settings, the variants it opens, the store as one
stacked pass sees it, and the results split back per evaluation (``SuiteResult``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import OptionError
from ..pipeline import make_result, store_set
from ..progress import Phases
from ..settings import Settings
from ..state import QueryState
from ..store import Store
from .plan import Suite
from .summary import suite_section



@dataclass
class SuiteResult:
    """The evaluations' results (in the plan's order) and the suite's summaries."""

    suite: Suite
    results: list  # metrics.Result per evaluation of suite.evaluations
    execution: dict
    query_columns: dict = field(default_factory=dict)  # query variant -> its variant_columns (types, severities)
    run: dict = field(default_factory=dict)

    def to_dict(self, per_query: bool = False) -> dict:
        return {"suite": suite_section(self.suite, self.results, self.execution, self.query_columns, per_query),
                "run": self.run}


def open_groups(store: Store, settings: Settings, suite: Suite) -> list:
    """Per gallery variant, in the plan's order: ((its name, FeatureSet), [(query variant name,
    FeatureSet), ...]); every variant opened, and so checked, before any work."""
    return [((g, variant_side(store, settings, "gallery", g)), [(q, variant_side(store, settings, "query", q))
                                                                for q in qs])
            for g, qs in suite.groups()]



def suite_settings(store: Store, suite: Suite) -> Settings:
    """The suite's options as Settings, refusing what a stacked pass cannot give per evaluation."""
    from ..openset import request as open_set_request
    from ..ranked import request as ranked_request
    from ..verification import request as verification_request

    options = dict(suite.options)  # the requests below take their keywords out of it, as evaluate's do
    ranked, _ = ranked_request(options)
    requests = {"ranked": ranked, "open_set": open_set_request(options), "verification": verification_request(options)}
    try:
        settings = Settings.parse(store, **options, **requests)
    except TypeError as exc:  # an option evaluate does not know
        raise OptionError(f"suite '{suite.plan}': {exc}") from None
    refusals = {
        "a distance store holds one query x gallery matrix, not feature variants": store.holds_distances,
        "ranked lists are per evaluation files: evaluate the pair with 'streameval eval' for them":
            settings.ranked is not None,
        "pair-level verification pools all pairs of an evaluation: evaluate the pair with 'streameval eval "
        "--verification'": settings.verification is not None,
        "minmax GOM normalisation spans all pairs of an evaluation: use gom_norm 'fixed:LO:HI' or 'none'":
            settings.minmax,
        "a protocol with two directions: set direction 'v2t' or 't2v'": len(settings.protocol.directions) == 2,
        "a protocol whose gallery includes the queries' copies (which variant would they be?)":
            settings.protocol.gallery_includes_queries,
    }
    for reason, refused in refusals.items():
        if refused:
            raise OptionError(f"suite '{suite.plan}' cannot run: {reason}")
    return settings


def variant_side(store: Store, settings: Settings, side: str, name: str):
    """The FeatureSet of variant ``name`` on the evaluation's ``side`` ("query" or "gallery")."""
    from ..store.variants import variant_set

    return variant_set(store, store_set(settings.protocol, side), name)


def stacked_view(base: Store, gallery: tuple, queries: list) -> Store:
    """The store as one pass sees it: the query variants stacked, the gallery variant (each a
    (name, FeatureSet) pair)."""
    from ..store.stack import stack_sets

    sets = [fs for _, fs in queries]
    query = sets[0] if len(sets) == 1 else stack_sets(sets, f"{len(sets)} stacked query variants")
    return replace(base, query=query, gallery=gallery[1])


def split_results(base: Store, settings: Settings, runner, gallery: tuple, queries: list, state: QueryState,
                  read: int) -> dict:
    """{(query variant, gallery variant): Result} of one stacked pass: each variant's rows of the
    state, finalised as ``evaluate`` does (the pass's bytes shared out evenly)."""
    n = len(queries[0][1])
    out = {}
    for j, (name, query) in enumerate(queries):
        rows = np.arange(j * n, (j + 1) * n)
        positives = state.positives.take(rows)
        own = QueryState(positives, state.stats.take(state.positives.offsets, rows), state.dist_range,
                         state.gallery_rows)
        view = replace(base, query=query, gallery=gallery[1])
        out[(name, gallery[0])] = make_result(view, settings, own, runner, read // len(queries),
                                n * state.gallery_rows, runner.meta)
    return out


def suite_result(store: Store, settings: Settings, suite: Suite, by_pair: dict, passes: int,
                 phases: Phases) -> SuiteResult:
    from ..metrics import run_timing

    results = [by_pair[(ev.query, ev.gallery)] for ev in suite.evaluations]
    gemms = len(by_pair)
    execution = {"evaluations": len(suite.evaluations), "gallery_variants": len(suite.groups()),
                 "gallery_passes": passes, "gemms": gemms}
    pairs = sum(r.n_queries * r.n_gallery for r in by_pair.values())
    columns = {ev.query: _query_columns(store, settings, ev.query) for ev in suite.evaluations if ev.setting == "query"}
    return SuiteResult(suite, results, execution, columns, run_timing(dict(phases.seconds), pairs))


def _query_columns(store: Store, settings: Settings, name: str) -> dict:
    """The query variant's per-row corruption types and severities (``variant_columns``; none for
    clean) and the names of its types when its attributes give them (``corruption_names``: a type
    is its index into that list)."""
    from ..store.variants import CLEAN, variant_attrs, variant_columns

    if name == CLEAN:
        return {}
    set_name = store_set(settings.protocol, "query")
    names = variant_attrs(store, set_name, name).get("corruption_names")
    named = isinstance(names, list) and all(isinstance(n, str) for n in names)
    return {**variant_columns(store, set_name, name), "corruption_names": names if named else None}
