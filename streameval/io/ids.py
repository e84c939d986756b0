"""Ids stored as floating point (MATLAB's double, or numpy arrays saved from float tensors): whole
numbers are ids, read as int64; a fraction, NaN or a value beyond int64 is refused, naming its row.
One check for every format."""

from __future__ import annotations

import numpy as np

from ..core.errors import StoreError


class IntegralIds:
    """A floating point array used as ids: each value checked integral, read as int64."""

    dtype = np.dtype(np.int64)

    def __init__(self, array, src: str):
        self.array, self.src, self.name, self.shape = array, src, array.name, array.shape

    def _checked(self, values: np.ndarray, first_row: int) -> np.ndarray:
        exact = (values == np.round(values)) & (values >= -2.0**63) & (values < 2.0**63)  # NaN fails
        if not exact.all():
            row = int(np.flatnonzero(~exact)[0])
            raise StoreError(f"'{self.src}': '{self.name}' row {first_row + row} holds {values[row]}, "
                             "not an integer id")
        return values.astype(np.int64)

    def blocks(self, step: int):
        start = 0
        for block in self.array.blocks(step):
            yield self._checked(block, start)
            start += len(block)

    def whole(self) -> np.ndarray:
        return self._checked(self.array.whole(), 0)


def integral_ids(array, src: str):
    """``array`` used as ids: floating point ones checked whole and read as int64, others as they are."""
    return IntegralIds(array, src) if array.dtype.kind == "f" else array
