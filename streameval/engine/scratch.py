"""Per-thread buffers reused across tasks.

A fresh array of a few MiB costs a page fault per 4 KiB page the first time it is written: for a
block of dot products, or a statistic's list of the pairs it found, about as much as the GEMM itself
at small D.  Tasks therefore take their block-sized working arrays from here; each worker thread
keeps one buffer per purpose, grown when a larger one is asked for.
"""

from __future__ import annotations

import math
import threading

import numpy as np

_buffers: dict[tuple, np.ndarray] = {}  # (thread id, purpose) -> reusable buffer
_kept: dict[tuple, tuple] = {}  # (thread id, purpose) -> (the source object, what was made of it)


def buffer(purpose: str, dtype, shape: tuple, allocate=np.empty) -> np.ndarray:
    """This thread's buffer for ``purpose``, viewed as ``shape`` (contents undefined), made by
    ``allocate(size, dtype)`` when there is none large enough."""
    size = math.prod(shape)  # numpy's prod costs ~5 us a call, here 5 a block
    key = (threading.get_ident(), purpose)
    found = _buffers.get(key)
    if found is None or found.dtype != dtype or found.size < size:
        found = _buffers[key] = allocate(size, dtype=dtype)
    return found[:size].reshape(shape)


def kept(purpose: str, source, make):
    """This thread's ``make(source)``, made again only when ``source`` is another object than last
    time for ``purpose`` (a query block's features put on a device once for every gallery chunk
    the thread scores; the source is held, so its id is never another's)."""
    key = (threading.get_ident(), purpose)
    found = _kept.get(key)
    if found is None or found[0] is not source:
        found = _kept[key] = (source, make(source))
    return found[1]


def release() -> None:
    """Drop every buffer (the threaded scheduler's threads outlive an evaluation)."""
    _buffers.clear()
    _kept.clear()
