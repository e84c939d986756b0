"""Arrays held in memory or memory-mapped, in the interface every reader offers (package docstring)."""

from __future__ import annotations

from functools import cached_property

import numpy as np

from ..core.errors import StoreError, one_line


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


def is_tensor(value) -> bool:
    """A torch tensor (a subclass too, e.g. a Parameter), told by its class without importing torch."""
    return any(cls.__name__ == "Tensor" and cls.__module__ == "torch" for cls in type(value).__mro__)


def host_array(value, what: str) -> np.ndarray:
    """``value`` as a numpy array: a torch tensor detached and moved to the host (bfloat16, which
    numpy lacks, as float32), sharing its memory when it is already a dense CPU tensor; anything
    else through ``np.asarray``.  torch is imported only for a tensor (streameval does not require
    it).  A sparse, quantized or other tensor numpy cannot hold is a StoreError naming ``what``."""
    if not is_tensor(value):
        return np.asarray(value)
    import torch

    if value.layout != torch.strided:
        raise StoreError(f"{what} is a {str(value.layout).removeprefix('torch.')} tensor; save it dense "
                         "(tensor.to_dense()) to convert it")
    tensor = value.detach().cpu()  # the same storage when it is on the CPU already
    try:
        return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()
    except (TypeError, RuntimeError) as exc:  # quantized, meta or complex tensors numpy cannot take as they are
        raise StoreError(f"{what} is a {tensor.dtype} tensor numpy cannot hold ({one_line(exc)}); save it as float32")
