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
goes back.  The pass under way is named; work becomes time at each pass's cost measured during the
run, and the ETA says "estimating" until every pass still to run has one.  A :class:`Reporter`
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

PASSES = ("neighbours", "positives", "range", "pilot", "scoring", "rescoring", "refinement", "settling")  # in the order they run
COMPILING = "compiling kernels"  # the phase, and what the bar says, while numba compiles or loads kernels
TICK_S = 0.5  # how often the bar's clock is redrawn while kernels compile (no task finishes meanwhile)
BAR_WIDTH = 30
LOG_STEP = 10  # percent between lines in non-interactive output
REDRAW_S = 0.1  # a live bar redraws at most this often
CLEAR_LINE = "\033[K"  # erase the rest of a terminal line (what a longer earlier drawing left)
ETA_AFTER = 0.01  # fraction of a pass's work done before its cost counts as measured
MEASURED_ROUNDS = 2  # a pass's cost counts as measured after this many tasks a worker (overestimated by
# at most (workers - 1) / tasks done, under 50%: its first interval books one task's work for a round)
ESTIMATING = "estimating"  # what the ETA says until every pass with work left has a measured cost
WATCH_INTERVAL_S = 0.2  # how often the distributed scheduler is asked for finished keys

# The cost model: work in units of one multiply-add of the distance GEMM.  Only ratios matter: they
# make the bar advance in proportion to time.  Measured per task on one core (200 .. 3,368 queries,
# D = 128 .. 2048): a scored pair costs 7.6 .. 42 ns, about D + PAIR_OVERHEAD multiply-adds at the
# GEMM's rate (the overhead is the kernel's per-pair work: the distance, its error window, the slot
# search, the threshold bin), and reading the store 1 .. 1.5 ns per byte (decompression, copy,
# upcast, row terms), about BYTE_COST multiply-adds.  The positives pass reads each row once per
# query block and scores no pair, so next to a pass scoring many queries against the same rows it
# weighs little (under 2% at 10,000 queries, D = 512), and more with few queries, as it takes.  The
# range pass only keeps each pair's distance within the extremes: on one core (1,000 x 20,000, D = 32
# .. 1024) a pair of it costs 1.1 .. 1.9x less than a scored one, D + RANGE_PAIR_OVERHEAD multiply-adds
# at every D.  What a scored pair costs beyond that grows with the positives per query, which no key
# knows: the bar measures each pass's cost as it runs (``Bar``), this model is its first guess.
PAIR_OVERHEAD = 300
RANGE_PAIR_OVERHEAD = 140
BYTE_COST = 64


def pairs_work(n_queries: int, n_rows: int, dim: int, overhead: int = PAIR_OVERHEAD) -> int:
    """Work of computing the distances of ``n_queries`` x ``n_rows`` pairs of dimension ``dim``,
    ``overhead`` multiply-adds' worth of work a pair besides (``RANGE_PAIR_OVERHEAD``: the range pass)."""
    return n_queries * n_rows * (dim + overhead)


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
        self.restart()

    def show(self, percent: int, passes: str, elapsed: float, eta: float | str | None) -> None:
        """``eta``: seconds, ESTIMATING, or None for none (while kernels compile, before the passes)."""
        if self.interactive:
            if elapsed - self._last_drawn < REDRAW_S:
                return
            self._last_drawn = elapsed
            filled = BAR_WIDTH * percent // 100
            eta_text = f"  eta {_eta_text(eta)}" if eta is not None else ""
            self._write(f"\r{self.label} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {percent:3d}% {passes}  "
                        f"{elapsed:.1f} s{eta_text}{CLEAR_LINE}")
        elif percent >= self._last_logged + LOG_STEP:
            self._last_logged = percent - percent % LOG_STEP
            eta_text = f", eta {_eta_text(eta)}" if eta is not None else ""
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


def _eta_text(eta: float | str) -> str:
    return eta if isinstance(eta, str) else duration(eta)


