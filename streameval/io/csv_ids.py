"""Ids of one set from a CSV file: a header line naming the columns, then one line per image, in
the order of the set's feature rows (or distance matrix rows / columns).

Columns (case and separators ignored; other columns are left alone): the person id (``pid``,
``pids``, ``person_id``, ``label``, ``id``, ``identity``), the camera (``camid``, ``camids``,
``cam``, ``cam_id``, ``camera``, ``camera_id``) and optionally the image path (``path``,
``image``, ``img``, ``file``, ``filename``, ``image_path``, ``img_path``).  Fields separated by
commas, tabs or semicolons (told from the header line).

The file is read once when opened (every line checked, rows counted, paths kept: a store's paths
are written whole) and ids are then read again a block of rows at a time, so memory holds a block
of ids, not the set's.
"""

from __future__ import annotations

import csv
import os
from itertools import islice

import numpy as np

from ..core.choices import INT64_MAX, INT64_MIN
from ..core.errors import StoreError
from . import normalise

COLUMNS = {
    "pid": ("pid", "pids", "person_id", "label", "id", "identity"),
    "camid": ("camid", "camids", "cam", "cam_id", "camera", "camera_id"),
    "path": ("path", "paths", "image", "img", "file", "filename", "image_path", "img_path"),
}


class CsvIds:
    """The pids, camids and paths (None without a path column) of one set."""

    def __init__(self, path: str, set_name: str):
        self.path, self.set_name = os.fspath(path), set_name
        if not os.path.isfile(self.path):
            raise StoreError(f"no {set_name} ids file at '{self.path}'")
        lines = self._lines()
        header = next(lines, None)
        if header is None:
            raise StoreError(f"'{self.path}' is empty; {set_name} ids need a header line (pid,camid[,path])")
        self.columns = self._columns(header[1])
        rows, paths = 0, [] if "path" in self.columns else None
        for line, fields in lines:
            self._ids(line, fields)
            if paths is not None:
                paths.append(fields[self.columns["path"]])
            rows += 1
        if rows == 0:
            raise StoreError(f"'{self.path}' holds a header but no {set_name} rows")
        self.rows, self.paths = rows, paths

    def _lines(self):
        """(line number, fields) of every non-blank line, the header first."""
        try:
            with open(self.path, newline="", encoding="utf-8-sig") as fh:
                first = fh.readline()
                try:
                    dialect = csv.Sniffer().sniff(first, delimiters=",\t;")
                except csv.Error:  # a single column: no separator to find
                    dialect = csv.excel
                fh.seek(0)
                for line, fields in enumerate(csv.reader(fh, dialect), start=1):
                    if fields:
                        yield line, fields
        except (OSError, UnicodeDecodeError, csv.Error) as exc:
            raise StoreError(f"cannot read '{self.path}': {exc}") from None

    def _columns(self, header: list) -> dict:
        names = [normalise(name) for name in header]
        columns = {}
        for column, accepted in COLUMNS.items():
            found = [i for i, name in enumerate(names) if name in accepted]
            if len(found) > 1:
                raise StoreError(f"'{self.path}': columns {', '.join(header[i] for i in found)} could each be the "
                                 f"{column}; keep one")
            if found:
                columns[column] = found[0]
            elif column != "path":
                raise StoreError(f"'{self.path}' has no {column} column (its header line: {','.join(header)}); "
                                 f"name it one of {', '.join(accepted)}")
        return columns

    def _ids(self, line: int, fields: list) -> tuple:
        if len(fields) <= max(self.columns.values()):
            raise StoreError(f"'{self.path}' line {line} has {len(fields)} fields, fewer than the header's")
        return tuple(self._integer(line, column, fields[self.columns[column]]) for column in ("pid", "camid"))

    def _integer(self, line: int, column: str, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise StoreError(f"'{self.path}' line {line}: {column} {text!r} is not an integer") from None
        if not INT64_MIN <= value <= INT64_MAX:
            raise StoreError(f"'{self.path}' line {line}: {column} {value} does not fit int64")
        return value

    def blocks(self, step: int):
        """(pids, camids) blocks of ``step`` rows, int64."""
        lines = islice(self._lines(), 1, None)
        while block := [self._ids(line, fields) for line, fields in islice(lines, step)]:
            yield np.array(block, dtype=np.int64).T

    def column(self, field: str) -> CsvColumn:
        return CsvColumn(self, field)


class CsvColumn:
    """The pids or the camids of a :class:`CsvIds`, in the array interface (package docstring)."""

    dtype = np.dtype(np.int64)

    def __init__(self, ids: CsvIds, field: str):
        self.ids, self.index = ids, ("pids", "camids").index(field)
        self.name = f"{os.path.basename(ids.path)}:{('pid', 'camid')[self.index]}"
        self.shape = (ids.rows,)

    def blocks(self, step: int):
        for block in self.ids.blocks(step):
            yield block[self.index]

    def whole(self) -> np.ndarray:
        return np.concatenate(list(self.blocks(1 << 16)))
