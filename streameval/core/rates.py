"""Rate targets (FAR, FPIR) as the decimals a user wrote, exactly: 0.29 is 29/100, not float64's
0.28999..., so k = floor(0.29 x 100) is 29 (docs/verification.md#definitions; docs/open-set.md#definitions).  No numpy: option parsing."""

from __future__ import annotations

import math
from fractions import Fraction

from .errors import OptionError


def items(value, name: str) -> list:
    """A comma-separated string, a single number or a sequence, as a list of its items."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    if isinstance(value, (int, float, Fraction)) or hasattr(value, "dtype"):
        return [value]
    try:
        return list(value)
    except TypeError:
        raise OptionError(f"{name} must be a comma-separated string or a list, got {value!r}") from None


def parse_rates(value, name: str, what: str) -> tuple[str, ...]:
    """Targets in [0, 1] as decimal strings (a float by its shortest repr), ascending and unique by
    value.  ``name``: the keyword and option, e.g. "far (--far)"; ``what``: "FAR"."""
    targets = {}
    for item in items(value, name):
        text = item.strip() if isinstance(item, str) else repr(item) if isinstance(item, float) else str(item)
        try:
            x = Fraction(text)
        except (ValueError, ZeroDivisionError):
            raise OptionError(f"{name} takes decimal {what} targets from 0 to 1, comma-separated, got {text!r}") \
                from None
        if not 0 <= x <= 1 or isinstance(item, bool):
            raise OptionError(f"{name} takes {what} targets from 0 to 1, got {text!r}")
        targets.setdefault(x, text)
    if not targets:
        raise OptionError(f"{name} needs at least one {what} target")
    return tuple(targets[x] for x in sorted(targets))


def k_of(target: str, n_neg: int) -> int:
    """k = floor(x N-) exactly, x (a rate) as written."""
    return math.floor(Fraction(target) * n_neg)
