"""``--against REV`` of scripts/bench.py: the same problems timed on another git revision, side by
side with the working tree, in one run.

* The revision: its tree exported with ``git archive`` into ``WORKDIR/rev-<commit>/src`` (a plain
  copy: nothing is registered in the repository, and WORKDIR may not lie in the checkout's tracked
  tree) and installed, non-editable and with its dependencies, into its own venv beside it
  (``python -m venv``, ``pip install src``).  Both are reused while the commit is the same: the venv
  holds a stamp with the commit it was installed from.
* The children: REV's side runs this bench's own child code (``bench.py --_run METHOD``) with the
  venv's python, so both sides are timed the same way and only the imported streameval differs.
  The child code calls only API old revisions have too (``evaluate(store, metric=..., no_gom=...,
  gom_norm=...)``, ``Result.mAP`` / ``rank`` / ``mINP`` / ``per_query``; phases and trials where
  present).
* The store: REV reads the working tree's store if it can (checked by opening it with REV's
  ``open_store``); otherwise (an older store schema) the same rows are written once into a store of
  REV's own with REV's ``write_store`` (same dtype and chunk rows), next to the working tree's and
  reused while both are the same.  Both sides must then give the same numbers, which the report
  checks.
* The order: for every method, ``--repeat`` rounds of (HEAD, REV), so load drift on a shared machine
  affects both sides alike; the best run of each side is kept, and the median shown beside it.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

REV = "REV"
SETS, FIELDS = ("query", "gallery"), ("features", "pids", "camids")
NUMBERS = ("mAP", "rank1", "mINP")  # compared between the sides, with the number of valid queries
VERSIONS = ("import json, os, numpy, numba, dask, zarr, streameval; print(json.dumps({'streameval': "
            "os.path.dirname(streameval.__file__), 'numpy': numpy.__version__, 'numba': numba.__version__, "
            "'dask': dask.__version__, 'zarr': zarr.__version__}))")
OPENS = ("import sys, streameval; s = streameval.open_store(sys.argv[1]); "
         "print(len(s.query), len(s.gallery), s.dim)")
SAFE = "-P"  # python -c without the current folder on sys.path: in the checkout it would import the working tree


@dataclass
class Revision:
    commit: str  # the full commit id
    subject: str  # its first line
    folder: str  # WORKDIR/rev-<commit[:12]>: src/ and venv/
    python: str  # the venv's interpreter
    how: str  # how the checkout and venv came to be (made, reused)
    versions: dict  # where its streameval lives, and its numpy, numba, dask, zarr

    @property
    def short(self) -> str:
        return self.commit[:7]


def die(message: str, code: int) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)


def repository() -> str:
    """The top folder of the checkout this script belongs to."""
    here = os.path.dirname(os.path.abspath(__file__))
    return subprocess.run(["git", "-C", here, "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          check=True).stdout.strip()


def check_outside_checkout(folder: str, repo: str) -> None:
    """Refuse a work folder in the checkout that git does not ignore (out/ is ignored)."""
    folder, repo = os.path.realpath(folder), os.path.realpath(repo)
    if os.path.commonpath([folder, repo]) != repo:
        return
    # a folder's path with a slash: ignore patterns of folders ("/out/") match it even before it exists
    ignored = subprocess.run(["git", "-C", repo, "check-ignore", "-q", folder + os.sep]).returncode == 0
    if not ignored:
        die(f"--workdir {folder} lies in the checkout and git does not ignore it: REV's checkout and venv would "
            "show as untracked files; choose a folder outside it or an ignored one such as out/", 2)


def prepare_revision(commit: str, workdir: str) -> Revision:
    """REV's exported tree and venv under ``workdir``, made or reused (module docstring)."""
    repo = repository()
    check_outside_checkout(workdir, repo)
    folder = os.path.join(os.path.abspath(workdir), f"rev-{commit[:12]}")
    venv = os.path.join(folder, "venv")
    python, stamp = os.path.join(venv, "bin", "python"), os.path.join(venv, ".bench-installed")
    if _read(stamp) == commit and os.path.exists(python):
        how = "checkout and venv reused"
    else:
        started = time.perf_counter()
        shutil.rmtree(folder, ignore_errors=True)
        print(f"REV {commit[:7]}: exporting the tree and installing it into {venv} (once) ...", flush=True)
        export_tree(repo, commit, os.path.join(folder, "src"))
        install(os.path.join(folder, "src"), venv, os.path.join(folder, "install.log"))
        with open(stamp, "w") as fh:
            fh.write(commit)
        how = f"checkout and venv made in {time.perf_counter() - started:.0f} s"
    subject = subprocess.run(["git", "-C", repo, "log", "-1", "--format=%s", commit], capture_output=True, text=True,
                             check=True).stdout.strip()
    probe = subprocess.run([python, SAFE, "-c", VERSIONS], capture_output=True, text=True)
    if probe.returncode != 0:
        die(f"REV {commit[:7]}: its venv {venv} cannot import streameval: {_last_line(probe.stderr)}", 3)
    return Revision(commit, subject, folder, python, how, json.loads(probe.stdout))


