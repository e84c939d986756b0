"""A suite's saved state, for incremental updates (docs/suites.md#execution-one-pass-per-gallery-variant: appends go to every gallery
variant; a suite's saved state updates like any state).

Layout: ``DIR/suite.json`` (the suite's record: plan, options, evaluations) and one ordinary state
per gallery variant, ``DIR/gallery-<variant>/`` (``statestore``), holding the stacked pass's
per-query state.  ``update_suite`` (``run.py``) extends each of them by the appended rows exactly as
``streameval update`` extends one state (``incremental.advance``), then finalises every evaluation.
Each group's state is replaced atomically; an update interrupted between groups leaves the updated
ones current, and the next update finds nothing left to add to them.
"""

from __future__ import annotations

import json
import os

from ..core.outputs import check_directory, check_folder, write_text
from ..run.statestore import StateError
from .plan import Suite

RECORD = "suite.json"
GROUP_PREFIX = "gallery-"


def check_state_target(path, overwrite: bool, settings) -> None:
    """Before any work: a suite state can be written at ``path`` (absent, empty, or a suite state
    replaced with ``overwrite``) for a protocol whose counts survive appends."""
    from ..run.statestore import check_updatable

    check_updatable(settings)
    check_folder(path, "suite state directory")
    path = os.fspath(path)
    if not os.path.lexists(path) or (os.path.isdir(path) and not os.listdir(path)):
        return
    if not _is_suite_state(path):
        raise StateError(f"'{path}' exists and is not a streameval suite state; choose another --state path")
    check_directory(path, overwrite, "suite state")


def _is_suite_state(path: str) -> bool:
    return os.path.isdir(path) and all(name == RECORD or name.startswith(GROUP_PREFIX) for name in os.listdir(path))


def group_folder(path, gallery_variant: str) -> str:
    return os.path.join(os.fspath(path), GROUP_PREFIX + gallery_variant)


def save_group(path, view, settings, query_state, gallery_variant: str, query_hash: str | None = None) -> None:
    from ..run.statestore import save_state

    save_state(group_folder(path, gallery_variant), view, settings, query_state, query_hash)


def finish_state(path, suite: Suite) -> None:
    """The suite's record, written last: a state without it is not a suite state yet."""
    write_text(os.path.join(os.fspath(path), RECORD), json.dumps(suite.record(), indent=1) + "\n", "suite state record")


def load_suite_record(path) -> Suite:
    record_path = os.path.join(os.fspath(path), RECORD)
    try:
        with open(record_path, encoding="utf-8") as fh:
            return Suite.from_record(json.load(fh))
    except FileNotFoundError:
        raise StateError(f"'{os.fspath(path)}' is not a suite state (no {RECORD}); run 'streameval suite --state' "
                         "first") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StateError(f"the suite state at '{os.fspath(path)}' is damaged ({RECORD}: {exc})") from None