def duration(seconds: float) -> str:
    """42 s, 12 min 05 s, 3 h 07 min."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class Bar:
    """One bar over every compute of a run, drawn by a Reporter.

    Each task's work (``key_work``) is turned into time by its pass's cost, measured as the run goes:
    the wall time between a task's finish and the one before it is booked to the task's pass, so a
    pass's cost is its booked seconds per unit of work done (``costs``).  A pass's first interval
    covers the ``workers`` tasks it started together while booking one task's work, so its cost
    counts as measured only after a few rounds of them (``MEASURED_ROUNDS``; half its tasks, if
    fewer).  The range pass only finds extremes where the scoring pass places every pair, and both
    costs depend on the data (the positives per query), so no fixed model weighs them: until a pass
    has run, it is taken to cost what the passes measured so far cost on average (the work model's
    ratios: its first guess), and the ETA says "estimating" until every pass with work left has a
    measured cost.

    The shown fraction advances at each finished task by the task's share of the time estimated left
    (``(1 - fraction) * task / left``): it never goes back, neither when a compute adds work nor when
    a cost is measured anew; the rest of the bar stands for what is left, and it reaches the end with
    the last task.
    """

    def __init__(self, reporter: Reporter, clock=time.perf_counter, workers: int = 1):
        self.reporter, self.clock, self.workers = reporter, clock, workers
        self.started: float | None = None
        self.total: dict[str, int] = {}  # pass -> work, of the graphs given so far
        self.expected: dict[str, int] = {}  # pass -> work announced before its graph
        self.done: dict[str, int] = {}
        self.tasks: dict[str, int] = {}  # pass -> tasks with work, of the graphs given so far
        self.tasks_done: dict[str, int] = {}
        self.spent: dict[str, float] = {}  # pass -> wall seconds booked to its finished tasks
        self.weights: dict = {}  # key -> (pass, work) of keys not finished yet
        self.fraction = 0.0
        self.last_finish: float | None = None
        self.compiles = 0  # numba compiles under way during the passes (``compile_watch``)
        self._drawing = threading.Lock()  # a compile in a worker thread redraws too

    def start(self, now: float) -> None:
        self.started = self.last_finish = now
        self.redraw()

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

    def expect(self, pass_name: str, work: int) -> None:
        """Announce a pass of a later compute, so the bar's length counts it from the start."""
        self.expected[pass_name] = self.expected.get(pass_name, 0) + work

    def add_graph(self, keys) -> list:
        """Count the work of a graph about to run (taking it off what was announced of its passes:
        a run of several graphs, a suite's, announces them all first) and return the keys that
        carry work.  Passes nobody announced: the bar says they were added."""
        weights = {key: weight for key in keys if (weight := key_work(key)) is not None}
        added = [p for p in PASSES if p not in self.expected and any(w[0] == p for w in weights.values())]
        left = self.work_total - self.work_done
        for pass_name, work in weights.values():
            left_announced = self.expected.pop(pass_name, 0) - work
            if left_announced > 0:
                self.expected[pass_name] = left_announced
            self.total[pass_name] = self.total.get(pass_name, 0) + work
            self.tasks[pass_name] = self.tasks.get(pass_name, 0) + 1
        self.weights.update(weights)
        grown = self.work_total - self.work_done - left
        if added and grown > 0 and left > 0 and self.started is not None:
            self.reporter.note(self.percent, f"+{', '.join(added)}: the work left grew {(left + grown) / left:.1f}x "
                                             "(the rest of the bar covers it)")
        return list(weights)

    def finished(self, key) -> None:
        weight = self.weights.pop(key, None)
        if weight is None:
            return
        pass_name, work = weight
        with self._drawing:
            now, costs = self.clock(), self.costs()
            left = self.seconds_left(costs)
            if left > 0:
                self.fraction += (1 - self.fraction) * min(1.0, work * costs[pass_name] / left)
            if self.last_finish is not None:
                self.spent[pass_name] = self.spent.get(pass_name, 0.0) + now - self.last_finish
            self.last_finish = now
            self.done[pass_name] = self.done.get(pass_name, 0) + work
            self.tasks_done[pass_name] = self.tasks_done.get(pass_name, 0) + 1
        self.redraw()

    def close(self, now: float) -> None:
        """The run's passes are complete: the one 100% line, with the bar's time."""
        self.reporter.finish(", ".join(p for p in PASSES if p in self.total), now - self.started)

    @property
    def work_total(self) -> int:
        return sum(self.total.values()) + sum(self.expected.values())

    @property
    def work_done(self) -> int:
        return sum(self.done.values())

    def work_left(self, pass_name: str) -> int:
        return self.total.get(pass_name, 0) + self.expected.get(pass_name, 0) - self.done.get(pass_name, 0)

    def measured(self) -> dict[str, float]:
        """Seconds per unit of work of the passes whose cost is known: with time booked to them, at
        least ETA_AFTER of their work done, and MEASURED_ROUNDS rounds of tasks on every worker (or
        half their tasks), the first interval's excess spread thin (see the class)."""
        def known(p):
            rounds = min(MEASURED_ROUNDS * self.workers, -(-self.tasks.get(p, 0) // 2))
            return (self.spent.get(p, 0) > 0 and self.done[p] >= ETA_AFTER * (self.done[p] + self.work_left(p))
                    and self.tasks_done[p] >= max(1, rounds))

        return {p: self.spent[p] / self.done[p] for p in self.done if known(p)}

    def costs(self) -> dict[str, float]:
        """Seconds (or, before anything is measured, relative time) per unit of work of every pass:
        measured, or else the average of the measured passes."""
        measured = self.measured()
        spent = sum(self.spent[p] for p in measured)
        average = spent / sum(self.done[p] for p in measured) if measured else 1.0
        return {p: measured.get(p, average) for p in PASSES}

    def seconds_left(self, costs: dict[str, float]) -> float:
        return sum(self.work_left(p) * costs[p] for p in PASSES)

    def eta(self) -> float | None:
        """Seconds left at each pass's measured cost; None until every pass with work left has one."""
        measured = self.measured()
        if any(self.work_left(p) > 0 and p not in measured for p in PASSES):
            return None
        return self.seconds_left({p: measured.get(p, 0.0) for p in PASSES})

    @property
    def percent(self) -> int:
        """Whole percent of the bar, at most 99 until ``close`` (results still to be gathered)."""
        return min(99, int(round(100 * self.fraction, 6)))  # (a sum of float steps: 0.4999999 is 50%)

    def under_way(self) -> str:
        """The passes with work done and work left, or else the next one (or else the last); or
        "compiling kernels" while numba compiles."""
        if self.compiles > 0:
            return COMPILING
        left = [p for p in PASSES if self.work_left(p) > 0]
        begun = [p for p in left if self.done.get(p, 0) > 0]
        return ", ".join(begun or left[:1] or [p for p in PASSES if p in self.total][-1:])

    def redraw(self) -> None:
        """Draw the bar as it stands (also when what is under way changed, no work was done)."""
        if self.started is None:
            return
        with self._drawing:
            eta = self.eta()
            self.reporter.show(self.percent, self.under_way(), self.clock() - self.started,
                               ESTIMATING if eta is None else eta)


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
