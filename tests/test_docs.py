"""The worked example of docs/metrics.md shows what streameval computes, and the docs link up.

The example's tables are marked in the page (``<!-- docs-example: NAME -->`` ... ``<!--
/docs-example -->``).  The gallery table is the input: it is read, evaluated with the options the
page states, and every number of the results and curves tables must be what streameval returns
(as printed, to 4 decimals).  The "by hand" expressions must equal streameval's values too, and the
R / TP columns must be the counts a plain reading of the gallery table gives, so neither the page
nor the code can drift alone.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

import streameval

DOCS = Path(__file__).resolve().parents[1] / "docs"
METRICS_PAGE = DOCS / "metrics.md"
EVAL_OPTIONS = {"metric": "euclidean", "protocol": "market", "gom_norm": "none", "gom_bins": 10, "gom_b": 5}
JUNK_PID = -1  # streameval's default junk pid, as the page's gallery uses it
QUERY_COLUMN = re.compile(r"for query (\d+) \(pid (-?\d+), camera (-?\d+)\)")


def marked_table(text: str, name: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the Markdown table between the page's markers for ``name``."""
    block = re.search(rf"<!-- docs-example: {name} -->\n(.*?)<!-- /docs-example -->", text, re.S)
    assert block, f"docs/metrics.md lacks the marked table '{name}'"
    lines = [line.strip() for line in block.group(1).strip().splitlines()]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    assert set("".join(cells[1])) <= set("-:"), f"table '{name}': the second line must be the separator"
    return cells[0], cells[2:]


@pytest.fixture(scope="module")
def page() -> str:
    return METRICS_PAGE.read_text()


@pytest.fixture(scope="module")
def example(page):
    """The gallery table as arrays, the queries named in its header, and streameval's results."""
    header, rows = marked_table(page, "gallery")
    queries = [tuple(int(v) for v in QUERY_COLUMN.fullmatch(h).groups()) for h in header if QUERY_COLUMN.fullmatch(h)]
    assert [q[0] for q in queries] == list(range(len(queries)))
    assert [int(r[0]) for r in rows] == list(range(len(rows))), "gallery indices must be 0, 1, ..."
    arrays = dict(
        qf=np.zeros((len(queries), 1), dtype=np.float32),  # every query at the origin
        q_pids=np.array([q[1] for q in queries]), q_camids=np.array([q[2] for q in queries]),
        gf=np.array([[float(r[1])] for r in rows], dtype=np.float32),
        g_pids=np.array([int(r[2]) for r in rows]), g_camids=np.array([int(r[3]) for r in rows]),
    )
    roles = [[r[4 + k].split()[0] for r in rows] for k in range(len(queries))]
    results = {vp: streameval.evaluate(arrays, gom_vp=vp, **EVAL_OPTIONS) for vp in ("reference", "jaccard")}
    return arrays, roles, results


def test_page_states_the_options_it_was_computed_with(page):
    for name, value in EVAL_OPTIONS.items():
        assert f"`{name}={json.dumps(value)}`" in page


def test_gallery_roles_are_streamevals(example):
    """The page's positive / negative / junk labels: positives are what streameval counts, and the
    labels follow the market rule (junk pid, or same pid and same camera)."""
    arrays, roles, results = example
    n_positives = results["reference"].per_query["n_positives"]
    for k, query_roles in enumerate(roles):
        assert query_roles.count("positive") == n_positives[k]
        for g, role in enumerate(query_roles):
            same_pid = arrays["g_pids"][g] == arrays["q_pids"][k]
            junk = arrays["g_pids"][g] == JUNK_PID or (same_pid and arrays["g_camids"][g] == arrays["q_camids"][k])
            assert role == ("junk" if junk else "positive" if same_pid else "negative"), (k, g)


def closed_query_values(result) -> dict:
    per_query, gom = result.per_query, result.gom
    return {
        "first_hit_rank": per_query["first_hit_rank"][0], "AP": per_query["ap"][0],
        "AP trapezoid": per_query["ap_trapezoid"][0], "INP": per_query["inp"][0], "CMC@1": result.rank(1),
        "mReP_max": gom["mReP_max"], "tau_max": gom["tau_max"], "mVP_max": gom["mVP_max"], "MFR": gom["MFR"],
        "tau_nz": gom["tau_nz"],
    }


def shown(value) -> str:
    """A value as the page prints it: integers plain, the rest to 4 decimals."""
    return str(int(value)) if isinstance(value, (int, np.integer)) else f"{value:.4f}"


