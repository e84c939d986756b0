"""What a re-ranked run asks for (``Spec``): the flavour and its k1, k2, lambda, query expansion; once the run's kNN pass is done, the re-ranked distances (``distances``, the block
source) and what the result reports of them (``facts``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.choices import check_range
from ...core.errors import OptionError
from .flavours import FLAVOURS

RERANK_DEFAULTS = {"k1": 20, "k2": 6, "lambda": 0.3}
QE_DEFAULTS = {"k": 5, "alpha": 3.0, "times": 1}
FLAT = {"rerank_k1": "k1", "rerank_k2": "k2", "rerank_lambda": "lambda"}  # evaluate's / the CLI's flat keywords
QE_FLAT = {"qe_k": "k", "qe_alpha": "alpha", "qe_times": "times"}
REQUEST_KEYS = ("rerank", *FLAT, "qe", *QE_FLAT)


def request(options: dict) -> dict | None:
    """Take the re-ranking keywords out of ``options`` (evaluate's), for ``Spec.parse``."""
    return {key: options.pop(key) for key in REQUEST_KEYS if key in options} or None


@dataclass(frozen=True)
class Expansion:
    k: int
    alpha: float
    times: int


@dataclass(frozen=True)
class Spec:
    flavour: str | None  # None: query expansion alone
    k1: int
    k2: int
    lam: float
    qe: Expansion | None
    distances: object = field(default=None, compare=False, repr=False)  # the block source, once computed
    facts: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def parse(cls, request: dict | None, metric: str) -> "Spec | None":
        """The re-ranking keywords (``REQUEST_KEYS``, as ``request`` takes them out of evaluate's):
        ``rerank`` (a flavour name or a record {"flavour", "k1", "k2", "lambda"}), ``rerank_k1/_k2/_lambda``,
        ``qe`` ("aqe" or a record {"k", "alpha", "times"}), ``qe_k/_alpha/_times``;
        None when neither re-ranking nor query expansion is asked for."""
        request = {key: value for key, value in (request or {}).items() if value is not None}
        rerank, qe = _record(request.pop("rerank", None), "flavour"), _record(request.pop("qe", None), "kind")
        for record, flat, needs in ((rerank, FLAT, "--rerank (rerank=FLAVOUR)"), (qe, QE_FLAT, "--qe aqe")):
            stray = [_cli(key) for key in request if key in flat]
            if record is None and stray:
                raise OptionError(f"{', '.join(stray)} only go with {needs}")
        if rerank is None and qe is None:
            return None
        flavour = None
        values = dict(RERANK_DEFAULTS)
        if rerank is not None:
            flavour = rerank.pop("flavour", None)
            if flavour not in FLAVOURS:
                raise OptionError(f"rerank must be one of {', '.join(FLAVOURS)}, got {flavour!r}")
            values.update({key: rerank.pop(key) for key in list(rerank) if key in values})
            _no_more(rerank, "rerank")
            values.update({FLAT[key]: value for key, value in request.items() if key in FLAT})
            if metric not in ("cosine", "euclidean", "sqeuclidean"):
                raise OptionError(f"--rerank re-ranks feature distances (cosine, euclidean), not {metric!r}: a "
                                  "distance store's values are already final")
        expansion = None
        if qe is not None:
            if qe.pop("kind", "aqe") != "aqe":
                raise OptionError("qe must be 'aqe' (fast-reid's average query expansion)")
            picked = dict(QE_DEFAULTS)
            picked.update({key: qe.pop(key) for key in list(qe) if key in picked})
            _no_more(qe, "qe")
            picked.update({QE_FLAT[key]: value for key, value in request.items() if key in QE_FLAT})
            expansion = Expansion(check_range(picked["k"], "qe_k"), check_range(picked["alpha"], "qe_alpha"),
                                  check_range(picked["times"], "qe_times"))
        return cls(flavour, check_range(values["k1"], "rerank_k1"), check_range(values["k2"], "rerank_k2"),
                   check_range(values["lambda"], "rerank_lambda"), expansion)

    def to_record(self) -> dict:
        record = {}
        if self.flavour is not None:
            record["rerank"] = {"flavour": self.flavour, "k1": self.k1, "k2": self.k2, "lambda": self.lam}
        if self.qe is not None:
            record["qe"] = {"k": self.qe.k, "alpha": self.qe.alpha, "times": self.qe.times}
        return record

    def section(self) -> dict:
        """The result's ``rerank`` section: the options and what the run found (PROTOCOLS.md 6.1)."""
        options = {"flavour": self.flavour}
        if self.flavour is not None:
            options.update({"k1": self.k1, "k2": self.k2, "lambda": self.lam})
        if self.qe is not None:
            options["qe"] = {"k": self.qe.k, "alpha": self.qe.alpha, "times": self.qe.times}
        return {**options, **self.facts}


def _record(value, key: str) -> dict | None:
    if value is None or value is False:
        return None
    if isinstance(value, str):
        return {key: value}
    if isinstance(value, dict):
        return dict(value)
    raise OptionError(f"{'rerank' if key == 'flavour' else 'qe'} must be a name or a mapping, got {value!r}")


def _no_more(record: dict, what: str) -> None:
    if record:
        raise OptionError(f"{what} has unknown field(s) {', '.join(sorted(record))}")


def _cli(key: str) -> str:
    return "--" + key.replace("_", "-")
