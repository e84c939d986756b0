""".npy files, one array each, named by their file name (``qf.npy`` is ``qf``): given one by one or
as a folder.  Memory-mapped, so a block of rows reads just those rows."""

from __future__ import annotations

import os

import numpy as np

from ..core.errors import StoreError
from . import Source
from .arrays import MemoryArray


def open_files(paths, folder: str | None = None) -> Source:
    arrays, files = {}, {}
    for path in paths:
        name = os.path.splitext(os.path.basename(path))[0]
        if name in files:
            raise StoreError(f"two inputs give the array '{name}': '{files[name]}' and '{path}'")
        files[name] = path
        try:
            values = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise StoreError(f"cannot read '{path}' as a .npy file: {exc}") from None
        arrays[name] = MemoryArray(name, values)
    label = os.path.basename(folder.rstrip("/")) if folder else ", ".join(os.path.basename(path) for path in paths)
    return Source(folder or ", ".join(paths), f"{label} (.npy, memory-mapped)", arrays)
