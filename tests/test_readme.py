"""Every recipe in the README runs as written.

Each ```python and ```bash block of README.md runs in a fresh directory, with the virtual
environment running these tests first on PATH: bash blocks line by line (each line must exit 0),
python blocks as typed at the prompt, each bare expression showing its value (must exit 0), the
numbers they show or print then recomputed another way (``CHECKS``).  A ``streameval eval`` /
``update`` line must also leave its result: the --json file (or JSON on stdout), or the summary
table.

A block that cannot run here carries a marker on the line before its opening fence::

    <!-- not run: needs a SLURM cluster -->

and is reported as skipped with that reason.  Every other block runs, so a recipe is tested from
the day it is written.

What a block's directory holds beforehand (what a reader brings):

    features.npz  a tiny problem: qf, q_pids, q_camids, gf, g_pids, g_camids
    feats.zarr    that problem as a store, unless the block makes it (``streameval convert ... feats.zarr``)
    today.npz     gallery rows to append: gf, g_pids, g_camids
    .venv         the environment running the tests (for ``source .venv/bin/activate``)

Python blocks also find the reader's own arrays under the names the README gives them (PRELUDE).
Arguments that would take minutes are replaced, only as listed in SUBSTITUTIONS.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import streameval

README = Path(__file__).resolve().parents[1] / "README.md"
MARKER = re.compile(r"<!--\s*not run:\s*(.*?)\s*-->")
FENCE = re.compile(r"```(\S*)")
RUN_LANGUAGES = ("python", "bash")
TIMEOUT_S = 120

SUBSTITUTIONS = {  # README text -> what runs here: a 2,000,000-row gallery takes minutes and 2 GB
    "--queries 10000 --gallery 2000000": "--queries 100 --gallery 2000",
}

PRELUDE = """\
import numpy as _np
with _np.load("features.npz") as _npz:
    qf, qp, qc, gf, gp, gc = (_npz[k] for k in ("qf", "q_pids", "q_camids", "gf", "g_pids", "g_camids"))
with _np.load("today.npz") as _npz:
    features, pids, camids = (_npz[k] for k in ("gf", "g_pids", "g_camids"))
del _np, _npz
"""


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence
    language: str
    code: str
    not_run: str | None  # the marker's reason


def readme_blocks(text: str) -> list[Block]:
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = FENCE.fullmatch(lines[i].strip())
        if not fence:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        assert end is not None, f"README line {i + 1}: code block never closed"
        before = next((line.strip() for line in reversed(lines[:i]) if line.strip()), "")
        marker = MARKER.fullmatch(before)
        blocks.append(Block(i + 1, fence.group(1), "\n".join(lines[i + 1:end]), marker and marker.group(1)))
        i = end + 1
    return blocks


README_TEXT = README.read_text()
BLOCKS = [b for b in readme_blocks(README_TEXT) if b.language in RUN_LANGUAGES]


def bash_lines(code: str) -> list[str]:
    """Commands of a bash block: continuation lines joined, blank and comment lines dropped."""
    commands = code.replace("\\\n", " ").splitlines()
    return [c for c in commands if c.strip() and not c.lstrip().startswith("#")]


def substituted(command: str) -> str:
    for text, replacement in SUBSTITUTIONS.items():
        command = command.replace(text, replacement)
    return command


def made_by(block: Block) -> set[str]:
    """Stores a bash block creates itself (so they must not exist before it runs)."""
    made = set()
    for command in bash_lines(block.code) if block.language == "bash" else ():
        words = shlex.split(command, comments=True)
        if words[:2] == ["streameval", "convert"]:
            made.add(words[3])
        elif words[:2] == ["streameval", "synth"]:
            made.add(words[2])
    return made


def tiny_problem(rng, n_query, n_gallery, n_ids=8, dim=8):
    """Clustered identities, close enough that not every rank-1 is a hit (a rank off by one shows in
    the numbers checked); a few open-set queries (pids past n_ids), pid 0 distractors, -1 junk."""
    centres = 2 * rng.standard_normal((n_ids + 3, dim))
    q_pids = np.concatenate([rng.integers(1, n_ids + 1, n_query - 3), [n_ids + 1, n_ids + 2, n_ids + 2]])
    g_pids = rng.choice(np.arange(-1, n_ids + 1), n_gallery)
    arrays = {"q_pids": q_pids, "q_camids": rng.integers(0, 3, n_query),
              "g_pids": g_pids, "g_camids": rng.integers(0, 3, n_gallery)}
    for features, pids in (("qf", q_pids), ("gf", g_pids)):
        arrays[features] = (centres[np.maximum(pids, 0)] + rng.standard_normal((len(pids), dim))).astype(np.float32)
    return arrays


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    rng = np.random.default_rng(0)
    root = tmp_path_factory.mktemp("readme-inputs")
    problem = tiny_problem(rng, 24, 300)
    np.savez(root / "features.npz", **problem)
    streameval.write_store(root / "feats.zarr", *(problem[k] for k in ("qf", "q_pids", "q_camids")),
                           *(problem[k] for k in ("gf", "g_pids", "g_camids")), chunk_rows=64)
    today = tiny_problem(rng, 3, 60)
    np.savez(root / "today.npz", **{k: today[k] for k in ("gf", "g_pids", "g_camids")})
    return root


def block_dir(block: Block, inputs: Path, tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    for entry in inputs.iterdir():
        if entry.name not in made_by(block):
            (shutil.copytree if entry.is_dir() else shutil.copy)(entry, work / entry.name)
    (work / ".venv").symlink_to(sys.prefix)
    return work


def environment() -> dict:
    """The environment running the tests first on PATH; no terminal, so nothing prompts."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def run(args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=environment(), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=TIMEOUT_S)


