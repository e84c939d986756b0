"""How the ``streameval`` command stops when asked to: the first Ctrl-C (SIGINT) or SIGTERM (``kill``,
a batch system ending the job) raises in the main thread, so the run cleans up as it unwinds
(temporary stores removed, a state's unfinished version left unused, a live bar's line ended) and
ends in one line; any later one is ignored, so that a second Ctrl-C cannot cut the clean-up short
(it would leave a temporary store behind, or a traceback from the interpreter's exit).

A signal that arrives while Python runs a finaliser (``__del__``: a store's reader lock released by
the garbage collector) raises there, where the interpreter swallows the exception; so each signal is
also recorded, and the command checks the record when it returns (``raise_if_stopped``): a swallowed
Ctrl-C still ends the run as stopped, silently rather than as an "Exception ignored" traceback.

Only the console script installs these handlers (``entry``): a program calling the API keeps its own.
"""

from __future__ import annotations

import signal
import sys

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # the shells' convention: 128 + the signal number


class Terminated(KeyboardInterrupt):
    """SIGTERM: a KeyboardInterrupt, so that whatever cleans up after a Ctrl-C cleans up after it too."""


_received: list[int] = []  # the signal that stopped this process, once one did


def stop_on_first_signal() -> None:
    """The first SIGINT raises KeyboardInterrupt, the first SIGTERM Terminated; later ones are ignored."""
    sys.unraisablehook = _quiet_when_stopped
    for number in EXIT_CODES:
        signal.signal(number, _stop)


def raise_if_stopped() -> None:
    """Raise the stop again if a signal came and its exception was swallowed (raised in a finaliser)."""
    if _received:
        raise _exception(_received[0])


def ignore_signals() -> None:
    """From now on SIGINT and SIGTERM do nothing, until the process is gone (SIG_IGN: the interpreter's
    exit resets handlers written in Python to the default, which would kill it)."""
    for number in EXIT_CODES:
        signal.signal(number, signal.SIG_IGN)


def stopped(exc: KeyboardInterrupt) -> tuple[str, int]:
    """What stopped the run, in words, and the exit code that says so."""
    if isinstance(exc, Terminated):
        return "terminated (SIGTERM)", EXIT_CODES[signal.SIGTERM]
    return "interrupted (Ctrl-C)", EXIT_CODES[signal.SIGINT]


def _exception(number: int) -> KeyboardInterrupt:
    return Terminated() if number == signal.SIGTERM else KeyboardInterrupt()


def _stop(number, frame):
    ignore_signals()
    _received.append(number)
    raise _exception(number)


def _quiet_when_stopped(unraisable) -> None:
    """A stop swallowed by a finaliser says nothing there (``raise_if_stopped`` reports it); anything
    else is printed as Python prints it."""
    if not (_received and isinstance(unraisable.exc_value, KeyboardInterrupt)):
        sys.__unraisablehook__(unraisable)
