"""Ranked lists (docs/ranked-lists.md): per query its top-k gallery rows in key order, the
positives' ranks, and the worst and best queries, from the state of the one scoring pass.

* :class:`Spec` (``ranked_list=K``, ``trial``, ``with_junk``): what the pass keeps, the ``topk``
  statistic (``statistics.topk``): the k smallest kept negatives of the trial, and with junk the k
  smallest excluded rows.  It decides a saved state's arrays, so it is one of the ``Settings``.
* :class:`Selection` (``queries``, ``sort_by``, ``with_positives``): which queries are written and
  how; it changes no state.
* :func:`finalise`: state -> :class:`RankedLists`.  The kept top-k is the k smallest of the listed
  negatives and the trial's positives (exact: both come with canonical distances); the positives'
  ranks r_i = i + c_i come from the slot counts; excluded rows before the k-th kept row are shown
  in place, without a rank.
* Output: JSON lines, one record per selected query (:meth:`RankedLists.records`), or a zarr group
  (a ``.zarr`` path) with the same content as arrays indexed by the selected queries' position;
  :func:`read_records` reads either back.

Nothing here runs unless ranked lists are asked for.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ...core import outputs
from ...core.choices import check_range, is_integer, record_values
from ...core.errors import OptionError

RANKED_OPTIONS = ("ranked_list", "trial", "with_junk", "with_positives", "queries", "sort_by")
SPEC_KEYS = {"ranked_list": "k", "trial": "trial", "with_junk": "with_junk"}  # keyword -> Spec field
CLI_NAMES = {key: "--" + key.replace("_", "-") for key in RANKED_OPTIONS}
SORT_KEYS = ("ap", "inp", "rank")
MARKS = ("positive", "negative", "junk")  # codes 0, 1, 2; PAD marks no entry
POSITIVE, NEGATIVE, JUNK, PAD = 0, 1, 2, -1
SECTION_ROWS = 10  # worst and best queries listed in the result JSON
GROUP_FORMAT = 1  # of the zarr group's layout (attribute streameval_ranked)


@dataclass(frozen=True)
class Spec:
    """What the scoring pass keeps for ranked lists (docs/ranked-lists.md)."""

    k: int
    trial: int = 0
    with_junk: bool = False

    @classmethod
    def parse(cls, value, n_trials: int) -> "Spec | None":
        """None, a Spec, or its record (``to_record``), checked against the protocol's trials."""
        if value is None:
            return None
        if isinstance(value, Mapping):
            value = cls(*record_values(value, ("k", "trial", "with_junk"), "a ranked-list record"))
        check_range(value.k, "ranked_list", "ranked_list (--ranked-list)")
        if not is_integer(value.trial) or not 0 <= value.trial < n_trials:
            raise OptionError(f"trial (--trial) must be an integer from 0 to {n_trials - 1} (the protocol has "
                              f"{n_trials} trial{'s' if n_trials > 1 else ''}), got {value.trial!r}")
        if not isinstance(value.with_junk, bool):
            raise OptionError(f"with_junk must be true or false, got {value.with_junk!r}")
        return cls(int(value.k), int(value.trial), value.with_junk)

    def to_record(self) -> dict:
        return {"k": self.k, "trial": self.trial, "with_junk": self.with_junk}

    def statistic(self):
        from .statistic import TopK

        return TopK(self.k, self.trial, self.with_junk)


