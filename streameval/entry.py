"""The ``streameval`` console script: Ctrl-C while the command line itself loads ends as one line
too (the commands' own errors are handled in ``cli``)."""

import atexit
import gc
import sys


def main():
    # Python's last garbage collection at exit walks every object numba, dask and zarr made
    # (~0.25 s of a Market-sized run); frozen objects are skipped, and the process ends anyway.
    atexit.register(gc.freeze)
    try:
        from .cli import main as command_line
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted (Ctrl-C)\n")
        sys.exit(130)
    command_line()
