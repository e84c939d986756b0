"""A protocol as data (docs/protocols.md#1-the-fields): which gallery rows a query is scored against, the
CMC flavour, the denominator policy and the trials.  Presets (``presets.py``) and user files
(``userfile.py``) are records of this type; the engine reads only these fields.

A ``Protocol`` is checked and put in canonical form when it is made (``__post_init__``, the one
place that validates): a Protocol that exists is valid.  Its parts (``CameraRelation``,
``TrialSpec``, ``SgsSpec``) are checked as parts of it, with errors naming the field
(``trials.count``, ``x_any``).  Fields also accept their record forms ("equal", [[3, 2]], a dict
for ``trials`` / ``sgs``), so ``from_record`` and a user file need no parser of their own.

Importable without numpy: ``streameval protocols`` and ``--help`` stay instant.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields

from ..core.choices import INT64_MAX, INT64_MIN, MAX_SGS_REPEATS, MAX_TRIALS, Bounds
from ..core.errors import OptionError

CMC_FLAVOURS = ("first-hit", "identity-dedup", "sgs")
REFERENCE_APS = ("rectangle", "trapezoid")
DENOMINATORS = ("skip", "zero")
TRIAL_SOURCES = ("draw", "official", "mangye16-random")
TRIAL_GROUPS = ("pid", "pid-camera")
TRIAL_QUERIES = ("all", "not-in-gallery")
SGS_MODES = ("sampled", "expected", "both")
CAMERA_RULES = ("same-id-same-cam", "separate-cameras")
DIRECTIONS = ("v2t", "t2v")
DRAW_VERSION = 1  # of the seeded draws (docs/protocols.md#the-seeded-hash): bump when the hash or a draw rule changes
OFFICIAL_PREFIX = "official:"  # trial source "official:PATH" (CLI and user files)


@dataclass(frozen=True)
class CameraRelation:
    """Ordered (query camera, gallery camera) pairs: none, every pair with equal cameras, or a list."""

    equal: bool = False
    pairs: tuple = ()  # tuple[tuple[int, int], ...], sorted, no duplicates; empty when ``equal``


@dataclass(frozen=True)
class TrialSpec:
    """Gallery (and query) masks over one superset gallery (docs/protocols.md)."""

    count: int  # T, 1..MAX_TRIALS
    source: str = "draw"  # TRIAL_SOURCES
    path: str | None = None  # the table of source "official"
    group: str = "pid-camera"  # TRIAL_GROUPS: draw groups
    shots: int = 1  # rows per group per trial
    seed: int = 0
    queries: str = "all"  # TRIAL_QUERIES: "not-in-gallery" (VehicleID) needs gallery_includes_queries
    cameras: tuple = ()  # mangye16-random: gallery cameras walked in this order per pid (SYSU: 1, 2, 4, 5)


@dataclass(frozen=True)
class SgsSpec:
    """Single-gallery-shot CMC (docs/protocols.md#cuhk03-sgs); the camera rule is also reflected in x_same / x_any."""

    mode: str = "sampled"  # SGS_MODES
    repeats: int = 10
    seed: int = 0
    camera_rule: str = "same-id-same-cam"  # CAMERA_RULES


# (x_same, x_any) of each sgs camera rule: torchreid's and open-reid's (docs/protocols.md#cuhk03-sgs)
CAMERA_RULE_RELATIONS = {
    "same-id-same-cam": (CameraRelation(equal=True), CameraRelation()),
    "separate-cameras": (CameraRelation(), CameraRelation(equal=True)),
}


@dataclass(frozen=True)
class Protocol:
    name: str
    junk_pids: tuple = (-1,)  # sorted ints
    x_same: CameraRelation = CameraRelation(equal=True)
    x_any: CameraRelation = CameraRelation()
    gallery_includes_queries: bool = False
    cmc: str = "first-hit"
    sgs: SgsSpec | None = None  # set exactly when cmc == "sgs"
    reference_ap: str = "rectangle"
    denominator: str = "skip"
    trials: TrialSpec | None = None
    query_cameras: tuple | None = None  # queries from these cameras only (None: all)
    gallery_cameras: tuple | None = None  # gallery rows from these cameras only (None: all)
    directions: tuple = ()  # RegDB: the directions to run, e.g. ("v2t", "t2v"); () = the store as it is

    def __post_init__(self):
        for name, value in _canonical_fields(self).items():
            object.__setattr__(self, name, value)  # frozen: the canonical form is set once, here
        _check_combinations(self)

    @property
    def uses_seeded_draws(self) -> bool:
        """True when the seeded hash of docs/protocols.md#the-seeded-hash picks rows: trials drawn with source "draw",
        or a sampled sgs CMC.  Only then does the result depend on ``DRAW_VERSION``."""
        drawn_trials = self.trials is not None and self.trials.source == "draw"
        sampled_sgs = self.sgs is not None and self.sgs.mode in ("sampled", "both")
        return drawn_trials or sampled_sgs

    @property
    def camera_fields(self) -> tuple:
        """The fields that read camera ids: a store without them (every row camera 0) would be
        evaluated wrongly under any of these, so it is refused."""
        trials = self.trials
        uses = {
            "x_same": self.x_same.equal or bool(self.x_same.pairs),
            "x_any": self.x_any.equal or bool(self.x_any.pairs),
            "query_cameras": self.query_cameras is not None,
            "gallery_cameras": self.gallery_cameras is not None,
            "trials": trials is not None and (trials.group == "pid-camera" or bool(trials.cameras)
                                              or trials.source == "official"),
        }
        return tuple(name for name, used in uses.items() if used)

    def to_record(self) -> dict:
        """Every field, JSON-ready, in field order, plus ``draw_version``: DRAW_VERSION when the
        protocol uses seeded draws (``uses_seeded_draws``), else None."""
        record = {field.name: _jsonable(getattr(self, field.name)) for field in fields(self)}
        record["draw_version"] = DRAW_VERSION if self.uses_seeded_draws else None
        return record

    @classmethod
    def from_record(cls, record: Mapping) -> "Protocol":
        """The inverse of ``to_record``.  Missing fields take their defaults (``market``'s values),
        except ``name``; unknown keys, and a ``draw_version`` other than this streameval's, are
        refused, naming the key."""
        if not isinstance(record, Mapping):
            raise OptionError(f"a protocol must be a table of fields, got {record!r}")
        names = [field.name for field in fields(cls)]
        _refuse_unknown(record, [*names, "draw_version"], "")
        if "name" not in record:
            raise OptionError("name is required: the protocol's name, recorded with every result")
        protocol = cls(**{key: value for key, value in record.items() if key in names})
        if "draw_version" in record:
            _check_draw_version(record["draw_version"], protocol.to_record()["draw_version"])
        return protocol


def split_trial_source(text, field: str = "trials.source") -> tuple[str, str | None]:
    """``draw``, ``mangye16-random`` or ``official:PATH`` as (source, path)."""
    if isinstance(text, str) and text.startswith(OFFICIAL_PREFIX):
        path = text[len(OFFICIAL_PREFIX):]
        if not path:
            raise OptionError(f"{field} official:PATH needs the path of the trial table, got {text!r}")
        return "official", path
    if text in ("draw", "mangye16-random"):
        return text, None
    raise OptionError(f"{field} must be draw, official:PATH or mangye16-random, got {text!r}")


# --- canonical form and checks, field by field -----------------------------------------------------


def _canonical_fields(protocol: Protocol) -> dict:
    return {
        "name": _name(protocol.name),
        "junk_pids": tuple(sorted(set(_codes(protocol.junk_pids, "junk_pids")))),
        "x_same": _relation(protocol.x_same, "x_same"),
        "x_any": _relation(protocol.x_any, "x_any"),
        "gallery_includes_queries": _flag(protocol.gallery_includes_queries, "gallery_includes_queries"),
        "cmc": _choice(protocol.cmc, "cmc", CMC_FLAVOURS),
        "sgs": None if protocol.sgs is None else _sgs(_part(protocol.sgs, SgsSpec, "sgs")),
        "reference_ap": _choice(protocol.reference_ap, "reference_ap", REFERENCE_APS),
        "denominator": _choice(protocol.denominator, "denominator", DENOMINATORS),
        "trials": None if protocol.trials is None else _trials(_part(protocol.trials, TrialSpec, "trials")),
        "query_cameras": _camera_set(protocol.query_cameras, "query_cameras"),
        "gallery_cameras": _camera_set(protocol.gallery_cameras, "gallery_cameras"),
        "directions": _directions(protocol.directions),
    }


def _check_combinations(protocol: Protocol) -> None:
    """Fields that contradict each other (docs/protocols.md#3-your-own-protocol-file): refused, naming the field."""
    sgs, trials = protocol.sgs, protocol.trials
    if protocol.cmc == "sgs" and sgs is None:
        raise OptionError("sgs: cmc 'sgs' needs an sgs table (mode, repeats, seed, camera_rule)")
    if sgs is not None and protocol.cmc != "sgs":
        raise OptionError(f"sgs: an sgs table needs cmc = 'sgs', got cmc {protocol.cmc!r}")
    if sgs is not None and trials is not None:
        raise OptionError("trials: not combined with cmc 'sgs', whose repeats play the trials' role (sgs.repeats)")
    if sgs is not None and (protocol.x_same, protocol.x_any) != CAMERA_RULE_RELATIONS[sgs.camera_rule]:
        x_same, x_any = (_jsonable(r) for r in CAMERA_RULE_RELATIONS[sgs.camera_rule])
        raise OptionError(f"sgs.camera_rule {sgs.camera_rule!r} means x_same {x_same!r} and x_any {x_any!r}, "
                          f"got x_same {_jsonable(protocol.x_same)!r} and x_any {_jsonable(protocol.x_any)!r}")
    if trials is None:
        return
    if trials.queries == "not-in-gallery" and not protocol.gallery_includes_queries:
        raise OptionError("trials.queries 'not-in-gallery' needs gallery_includes_queries = true "
                          "(a query takes part in a trial when its own gallery copy is not drawn)")
    gallery = protocol.gallery_cameras
    outside = [c for c in trials.cameras if gallery is not None and c not in gallery]
    if outside:
        raise OptionError(f"trials.cameras: camera {outside[0]} is not among gallery_cameras {list(gallery)}")


def _trials(spec: TrialSpec) -> TrialSpec:
    source, path = spec.source, spec.path
    if isinstance(source, str) and source.startswith(OFFICIAL_PREFIX):  # the "official:PATH" shorthand
        if path is not None:
            raise OptionError("trials.source official:PATH and trials.path both name the table; give one")
        source, path = split_trial_source(source)
    source = _choice(source, "trials.source", TRIAL_SOURCES)
    if source == "official" and not (isinstance(path, str) and path):
        raise OptionError(f"trials.path: source 'official' needs the path of the trial table, got {path!r}")
    if source != "official" and path is not None:
        raise OptionError(f"trials.path names an official trial table, but trials.source is {source!r}")
    trials = TrialSpec(
        count=_bounded(spec.count, "trials.count", 1, MAX_TRIALS, " (trial masks are bits of one 64-bit word)"),
        source=source, path=path,
        group=_choice(spec.group, "trials.group", TRIAL_GROUPS),
        shots=_bounded(spec.shots, "trials.shots", 1, INT64_MAX),
        seed=_bounded(spec.seed, "trials.seed", INT64_MIN, INT64_MAX),
        queries=_choice(spec.queries, "trials.queries", TRIAL_QUERIES),
        cameras=_codes(spec.cameras, "trials.cameras"),
    )
    if len(set(trials.cameras)) != len(trials.cameras):
        raise OptionError(f"trials.cameras lists a camera twice: {list(trials.cameras)}")
    if source == "mangye16-random" and trials.shots != 1:
        raise OptionError(f"trials.shots must be 1 with source 'mangye16-random' (single-shot only, as upstream), "
                          f"got {trials.shots}")
    if source == "mangye16-random" and not trials.cameras:
        raise OptionError("trials.cameras: source 'mangye16-random' walks the gallery cameras in a given order "
                          "(SYSU-MM01: [1, 2, 4, 5]); name them")
    return trials


def _sgs(spec: SgsSpec) -> SgsSpec:
    return SgsSpec(
        mode=_choice(spec.mode, "sgs.mode", SGS_MODES),
        repeats=_bounded(spec.repeats, "sgs.repeats", 1, MAX_SGS_REPEATS),
        seed=_bounded(spec.seed, "sgs.seed", INT64_MIN, INT64_MAX),
        camera_rule=_choice(spec.camera_rule, "sgs.camera_rule", CAMERA_RULES),
    )


def _part(value, kind: type, field: str):
    """``value`` as a ``kind`` (TrialSpec, SgsSpec); a mapping is read as its fields."""
    if isinstance(value, kind):
        return value
    if not isinstance(value, Mapping):
        raise OptionError(f"{field} must be a table of {', '.join(f.name for f in fields(kind))}, got {value!r}")
    _refuse_unknown(value, [f.name for f in fields(kind)], f"{field}.")
    missing = [f.name for f in fields(kind) if f.default is MISSING and f.name not in value]
    if missing:
        raise OptionError(f"{field}.{missing[0]} is required")
    return kind(**value)


def _refuse_unknown(table: Mapping, names: list[str], prefix: str) -> None:
    unknown = [key for key in table if key not in names]
    if unknown:
        raise OptionError(f"unknown field {prefix}{unknown[0]} (fields: {', '.join(names)})")


def _relation(value, field: str) -> CameraRelation:
    """A CameraRelation from itself or its record form: "none", "equal" or [[query cam, gallery cam], ...]."""
    if isinstance(value, CameraRelation):
        equal, pairs = value.equal, value.pairs
    elif isinstance(value, str) and value in ("none", "equal"):
        equal, pairs = value == "equal", ()
    elif isinstance(value, (str, bytes, Mapping)) or not _is_iterable(value):
        raise OptionError(f"{field} must be 'none', 'equal' or a list of [query camera, gallery camera] pairs, "
                          f"got {value!r}")
    else:
        equal, pairs = False, value
    if not isinstance(equal, bool):
        raise OptionError(f"{field}: equal must be true or false, got {equal!r}")
    pairs = tuple(sorted({_pair(pair, field) for pair in _sequence(pairs, field)}))
    if equal and pairs:
        raise OptionError(f"{field}: 'equal' already holds every equal-camera pair; give 'equal' or pairs, not both")
    return CameraRelation(equal=equal, pairs=pairs)


def _pair(value, field: str) -> tuple[int, int]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:  # ordered: (3, 2) is not (2, 3)
        raise OptionError(f"{field}: each pair is [query camera, gallery camera], got {value!r}")
    return _code(value[0], field), _code(value[1], field)


def _camera_set(value, field: str) -> tuple | None:
    if value is None:
        return None
    cameras = tuple(sorted(set(_codes(value, field))))
    if not cameras:
        raise OptionError(f"{field} names no camera; leave it out to take every camera")
    return cameras


def _directions(value) -> tuple:
    chosen = {_choice(d, "directions", DIRECTIONS) for d in _sequence(value, "directions")}
    return tuple(d for d in DIRECTIONS if d in chosen)


def _codes(values, field: str) -> tuple:
    """pids or camera codes: 64-bit signed integers, the minimum excepted (it marks missing ids in a store)."""
    return tuple(_code(value, field) for value in _sequence(values, field))


def _code(value, field: str) -> int:
    return _bounded(value, field, INT64_MIN + 1, INT64_MAX, f" (64-bit signed; {INT64_MIN} is reserved)")


def _bounded(value, field: str, low: int, high: int, why: str = "") -> int:
    return Bounds(low, high, why).check(_integer(value, field), field)


def _integer(value, field: str) -> int:
    """A Python int; bools and floats are refused (a JSON 10.0 or true is not a count)."""
    if isinstance(value, bool):
        raise OptionError(f"{field} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise OptionError(f"{field} must be an integer, got {value!r}") from None


def _choice(value, field: str, vocabulary: tuple) -> str:
    if not isinstance(value, str) or value not in vocabulary:
        raise OptionError(f"{field} must be one of {', '.join(vocabulary)}, got {value!r}")
    return value


def _flag(value, field: str) -> bool:
    if not isinstance(value, bool):
        raise OptionError(f"{field} must be true or false, got {value!r}")
    return value


def _name(value) -> str:
    if not isinstance(value, str) or not value.strip() or not value.isprintable():
        raise OptionError(f"name must be a non-empty single-line string, got {value!r}")
    return value


def _sequence(value, field: str) -> list:
    if isinstance(value, (str, bytes, Mapping)) or not _is_iterable(value):
        raise OptionError(f"{field} must be a list, got {value!r}")
    return list(value)


def _is_iterable(value) -> bool:
    try:
        iter(value)
    except TypeError:
        return False
    return True


def _jsonable(value):
    """A field value in its record form: relations as "none" | "equal" | pairs, parts as dicts, lists."""
    if isinstance(value, CameraRelation):
        return "equal" if value.equal else [list(pair) for pair in value.pairs] or "none"
    if isinstance(value, (TrialSpec, SgsSpec)):
        return {field.name: _jsonable(getattr(value, field.name)) for field in fields(value)}
    if isinstance(value, tuple):
        return [_jsonable(item) for item in value]
    return value


def _check_draw_version(recorded, current) -> None:
    if isinstance(recorded, bool) or recorded != current:
        raise OptionError(f"draw_version {recorded!r} is not this streameval's ({current!r} for this protocol): "
                          "its seeded draws would pick other rows")
