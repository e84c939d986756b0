"""``streameval show``: ranked lists (``eval --ranked-list K``) as a static HTML page, and as PNG
grids with matplotlib.

One row per selected query, in the order of the ranked-list file (worst first, as ``eval`` selects
them) or as ``--queries`` picks them: the query image with its pid, camera, AP and first-hit rank,
then its top-k with rank, distance and a border, green = positive, red = negative, grey = junk;
under it, when the records hold them (``--with-positives``), every positive in rank order.  Without
image paths (neither in the records nor in the store) each query gets a table of ids and distances
instead.

The page is one HTML file that refers to the images by their path relative to the page (nothing is
copied or embedded: the page stays small whatever the images, and shows them at full quality while
the page and the images keep their places).  A small script marks every image that loaded
(``data-loaded``) and names the ones that did not at the top of the page.

Image paths come from the records, else from the store (``store.paths``); relative ones are relative
to ``--image-root``, by default the folder holding the store (where ``synth --images`` and the
readers record them relative to), else the current folder.  The store is opened only when some
record lacks a path.
"""

from __future__ import annotations

import heapq
import html
import json
import os
import urllib.parse

from ..core.errors import OptionError, StoreError
from ..core.extras import require_extra
from ..core.outputs import replace_file, write_text

MARKS = ("positive", "negative", "junk")
COLOURS = {"positive": "#1a9850", "negative": "#d73027", "junk": "#9e9e9e", "query": "#2b2b2b"}


# ---------------------------------------------------------------- reading the ranked lists


def ranked_list_source(path: str) -> tuple[str, dict]:
    """The ranked lists of ``path`` (a result JSON with a "ranked_list" section, or the lists
    themselves: a JSON-lines file or a ``.zarr`` group) and the section ({} for the lists)."""
    if os.path.isdir(path):
        return path, {}
    try:
        with open(path, encoding="utf-8") as fh:
            first = fh.readline()
            if _is_record(first):
                return path, {}
            result = json.loads(first + fh.read())
    except (OSError, UnicodeDecodeError) as exc:
        raise StoreError(f"cannot read '{path}': {exc}") from None
    except ValueError:
        raise StoreError(f"'{path}' is neither a result JSON nor a ranked-list JSON-lines file") from None
    section = result.get("ranked_list") if isinstance(result, dict) else None
    if not isinstance(section, dict) or not isinstance(section.get("path"), str):
        raise StoreError(f"'{path}' holds no ranked lists: evaluate with --ranked-list K, e.g. "
                         f"'streameval eval STORE --ranked-list 10 --json {os.path.basename(path)}'")
    return os.path.join(os.path.dirname(path), section["path"]), section


def _is_record(line: str) -> bool:
    try:
        value = json.loads(line)
    except ValueError:
        return False
    return isinstance(value, dict) and "query" in value and "top" in value


