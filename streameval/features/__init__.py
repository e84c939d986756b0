"""The features a run adds to the closed-set metrics, each a :class:`Feature` in ``REGISTRY``:
``Settings`` (parse, statistics, options, state key), ``make_result``, the summary and the CLI's
option groups loop over it, so a new metric is a module here and a line in ``REGISTRY``.

Light on purpose: the CLI builds its options from these at startup (``--help`` stays instant), so
each feature imports its implementation inside its methods.
"""

from __future__ import annotations

from .dedup import Dedup
from .gom import Gom
from .open_set import OpenSet
from .ranked import Ranked
from .rerank import Rerank
from .sgs import Sgs
from .verification import Verification

OPEN_SET, VERIFICATION = OpenSet(), Verification()
# the order of the scoring pass's statistics, the summary's sections, the options and the saved state's key
REGISTRY = (Gom(), Dedup(), Sgs(), Ranked(), OPEN_SET, VERIFICATION, Rerank())
TARGETED = (VERIFICATION, OPEN_SET)  # those with values at targets (``Feature.target``), in their columns' order
