"""The sgs CMC (CUHK03's single-gallery-shot, docs/protocols.md#cuhk03-sgs): on with the protocol's
``sgs`` mode, its sampled repeats and / or its exact expectation over every draw."""

from __future__ import annotations

from ..feature import Feature


class Sgs(Feature):
    name, setting = "sgs", False

    def statistics(self, settings, meta, dim: int) -> tuple:
        sgs = settings.protocol.sgs
        if sgs is None:
            return ()
        from .statistic import SgsExpected, SgsSampled

        return ((SgsSampled(sgs.repeats, sgs.seed),) if sgs.mode in ("sampled", "both") else ()) + \
            ((SgsExpected(meta.identities.pids.shape[0]),) if sgs.mode in ("expected", "both") else ())
