"""Open-set identification (docs/open-set.md#definitions): DIR at FPIR targets and ranks, from each
query's nearest item counted in the scoring pass."""

from __future__ import annotations

from ..feature import Feature, Flag


class OpenSet(Feature):
    name, result_field, help_section, target = "open_set", "open_set", "Open-set & verification", "fpir"
    flags = (
        Flag("--open-set", "Also open-set identification: DIR at FPIR targets and ranks (Liao et al.), in the same "
             "pass (docs/open-set.md).", "flag"),
        Flag("--fpir", "--open-set: FPIR targets, exact as written (default 0.001,0.01,0.1).", metavar="X[,X...]"),
        Flag("--dir-ranks", "--open-set: DIR ranks (default 1,5,10,20).", metavar="R[,R...]"),
        Flag("--fpir-rounding", "--open-set: false alarms allowed, k = x N_nm rounded half up (round, Liao's; "
             "default) or down (floor: never above x).", ("round", "floor")),
    )

    def parse(self, base, store, options: dict):
        from .finalise import Spec

        return Spec.parse(options.pop("open_set", None), base.max_rank)

    def statistics(self, settings, meta, dim: int) -> tuple:
        if settings.open_set is None:
            return ()
        from .statistic import Nearest

        return (Nearest(settings.n_trials),)

    def state_key(self, settings) -> dict:  # the nearest-item state; targets and ranks only shape the report
        return {} if settings.open_set is None else {"open_set": True}

    def finalise(self, store, settings, state, q_bits, selection):
        from .finalise import finalise

        return finalise(state, settings, q_bits)

    def summary_lines(self, section: dict) -> list[str]:
        """The terminal table's open-set lines: the populations, then DIR per rank at each target."""
        def pct(value):
            return "n/a" if value is None else f"{100 * value:.2f}%"

        def count(value):  # a mean over trials need not be whole
            return f"{int(value):,}" if float(value).is_integer() else f"{value:,.1f}"

        trials = f"; means over {section['T']} trials" if "T" in section else ""
        lines = [f"  open-set DIR@FPIR ({count(section['n_non_mated'])} non-mated, {count(section['n_mated'])} mated "
                 f"queries; k rounded {'half up' if section['rounding'] == 'round' else 'down'}{trials})"]
        for point in section["points"]:
            ranks = "  ".join(f"R{rank} {pct(value)}" for rank, value in point["dir"].items())
            lines.append(f"    FPIR {point['fpir']:g} (achieved {pct(point['achieved_fpir'])}): {ranks}")
        if section["note"]:
            limit = "  ".join(f"R{rank} {pct(value)}" for rank, value in section["closed_set_limit"].items())
            lines.append(f"    {section['note']}: {limit}")
        return lines

    def headline(self, point) -> tuple[tuple, str]:  # the first rank's DIR
        rank = next(iter(point["dir"]))
        return ("dir", rank), f"DIR-R{rank}"

    def point_values(self, point) -> list:
        return [(("achieved_fpir",), "achieved FPIR")] + [(("dir", rank), f"DIR-R{rank}") for rank in point["dir"]]

    def aggregate(self, first, points, statistics) -> tuple[dict, dict]:
        limit, stats = {}, {}
        for rank in first["ranks"]:
            stats[f"closed-set limit R{rank}"] = found = statistics(("closed_set_limit", str(rank)))
            limit[str(rank)] = found["mean"]
        return {"ranks": first["ranks"], "points": points, "closed_set_limit": limit, "note": None}, stats
