"""The k-reciprocal re-ranking flavours (docs/reranking.md, PROTOCOLS.md 6.1): what each codebase's
"+RK" computes, as data.

Every flavour's B is a power of the engine's canonical distance d of one base metric (cosine:
d = 1 - cos; sqeuclidean: d = |x - y|^2), B = scale * d^power, so neighbour lists by (d, row) are
lists by (B, row) and rowmax(B) = scale * max(d)^power: the kNN pass keeps d alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def half_up(k1: int) -> int:
    """The original re_ranking.m's expansion size: round((k1 + 1) / 2) with halves up."""
    return (k1 + 2) // 2


def half_even_plus_one(k1: int) -> int:
    """The Python ports': Python's round(k1 / 2) (halves to even) plus one."""
    return round(k1 / 2) + 1


@dataclass(frozen=True)
class Flavour:
    """One row of the flavours table."""

    name: str
    own_neighbour: int  # L1 = k1 + own_neighbour: whether the list of k1 counts the item itself
    expansion: object  # k1 -> h
    power: int  # B = scale * d^power
    cosine_only: bool  # B is always of L2-normalised features (layumi)
    normalised: bool  # w = exp(-B / rowmax) and A = B / rowmax (else w = exp(-B), A = d)
    clamp: bool  # J clamped at 0 (fast-reid)

    def base_metric(self, metric: str) -> str:
        """The engine metric whose canonical distance d the flavour's B is a power of."""
        return "cosine" if self.cosine_only or metric == "cosine" else "sqeuclidean"

    def scale(self, metric: str) -> float:
        """B / d^power: |x^ - y^|^2 = 2 (1 - cos) where the flavour squares normalised features."""
        squares_normalised = self.base_metric(metric) == "cosine" and self.name != "torchreid"
        return float(2 ** self.power) if squares_normalised else 1.0

    def lists(self, k1: int) -> int:
        """L1: the neighbour list length R(i; L1) is taken from."""
        return k1 + self.own_neighbour

    def b(self, d: np.ndarray, metric: str) -> np.ndarray:
        """B from the canonical distance (float64; a distance rounded below 0 counts as 0)."""
        return self.scale(metric) * np.maximum(d, 0.0) ** self.power


FLAVOURS = {
    "matlab": Flavour("matlab", 1, half_up, 1, False, True, False),
    "torchreid": Flavour("torchreid", 1, half_even_plus_one, 2, False, True, False),
    "layumi": Flavour("layumi", 1, half_even_plus_one, 2, True, True, False),
    "fastreid": Flavour("fastreid", 0, half_even_plus_one, 1, False, False, True),
}