def export_tree(repo: str, commit: str, src: str) -> None:
    """``git archive COMMIT | tar -x -C src``."""
    os.makedirs(src)
    archive = subprocess.Popen(["git", "-C", repo, "archive", "--format=tar", commit], stdout=subprocess.PIPE)
    untar = subprocess.run(["tar", "-x", "-C", src], stdin=archive.stdout, capture_output=True, text=True)
    archive.stdout.close()
    if archive.wait() != 0 or untar.returncode != 0:
        die(f"cannot export commit {commit[:7]} into {src}: {_last_line(untar.stderr) or 'git archive failed'}", 3)


def install(src: str, venv: str, log: str) -> None:
    """A fresh venv with ``src`` installed (not editable) and its dependencies; pip's output in ``log``."""
    with open(log, "w") as out:
        for cmd in ([sys.executable, "-m", "venv", venv], [os.path.join(venv, "bin", "python"), "-m", "pip", "install", src]):
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                die(f"'{' '.join(cmd)}' failed; its output is in {log}", 3)


def print_revision(rev: Revision) -> None:
    v = rev.versions
    print(f"against : {REV} = {rev.short} \"{rev.subject}\" ({rev.how}, {rev.folder})")
    print(f"          {REV}'s streameval from {v['streameval']}; numpy {v['numpy']}, numba {v['numba']}, "
          f"dask {v['dask']}, zarr {v['zarr']}; HEAD = the working tree")


# --------------------------------------------------------------------------------------------------
# the store REV reads


def revision_store(rev: Revision, path: str, size) -> tuple[str, str]:
    """(store REV evaluates, how it came to be): the working tree's store if REV reads it, else the
    same rows written by REV's own ``write_store`` (made once, reused while both stay the same)."""
    from bench import PARAMS_SUFFIX

    opened = subprocess.run([rev.python, SAFE, "-c", OPENS, path], capture_output=True, text=True)
    if opened.returncode == 0 and opened.stdout.split() == [str(n) for n in size[:3]]:
        return path, f"{REV} reads the working tree's store"
    why = _last_line(opened.stderr).replace(f"'{path}'", "it") or f"it reads a shape of {opened.stdout.strip()}"
    own = path.removesuffix(".zarr") + f".rev-{rev.commit[:12]}.zarr"
    marker = own + PARAMS_SUFFIX
    recorded = {"rows_of": path, "rows_params": json.loads(_read(path + PARAMS_SUFFIX) or "null"), "revision": rev.commit}
    if os.path.exists(own) and _read(marker) == json.dumps(recorded):
        return own, f"{REV}'s copy of the same rows, reused ({REV} cannot read the working tree's store: {why})"
    if os.path.exists(marker):
        os.remove(marker)
    started = time.perf_counter()
    transcribe(rev, path, own)
    with open(marker, "w") as fh:
        fh.write(json.dumps(recorded))
    return own, (f"the same rows written by {REV}'s write_store in {time.perf_counter() - started:.1f} s ({REV} cannot "
                 f"read the working tree's store: {why})")


def transcribe(rev: Revision, path: str, own: str) -> None:
    """Copy the rows of the store at ``path`` into a new store of REV's at ``own``: this side writes
    them as .npy files (chunk by chunk), REV's child (``--_run transcribe``) writes its store."""
    import bench

    dump = tempfile.mkdtemp(prefix="bench-rows-", dir=os.path.dirname(own))
    try:
        dump_rows(path, dump)
        child = subprocess.run([rev.python, os.path.abspath(bench.__file__), "--_run", "transcribe", "--_store", dump,
                                "--_out", own], capture_output=True, text=True)
        if child.returncode != 0:
            sys.stderr.write(child.stderr)
            die(f"{REV} {rev.short} could not write the rows of {path} into its own store {own}", 3)
    finally:
        shutil.rmtree(dump, ignore_errors=True)


