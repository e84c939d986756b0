"""GOM: genuine open-set metrics (docs/metrics.md#5-open-set-metrics-gom), "Re-identification = Retrieval + Verification".

Distances are normalised to d~ in [0, 1] and thresholded on the grid ``tau_i = i * (1/N)``,
i = 0..N; an item is returned at tau iff d~ <= tau (junk only at tau >= 1).

* mRP, mVP, mReP: means over Q+ of RP_tau, VP_tau, ReP_tau = sqrt(RP_tau * VP_tau)
* mFR: mean over Q- of FR_tau = min(R_tau, B) / B
* mReP_max = max mReP, tau_max = first tau reaching it, mVP_max = max mVP
* MREP, MFR = trapezoid integrals of mReP and mFR over the grid
* tau_nz = first tau with mFR > 0

The streamed state is integer: per query and trial, a histogram of the thresholds at which its
negatives are first returned (``statistics.gom_hist``).  Ratios are formed once, per query in ``kernels.gom_curves``
and as means in ``summarize``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...engine import kernels
from ...core.choices import check_range
from ...core.choices import GOM_VP_MODES as VP_MODES
from ...core.errors import OptionError
from ...engine.ranges import DistanceRange, Normalisation

NORM_MODES = ("minmax", "fixed:LO:HI", "none")


@dataclass(frozen=True)
class GomOptions:
    """``norm``: 'minmax' | 'fixed' | 'none' (with ``lo``, ``hi`` for fixed)."""

    norm: str = "minmax"
    lo: float = 0.0
    hi: float = 1.0
    bins: int = 100
    b: int = 3000
    vp: str = "reference"

    @classmethod
    def parse(cls, norm: str = "minmax", bins: int = 100, b: int = 3000, vp: str = "reference") -> "GomOptions":
        bins, b = check_range(bins, "gom_bins"), check_range(b, "gom_b")
        if vp not in VP_MODES:
            raise OptionError(f"gom_vp must be reference or jaccard, got {vp!r}")
        if norm in ("minmax", "none"):
            return cls(norm=norm, bins=bins, b=b, vp=vp)
        parts = str(norm).split(":")
        try:
            if parts[0] != "fixed" or len(parts) != 3:
                raise ValueError
            lo, hi = float(parts[1]), float(parts[2])
        except ValueError:
            raise OptionError(f"gom_norm must be minmax, none or fixed:LO:HI (e.g. fixed:0:2), got {norm!r}") from None
        if not (np.isfinite(lo) and np.isfinite(hi) and hi > lo and np.isfinite(hi - lo)):
            raise OptionError(f"gom_norm fixed:LO:HI needs finite LO < HI with a finite span HI - LO, got {norm!r}")
        return cls(norm="fixed", lo=lo, hi=hi, bins=bins, b=b, vp=vp)

    @property
    def label(self) -> str:
        return f"fixed:{self.lo:g}:{self.hi:g}" if self.norm == "fixed" else self.norm

    @property
    def spec(self) -> str:
        """The ``gom_norm`` option exactly (repr keeps every digit of LO and HI)."""
        return f"fixed:{self.lo!r}:{self.hi!r}" if self.norm == "fixed" else self.norm

    @property
    def tau(self) -> np.ndarray:
        return np.arange(self.bins + 1, dtype=np.float64) * (1.0 / self.bins)


CURVES = ("rp", "vp", "rep", "fr")


def query_curves(positives, slots: np.ndarray, hist: np.ndarray, junk: np.ndarray, options: GomOptions,
                 norm: Normalisation) -> dict:
    """Per-query curves of one trial: (queries, N + 1) arrays ``rp``, ``vp``, ``rep`` (Q+ rows) and
    ``fr`` (Q- rows), zero elsewhere; ``positives``, ``slots`` in the trial's layout
    (``statistics.slots.restrict``), ``hist`` and ``junk`` the trial's columns."""
    tau = options.tau
    curves = {name: np.zeros((positives.counts.shape[0], tau.shape[0])) for name in CURVES}
    kernels.gom_curves(
        positives.offsets, positives.dist, slots, np.ascontiguousarray(hist), np.ascontiguousarray(junk), tau,
        norm.mode, norm.lo, norm.span, options.vp == "jaccard", options.b, *(curves[name] for name in CURVES),
    )
    return curves


def _first_tau(tau: np.ndarray, mask: np.ndarray):
    hits = np.flatnonzero(mask)
    return float(tau[hits[0]]) if hits.size else None


def trapezoid(curves: np.ndarray, tau: np.ndarray) -> np.ndarray:
    """The trapezoid integral over ``tau`` of a curve (a float) or of each row of curves (an array)."""
    return np.sum(np.diff(tau) * (curves[..., 1:] + curves[..., :-1]) / 2, axis=-1)


def query_areas(curves: dict, in_trial: np.ndarray, n_positives: np.ndarray, options: GomOptions) -> dict:
    """Each query's share of MREP and MFR: ``rep_area``, the trapezoid integral of its ReP curve
    (Q+ of the trial; NaN elsewhere), and ``fr_area``, of its FR curve (Q-; NaN elsewhere).  The
    integral is linear, so MREP is the mean of ``rep_area`` over Q+ and MFR of ``fr_area`` over Q-."""
    valid = n_positives > 0
    return {"rep_area": np.where(in_trial & valid, trapezoid(curves["rep"], options.tau), np.nan),
            "fr_area": np.where(in_trial & ~valid, trapezoid(curves["fr"], options.tau), np.nan)}


def summarize(curves: dict, n_positives: np.ndarray, options: GomOptions, dist_range: DistanceRange | None) -> dict:
    """Mean curves and their summaries; Q+ values None when Q+ is empty, Q- values when Q- is."""
    valid = n_positives > 0
    tau = options.tau
    out = {
        "tau": tau.tolist(), "B": options.b, "normalisation": options.label, "bins": options.bins,
        "vp": options.vp, "dmin": None, "dmax": None,
        "mRP": None, "mVP": None, "mReP": None, "mReP_max": None, "tau_max": None, "mVP_max": None, "MREP": None,
        "mFR": None, "MFR": None, "tau_nz": None,
    }
    if dist_range is not None:
        out["dmin"], out["dmax"] = dist_range.lo, dist_range.hi
    if valid.any():
        m_rp, m_vp, m_rep = (curves[name][valid].mean(axis=0) for name in ("rp", "vp", "rep"))
        out.update(
            mRP=m_rp.tolist(), mVP=m_vp.tolist(), mReP=m_rep.tolist(), mReP_max=float(m_rep.max()),
            tau_max=_first_tau(tau, m_rep == m_rep.max()), mVP_max=float(m_vp.max()), MREP=float(trapezoid(m_rep, tau)),
        )
    if not valid.all():
        m_fr = curves["fr"][~valid].mean(axis=0)
        out.update(mFR=m_fr.tolist(), MFR=float(trapezoid(m_fr, tau)), tau_nz=_first_tau(tau, m_fr > 0))
    return out
