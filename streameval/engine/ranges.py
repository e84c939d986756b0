"""Distance ranges and the normalisation d~ = (d - lo) / (hi - lo) that statistics may read: the
range pass's per-trial (min, max) and the kernels' arguments built from a scale (GOM's thresholds are
its one user today)."""

from __future__ import annotations

from dataclasses import dataclass

from . import kernels


@dataclass(frozen=True)
class Normalisation:
    """Kernel arguments of d~: mode code, lo and span (= hi - lo)."""

    mode: int
    lo: float
    span: float

    @classmethod
    def identity(cls) -> "Normalisation":
        return cls(kernels.NORM_NONE, 0.0, 1.0)

    @classmethod
    def affine(cls, lo: float, hi: float) -> "Normalisation":
        return cls(kernels.NORM_AFFINE, float(lo), float(hi) - float(lo))


@dataclass(frozen=True)
class DistanceRange:
    """Global (min, max) distance over all pairs; merge = elementwise min / max."""

    lo: float
    hi: float

    @staticmethod
    def merge(a: "DistanceRange", b: "DistanceRange") -> "DistanceRange":
        return DistanceRange(min(a.lo, b.lo), max(a.hi, b.hi))


def normalisations(scale, dist_ranges, n_trials: int) -> tuple:
    """d~'s kernel arguments per trial for ``scale`` (``Scoring.scale``): identity (None, ``none``),
    fixed LO:HI, or the trial's range (``minmax``: ``dist_ranges`` from the range pass)."""
    if scale is None or scale.norm == "none":
        return (Normalisation.identity(),) * n_trials
    if scale.norm == "fixed":
        return (Normalisation.affine(scale.lo, scale.hi),) * n_trials
    return tuple(Normalisation.affine(r.lo, r.hi) for r in dist_ranges)
