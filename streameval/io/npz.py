""".npz archives (``numpy.savez`` / ``savez_compressed``), members streamed.

``numpy.load`` reads a whole .npz member into memory (``mmap_mode`` does not apply to archives), so
members are streamed instead: each is opened in the zip (stored or deflated alike), its .npy header
parsed, and its rows read a block at a time.  Memory stays bounded by a block, except for a 2-D
member saved in Fortran order, which has to be read whole (and a distance matrix, ``matrix()``,
which is read whole: a block of its rows and columns is not a contiguous read).
"""

from __future__ import annotations

import os
import struct
import zipfile
import zlib

import numpy as np
from numpy.lib import format as npy_format

from ..core.errors import StoreError
from . import Source

MAX_HEADER_BYTES = 10_000  # numpy's own limit on a header it parses with literal_eval
_READ_ERRORS = (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError)


class Member:
    """One .npy member of the archive: header facts, and its rows read in order."""

    def __init__(self, zf: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, src: str):
        self.zf, self.info, self.name, self.src = zf, info, name, src
        try:
            with zf.open(info) as fh:
                self.shape, self.fortran, self.dtype = _read_header(fh)
        except _READ_ERRORS as exc:
            raise self._error(exc) from None
        self._whole = None

    def _error(self, exc: Exception) -> StoreError:
        return StoreError(f"cannot read '{self.name}' from '{self.src}': {exc}")

    def blocks(self, step: int):
        """Yield consecutive blocks of ``step`` rows (the last one shorter)."""
        try:
            yield from self._blocks(step)
        except _READ_ERRORS as exc:
            raise self._error(exc) from None

    def whole(self) -> np.ndarray:
        if self._whole is None:
            try:
                with self.zf.open(self.info) as fh:
                    self._whole = npy_format.read_array(fh, allow_pickle=False)
            except _READ_ERRORS as exc:
                raise self._error(exc) from None
        return self._whole

    def matrix(self) -> np.ndarray:
        return self.whole()

    def _blocks(self, step: int):
        n = self.shape[0]
        if self.fortran and len(self.shape) > 1:
            whole = self.whole()
            for start in range(0, n, step):
                yield whole[start:start + step]
            return
        with self.zf.open(self.info) as fh:
            _read_header(fh)
            row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
            for start in range(0, n, step):
                rows = min(step, n - start)
                data = _read_exact(fh, rows * row_bytes)
                yield np.frombuffer(data, dtype=self.dtype).reshape((rows,) + tuple(self.shape[1:]))


def _read_header(fh):
    """(shape, fortran order, dtype) of a member, through numpy's public format API only (its
    private header reader moved between numpy versions)."""
    version = npy_format.read_magic(fh)
    readers = {(1, 0): npy_format.read_array_header_1_0, (2, 0): npy_format.read_array_header_2_0,
               (3, 0): _read_header_3_0}
    if version not in readers:
        raise ValueError(f"unknown .npy format version {version[0]}.{version[1]}")
    return readers[version](fh)


def _read_header_3_0(fh):
    """Version 3.0 is 2.0's layout (a 4-byte little-endian length, then a dict literal) with the
    header in UTF-8, for non-ASCII field names: no public reader takes it, so it is parsed here."""
    import ast

    (length,) = struct.unpack("<I", _read_exact(fh, 4))
    if length > MAX_HEADER_BYTES:
        raise ValueError(f"a .npy header of {length:,} bytes is too large to be read safely")
    try:
        header = ast.literal_eval(_read_exact(fh, length).decode("utf-8"))
    except (SyntaxError, UnicodeDecodeError, MemoryError, RecursionError) as exc:
        raise ValueError(f"cannot parse the .npy header: {exc}") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise ValueError("the .npy header is not a dict of descr, fortran_order and shape")
    shape, fortran = header["shape"], header["fortran_order"]
    if not isinstance(shape, tuple) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ValueError(f"the .npy header's shape is not valid: {shape!r}")
    if not isinstance(fortran, bool):
        raise ValueError(f"the .npy header's fortran_order is not a bool: {fortran!r}")
    try:
        dtype = npy_format.descr_to_dtype(header["descr"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the .npy header's descr is not a dtype: {exc}") from None
    return shape, fortran, dtype


def _read_exact(fh, nbytes: int) -> bytes:
    data = fh.read(nbytes)  # a zip member's read(n) returns n bytes unless the member ends first
    if len(data) < nbytes:
        raise EOFError("the data ends before the size its header declares")
    return data


def open_source(src: str) -> Source:
    """The .npy members of the archive at ``src``, by name."""
    if not zipfile.is_zipfile(src):
        raise StoreError(f"'{src}' is not an .npz archive (a zip of .npy arrays, as numpy.savez writes)")
    try:
        zf = zipfile.ZipFile(src)
    except _READ_ERRORS as exc:
        raise StoreError(f"cannot read '{src}': {exc}") from None
    try:
        arrays = {info.filename[:-4]: Member(zf, info, info.filename[:-4], src)
                  for info in zf.infolist() if info.filename.endswith(".npy")}
    except BaseException:
        zf.close()
        raise
    return Source(src, f"{os.path.basename(src)} (.npz)", arrays, close=zf.close)