def read_records(path: str):
    """Yield the records of a ranked-list output (JSON lines, or a ``.zarr`` group read by
    ``ranked.read_records``), each checked (``check_record``)."""
    if os.path.isdir(path):
        from ..features.ranked.finalise import read_records as read_group

        for number, record in enumerate(read_group(path)):
            yield check_record(record, f"'{path}' query {number}")
        return
    if path.endswith(".csv"):
        raise StoreError(f"'{path}' is the plain CSV of file names; show reads the ranked lists written as JSON lines "
                         "(.jsonl) or a .zarr group (eval --ranked-out)")
    try:
        with open(path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if line.strip():
                    yield check_record(_parse(line, path, number), f"'{path}' line {number}")
    except (OSError, UnicodeDecodeError) as exc:
        raise StoreError(f"cannot read the ranked lists '{path}': {exc}") from None


def _parse(line: str, path: str, number: int):
    try:
        return json.loads(line)
    except ValueError as exc:
        raise StoreError(f"'{path}' line {number} is not JSON ({exc})") from None


def check_record(record, where: str) -> dict:
    """A record as docs/ranked-lists.md#one-record-per-query-json-lines and the ranked-list format define it, or StoreError naming the
    first field that is not."""
    if not isinstance(record, dict):
        raise StoreError(f"{where}: expected a JSON object per query")
    _check_fields(record, where, {"query": "int", "pid": "int", "camid": "int", "path": "str?", "ap": "num?",
                                  "first_hit_rank": "int?", "n_positives": "int?", "inp": "num?", "rho": "int?"})
    if "top" not in record:
        raise StoreError(f"{where}: no 'top' list")
    for key in ("top", "positives"):
        items = record.get(key, [])
        if not isinstance(items, list):
            raise StoreError(f"{where}: '{key}' is not a list")
        for number, entry in enumerate(items):
            if not isinstance(entry, dict):
                raise StoreError(f"{where}: {key}[{number}] is not a JSON object")
            _check_fields(entry, f"{where}: {key}[{number}]", {"gallery": "int", "pid": "int", "camid": "int",
                                                              "distance": "num", "rank": "int?", "path": "str?"})
            if key == "top" and entry.get("mark") not in MARKS:
                raise StoreError(f"{where}: top[{number}] has mark {entry.get('mark')!r}, not one of {', '.join(MARKS)}")
    return record


def _check_fields(record: dict, where: str, kinds: dict) -> None:
    """``kinds``: key -> "int", "num" or "str", with "?" when the key may be absent or null."""
    for key, kind in kinds.items():
        value, optional, kind = record.get(key), kind.endswith("?"), kind.rstrip("?")
        if value is None and optional:
            continue
        if key not in record:
            raise StoreError(f"{where}: no '{key}'")
        types = {"int": int, "num": (int, float), "str": str}[kind]
        if isinstance(value, bool) or not isinstance(value, types):
            raise StoreError(f"{where}: '{key}' is {value!r}, expected {kind}" + (" or null" if optional else ""))


# ---------------------------------------------------------------- choosing the queries


def parse_queries(text: str | None) -> tuple[str, object]:
    """``worst:N`` | ``best:N`` | ``ids:LIST`` | ``all`` (None: all, in the file's order), read as
    ``eval --queries`` reads them: (kind, N or the rows or None)."""
    from ..features.ranked.finalise import Selection

    selection = Selection.parse("all" if text is None else text)
    return selection.kind, selection.count or selection.ids


def select(records, selection: tuple[str, object], source: str) -> list[dict]:
    """The records to show, in showing order.  worst / best: by AP (ascending / descending), ties by
    query row; queries without AP (no positive) are left out.  Memory: the selected records."""
    kind, value = selection
    if kind == "all":
        return list(records)
    if kind == "ids":
        wanted = {row: None for row in value}
        for record in records:
            if record["query"] in wanted and wanted[record["query"]] is None:
                wanted[record["query"]] = record
        missing = [row for row, record in wanted.items() if record is None]
        if missing:
            raise OptionError(f"--queries: query rows {', '.join(map(str, missing))} are not in the ranked lists of "
                              f"'{source}' (evaluate with --queries ids:... to have them)")
        return list(wanted.values())
    scored = (record for record in records if record.get("ap") is not None)
    sign = 1 if kind == "worst" else -1
    return heapq.nsmallest(value, scored, key=lambda record: (sign * record["ap"], record["query"]))


# ---------------------------------------------------------------- image files


def entries(record: dict):
    """The record's query, top-k and positives entries (each a dict with pid, camid, path...)."""
    return [record, *record["top"], *record.get("positives", ())]


def attach_files(shown: list[dict], store_path: str | None, image_root: str | None) -> None:
    """Give every entry a "file": its image file (absolute), or None when no path is known.  Paths
    missing from the records are read from the store."""
    if store_path is not None and any(entry.get("path") is None for record in shown for entry in entries(record)):
        _paths_from_store(shown, store_path)
    root = os.path.abspath(image_root or (os.path.dirname(os.path.abspath(store_path)) if store_path else "."))
    for record in shown:
        for entry in entries(record):
            path = entry.get("path")
            entry["file"] = None if path is None else os.path.normpath(os.path.join(root, path))


def _paths_from_store(shown: list[dict], store_path: str) -> None:
    """Fill the entries' missing paths from the store's query/gallery paths (extended gallery rows
    past the stored gallery are the queries' copies), after checking that the store's pids and
    cameras of those rows are the lists' (other lists would get other people's images)."""
    import numpy as np

    from ..store import open_store, read_field
    from ..store.paths import read_paths

    store = open_store(store_path)
    n_gallery = len(store.gallery)

    def set_row(record: dict, entry: dict) -> tuple[str, int]:
        if entry is record:
            return "query", record["query"]
        row = entry["gallery"]
        return ("gallery", row) if row < n_gallery else ("query", row - n_gallery)

    # (set, row) -> (pid, camid) as the lists say
    said = {set_row(record, entry): (entry["pid"], entry["camid"]) for record in shown for entry in entries(record)}
    found = {}
    for set_name in ("query", "gallery"):
        rows = np.array(sorted(row for name, row in said if name == set_name), dtype=np.int64)
        fs = getattr(store, set_name)
        if not rows.size:
            continue
        if rows[0] < 0 or rows[-1] >= len(fs):
            raise StoreError(f"the ranked lists name {set_name} row {rows[-1]} but '{store_path}' has {len(fs):,} "
                             f"{set_name} rows: were they computed from another store?")
        stored = zip(rows.tolist(), read_field(fs, "pids", rows).tolist(), read_field(fs, "camids", rows).tolist())
        for row, pid, camid in stored:
            if said[(set_name, row)] != (pid, camid):
                raise StoreError(f"the ranked lists do not match '{store_path}': {set_name} row {row} has pid "
                                 f"{said[(set_name, row)][0]}, camera {said[(set_name, row)][1]} in the lists, pid "
                                 f"{pid}, camera {camid} in the store")
        found.update(zip(((set_name, row) for row in rows.tolist()), read_paths(store, set_name, rows) or ()))
    for record in shown:
        for entry in entries(record):
            entry["path"] = entry.get("path") or found.get(set_row(record, entry))


# ---------------------------------------------------------------- the page


STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; background: #fff; }
h1 { font-size: 1.4em; margin: 0 0 .3em; }
h2 { font-size: 1.05em; margin: 1.2em 0 .4em; }
.about, .legend { color: #555; margin: .2em 0; }
.legend span { display: inline-block; padding: 0 .5em; margin-right: .5em; border: 3px solid; }
#broken { color: #b00; font-weight: bold; }
#broken:empty { display: none; }
div.ranked, div.positives { display: flex; flex-wrap: wrap; gap: 6px; align-items: flex-start; }
div.positives { margin-top: 6px; padding-top: 6px; border-top: 1px dashed #bbb; }
div.positives > .label { writing-mode: vertical-rl; transform: rotate(180deg); color: #555; font-size: 12px; }
figure { margin: 0; text-align: center; font-size: 11px; line-height: 1.25; width: 84px; }
figure img, figure .noimage { display: block; height: 128px; width: 64px; object-fit: contain; margin: 0 auto;
  border: 5px solid; box-sizing: content-box; background: #f4f4f4; }
figure .noimage { display: flex; align-items: center; justify-content: center; color: #777; }
figure.query img, figure.query .noimage { border-width: 5px; border-style: double; }
figure.query { margin-right: 12px; }
img.broken { outline: 2px dashed #b00; }
table { border-collapse: collapse; font-size: 13px; }
td, th { padding: 2px 8px; text-align: right; border-bottom: 1px solid #eee; }
td.mark { text-align: left; border-left: 6px solid; }
th.mark { text-align: left; border-left: 6px solid transparent; }
""" + "".join(f"""
figure.{mark} > img, figure.{mark} > .noimage, .legend .{mark} {{ border-color: {colour}; }}
tr.{mark} td.mark {{ border-left-color: {colour}; }}""" for mark, colour in COLOURS.items())

SCRIPT = """
addEventListener("load", () => {
  const images = Array.from(document.images);
  const loaded = images.filter(image => image.complete && image.naturalWidth > 0);
  images.forEach(image => {
    const ok = loaded.includes(image);
    image.dataset.loaded = ok ? "yes" : "no";
    if (!ok) image.classList.add("broken");
  });
  document.body.dataset.imagesLoaded = loaded.length;
  const missing = images.length - loaded.length;
  if (missing) document.getElementById("broken").textContent =
    missing + " of " + images.length + " images could not be loaded (dashed red outline)";
});
"""


def plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _text(value) -> str:
    return html.escape(str(value), quote=True)


def _number(value, digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def render_page(shown: list[dict], section: dict, source: str, page: str, with_images: bool) -> str:
    """The whole HTML page of the ``shown`` records (entries carry their "file" when
    ``with_images``); image sources relative to the folder of ``page``."""
    folder = os.path.dirname(os.path.abspath(page))
    k = section.get("k") or max(sum(entry.get("rank") is not None for entry in record["top"]) for record in shown)
    facts = [plural(len(shown), "query", "queries"), f"top-{k}", f"from {os.path.basename(source)}"]
    facts += [f"{name} {section[name]}" for name in ("trial", "queries", "sort_by") if section.get(name) is not None]
    legend = "".join(f'<span class="{mark}">{mark}</span>' for mark in MARKS)
    body = "\n".join(_query_block(number, record, folder, with_images) for number, record in enumerate(shown, 1))
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>streameval ranked lists: {_text(os.path.basename(source))}</title>
<style>{STYLE}</style>
</head>
<body data-images-loaded="0">
<h1>Ranked lists</h1>
<p class="about">{_text(" · ".join(facts))}</p>
<p class="legend">border: {legend} (query: double black)</p>
<p id="broken"></p>
{body}
<script>{SCRIPT}</script>
</body>
</html>
"""


HEADING_FACTS = {"first_hit_rank": "first hit at rank {}", "inp": "INP {:.4f}", "n_positives": "{} positives",
                 "rho": "rho {}"}  # a record's optional facts, in the heading when present


def _heading(number: int, record: dict) -> str:
    parts = [f"{number}. query {record['query']}", f"pid {record['pid']}", f"camera {record['camid']}",
             f"AP {_number(record.get('ap'))}" if record.get("ap") is not None else "no positive (no AP)"]
    parts += [text.format(record[key]) for key, text in HEADING_FACTS.items() if record.get(key) is not None]
    return " · ".join(parts)


def _query_block(number: int, record: dict, folder: str, with_images: bool) -> str:
    heading = f'<h2>{_text(_heading(number, record))}</h2>'
    if not with_images:
        return f'<section class="query" data-query="{record["query"]}">{heading}\n{_table(record)}</section>'
    query = _figure(record, "query", [f"query {record['query']}", f"pid {record['pid']} · cam {record['camid']}"],
                    folder)
    top = "".join(_figure(entry, entry["mark"], [_rank_text(entry), _number(entry["distance"]),
                                                 f"pid {entry['pid']} · cam {entry['camid']}"], folder)
                  for entry in record["top"])
    rows = f'<div class="ranked">{query}{top}</div>'
    if "positives" in record:
        positives = "".join(_figure(entry, "positive", [f"rank {entry['rank']}", _number(entry["distance"]),
                                                        f"cam {entry['camid']}"], folder)
                            for entry in record["positives"])
        rows += f'\n<div class="positives"><span class="label">positives</span>{positives}</div>'
    return f'<section class="query" data-query="{record["query"]}">{heading}\n{rows}</section>'


def _rank_text(entry: dict) -> str:
    return "junk" if entry.get("rank") is None else f"rank {entry['rank']}"


def _figure(entry: dict, mark: str, caption: list[str], folder: str) -> str:
    what = f"gallery row {entry['gallery']}" if "gallery" in entry else "query"
    alt = f"{what}, pid {entry['pid']}, camera {entry['camid']}"
    if entry.get("file") is None:
        image = f'<div class="noimage" title="{_text(alt)}">no image</div>'
    else:
        image = f'<img src="{_text(_url(entry["file"], folder))}" alt="{_text(alt)}" loading="eager">'
    lines = "<br>".join(_text(line) for line in caption)
    return f'<figure class="entry {mark}" data-mark="{mark}">{image}<figcaption>{lines}</figcaption></figure>'


def _url(file: str, folder: str) -> str:
    """The image's address from the page: relative when it can be, else a file URL."""
    try:
        relative = os.path.relpath(file, folder)
    except ValueError:  # another drive (Windows)
        return "file://" + urllib.parse.quote(os.path.abspath(file).replace(os.sep, "/"))
    return urllib.parse.quote(relative.replace(os.sep, "/"))


def _table(record: dict) -> str:
    head = ('<tr><th>rank</th><th>gallery row</th><th>pid</th><th>camera</th><th>distance</th>'
            '<th class="mark">mark</th></tr>')
    rows = [f'<tr class="entry query"><td>query</td><td>{record["query"]} (query)</td><td>{record["pid"]}</td>'
            f'<td>{record["camid"]}</td><td></td><td class="mark">query</td></tr>',
            *(_table_row(entry, entry["mark"], _rank_text(entry)) for entry in record["top"])]
    table = f'<table class="ranked"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'
    if "positives" in record:
        positives = "".join(_table_row(entry, "positive", f"rank {entry['rank']}") for entry in record["positives"])
        table += f'\n<p>positives</p><table class="positives"><thead>{head}</thead><tbody>{positives}</tbody></table>'
    return table


def _table_row(entry: dict, mark: str, rank: str) -> str:
    cells = [rank, entry["gallery"], entry["pid"], entry["camid"], _number(entry["distance"])]
    return (f'<tr class="entry {mark}">' + "".join(f"<td>{_text(cell)}</td>" for cell in cells)
            + f'<td class="mark">{mark}</td></tr>')


# ---------------------------------------------------------------- PNG grids


def png_name(number: int, record: dict) -> str:
    return f"{number:03d}-query{record['query']}.png"


def write_png_grids(shown: list[dict], folder: str) -> None:
    """One PNG per shown query (``png_name``): the query and its top-k in a row, the positives in a
    second row (as many as fit the width; the title says how many more)."""
    plt = _pyplot()
    for number, record in enumerate(shown, 1):
        columns = 1 + max(len(record["top"]), 1)
        positives = record.get("positives")
        rows = 2 if positives else 1
        fig, axes = plt.subplots(rows, columns, figsize=(1.15 * columns, 2.6 * rows), squeeze=False)
        _cell(axes[0][0], record, "query", f"query {record['query']}\npid {record['pid']} cam {record['camid']}")
        for ax, entry in zip(axes[0][1:], record["top"]):
            _cell(ax, entry, entry["mark"], f"{_rank_text(entry)}\n{_number(entry['distance'])}\npid {entry['pid']}")
        if positives:
            axes[1][0].set_axis_off()
            more = len(positives) - (columns - 1)
            axes[1][0].text(0.5, 0.5, "positives" + (f"\n(+{more} more)" if more > 0 else ""), ha="center",
                            va="center", transform=axes[1][0].transAxes, fontsize=8)
            for ax, entry in zip(axes[1][1:], positives):
                _cell(ax, entry, "positive", f"rank {entry['rank']}\n{_number(entry['distance'])}")
        for ax in axes.flat:
            if not ax.has_data() and not ax.texts and not ax.images:
                ax.set_axis_off()
        fig.suptitle(_heading(number, record), fontsize=8)
        fig.tight_layout()
        replace_file(os.path.join(folder, png_name(number, record)), lambda tmp, fig=fig: fig.savefig(tmp, dpi=100))
        plt.close(fig)


def _cell(ax, entry: dict, mark: str, title: str) -> None:
    """One image with a coloured frame (or a grey box saying why there is none)."""
    image = _image(entry.get("file"))
    if image is None:
        ax.text(0.5, 0.5, "no image" if entry.get("file") is None else "missing", ha="center", va="center",
                transform=ax.transAxes, fontsize=7, color="#777")
    else:
        ax.imshow(image)
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_edgecolor(COLOURS[mark])
        spine.set_linewidth(4)
    ax.set_title(title, fontsize=7)


def _image(file: str | None):
    if file is None:
        return None
    import matplotlib.image

    try:
        return matplotlib.image.imread(file)
    except (OSError, ValueError, SyntaxError):  # missing, unreadable or not an image PIL knows
        return None


def _pyplot():
    matplotlib = require_extra("matplotlib", package="matplotlib", extra="plot", purpose="--png", error=OptionError)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ---------------------------------------------------------------- the command


def default_page(result: str) -> str:
    """``r.json`` -> ``r.html`` beside it."""
    return os.path.splitext(result)[0] + ".html"


def show(result: str, *, store: str | None = None, out: str | None = None, png: str | None = None,
         queries: str | None = None, image_root: str | None = None) -> dict:
    """Write the page ``out`` (default ``default_page(result)``; and with ``png`` the PNG grids into
    that folder) for the ranked lists of ``result``.  Output paths are the caller's to check first
    (the CLI does).  Returns what the summary says: "page", "queries", "files" (image files named),
    "missing" (those that do not exist)."""
    selection = parse_queries(queries)
    if png is not None:
        _pyplot()  # before any work: a missing matplotlib is an error, not a half-done job
    page = out or default_page(result)
    source, section = ranked_list_source(result)
    if os.path.abspath(page) in (os.path.abspath(result), os.path.abspath(source)):
        raise OptionError(f"the page '{page}' would replace the ranked lists it shows; name another file")
    if not os.path.exists(source):
        raise StoreError(f"the ranked lists of '{result}' are not at '{source}' (moved or deleted?)")
    shown = select(read_records(source), selection, source)
    if not shown:
        raise StoreError(f"no query to show: '{source}' holds no ranked list"
                         + (" with an AP (worst/best leave out queries without positives)"
                            if selection[0] in ("worst", "best") else ""))
    attach_files(shown, store, image_root)
    files = [entry["file"] for record in shown for entry in entries(record) if entry["file"] is not None]
    write_text(page, render_page(shown, section, source, page, with_images=bool(files)), "page")
    if png is not None:
        os.makedirs(png, exist_ok=True)
        write_png_grids(shown, png)
    return {"page": page, "queries": len(shown), "files": len(files),
            "missing": [file for file in files if not os.path.isfile(file)]}
