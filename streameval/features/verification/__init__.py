"""Pair-level verification (docs/verification.md): TAR at FAR targets, AUC, ROC and DET curves.
Its section is made while the run's session is open (``report``: further passes may refine it).

spec (options, light) -> kernels -> statistic (the pass's fields; a window) -> placement (a
pilot's windows) -> select (the exact selection) -> report (its passes, the result's section).
"""

from __future__ import annotations

from ..feature import Feature, Flag


class Verification(Feature):
    name, result_field, help_section, target = "verification", "verification", "Open-set & verification", "far"
    flags = (
        Flag("--verification", "Also pair-level verification: TAR at FAR targets, achieved FAR and threshold, "
             "ROC/DET points, over all queries' kept pairs, exact (docs/verification.md).", "flag"),
        Flag("--far", "--verification: FAR targets, exact as written (default 1e-4,1e-3,1e-2).", metavar="X[,X...]"),
        Flag("--auc", "--verification: also the AUC (ties count half); costly with float32 GEMMs, see the docs.",
             "flag"),
        Flag("--tail-budget", "--verification: memory for the tail of smallest negative distances (default 64MiB; a "
             "SIZE as --memory-budget's); a larger need takes an exact refinement pass more.", "size", "SIZE"),
        Flag("--hist-bits", "--verification: histogram (ROC/DET) resolution, in bits of the distance's float64 key "
             "(default 16: 16 bins per octave).", "count"),
    )

    def parse(self, base, store, options: dict):
        from .spec import Spec, pair_bound

        bound = None if store is None else pair_bound(store, base.protocol)
        return Spec.parse(options.pop("verification", None), bound, base.n_trials)

    def statistics(self, settings, meta, dim: int) -> tuple:
        spec = settings.verification
        return () if spec is None else (spec.statistic(settings.n_trials, settings.precision),)

    def state_key(self, settings) -> dict:  # the arrays; FAR targets and the refinement's budget only shape the report
        if settings.verification is None:
            return {}
        record = settings.verification.to_record()
        return {"verification": {name: record[name] for name in ("hist_bits", "core", "auc")}}

    def summary_lines(self, section) -> list[str]:
        from .report import summary_lines

        return summary_lines(section)

    def headline(self, point) -> tuple[tuple, str]:
        return ("tar",), "TAR"

    def point_values(self, point) -> list:
        return [(("tar",), "TAR"), (("achieved_far",), "achieved FAR")]

    def aggregate(self, first, points, statistics) -> tuple[dict, dict]:  # no curves: each run's ROC is its own
        stats = {"auc": statistics(("auc",))}
        return {"points": points, "auc": stats["auc"]["mean"], "curves": None}, stats
