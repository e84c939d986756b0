"""The identity-dedup CMC (docs/protocols.md#cmc-flavours: SYSU-MM01's): on with the protocol's
``cmc``, each query's first distinct identities per trial, up to max_rank, ride the scoring pass."""

from __future__ import annotations

from ..feature import Feature


class Dedup(Feature):
    name, setting = "dedup", False

    def statistics(self, settings, meta, dim: int) -> tuple:
        if settings.protocol.cmc != "identity-dedup":
            return ()
        from .statistic import Dedup as DedupStatistic

        return (DedupStatistic(settings.n_trials, settings.max_rank),)

    def state_key(self, settings) -> dict:  # its state is max_rank long
        return {"max_rank": settings.max_rank} if settings.protocol.cmc == "identity-dedup" else {}
