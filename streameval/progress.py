"""Progress that tells the truth: one bar per run, advancing with the work done, not the tasks.

Work.  Every task that reads or scores gallery rows carries its work in its Dask key
(``work_key``: pass name, work units, a unique id), so either scheduler can weigh the tasks it
reports finished: Dask's threaded scheduler through a local callback (:class:`ThreadedProgress`),
dask.distributed through a scheduler plugin collecting the finished keys (``compute_distributed``).
Merges and bookkeeping tasks carry none.  The units are defined once, here (``pairs_work``,
``read_work``).

A :class:`Bar` spans every compute of a run: ``update`` announces the scoring of the new rows
before its first compute (``expect``) and learns how many queries it re-scores only after it; the
bar then says so and spreads the rest of its length over the grown remainder, so the percent never
goes back.  The pass under way is named, the ETA comes from the work rate.  A :class:`Reporter`
draws it: a live bar on a terminal, a line per 10% otherwise.

:class:`Phases` splits a run's elapsed time into consecutive named phases; the bar is one of them
("passes"), so the summary's total is the bar's time plus named remainders.
"""

from __future__ import annotations

import re
import sys
import threading
import time
import uuid
from contextlib import contextmanager, suppress

from dask.callbacks import Callback

PASSES = ("positives", "range", "pilot", "scoring", "rescoring", "refinement", "settling")  # in the order they run
COMPILING = "compiling kernels"  # the phase, and what the bar says, while numba compiles or loads kernels
TICK_S = 0.5  # how often the bar's clock is redrawn while kernels compile (no task finishes meanwhile)
BAR_WIDTH = 30
LOG_STEP = 10  # percent between lines in non-interactive output
REDRAW_S = 0.1  # a live bar redraws at most this often
CLEAR_LINE = "\033[K"  # erase the rest of a terminal line (what a longer earlier drawing left)
ETA_AFTER = 0.01  # fraction of the work done before an ETA is given
WATCH_INTERVAL_S = 0.2  # how often the distributed scheduler is asked for finished keys

# The cost model: work in units of one multiply-add of the distance GEMM.  Only ratios matter: they
# make the bar advance in proportion to time.  Measured per task on one core (200 .. 3,368 queries,
# D = 128 .. 2048): a scored pair costs 7.6 .. 42 ns, about D + PAIR_OVERHEAD multiply-adds at the
# GEMM's rate (the overhead is the kernel's per-pair work: the distance, its error window, the slot
# search, the threshold bin), and reading the store 1 .. 1.5 ns per byte (decompression, copy,
# upcast, row terms), about BYTE_COST multiply-adds.  The positives pass reads each row once per
# query block and scores no pair, so next to a pass scoring many queries against the same rows it
# weighs little (under 2% at 10,000 queries, D = 512), and more with few queries, as it takes.
PAIR_OVERHEAD = 300
BYTE_COST = 64


def pairs_work(n_queries: int, n_rows: int, dim: int) -> int:
    """Work of computing the distances of ``n_queries`` x ``n_rows`` pairs of dimension ``dim``."""
    return n_queries * n_rows * (dim + PAIR_OVERHEAD)


def read_work(n_bytes: int) -> int:
    """Work of reading ``n_bytes`` from the store."""
    return n_bytes * BYTE_COST


def work_key(pass_name: str, work: int) -> str:
    """A unique Dask key naming the task's pass and work (Dask's dashboards show it as ``pass_name``)."""
    return f"{pass_name}-{int(work)}-{uuid.uuid4().hex}"


_WORK_KEY = re.compile(rf"({'|'.join(PASSES)})-(\d+)-[0-9a-f]{{32}}")


def key_work(key) -> tuple[str, int] | None:
    """(pass name, work) of a ``work_key``; None for other keys (tasks without work of their own)."""
    match = _WORK_KEY.fullmatch(key) if isinstance(key, str) else None
    return (match.group(1), int(match.group(2))) if match else None


