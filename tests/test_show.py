"""``streameval show``: the HTML page (and PNG grids) of ranked lists.

Ranked lists are computed here by brute force (docs/ranked-lists.md, market protocol) from a real
store made by ``synth --images`` and written in the JSON-lines record format, and the page is read
back with an HTML parser: one section per selected query, in order, each with the query and its
top-k (marks, ranks, distances, image files), the positives, or without image paths a table.  One
integration test runs the whole chain (synth, eval --ranked-list, show) and opens the page in
headless Chromium; it is skipped only when no Chromium or Chrome is installed.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import urllib.parse
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image as mpimage

from streameval.store import open_store, read_rows
from streameval.store.paths import read_paths

from cli_checks import cli, one_error_line

K = 4
SYNTH = ("--queries", 10, "--gallery", 90, "--dim", 8, "--ids", 6, "--cams", 3, "--junk", 0.1, "--distractors", 0.1,
         "--chunk-rows", 32, "-q")
GREEN, RED = (0x1a, 0x98, 0x50), (0xd7, 0x30, 0x27)  # the page's positive / negative borders
FRAME_PIXELS = (64 + 10) * (128 + 10) - 64 * 128  # a thumbnail's 5-pixel frame on the page


# ----------------------------------------------------------------------------- ranked lists by brute force


def brute_force_records(store_path, k=K, with_junk=False, with_positives=False) -> list[dict]:
    """Every query's record (query order): float64 euclidean distances, ties by gallery row; market
    protocol (pid -1, and the query's pid in its own camera, are junk); ranks among kept rows; with
    junk, the first (at most k) junk rows before the k-th kept row in place."""
    store = open_store(store_path)
    qf, qp, qc = read_rows(store.query, slice(None), np.float64)
    gf, gp, gc = read_rows(store.gallery, slice(None), np.float64)
    records = []
    for q in range(len(qp)):
        d = np.sqrt(((gf - qf[q]) ** 2).sum(axis=1))
        order = np.lexsort((np.arange(len(d)), d))
        junk = (gp == -1) | ((gp == qp[q]) & (gc == qc[q]))
        positive = (gp == qp[q]) & ~junk
        kept = order[~junk[order]]
        hits = np.flatnonzero(positive[kept]) + 1
        top = []
        for g in order:
            if len([e for e in top if e["rank"]]) == k:
                break
            if junk[g] and (not with_junk or len([e for e in top if not e["rank"]]) == k):
                continue
            rank = None if junk[g] else int(np.flatnonzero(kept == g)[0]) + 1
            top.append({"gallery": int(g), "pid": int(gp[g]), "camid": int(gc[g]), "path": None,
                        "distance": float(d[g]), "mark": "junk" if junk[g] else "positive" if positive[g] else "negative",
                        "rank": rank})
        ap = float(np.mean(np.arange(1, len(hits) + 1) / hits)) if len(hits) else None
        record = {"query": q, "trial": 0, "pid": int(qp[q]), "camid": int(qc[q]), "path": None,
                  "n_positives": int(len(hits)), "ap": ap, "ap_trapezoid": None,
                  "inp": float(len(hits) / hits[-1]) if len(hits) else None,
                  "first_hit_rank": int(hits[0]) if len(hits) else None, "rho": None, "top": top}
        if with_positives:
            record["positives"] = [{"gallery": int(kept[r - 1]), "pid": int(gp[kept[r - 1]]),
                                    "camid": int(gc[kept[r - 1]]), "path": None, "distance": float(d[kept[r - 1]]),
                                    "rank": int(r)} for r in hits]
        records.append(record)
    return records


def write_lines(path, records) -> Path:
    Path(path).write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return Path(path)


# ----------------------------------------------------------------------------- reading the page back


class Page(HTMLParser):
    """The page's sections: per query its heading, entries (query first) and positives, each entry
    its mark, image src (None without), caption; or the cells of its table rows."""

    def __init__(self, text: str):
        super().__init__()
        self.sections, self._row, self._entry, self._text = [], None, None, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = (attrs.get("class") or "").split()
        if tag == "section":
            self.sections.append({"query": int(attrs["data-query"]), "heading": "", "entries": [], "positives": []})
        elif tag in ("div", "table") and {"ranked", "positives"} & set(classes):
            self._row = "positives" if "positives" in classes else "entries"
        elif tag in ("figure", "tr") and "entry" in classes:
            self._entry = {"mark": classes[1], "src": None, "text": []}
            self.sections[-1][self._row].append(self._entry)
        elif tag == "img" and self._entry is not None:
            self._entry["src"] = attrs["src"]
        elif tag == "h2":
            self._text = "heading"

    def handle_endtag(self, tag):
        if tag in ("figure", "tr"):
            self._entry = None
        elif tag == "h2":
            self._text = None

    def handle_data(self, data):
        if self._text == "heading":
            self.sections[-1]["heading"] += data
        elif self._entry is not None and data.strip():
            self._entry["text"].append(data.strip())


def page_of(path) -> Page:
    return Page(Path(path).read_text(encoding="utf-8"))


def image_file(page_path, src) -> Path:
    return (Path(page_path).parent / urllib.parse.unquote(src)).resolve()


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> Path:
    """people.zarr with images in pics/ (paths relative to the store's folder), plain.zarr without."""
    root = tmp_path_factory.mktemp("show")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        cli("synth", "people.zarr", "--images", "pics", *SYNTH)
        cli("synth", "plain.zarr", *SYNTH)
    finally:
        os.chdir(cwd)
    return root


@pytest.fixture
def work(stores, tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def show(*args, code=0):
    return cli("show", *args, code=code)


# ----------------------------------------------------------------------------- the page


def test_each_query_shows_its_image_then_its_top_k_with_marks_ranks_distances_and_images(stores, work):
    records = brute_force_records(stores / "people.zarr")
    source = write_lines(work / "lists.jsonl", records)
    show(source, "--store", stores / "people.zarr", "--out", work / "page.html")
    page = page_of(work / "page.html")
    assert [s["query"] for s in page.sections] == [r["query"] for r in records]  # the file's order
    gallery_paths = read_paths(open_store(stores / "people.zarr"), "gallery", slice(None))
    for section, record in zip(page.sections, records):
        query, *top = section["entries"]
        assert query["mark"] == "query" and len(top) == K == len(record["top"])
        assert image_file(work / "page.html", query["src"]) == stores / "pics" / "query" / f"{record['query']:06d}.png"
        assert f"pid {record['pid']}" in section["heading"] and f"camera {record['camid']}" in section["heading"]
        if record["ap"] is None:
            assert "no positive" in section["heading"]
        else:
            assert f"AP {record['ap']:.4f}" in section["heading"]
            assert f"first hit at rank {record['first_hit_rank']}" in section["heading"]
        for shown, entry in zip(top, record["top"]):
            assert shown["mark"] == entry["mark"]
            assert shown["text"][:2] == [f"rank {entry['rank']}", f"{entry['distance']:.4f}"]
            assert image_file(work / "page.html", shown["src"]) == (stores / gallery_paths[entry["gallery"]]).resolve()
            assert image_file(work / "page.html", shown["src"]).is_file()
    marks = {e["mark"] for s in page.sections for e in s["entries"]}
    assert {"positive", "negative"} <= marks


def test_junk_in_place_and_the_positives_row(stores, work):
    records = brute_force_records(stores / "people.zarr", with_junk=True, with_positives=True)
    assert any(e["mark"] == "junk" for r in records for e in r["top"])  # the fixture has junk before rank K
    show(write_lines(work / "lists.jsonl", records), "--store", stores / "people.zarr", "--out", work / "page.html")
    for section, record in zip(page_of(work / "page.html").sections, records):
        top = section["entries"][1:]
        assert [e["mark"] for e in top] == [e["mark"] for e in record["top"]]
        assert [e["text"][0] for e in top if e["mark"] == "junk"] == ["junk"] * sum(
            e["mark"] == "junk" for e in record["top"])
        assert [e["text"][:2] for e in section["positives"]] == [
            [f"rank {p['rank']}", f"{p['distance']:.4f}"] for p in record["positives"]]
        assert all(e["mark"] == "positive" and e["src"] for e in section["positives"])


@pytest.mark.parametrize("queries", ["worst:3", "best:2", "ids:7,2,5", "all"])
def test_queries_are_chosen_and_ordered_as_asked(stores, work, queries):
    records = brute_force_records(stores / "people.zarr")
    show(write_lines(work / "lists.jsonl", records), "--store", stores / "people.zarr", "--queries", queries)
    shown = [s["query"] for s in page_of(work / "lists.html").sections]
    scored = [r for r in records if r["ap"] is not None]
    kind, _, value = queries.partition(":")
    expected = {
        "worst": [r["query"] for r in sorted(scored, key=lambda r: (r["ap"], r["query"]))][:3],
        "best": [r["query"] for r in sorted(scored, key=lambda r: (-r["ap"], r["query"]))][:2],
        "ids": [7, 2, 5],
        "all": [r["query"] for r in records],
    }[kind]
    assert shown == expected


def test_without_image_paths_each_query_gets_a_table_of_ids_and_distances(stores, work):
    records = brute_force_records(stores / "plain.zarr", with_positives=True)
    result = show(write_lines(work / "lists.jsonl", records), "--store", stores / "plain.zarr")
    assert "tables of ids and distances" in result.output
    text = (work / "lists.html").read_text()
    assert "<img" not in text
    for section, record in zip(page_of(work / "lists.html").sections, records):
        query, *top = section["entries"]
        assert query["text"][:3] == ["query", f"{record['query']} (query)", str(record["pid"])]
        assert [e["text"] for e in top] == [
            [f"rank {e['rank']}", str(e["gallery"]), str(e["pid"]), str(e["camid"]), f"{e['distance']:.4f}", e["mark"]]
            for e in record["top"]]
        assert [e["text"][0] for e in section["positives"]] == [f"rank {p['rank']}" for p in record["positives"]]


def test_paths_in_the_records_need_no_store_and_start_from_the_image_root(stores, work):
    records = brute_force_records(stores / "people.zarr")[:2]
    store = open_store(stores / "people.zarr")
    for record in records:
        record["path"] = read_paths(store, "query", [record["query"]])[0]
        for entry in record["top"]:
            entry["path"] = read_paths(store, "gallery", [entry["gallery"]])[0]
    show(write_lines(work / "lists.jsonl", records), "--image-root", stores)
    srcs = [e["src"] for s in page_of(work / "lists.html").sections for e in s["entries"]]
    assert len(srcs) == 2 * (K + 1) and all(image_file(work / "lists.html", src).is_file() for src in srcs)
    result = show(work / "lists.jsonl", "--overwrite")  # relative to the current folder: not there
    assert "image files do not exist" in result.stderr


def test_every_text_is_escaped(stores, work):
    record = brute_force_records(stores / "people.zarr")[0]
    odd = work / 'odd <b>&"\' dir'
    odd.mkdir()
    shutil.copy(stores / "pics" / "query" / "000000.png", odd / "q <i>&.png")
    record["path"] = str(odd / "q <i>&.png")
    source = write_lines(work / "<b>lists&.jsonl", [record])
    show(source, "--out", work / "page.html")
    text = (work / "page.html").read_text()
    assert "<b>" not in text and "<i>" not in text and "&lt;b&gt;lists&amp;.jsonl" in text
    query = page_of(work / "page.html").sections[0]["entries"][0]
    assert image_file(work / "page.html", query["src"]) == odd / "q <i>&.png"


def test_a_result_json_leads_to_its_lists_and_bad_input_is_one_line(stores, work):
    write_lines(work / "r.ranked.jsonl", brute_force_records(stores / "people.zarr")[:3])
    (work / "r.json").write_text(json.dumps({"mAP": 0.5, "ranked_list": {"k": K, "trial": 0, "path": "r.ranked.jsonl"}}))
    assert "3 queries" in show(work / "r.json", "--store", stores / "people.zarr").output
    assert len(page_of(work / "r.html").sections) == 3
    (work / "plain.json").write_text(json.dumps({"mAP": 0.5}))
    assert "--ranked-list K" in one_error_line(show(work / "plain.json", code=3))
    lines = (work / "r.ranked.jsonl").read_text().splitlines()
    for broken, says in [(lines[0] + "\n{", "line 2 is not JSON"),
                         (lines[0].replace('"negative"', '"maybe"', 1), "mark 'maybe'"),
                         (lines[0].replace('"pid": ', '"pid": "x", "_": ', 1), "'pid' is 'x', expected int")]:
        (work / "bad.jsonl").write_text(broken + "\n")
        assert says in one_error_line(show(work / "bad.jsonl", "--overwrite", code=3))
    assert "not in the ranked lists" in one_error_line(show(work / "r.json", "--queries", "ids:9", "--overwrite",
                                                            code=2))


def test_lists_written_as_a_zarr_group_show_as_the_json_lines_do(stores, work):
    cli("eval", stores / "people.zarr", "--ranked-list", 3, "--with-junk", "--with-positives", "--ranked-out",
        work / "lists.zarr", "--json", work / "r.json", "-q")
    show(work / "r.json", "--out", work / "from-result.html", "--image-root", stores)
    show(work / "lists.zarr", "--store", stores / "people.zarr")
    expected = brute_force_records(stores / "people.zarr", k=3, with_junk=True, with_positives=True)
    by_query = {record["query"]: record for record in expected}
    for page in (work / "from-result.html", work / "lists.html"):
        sections = page_of(page).sections
        assert sorted(s["query"] for s in sections) == sorted(by_query)  # --queries all: every query
        for section in sections:
            record = by_query[section["query"]]
            assert [e["mark"] for e in section["entries"][1:]] == [e["mark"] for e in record["top"]]
            assert len(section["positives"]) == len(record["positives"])
            assert all(image_file(page, e["src"]).is_file() for e in section["entries"] + section["positives"])


def test_lists_of_another_store_get_no_images_from_this_one(stores, work):
    records = brute_force_records(stores / "people.zarr")[:2]
    records[1]["top"][2]["pid"] += 1
    source = write_lines(work / "lists.jsonl", records)
    error = one_error_line(show(source, "--store", stores / "people.zarr", code=3))
    assert f"gallery row {records[1]['top'][2]['gallery']} has pid {records[1]['top'][2]['pid']}" in error
    records[1]["top"][2]["gallery"] = 90 + 10  # past the gallery, then past the queries' copies
    write_lines(source, records)
    assert "name query row 10 but" in one_error_line(show(source, "--store", stores / "people.zarr", code=3))
    assert not (work / "lists.html").exists()


def test_outputs_are_checked_before_any_work(stores, work):
    source = write_lines(work / "lists.jsonl", brute_force_records(stores / "people.zarr")[:2])
    (work / "lists.html").write_text("mine")
    assert "--overwrite" in one_error_line(show(source, code=2))
    assert (work / "lists.html").read_text() == "mine"
    assert "does not exist" in one_error_line(show(source, "--out", work / "no" / "p.html", code=2))
    assert "would replace the ranked lists" in one_error_line(show(source, "--out", source, "--overwrite", code=2))
    (work / "grids").mkdir()
    assert "already exists" in one_error_line(show(source, "--out", work / "new.html", "--png", work / "grids",
                                                   code=2))
    assert not (work / "new.html").exists()
    assert "worst:N" in one_error_line(show(source, "--queries", "worst:0", "--out", work / "new.html", code=2))


def test_png_grids_one_per_query_with_coloured_frames(stores, work):
    records = brute_force_records(stores / "people.zarr", with_positives=True)
    source = write_lines(work / "lists.jsonl", records)
    assert "3 PNG grids" in show(source, "--store", stores / "people.zarr", "--queries", "worst:3", "--png",
                                 work / "grids").output
    worst = sorted((r for r in records if r["ap"] is not None), key=lambda r: (r["ap"], r["query"]))[:3]
    names = sorted(os.listdir(work / "grids"))
    assert names == [f"{n:03d}-query{r['query']}.png" for n, r in enumerate(worst, 1)]
    for name, record in zip(names, worst):
        pixels = np.round(mpimage.imread(work / "grids" / name)[..., :3] * 255).astype(int)
        for colour, mark in ((GREEN, "positive"), (RED, "negative")):
            present = (np.abs(pixels - colour).max(axis=-1) <= 2).sum() > 100
            marks = [e["mark"] for e in record["top"]] + ["positive"] * len(record["positives"])
            assert present == (mark in marks), (name, mark)


# ----------------------------------------------------------------------------- in a real browser


BROWSER = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome") if shutil.which(name)),
               None)


def browse(page: Path, tmp_path: Path, *args: str) -> str:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'browser-profile'}"]
    proc = subprocess.run([BROWSER, *flags, *args, page.resolve().as_uri()], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.skipif(BROWSER is None, reason="no chromium, chromium-browser or google-chrome installed")
def test_synth_eval_show_opens_in_chromium_with_every_ranked_image_loaded(stores, work):
    """The README's chain: synth --images, eval --ranked-list, show; then the page in headless Chromium."""
    cli("eval", stores / "people.zarr", "--ranked-list", K, "--queries", "worst:5", "--json", work / "r.json", "-q")
    records = [json.loads(line) for line in (work / "r.ranked.jsonl").read_text().splitlines()]
    assert [r["query"] for r in records] == json.loads((work / "r.json").read_text())["ranked_list"]["worst"][:5]
    show(work / "r.json", "--store", stores / "people.zarr", "--png", work / "grids")
    assert len(os.listdir(work / "grids")) == 5

    text = browse(work / "r.html", work, "--dump-dom")  # the DOM after the page's scripts ran
    dom = Page(text)
    expected = sum(1 + len(record["top"]) for record in records)
    assert len(records) == 5 and expected == 5 * (K + 1)
    assert [s["query"] for s in dom.sections] == [r["query"] for r in records]
    assert sum(len(s["entries"]) for s in dom.sections) == expected
    assert f'data-images-loaded="{expected}"' in text and text.count('data-loaded="yes"') == expected

    shot = work / "shot.png"  # tall enough for the five rows
    browse(work / "r.html", work, f"--screenshot={shot}", "--window-size=1000,1400", "--hide-scrollbars")
    pixels = np.round(mpimage.imread(shot)[..., :3] * 255).astype(int)
    assert pixels.shape == (1400, 1000, 3)
    assert (pixels.min(axis=-1) < 250).mean() > 0.05  # not blank: images, borders and text
    for colour, mark in ((GREEN, "positive"), (RED, "negative")):  # one frame per entry of that mark, plus the
        drawn = (np.abs(pixels - colour).max(axis=-1) <= 2).sum()  # legend's (a thinner, shorter frame)
        frames = sum(entry["mark"] == mark for record in records for entry in record["top"])
        assert frames > 0 and drawn // FRAME_PIXELS == frames, (mark, drawn, frames)


COLUMN_PLACES = """<script>
addEventListener("load", () => {  // per table: the left edge and width of its header and of each row's cells
  const edges = cells => Array.from(cells, c => [Math.round(c.getBoundingClientRect().left),
                                                 Math.round(c.getBoundingClientRect().width)]);
  document.body.dataset.columns = JSON.stringify(Array.from(document.querySelectorAll("table"), table => ({
    head: edges(table.querySelectorAll("thead th")),
    rows: Array.from(table.querySelectorAll("tbody tr"), row => edges(row.cells))})));
});
</script>"""


@pytest.mark.skipif(BROWSER is None, reason="no chromium, chromium-browser or google-chrome installed")
def test_a_tables_headers_stand_over_their_columns_in_chromium(stores, work):
    """Without image paths: every header cell has the place and width of the cells under it."""
    records = brute_force_records(stores / "plain.zarr", with_positives=True)[:3]
    show(write_lines(work / "lists.jsonl", records), "--store", stores / "plain.zarr")
    measured = work / "measured.html"  # the page, plus a script reading where the browser put each cell
    measured.write_text((work / "lists.html").read_text(encoding="utf-8").replace("</body>", COLUMN_PLACES + "</body>"),
                        encoding="utf-8")
    text = browse(measured, work, "--dump-dom", "--window-size=1200,900")
    tables = json.loads(html.unescape(re.search(r'data-columns="([^"]*)"', text).group(1)))
    assert len(tables) == sum(1 + ("positives" in record) for record in records)  # top-k, and positives
    for table in tables:
        assert len(table["head"]) == 6 and table["rows"]
        assert all(row == table["head"] for row in table["rows"])
