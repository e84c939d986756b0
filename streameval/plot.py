"""``streameval plot``: CMC and GOM curves of a result JSON, for people who would rather look."""

from __future__ import annotations

import json

from .errors import OptionError, StoreError


def plot_result(result_json: str, out_png: str) -> None:
    """Two panels: CMC@k; mReP (and mRP, mVP) and mFR against tau with tau_max marked."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise OptionError("plotting needs matplotlib: in the streameval clone, run .venv/bin/pip install -e '.[plot]'") from None
    try:
        with open(result_json) as fh:
            result = json.load(fh)
        cmc, gom = result["cmc"], result.get("gom")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"'{result_json}' is not a streameval result JSON ({exc})") from None
    fig, (ax_cmc, ax_gom) = plt.subplots(1, 2, figsize=(11, 4.2))
    if cmc:
        ranks = range(1, len(cmc) + 1)
        ax_cmc.plot(ranks, cmc, marker=".", color="tab:blue")
        ax_cmc.set_title(f"CMC  (rank-1 {cmc[0]:.2%}, mAP {result['mAP']:.2%})")
    else:
        ax_cmc.text(0.5, 0.5, "no query with positives", ha="center", transform=ax_cmc.transAxes)
    ax_cmc.set(xlabel="rank k", ylabel="CMC@k", ylim=(0, 1.02))
    ax_cmc.grid(alpha=0.3)
    if gom:
        tau = gom["tau"]
        for key, style in (("mReP", "-"), ("mRP", ":"), ("mVP", "--"), ("mFR", "-")):
            if gom.get(key) is not None:
                ax_gom.plot(tau, gom[key], style, label=key)
        if gom.get("tau_max") is not None:
            ax_gom.axvline(gom["tau_max"], color="grey", lw=0.8)
            ax_gom.annotate(f"tau_max={gom['tau_max']:.2f}\nmReP_max={gom['mReP_max']:.3f}",
                            (gom["tau_max"], gom["mReP_max"]), textcoords="offset points", xytext=(8, 8),
                            fontsize=9, bbox={"boxstyle": "round", "fc": "white", "ec": "grey", "alpha": 0.9})
        ax_gom.set_title(f"GOM ({gom['normalisation']})")
        ax_gom.legend(loc="best")
    else:
        ax_gom.text(0.5, 0.5, "GOM not computed (--no-gom)", ha="center", transform=ax_gom.transAxes)
    ax_gom.set(xlabel="tau (normalised distance threshold)", ylim=(0, 1.02))
    ax_gom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