@dataclass(frozen=True)
class Selection:
    """Which queries' lists are written, in which order, and whether with every positive (5.3):
    ``queries`` as given (worst:N, best:N, ids:LIST, all), read into ``kind``, ``count``, ``ids``."""

    queries: str = "all"
    sort_by: str = "ap"
    with_positives: bool = False
    kind: str = "all"
    count: int | None = None
    ids: tuple | None = None

    @classmethod
    def parse(cls, queries="all", sort_by="ap", with_positives=False) -> "Selection":
        kind, _, value = str(queries).partition(":")
        count = ids = None
        if kind in ("worst", "best") and value.isdigit() and int(value) >= 1:
            count = int(value)
        elif kind == "ids" and all(item.strip().isdigit() for item in value.split(",")):
            ids = tuple(int(item) for item in value.split(","))
            if len(set(ids)) != len(ids):
                raise OptionError(f"queries (--queries) {queries!r} lists a query twice")
        elif queries != "all":
            raise OptionError("queries (--queries) must be worst:N, best:N (N >= 1), ids:LIST (query rows, "
                              f"comma-separated) or all, got {queries!r}")
        if sort_by not in SORT_KEYS:
            raise OptionError(f"sort_by (--sort-by) must be one of {', '.join(SORT_KEYS)}, got {sort_by!r}")
        if not isinstance(with_positives, bool):
            raise OptionError(f"with_positives must be true or false, got {with_positives!r}")
        return cls(queries, sort_by, with_positives, kind, count, ids)

    def check(self, n_queries: int) -> None:
        """Before any work: ids name query rows of the store."""
        if self.ids is not None and max(self.ids) >= n_queries:
            raise OptionError(f"queries (--queries) {self.queries!r} names query row {max(self.ids)}, but the store "
                              f"has {n_queries:,} queries (rows 0 to {n_queries - 1})")

    def rows(self, in_trial: np.ndarray, worst: np.ndarray, best: np.ndarray) -> np.ndarray:
        """The selected query rows, in the order written: worst / best (queries with positives
        only), the ids listed, or every query of the trial."""
        if self.kind in ("worst", "best"):
            return (worst if self.kind == "worst" else best)[:self.count]
        if self.ids is not None:
            return np.array(self.ids, dtype=np.int64)
        return np.flatnonzero(in_trial)


def request(options: dict, saved: dict | None = None) -> tuple[dict | None, Selection | None]:
    """Take the ranked-list keywords out of ``options``: (the Spec record for ``Settings.parse``,
    the Selection), or (None, None) when no ranked lists are asked for.  None values are absent;
    ``saved``: the Spec record of a saved state, which given keywords override (``update``)."""
    given = {key: options.pop(key) for key in RANKED_OPTIONS if key in options}
    given = {key: value for key, value in given.items() if value is not None}
    spec = {**(saved or {}), **{SPEC_KEYS[key]: value for key, value in given.items() if key in SPEC_KEYS}}
    if "k" not in spec:
        if given:
            raise OptionError(f"{', '.join(CLI_NAMES[key] for key in given)} only go with --ranked-list K "
                              "(ranked_list=K)")
        return None, None
    selection = Selection.parse(given.get("queries", "all"), given.get("sort_by", "ap"),
                                given.get("with_positives", False))
    return {"trial": 0, "with_junk": False, **spec}, selection


# --------------------------------------------------------------------------------------- finalising


