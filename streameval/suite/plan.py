"""A suite's plan (docs/suites.md#settings-and-evaluations): which (query variant, gallery variant) evaluations, under
which protocol and options, from a preset (``cil-upstream``, ``cil-factorial``) or a .toml / .json
suite file; grouped by gallery variant for the run (4.5)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..core.choices import MAX_VARIANT_TRIALS, Bounds, check_range
from ..core.errors import OptionError

SETTINGS = ("clean", "query", "gallery", "both")  # the report's order; a suite file may name others
DEFAULT_TRIALS = 10
DEFAULT_HEADLINE = "both"
CLEAN = "clean"
FACTORIAL_NOTE = "factorial, not upstream-equivalent: the settings of one trial share their corrupted draws"
UPSTREAM_NOTE = "upstream-like: each trial's query, gallery and both settings use independent corrupted draws"
PRESETS = ("cil-upstream", "cil-factorial")
FILE_KEYS = ("plan", "protocol", "trials", "headline_setting", "std_ddof", "options", "evaluation")
EVALUATION_KEYS = ("name", "setting", "trial", "query", "gallery")
UPSTREAM_OPTIONS = {"protocol": "market", "max_rank": 50, "no_gom": True}  # upstream's metrics (4.2)


@dataclass(frozen=True)
class Evaluation:
    """One (query variant, gallery variant) pair of a setting and trial."""

    name: str
    setting: str
    trial: int | None
    query: str
    gallery: str

    def record(self) -> dict:
        return {"name": self.name, "setting": self.setting, "trial": self.trial, "query_variant": self.query,
                "gallery_variant": self.gallery}


@dataclass(frozen=True)
class Suite:
    plan: str  # the preset's name or the suite file's
    note: str | None
    trials: int
    headline_setting: str
    std_ddof: int
    options: dict  # evaluate's keywords: protocol and metric options (never execution ones)
    evaluations: tuple

    def groups(self) -> list[tuple[str, list[str]]]:
        """(gallery variant, its distinct query variants), in the order the plan first names them:
        one pass over each gallery variant scores all its query variants."""
        grouped: dict[str, list[str]] = {}
        for ev in self.evaluations:
            queries = grouped.setdefault(ev.gallery, [])
            if ev.query not in queries:
                queries.append(ev.query)
        return list(grouped.items())

    def record(self) -> dict:
        """What reproduces the suite (saved with a suite state)."""
        return {"plan": self.plan, "note": self.note, "trials": self.trials, "headline_setting": self.headline_setting,
                "std_ddof": self.std_ddof, "options": self.options,
                "evaluations": [ev.record() for ev in self.evaluations]}

    @classmethod
    def from_record(cls, record: dict) -> "Suite":
        evaluations = tuple(Evaluation(e["name"], e["setting"], e["trial"], e["query_variant"], e["gallery_variant"])
                            for e in record["evaluations"])
        return cls(record["plan"], record["note"], record["trials"], record["headline_setting"], record["std_ddof"],
                   dict(record["options"]), evaluations)


def preset_evaluations(plan: str, trials: int) -> list[Evaluation]:
    """The evaluations of a preset plan over ``trials`` trials: the one place the presets' variant
    names are decided (``preset_variants``, what ``synth --variants`` writes, derives from it)."""
    evaluations = [Evaluation(CLEAN, CLEAN, None, CLEAN, CLEAN)]
    for t in range(trials):
        if plan == "cil-factorial":
            q = g = f"corrupt-t{t}"
            pairs = {"query": (q, CLEAN), "gallery": (CLEAN, g), "both": (q, g)}
        else:
            pairs = {"query": (f"query-t{t}", CLEAN), "gallery": (CLEAN, f"gallery-t{t}"),
                     "both": (f"both-t{t}", f"both-t{t}")}
        evaluations += [Evaluation(f"{setting}-t{t}", setting, t, q, g) for setting, (q, g) in pairs.items()]
    return evaluations


def preset_variants(plan: str, trials: int) -> dict:
    """{set name: [(variant name, setting, trial), ...]}: the corrupted variants of each side a
    preset evaluates, in order; a variant more than one setting uses (``cil-factorial``'s) has the
    setting "factorial"."""
    if plan not in PRESETS:
        raise OptionError(f"no variant preset {plan!r}: choose {' or '.join(PRESETS)}")
    sides = {"query": {}, "gallery": {}}
    for ev in preset_evaluations(plan, trials):
        for side, name in (("query", ev.query), ("gallery", ev.gallery)):
            if name != CLEAN:
                setting, _ = sides[side].setdefault(name, (ev.setting, ev.trial))
                if setting != ev.setting:
                    sides[side][name] = ("factorial", ev.trial)
    return {side: [(name, setting, trial) for name, (setting, trial) in names.items()]
            for side, names in sides.items()}


def load_suite(spec: str, trials: int | None = None, headline_setting: str | None = None,
               std_ddof: int | None = None, **options) -> Suite:
    """A preset name or a suite file, with the command line's values over the file's.  ``options``:
    evaluate's keywords (protocol, metric, max_rank, ...), None meaning "as the plan says"."""
    given = {key: value for key, value in options.items() if value is not None}
    if spec in PRESETS:
        fields = {"plan": spec}
        name = spec
    elif Path(spec).suffix.lower() in (".toml", ".json"):
        from ..protocols.userfile import read_table_file

        fields = _check_fields(read_table_file(spec, "suite file"), spec)
        name = Path(spec).name
    else:
        raise OptionError(f"suite must be a preset ({', '.join(PRESETS)}) or a .toml / .json suite file, got {spec!r}")
    plan = fields.get("plan")
    if plan is not None and plan not in PRESETS:
        raise OptionError(f"suite '{spec}': plan must be one of {', '.join(PRESETS)}, got {plan!r}")
    trials = check_range(trials if trials is not None else fields.get("trials", DEFAULT_TRIALS), "variant_trials",
                         "trials")
    evaluations = preset_evaluations(plan, trials) if plan else []
    evaluations += [_evaluation(entry, i, spec) for i, entry in enumerate(fields.get("evaluation", []))]
    if not evaluations:
        raise OptionError(f"suite '{spec}' names no evaluation: give a plan ({', '.join(PRESETS)}) or [[evaluation]] "
                          "entries")
    headline = headline_setting or fields.get("headline_setting")
    _check_headline(headline, evaluations, spec)
    suite = Suite(
        name, {"cil-factorial": FACTORIAL_NOTE, "cil-upstream": UPSTREAM_NOTE}.get(plan),
        trials, headline or DEFAULT_HEADLINE,
        std_ddof if std_ddof is not None else fields.get("std_ddof", 1),
        {**UPSTREAM_OPTIONS, **_options(fields, spec), **given}, _distinct(evaluations, spec),
    )
    if suite.std_ddof not in (0, 1):
        raise OptionError(f"std_ddof must be 1 (sample standard deviation) or 0, got {suite.std_ddof!r}")
    return suite


def _check_headline(headline, evaluations: list, spec: str) -> None:
    """A headline setting that is asked for must be one the suite evaluates (the default, 'both',
    may be absent from a suite file's evaluations: the summary then says so)."""
    settings = list(dict.fromkeys(ev.setting for ev in evaluations))
    if headline is not None and headline not in settings:
        raise OptionError(f"headline_setting (--headline-setting) must be a setting suite '{spec}' evaluates: "
                          f"{', '.join(settings)}; got {headline!r}")


def _check_fields(fields, spec: str) -> dict:
    if not isinstance(fields, dict):
        raise OptionError(f"suite file '{spec}': the top level must be a table, got {fields!r}")
    unknown = sorted(set(fields) - set(FILE_KEYS))
    if unknown:
        raise OptionError(f"suite file '{spec}': unknown key {unknown[0]!r} (known: {', '.join(FILE_KEYS)})")
    if not isinstance(fields.get("evaluation", []), list):
        raise OptionError(f"suite file '{spec}': 'evaluation' must be a list of tables ([[evaluation]])")
    return fields


def _options(fields: dict, spec: str) -> dict:
    options = dict(fields.get("options", {}))
    if not isinstance(fields.get("options", {}), dict):
        raise OptionError(f"suite file '{spec}': 'options' must be a table of evaluation options")
    if "protocol" in fields:
        options["protocol"] = fields["protocol"]
    return options


def _evaluation(entry, i: int, spec: str) -> Evaluation:
    where = f"suite file '{spec}', evaluation {i + 1}"
    if not isinstance(entry, dict):
        raise OptionError(f"{where}: must be a table, got {entry!r}")
    unknown = sorted(set(entry) - set(EVALUATION_KEYS))
    if unknown:
        raise OptionError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(EVALUATION_KEYS)})")
    query, gallery = entry.get("query", CLEAN), entry.get("gallery", CLEAN)
    setting = entry.get("setting") or _setting_of(query, gallery)
    trial = entry.get("trial")
    if trial is not None:
        Bounds(0, MAX_VARIANT_TRIALS - 1).check(trial, f"{where}: trial")
    for key, value in (("query", query), ("gallery", gallery), ("setting", setting)):
        if not isinstance(value, str) or not value:
            raise OptionError(f"{where}: {key} must be a name, got {value!r}")
    name = entry.get("name") or (setting if trial is None else f"{setting}-t{trial}")
    return Evaluation(str(name), setting, trial, query, gallery)


def _setting_of(query: str, gallery: str) -> str:
    """The setting a pair belongs to when the file does not say: which sides are not clean."""
    return {(True, True): "clean", (False, True): "query", (True, False): "gallery"}.get(
        (query == CLEAN, gallery == CLEAN), "both")


def _distinct(evaluations: list, spec: str) -> tuple:
    """Each evaluation once: the same (setting, trial, pair) listed twice runs once; one name for
    two different evaluations is an error (results are keyed by it)."""
    by_name: dict[str, Evaluation] = {}
    for ev in evaluations:
        earlier = by_name.get(ev.name)
        if earlier is not None and replace(earlier, name=ev.name) != ev:
            raise OptionError(f"suite '{spec}': two evaluations are named {ev.name!r}; name them apart (name = ...)")
        by_name.setdefault(ev.name, ev)
    return tuple(by_name.values())
