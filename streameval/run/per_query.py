"""The per-query table of a :class:`~streameval.run.result.Result`: one row per query (per trial and
query with trials or sgs repeats, per direction and query for regdb) with its ids from the store and
its per-query values, as ``Result.to_pandas()`` and ``--per-query-out FILE.csv|FILE.parquet`` give it
(docs/options.md#per-query-table).

The CSV is written with the csv module (no pandas needed); Parquet goes through pandas and pyarrow
(or fastparquet), which the CLI checks before any work.  Floats are written as Python's shortest
repr, so the CSV reads back to the very float64 values; a missing value (AP of a query without
positives) is an empty cell.  Imports nothing heavy: the CLI checks its output before the engine loads.
"""

from __future__ import annotations

import csv
import os

import numpy as np

from ..core import outputs
from ..core.errors import OptionError
from ..core.extras import require_extra

FORMATS = (".csv", ".parquet")
ID_COLUMNS = ("query", "pid", "camid")
VALUE_COLUMNS = ("ap", "ap_trapezoid", "inp", "first_hit_rank", "n_positives", "rho")  # rho: flavoured CMCs only
PANDAS = {"package": "pandas", "extra": "pandas"}


def columns(result) -> dict:
    """{column name: values (a numpy array, or a list of str for direction and path)}, every column
    as long as the table; the columns in the order of docs/options.md#per-query-table."""
    if result.queries is None:
        raise OptionError("this result holds no query ids (Result.queries); per-query tables come from evaluate, "
                          "update or a suite run")
    parts = [_part(done, name) for name, done in result.by_direction.items()] if result.by_direction \
        else [_part(result, None)]
    names = [name for name in _ORDER if any(name in part for part in parts)]
    return {name: _joined([part.get(name) for part in parts], [_rows(part) for part in parts]) for name in names}


_ORDER = ("trial", "direction", *ID_COLUMNS, "path", "in_trial", *VALUE_COLUMNS)


def _part(result, direction: str | None) -> dict:
    """The table of one direction: its trials (or repeats) one after the other, queries in store order."""
    queries, per_query = result.queries, result.per_query
    n_queries = queries["pid"].shape[0]
    n_trials = per_query["ap"].shape[0] if per_query["ap"].ndim == 2 else None
    repeat = n_trials or 1
    out = {"trial": None if n_trials is None else np.repeat(np.arange(n_trials, dtype=np.int64), n_queries),
           "direction": None if direction is None else [direction] * (repeat * n_queries),
           "query": np.tile(np.arange(n_queries, dtype=np.int64), repeat),
           "pid": np.tile(queries["pid"], repeat), "camid": np.tile(queries["camid"], repeat),
           "path": None if queries["path"] is None else list(queries["path"]) * repeat,
           "in_trial": None if n_trials is None else queries["in_trial"].reshape(-1),
           **{name: per_query[name].reshape(-1) for name in VALUE_COLUMNS if name in per_query}}
    return {name: values for name, values in out.items() if values is not None}


def _rows(part: dict) -> int:
    return len(part["query"])


def _joined(pieces: list, rows: list):
    """One column from the directions' pieces; a direction without it (paths of one set only) gets
    empty cells."""
    if len(pieces) == 1:
        return pieces[0]
    if any(piece is None or isinstance(piece, list) for piece in pieces):
        return [value for piece, n in zip(pieces, rows) for value in (piece if piece is not None else [None] * n)]
    return np.concatenate(pieces)


def to_pandas(result):
    """The table as a pandas DataFrame (pandas needed: the 'pandas' extra)."""
    pandas = require_extra("pandas", **PANDAS, purpose="Result.to_pandas()", error=OptionError)
    return pandas.DataFrame(columns(result))


def check_output(path, overwrite: bool) -> str | None:
    """Before any work: ``path`` (None: no table) is a local .csv or .parquet file that can be
    written, and Parquet's libraries are installed."""
    if path is None:
        return None
    path = os.fspath(path)
    suffix = os.path.splitext(path)[1].lower()
    if path == "-" or outputs.is_url(path) or suffix not in FORMATS:
        raise OptionError(f"--per-query-out writes a local .csv or .parquet file, not '{path}'")
    if suffix == ".parquet":
        _parquet_engine()
    outputs.check_file(path, overwrite, "--per-query-out file")
    return path


def _parquet_engine() -> None:
    """pandas and one of its Parquet engines (pyarrow, else fastparquet), or OptionError saying how
    to install them."""
    purpose = "--per-query-out FILE.parquet"
    require_extra("pandas", **PANDAS, purpose=purpose, error=OptionError)
    try:
        require_extra("pyarrow", package="pyarrow", extra="pandas", purpose=purpose, error=OptionError)
    except OptionError as missing:
        try:
            import fastparquet  # noqa: F401  (pandas' other Parquet engine)
        except ImportError:
            raise missing from None


def write(result, path: str | None) -> "outputs.OutputError | None":
    """Write the table to ``path`` (checked by ``check_output``; replaced atomically).  Returns the
    error when it could not be written (the caller still writes the result JSON and summary first)."""
    if path is None:
        return None
    table = columns(result)
    fill = _write_parquet if path.lower().endswith(".parquet") else _write_csv
    try:
        outputs.replace_file(path, lambda tmp: fill(table, tmp))
    except OSError as exc:
        return outputs.OutputError(f"cannot write the per-query table '{path}': {exc.strerror or exc}")
    return None


def _write_csv(table: dict, path: str) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(table)
        cells = [[_cell(value) for value in _values(values)] for values in table.values()]
        writer.writerows(zip(*cells))
        fh.flush()
        os.fsync(fh.fileno())


def _values(values) -> list:
    return values if isinstance(values, list) else values.tolist()


def _cell(value) -> str:
    """A CSV cell: floats as their shortest exact repr, NaN and None empty, booleans true/false."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def _write_parquet(table: dict, path: str) -> None:
    import pandas

    pandas.DataFrame(table).to_parquet(path, index=False)