def dump_rows(path: str, folder: str) -> None:
    """Every array of the store as ``SET_FIELD.npy`` in ``folder``, and ``meta.json`` (dtype, chunk rows)."""
    import numpy as np

    from streameval.store import open_store

    store = open_store(path)
    for set_name in SETS:
        fs = getattr(store, set_name)
        for field in FIELDS:
            source = getattr(fs, field)
            target = np.lib.format.open_memmap(os.path.join(folder, f"{set_name}_{field}.npy"), mode="w+",
                                               dtype=source.dtype, shape=(len(fs), *source.shape[1:]))
            for start in range(0, len(fs), fs.chunk_rows):
                target[start:start + fs.chunk_rows] = source[start:min(start + fs.chunk_rows, len(fs))]
            target.flush()
            del target
    with open(os.path.join(folder, "meta.json"), "w") as fh:
        json.dump({"dtype": str(store.gallery.features.dtype), "chunk_rows": store.gallery.chunk_rows}, fh)


def transcribe_child(args) -> None:
    """In REV's venv: the rows ``dump_rows`` left in ``args._store`` as REV's store at ``args._out``."""
    import numpy as np

    import streameval

    with open(os.path.join(args._store, "meta.json")) as fh:
        meta = json.load(fh)
    arrays = [np.load(os.path.join(args._store, f"{s}_{f}.npy"), mmap_mode="r") for s in SETS for f in FIELDS]
    streameval.write_store(args._out, *arrays, dtype=meta["dtype"], chunk_rows=meta["chunk_rows"],
                           default_metric="euclidean", overwrite=True)


# --------------------------------------------------------------------------------------------------
# running and reporting


def run_against(args, sides: dict) -> dict:
    """{method: {side: result}} (``sides``: side -> (python, store)): the methods both sides have
    timed in alternating rounds; floor, classic and update on the working tree only;
    ``process``: {process: {side: {"cold", "warm"}}}."""
    from bench import HEAD, VARIANTS, run_child, run_processes

    results = {}
    for method in args.methods:
        if method == "process":
            results[method] = run_processes(args, sides)
        elif method in VARIANTS:
            runs = {side: [] for side in sides}
            for _ in range(args.repeat):
                for side, (python, store) in sides.items():
                    runs[side].append(run_child(args, method, store, python=python, repeat=1))
            results[method] = {side: best_child_run(r) for side, r in runs.items()}
        else:
            results[method] = {HEAD: run_child(args, method, sides[HEAD][1])}
        sys.stdout.flush()
    return results


def best_child_run(runs: list) -> dict:
    """The fastest of one-run children, with every run's time (or the first failure)."""
    failed = next((run for run in runs if "error" in run), None)
    if failed:
        return failed
    best = min(runs, key=lambda run: run["time_s"])
    loads = [run["others_cores"] for run in runs if run.get("others_cores") is not None]
    return dict(best, times_s=[run["time_s"] for run in runs], others_cores=max(loads) if loads else None)


def table_rows(results: dict) -> list:
    """(label, {side: timing}) per row of the table, in METHODS order: processes cold and warm."""
    from bench import COLD_AND_WARM, METHODS

    rows = []
    for method in METHODS:
        if method not in results or method == "update":
            continue
        if method != "process":
            rows.append((method, results[method]))
            continue
        for name in COLD_AND_WARM:
            for phase in ("cold", "warm"):
                rows.append((f"{name} {phase}", {side: r[phase] for side, r in results[method][name].items()}))
    return rows


def report_against(size, noise, stores: dict, results: dict, args, rev: Revision) -> dict:
    """The table of both sides, the numbers check, and every run's details; the JSON record."""
    from bench import HEAD, problem_line, problem_title, print_details, report_update

    print(f"=== {problem_title(size, noise, args)}: {HEAD} (working tree) vs {REV} {rev.short} ===")
    for side, (path, how) in stores.items():
        print(f"store {side:<4}: {path} ({how})")
    head = {method: r[HEAD] for method, r in results.items() if method != "process" and HEAD in r}
    print(problem_line(head))
    floor = head.get("floor")
    header = (f"{'method':<18}{'HEAD best':>10}{'median':>9}{'REV best':>10}{'median':>9}{'HEAD/REV':>10}"
              f"{'passes/GEMM HEAD':>18}{'REV':>7}")
    print(header)
    print("-" * len(header))
    rows = [table_row(label, by_side, floor) for label, by_side in table_rows(results)]
    if args.repeat > 1:  # the in-process methods' runs are in their detail lines below
        for row in rows:
            if row["method"].endswith(("cold", "warm")) and "times_s" in row:
                print(f"  {row['method']} runs (s): " + "; ".join(
                    f"{side} " + " ".join(f"{t:.3f}" for t in times) for side, times in row["times_s"].items()))
    if floor and "detail" in floor:
        print(f"passes/GEMM: a method's scoring passes (its result's phase 'passes') over the floor's GEMM "
              f"({floor['detail']['gemm']:.3f} s, HEAD's chunk plan); minmax GOM (streameval) makes two passes")
    numbers = check_numbers(results, rev)
    if "update" in results:
        report_update(results["update"][HEAD], size[1])
    for side in stores:
        print_details({m: r[side] for m, r in results.items() if m != "process" and side in r}, f" [{side}]")
    print()
    return {"size": dict(zip(("n_query", "n_gallery", "dim", "n_ids"), size)), "noise": noise,
            "against": rev.commit, "stores": {side: {"path": p, "how": h} for side, (p, h) in stores.items()},
            "rows": rows, "numbers": numbers, "results": results}


