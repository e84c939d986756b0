"""User-defined protocols (docs/protocols.md#3-your-own-protocol-file): a .toml or .json file with the fields of a
protocol record.  Missing fields take ``market``'s values, a missing name the file's stem; a relative
``official`` trial table is found beside the file.  Every problem is one OptionError naming the file
and the key (or the parser's line)."""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import replace
from pathlib import Path

from ..core.errors import OptionError
from .record import Protocol

SUFFIXES = (".toml", ".json")


def is_protocol_file(spec) -> bool:
    return Path(spec).suffix.lower() in SUFFIXES


def load(path) -> Protocol:
    path = Path(path)
    fields = read_table_file(path)
    if not isinstance(fields, dict):
        raise OptionError(f"protocol file '{path}': the top level must be a table of fields, got {fields!r}")
    try:
        protocol = Protocol.from_record({"name": path.stem, **fields})
    except OptionError as exc:
        raise OptionError(f"protocol file '{path}': {exc}") from None
    return _table_beside(protocol, path)


def read_table_file(path, what: str = "protocol file"):
    """The parsed content of a .toml or .json file (protocols, suites); every problem one
    OptionError naming ``what`` and the file."""
    path = Path(path)
    if not is_protocol_file(path):
        raise OptionError(f"{what} '{path}' must end in {' or '.join(SUFFIXES)}")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise OptionError(f"{what} '{path}' does not exist") from None
    except OSError as exc:
        raise OptionError(f"cannot read {what} '{path}': {exc.strerror or exc}") from None
    try:
        if path.suffix.lower() == ".toml":
            return tomllib.loads(data.decode("utf-8"))  # its messages end "(at line L, column C)"
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise OptionError(f"{what} '{path}': {exc.msg} (at line {exc.lineno}, column {exc.colno})") from None
    except UnicodeDecodeError:
        raise OptionError(f"{what} '{path}' is not UTF-8 text") from None
    except (ValueError, RecursionError) as exc:  # tomllib.TOMLDecodeError is a ValueError; absurd nesting
        raise OptionError(f"{what} '{path}': {exc}") from None


def _table_beside(protocol: Protocol, path: Path) -> Protocol:
    """The official trial table a protocol file names is in the file's folder or below it, wherever
    streameval runs: a shared protocol file cannot make streameval read other files (an absolute
    path or one that climbs out with '..' is refused)."""
    trials = protocol.trials
    if trials is None or trials.path is None:
        return protocol
    folder = os.path.abspath(path.parent)
    table = os.path.normpath(os.path.join(folder, trials.path))
    if os.path.isabs(trials.path) or os.path.commonpath([folder, table]) != folder:
        raise OptionError(f"protocol file '{path}': trials.path '{trials.path}' is outside the protocol file's folder; "
                          "name the official trial table relative to the file, in its folder or below it")
    return replace(protocol, trials=replace(trials, path=table))