def check_result_left(words: list[str], proc, cwd: Path) -> None:
    """An eval / update line leaves its result: the --json file (or JSON on stdout or where stdout
    was redirected), or, without --json, the summary table."""
    if "--json" in words:
        target = words[words.index("--json") + 1]
        if target == "-":
            text = (cwd / words[words.index(">") + 1]).read_text() if ">" in words else proc.stdout
        else:
            text = (cwd / target).read_text()
        assert "mAP" in json.loads(text)
    elif not {"-q", "--quiet"} & set(words):
        assert "mAP" in proc.stdout


def run_bash(block: Block, cwd: Path) -> None:
    for command in map(substituted, bash_lines(block.code)):
        proc = run(["bash", "-c", "set -o pipefail\n" + command], cwd)
        assert proc.returncode == 0, (f"README line {block.line}: `{command}` exited {proc.returncode}\n"
                                      f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-2000:]}")
        words = shlex.split(command, comments=True)
        if words[:2] in (["streameval", "eval"], ["streameval", "update"]) and "--help" not in words:
            check_result_left(words, proc, cwd)


# A python block runs as the reader would type it at the prompt: each bare expression shows its value
# (what the README's comments describe).  Its check then runs, with ``shown`` (the text it showed and
# printed) and ``displayed`` (the values shown, in order).
REPL = """\
import ast, contextlib, io, sys
code, check = sys.argv[1:3]
namespace = {"__name__": "__main__"}
exec(%r, namespace)
displayed, show = [], sys.displayhook
def record(value):
    if value is not None:
        displayed.append(value)
    show(value)
sys.displayhook = record
shown = io.StringIO()
with contextlib.redirect_stdout(shown):
    for node in ast.parse(code).body:
        single = isinstance(node, ast.Expr)
        tree = ast.Interactive([node]) if single else ast.Module([node], [])
        exec(compile(tree, "<README>", "single" if single else "exec"), namespace)
print(shown.getvalue(), end="")
sys.path.insert(0, %r)
exec(check, {**namespace, "shown": shown.getvalue(), "displayed": displayed})
""" % (PRELUDE, str(Path(__file__).resolve().parent))