def table_row(label: str, by_side: dict, floor: dict | None) -> dict:
    """Print one row (best and median of each side, their ratio, passes over the GEMM); its record."""
    from bench import HEAD, fmt, passes_over_gemm

    failed = {side: r["error"] for side, r in by_side.items() if "error" in r}
    if failed:
        print(f"{label:<18}  FAILED: " + "; ".join(f"{side}: {error}" for side, error in failed.items()))
        return {"method": label, "errors": failed}
    best = {side: r["time_s"] for side, r in by_side.items()}
    median = {side: statistics.median(r["times_s"]) for side, r in by_side.items()}
    passes = {side: passes_over_gemm(r, floor) for side, r in by_side.items()}
    ratio = best[HEAD] / best[REV] if REV in best else None
    print(f"{label:<18}{best[HEAD]:>10.3f}{median[HEAD]:>9.3f}{fmt(best.get(REV), '.3f'):>10}"
          f"{fmt(median.get(REV), '.3f'):>9}{fmt(ratio, '.2f'):>9}{'x' if ratio else ' '}"
          f"{fmt(passes.get(HEAD), '.2f'):>18}{fmt(passes.get(REV), '.2f'):>7}")
    return {"method": label, "best_s": best, "median_s": median, "times_s": {s: r["times_s"] for s, r in by_side.items()},
            "head_over_rev": ratio, "passes_over_gemm": passes}


def check_numbers(results: dict, rev: Revision) -> list:
    """Both sides' numbers for every method both ran: the same data must give the same numbers.
    Prints one line, and a loud one on stdout and stderr for every method where they differ."""
    from bench import AGREE_TOL, HEAD, VARIANTS, fmt

    checks = []
    for method in VARIANTS:
        sides = results.get(method, {})
        if "metrics" not in sides.get(HEAD, {}) or "metrics" not in sides.get(REV, {}):
            continue
        a, b = sides[HEAD]["metrics"], sides[REV]["metrics"]
        diffs = {k: abs(a[k] - b[k]) if a[k] is not None and b[k] is not None else (0.0 if a[k] is b[k] else None)
                 for k in NUMBERS}
        same = all(a[k] == b[k] for k in NUMBERS) and a["n_valid_queries"] == b["n_valid_queries"]
        agree = a["n_valid_queries"] == b["n_valid_queries"] and all(d is not None and d <= AGREE_TOL
                                                                    for d in diffs.values())
        checks.append({"method": method, "head": a, "rev": b, "abs_diff": diffs, "same": same, "agree": agree})
    if not checks:
        return checks
    verdicts = ", ".join(f"{c['method']} {'SAME' if c['same'] else 'agree' if c['agree'] else 'DIFFER'}"
                         for c in checks)
    a = checks[0]["head"]
    print(f"numbers {HEAD} vs {REV} (mAP, rank-1, mINP, valid queries; agree: within {AGREE_TOL:g}): {verdicts}  "
          f"[{checks[0]['method']}: mAP {fmt(a['mAP'], '.6f')}, rank-1 {fmt(a['rank1'], '.6f')}]")
    for c in checks:
        if not c["agree"]:
            loud = (f"!!! {HEAD} and {REV} {rev.short} DIFFER on the same rows, {c['method']}: "
                    + ", ".join(f"{k} {fmt(c['head'][k], '.6f')} vs {fmt(c['rev'][k], '.6f')}" for k in NUMBERS)
                    + f", valid queries {c['head']['n_valid_queries']} vs {c['rev']['n_valid_queries']}")
            print(loud)
            print(loud, file=sys.stderr)
    return checks


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""
