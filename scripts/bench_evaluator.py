#!/usr/bin/env python
"""Peak memory of ``streameval.Evaluator`` against evaluating the same rows from a store (issue 27).

A synthetic store (``streameval.tools.synth``, float16, ``--rows`` gallery rows x ``--dim``, default
2,000,000 x 64) is written once under ``--workdir`` (reused while its parameters are the same); then
each method runs in a fresh child process, whose peak RSS (``ru_maxrss``) is its own:

  store      ``streameval.evaluate(STORE)``: the evaluation the evaluator must stay close to.
  evaluator  the same rows given to ``streameval.Evaluator()`` in batches of ``--batch`` rows (read
             from the store a chunk at a time, as a data loader would hand them over), then
             ``compute()``: rows held up to the buffer budget (``--buffer-budget``, default the
             evaluator's), the rest in its temporary store.
  arrays     (with ``--arrays``) ``streameval.evaluate`` on the whole arrays in memory, for scale.

Both evaluations use evaluate's default options; the table shows each method's peak RSS, its time
(the evaluator's split into adding and computing) and mAP, which must be the same for all (the
bench exits 1 otherwise), and the evaluator's peak over the store's (goal: at most 1.2).

    .venv/bin/python scripts/bench_evaluator.py --rows 200000     # a quick check (~1 minute, 2 cores)
    .venv/bin/python scripts/bench.py --evaluator-rss             # 2,000,000 rows
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

GOAL = 1.2  # the evaluator's peak RSS over the store evaluation's, at most
METHODS = ("store", "evaluator", "arrays")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="scripts/bench_evaluator.py", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2_000_000, help="gallery rows (default: 2,000,000)")
    p.add_argument("--queries", type=int, default=2_000, help="queries (default: 2,000)")
    p.add_argument("--dim", type=int, default=64, help="feature dimension (default: 64)")
    p.add_argument("--ids", type=int, default=None, help="identities (default: rows // 20)")
    p.add_argument("--batch", type=int, default=4096, help="rows per batch given to the evaluator (default: 4096)")
    p.add_argument("--buffer-budget", default=None, help="the evaluator's buffer_budget (default: its own)")
    p.add_argument("--arrays", action="store_true", help="also evaluate the whole arrays in memory")
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "streameval-bench"),
                   help="where the store is written and reused (default: %(default)s)")
    p.add_argument("--_run", choices=METHODS, help=argparse.SUPPRESS)
    p.add_argument("--_store", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.ids = args.ids or max(1, args.rows // 20)
    if min(args.rows, args.queries, args.dim, args.batch) < 1:
        p.error("--rows, --queries, --dim and --batch must be positive")
    return args


def prepared_store(args) -> str:
    """The synthetic store of these parameters, written unless there already."""
    from streameval.tools.synth import synthesize

    path = os.path.join(args.workdir, f"evaluator_{args.queries}x{args.rows}x{args.dim}_{args.ids}ids_float16.zarr")
    if not os.path.isdir(path):
        os.makedirs(args.workdir, exist_ok=True)
        started = time.perf_counter()
        synthesize(path, n_query=args.queries, n_gallery=args.rows, dim=args.dim, n_ids=args.ids, n_cams=6,
                   dtype="float16")
        print(f"wrote {path} in {time.perf_counter() - started:.1f} s", flush=True)
    return path


def batches(fs, rows: int):
    """(features, pids, camids) of the set ``fs`` in batches of ``rows``, read a chunk at a time."""
    for start in range(0, len(fs), fs.chunk_rows):
        stop = min(start + fs.chunk_rows, len(fs))
        chunk = [getattr(fs, field)[start:stop] for field in ("features", "pids", "camids")]
        for first in range(0, stop - start, rows):
            yield [column[first:first + rows] for column in chunk]


def run_child(args) -> dict:
    """One method in this process: its numbers and this process's peak RSS."""
    import streameval

    started = time.perf_counter()
    facts = {}
    if args._run == "store":
        result = streameval.evaluate(args._store)
    elif args._run == "arrays":
        store = streameval.open_store(args._store)
        result = streameval.evaluate({f"{side[0]}{name}": getattr(getattr(store, side), field)[:]
                                      for side in ("query", "gallery")
                                      for field, name in (("features", "f"), ("pids", "_pids"), ("camids", "_camids"))})
    else:
        store = streameval.open_store(args._store)
        budget = {} if args.buffer_budget is None else {"buffer_budget": args.buffer_budget}
        with streameval.Evaluator(**budget) as ev:
            for batch in batches(store.query, args.batch):
                ev.add_queries(*batch)
            for batch in batches(store.gallery, args.batch):
                ev.add_gallery(*batch)
            facts["adding_s"] = time.perf_counter() - started
            result = ev.compute()
    facts.update(seconds=time.perf_counter() - started, mAP=result.mAP, rank1=result.rank(1),
                 peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return facts


def child(args, method: str, store: str) -> dict:
    budget = [] if args.buffer_budget is None else ["--buffer-budget", args.buffer_budget]
    command = [sys.executable, os.path.abspath(__file__), "--_run", method, "--_store", store,
               "--batch", str(args.batch), *budget]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: the {method} child failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    args = parse_args(argv)
    if args._run:
        print(json.dumps(run_child(args)))
        return 0
    store = prepared_store(args)
    budget = args.buffer_budget or "the default"
    print(f"\n{args.queries:,} queries x {args.rows:,} gallery rows x {args.dim} float16; evaluator batches of "
          f"{args.batch:,} rows, buffer budget {budget}\n")
    methods = [m for m in METHODS if m != "arrays" or args.arrays]
    rows = {method: child(args, method, store) for method in methods}
    print(f"{'method':<10} {'peak RSS':>12} {'time':>9} {'adding':>9}  {'mAP':<20} rank-1")
    for method, facts in rows.items():
        adding = f"{facts['adding_s']:8.1f}s" if "adding_s" in facts else f"{'':9}"
        print(f"{method:<10} {facts['peak_rss_mib']:9.0f} MiB {facts['seconds']:8.1f}s {adding}  "
              f"{facts['mAP']!r:<20} {facts['rank1']!r}")
    ratio = rows["evaluator"]["peak_rss_mib"] / rows["store"]["peak_rss_mib"]
    print(f"\nevaluator / store peak RSS: {ratio:.2f} (goal: at most {GOAL}){'' if ratio <= GOAL else '  !!! over'}")
    if len({(facts["mAP"], facts["rank1"]) for facts in rows.values()}) != 1:
        print("error: the methods gave different numbers on the same rows", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
