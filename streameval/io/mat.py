"""MATLAB .mat files: v4 to v7 through scipy.io (each variable read whole, only the variables
used), v7.3 through h5py (an HDF5 file, read a block of rows at a time: ``h5``).

layumi's Person_reID_baseline_pytorch saves ``pytorch_result.mat`` with ``gallery_f``,
``gallery_label``, ``gallery_cam``, ``query_f``, ``query_label``, ``query_cam``, labels as 1 x N rows.
MATLAB has no 1-D arrays and stores numbers as double, so ids are read from 1 x N or N x 1 arrays,
and integral floating point ids as int64 (a fraction, NaN or a value beyond int64 is refused).
"""

from __future__ import annotations

import os

import numpy as np

from ..core.errors import StoreError, one_line
from . import Source, require
from .arrays import LazyArray

_CLASSES = {"double": np.float64, "single": np.float32, "int8": np.int8, "int16": np.int16, "int32": np.int32,
            "int64": np.int64, "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64,
            "logical": np.bool_}  # other classes (char, cell, struct, sparse) cannot be features or ids
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_READ_ERRORS = (OSError, ValueError, TypeError, EOFError, NotImplementedError, KeyError)


def open_source(src: str) -> Source:
    if _is_hdf5(src):  # v7.3 (its 128-byte MATLAB header is optional for HDF5 readers)
        from .h5 import open_source as open_hdf5

        return open_hdf5(src, matlab=True, label="MATLAB v7.3, HDF5")
    scipy_io = require("scipy.io", "scipy", src)
    try:
        major, _ = scipy_io.matlab.matfile_version(src)
    except _READ_ERRORS + (scipy_io.matlab.MatReadError,) as exc:
        raise StoreError(f"'{src}' is not a MATLAB .mat file: {one_line(exc)}") from None
    try:
        variables = scipy_io.whosmat(src)
    except _READ_ERRORS + (scipy_io.matlab.MatReadError,) as exc:
        raise StoreError(f"cannot read '{src}': {one_line(exc)}") from None

    def loader(name):
        def load():
            try:
                return scipy_io.loadmat(src, variable_names=[name])[name]
            except _READ_ERRORS + (scipy_io.matlab.MatReadError,) as exc:
                raise StoreError(f"cannot read '{name}' from '{src}': {one_line(exc)}") from None
        return load

    arrays = {name: LazyArray(name, shape, _CLASSES.get(cls, object), loader(name)) for name, shape, cls in variables}
    version = "v4" if major == 0 else "v5"
    return Source(src, f"{os.path.basename(src)} (MATLAB {version}, read whole)", arrays, matlab=True)


def _is_hdf5(src: str) -> bool:
    """The HDF5 signature at offset 0 or after a user block (512 bytes, doubling), as HDF5 looks for it."""
    try:
        with open(src, "rb") as fh:
            size, offset = os.fstat(fh.fileno()).st_size, 0
            while offset + 8 <= size:
                fh.seek(offset)
                if fh.read(8) == HDF5_SIGNATURE:
                    return True
                offset = 512 if offset == 0 else 2 * offset
    except OSError as exc:
        raise StoreError(f"cannot read '{src}': {exc.strerror or exc}") from None
    return False

