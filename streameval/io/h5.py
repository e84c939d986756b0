"""HDF5 files (h5py): every dataset, by its path in the file (``query/features`` matches like
``query_features``), read a block of rows at a time.

MATLAB v7.3 .mat files are HDF5 too, laid out as MATLAB stores arrays (column-major): a MATLAB
N x D array is an HDF5 dataset of shape (D, N), so with ``matlab`` every dataset is read
transposed (a block of rows is a block of the dataset's columns).  MATLAB's own bookkeeping groups
(``#refs#``, ``#subsystem#``) are skipped.
"""

from __future__ import annotations

import os

import numpy as np

from ..core.errors import StoreError, one_line
from . import Source, require

_READ_ERRORS = (OSError, KeyError, ValueError, TypeError, RuntimeError)


class H5Array:
    """A dataset, optionally transposed (``matlab``), optionally read as a vector along one stored
    axis (MATLAB's 1 x N and N x 1 arrays)."""

    def __init__(self, name: str, dataset, src: str, transposed: bool, vector_axis: int | None = None):
        self.name, self.dataset, self.src = name, dataset, src
        self.transposed, self.vector_axis = transposed, vector_axis
        stored = tuple(dataset.shape)
        if vector_axis is not None:
            self.shape = (stored[vector_axis],)
        else:
            self.shape = stored[::-1] if transposed else stored
        self.dtype = dataset.dtype
        self.ndim = len(self.shape)

    def _read(self, rows: slice) -> np.ndarray:
        ds = self.dataset
        try:
            if self.vector_axis is not None:
                return ds[tuple(rows if axis == self.vector_axis else 0 for axis in range(ds.ndim))]
            if self.transposed:
                return np.transpose(ds[(slice(None),) * (ds.ndim - 1) + (rows,)])
            return ds[rows]
        except _READ_ERRORS as exc:
            raise StoreError(f"cannot read '{self.name}' from '{self.src}': {one_line(exc)}") from None

    def blocks(self, step: int):
        for start in range(0, self.shape[0], step):
            yield self._read(slice(start, start + step))

    def whole(self) -> np.ndarray:
        return self._read(slice(None))

    def matrix(self):
        return self

    def __getitem__(self, key):
        """``[rows, cols]`` of a 2-D array (how distance matrices are read)."""
        rows, cols = key
        try:
            return self.dataset[cols, rows].T if self.transposed else self.dataset[rows, cols]
        except _READ_ERRORS as exc:
            raise StoreError(f"cannot read '{self.name}' from '{self.src}': {one_line(exc)}") from None

    def vector(self) -> H5Array:
        if self.ndim != 2 or 1 not in self.shape:
            return self
        stored = self.dataset.shape
        return H5Array(self.name, self.dataset, self.src, self.transposed, 0 if stored[0] != 1 else 1)


def open_source(src: str, matlab: bool = False, label: str = "HDF5") -> Source:
    h5py = require("h5py", "h5py", src)
    try:
        f = h5py.File(src, "r")
    except _READ_ERRORS as exc:
        raise StoreError(f"cannot read '{src}' as an HDF5 file: {one_line(exc)}") from None
    arrays = {}

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset) and not (matlab and name.startswith("#")):
            arrays[name] = H5Array(name, obj, src, transposed=matlab)

    try:
        f.visititems(visit)
    except _READ_ERRORS as exc:
        f.close()
        raise StoreError(f"cannot read '{src}' as an HDF5 file: {one_line(exc)}") from None
    return Source(src, f"{os.path.basename(src)} ({label})", arrays, matlab=matlab, close=f.close)
