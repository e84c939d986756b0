"""What two evaluations of one problem must agree on, however they ran."""

from __future__ import annotations


def comparable(result) -> dict:
    """Every number of ``result``, per query too, without how the run went (times, chunk plan,
    scheduler, device): the run's facts, and each direction's (regdb)."""
    out = result.to_dict(per_query=True)
    out.pop("run")
    for direction in (out.get("directions") or {}).values():
        direction.pop("run")
    return out