def test_results_table_is_what_streameval_returns(page, example):
    _, _, results = example
    values = closed_query_values(results["reference"])
    values.update({f"MREP ({vp})": result.gom["MREP"] for vp, result in results.items()})
    header, rows = marked_table(page, "results")
    assert header == ["value", "by hand", "streameval"]
    assert sorted(r[0] for r in rows) == sorted(values)
    for name, by_hand, printed in rows:
        assert printed == shown(values[name]), name
        if by_hand:
            assert eval(by_hand, {"__builtins__": {}, "sqrt": math.sqrt}) == pytest.approx(values[name], abs=1e-12), name


def counts(arrays, query: int, tau: float) -> tuple[int, int]:
    """(returned, returned positives) of one query at tau, read off the gallery as the page
    describes it: kept items with distance <= tau, junk only at tau = 1."""
    same_pid = arrays["g_pids"] == arrays["q_pids"][query]
    junk = (arrays["g_pids"] == JUNK_PID) | (same_pid & (arrays["g_camids"] == arrays["q_camids"][query]))
    returned = ~junk & (arrays["gf"][:, 0] <= tau)
    return int(returned.sum() + (junk.sum() if tau >= 1 else 0)), int((returned & same_pid).sum())


def test_curves_table_is_what_streameval_returns(page, example):
    arrays, _, results = example
    header, rows = marked_table(page, "curves")
    assert header == ["tau", "R", "TP", "RP", "VP reference", "ReP reference", "VP jaccard", "ReP jaccard", "R(Q−)", "FR"]
    reference, jaccard = results["reference"].gom, results["jaccard"].gom
    assert len(rows) == len(reference["tau"])
    n = int(results["reference"].per_query["n_positives"][0])
    last_rank = n / results["reference"].per_query["inp"][0]
    for i, row in enumerate(rows):
        tau = reference["tau"][i]
        returned, tp = counts(arrays, 0, tau)
        returned_open, _ = counts(arrays, 1, tau)
        assert row[:3] == [f"{tau:.1f}", str(returned), str(tp)]
        assert row[8] == str(returned_open)
        assert row[3:8] + row[9:] == [
            shown(reference["mRP"][i]), shown(reference["mVP"][i]), shown(reference["mReP"][i]),
            shown(jaccard["mVP"][i]), shown(jaccard["mReP"][i]), shown(reference["mFR"][i]),
        ], f"tau {tau}"
        # the page's formulas, applied to its own counts, give streameval's values
        assert reference["mVP"][i] == pytest.approx(tp / (min(returned, last_rank) - tp + n))
        assert jaccard["mVP"][i] == pytest.approx(tp / (returned - tp + n))
        assert reference["mFR"][i] == pytest.approx(min(returned_open, EVAL_OPTIONS["gom_b"]) / EVAL_OPTIONS["gom_b"])


def test_relative_links_point_to_existing_pages_and_headings():
    """Every link between the docs pages resolves: the file exists and so does the #heading."""
    for source in DOCS.glob("*.md"):
        for target, anchor in re.findall(r"\]\(([\w.-]*\.md)?(?:#([\w-]+))?\)", source.read_text()):
            page = source.parent / target if target else source
            assert page.exists(), f"{source.name} links to missing {target}"
            if anchor:
                assert anchor in {github_anchor(h) for h in re.findall(r"^#+ (.+)$", page.read_text(), re.M)}, \
                    f"{source.name} links to missing #{anchor} in {page.name}"


def github_anchor(heading: str) -> str:
    """The anchor GitHub makes of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_docs_cited_in_code_exist_with_their_headings():
    """Every page of docs/ (and heading, after a #) that the package, the scripts, the tests or the
    README cite exists: a citation is a link a reader can follow."""
    root = DOCS.parent
    sources = [*root.glob("streameval/**/*.py"), *root.glob("scripts/*.py"), *root.glob("tests/**/*.py"),
               root / "README.md"]
    # a page, then its anchors: "docs/verification.md#definitions, #how-it-is-computed"
    cited = {(page, anchors) for source in sources
             for page, anchors in re.findall(r"\bdocs/([\w/.-]+\.md)((?:#[\w-]+)(?:, #[\w-]+)*)?", source.read_text())}
    assert cited, "no docs/ citation found: the pattern no longer matches"
    for page, anchors in sorted(cited):
        assert (DOCS / page).is_file(), f"docs/{page} is cited but does not exist"
        headings = {github_anchor(h) for h in re.findall(r"^#+ (.+)$", (DOCS / page).read_text(), re.M)}
        for anchor in re.findall(r"#([\w-]+)", anchors):
            assert anchor in headings, f"docs/{page} has no heading #{anchor}"


def test_readme_and_cli_help_point_to_the_docs():
    readme = (DOCS.parent / "README.md").read_text()
    assert "docs/metrics.md" in readme and "docs/options.md" in readme
    from click.testing import CliRunner

    from streameval.cli import main

    assert "docs/metrics.md" in CliRunner().invoke(main, ["--help"]).output
