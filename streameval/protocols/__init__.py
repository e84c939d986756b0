"""Protocols as data (docs/protocols.md): ``resolve`` turns a preset name, a protocol file or a
Protocol, plus the command line's overrides, into the one validated record an evaluation uses.

Importable without numpy (``streameval protocols`` answers at once).
"""

from __future__ import annotations

import os
from dataclasses import replace

from ..core.choices import check_range
from ..core.errors import OptionError
from .presets import ALIASES, PRESETS, preset, presets_table
from .record import (CAMERA_RULE_RELATIONS, CAMERA_RULES, CMC_FLAVOURS, DIRECTIONS, DRAW_VERSION,
                     CameraRelation, Protocol, SgsSpec, TrialSpec, _choice, _integer, split_trial_source)
from .userfile import is_protocol_file, load

__all__ = ["resolve", "presets_table", "Protocol", "CameraRelation", "TrialSpec", "SgsSpec", "PRESETS", "ALIASES",
           "DRAW_VERSION"]


def resolve(spec, *, junk_pids=None, denominator=None, cmc=None, trials=None, trial_source=None, shots=None,
            seed=None, sgs_mode=None, sgs_repeats=None, camera_rule=None, direction=None) -> Protocol:
    """The protocol ``spec`` names, with the overrides applied (None keeps the spec's value).

    ``spec``: a preset name or alias, a .toml / .json protocol file, or a Protocol (checked again).
    Overrides (docs/protocols.md#4-changing-a-field-from-the-command-line, the CLI options with underscores):

    * ``junk_pids`` (ints), ``denominator``;
    * ``cmc``: first-hit or identity-dedup; the sgs CMC is neither switched on nor off here (it
      comes with its repeats and camera rule: protocol ``cuhk03-sgs`` or a file's [sgs] table);
    * ``trials``: 0 removes the trials, T >= 1 sets their count (on a protocol without trials it
      adds seeded draws: one row per (pid, camera), seed 0); ``trial_source`` (draw,
      official:PATH, mangye16-random), ``shots``;
    * ``seed``: of the trial draws and of the sgs draws, whichever the protocol has;
    * ``sgs_mode``, ``sgs_repeats``, ``camera_rule`` (also sets x_same / x_any): sgs protocols only;
    * ``direction``: both, v2t or t2v: protocols with directions (regdb) only.

    An override the protocol has no use for is an OptionError naming it, as is any bad value.
    """
    protocol = _named(spec)
    changes = {"trials": _trials(protocol, trials, trial_source, shots, seed)}
    changes.update(_sgs(protocol, sgs_mode, sgs_repeats, camera_rule, seed))
    changes.update(_given(junk_pids=junk_pids, denominator=denominator))
    if cmc is not None:
        changes["cmc"] = _cmc(protocol, cmc)
    if direction is not None:
        changes["directions"] = _directions(protocol, direction)
    resolved = replace(protocol, **changes)
    if seed is not None and not resolved.uses_seeded_draws:
        raise OptionError(f"seed does not apply: protocol '{resolved.name}' draws nothing with a seed "
                          "(no trials with source draw, no sampled sgs CMC)")
    _check_trial_table(resolved)
    return resolved


def _named(spec) -> Protocol:
    if isinstance(spec, Protocol):
        return replace(spec)  # made again, so checked again
    found = preset(spec) if isinstance(spec, str) else None
    if found is not None:
        return found
    if isinstance(spec, (str, os.PathLike)) and is_protocol_file(spec):
        return load(spec)
    names = ", ".join(f"{name} ({', '.join(p.aliases)})" if p.aliases else name for name, p in PRESETS.items())
    raise OptionError(f"protocol must be a preset ({names}) or a .toml / .json protocol file, got {spec!r}")


def _trials(protocol: Protocol, trials, trial_source, shots, seed) -> TrialSpec | None:
    spec = protocol.trials
    if trials is not None:
        count = check_range(_integer(trials, "trials"), "trials")
        spec = None if count == 0 else TrialSpec(count=count) if spec is None else replace(spec, count=count)
    if spec is None:
        _refuse_unused(f"there are no trials (protocol '{protocol.name}' has none or trials = 0); "
                       "add them with trials = T", trial_source=trial_source, shots=shots)
        return None
    if trial_source is not None:
        source, path = split_trial_source(trial_source, "trial_source")
        spec = replace(spec, source=source, path=path and os.path.abspath(path))
    return replace(spec, **_given(shots=shots, seed=seed))


def _sgs(protocol: Protocol, sgs_mode, sgs_repeats, camera_rule, seed) -> dict:
    sgs = protocol.sgs
    if sgs is None:
        _refuse_unused(f"protocol '{protocol.name}' has no sgs CMC (cuhk03-sgs has)", sgs_mode=sgs_mode,
                       sgs_repeats=sgs_repeats, camera_rule=camera_rule)
        return {}
    changes = {}
    if camera_rule is not None:
        rule = _choice(camera_rule, "camera_rule", CAMERA_RULES)
        sgs = replace(sgs, camera_rule=rule)
        changes["x_same"], changes["x_any"] = CAMERA_RULE_RELATIONS[rule]
    return {**changes, "sgs": replace(sgs, **_given(mode=sgs_mode, repeats=sgs_repeats, seed=seed))}


def _cmc(protocol: Protocol, cmc) -> str:
    if "sgs" in (cmc, protocol.cmc) and cmc != protocol.cmc:
        raise OptionError(f"cmc {cmc!r}: the sgs CMC comes with its repeats and camera rule, so it is not switched "
                          f"by cmc (protocol '{protocol.name}' has cmc {protocol.cmc!r}); use protocol cuhk03-sgs, "
                          "or a file with an [sgs] table (sgs results report the first-hit curve too)")
    return _choice(cmc, "cmc", CMC_FLAVOURS)


def _directions(protocol: Protocol, direction) -> tuple:
    if not protocol.directions:
        raise OptionError(f"direction does not apply: protocol '{protocol.name}' has no directions (regdb has)")
    chosen = _choice(direction, "direction", ("both", *DIRECTIONS))
    return DIRECTIONS if chosen == "both" else (chosen,)


def _given(**overrides) -> dict:
    """The overrides given (not None)."""
    return {name: value for name, value in overrides.items() if value is not None}


def _refuse_unused(why: str, **overrides) -> None:
    for name in _given(**overrides):
        raise OptionError(f"{name} does not apply: {why}")


def _check_trial_table(protocol: Protocol) -> None:
    trials = protocol.trials
    if trials is not None and trials.source == "official" and not os.path.isfile(trials.path):
        raise OptionError(f"trials.path: the official trial table '{trials.path}' is not a file")
