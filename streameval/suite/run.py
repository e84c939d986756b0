"""Running a suite (PROTOCOLS.md 4.5): one pass per gallery variant.

For each gallery variant, every query variant paired with it is stacked into one query set
(``store.stack``): each gallery chunk of that variant is read once per query block and scored
against all of them, each stacked row with its own per-query state.  The pass's state then splits
back by variant, and each evaluation is finalised exactly as ``evaluate`` finalises its own run,
so its numbers are those of a separate ``eval`` of the pair.  The positives pre-pass runs per
stacked row (per evaluation); the protocol's metadata (trial draws, sgs identities) is built once,
from the clean rows, whose ids every variant shares.
"""

from __future__ import annotations

from .. import graph
from ..locking import writing
from ..pipeline import as_store, gallery_metadata, oriented, run_passes
from ..progress import Phases
from ..session import run_plan, session
from ..settings import Execution
from .plan import Suite
from .state import check_state_target, finish_state, save_group
from .views import SuiteResult, open_groups, split_results, stacked_view, suite_result, suite_settings


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
    base = oriented(store, settings.protocol)
    groups = open_groups(store, settings, suite)
    with writing(state):  # the suite state's writer lock, from its check to its record (none without a state)
        if state is not None:
            check_state_target(state, overwrite_state, settings)
        by_pair, passes = {}, 0
        views = [stacked_view(base, gallery, queries) for gallery, queries in groups]
        # the metadata from the clean rows: the variants share their ids
        with session(views[0], settings, execution, phases, "streameval suite", gallery_metadata(base, settings)) as runner:
            plans = [run_plan(view, settings, execution, runner.plan.workers, runner.meta) for view in views]
            announce(runner, views, plans)
            for (gallery, queries), view, plan in zip(groups, views, plans):
                runner.plan = plan
                done = run_passes(view, settings, runner)
                passes += len(runner.plan.query_ranges(len(view.query)))
                by_pair.update(split_results(base, settings, runner, gallery, queries, done.state, done.read))
                if state is not None:
                    save_group(state, view, settings, done.state, gallery[0])
        if state is not None:
            finish_state(state, suite)
            phases.lap("saving state")
        return suite_result(store, settings, suite, by_pair, passes, phases)


def announce(runner, views: list, plans: list) -> None:
    """Tell the progress bar every pass's work up front: one bar (and ETA) for the whole suite."""
    for view, plan in zip(views, plans):
        parts = graph.gallery_parts(view.query, view.gallery, False)
        runner.expect("positives", graph.positives_pass_work(view.query, parts, plan))
        runner.expect("scoring", graph.scoring_work(view.query, parts, plan, len(view.query), 0,
                                                    graph.extended_rows(parts)))

