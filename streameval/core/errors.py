"""Errors a user can act on.

Every failure caused by the input (a malformed store, bad options) is raised as a
:class:`StreamevalError` subclass with a message that names the problem and the fix. The CLI turns
them into one line on stderr and a non-zero exit code, never a traceback.
"""


class StreamevalError(Exception):
    """Base class; ``exit_code`` is what the CLI exits with."""

    exit_code = 1


class StoreError(StreamevalError):
    """The feature store is missing, malformed or holds invalid data."""

    exit_code = 3


class OptionError(StreamevalError):
    """An evaluation option is invalid or does not fit the data."""

    exit_code = 2


class StoreWarning(UserWarning):
    """The store reads correctly but lacks a safeguard (the CLI prints it as one ``warning:`` line)."""


def one_line(exc: BaseException) -> str:
    """An exception as a short single line, for messages that wrap a library's error (zarr and
    codec messages can span lines)."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 300 else text[:297] + "..."
