"""What a feature is to the run and the CLI: :class:`Feature` and its command-line :class:`Flag`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Flag:
    """A command-line option of a feature, which the CLI turns into a click option.  ``kind``: None
    (text), "flag", "count" (a number in ``choices.RANGES`` under the option's name), "size" (bytes),
    "path", or a tuple of choices.  ``default`` is eval's; update's is the saved state's."""

    name: str
    help: str
    kind: object = None
    metavar: str | None = None
    default: object = None


class Feature:
    """What one feature adds to a run; the defaults are those of a feature that adds nothing there.
    One with a ``setting`` defines ``parse(base, store, options)``: its Spec from Settings.parse's
    keywords (taking its own out of ``options``), None when off (``base``: the settings without
    features; ``store``: None for a saved state's options).  One whose section reports values at
    targets (``target``: the key of its points) says which (``headline``, ``point_values``) and how
    its section is averaged over runs (``aggregate``)."""

    name = ""  # its Settings field (when ``setting``) and its key in results and saved options
    setting = True  # whether Settings holds its Spec (None: off); else the protocol alone turns it on
    result_field = None  # the Result field its section fills, if any
    phase = None  # the run phase ``finalise`` is timed as (None: within "metrics")
    finalise = None  # (store, settings, state, q_bits, selection) -> its Result section, if it makes one there
    help_section = ""  # the --help heading of its ``flags``
    flags: tuple = ()  # its command-line options (Flag)
    target = None  # the target key of its section's points ("far": TAR at each FAR), if it has them

    def statistics(self, settings, meta, dim: int) -> tuple:
        """What the scoring pass counts for it."""
        return ()

    def prepare_run(self, store, settings, runner, temporary) -> tuple:
        """(store, settings) the passes run on, after what it computes before them (re-ranking's kNN
        pass); ``temporary``: an ExitStack that removes the run's temporary folders."""
        return store, settings

    def block_source(self, spec, default):
        """The source of the run's distances (``engine/sources.py``) given its Spec: ``default``
        unless it replaces them."""
        return default

    def to_options(self, spec) -> dict:
        """Its ``evaluate`` keywords (Settings.to_options)."""
        return {} if spec is None else {self.name: spec.to_record()}

    def state_key(self, settings) -> dict:
        """What a saved per-query state of it depends on (Settings.state_key)."""
        return {}

    def summary_lines(self, section) -> list[str]:
        """Its lines in the terminal summary."""
        return []

