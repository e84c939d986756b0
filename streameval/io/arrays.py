"""Arrays held in memory or memory-mapped, in the interface every reader offers (package docstring)."""

from __future__ import annotations

from functools import cached_property

import numpy as np


class MemoryArray:
    """A numpy array or memory map: a block of rows is a slice (a memory map reads just those rows)."""

    def __init__(self, name: str, values):
        self.name = name
        self.values = values

    @property
    def shape(self) -> tuple:
        return tuple(self.values.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    def blocks(self, step: int):
        for start in range(0, self.shape[0], step):
            yield np.asarray(self.values[start:start + step])

    def whole(self) -> np.ndarray:
        return np.asarray(self.values)

    def matrix(self):
        return self.values

    def vector(self) -> MemoryArray:
        """A 1 x N or N x 1 array as N values (MATLAB's vectors)."""
        if len(self.shape) == 2 and 1 in self.shape:
            return MemoryArray(self.name, self.values.reshape(-1))
        return self


class LazyArray(MemoryArray):
    """An array whose shape and dtype are known before its values are loaded (by ``load``), which
    happens only if it is used."""

    def __init__(self, name: str, shape: tuple, dtype, load):
        self.name, self._shape, self._dtype, self._load = name, tuple(shape), np.dtype(dtype), load

    @property
    def shape(self) -> tuple:
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @cached_property
    def values(self):
        return self._load()

    def vector(self) -> MemoryArray:
        return MemoryArray(self.name, self.values).vector()
