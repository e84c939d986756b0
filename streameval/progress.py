"""Progress a person can follow: a live bar on a terminal, a line per 10% in logs, nothing if quiet.

``track(scheduler_kind)`` gives a context manager hooked into Dask's threaded scheduler (a local
callback) or, with a distributed Client, into the scheduler's progress feed.
"""

from __future__ import annotations

import sys
import time

from dask.callbacks import Callback

BAR_WIDTH = 30
LOG_STEP = 10  # percent between lines in non-interactive output


class Reporter:
    """Draws task completion on ``stream``."""

    def __init__(self, label: str = "streameval", stream=None):
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.interactive = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.started = time.perf_counter()
        self._last_logged = -LOG_STEP
        self._last_drawn = 0.0

    def update(self, done: int, total: int) -> None:
        percent = int(100 * done / total) if total else 100
        elapsed = time.perf_counter() - self.started
        if self.interactive:
            now = time.perf_counter()
            if now - self._last_drawn < 0.1 and done < total:
                return
            self._last_drawn = now
            filled = BAR_WIDTH * percent // 100
            eta = f"  eta {elapsed * (total - done) / done:5.0f} s" if 0 < done < total else ""
            self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {percent:3d}% "
                              f"{done}/{total} tasks {elapsed:6.1f} s{eta}  ")
        elif percent >= self._last_logged + LOG_STEP or done == total:
            self._last_logged = percent - percent % LOG_STEP
            self.stream.write(f"{self.label}: {percent}% ({done}/{total} tasks) {elapsed:.1f} s\n")
        self.stream.flush()

    def close(self) -> None:
        if self.interactive:
            self.stream.write("\n")
            self.stream.flush()


class ThreadedProgress(Callback):
    """Dask local-scheduler callback feeding a Reporter (counts as dask.diagnostics.ProgressBar does)."""

    def __init__(self, reporter: Reporter):
        super().__init__()
        self.reporter = reporter

    def _start_state(self, dsk, state):
        self.total = sum(len(state[k]) for k in ("ready", "waiting", "running")) + len(state["finished"])
        self.reporter.update(len(state["finished"]), self.total)

    def _posttask(self, key, result, dsk, state, worker_id):
        self.reporter.update(len(state["finished"]), self.total)

    def _finish(self, dsk, state, errored):
        self.reporter.close()


def wait_distributed(client, futures, reporter: Reporter | None) -> None:
    """Block until ``futures`` (and everything they depend on) are done, drawing progress."""
    if reporter is None:
        client.gather(futures, errors="skip")
        return
    from distributed.diagnostics.progressbar import ProgressBar

    class _Feed(ProgressBar):
        def _draw_bar(self, remaining, all, **kwargs):
            reporter.update(all - remaining, all)

    client.sync(_Feed(futures, scheduler=client.scheduler.address).listen)
    reporter.close()
