"""Running a suite (docs/suites.md#execution-one-pass-per-gallery-variant): one pass per gallery
variant, and its update.

For each gallery variant, every query variant paired with it is stacked into one query set
(``store.stack``): each gallery chunk of that variant is read once per query block and scored
against all of them, each stacked row with its own per-query state.  The pass's state then splits
back by variant, and each evaluation is finalised exactly as ``evaluate`` finalises its own run,
so its numbers are those of a separate ``eval`` of the pair.  The positives pre-pass runs per
stacked row (per evaluation); the protocol's metadata (trial draws, sgs identities) is built once,
from the clean rows, whose ids every variant shares.  ``update_suite`` extends each group's saved
state (``state``) by the appended rows exactly as ``streameval update`` extends one state
(``incremental.advance``), then finalises every evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

from ..engine import graph
from ..core.errors import OptionError
from ..run.incremental import advance
from ..core.locking import writing
from ..run.pipeline import as_store, feature_requests, gallery_metadata, make_result, oriented, run_passes, store_set
from ..core.progress import Phases
from ..run.session import run_plan, session
from ..run.settings import Execution, Settings
from ..engine.state import QueryState
from ..run.statestore import check_matches, load_state
from ..store import Store
from .plan import Suite
from .state import check_state_target, finish_state, group_folder, load_suite_record, save_group
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


def run_suite(data, suite: Suite | str, *, storage_options: dict | None = None, state=None,
              overwrite_state: bool = False, **options) -> SuiteResult:
    """Evaluate every (query variant, gallery variant) pair of ``suite`` (a preset name, a suite
    file, or ``load_suite``'s Suite with overrides) on the store ``data`` (a path, URL or Store),
    grouped by gallery variant; the keywords are ``evaluate``'s execution keywords.  ``state``:
    also save the suite's per-query states there, for ``update_suite``."""
    phases = Phases()
    if isinstance(suite, str):
        from .plan import load_suite

        suite = load_suite(suite)
    execution = Execution.from_options("run_suite", options)
    store = as_store(data, storage_options)
    settings = suite_settings(store, suite)
    with writing(state):  # the suite state's writer lock, from its check to its record (none without a state)
        if state is not None:
            check_state_target(state, overwrite_state, settings)
        by_pair, passes, _ = run_groups(store, settings, suite, execution, phases, state)
        if state is not None:
            finish_state(state, suite)
            phases.lap("saving state")
        return suite_result(store, settings, suite, by_pair, passes, phases)


def update_suite(data, state, *, storage_options: dict | None = None, **options) -> SuiteResult:
    """Extend the suite state at ``state`` to every committed gallery row of the store ``data``
    (rows appended to every gallery variant) and return the suite's result, equal to a full
    ``run_suite``; the keywords are ``evaluate``'s execution keywords."""
    phases = Phases()
    execution = Execution.from_options("update_suite", options)
    store = as_store(data, storage_options)
    with writing(state):  # from loading to saving: two updates of one state would each save over the other
        suite = load_suite_record(state)
        settings = suite_settings(store, suite)
        by_pair, passes, facts = run_groups(store, settings, suite, execution, phases, state, update=True)
        result = suite_result(store, settings, suite, by_pair, passes, phases)
        result.execution["update"] = facts
        return result


def run_groups(store: Store, settings: Settings, suite: Suite, execution: Execution, phases: Phases, state,
               update: bool = False):
    """One stacked pass per gallery variant, on one session: ({(query variant, gallery variant):
    Result}, the gallery passes run, {gallery variant: the update's facts}).  Each group's state is
    saved in ``state`` (if given); with ``update``, the saved one is extended, and saved again when
    rows were added."""
    base = oriented(store, settings.protocol)
    groups = open_groups(store, settings, suite)
    views = [stacked_view(base, gallery, queries) for gallery, queries in groups]
    saved = {g: load_state(group_folder(state, g)) for (g, _), _ in groups} if update else {}
    by_pair, passes, facts = {}, 0, {}
    label = "streameval suite update" if update else "streameval suite"
    # the metadata from the clean rows: the variants share their ids
    with session(views[0], settings, execution, phases, label, gallery_metadata(base, settings)) as runner:
        plans = [run_plan(view, settings, execution, runner.plan.workers, runner.meta) for view in views]
        if not update:  # (an update announces its passes as it learns their work)
            announce(runner, views, plans)
        for ((name, gallery), queries), view, plan in zip(groups, views, plans):
            query_hash = check_matches(saved[name], view, settings) if update else None
            runner.plan = plan
            extend = partial(advance, saved=saved[name].query_state) if update else None
            done = run_passes(view, settings, runner, extend)  # (no bands to place: a suite has no verification)
            if done.facts is None or done.facts["rows_added"]:
                passes, facts[name] = passes + len(plan.query_ranges(len(view.query))), done.facts
                if state is not None:
                    save_group(state, view, settings, done.state, name, query_hash)
            by_pair.update(split_results(base, settings, runner, (name, gallery), queries, done.state, done.read))
    return by_pair, passes, facts


def announce(runner, views: list, plans: list) -> None:
    """Tell the progress bar every pass's work up front: one bar (and ETA) for the whole suite."""
    for view, plan in zip(views, plans):
        parts = graph.gallery_parts(view.query, view.gallery, False)
        runner.expect("positives", graph.positives_pass_work(view.query, parts, plan))
        runner.expect("scoring", graph.scoring_work(view.query, parts, plan, len(view.query), 0,
                                                    graph.extended_rows(parts)))


def open_groups(store: Store, settings: Settings, suite: Suite) -> list:
    """Per gallery variant, in the plan's order: ((its name, FeatureSet), [(query variant name,
    FeatureSet), ...]); every variant opened, and so checked, before any work."""
    return [((g, variant_side(store, settings, "gallery", g)), [(q, variant_side(store, settings, "query", q))
                                                                for q in qs])
            for g, qs in suite.groups()]


def suite_settings(store: Store, suite: Suite) -> Settings:
    """The suite's options as Settings, refusing what a stacked pass cannot give per evaluation."""
    options = dict(suite.options)  # the requests take their keywords out of it, as evaluate's do
    requests, _ = feature_requests(options)
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
        own = QueryState(state.positives.take(rows), state.stats.take(state.positives.offsets, rows),
                         state.dist_range, state.gallery_rows)
        view = replace(base, query=query, gallery=gallery[1])
        out[(name, gallery[0])] = make_result(view, settings, own, runner, read // len(queries),
                                n * state.gallery_rows, runner.meta)
    return out


def suite_result(store: Store, settings: Settings, suite: Suite, by_pair: dict, passes: int,
                 phases: Phases) -> SuiteResult:
    from ..run.result import run_timing

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
