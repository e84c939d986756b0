"""Pair-level verification's options (docs/verification.md#options, #definitions): what the user
asks for and what the scoring pass keeps for it.  Light: no numba, no pass.

Pairs (q, g) with g kept for q (docs/protocols.md#the-kept-set): positive pairs (same identity, label 1, "genuine")
and negative pairs (label 0, "impostor"), pooled over all queries of a trial.  A pair is accepted
at threshold t when d < t.  FAR target x (the decimal as written, exactly: ``fractions.Fraction``):
k = floor(x N-); with k < N-, the threshold is n_(k+1), the (k+1)-th smallest negative distance.

:class:`Spec` (``verification``, ``far``, ``auc``, ``tail_budget``, ``hist_bits``): per trial a
histogram of the negatives, their count N- and, when it fits ``tail_budget``, a tail of the
smallest ones; it decides a saved state's arrays, so it is one of the ``Settings``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from fractions import Fraction

from ...core.choices import check_range, is_integer
from ...core.errors import OptionError
from ...engine.plan import parse_bytes
from ...core.rates import k_of, parse_rates

VERIFY_OPTIONS = ("verification", "far", "auc", "tail_budget", "hist_bits")
CLI_NAMES = {key: "--" + key.replace("_", "-") for key in VERIFY_OPTIONS}
DEFAULT_FAR = ("1e-4", "1e-3", "1e-2")
DEFAULT_TAIL_BUDGET = 64 << 20
DEFAULT_HIST_BITS = 16
RECORD_KEYS = ("far", "auc", "tail_budget", "hist_bits", "core")
LABEL_CONVENTION = (
    "label 1 = positive pair (same identity, kept by the protocol), label 0 = negative pair; a pair is accepted "
    "when its distance is below the threshold; TAR = accepted positive pairs / N+, FAR = accepted negative pairs "
    "/ N-, over all queries' pairs (docs/verification.md#definitions). fast-reid's roc.py labels them the other "
    "way round: its "
    "'TPR'(t) is 1 - FAR(t) and its 'FPR'(t) is 1 - TAR(t).")


@dataclass(frozen=True)
class Spec:
    """What the scoring pass keeps for verification.  ``core``: the tail's length L (k_max + 1 for
    the largest number of negative pairs the store can have, queries x extended gallery rows), 0
    when the tail would not fit ``tail_budget``: then the selection takes windows (``select``)."""

    far: tuple = DEFAULT_FAR
    auc: bool = False
    tail_budget: int = DEFAULT_TAIL_BUDGET
    hist_bits: int = DEFAULT_HIST_BITS
    core: int | None = None
    windows: object = None  # statistic.Windows placed by a pilot for this run (not a saved state's)

    @classmethod
    def parse(cls, value, pair_bound: int | None, n_trials: int) -> "Spec | None":
        """None, or a record (``request``, ``to_record``), checked; ``core`` is sized from
        ``pair_bound`` unless the record holds it (a saved state's)."""
        if value is None:
            return None
        if not isinstance(value, Mapping) or not set(value) <= set(RECORD_KEYS):
            raise OptionError(f"a verification record is {value!r:.80}, expected a mapping of {', '.join(RECORD_KEYS)}")
        budget = parse_bytes(value.get("tail_budget", DEFAULT_TAIL_BUDGET))
        spec = cls(parse_rates(value.get("far", DEFAULT_FAR), "far (--far)", "FAR"), value.get("auc", False), budget,
                   value.get("hist_bits", DEFAULT_HIST_BITS), value.get("core"))
        if not isinstance(spec.auc, bool):
            raise OptionError(f"auc must be true or false, got {spec.auc!r}")
        check_range(budget, "tail_budget", "tail_budget (--tail-budget)")
        check_range(spec.hist_bits, "hist_bits", "hist_bits (--hist-bits)")
        if spec.core is None:
            if pair_bound is None:
                raise OptionError("a verification record without its tail length (core) needs the store")
            return replace(spec, core=spec.sized_core(pair_bound, n_trials))
        if not is_integer(spec.core) or spec.core < 0:
            raise OptionError(f"a verification record's core must be a non-negative integer, got {spec.core!r}")
        return spec

    def sized_core(self, pair_bound: int, n_trials: int) -> int:
        """L = k_max + 1 for N- = ``pair_bound`` (targets below 1; x = 1 accepts everything), or 0
        when the tail's buffer (``tail_bytes``) would not fit the budget."""
        below_one = [x for x in self.far if Fraction(x) < 1]
        if not below_one:
            return 0
        core = k_of(below_one[-1], pair_bound) + 1
        return core if self.tail_bytes(core, n_trials) <= self.tail_budget else 0

    @staticmethod
    def tail_bytes(core: int, n_trials: int) -> int:
        from .kernels import ENTRY_BYTES, capacity

        return n_trials * (capacity(core) + 1) * ENTRY_BYTES

    def to_record(self) -> dict:
        return {"far": list(self.far), "auc": self.auc, "tail_budget": self.tail_budget, "hist_bits": self.hist_bits,
                "core": self.core}

    def statistic(self, n_trials: int, precision: str):
        from .statistic import Verify

        return Verify(n_trials, self.hist_bits, self.core, self.auc, self.exact_bins(precision), self.windows)

    def exact_bins(self, precision: str) -> bool:
        """Whether the scoring pass bins negatives exactly: with float32 GEMMs the error window
        holds a bin edge for ~0.4% of the negatives (Market-like data, 16 bits), whose canonical
        distances would cost more than the rest of verification; the tail and the pilot's windows do
        not need it (GOM's thresholds do the same, ``kernels.bin_error_bound``); without them the
        selection starts from the histogram, which then places exact windows."""
        return precision == "float64" or not (self.core or self.windows)


def pair_bound(store, protocol) -> int:
    """An upper bound of N- known before any pass: queries x extended gallery rows, in either
    direction of the store."""
    q, g = len(store.query), len(store.gallery)
    both = protocol.gallery_includes_queries
    return max(q * (g + q * both), g * (q + g * both))


def request(options: dict, saved: dict | None = None) -> dict | None:
    """Take the verification keywords out of ``options``: the Spec record for ``Settings.parse``,
    or None when verification is not asked for.  None values are absent; ``saved``: the record of
    a saved state, which given keywords override (``update``)."""
    given = {key: options.pop(key) for key in VERIFY_OPTIONS if key in options}
    given = {key: value for key, value in given.items() if value is not None}
    enabled = given.pop("verification", False)
    if not isinstance(enabled, bool):
        raise OptionError(f"verification must be true or false, got {enabled!r}")
    if saved is None and not enabled:
        if given:
            raise OptionError(f"{', '.join(CLI_NAMES[key] for key in given)} only go with --verification "
                              "(verification=True)")
        return None
    return {**(saved or {}), **given}