# The numbers a block shows or prints, recomputed another way: the brute-force reference, a full
# evaluation, or the suite's spread from separate evaluations and numpy.  Keyed by a line of the block.
CHECKS = {
    'result = streameval.evaluate("feats.zarr", metric="euclidean", max_rank=50)': """
import numpy as np
from reference import reference_evaluate
ref = reference_evaluate(qf, qp, qc, gf, gp, gc, metric="euclidean", max_rank=50)
(m_ap, rank1, cmc, m_inp), shown_result = displayed[:2]
assert np.allclose([m_ap, rank1, m_inp], [ref["mAP"], ref["cmc"][0], ref["mINP"]], rtol=0, atol=1e-12), shown
assert np.allclose(cmc, ref["cmc"], rtol=0, atol=1e-12)
assert f"mAP {100 * ref['mAP']:.2f}%" in repr(shown_result) and repr(shown_result) in shown
arrays = displayed[-1]  # in-memory arrays, the default metric
ref = reference_evaluate(qf, qp, qc, gf, gp, gc, metric=arrays.to_dict()["metric"], max_rank=arrays.max_rank)
assert np.allclose([arrays.mAP, arrays.mINP], [ref["mAP"], ref["mINP"]], rtol=0, atol=1e-12)
""",
    'result = streameval.evaluate("feats.zarr", state="feats.state")': """
shown_update = displayed[-1]
assert repr(shown_update) in shown
assert (shown_update["rows_before"], shown_update["rows_added"]) == (len(gf), len(features)), shown
full = streameval.evaluate("feats.zarr").to_dict(per_query=True)
assert {k: v for k, v in result.to_dict(per_query=True).items() if k != "run"} == \\
    {k: v for k, v in full.items() if k != "run"}  # the comment's claim: update == evaluate of the grown store
""",
    'result = streameval.run_suite("feats.zarr", streameval.load_suite("cil-factorial", trials=3))': """
import numpy as np
m_ap = [streameval.evaluate("feats.zarr", query_variant=f"corrupt-t{t}", gallery_variant=f"corrupt-t{t}").mAP
        for t in range(3)]
assert np.std(m_ap) > 0  # (ddof 0 would print another std)
assert shown == f"both: mAP {np.mean(m_ap):.4f} +- {np.std(m_ap, ddof=1):.4f} over 3 trials\\n", (shown, m_ap)
""",
    "result = evaluator.compute()                                   # evaluate() on the concatenated rows": """
import numpy as np
from reference import reference_evaluate
ref = reference_evaluate(qf, qp, qc, gf, gp, gc, metric="cosine")
assert np.allclose(displayed[-1], [ref["mAP"], ref["cmc"][0], ref["mINP"]], rtol=0, atol=1e-12), shown
whole = streameval.evaluate(dict(qf=qf, q_pids=qp, q_camids=qc, gf=gf, g_pids=gp, g_camids=gc), metric="cosine")
assert {k: v for k, v in result.to_dict(per_query=True).items() if k != "run"} == \\
    {k: v for k, v in whole.to_dict(per_query=True).items() if k != "run"}  # the comment's claim: bit for bit
""",
    "cmc, mAP = evaluate_rank(distmat, qp, gp, qc, gc, max_rank=10)": """
import numpy as np
from reference import reference_evaluate
ref = reference_evaluate(qf, qp, qc, gf, gp, gc, metric="sqeuclidean", junk_pids=(), max_rank=10)
assert np.allclose(displayed[-1], [ref["cmc"][0], ref["mAP"]], rtol=0, atol=1e-6), shown
assert cmc.dtype == np.float32 and np.allclose(cmc, ref["cmc"], rtol=0, atol=1e-6)
""",
}


def check_of(block: Block) -> str:
    found = [check for line, check in CHECKS.items() if line in block.code.splitlines()]
    assert len(found) <= 1, f"README line {block.line}: several checks"
    return found[0] if found else ""


def run_python(block: Block, cwd: Path) -> None:
    proc = run([sys.executable, "-c", REPL, substituted(block.code), check_of(block)], cwd)
    assert proc.returncode == 0, f"README python block at line {block.line} exited {proc.returncode}:\n{proc.stderr}"


@pytest.mark.parametrize("block", BLOCKS, ids=[f"line{b.line}-{b.language}" for b in BLOCKS])
def test_readme_block_runs_as_written(block, inputs, tmp_path):
    if block.not_run:
        pytest.skip(f"README line {block.line}: not run: {block.not_run}")
    cwd = block_dir(block, inputs, tmp_path)
    (run_bash if block.language == "bash" else run_python)(block, cwd)


def test_every_code_block_is_python_bash_or_plain_text():
    """A recipe cannot slip past the test under another language tag (sh, console, ...)."""
    languages = {b.language for b in readme_blocks(README_TEXT)}
    assert languages <= {*RUN_LANGUAGES, ""}, languages


def test_every_marker_sits_right_before_a_block():
    marked = [b for b in BLOCKS if b.not_run]
    assert len(MARKER.findall(README_TEXT)) == len(marked)
    assert all(b.not_run.strip() for b in marked)  # a reason is given


def shows_something(code: str) -> bool:
    """A bare expression shown at the prompt (a call is a statement for its effect: not counted), or a print."""
    return "print(" in code or any(isinstance(node, ast.Expr) and not isinstance(node.value, ast.Call)
                                   for node in ast.parse(code).body)


def test_every_python_block_that_shows_numbers_has_them_checked():
    for block in BLOCKS:
        if block.language == "python" and not block.not_run and shows_something(block.code):
            assert check_of(block), f"README line {block.line}: shows numbers that no CHECKS entry recomputes"
    assert all(any(line in b.code.splitlines() for b in BLOCKS) for line in CHECKS)  # none stale


def test_most_blocks_run_and_substitutions_are_current():
    run_blocks = [b for b in BLOCKS if not b.not_run]
    assert {b.language for b in run_blocks} == set(RUN_LANGUAGES)
    assert len(run_blocks) > len(BLOCKS) - len(run_blocks)
    for text in SUBSTITUTIONS:
        assert sum(b.code.count(text) for b in run_blocks) == 1, text
