"""GOM open-set metrics (docs/metrics.md#5-open-set-metrics-gom): the options, the threshold
histograms' statistic, the state key and the summary lines; the curves are computed with the
closed-set values per trial."""

from __future__ import annotations

from ..feature import Feature, Flag


class Gom(Feature):
    name, result_field, help_section = "gom", "gom", "Metrics"
    flags = (
        Flag("--no-gom", "Skip the GOM open-set metrics (closed-set metrics only, one pass).", "flag", default=False),
        Flag("--gom-norm", "GOM distance normalisation: minmax (global min/max, an extra pass), fixed:LO:HI "
             "(e.g. fixed:0:2 for cosine, one pass) or none (distances already in [0, 1]).", default="minmax"),
        Flag("--gom-bins", "Threshold grid size N: tau = 0, 1/N, ..., 1.", "count", default=100),
        Flag("--gom-b", "FR cap B: FR = min(returned, B) / B for open-set queries.", "count", default=3000),
        Flag("--gom-vp", "VP as the GOM reference code (returns capped at the last positive) or the paper's "
             "Jaccard index.", ("reference", "jaccard"), default="reference"),
    )

    def parse(self, base, store, options: dict):
        from .finalise import GomOptions

        o = {key: options.pop(key, default) for key, default in
             (("no_gom", False), ("gom_norm", "minmax"), ("gom_bins", 100), ("gom_b", 3000), ("gom_vp", "reference"))}
        return None if o["no_gom"] else GomOptions.parse(o["gom_norm"], o["gom_bins"], o["gom_b"], o["gom_vp"])

    def statistics(self, settings, meta, dim: int) -> tuple:
        if settings.gom is None:
            return ()
        from ...engine import kernels
        from .statistic import GomHist

        return (GomHist(settings.n_trials, settings.gom.bins, settings.gom.norm == "fixed",
                        kernels.bin_error_bound(dim, settings.precision)),)

    def to_options(self, spec) -> dict:
        if spec is None:
            from .finalise import GomOptions

            return {**self.to_options(GomOptions()), "no_gom": True}
        return {"no_gom": False, "gom_norm": spec.spec, "gom_bins": spec.bins, "gom_b": spec.b, "gom_vp": spec.vp}

    def state_key(self, settings) -> dict:  # B and vp only shape the report
        gom = settings.gom
        return {"gom": None if gom is None else {"norm": gom.norm, "lo": gom.lo, "hi": gom.hi, "bins": gom.bins}}

    def summary_lines(self, gom: dict) -> list[str]:
        norm = gom["normalisation"]
        if gom["dmin"] is not None:
            norm += f" [{gom['dmin']:.4g}, {gom['dmax']:.4g}]"
        lines = [f"  GOM ({norm}, {gom['bins']} bins, vp {gom['vp']}, B {gom['B']})"]
        if gom["mReP"] is None:
            lines.append("    no query with positives: mReP/mRP/mVP are undefined")
        else:
            lines.append(f"    mReP_max {_num(gom['mReP_max'])} at tau {_num(gom['tau_max'], '.2f')}   "
                         f"MREP {_num(gom['MREP'])}   mVP_max {_num(gom['mVP_max'])}")
        if gom["mFR"] is None:
            lines.append("    no open-set query (without positives): mFR/MFR/tau_nz are undefined")
        else:
            lines.append(f"    MFR {_num(gom['MFR'])}   tau_nz {_num(gom['tau_nz'], '.2f')}")
        warning = clipping_warning(gom)
        return lines + ([f"    warning: {warning}"] if warning else [])


def _num(value, fmt=".4f") -> str:
    return "n/a" if value is None else format(value, fmt)


def clipping_warning(gom: dict | None) -> str | None:
    """Distances outside a fixed GOM normalisation were clipped: said with every format."""
    clipped = (gom or {}).get("clipped")  # fixed normalisation only
    if not clipped or not (clipped["below"] or clipped["above"]):
        return None
    below, above = clipped["below"], clipped["above"]
    return (f"{below + above:,} of {clipped['pairs']:,} distances fall outside {gom['normalisation']} "
            f"({below:,} below, {above:,} above) and were clipped to its ends (observed: "
            f"[{clipped['observed_min']:.4g}, {clipped['observed_max']:.4g}]); widen it or use minmax")