class Phases:
    """Consecutive named phases of a run: each ``lap`` is the time since the previous one, so the
    phases add up to the elapsed time."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.mark = clock()
        self.seconds: dict[str, float] = {}

    def lap(self, name: str, carved: dict | None = None) -> float:
        """End phase ``name`` now (adding to it if it ran before); ``carved``: {phase: seconds} of it
        to book under other names.  Returns the time."""
        now = self.clock()
        lap = now - self.mark
        # never more carved out than the lap lasted (numba's compile timer also hears other threads)
        carved = carved or {}
        total = sum(carved.values())
        if total > lap:
            carved = {phase: seconds * lap / total for phase, seconds in carved.items()}
        for phase, seconds in {name: lap - sum(carved.values()), **carved}.items():
            self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds
        self.mark = now
        return now


@contextmanager
def compile_watch(bar):
    """While numba compiles a kernel in the block (loading one from its cache takes milliseconds),
    ``bar`` (if any) says "compiling kernels" (``Bar.compiles``): the bar would otherwise stand still
    on the pass under way."""
    if bar is None:
        yield
        return
    from numba.core import event

    class Counting(event.Listener):  # a compile nests the compiles of what it calls
        def on_start(self, _):
            bar.compiles += 1
            bar.redraw()

        def on_end(self, _):
            bar.compiles -= 1
            bar.redraw()

    with event.install_listener("numba:compile", Counting()):
        yield


@contextmanager
def compile_timer():
    """Seconds numba spends compiling or loading cached kernels in the block (``timer.seconds``)."""
    from numba.core import event

    timer = _Seconds()
    with event.install_timer("numba:compiler_lock", timer.add):
        yield timer


class _Seconds:
    seconds = 0.0

    def add(self, seconds: float) -> None:
        self.seconds += seconds


class Reporter:
    """Draws a bar on ``stream`` (stderr by default): live on a terminal, a line per 10% otherwise."""

    def __init__(self, label: str = "streameval", stream=None):
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.interactive = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last_logged = -LOG_STEP
        self._last_drawn = -REDRAW_S

    def show(self, percent: int, passes: str, elapsed: float, eta: float | None) -> None:
        if self.interactive:
            if elapsed - self._last_drawn < REDRAW_S:
                return
            self._last_drawn = elapsed
            filled = BAR_WIDTH * percent // 100
            eta_text = f"  eta {duration(eta)}" if eta is not None else ""
            self._write(f"\r{self.label} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {percent:3d}% {passes}  "
                        f"{elapsed:.1f} s{eta_text}{CLEAR_LINE}")
        elif percent >= self._last_logged + LOG_STEP:
            self._last_logged = percent - percent % LOG_STEP
            eta_text = f", eta {duration(eta)}" if eta is not None else ""
            self._write(f"{self.label}: {percent}% {passes}, {elapsed:.1f} s{eta_text}\n")

    def restart(self) -> None:
        """Draw the next call to ``show`` whatever it says (a new clock starts: the passes')."""
        self._last_logged = -LOG_STEP
        self._last_drawn = -REDRAW_S

    def note(self, percent: int, text: str) -> None:
        """A line of its own (a live bar is redrawn below it)."""
        self._line(f"{self.label}: {percent}% {text}")
        self._last_drawn = -REDRAW_S

    def finish(self, passes: str, elapsed: float) -> None:
        head = f"{self.label} [{'#' * BAR_WIDTH}]" if self.interactive else f"{self.label}:"
        self._line(f"{head} 100% {passes} in {elapsed:.2f} s")

    def abandon(self) -> None:
        """The run failed: end a live bar's line, so the error starts on its own."""
        if self.interactive:
            self._write("\n")

    def _line(self, text: str) -> None:
        self._write(f"\r{text}{CLEAR_LINE}\n" if self.interactive else f"{text}\n")

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


def duration(seconds: float) -> str:
    """42 s, 12 min 05 s, 3 h 07 min."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class Bar:
    """One bar over every compute of a run, measured in work (``key_work``), drawn by a Reporter.

    The shown fraction is ``base + (1 - base) * (work done since the base) / (work left then)``,
    the base being taken whenever the total changes: plain work done / total work until the total
    grows; then the bar keeps its place and the rest of it stands for the work left, so it never
    goes back.
    """

    def __init__(self, reporter: Reporter, clock=time.perf_counter):
        self.reporter, self.clock = reporter, clock
        self.started: float | None = None
        self.total: dict[str, int] = {}  # pass -> work, of the graphs given so far
        self.expected: dict[str, int] = {}  # pass -> work announced before its graph
        self.done: dict[str, int] = {}
        self.weights: dict = {}  # key -> (pass, work) of keys not finished yet
        self.base_fraction, self.base_done = 0.0, 0
        self.compiles = 0  # numba compiles under way during the passes (``compile_watch``)
        self._drawing = threading.Lock()  # a compile in a worker thread redraws too

    def start(self, now: float) -> None:
        self.started = now
        self._show()

    @contextmanager
    def compiling(self):
        """Before the passes: the bar says "compiling kernels" at 0%, its clock redrawn every TICK_S."""
        started, done = self.clock(), threading.Event()

        def tick():
            while True:
                self.reporter.show(0, COMPILING, self.clock() - started, None)
                if done.wait(TICK_S):
                    return

        ticker = threading.Thread(target=tick, name="streameval-compiling", daemon=True)
        ticker.start()
        try:
            yield
        finally:
            done.set()
            ticker.join()
            self.reporter.restart()

    def redraw(self) -> None:
        """Draw again (what is under way changed, no work was done)."""
        self._show()

    def expect(self, pass_name: str, work: int) -> None:
        """Announce a pass of a later compute, so the bar's length counts it from the start."""
        self._rebase()
        self.expected[pass_name] = self.expected.get(pass_name, 0) + work

    def add_graph(self, keys) -> list:
        """Count the work of a graph about to run (taking it off what was announced of its passes:
        a run of several graphs, a suite's, announces them all first) and return the keys that
        carry work.  Passes nobody announced: the bar says they were added."""
        weights = {key: weight for key in keys if (weight := key_work(key)) is not None}
        added = [p for p in PASSES if p not in self.expected and any(w[0] == p for w in weights.values())]
        left = self.work_total - self.work_done
        self._rebase()
        for pass_name, work in weights.values():
            left_announced = self.expected.pop(pass_name, 0) - work
            if left_announced > 0:
                self.expected[pass_name] = left_announced
            self.total[pass_name] = self.total.get(pass_name, 0) + work
        self.weights.update(weights)
        grown = self.work_total - self.work_done - left
        if added and grown > 0 and left > 0 and self.started is not None:
            self.reporter.note(self.percent, f"+{', '.join(added)}: the work left grew {(left + grown) / left:.1f}x "
                                             "(the rest of the bar covers it)")
        return list(weights)

    def finished(self, key) -> None:
        weight = self.weights.pop(key, None)
        if weight is not None:
            self.done[weight[0]] = self.done.get(weight[0], 0) + weight[1]
            self._show()

    def close(self, now: float) -> None:
        """The run's passes are complete: the one 100% line, with the bar's time."""
        self.reporter.finish(", ".join(p for p in PASSES if p in self.total), now - self.started)

    @property
    def work_total(self) -> int:
        return sum(self.total.values()) + sum(self.expected.values())

    @property
    def work_done(self) -> int:
        return sum(self.done.values())

    @property
    def fraction(self) -> float:
        left = self.work_total - self.base_done
        return self.base_fraction + (1 - self.base_fraction) * ((self.work_done - self.base_done) / left if left else 0)

    @property
    def percent(self) -> int:
        """Whole percent of the bar, at most 99 until ``close`` (results still to be gathered)."""
        return min(99, int(100 * self.fraction))

    def under_way(self) -> str:
        """The passes with work done and work left, or else the next one (or else the last); or
        "compiling kernels" while numba compiles."""
        if self.compiles > 0:
            return COMPILING
        left = [p for p in PASSES if self.done.get(p, 0) < self.total.get(p, 0) + self.expected.get(p, 0)]
        begun = [p for p in left if self.done.get(p, 0) > 0]
        return ", ".join(begun or left[:1] or [p for p in PASSES if p in self.total][-1:])

    def _rebase(self) -> None:
        """Before the total changes: the bar goes on from where it is (no change while it does not)."""
        self.base_fraction, self.base_done = self.fraction, self.work_done

    def _show(self) -> None:
        if self.started is None:
            return
        with self._drawing:
            elapsed = self.clock() - self.started
            done, left = self.work_done, self.work_total - self.work_done
            # the first tasks alone are too few to tell the rate
            rate_known = done > 0 and done >= ETA_AFTER * self.work_total
            eta = left * elapsed / done if rate_known else None  # the work left at the rate so far
            self.reporter.show(self.percent, self.under_way(), elapsed, eta)


class ThreadedProgress(Callback):
    """Dask local-scheduler callback: tells the bar of every finished key."""

    def __init__(self, bar: Bar):
        super().__init__()
        self.bar = bar

    def _posttask(self, key, result, dsk, state, worker_id):
        self.bar.finished(key)


def compute_distributed(client, built, keys: list, finished):
    """``built`` computed on the client's cluster, calling ``finished(key)`` for each of ``keys`` done.

    A plugin on the scheduler, added before the graph is sent, collects the keys as they reach
    memory (each once, even if a lost worker makes one compute again); the client collects them
    every WATCH_INTERVAL_S.
    """
    name = f"streameval-progress-{uuid.uuid4().hex}"
    client.run_on_scheduler(_watch_keys, name, keys)
    try:
        future = client.compute(built)
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())
        while not done.wait(WATCH_INTERVAL_S):
            for key in client.run_on_scheduler(_pop_finished, name):
                finished(key)
        for key in client.run_on_scheduler(_pop_finished, name):
            finished(key)
        return future.result()
    finally:
        with suppress(OSError):  # the scheduler may be gone: then that is the error to report
            client.run_on_scheduler(_unwatch, name)


def _watch_keys(name: str, keys: list, dask_scheduler=None) -> None:
    """Runs on the scheduler (which imports streameval: ``cluster.preflight``)."""
    from distributed.diagnostics.plugin import SchedulerPlugin

    class FinishedKeys(SchedulerPlugin):
        def __init__(self):
            self.watched, self.finished = set(keys), []

        def transition(self, key, start, finish, *args, **kwargs):
            if finish == "memory" and key in self.watched:
                self.watched.discard(key)
                self.finished.append(key)

    dask_scheduler.add_plugin(FinishedKeys(), name=name)


def _pop_finished(name: str, dask_scheduler=None) -> list:
    plugin = dask_scheduler.plugins[name]
    keys, plugin.finished = plugin.finished, []
    return keys


def _unwatch(name: str, dask_scheduler=None) -> None:
    dask_scheduler.remove_plugin(name=name)
