"""Chunk sizes from a memory budget.

One task scores a block of ``query_block`` queries against ``gallery_chunk`` gallery rows.  Its
working memory is dominated by the dot-product block (query_block x gallery_chunk) and the gallery
rows it reads (stored dtype plus the upcast copy).  ``workers`` tasks run at once, so each gets a
``budget / (2 * workers)`` share (the other half covers the statistics' states, which
``session.check_memory`` adds to the tasks' memory against the same budget, the query block,
positives and the interpreter).  Nothing here depends on the gallery length except the number of tasks.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

from ..core.choices import check_range
from ..core.errors import OptionError

DEFAULT_MEMORY_BUDGET = 1 << 30  # the default budget up to two workers (``default_memory_budget``)
# The default budget a worker beyond them: with all 10,000 queries in one block, a smaller share
# plans narrower tasks, whose per-query costs (a state's copy a task, each query's slots a sub-block)
# grow with their count.  10,000 x 500,000 x 256 float16, no GOM, 2 workers, shares of 32 / 64 / 128 /
# 256 / 512 MiB (budgets of 128 MiB .. 2 GiB: 16 workers' shares of 1 .. 16 GiB): 36.7 / 27.8 / 21.0
# / 16.4 / 16.8 s; the share of 256 MiB is a task of a whole 16,384-row store chunk.
WORKER_MEMORY_BUDGET = 512 << 20
MIN_GALLERY_CHUNK = 256
MIN_TAIL_TASK = 64  # fewer gallery rows are not worth a task of their own
MIN_QUERY_BLOCK = 256  # fewer queries per task: the gallery is re-read for every handful of queries
TASKS_PER_WORKER = 4  # enough tasks per thread that the last round leaves little idle time
QUERY_SUB_BLOCK = 512  # query rows per GEMM inside a task: 512 x 4096 float32 dot products = 8 MiB
GALLERY_SUB_BLOCK = 4096  # gallery rows per GEMM inside a task, however many rows the task reads
# A sub-block's working memory per pair beyond its dot product: the statistics' lists of the
# negatives within reach (query, column, slot: 3 int64), the float64 distances some statistics
# read, re-ranking's float64 values (two arrays).
PAIR_SCRATCH_BYTES = 48

# Sizes as Dask reads them (dask.utils.parse_bytes): decimal kB, MB, GB, TB = 10^3, 10^6, ...; binary
# KiB, MiB, GiB, TiB = 2^10, 2^20, ...; a plain number is bytes.  Case is ignored; a bare K, M or G
# is refused (Dask reads it as decimal, others as binary: it would be a guess).
_UNITS = {"": 1, "b": 1, **{f"{prefix}b": 1000 ** power for power, prefix in enumerate("kmgtp", 1)},
          **{f"{prefix}ib": 1024 ** power for power, prefix in enumerate("kmgtp", 1)}}
SIZE_UNITS = "bytes, or with a unit: kB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)"


def parse_bytes(text) -> int:
    """'1GiB' (2^30), '4GB' (4 * 10^9), '512MiB', '1.5kB' or a plain number (bytes) -> bytes; the
    one parser of every size option (units as Dask reads them, SIZE_UNITS)."""
    from fractions import Fraction

    if isinstance(text, int) and not isinstance(text, bool):
        return text
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise OptionError(f"cannot read a memory size from {text!r}: give {SIZE_UNITS}, e.g. 512MiB or 4GB")
    return int(Fraction(match.group(1)) * _UNITS[match.group(2).lower()])


@dataclass(frozen=True)
class Plan:
    query_block: int
    gallery_chunk: int
    workers: int
    task_bytes: int = 0  # a task's working memory: its dot-product block and the gallery rows it reads
    read_chunk: int = 0  # gallery rows a range or scoring task reads (``read_chunk``; 0: gallery_chunk)
    tail_tasks: int = 1  # tasks sharing the rows left after the whole ``task_rows`` tasks (``read_ranges``)
    positives_chunk: int = 0  # gallery rows a positives task reads (``positives_chunk``; 0: task_rows)

    def query_ranges(self, n_query: int):
        return _ranges(n_query, self.query_block)

    def gallery_ranges(self, n_gallery: int, start: int = 0):
        return [(a + start, b + start) for a, b in _ranges(n_gallery - start, self.gallery_chunk)]

    @property
    def task_rows(self) -> int:
        """Gallery rows a task of the passes that score a query block reads."""
        return self.read_chunk or self.gallery_chunk

    def read_ranges(self, n_gallery: int, start: int = 0):
        """``gallery_ranges`` of the passes that score a query block: ``task_rows`` rows a task, as
        many whole tasks as give every one of ``tail_tasks`` workers the same number, and the rows
        left after them shared evenly by ``tail_tasks`` tasks.  Left as one task, a partial last
        task ended the pass on one worker while the others waited (0.1 s of the bench's 3 s: 1,696
        rows after twelve tasks of 8,192); after an odd count of whole tasks, the odd one and the
        partial one shared (Market size: 2,048 + 1,300 rows after eight tasks of 2,048) leave no
        worker with a task fewer."""
        ranges = _ranges(n_gallery - start, self.task_rows)
        whole = len(ranges) - (bool(ranges) and ranges[-1][1] - ranges[-1][0] < self.task_rows)
        kept = whole // self.tail_tasks * self.tail_tasks
        if kept < len(ranges):
            first, end = ranges[kept][0], ranges[-1][1]
            pieces = max(1, min(self.tail_tasks, (end - first) // MIN_TAIL_TASK))
            ranges = ranges[:kept] + [(first + (end - first) * k // pieces, first + (end - first) * (k + 1) // pieces)
                                      for k in range(pieces)]
        return [(a + start, b + start) for a, b in ranges]

    @property
    def positives_rows(self) -> int:
        """Gallery rows a task of the positives pass reads."""
        return self.positives_chunk or self.task_rows

    def positives_ranges(self, n_gallery: int, start: int = 0):
        """``gallery_ranges`` of the positives pass: ``positives_rows`` rows a task."""
        return [(a + start, b + start) for a, b in _ranges(n_gallery - start, self.positives_rows)]


def _ranges(n: int, step: int):
    return [(a, min(a + step, n)) for a in range(0, n, step)]


def default_chunk_rows(dim: int, itemsize: int, target_bytes: int = 8 << 20) -> int:
    """Store chunk rows for ~8 MiB chunks: a power of two in [256, 65536]."""
    rows = max(1, target_bytes // (dim * itemsize))
    return int(min(65536, max(256, 1 << int(math.log2(rows)))))


def make_plan(
    n_query: int,
    n_gallery: int,
    dim: int,
    itemsize: int,
    stored_itemsize: int,
    store_chunk_rows: int,
    workers: int,
    memory_budget: int | None = None,
    query_block: int | None = None,
    gallery_chunk: int | None = None,
) -> Plan:
    """Pick (query_block, gallery_chunk) for ``memory_budget`` (None: ``default_memory_budget``);
    explicit values win (up to the store's sizes) but are checked: in range, and a task's working
    memory within this machine's."""
    memory_budget = resolve_budget(memory_budget, workers)
    for name, value in (("query_block", query_block), ("gallery_chunk", gallery_chunk), ("workers", workers),
                        ("memory_budget", memory_budget)):
        if value is not None:
            check_range(value, name)
    if query_block is not None:
        query_block = min(query_block, n_query)  # the chunk is sized for the block the task holds
    share = memory_budget // (2 * workers)
    row_bytes = dim * (itemsize + stored_itemsize)
    if query_block is None or gallery_chunk is None:
        needed = minimum_budget(n_query, dim, itemsize, stored_itemsize, workers)
        if memory_budget < needed:
            raise OptionError(
                f"a memory budget of {format_bytes(memory_budget)} is too small to plan {workers} worker(s): at least "
                f"{format_bytes(needed)} (a {MIN_GALLERY_CHUNK}-row gallery chunk against "
                f"{min(n_query, MIN_QUERY_BLOCK)} queries per worker), or give --query-block and --gallery-chunk"
            )
    if query_block is None:
        # all queries in one block when a minimal chunk still fits: then the gallery is read once
        query_block = max(1, min(n_query, (share - MIN_GALLERY_CHUNK * row_bytes) // (MIN_GALLERY_CHUNK * itemsize)))
    planned = gallery_chunk is None
    if planned:
        fit = max(MIN_GALLERY_CHUNK, share // (query_block * itemsize + row_bytes))
        balanced = math.ceil(n_gallery / (TASKS_PER_WORKER * workers))
        gallery_chunk = _align(max(MIN_GALLERY_CHUNK, min(fit, balanced)), store_chunk_rows)
    query_block, gallery_chunk = int(min(query_block, n_query)), int(min(gallery_chunk, n_gallery))
    task_bytes = query_block * gallery_chunk * itemsize + gallery_chunk * row_bytes
    rows = read_chunk(query_block, gallery_chunk, itemsize, row_bytes, store_chunk_rows, balanced, task_bytes) \
        if planned else gallery_chunk
    plan = Plan(query_block, gallery_chunk, workers, task_bytes, rows, workers if planned else 1,
                positives_chunk(rows, row_bytes, store_chunk_rows, n_gallery, workers, task_bytes) if planned else rows)
    _check_task_memory(plan)
    return plan


def read_chunk(query_block: int, gallery_chunk: int, itemsize: int, row_bytes: int, store_chunk_rows: int,
               balanced: int, task_bytes: int) -> int:
    """Gallery rows a task scoring a query block reads: ``gallery_chunk`` doubled while it stays
    within a store chunk (reading part of one decodes all of it: ~4x the bytes at a quarter), the
    balance between workers (``balanced`` rows a task) and the task's memory ``task_bytes``.  A task
    makes its values a sub-block (QUERY_SUB_BLOCK x GALLERY_SUB_BLOCK) at a time, so its memory
    grows with the rows it reads by their bytes only: task_bytes, sized for a block of
    query_block x gallery_chunk dot products, holds more rows than that when query_block is large."""
    def memory(rows: int) -> int:
        sub_block = min(query_block, QUERY_SUB_BLOCK) * min(rows, GALLERY_SUB_BLOCK) * (itemsize + PAIR_SCRATCH_BYTES)
        return sub_block + rows * row_bytes

    rows = gallery_chunk
    while 2 * rows <= min(store_chunk_rows, balanced) and memory(2 * rows) <= task_bytes:
        rows *= 2
    return rows


def positives_chunk(task_rows: int, row_bytes: int, store_chunk_rows: int, n_gallery: int, workers: int,
                    task_bytes: int) -> int:
    """Gallery rows a task of the positives pass reads: ``task_rows`` doubled while it stays within
    a store chunk, the task's memory ``task_bytes`` (a positives task holds its rows, no dot
    products) and two tasks a worker.  A scoring task that reads half a store chunk balances the
    workers' long tasks; a positives task is short, and reading the whole chunk once instead of
    decoding it for each half took the bench's hard problem's positives pass from 0.15 to 0.12 s."""
    rows = task_rows
    while 2 * rows <= store_chunk_rows and 2 * rows * row_bytes <= task_bytes and 4 * rows * workers <= n_gallery:
        rows *= 2
    return rows


def _check_task_memory(plan: Plan) -> None:
    """Refuse a task whose dot-product block and gallery rows exceed this machine's memory: it would
    swap or be killed after minutes instead of failing now."""
    memory = physical_memory()
    if memory is not None and plan.task_bytes > memory:
        raise OptionError(
            f"a task of {plan.query_block:,} queries x {plan.gallery_chunk:,} gallery rows needs about "
            f"{format_bytes(plan.task_bytes)}, more than this machine's memory ({format_bytes(memory)}): give a smaller "
            "--query-block / --gallery-chunk or --memory-budget"
        )


def default_memory_budget(workers: int) -> int:
    """The budget of a run that names none: ``WORKER_MEMORY_BUDGET`` a worker, at least
    ``DEFAULT_MEMORY_BUDGET`` and at most a quarter of this machine's memory (where it says).  A
    budget that stayed the same on every machine would give each of 16 workers a sixteenth of it:
    tasks of 512 gallery rows against 10,000 queries, twice the time of whole store chunks."""
    wanted = workers * WORKER_MEMORY_BUDGET
    memory = physical_memory()
    return max(DEFAULT_MEMORY_BUDGET, wanted if memory is None else min(wanted, memory // 4))


def resolve_budget(memory_budget, workers: int) -> int:
    """A run's memory budget in bytes: ``memory_budget`` (a size, ``parse_bytes``), or None for
    ``default_memory_budget``."""
    return default_memory_budget(workers) if memory_budget is None else parse_bytes(memory_budget)


def physical_memory() -> int | None:
    """This machine's memory in bytes; None where the system does not say (not POSIX)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def minimum_budget(n_query: int, dim: int, itemsize: int, stored_itemsize: int, workers: int) -> int:
    """The smallest budget that plans sensibly: each worker holds a minimal gallery chunk (stored and
    upcast) and its dot products with a block of MIN_QUERY_BLOCK queries (or all of them), doubled
    as ``make_plan`` shares it."""
    per_worker = MIN_GALLERY_CHUNK * (dim * (itemsize + stored_itemsize) + min(n_query, MIN_QUERY_BLOCK) * itemsize)
    return 2 * workers * per_worker


def format_bytes(n: int) -> str:
    for unit, size in (("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _align(rows: int, store_chunk_rows: int) -> int:
    """Round to whole store chunks (each chunk read by one task), or to a power-of-two fraction of
    one when a store chunk is larger than the budget allows."""
    if rows >= store_chunk_rows:
        return (rows // store_chunk_rows) * store_chunk_rows
    fraction = store_chunk_rows
    while fraction > rows and fraction > MIN_GALLERY_CHUNK:
        fraction //= 2
    return fraction
