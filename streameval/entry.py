"""The ``streameval`` console script: the first Ctrl-C or SIGTERM stops the command, later ones are
ignored (``signals``); one while the command line itself loads ends as one line too (the commands'
own errors are handled in ``cli``)."""

import atexit
import gc
import sys

from .core import signals


def main():
    # Python's last garbage collection at exit walks every object numba, dask and zarr made
    # (~0.25 s of a Market-sized run); frozen objects are skipped, and the process ends anyway.
    atexit.register(gc.freeze)
    signals.stop_on_first_signal()
    try:
        from .cli import main as command_line

        command_line()
    except KeyboardInterrupt as exc:  # before a command runs: nothing to clean up
        what, code = signals.stopped(exc)
        sys.stderr.write(f"error: {what}\n")
        sys.exit(code)
    finally:  # the command is over, its exit code set: a signal now would only interrupt the exit
        signals.ignore_signals()