def _ordered(key: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``rows`` by ascending ``key``, ties by query row."""
    return rows[np.lexsort((rows, key[rows]))]


def _positive_ranks(positives, slots: np.ndarray) -> np.ndarray:
    """r_i = i + c_i of every positive of a trial (``slots.restrict``'s layout)."""
    counts = positives.counts
    prefix = np.concatenate([[0], np.cumsum(slots)])
    before = prefix[1:] - np.repeat(prefix[positives.offsets[:-1]], counts)
    local = np.arange(slots.shape[0]) - np.repeat(positives.offsets[:-1], counts)
    return local + 1 + before


def _first_positives(positives, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(distances, gallery rows) of the first k positives of each of ``rows``, (n, k), padded inf."""
    d = np.full((rows.shape[0], k), np.inf)
    g = np.full((rows.shape[0], k), np.inf)
    shown = np.minimum(positives.counts[rows], k)
    query = np.repeat(np.arange(rows.shape[0]), shown)
    column = np.arange(query.shape[0]) - np.repeat(np.cumsum(shown) - shown, shown)
    at = positives.offsets[rows][query] + column
    d[query, column] = positives.dist[at]
    g[query, column] = positives.gidx[at]
    return d, g


def _all_positives(positives, slots: np.ndarray, rows: np.ndarray) -> dict:
    """Every positive of ``rows`` with its distance and rank, CSR over the rows (--with-positives)."""
    from ...engine.state import offsets_from_counts, segment_positions

    at = segment_positions(positives.offsets, rows)
    return {"offsets": offsets_from_counts(positives.counts[rows]), "gallery": positives.gidx[at],
            "distance": positives.dist[at], "rank": _positive_ranks(positives, slots)[at]}


def _sorted_by_key(d: np.ndarray, g: np.ndarray, *others) -> list:
    """Each row's entries in (distance, gallery row) order: ``d``, ``g`` and ``others`` rearranged alike."""
    order = np.lexsort((g, d), axis=-1)
    return [np.take_along_axis(a, order, axis=-1) for a in (d, g, *others)]


def _top(kept: np.ndarray, excluded: np.ndarray | None, pos_d: np.ndarray, pos_g: np.ndarray) -> dict:
    """The displayed lists of the selected queries, (n, L) arrays in key order: the k smallest kept
    rows (negatives and positives, ranked 1..k), then with junk the excluded rows before the k-th
    kept one (or all listed, when fewer than k rows are kept), rank 0 for none."""
    n, k = pos_d.shape
    marks = np.concatenate([np.full((n, k), NEGATIVE), np.full((n, k), POSITIVE)], axis=1)
    d, g, mark = _sorted_by_key(np.concatenate([kept[..., 0], pos_d], axis=1),
                                np.concatenate([kept[..., 1], pos_g], axis=1), marks)
    d, g, mark = d[:, :k], g[:, :k], mark[:, :k]
    rank = np.where(np.isfinite(d), np.arange(1, k + 1), 0)
    if excluded is not None:
        last_d, last_g = d[:, -1:], g[:, -1:]
        before = (excluded[..., 0] < last_d) | ((excluded[..., 0] == last_d) & (excluded[..., 1] < last_g))
        junk_d = np.where(before, excluded[..., 0], np.inf)
        junk_g = np.where(before, excluded[..., 1], np.inf)
        d, g, mark, rank = _sorted_by_key(np.concatenate([d, junk_d], axis=1), np.concatenate([g, junk_g], axis=1),
                                          np.concatenate([mark, np.full((n, k), JUNK)], axis=1),
                                          np.concatenate([rank, np.zeros((n, k), dtype=rank.dtype)], axis=1))
    length = np.isfinite(d).sum(axis=1)
    width = int(length.max(initial=0))
    mark = np.where(np.isfinite(d), mark, PAD)[:, :width]
    return {"gallery": np.where(np.isfinite(g), g, -1).astype(np.int64)[:, :width], "distance": d[:, :width],
            "mark": mark.astype(np.int8), "rank": rank[:, :width].astype(np.int64), "length": length.astype(np.int64)}


def _row_facts(store, set_name: str, rows: np.ndarray) -> tuple:
    """(pids, camids, paths or None) of ``rows`` (sorted, unique) of a set."""
    from ...store import read_field
    from ...store.paths import read_paths

    fs = getattr(store, set_name)
    return (np.asarray(read_field(fs, "pids", rows), np.int64), np.asarray(read_field(fs, "camids", rows), np.int64),
            read_paths(store, set_name, rows))


def _gallery_facts(store, rows: np.ndarray) -> tuple:
    """(pids, camids, paths or None) of extended gallery rows: the stored gallery's, then the query
    copies' (rows n_gallery + i, with queries in the gallery)."""
    rows = np.unique(rows)
    n_stored = len(store.gallery)
    parts = [_row_facts(store, "gallery", rows[rows < n_stored]),
             _row_facts(store, "query", rows[rows >= n_stored] - n_stored)]
    pids, camids = (np.concatenate([p[i] for p in parts]) for i in (0, 1))
    paths = None
    if parts[0][2] is not None or parts[1][2] is not None:
        paths = [*(parts[0][2] or [None] * int((rows < n_stored).sum())),
                 *(parts[1][2] or [None] * int((rows >= n_stored).sum()))]
    return rows, pids, camids, paths


def finalise(store, settings, state, q_bits: np.ndarray, selection: Selection | None) -> "RankedLists":
    """The ranked lists of ``state`` (a ``QueryState`` with the ``topk`` statistic) for the
    settings' ``ranked`` Spec: the worst and best queries and the selected queries' lists."""
    from ..closed_set.metrics import query_values
    from ..dedup.statistic import dedup_ranks
    from ..closed_set.slots import restrict

    spec, selection = settings.ranked, selection or Selection()
    t, arrays = spec.trial, state.stats.arrays
    positives, slots = restrict(state.positives, arrays["slots/counts"], t)
    values = query_values(positives, slots)
    in_trial = ((q_bits >> np.uint64(t)) & np.uint64(1)).astype(bool)
    valid = np.flatnonzero(in_trial & (values["n_positives"] > 0))
    if settings.protocol.cmc == "identity-dedup":
        values["rho"] = dedup_ranks(arrays["dedup/held"], t)
    worst_key = {"ap": values["ap"], "inp": values["inp"], "rank": -values["first_hit_rank"]}[selection.sort_by]
    worst, best = _ordered(worst_key, valid), _ordered(-worst_key, valid)
    rows = selection.rows(in_trial, worst, best)

    pos_d, pos_g = _first_positives(positives, rows, spec.k)
    top = _top(arrays["topk/kept"][rows], arrays["topk/excluded"][rows] if spec.with_junk else None, pos_d, pos_g)
    listed = [top["gallery"][top["mark"] != PAD]]
    chosen = _all_positives(positives, slots, rows) if selection.with_positives else None
    if chosen is not None:
        listed.append(chosen["gallery"])
    q_pid, q_cam, q_paths = _row_facts(store, "query", np.sort(rows))
    unsort = np.argsort(np.argsort(rows))
    per_query = {"pid": q_pid[unsort], "camid": q_cam[unsort], "n_positives": values["n_positives"][rows],
                 **{name: values[name][rows] for name in ("ap", "ap_trapezoid", "inp", "first_hit_rank")},
                 "rho": values["rho"][rows] if "rho" in values else None,
                 "path": None if q_paths is None else [q_paths[i] for i in unsort]}
    return RankedLists(spec, selection, rows, per_query, top, chosen,
                       _gallery_facts(store, np.concatenate(listed).astype(np.int64)),
                       worst[:SECTION_ROWS].tolist(), best[:SECTION_ROWS].tolist())


def _number(value):
    """A float, or None for NaN (the metrics of a query without positives)."""
    value = float(value)
    return None if value != value else value


@dataclass
class RankedLists:
    """The ranked lists of the selected queries (``queries``, in selection order), as arrays; the
    records are made as they are read (``records``, ``__iter__``).  ``path``: where they were
    written (set by ``write``; relative to the result JSON's folder in the CLI)."""

    spec: Spec
    selection: Selection
    queries: np.ndarray
    per_query: dict  # pid, camid, n_positives, ap, ap_trapezoid, inp, first_hit_rank, rho, path
    top: dict  # (n, L): gallery, distance, mark, rank; (n,): length
    positives: dict | None  # CSR over the selected queries: offsets, gallery, distance, rank
    gallery: tuple  # (sorted extended rows, their pids, camids, paths or None)
    worst: list
    best: list
    path: str | None = field(default=None)

    def __len__(self) -> int:
        return int(self.queries.shape[0])

    def __iter__(self):
        return self.records()

    def section(self) -> dict:
        """The result JSON's ``ranked_list`` section."""
        return {"k": self.spec.k, "trial": self.spec.trial, "with_junk": self.spec.with_junk,
                "with_positives": self.selection.with_positives, "queries": self.selection.queries,
                "sort_by": self.selection.sort_by, "path": self.path, "worst": self.worst, "best": self.best}

    def _item(self, row: int) -> dict:
        rows, pids, camids, paths = self.gallery
        at = int(np.searchsorted(rows, row))
        return {"gallery": row, "pid": int(pids[at]), "camid": int(camids[at]),
                "path": None if paths is None else paths[at]}

    def record(self, n: int) -> dict:
        """The record of the n-th selected query (docs/ranked-lists.md)."""
        pq, top = self.per_query, self.top
        rank = int(pq["first_hit_rank"][n])
        out = {"query": int(self.queries[n]), "trial": self.spec.trial, "pid": int(pq["pid"][n]),
               "camid": int(pq["camid"][n]), "path": None if pq["path"] is None else pq["path"][n],
               "n_positives": int(pq["n_positives"][n]),
               **{name: _number(pq[name][n]) for name in ("ap", "ap_trapezoid", "inp")},
               "first_hit_rank": rank if rank > 0 else None,
               "rho": int(pq["rho"][n]) if pq["rho"] is not None and rank > 0 else None}
        out["top"] = [{**self._item(int(top["gallery"][n, m])), "distance": float(top["distance"][n, m]),
                       "mark": MARKS[top["mark"][n, m]], "rank": int(top["rank"][n, m]) or None}
                      for m in range(int(top["length"][n]))]
        if self.positives is not None:
            p = self.positives
            out["positives"] = [{**self._item(int(p["gallery"][m])), "distance": float(p["distance"][m]),
                                 "rank": int(p["rank"][m])} for m in range(p["offsets"][n], p["offsets"][n + 1])]
        return out

    def records(self):
        """One record per selected query, in selection order."""
        return (self.record(n) for n in range(len(self)))

    def write(self, path, overwrite: bool = False) -> None:
        """Write the records as JSON lines, or as a zarr group when ``path`` ends in ``.zarr``
        (``check_output`` first; ``overwrite`` replaces an existing output)."""
        check_output(path, overwrite)
        path = os.fspath(path)
        if _is_group(path):
            _write_group(self, path)
        elif path.endswith(".csv"):
            outputs.write_text(path, self.file_names(), "ranked lists")
        else:
            outputs.write_text(path, "".join(json.dumps(record) + "\n" for record in self.records()), "ranked lists")
        self.path = path

    def file_names(self) -> str:
        """The plain CSV of docs/ranked-lists.md#one-record-per-query-json-lines: per query its top-k in order, one line per item, with
        the query's and the item's image paths (empty without paths) and the item's mark."""
        import csv
        import io

        text = io.StringIO()
        writer = csv.writer(text, lineterminator="\n")
        writer.writerow(["query", "query_path", "position", "rank", "distance", "mark", "gallery", "gallery_path"])
        for record in self.records():
            for position, item in enumerate(record["top"], 1):
                writer.writerow([record["query"], record["path"] or "", position, item["rank"] or "",
                                 repr(item["distance"]), item["mark"], item["gallery"], item["path"] or ""])
        return text.getvalue()


# ----------------------------------------------------------------------------------------- outputs


def _is_group(path) -> bool:
    return os.fspath(path).rstrip("/").endswith(".zarr")


def output_path(ranked_list, ranked_out, json_path, overwrite: bool) -> str | None:
    """The CLI's ranked-lists output, checked before any work: ``--ranked-out``, or next to the
    ``--json`` file as ``<stem>.ranked.jsonl``; None without ``--ranked-list``."""
    if ranked_list is None:
        if ranked_out is not None:
            raise OptionError("--ranked-out only goes with --ranked-list K")
        return None
    path = ranked_out
    if path is None and json_path not in (None, "-"):
        path = os.path.splitext(os.fspath(json_path))[0] + ".ranked.jsonl"
    if path is None:
        raise OptionError("--ranked-list writes the lists to --ranked-out PATH (.jsonl, .csv, or a .zarr group), or next "
                          "to the --json file: give one of them")
    check_output(path, overwrite)
    return os.fspath(path)


def check_output(path, overwrite: bool) -> None:
    """Before any work: the lists can be written at ``path`` (a file, or a directory for .zarr)."""
    if os.fspath(path) == "-" or outputs.is_url(path):
        raise OptionError(f"ranked lists are written to a local file or .zarr folder, not '{os.fspath(path)}'")
    if _is_group(path):
        outputs.check_directory(path, overwrite, "ranked-lists group")
        outputs.refuse_foreign(path, "streameval_ranked", "ranked-lists group")
    else:
        outputs.check_file(path, overwrite, "ranked-lists file")


def write_output(result, path: str | None, json_path) -> "outputs.OutputError | None":
    """Write the result's lists to ``path`` (checked by ``output_path``) and name it in the result
    JSON relative to its folder when inside it.  Returns the error when they could not be written
    (the caller still writes the result JSON first)."""
    if path is None:
        return None
    lists = result.ranked_lists
    try:
        lists.write(path, overwrite=True)
    except outputs.OutputError as exc:
        return exc
    except OSError as exc:
        return outputs.OutputError(f"cannot write the ranked lists at '{path}': {exc.strerror or exc}")
    if json_path not in (None, "-"):
        folder, full = os.path.dirname(os.path.abspath(json_path)), os.path.abspath(path)
        if os.path.commonpath([folder, full]) == folder:
            lists.path = os.path.relpath(full, folder)
    return None


QUERY_COLUMNS = {"query": np.int64, "pid": np.int64, "camid": np.int64, "n_positives": np.int64, "ap": np.float64,
                 "ap_trapezoid": np.float64, "inp": np.float64, "first_hit_rank": np.int64, "rho": np.int64}
ITEM_COLUMNS = {"gallery": np.int64, "pid": np.int64, "camid": np.int64, "distance": np.float64, "mark": np.int8,
                "rank": np.int64}
NULLABLE = ("ap", "ap_trapezoid", "inp", "first_hit_rank", "rho", "rank", "path")  # null: NaN, -1 or ""


def _cell(name: str, value):
    """A record's value as an array element (null: NaN, -1 or ""; marks as their codes)."""
    if value is None:
        return {"path": "", "mark": PAD}.get(name, np.nan if name in ("ap", "ap_trapezoid", "inp") else -1)
    return MARKS.index(value) if name == "mark" else value


def _value(name: str, cell):
    """An array element as a record's value (``_cell`` undone)."""
    if name == "mark":
        return MARKS[int(cell)]
    if name == "path":
        return None if cell == "" else str(cell)
    value = float(cell) if isinstance(cell, np.floating) else int(cell)
    null = (value != value) if isinstance(value, float) else value == -1
    return None if name in NULLABLE and null else value


def _columns(lists: RankedLists) -> dict:
    """The group's arrays: per selected query (n,), per top entry (n, L) padded with the nulls, per
    positive (CSR by ``positives/offsets``); ``path`` arrays when the store has paths."""
    records = list(lists.records())
    with_paths = lists.per_query["path"] is not None or lists.gallery[3] is not None
    query_names = [*QUERY_COLUMNS, *(("path",) if with_paths else ())]
    item_names = [*ITEM_COLUMNS, *(("path",) if with_paths else ())]
    out = {name: np.array([_cell(name, r[name]) for r in records], dtype=QUERY_COLUMNS.get(name, object))
           for name in query_names}
    width = max((len(r["top"]) for r in records), default=0)
    for name in item_names:
        rows = [[_cell(name, e[name]) for e in r["top"]] + [_cell(name, None)] * (width - len(r["top"]))
                for r in records]
        out[f"top/{name}"] = np.array(rows, dtype=ITEM_COLUMNS.get(name, object)).reshape(len(records), width)
    if lists.positives is not None:
        out["positives/offsets"] = np.asarray(lists.positives["offsets"], dtype=np.int64)
        entries = [e for r in records for e in r["positives"]]
        for name in item_names:
            if name != "mark":
                out[f"positives/{name}"] = np.array([_cell(name, e[name]) for e in entries],
                                                    dtype=ITEM_COLUMNS.get(name, object))
    return out


def _write_group(lists: RankedLists, path: str) -> None:
    """The records as arrays (``_columns``), written beside ``path`` and moved into place."""
    import shutil

    import zarr

    tmp = outputs.create_beside(path, ".zarr", directory=True)
    try:
        group = zarr.open_group(tmp, mode="w")
        for name, data in _columns(lists).items():
            strings = data.dtype == object
            arr = group.create_array(name, shape=data.shape, dtype=str if strings else data.dtype,
                                     chunks=tuple(max(1, n) for n in data.shape))
            if data.size:
                arr[...] = data
        group.attrs.update({**lists.section(), "path": None, "streameval_ranked": GROUP_FORMAT})
        if os.path.isdir(path):
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_records(path) -> list[dict]:
    """The records of a ranked-lists output: a JSON-lines file or a ``.zarr`` group."""
    path = os.fspath(path)
    if not _is_group(path):
        with open(path) as fh:
            return [json.loads(line) for line in fh if line.strip()]
    import zarr

    group = zarr.open_group(path, mode="r")
    trial = group.attrs["trial"]
    arrays = {name: arr[...] for name, arr in group.arrays()}
    arrays.update({f"{sub}/{name}": arr[...] for sub in ("top", "positives") if sub in group
                   for name, arr in group[sub].arrays()})
    item_names = [name for name in (*ITEM_COLUMNS, "path") if f"top/{name}" in arrays]
    records = []
    for n in range(arrays["query"].shape[0]):
        record = {"query": int(arrays["query"][n]), "trial": trial}
        record.update({name: _value(name, arrays[name][n]) for name in (*QUERY_COLUMNS, "path") if name in arrays
                       and name != "query"})
        record.setdefault("path", None)
        record["top"] = [{"path": None, **{name: _value(name, arrays[f"top/{name}"][n, m]) for name in item_names}}
                         for m in range(arrays["top/mark"].shape[1]) if arrays["top/mark"][n, m] != PAD]
        if "positives/offsets" in arrays:
            lo, hi = arrays["positives/offsets"][n:n + 2]
            record["positives"] = [{"path": None, **{name: _value(name, arrays[f"positives/{name}"][m])
                                                     for name in item_names if name != "mark"}} for m in range(lo, hi)]
        records.append(record)
    return records
