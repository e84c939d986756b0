#!/usr/bin/env python
"""Benchmark streameval against the bare distance floor and the classic full-matrix evaluator.

These methods are timed side by side on the same synthetic store (``streameval.tools.synth``), for each
problem: every ``--size`` at every ``--noise`` (below):

  streameval  ``streameval.evaluate(store, metric=...)`` with default options: closed-set metrics and
              GOM with ``minmax`` normalisation (two passes over the gallery).  The numba JIT is
              warmed first on a tiny problem, so compile time is not counted.
  se-fixed    the same with ``gom_norm="fixed:0:HI"`` (one pass; HI bounds every distance).
  se-closed   the same with ``no_gom=True``: CMC, mAP, mINP only (one pass).
  se-osv      se-closed plus open-set identification and verification (``open_set=True,
              verification=True``: DIR@FPIR, TAR@FAR at the default targets), to set against se-closed.
  se-all      the default evaluation (GOM, minmax) plus the same, to set against streameval.
  floor       the bare distance computation over the same blocks: the same chunk plan
              (``streameval.engine.plan.make_plan`` with evaluate's arguments), each gallery chunk read from
              the store and upcast, the query-block x gallery-chunk GEMM (numpy, BLAS on all cores)
              plus the norm combination (numpy, in cache-sized tiles, on all cores), the result
              discarded.  No ranking: a lower bound for any exact evaluator that reads the store.
  update      incremental re-evaluation (``streameval update``): a copy of the store is evaluated with
              ``state=``, then ``--update-frac`` (default 1%) more gallery rows are appended - copies of
              random gallery rows relabelled as pid 0 distractors, so no new positives and no new
              extreme distance - and ``update`` is timed against a full ``evaluate`` of the grown
              store, for the default (minmax GOM), fixed-GOM and closed-set options.
  classic     what the common ReID codebases do (torchreid / fast-reid): load everything, compute the
              full Nq x Ng float32 distance matrix (squared euclidean like torchreid's
              ``euclidean_squared_distance``, or cosine), ``np.argsort(distmat, axis=1)``, then a
              compiled (numba, cached like torchreid's Cython) per-query loop mirroring torchreid's
              ``eval_market1501``.
  process     what a user waits for: whole processes, timed from spawn to exit (Python start-up,
              imports, numba's cache and interpreter exit included; page cache warm):
                cli-closed       ``streameval eval STORE --no-gom -q --metric M``
                cli              ``streameval eval STORE -q --metric M`` (default GOM, minmax)
                classic-process  the classic evaluator above as a script: one evaluation, then exit
              each streameval process twice per round: "cold" with numba's cache empty (a fresh
              NUMBA_CACHE_DIR: streameval makes its versioned cache folder inside it, so every kernel
              the run needs is compiled: what a first run after an install or an upgrade costs),
              then "warm" with the cache that cold run left (every later run); the classic process
              after one untimed warm-up run.  With its own peak RSS, next to the in-process times of
              se-closed, streameval and classic, and the speed-up (warm) over the classic process.
              Also a start-up line (once): ``streameval --help`` and ``python -c "import streameval"``.

Problems (``--noise``, default ``easy,hard``): each size is synthesised at each noise, synth's
``noise`` scaling the per-image noise against the identity signal.  ``easy`` (1) is synth's default
model (Market size: rank-1 ~95%, mAP ~83%); ``hard`` (``streameval.tools.synth.NOISE_HARD``) a weak one
(Market size: mAP ~53%, a query's last positive ~570 rows deep at the median, beyond ~2,600 for a
tenth of the queries), where the statistics carry many more positives and ranks.  Each problem's
table opens with how hard it is: mAP, rank-1 and mINP of the first streameval method, and the rank
of the queries' last positives (median, 90th percentile, deepest: a query's positives over its INP).

What the columns say, besides the best wall time and peak RSS:

  x floor       the method's time over the floor's (read + GEMM + norms).
  passes/GEMM   the method's scoring passes over the floor's GEMM alone: the passes are the phase
                "passes" of the result's ``run["phases"]`` (evaluate's phases, also in ``--json``
                and the CLI summary: the time from the first graph computed to the last, i.e. every
                pass over the gallery, without set-up and the metrics' final step), the GEMM the
                floor's "gemm" breakdown over the same chunk plan.  So the goal "scoring passes
                <= 1.3x the GEMM" reads off the column; minmax GOM (streameval, se-all) makes two
                passes over the gallery, each with its own GEMM, so its figure compares with 2 x 1.3.

``--against REV`` (scripts/bench_against.py) times the same problems on another git revision, side
by side with the working tree (HEAD in the table; REV the revision), in the same run: REV's tree is
exported into ``WORKDIR/rev-<commit>/src`` and installed with its dependencies into its own venv
beside it (both reused while the commit is the same); REV's children run this script's child code
with that venv's python, so both sides are timed the same way.  REV evaluates the working tree's
store if it reads it, else the same rows written into a store of its own by its ``write_store``.
Methods (default ``streameval,se-fixed,se-closed,floor,process``): the streameval variants and the
CLI processes (cold and warm) run on both sides, in ``--repeat`` rounds of (HEAD, REV) so a busy
machine's drift affects both alike; floor (and classic, update if asked) on the working tree only.
The table shows per method each side's best and median time, HEAD/REV (best over best: below 1 is
faster than REV) and passes/GEMM of each side (REV's where its results have phases), then checks
that both sides gave the same mAP, rank-1, mINP and valid queries on the same rows: a difference
is printed loudly, on stderr too, and the bench exits 1.

``--protocols`` is a separate mode (issue 11): the protocol machinery, at Market-1501 size by default,
each method without GOM so that only the protocol differs.  ``T`` = ``--trials`` (default 10):

  se-market       ``streameval.evaluate(store, no_gom=True)``: the market protocol, one pass.
  se-cuhk03       the same with ``protocol="cuhk03-sgs", sgs_repeats=T`` (sampled single gallery shot).
  se-sysu         the same with the SYSU-like protocol: ``protocols.resolve("market", trials=T,
                  cmc="identity-dedup")`` (T seeded gallery trials of one row per (pid, camera), market's
                  same-identity same-camera rule) plus SYSU's any-identity rule x_any = {(3, 2)}: query
                  camera 3 never sees gallery camera 2.  (The store's cameras are 0..5, not SYSU's.)
  classic-market  the classic evaluator above (``classic``).
  classic-cuhk03  torchreid's Python ``eval_cuhk03``: full distance matrix, ``np.argsort``, then per
                  query the kept list and, per repeat, one ``np.random.choice`` per kept identity and
                  the CMC of the sampled list; AP on the full kept list.
  classic-sysu    mangye16's ``eval_sysu``, per trial: the full matrix (computed once) masked to the
                  trial's gallery (streameval's seeded draws, so the numbers can agree), ``np.argsort``
                  of it, then per query the identity-deduplicated CMC, AP and INP.
The classic Python loops stop after ``--classic-budget`` seconds and their time is then extrapolated
linearly from the queries (or trials) done, which the table says.

``--rerank [FLAVOUR]`` is a separate mode (issue 26, scripts/bench_rerank.py): k-reciprocal re-ranking
on MSMT17-shaped stores (11,659 + 82,161 rows, D = 2,048 and 256, float16; ``--rerank-scale S`` for
S of the rows), ``streameval eval --rerank FLAVOUR`` as a whole process (with ``--against REV`` REV's
too, interleaved) next to the bare U x U GEMM over the same rows (``uu-floor``) and the dense
torchreid-style numpy re-ranking at the largest N that fits this machine (``dense``), with the goals
(within 1.5x the U x U GEMM, peak RSS < 2 GB).

``--device DEV`` is a separate mode (issue 28, scripts/bench_device.py): the GPU path (DEV ``cuda``, ``cuda:N``,
or ``torch:cpu``: the same torch code on the CPU) in-process (closed-set and default) and as a warm CLI
process, next to the CPU path (unless ``--skip-cpu``) and two floors: the device's GEMM alone over the
same chunk plan (gallery chunks already in host memory, uploaded and multiplied, TF32 off) and reading
the store alone; each method over max(floors), and the device's numbers checked against the CPU path's
(SAME / DIFFERENT).  ``--precision float64`` runs both paths and the GEMM floor in float64.
scripts/gpu_check.sh runs it on a GPU machine in one command.

``--evaluator-rss [ROWS]`` is a separate mode (issue 27, scripts/bench_evaluator.py): the peak RSS of
``streameval.Evaluator`` given ROWS x 64 float16 gallery rows (default 2,000,000) in batches of 4096,
then ``compute()``, against ``evaluate`` of the same store, each in its own process (goal: within 1.2x).

Each other method runs in a fresh child process (``bench.py --_run METHOD ...``), so its peak RSS is
its own.  Their timings exclude process start, imports and JIT warm-up; the best of ``--repeat`` runs
is kept (for ``process`` too); with --against each side's runs are shown too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

from bench_against import (REV, prepare_revision, print_revision, report_against, revision_store, run_against,
                           transcribe_child)
from bench_rerank import (CHILD_RUNNERS as RERANK_RUNNERS, RERANK_CHILDREN, RERANK_DTYPE, RERANK_METHODS, RERANK_SIZES,
                          run_rerank_mode, scaled_sizes)
from bench_device import DEVICE_METHODS, FLOOR_CHILD, Breakdown, device_methods, run_device_floors, run_device_mode
from bench_suite import SUITE_CHILDREN, SUITE_METHODS, SUITE_SIZE, run_child_method, run_suite_mode

METHODS = ("streameval", "se-fixed", "se-closed", "se-osv", "se-all", "floor", "update", "classic", "process")
VARIANTS = ("streameval", "se-fixed", "se-closed", "se-osv", "se-all")
UPDATE_VARIANTS = VARIANTS[:3]  # update is timed for the closed-set and GOM options
OPEN_SET_VERIFICATION = {"open_set": True, "verification": True}  # DIR@FPIR and TAR@FAR, default targets
GOAL_OSV_COST = 1.2  # open-set + verification cost at most this much over the same evaluation without them
PROCESSES = {  # whole-process command -> the in-process method doing the same work
    "cli-closed": "se-closed", "cli": "streameval", "classic-process": "classic"}
COLD_AND_WARM = ("cli-closed", "cli")  # the processes timed with numba's cache empty and filled
HEAD = "HEAD"  # the side of the working tree (--against adds REV's)
AGAINST_METHODS = "streameval,se-fixed,se-closed,floor,process"
DEFAULT_SIZES = ("3368x19732x2048", "10000x50000x256")
SCALING_SIZES = ("10000x20000x256:2000", "10000x200000x256:2000", "10000x2000000x256:2000")  # gallery x1, x10, x100
SCALING_METHODS = "streameval,se-fixed,se-closed,floor"  # the classic evaluator cannot hold 10,000 x 2,000,000
KNOWN_IDS = {(3368, 19732, 2048): 750, (10000, 50000, 256): 2000}  # Market-1501's 750 test ids; ~5 queries/id
AGREE_TOL = 1e-6
PARAMS_SUFFIX = ".bench-params.json"
# --protocols: table name -> child method (market's rows are the se-closed and classic methods above)
PROTOCOL_METHODS = {"se-market": "se-closed", "se-cuhk03": "se-cuhk03", "se-sysu": "se-sysu",
                    "classic-market": "classic", "classic-cuhk03": "classic-cuhk03", "classic-sysu": "classic-sysu"}
PROTOCOL_CHILDREN = ("se-cuhk03", "se-sysu", "classic-cuhk03", "classic-sysu")
PROTOCOL_SIZE = "3368x19732x2048"
PROTOCOL_GOAL_COST = 1.5  # T trials or repeats cost at most this many market evaluations
PROTOCOL_GOAL_SPEEDUP = 50  # and are at least this much faster than the classic CUHK03 loop
MAX_RANK = 50  # torchreid's default, and evaluate's


# --------------------------------------------------------------------------------------------------
# command line


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="scripts/bench.py",
        description=__doc__.split("\n\n")[0] + "\n\n" + "\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "examples:\n"
            "  .venv/bin/python scripts/bench.py                       # both default sizes, all methods\n"
            "  .venv/bin/python scripts/bench.py --size 3368x19732x2048 --repeat 3\n"
            "  .venv/bin/python scripts/bench.py --size 2000x20000x512:400 --methods streameval,floor\n"
            "  .venv/bin/python scripts/bench.py --metric cosine --dtype float16 --json bench.json\n"
            "  .venv/bin/python scripts/bench.py --scaling           # 10,000 queries x 20k / 200k / 2M gallery\n"
            "  .venv/bin/python scripts/bench.py --protocols         # market vs cuhk03-sgs vs SYSU-like trials\n"
            "  .venv/bin/python scripts/bench.py --noise hard --size 3368x19732x2048   # the weak model only\n"
            "  .venv/bin/python scripts/bench.py --against HEAD~1 --repeat 3   # vs the commit before, interleaved\n"
            "  .venv/bin/python scripts/bench.py --rerank                # MSMT17-shaped: vs U x U GEMM and dense\n"
            "  .venv/bin/python scripts/bench.py --rerank --rerank-scale 0.02   # the same at 1/50 of the rows\n"
            "  .venv/bin/python scripts/bench.py --against d00fc36 --size 500x5000x64 --methods se-closed,floor\n"
            "  .venv/bin/python scripts/bench.py --device cuda --size 3368x19732x2048 --dtype float16\n"
            "  .venv/bin/python scripts/bench.py --device cuda --size 10000x10000000x256 --dtype float16 --skip-cpu\n"
            "  .venv/bin/python scripts/bench.py --device torch:cpu --size 200x5000x64   # device code on the CPU\n"
            "\n"
            "Stores are created under --workdir, named after their parameters, and reused when a\n"
            "store with the same parameters is already there (a side file records them)."
        ),
    )
    p.add_argument("--size", action="append", metavar="NQxNGxD[:IDS]",
                   help="problem size: queries x gallery x feature dim, optionally ':IDS' identities; "
                        "repeatable (default: %s)" % " and ".join(DEFAULT_SIZES))
    p.add_argument("--ids", type=int, default=None,
                   help="identities, for sizes given without ':IDS' (default: 750 for 3368x19732x2048, "
                        "2000 for 10000x50000x256, else NQ // 5)")
    p.add_argument("--cams", type=int, default=6, help="cameras (default: 6)")
    p.add_argument("--noise", default=None, metavar="LIST",
                   help="the problems at each size, by synth's noise (a weaker model for more noise): comma-"
                        "separated 'easy' (noise 1: Market size at mAP ~83%%), 'hard' (streameval.tools.synth.NOISE_HARD: "
                        "mAP ~53%%, last positives hundreds to thousands of rows deep) or numbers >= 0 "
                        "(default: easy,hard; with --scaling, --protocols or --suite: easy)")
    p.add_argument("--against", metavar="REV", default=None,
                   help="also time the same problems on git revision REV (a commit, tag, branch, HEAD~1...), side by "
                        "side with the working tree, interleaved; REV's checkout and venv are made under --workdir and "
                        "reused (see --against above).  Methods: default %s; of them, floor (and classic, update) "
                        "run on the working tree only" % AGAINST_METHODS)
    p.add_argument("--dtype", choices=("float32", "float16"), default=None,
                   help="stored feature dtype (default: float32; with --rerank %s); every method computes in "
                        "float32" % RERANK_DTYPE)
    p.add_argument("--metric", choices=("euclidean", "sqeuclidean", "cosine"), default="euclidean",
                   help="distance (default: euclidean).  The classic evaluator computes squared "
                        "euclidean for both euclidean metrics, as torchreid does (same ranking)")
    p.add_argument("--scaling", action="store_true",
                   help="millions-scale mode: sizes %s with methods %s, and a table of time, pairs/s and "
                        "peak RSS as the gallery grows 10x and 100x" % (", ".join(SCALING_SIZES), SCALING_METHODS))
    p.add_argument("--protocols", action="store_true",
                   help="protocol mode (issue 11): at size %s by default, methods %s: market, cuhk03-sgs with "
                        "--trials repeats and a SYSU-like run of --trials trials, streameval vs the classic "
                        "full-matrix implementations, and the cost ratios" % (PROTOCOL_SIZE, ",".join(PROTOCOL_METHODS)))
    p.add_argument("--suite", choices=("cil-factorial", "cil-upstream"), default=None,
                   help="suite mode (issue 14): at size %s by default, methods %s: a CIL-ReID suite of 1 + 3T "
                        "evaluations against one clean evaluation, the same evaluations run separately, the bare "
                        "GEMM, and the command-line processes (scripts/bench_suite.py)" % (SUITE_SIZE, ",".join(SUITE_METHODS)))
    p.add_argument("--rerank", nargs="?", const="matlab", default=None, metavar="FLAVOUR",
                   help="re-ranking mode (issue 26, scripts/bench_rerank.py): sizes %s (MSMT17's test split, %s "
                        "store by default), methods %s: `streameval eval --rerank FLAVOUR` as a process (default "
                        "flavour matlab), the bare U x U GEMM over the same rows, and the dense torchreid-style "
                        "re-ranking at the largest N that fits this machine; with --against REV also REV's process"
                        % (" and ".join(RERANK_SIZES), RERANK_DTYPE, ",".join(RERANK_METHODS)))
    p.add_argument("--evaluator-rss", nargs="?", const=2_000_000, type=int, default=None, metavar="ROWS",
                   help="evaluator mode (issue 27, scripts/bench_evaluator.py): peak RSS of streameval.Evaluator fed "
                        "ROWS x 64 float16 gallery rows (default 2,000,000) in batches of 4096, against evaluating the "
                        "same store, each in its own process")
    p.add_argument("--device", default=None, metavar="DEV",
                   help="device mode (issue 28, scripts/bench_device.py): DEV cuda, cuda:N or torch:cpu; methods %s "
                        "(default: all but device-all, cpu-all): the device path in-process and as a CLI process, the "
                        "CPU path, the device's GEMM alone and the store read alone, and the numbers of both paths "
                        "compared" % ",".join(DEVICE_METHODS))
    p.add_argument("--skip-cpu", action="store_true",
                   help="--device: leave out the CPU path's runs (cpu-*), e.g. at 10,000 x 10,000,000")
    p.add_argument("--precision", choices=("float32", "float64"), default=None,
                   help="--device: the GEMMs' precision, of both paths and the GEMM floor (default: float32)")
    p.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="--device: every run's memory budget (evaluate's memory_budget, the CLI's --memory-budget; "
                        "default theirs: 512MiB a worker, at least 1GiB, at most a quarter of the machine's memory)")
    p.add_argument("--breakdown", action="store_true",
                   help="--device: time where each in-process run's worker threads go (reads, positives, GEMMs or "
                        "device calls, the statistics, state copies: thread-seconds, ~1 us a call more)")
    p.add_argument("--rerank-scale", type=float, default=1.0, metavar="S",
                   help="--rerank: the sizes' rows and identities times S (e.g. 0.02 for a quick check; default: 1)")
    p.add_argument("--trials", type=int, default=10,
                   help="--protocols: sgs repeats and SYSU-like trials; --suite: corruption trials (default: 10)")
    p.add_argument("--classic-budget", type=float, default=600.0,
                   help="--protocols: seconds a classic Python loop (classic-cuhk03, classic-sysu) may run; "
                        "beyond it the loop stops and its time is extrapolated linearly (default: 600)")
    p.add_argument("--methods", default=None,
                   help="comma-separated subset of %s (default: all; with --against: %s; with --protocols: of %s)"
                        % (",".join(METHODS), AGAINST_METHODS, ",".join(PROTOCOL_METHODS)))
    p.add_argument("--repeat", type=int, default=1,
                   help="runs per method, best kept; with --against the runs of both sides alternate (default: 1)")
    p.add_argument("--seed", type=int, default=0, help="synthesis seed (default: 0)")
    p.add_argument("--junk-frac", type=float, default=0.0, help="gallery junk (pid -1) fraction (default: 0)")
    p.add_argument("--distractor-frac", type=float, default=0.0,
                   help="gallery distractor (pid 0) fraction (default: 0)")
    p.add_argument("--open-query-frac", type=float, default=0.0,
                   help="fraction of queries with no gallery identity (default: 0)")
    p.add_argument("--update-frac", type=float, default=0.01,
                   help="rows appended for the update method, as a fraction of the gallery (default: 0.01)")
    p.add_argument("--chunk-rows", type=int, default=None,
                   help="store chunk rows (default: synth's choice, ~8 MiB chunks)")
    p.add_argument("--classic-sort-threads", type=int, default=1,
                   help="threads for the classic argsort (default: 1, a single np.argsort call as "
                        "torchreid/fast-reid do; >1 splits the rows over threads)")
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "streameval-bench"),
                   help="where stores (and --against's checkouts and venvs, rev-COMMIT/) are created and reused; "
                        "not a folder of the checkout that git would show (default: %(default)s)")
    p.add_argument("--json", metavar="OUT", default=None, help="also write the results as JSON to OUT")
    # internal: one method in a child process
    p.add_argument("--_run", choices=[m for m in METHODS if m != "process"] + ["classic-process", "transcribe",
                                                                              *PROTOCOL_CHILDREN, *SUITE_CHILDREN,
                                                                              *RERANK_CHILDREN, FLOOR_CHILD],
                   help=argparse.SUPPRESS)
    p.add_argument("--_store", help=argparse.SUPPRESS)
    p.add_argument("--_out", help=argparse.SUPPRESS)
    p.add_argument("--_plan", help=argparse.SUPPRESS)  # QB,GC,WORKERS: the floors of --device follow the device's plan
    args = p.parse_args(argv)
    args.dtype = args.dtype or (RERANK_DTYPE if args.rerank else "float32")
    if args._run is None:
        known = (PROTOCOL_METHODS if args.protocols else SUITE_METHODS if args.suite else RERANK_METHODS if args.rerank
                 else DEVICE_METHODS if args.device is not None else METHODS)
        if args.rerank:
            check_rerank_args(p, args)
        if args.device is not None:
            check_device_args(p, args)
        elif args.skip_cpu or args.precision or args.memory_budget or args.breakdown:
            p.error("--skip-cpu, --precision, --memory-budget and --breakdown go with --device")
        if args.against is not None:
            if args.protocols or args.suite:
                p.error("--against compares the default mode's methods: not with --protocols or --suite")
            args.methods = args.methods or (",".join(RERANK_METHODS) if args.rerank else AGAINST_METHODS)
            try:
                args.against = resolve_revision(args.against)
            except ValueError as exc:
                p.error(str(exc))
        if args.suite:
            if args.protocols or args.scaling:
                p.error("--suite, --protocols and --scaling are separate modes: choose one")
            args.size = args.size or [SUITE_SIZE]
        if args.protocols:
            if args.scaling:
                p.error("--protocols and --scaling are separate modes: choose one")
            args.size = args.size or [PROTOCOL_SIZE]
            if not 1 <= args.trials <= 64:
                p.error("--trials must be from 1 to 64")
            if args.classic_budget <= 0:
                p.error("--classic-budget must be positive")
        if args.scaling:
            args.size = args.size or list(SCALING_SIZES)
            args.methods = args.methods or SCALING_METHODS
        if args.device is not None:
            args.methods, bad = device_methods(args.methods, args.skip_cpu)
        else:
            args.methods = [m.strip() for m in (args.methods or ",".join(known)).split(",") if m.strip()]
            bad = [m for m in args.methods if m not in known]
        if bad or not args.methods:
            p.error(f"--methods: unknown {', '.join(bad) or '(empty)'}; choose from {', '.join(known)}")
        try:
            args.sizes = [parse_size(s, args.ids) for s in (args.size or DEFAULT_SIZES)]
        except ValueError as exc:
            p.error(str(exc))
        if args.repeat < 1:
            p.error("--repeat must be at least 1")
        try:
            one_problem = args.scaling or args.protocols or args.suite or args.rerank or args.device
            args.noises = parse_noises(args.noise or ("easy" if one_problem else "easy,hard"))
        except ValueError as exc:
            p.error(str(exc))
        if not 0 < args.update_frac <= 1:
            p.error("--update-frac must be in (0, 1]")
        if args.classic_sort_threads < 1:
            p.error("--classic-sort-threads must be at least 1")
    return args


def check_rerank_args(p, args) -> None:
    """--rerank's flavour, scale and the modes it excludes; its sizes."""
    from streameval.features.rerank.flavours import FLAVOURS

    if args.rerank not in FLAVOURS:
        p.error(f"--rerank: unknown flavour {args.rerank!r}; choose from {', '.join(FLAVOURS)}")
    if args.protocols or args.suite or args.scaling:
        p.error("--rerank, --protocols, --suite and --scaling are separate modes: choose one")
    if not 0 < args.rerank_scale <= 1:
        p.error("--rerank-scale must be in (0, 1]")
    args.size = args.size or scaled_sizes(args.rerank_scale)


def check_device_args(p, args) -> None:
    """--device's name (as evaluate reads it, but not the CPU path's) and the modes it excludes."""
    from streameval.core.errors import OptionError
    from streameval.engine.device import parse_device

    try:
        if parse_device(args.device) is None:
            p.error("--device: the CPU path is the default; give cuda, cuda:N or torch:cpu")
    except OptionError as exc:
        p.error(f"--device: {exc}")
    if args.protocols or args.suite or args.scaling or args.rerank or args.against:
        p.error("--device is a separate mode: not with --protocols, --suite, --scaling, --rerank or --against")


def parse_noises(text: str) -> list[float]:
    """'easy,hard,2.5' -> [1.0, NOISE_HARD, 2.5]: synth's noise of each problem."""
    from streameval.tools.synth import NOISE_HARD

    named = {"easy": 1.0, "hard": NOISE_HARD}
    noises = []
    for item in (part.strip() for part in text.split(",")):
        try:
            noise = named[item] if item in named else float(item)
        except ValueError:
            raise ValueError(f"--noise: cannot read {item!r}; expected easy, hard or a number >= 0") from None
        if not 0 <= noise < float("inf"):
            raise ValueError(f"--noise: {item!r} is not a number >= 0")
        noises.append(noise)
    return list(dict.fromkeys(noises))


def noise_label(noise: float) -> str:
    """'easy (noise 1)', 'hard (noise 1.4)' or 'noise 2.5'."""
    from streameval.tools.synth import NOISE_HARD

    name = {1.0: "easy ", NOISE_HARD: "hard "}.get(noise, "")
    return f"{name}(noise {noise:g})" if name else f"noise {noise:g}"


def resolve_revision(rev: str) -> str:
    """The full commit id of ``rev`` in this script's repository (ValueError if there is none)."""
    try:
        return subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "--verify",
                               "--quiet", f"{rev}^{{commit}}"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        raise ValueError(f"--against: {rev!r} is not a commit of this repository") from None


def parse_size(text: str, ids_flag: int | None):
    """'NQxNGxD' or 'NQxNGxD:IDS' -> (nq, ng, dim, ids)."""
    shape, _, ids = text.partition(":")
    try:
        nq, ng, dim = (int(v) for v in shape.lower().split("x"))
        if ids:
            ids = int(ids)
        elif ids_flag is not None:
            ids = ids_flag
        else:
            ids = KNOWN_IDS.get((nq, ng, dim), max(1, nq // 5))
    except ValueError:
        raise ValueError(f"cannot read a size from {text!r}; expected NQxNGxD or NQxNGxD:IDS, e.g. 3368x19732x2048:750")
    if min(nq, ng, dim, ids) < 1:
        raise ValueError(f"size {text!r}: every number must be positive")
    return nq, ng, dim, ids


# --------------------------------------------------------------------------------------------------
# measurements shared by the children


def _proc_status() -> dict:
    try:
        with open("/proc/self/status") as fh:
            return {k: v.strip() for k, _, v in (line.partition(":") for line in fh)}
    except OSError:
        return {}


def rss_mb() -> float | None:
    kb = _proc_status().get("VmRSS")
    return int(kb.split()[0]) / 1024 if kb else None


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    """Peak RSS: VmHWM (since the last reset) if available, else ru_maxrss (whole process life)."""
    kb = _proc_status().get("VmHWM")
    if kb:
        return int(kb.split()[0]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 if sys.platform != "darwin" else 1 << 20)


def lifetime_maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 if sys.platform != "darwin" else 1 << 20)


def timed_runs(fn, repeat: int) -> dict:
    """Run ``fn`` ``repeat`` times; best wall time, peak RSS over the timed runs, last result."""
    base = rss_mb()
    peak_reset = reset_peak_rss()
    times, details, out = [], [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out, detail = fn()
        times.append(time.perf_counter() - t0)
        details.append(detail)
    best = min(range(repeat), key=times.__getitem__)
    return {
        "time_s": times[best], "times_s": times, "detail": details[best], "result": out,
        "base_rss_mb": base, "peak_rss_mb": peak_rss_mb(), "peak_rss_scope": "timed runs" if peak_reset else "process",
        "lifetime_maxrss_mb": lifetime_maxrss_mb(),
    }


class Combiner:
    """In-place norm combination of a block of GEMM output, on all cores, in cache-sized row tiles.

    ``dist`` holds ``-2 q.g`` (euclidean metrics) or ``-q.g / (|q||g|)`` (cosine); afterwards it holds
    the distances: ``max(|q|^2 + |g|^2 - 2 q.g, 0)`` (sqrt of it for euclidean) or ``1 - cos``.
    numpy ufuncs release the GIL, so the row ranges run in parallel threads.
    """

    TILE_BYTES = 256 << 10

    def __init__(self, metric: str, threads: int | None = None):
        from concurrent.futures import ThreadPoolExecutor

        self.metric = metric
        self.threads = threads or os.cpu_count() or 1
        self.pool = ThreadPoolExecutor(self.threads)
        list(self.pool.map(abs, range(self.threads)))  # start the threads

    def __call__(self, dist, qn, gn) -> None:
        import numpy as np

        n = dist.shape[0]
        tile = max(1, self.TILE_BYTES // (dist.itemsize * max(1, dist.shape[1])))
        bounds = np.linspace(0, n, self.threads + 1).astype(int)
        list(self.pool.map(lambda i: self._rows(dist, qn, gn, bounds[i], bounds[i + 1], tile), range(self.threads)))

    def _rows(self, dist, qn, gn, r0, r1, tile):
        import numpy as np

        for a in range(r0, r1, tile):
            d = dist[a:min(a + tile, r1)]
            if self.metric == "cosine":
                d += 1.0
            else:
                d += qn[a:a + d.shape[0]]
                d += gn
                np.maximum(d, 0.0, out=d)
                if self.metric == "euclidean":
                    np.sqrt(d, out=d)


# --------------------------------------------------------------------------------------------------
# (a) streameval


def sysu_like_protocol(trials: int):
    """The SYSU-like protocol of ``--protocols`` for a store whose cameras are not SYSU's: market with
    ``trials`` seeded gallery trials of one row per (pid, camera), the identity-dedup CMC, and SYSU's
    any-identity rule: query camera 3 never sees gallery camera 2 (docs/protocols.md#sysu-all-sysu-indoor)."""
    from dataclasses import replace

    from streameval import protocols

    market = protocols.resolve("market", trials=trials, cmc="identity-dedup")
    return replace(market, name="sysu-like", x_any=protocols.CameraRelation(pairs=((3, 2),)))


def _variant_options(variant: str, store_path: str, metric: str, trials: int = 10) -> dict:
    """evaluate() options of a streameval variant; se-fixed's HI bounds every distance (from norms).
    The protocol variants (``--protocols``) run without GOM, like se-closed."""
    if variant == "se-cuhk03":
        return {"no_gom": True, "protocol": "cuhk03-sgs", "sgs_repeats": trials}
    if variant == "se-sysu":
        return {"no_gom": True, "protocol": sysu_like_protocol(trials)}
    if variant == "se-closed":
        return {"no_gom": True}
    if variant == "se-osv":
        return {"no_gom": True, **OPEN_SET_VERIFICATION}
    if variant == "se-all":
        return dict(OPEN_SET_VERIFICATION)
    if variant == "se-fixed":
        import numpy as np

        from streameval.store import open_store

        store = open_store(store_path)
        top = max(float(np.sqrt((fs.features[:].astype(np.float32) ** 2).sum(1)).max()) for fs in (store.query, store.gallery))
        hi = {"cosine": 2.0, "euclidean": 2 * top, "sqeuclidean": 4 * top * top}[metric]
        return {"gom_norm": f"fixed:0:{hi:.6g}"}
    return {}


def warm_jit(metric: str, options: dict | None = None) -> tuple[float, str]:
    """Run streameval once on a tiny problem (with ``options``) so numba's compile time is not timed:
    in several gallery chunks, so the chains' merges compile too."""
    import numpy as np

    import streameval

    t0 = time.perf_counter()
    rng = np.random.default_rng(1)
    nq, ng, d = 40, 600, 32
    tiny = {
        "qf": rng.standard_normal((nq, d), dtype=np.float32), "q_pids": rng.integers(1, 20, nq),
        "q_camids": rng.integers(0, 3, nq), "gf": rng.standard_normal((ng, d), dtype=np.float32),
        "g_pids": rng.integers(1, 20, ng), "g_camids": rng.integers(0, 3, ng),
    }
    streameval.evaluate(tiny, metric=metric, gallery_chunk=128, **(options or {}))
    warm = time.perf_counter() - t0
    return warm, f"numba JIT warmed on a {nq}x{ng}x{d} problem ({warm:.1f} s, not timed)"


def run_streameval(args) -> dict:
    import streameval

    options = _variant_options(args._run, args._store, args.metric, args.trials)
    options.update({k: v for k, v in (("device", args.device), ("precision", args.precision),
                                      ("memory_budget", args.memory_budget)) if v})  # --device mode
    # each variant compiles its own statistics (verification, sgs, dedup, trial masks): warm those
    warm, warm_note = warm_jit(args.metric, options)

    def once():
        if not args.breakdown:
            return streameval.evaluate(args._store, metric=args.metric, **options), None
        t = time.perf_counter()
        with Breakdown() as timers:
            res = streameval.evaluate(args._store, metric=args.metric, **options)
        return res, {**timers.parts(), "workers x wall": res.run["workers"] * (time.perf_counter() - t)}

    out = timed_runs(once, args.repeat)
    res = out.pop("result")
    shown = {k: (v.name if k == "protocol" and not isinstance(v, str) else v) for k, v in options.items()}
    out["warmup"] = f"{warm_note}; options {shown or 'default'}"
    out["warmup_s"] = warm
    out["metrics"] = _metrics(res.mAP, res.rank(1), res.mINP, res.n_valid_queries)
    out["metrics"]["last_positive"] = last_positive_ranks(res.per_query)
    if args._run in PROTOCOL_CHILDREN:
        out["metrics"]["rank10"] = res.rank(10)
    if getattr(res, "trials", None):  # (a revision timed by --against may predate trials)
        out["metrics"]["n_valid_queries"] = res.n_valid_queries  # a mean over the trials
        out["metrics"]["per_trial"] = [dict(_metrics(t["mAP"], t["rank1"], t["mINP"], t["n_valid_queries"]),
                                            rank10=t["rank10"]) for t in res.trials["per_trial"]]
    out["plan"] = {k: res.run[k] for k in ("query_block", "gallery_chunk", "workers")}
    out["phases"] = res.run.get("phases")  # None where a revision predates them
    out["run_device"] = res.run.get("device")
    out["numbers_sha256"] = numbers_digest(res)
    out["streameval"] = os.path.dirname(os.path.abspath(streameval.__file__))
    return out


def numbers_digest(res) -> str:
    """A hash of every number of the result, per query too, but not the run's facts (times, device,
    plan): two results with the same digest gave the same numbers."""
    import hashlib

    numbers = res.to_dict(per_query=True)
    numbers.pop("run")
    return hashlib.sha256(json.dumps(numbers, sort_keys=True, default=repr).encode()).hexdigest()


def last_positive_ranks(per_query: dict) -> dict | None:
    """How deep the valid queries' last positives rank (median, 90th percentile, max): a query's
    positives over its INP, which is its positives over the rank of its last one.  None when the
    result has no per-query INP (several trials) or no valid query."""
    import numpy as np

    counts, inp = per_query.get("n_positives"), per_query.get("inp")
    if counts is None or inp is None or np.ndim(inp) != 1 or not (counts > 0).any():
        return None
    valid = counts > 0
    last = counts[valid] / inp[valid]
    return {"median": float(np.median(last)), "p90": float(np.percentile(last, 90)), "max": float(last.max())}


def append_distractor_copies(store_path: str, frac: float, seed: int) -> int:
    """Append ``frac`` x gallery rows: copies of random gallery rows, relabelled pid 0 in camera 0.
    A copy's distances already occur in the gallery, so they bring no new positive and no new
    minmax extreme: the case an incremental update is made for."""
    import numpy as np

    import streameval

    gallery = streameval.open_store(store_path).gallery
    n = max(1, round(frac * len(gallery)))
    rows = np.sort(np.random.default_rng(seed).choice(len(gallery), n, replace=False))
    features = np.asarray(gallery.features.oindex[rows])
    streameval.append_gallery(store_path, features, np.zeros(n, np.int64), np.zeros(n, np.int64))
    return n


def run_update(args) -> dict:
    """Per streameval variant: time update() after the append, and a full evaluate() of the grown store."""
    import shutil

    import streameval

    warm, warm_note = warm_jit(args.metric)
    work = tempfile.mkdtemp(prefix="bench-update-", dir=os.path.dirname(args._store))
    try:
        store = os.path.join(work, "store.zarr")
        shutil.copytree(args._store, store)
        variants = {variant: _variant_options(variant, store, args.metric) for variant in UPDATE_VARIANTS}
        for variant, options in variants.items():
            streameval.evaluate(store, metric=args.metric, state=os.path.join(work, variant), **options)
        added = append_distractor_copies(store, args.update_frac, args.seed)
        out = {"warmup": warm_note + "; store copied, evaluated with state= and appended to (not timed)",
               "warmup_s": warm, "rows_added": added, "variants": {}}
        for variant, options in variants.items():
            state, saved = os.path.join(work, variant), os.path.join(work, variant + ".saved")
            shutil.copytree(state, saved)

            def update_once():
                shutil.rmtree(state)
                shutil.copytree(saved, state)  # every run updates the same old state
                reset_peak_rss()
                t = time.perf_counter()
                res = streameval.update(store, state)
                return time.perf_counter() - t, res

            def full_once():
                t = time.perf_counter()
                res = streameval.evaluate(store, metric=args.metric, **options)
                return time.perf_counter() - t, res

            update_s, updated = min((update_once() for _ in range(args.repeat)), key=lambda run: run[0])
            update_rss = peak_rss_mb()
            reset_peak_rss()
            full_s, full = min((full_once() for _ in range(args.repeat)), key=lambda run: run[0])
            out["variants"][variant] = {
                "update_s": update_s, "full_s": full_s, "ratio": update_s / full_s, "update_peak_rss_mb": update_rss,
                "full_peak_rss_mb": peak_rss_mb(), "facts": updated.run["update"],
                "same_result": updated.to_dict(per_query=True) | {"run": None} == full.to_dict(per_query=True) | {"run": None},
            }
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --------------------------------------------------------------------------------------------------
# (b) the floor: bare distances over evaluate's blocks


def run_floor(args) -> dict:
    from streameval.store import open_store

    store = open_store(args._store)
    q_fs, g_fs = store.query, store.gallery
    return timed_floor(args, lambda a, b: q_fs.features[a:b], len(q_fs), lambda a, b: g_fs.features[a:b], len(g_fs),
                       store.dim, g_fs.features.dtype.itemsize, g_fs.chunk_rows)


def timed_floor(args, lhs_rows, n_lhs: int, rhs_rows, n_rhs: int, dim: int, stored_itemsize: int,
                chunk_rows: int) -> dict:
    """The floor over evaluate's chunk plan for an n_lhs x n_rhs product: ``lhs_rows(a, b)`` and
    ``rhs_rows(a, b)`` read rows a..b of either side (the query and gallery sets, or U twice)."""
    import numpy as np

    from streameval.engine.plan import make_plan

    dtype = np.dtype("float32")  # evaluate's default precision
    workers = os.cpu_count() or 1  # what evaluate uses without a distributed client
    plan = make_plan(n_lhs, n_rhs, dim, dtype.itemsize, stored_itemsize, chunk_rows, workers)
    cosine = args.metric == "cosine"

    t0 = time.perf_counter()
    a = np.ones((256, 256), dtype)
    _ = a @ a  # start the BLAS threads
    combine = Combiner(args.metric)
    warm = time.perf_counter() - t0

    def once():
        t_read = t_gemm = t_comb = 0.0
        buf = np.empty(plan.query_block * plan.gallery_chunk, dtype=dtype)  # reused output of the GEMMs
        for qa, qb in plan.query_ranges(n_lhs):
            t = time.perf_counter()
            q = np.ascontiguousarray(lhs_rows(qa, qb), dtype=dtype)
            t_read += time.perf_counter() - t
            t = time.perf_counter()
            qn = None
            if cosine:
                lhs = -(q / np.sqrt(np.einsum("ij,ij->i", q, q))[:, None])
            else:
                qn = np.einsum("ij,ij->i", q, q)[:, None]
                lhs = -2.0 * q  # fold the -2 into the query block (exact: a power of two)
            t_comb += time.perf_counter() - t
            for ga, gb in plan.gallery_ranges(n_rhs):
                t = time.perf_counter()
                g = np.ascontiguousarray(rhs_rows(ga, gb), dtype=dtype)
                t_read += time.perf_counter() - t
                t = time.perf_counter()
                gn = None
                if cosine:
                    g = g / np.sqrt(np.einsum("ij,ij->i", g, g))[:, None]
                else:
                    gn = np.einsum("ij,ij->i", g, g)
                t_comb += time.perf_counter() - t
                t = time.perf_counter()
                dist = buf[:(qb - qa) * (gb - ga)].reshape(qb - qa, gb - ga)
                np.matmul(lhs, g.T, out=dist)
                t_gemm += time.perf_counter() - t
                t = time.perf_counter()
                combine(dist, qn, gn)
                t_comb += time.perf_counter() - t
        return None, {"read+upcast": t_read, "gemm": t_gemm, "norms+combine": t_comb}

    out = timed_runs(once, args.repeat)
    out.pop("result")
    out["warmup"] = f"BLAS and combine threads started ({warm:.2f} s, not timed)"
    out["warmup_s"] = warm
    out["plan"] = {"query_block": plan.query_block, "gallery_chunk": plan.gallery_chunk, "workers": plan.workers}
    return out


# --------------------------------------------------------------------------------------------------
# (c) the classic full-matrix evaluator


def _classic_kernel():
    import numba as nb
    import numpy as np

    @nb.njit(parallel=True, nogil=True, cache=True)  # cached: a classic process loads it as torchreid loads its Cython
    def eval_market1501(indices, q_pids, q_camids, g_pids, g_camids, g_junk, ap, inp, first_hit):
        """torchreid's Cython ``eval_market1501`` per query, as a numba prange loop.

        For each query: walk the sorted gallery, drop junk pids and same-pid same-camera items,
        build the match vector of what is kept, then one cumulative pass gives the first hit (CMC),
        AP = mean of the precision at each hit, and INP = hits / rank of the last hit.
        """
        nq, ng = indices.shape
        for q in nb.prange(nq):
            qp = q_pids[q]
            qc = q_camids[q]
            order = indices[q]
            matches = np.empty(ng, dtype=np.uint8)
            kept = 0
            for k in range(ng):
                g = order[k]
                gp = g_pids[g]
                if g_junk[g] != 0 or (gp == qp and g_camids[g] == qc):
                    continue
                matches[kept] = 1 if gp == qp else 0
                kept += 1
            hits = 0
            ap_sum = 0.0
            first = -1
            last = 0
            for k in range(kept):  # cumsum of the match vector
                if matches[k]:
                    hits += 1
                    ap_sum += hits / (k + 1.0)
                    if first < 0:
                        first = k + 1
                    last = k + 1
            if hits == 0:  # query identity not in the gallery: skipped (open-set query)
                first_hit[q] = -1
                ap[q] = np.nan
                inp[q] = np.nan
            else:
                first_hit[q] = first
                ap[q] = ap_sum / hits
                inp[q] = hits / last
    return eval_market1501


def run_classic(args) -> dict:
    import numpy as np

    kernel = _classic_kernel()
    t0 = time.perf_counter()
    rng = np.random.default_rng(1)
    idx = np.argsort(rng.random((8, 64), dtype=np.float32), axis=1)
    ids = lambda n, hi: rng.integers(0, hi, n).astype(np.int64)  # noqa: E731
    kernel(idx, ids(8, 5), ids(8, 3), ids(64, 5), ids(64, 3), np.zeros(64, np.uint8),
           np.empty(8), np.empty(8), np.empty(8, np.int64))
    a = np.ones((256, 256), np.float32)
    _ = a @ a
    combine = Combiner("sqeuclidean" if args.metric == "euclidean" else args.metric)
    warm = time.perf_counter() - t0
    out = timed_runs(classic_evaluation(args, kernel, combine), args.repeat)
    out["metrics"] = out.pop("result")
    out["warmup"] = f"numba eval loop loaded, BLAS started ({warm:.1f} s, not timed)"
    out["warmup_s"] = warm
    out["sort_threads"] = args.classic_sort_threads
    return out


def run_classic_process(args) -> None:
    """The classic evaluator as the whole process a user runs: one evaluation, metrics on stdout."""
    combine = Combiner("sqeuclidean" if args.metric == "euclidean" else args.metric)
    once = classic_evaluation(args, _classic_kernel(), combine)
    print(json.dumps(once()[0]))


def classic_evaluation(args, kernel, combine):
    """One classic evaluation of the store, as a function returning (metrics, time breakdown)."""
    import numpy as np

    from streameval.store import open_store

    store = open_store(args._store)
    junk_pids = np.array([-1], dtype=np.int64)  # streameval's default junk_pids

    def once():
        seconds = {}
        data, distmat, indices = classic_ranking(store, args, combine, seconds)

        t = time.perf_counter()
        nq = data["qf"].shape[0]
        ap, inp, first_hit = np.empty(nq), np.empty(nq), np.empty(nq, dtype=np.int64)
        g_junk = np.isin(data["g_pids"], junk_pids).astype(np.uint8)
        kernel(indices, data["q_pids"], data["q_camids"], data["g_pids"], data["g_camids"], g_junk, ap, inp, first_hit)
        valid = first_hit > 0
        n_valid = int(valid.sum())
        metrics = _metrics(float(ap[valid].mean()) if n_valid else None,
                           float((first_hit[valid] == 1).mean()) if n_valid else None,
                           float(inp[valid].mean()) if n_valid else None, n_valid)
        seconds["eval loop"] = time.perf_counter() - t
        del distmat, indices
        return metrics, seconds

    return once


def classic_matrix(store, args, combine, seconds: dict):
    """(ids and features, the full distance matrix), their times added to ``seconds`` as "load" and
    "distmat": the first steps of every classic evaluation."""
    t = time.perf_counter()
    data = classic_load(store)
    seconds["load"] = time.perf_counter() - t
    t = time.perf_counter()
    distmat = classic_distmat(data, args.metric, combine)
    seconds["distmat"] = time.perf_counter() - t
    return data, distmat


def classic_ranking(store, args, combine, seconds: dict):
    """``classic_matrix`` and every row's argsort (timed as "argsort"): (data, distmat, indices)."""
    data, distmat = classic_matrix(store, args, combine, seconds)
    t = time.perf_counter()
    indices = classic_argsort(distmat, args.classic_sort_threads)
    seconds["argsort"] = time.perf_counter() - t
    return data, distmat, indices


def classic_load(store) -> dict:
    """Everything in memory, as the classic codebases hold it: float32 features, int64 labels."""
    import numpy as np

    return {
        "qf": np.asarray(store.query.features[:], dtype=np.float32),
        "gf": np.asarray(store.gallery.features[:], dtype=np.float32),
        "q_pids": np.asarray(store.query.pids[:], dtype=np.int64),
        "q_camids": np.asarray(store.query.camids[:], dtype=np.int64),
        "g_pids": np.asarray(store.gallery.pids[:], dtype=np.int64),
        "g_camids": np.asarray(store.gallery.camids[:], dtype=np.int64),
    }


def classic_distmat(data: dict, metric: str, combine):
    """The full Nq x Ng float32 distance matrix.

    torchreid: euclidean_squared_distance = |q|^2 + |g|^2 - 2 q g^T (addmm_), cosine_distance =
    1 - normalize(q) normalize(g)^T.  Here: one float32 GEMM on all cores with the -2 folded into q,
    then the norms added in place, in cache-sized tiles on all cores (``combine``: sqeuclidean for both
    euclidean metrics, the same ranking).
    """
    import numpy as np

    qf, gf = data["qf"], data["gf"]
    if metric == "cosine":
        qn, gn = None, None
        lhs = -(qf / np.linalg.norm(qf, axis=1, keepdims=True))
        rhs = gf / np.linalg.norm(gf, axis=1, keepdims=True)
    else:
        qn = np.einsum("ij,ij->i", qf, qf)[:, None]
        gn = np.einsum("ij,ij->i", gf, gf)
        lhs, rhs = -2.0 * qf, gf
    distmat = lhs @ rhs.T
    combine(distmat, qn, gn)
    return distmat


def classic_argsort(distmat, threads: int):
    """``np.argsort(distmat, axis=1)``; with threads > 1 the rows split over threads."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    if threads == 1:
        return np.argsort(distmat, axis=1)
    indices = np.empty(distmat.shape, dtype=np.intp)
    bounds = np.linspace(0, distmat.shape[0], threads + 1).astype(int)

    def part(i):
        indices[bounds[i]:bounds[i + 1]] = np.argsort(distmat[bounds[i]:bounds[i + 1]], axis=1)

    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(part, range(threads)))
    return indices


def _metrics(mAP, rank1, mINP, n_valid) -> dict:
    return {"mAP": mAP, "rank1": rank1, "mINP": mINP, "n_valid_queries": int(n_valid)}


# --------------------------------------------------------------------------------------------------
# (e) --protocols: the classic implementations of cuhk03-sgs and SYSU (plain Python/numpy, as upstream)


def run_classic_protocol(args) -> dict:
    """classic-cuhk03 or classic-sysu: best of --repeat; a loop cut by --classic-budget counts with its
    linear extrapolation (the parts of the breakdown add up to the reported time)."""
    import numpy as np

    from streameval.store import open_store

    t0 = time.perf_counter()
    a = np.ones((256, 256), np.float32)
    _ = a @ a  # start the BLAS threads
    combine = Combiner("sqeuclidean" if args.metric == "euclidean" else args.metric)
    warm = time.perf_counter() - t0
    store = open_store(args._store)
    evaluation = classic_cuhk03 if args._run == "classic-cuhk03" else classic_sysu
    out = timed_runs(lambda: evaluation(store, args, combine), args.repeat)
    out["metrics"] = out.pop("result")
    if out["metrics"]["subset"]:
        out["time_s"] = sum(out["detail"].values())
    out["warmup"] = f"BLAS started ({warm:.2f} s, not timed)"
    out["warmup_s"] = warm
    return out


def classic_cuhk03(store, args, combine):
    """torchreid's Python ``eval_cuhk03`` (torchreid/metrics/rank.py) on the full matrix: (metrics, seconds)."""
    import numpy as np

    seconds = {}
    data, distmat, indices = classic_ranking(store, args, combine, seconds)
    t = time.perf_counter()
    q_pids, q_camids, g_pids, g_camids = (data[k] for k in ("q_pids", "q_camids", "g_pids", "g_camids"))
    matches = (g_pids[indices] == q_pids[:, np.newaxis]).astype(np.int32)
    g_junk = g_pids == -1  # streameval's default junk pid (torchreid's eval_cuhk03 has none)
    seconds["matches"] = time.perf_counter() - t

    np.random.seed(args.seed)  # torchreid leaves the global generator unseeded
    t = time.perf_counter()
    deadline = t + args.classic_budget
    num_q = distmat.shape[0]
    all_cmc, all_AP = [], []
    done = 0
    while done < num_q and time.perf_counter() < deadline:
        q_idx = done
        done += 1
        q_pid, q_camid = q_pids[q_idx], q_camids[q_idx]
        order = indices[q_idx]
        remove = ((g_pids[order] == q_pid) & (g_camids[order] == q_camid)) | g_junk[order]
        keep = np.invert(remove)
        raw_cmc = matches[q_idx][keep]
        if not np.any(raw_cmc):
            continue
        kept_g_pids = g_pids[order][keep]
        g_pids_dict = defaultdict(list)
        for idx, pid in enumerate(kept_g_pids):
            g_pids_dict[pid].append(idx)
        cmc = 0.
        for _ in range(args.trials):
            mask = np.zeros(len(raw_cmc), dtype=bool)  # torchreid: np.bool, gone since numpy 1.24
            for _, idxs in g_pids_dict.items():
                rnd_idx = np.random.choice(idxs)  # one sampled gallery image per identity
                mask[rnd_idx] = True
            masked_raw_cmc = raw_cmc[mask]
            _cmc = masked_raw_cmc.cumsum()
            _cmc[_cmc > 1] = 1
            cmc += _cmc[:MAX_RANK].astype(np.float32)
        cmc /= args.trials
        all_cmc.append(cmc)
        num_rel = raw_cmc.sum()  # AP on the full kept list
        tmp_cmc = raw_cmc.cumsum()
        tmp_cmc = [x / (i + 1.) for i, x in enumerate(tmp_cmc)]
        tmp_cmc = np.asarray(tmp_cmc) * raw_cmc
        all_AP.append(tmp_cmc.sum() / num_rel)
    seconds["eval loop"] = (time.perf_counter() - t) * num_q / done
    del distmat, indices, matches
    n_valid = len(all_AP)
    cmc = np.asarray(all_cmc, dtype=np.float32).sum(0) / n_valid if n_valid else None
    metrics = _metrics(float(np.mean(all_AP)) if n_valid else None, float(cmc[0]) if n_valid else None, None, n_valid)
    metrics["rank10"] = float(cmc[9]) if n_valid else None
    metrics["subset"] = _subset(done, num_q, "queries", seconds["eval loop"] * done / num_q)
    return metrics, seconds


def classic_sysu(store, args, combine):
    """mangye16's ``eval_sysu`` (Cross-Modal-Re-ID-baseline eval_metrics.py) per trial, on the full matrix
    computed once and masked to each trial's gallery: (metrics, seconds)."""
    import numpy as np

    from streameval.protocols.draws import bits_to_masks, trial_bits

    seconds = {}
    data, distmat = classic_matrix(store, args, combine, seconds)
    q_pids, q_camids, g_pids, g_camids = (data[k] for k in ("q_pids", "q_camids", "g_pids", "g_camids"))
    t = time.perf_counter()
    # the trial galleries streameval draws (upstream: random.choice per (pid, camera)), so numbers agree
    gallery_bits, _ = trial_bits(sysu_like_protocol(args.trials), g_pids, g_camids, q_pids, q_camids, len(g_pids))
    trial_masks = bits_to_masks(gallery_bits, args.trials)
    seconds["draws"] = time.perf_counter() - t

    t = time.perf_counter()
    deadline = t + args.classic_budget
    per_trial, sort_s = [], 0.0
    while len(per_trial) < args.trials and time.perf_counter() < deadline:
        cols = np.flatnonzero(trial_masks[len(per_trial)])
        t_sort = time.perf_counter()
        indices = np.argsort(distmat[:, cols], axis=1)  # every trial re-sorts, as upstream
        sort_s += time.perf_counter() - t_sort
        per_trial.append(eval_sysu(indices, q_pids, q_camids, g_pids[cols], g_camids[cols]))
    done = len(per_trial)
    loop_s = (time.perf_counter() - t) * args.trials / done
    seconds["argsort"] = sort_s * args.trials / done
    seconds["eval loop"] = loop_s - seconds["argsort"]
    del distmat
    metrics = {key: _mean_or_none([m[key] for m in per_trial]) for key in ("mAP", "rank1", "rank10", "mINP")}
    metrics["n_valid_queries"] = float(np.mean([m["n_valid_queries"] for m in per_trial]))
    metrics["per_trial"] = per_trial
    metrics["subset"] = _subset(done, args.trials, "trials", loop_s * done / args.trials)
    return metrics, seconds


def eval_sysu(indices, q_pids, q_camids, g_pids, g_camids) -> dict:
    """One trial of mangye16's ``eval_sysu``: per query, the kept list (upstream's (3, 2) rule, plus the
    market rule of the SYSU-like protocol and junk), its identity-deduplicated CMC, AP and INP.
    Queries without a positive are skipped (upstream appends their dedup curve first, which only
    matters when some query has no positive)."""
    import numpy as np

    pred_label = g_pids[indices]
    matches = (g_pids[indices] == q_pids[:, np.newaxis]).astype(np.int32)
    new_all_cmc, all_AP, all_INP = [], [], []
    for q_idx in range(indices.shape[0]):
        q_pid, q_camid = q_pids[q_idx], q_camids[q_idx]
        order = indices[q_idx]
        remove = (((q_camid == 3) & (g_camids[order] == 2)) | ((g_pids[order] == q_pid) & (g_camids[order] == q_camid))
                  | (g_pids[order] == -1))
        keep = np.invert(remove)
        orig_cmc = matches[q_idx][keep]
        if not np.any(orig_cmc):
            continue
        new_cmc = pred_label[q_idx][keep]
        new_index = np.unique(new_cmc, return_index=True)[1]
        new_cmc = [new_cmc[index] for index in sorted(new_index)]  # identities by first appearance
        new_match = (np.asarray(new_cmc) == q_pid).astype(np.int32)
        new_cmc = new_match.cumsum()
        new_cmc = np.pad(new_cmc, (0, max(0, MAX_RANK - len(new_cmc))), mode="edge")  # upstream needs >= max_rank ids
        new_all_cmc.append(new_cmc[:MAX_RANK])

        cmc = orig_cmc.cumsum()
        pos_max_idx = np.max(np.where(orig_cmc == 1))
        all_INP.append(cmc[pos_max_idx] / (pos_max_idx + 1.0))
        num_rel = orig_cmc.sum()
        tmp_cmc = orig_cmc.cumsum()
        tmp_cmc = [x / (i + 1.) for i, x in enumerate(tmp_cmc)]
        tmp_cmc = np.asarray(tmp_cmc) * orig_cmc
        all_AP.append(tmp_cmc.sum() / num_rel)
    n_valid = len(all_AP)
    if not n_valid:
        return dict(_metrics(None, None, None, 0), rank10=None)
    new_all_cmc = np.asarray(new_all_cmc, dtype=np.float32).sum(0) / n_valid
    metrics = _metrics(float(np.mean(all_AP)), float(new_all_cmc[0]), float(np.mean(all_INP)), n_valid)
    metrics["rank10"] = float(new_all_cmc[9])
    return metrics


def _subset(done: int, total: int, unit: str, measured_s: float) -> dict | None:
    """None when the loop ran in full, else what the extrapolation rests on."""
    if done == total:
        return None
    return {"done": done, "of": total, "unit": unit, "measured_loop_s": measured_s}


def _mean_or_none(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def child_main(args) -> int:
    if args._run in ("classic-process", "transcribe"):
        (run_classic_process if args._run == "classic-process" else transcribe_child)(args)
        return 0
    t0 = time.perf_counter()
    runners = {"floor": run_floor, "classic": run_classic, "update": run_update,
               "se-cuhk03": run_streameval, "se-sysu": run_streameval,
               "classic-cuhk03": run_classic_protocol, "classic-sysu": run_classic_protocol,
               **{variant: run_streameval for variant in VARIANTS}, **dict.fromkeys(SUITE_CHILDREN, run_child_method),
               **RERANK_RUNNERS, FLOOR_CHILD: run_device_floors}
    out = runners[args._run](args)
    out["child_total_s"] = time.perf_counter() - t0
    with open(args._out, "w") as fh:
        json.dump(out, fh)
    return 0


# --------------------------------------------------------------------------------------------------
# (d) whole processes, as a user runs them


def streameval_command(python: str = sys.executable) -> list:
    """The installed ``streameval`` script of ``python``'s environment (else the CLI module)."""
    script = os.path.join(os.path.dirname(python), "streameval")
    return [script] if os.path.exists(script) else [python, "-m", "streameval.cli"]


def time_process(cmd: list, env: dict | None = None) -> dict:
    """Wall time from spawn to exit and peak RSS (the child's own, from wait4) of one process;
    ``env``: variables set for it on top of this process's environment."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                env=None if env is None else {**os.environ, **env})
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        result = {"time_s": wall, "peak_rss_mb": usage.ru_maxrss / 1024, "stdout": out.read()}
        if proc.returncode != 0:
            result["error"] = f"exited with {proc.returncode}: {err.read().strip()[-2000:]}"
    return result


def best_of_processes(runs: list, cmd: list) -> dict:
    """The best of ``runs`` (``time_process`` results) with every run's time, or the first error."""
    failed = [run for run in runs if "error" in run]
    if failed:
        return {"error": failed[0]["error"], "command": cmd}
    best = min(runs, key=lambda run: run["time_s"])
    return {"time_s": best["time_s"], "times_s": [run["time_s"] for run in runs], "peak_rss_mb": best["peak_rss_mb"],
            "stdout": best["stdout"], "command": cmd}


def best_process_time(cmd: list, repeat: int) -> dict:
    """One untimed warm-up run (numba caches written, modules and data in the page cache), then the
    best of ``repeat``."""
    warm = time_process(cmd)
    if "error" in warm:
        return {"error": warm["error"], "command": cmd}
    return best_of_processes([time_process(cmd) for _ in range(repeat)], cmd)


def cold_and_warm_times(commands: dict, repeat: int, workdir: str) -> dict:
    """{side: {"cold": best, "warm": best}} of each side's command (``commands``: side -> argv).

    Cold: numba's cache empty (NUMBA_CACHE_DIR a fresh folder; streameval keeps a user's cache folder
    and makes its versioned one inside it), so every kernel the run needs is compiled.  Warm: the
    same command again with that folder, as it is for a user after the first run.  Each of the
    ``repeat`` rounds runs every side cold, then every side warm (HEAD, REV, HEAD, REV), so the
    machine's drift affects the sides alike."""
    import shutil

    runs = {side: {"cold": [], "warm": []} for side in commands}
    for _ in range(repeat):
        caches = {side: tempfile.mkdtemp(prefix="bench-numba-cache-", dir=workdir) for side in commands}
        try:
            for phase in ("cold", "warm"):
                for side, cmd in commands.items():
                    runs[side][phase].append(time_process(cmd, {"NUMBA_CACHE_DIR": caches[side]}))
        finally:
            for cache in caches.values():
                shutil.rmtree(cache, ignore_errors=True)
    return {side: {phase: best_of_processes(r, commands[side]) for phase, r in phases.items()}
            for side, phases in runs.items()}


def run_processes(args, sides: dict) -> dict:
    """The whole-process timings of ``PROCESSES``: each streameval command cold and warm on every side
    (``sides``: label -> (python, store path); the working tree's first), the classic evaluator's
    process on the first side only, unless --against (it would not differ)."""
    def cli(python, store):
        return streameval_command(python) + ["eval", store, "-q", "--metric", args.metric]

    out = {name: cold_and_warm_times({side: cli(*where) + extra for side, where in sides.items()}, args.repeat,
                                     args.workdir)
           for name, extra in (("cli-closed", ["--no-gom"]), ("cli", []))}
    if not args.against:
        store = next(iter(sides.values()))[1]
        out["classic-process"] = best_process_time(
            [sys.executable, os.path.abspath(__file__), "--_run", "classic-process", "--_store", store, "--metric",
             args.metric, "--classic-sort-threads", str(args.classic_sort_threads)], args.repeat)
    return out


def startup_times(args, python: str = sys.executable) -> dict:
    """Wall time of ``streameval --help`` and ``python -c "import streameval"`` (best of at least 3)."""
    commands = {"streameval --help": streameval_command(python) + ["--help"],
                'python -c "import streameval"': [python, "-P", "-c", "import streameval"]}  # -P: not the cwd's
    return {name: best_process_time(cmd, max(3, args.repeat)) for name, cmd in commands.items()}


def print_startup(startup: dict, side: str = "") -> None:
    cells = [f"{name} {r['time_s']:.3f} s" if "time_s" in r else f"{name} FAILED: {r['error']}"
             for name, r in startup.items()]
    print(f"start-up{side}: " + ", ".join(cells) + " (fresh processes, best of 3 after a warm-up; goal < 0.5 s)")


# --------------------------------------------------------------------------------------------------
# parent: stores, children, table


def synth_fingerprint() -> str:
    """Hash of streameval/synth.py: a store made by a different generator is not reused."""
    import hashlib

    import streameval.tools.synth

    with open(streameval.tools.synth.__file__, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()[:16]


def store_params(args, size, noise: float = 1.0) -> dict:
    nq, ng, dim, ids = size
    return {
        "n_query": nq, "n_gallery": ng, "dim": dim, "n_ids": ids, "n_cams": args.cams, "seed": args.seed, "noise": noise,
        "junk_frac": args.junk_frac, "distractor_frac": args.distractor_frac,
        "open_query_frac": args.open_query_frac, "dtype": args.dtype, "chunk_rows": args.chunk_rows,
        **({"variants": args.suite, "variant_trials": args.trials} if getattr(args, "suite", None) else {}),
    }


def store_name(params: dict) -> str:
    name = (f"synth_{params['n_query']}x{params['n_gallery']}x{params['dim']}_ids{params['n_ids']}"
            f"_cams{params['n_cams']}_{params['dtype']}_seed{params['seed']}")
    for key, tag, default in (("junk_frac", "junk", 0), ("distractor_frac", "distr", 0), ("open_query_frac", "open", 0),
                              ("noise", "noise", 1)):
        if params[key] != default:
            name += f"_{tag}{params[key]:g}"
    if params["chunk_rows"]:
        name += f"_rows{params['chunk_rows']}"
    if params.get("variants"):
        name += f"_{params['variants']}{params['variant_trials']}"
    return name + ".zarr"


def ensure_store(args, size, noise: float = 1.0) -> tuple[str, str]:
    """The store for this size and synth noise under --workdir: reused if its recorded parameters match."""
    from streameval.core.errors import StoreError
    from streameval.store import open_store

    try:
        from streameval.tools.synth import synthesize
    except ImportError as exc:
        sys.exit(f"bench: cannot import streameval.tools.synth ({exc}); it is needed to create the store")
    params = store_params(args, size, noise)
    path = os.path.join(args.workdir, store_name(params))
    marker = path + PARAMS_SUFFIX
    recorded = dict(params, synth_sha256=synth_fingerprint())
    if os.path.exists(path) and os.path.exists(marker):
        try:
            with open(marker) as fh:
                same = json.load(fh) == recorded
            store = open_store(path)
            same = same and (len(store.query), len(store.gallery), store.dim) == size[:3]
        except (OSError, ValueError, StoreError):
            same = False
        if same:
            return path, "reused"
    os.makedirs(args.workdir, exist_ok=True)
    if os.path.exists(marker):
        os.remove(marker)
    t = time.perf_counter()
    synthesize(path, default_metric="euclidean", overwrite=True, progress=sys.stderr.isatty(), **params)
    with open(marker, "w") as fh:
        json.dump(recorded, fh)
    return path, f"created in {time.perf_counter() - t:.1f} s"


def warm_page_cache(path: str) -> float:
    """Read every file of the store once so every method starts from the same (warm) page cache."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as fh:
                while chunk := fh.read(1 << 24):
                    total += len(chunk)
    return total / 2**20


def run_child(args, method: str, store_path: str, python: str = sys.executable, repeat: int | None = None,
              extra: list = ()) -> dict:
    """``method`` timed in a child process of ``python`` (this bench's code, with the streameval
    that python imports), ``repeat`` runs (default --repeat), ``extra`` added to its options."""
    fd, out_path = tempfile.mkstemp(prefix=f"bench-{method}-", suffix=".json", dir=args.workdir)
    os.close(fd)
    cmd = [python, os.path.abspath(__file__), "--_run", method, "--_store", store_path, "--_out", out_path,
           "--metric", args.metric, "--repeat", str(repeat or args.repeat), "--update-frac", str(args.update_frac),
           "--seed", str(args.seed), "--trials", str(args.trials), "--classic-budget", str(args.classic_budget),
           "--classic-sort-threads", str(args.classic_sort_threads), *(["--suite", args.suite] if args.suite else []),
           *extra]
    t = time.perf_counter()
    busy0, cpu0 = _cpu_busy_s(), _children_cpu_s()
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stdout + proc.stderr)
            return {"error": f"child exited with {proc.returncode}"}
        with open(out_path) as fh:
            out = json.load(fh)
    finally:
        os.remove(out_path)
    out["process_s"] = time.perf_counter() - t
    if busy0 is not None:
        busy1 = _cpu_busy_s()
        # CPU time of everything else on the machine while the child ran, in cores on average
        out["others_cores"] = max(0.0, (busy1 - busy0) - (_children_cpu_s() - cpu0)) / out["process_s"]
    return out


def _cpu_busy_s() -> float | None:
    """Non-idle CPU seconds of the whole machine since boot (Linux /proc/stat), else None."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(v) for v in fh.readline().split()[1:8]]
        return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def machine_facts() -> dict:
    import numpy as np
    import threadpoolctl

    blas = [
        {k: info.get(k) for k in ("internal_api", "version", "num_threads", "architecture", "threading_layer")}
        for info in threadpoolctl.threadpool_info() if info.get("user_api") == "blas"
    ]
    versions = {"python": platform.python_version(), "numpy": np.__version__}
    for mod in ("numba", "dask", "zarr", "streameval"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # pragma: no cover - just a report
            versions[mod] = None
    env = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                      "MKL_NUM_THREADS", "NUMBA_NUM_THREADS", "NUMBA_THREADING_LAYER")
           if k in os.environ}
    return {"cpus": os.cpu_count(), "streameval_source": _source_state(), "machine": platform.machine(), "processor": _cpu_model(),
            "mem_gb": _mem_gb(), "blas": blas, "versions": versions, "env": env,
            "loadavg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def _source_state() -> str | None:
    """Which streameval code ran: git commit and uncommitted changes under streameval/, if a checkout."""
    import streameval

    pkg = os.path.dirname(os.path.abspath(streameval.__file__))
    try:
        head = subprocess.run(["git", "-C", pkg, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", pkg, "status", "--porcelain", "--", "."], capture_output=True,
                               text=True, check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return None
    changed = sorted(line[3:].strip() for line in dirty if line.strip())
    return f"git {head}" + (f" + uncommitted changes ({', '.join(changed)})" if changed else "")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _mem_gb() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def print_header(facts: dict, args) -> None:
    blas = ", ".join(f"{b['internal_api']} {b['version']} ({b['architecture']}, {b['num_threads']} threads)"
                     for b in facts["blas"]) or "unknown"
    v = facts["versions"]
    print(f"machine : {facts['cpus']} cpus ({facts['processor']}), "
          f"{facts['mem_gb']:.0f} GB RAM" if facts["mem_gb"] else f"machine : {facts['cpus']} cpus")
    print(f"BLAS    : {blas}")
    print("versions: " + ", ".join(f"{k} {val}" for k, val in v.items())
          + (f"; streameval source {facts['streameval_source']}" if facts["streameval_source"] else ""))
    if "OPENBLAS_CORETYPE" in facts["env"]:
        print(f"NOTE    : OPENBLAS_CORETYPE={facts['env']['OPENBLAS_CORETYPE']} is set: OpenBLAS kernels are "
              f"forced to that core type (results may not reflect this CPU's best kernels)")
    others = {k: val for k, val in facts["env"].items() if k != "OPENBLAS_CORETYPE"}
    if others:
        print("env     : " + ", ".join(f"{k}={val}" for k, val in others.items()))
    load = facts["loadavg_at_start"]
    if load:
        print(f"load    : {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1/5/15 min)"
              + ("  WARNING: the machine is busy, timings will be noisy" if load[0] > 0.5 else ""))
    print(f"options : metric={args.metric}, store dtype={args.dtype}, cams={args.cams}, seed={args.seed}, "
          f"repeat={args.repeat} (best of), methods={','.join(args.methods)}, workdir={args.workdir}")
    print(f"problems: each size at {', '.join(noise_label(noise) for noise in args.noises)}")
    if args.device:
        print(f"device  : {args.device} (torch {_torch_version()}), precision {args.precision or 'float32'}"
              + f", memory budget {args.memory_budget or _default_budget() + ' (the default)'}"
              + (", CPU path skipped (--skip-cpu)" if args.skip_cpu else ""))
    print("timing  : wall time of the evaluation only (no process start, imports or JIT warm-up), each method in a "
          "fresh child process; peak RSS = the child's VmHWM over the timed run(s), base = its RSS before them; "
          "'process': whole processes, spawn to exit")
    print()


def _default_budget() -> str:
    """The memory budget a run on this machine's cores plans for when it names none."""
    from streameval.engine.plan import default_memory_budget, format_bytes

    return format_bytes(default_memory_budget(os.cpu_count() or 1))


def _torch_version() -> str | None:
    """torch's version as installed, without importing it (the device's children do)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def fmt(value, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def problem_title(size, noise: float, args) -> str:
    nq, ng, dim, ids = size
    return (f"{nq} x {ng} x {dim}  ({ids} ids, {args.cams} cams, {args.dtype} store, metric {args.metric}, "
            f"{noise_label(noise)})")


def problem_line(results: dict) -> str:
    """How hard the problem is: the numbers of the first streameval method that ran (else the
    classic evaluator's), and how deep the queries' last positives rank."""
    method = next((m for m in (*VARIANTS, "classic") if "metrics" in results.get(m, {})), None)
    if method is None:
        return "problem : no method gave the numbers"
    m = results[method]["metrics"]
    text = f"problem : mAP {fmt(m['mAP'], '.4f')}, rank-1 {fmt(m['rank1'], '.4f')}, mINP {fmt(m['mINP'], '.4f')}"
    last = m.get("last_positive")
    if last:
        text += (f"; a query's last positive at rank {last['median']:,.0f} (median), {last['p90']:,.0f} (90th "
                 f"percentile), {last['max']:,.0f} (deepest)")
    return text + f"  ({method})"


def passes_over_gemm(r: dict, floor: dict | None) -> float | None:
    """The run's scoring passes (its phase "passes") over the floor's GEMM time; None where the run
    has no phases (a revision before them) or there is no floor."""
    gemm = ((floor or {}).get("detail") or {}).get("gemm")
    passes = (r.get("phases") or {}).get("passes")
    return passes / gemm if passes and gemm else None


def report_size(size, noise, store_path, how, results: dict, args) -> dict:
    nq, ng, dim, ids = size
    print(f"=== {problem_title(size, noise, args)} ===")
    print(f"store   : {store_path} ({how})")
    print(problem_line(results))
    floor = results.get("floor", {}).get("time_s")
    classic = results.get("classic", {}).get("time_s")
    rows = []
    header = (f"{'method':<12}{'time (s)':>10}{'peak RSS (MB)':>15}{'base RSS (MB)':>15}{'x floor':>9}"
              f"{'passes/GEMM':>13}{'vs classic':>12}")
    print(header)
    print("-" * len(header))
    for method in METHODS:
        if method not in results or method in ("update", "process"):
            continue
        r = results[method]
        if "error" in r:
            print(f"{method:<12}  FAILED: {r['error']}")
            rows.append({"method": method, "error": r["error"]})
            continue
        t = r["time_s"]
        x_floor = t / floor if floor else None
        passes = passes_over_gemm(r, results.get("floor"))
        vs_classic = classic / t if classic else None
        speedup = "-" if vs_classic is None else f"{vs_classic:.2f}x"
        print(f"{method:<12}{t:>10.3f}{r['peak_rss_mb']:>15.0f}{fmt(r['base_rss_mb'], '.0f'):>15}"
              f"{fmt(x_floor, '.2f'):>9}{fmt(passes, '.2f'):>13}{speedup:>12}")
        rows.append({"method": method, "time_s": t, "times_s": r["times_s"], "peak_rss_mb": r["peak_rss_mb"],
                     "base_rss_mb": r["base_rss_mb"], "lifetime_maxrss_mb": r["lifetime_maxrss_mb"],
                     "x_floor": x_floor, "passes_over_gemm": passes, "phases": r.get("phases"),
                     "speedup_vs_classic": vs_classic, "detail": r.get("detail"),
                     "plan": r.get("plan"), "metrics": r.get("metrics"), "warmup": r.get("warmup"),
                     "warmup_s": r.get("warmup_s"), "process_s": r.get("process_s"),
                     "others_cores": r.get("others_cores")})
    se = results.get("streameval", {})
    if "time_s" in se and classic:
        print(f"streameval speed-up over classic: {classic / se['time_s']:.2f}x")
    closed = results.get("se-closed", {}).get("time_s")
    if closed:
        costs = [f"{name} {results[name]['time_s'] / closed:.2f}x" for name in ("se-fixed", "streameval")
                 if "time_s" in results.get(name, {})]
        if costs:
            print("GOM cost relative to closed-set only: " + ", ".join(costs))
    osv = [f"{top} / {bottom} {results[top]['time_s'] / results[bottom]['time_s']:.2f}x"
           for top, bottom in (("se-osv", "se-closed"), ("se-all", "streameval"))
           if "time_s" in results.get(top, {}) and "time_s" in results.get(bottom, {})]
    if osv:
        print(f"open-set + verification cost: {', '.join(osv)} (goal <= {GOAL_OSV_COST}x)")
    update = report_update(results.get("update"), ng)
    processes = report_processes(results.get("process"), results, args.repeat)
    print_details(results)
    if "streameval" in results and "floor" in results and "plan" in se and "plan" in results["floor"]:
        same = se["plan"] == results["floor"]["plan"]
        print(f"  floor used streameval's chunk plan: {'yes' if same else 'NO (differs!)'}")
    agreement = None
    if "metrics" in se and "metrics" in results.get("classic", {}):
        a, c = se["metrics"], results["classic"]["metrics"]
        diffs = {k: (abs(a[k] - c[k]) if a[k] is not None and c[k] is not None else None) for k in ("mAP", "rank1", "mINP")}
        ok = (a["n_valid_queries"] == c["n_valid_queries"]
              and all(diffs[k] is not None and diffs[k] <= AGREE_TOL for k in ("mAP", "rank1")))
        agreement = {"streameval": a, "classic": c, "abs_diff": diffs, "agree": ok, "tolerance": AGREE_TOL}
        print(f"  agreement streameval vs classic: {'OK' if ok else 'DIFFER'} "
              f"(mAP {fmt(a['mAP'], '.6f')} vs {fmt(c['mAP'], '.6f')}, |d|={fmt(diffs['mAP'], '.1e')}; "
              f"rank-1 {fmt(a['rank1'], '.6f')} vs {fmt(c['rank1'], '.6f')}, |d|={fmt(diffs['rank1'], '.1e')}; "
              f"mINP |d|={fmt(diffs['mINP'], '.1e')}; valid queries {a['n_valid_queries']} vs {c['n_valid_queries']}; "
              f"tolerance {AGREE_TOL:g})")
    print()
    return {"size": {"n_query": nq, "n_gallery": ng, "dim": dim, "n_ids": ids}, "noise": noise, "store": store_path,
            "store_status": how, "rows": rows, "agreement": agreement, "update": update, "processes": processes}


def run_facts(r: dict) -> list:
    """A method's chunk plan, time breakdown and phases, as details lines show them."""
    bits = []
    if r.get("plan"):
        bits.append("plan query_block={query_block} gallery_chunk={gallery_chunk} workers={workers}".format(**r["plan"]))
    if r.get("detail"):
        bits.append("breakdown " + ", ".join(f"{k} {v:.3f}s" for k, v in r["detail"].items()))
    if r.get("phases"):
        bits.append("phases " + ", ".join(f"{k} {v:.3f}s" for k, v in r["phases"].items()))
    return bits


def print_details(results: dict, side: str = "") -> None:
    """A line per in-process method: its warm-up, chunk plan, time breakdown or phases, every run."""
    for method in METHODS:
        r = results.get(method)
        if not r or "error" in r or method in ("update", "process"):
            continue
        bits = [r["warmup"], *run_facts(r)]
        if method == "classic":
            bits.append(f"argsort threads {r['sort_threads']}")
        if len(r["times_s"]) > 1:
            bits.append("runs " + " ".join(f"{t:.3f}" for t in r["times_s"]))
        if r.get("others_cores") is not None and r["others_cores"] >= 0.1:
            bits.append(f"WARNING: other processes used {r['others_cores']:.1f} cores meanwhile")
        print(f"  {method}{side}: " + "; ".join(bits))


def process_runs(processes: dict, side: str = HEAD) -> dict:
    """{"cli-closed cold": run, "cli-closed warm": run, ..., "classic-process": run} of one side."""
    runs = {}
    for name, p in processes.items():
        if name in COLD_AND_WARM:
            runs.update({f"{name} {phase}": p[side][phase] for phase in ("cold", "warm")})
        else:
            runs[name] = p
    return runs


def report_processes(processes: dict | None, results: dict, repeat: int) -> dict | None:
    """The whole-process table: wall time from spawn to exit, cold and warm, next to the in-process
    time of the same work, and the speed-up (warm) over the classic evaluator's process."""
    if processes is None:
        return None
    classic = processes["classic-process"].get("time_s")
    print(f"whole processes (spawn to exit: start-up, imports, numba's cache, exit; best of {repeat}; "
          "cold: numba's cache folder empty, warm: as the cold run left it; classic after a warm-up run):")
    header = f"  {'process':<22}{'time (s)':>10}{'peak RSS (MB)':>15}{'in-process (s)':>22}{'vs classic process':>20}"
    print(header)
    rows = {}
    for label, p in process_runs(processes).items():
        if "error" in p:
            print(f"  {label:<22}  FAILED: {p['error']}")
            rows[label] = {"error": p["error"], "command": p["command"]}
            continue
        same = PROCESSES[label.split()[0]]
        inside = results.get(same, {}).get("time_s")
        speedup = classic / p["time_s"] if classic and not label.endswith(" cold") else None
        print(f"  {label:<22}{p['time_s']:>10.3f}{p['peak_rss_mb']:>15.0f}"
              f"{(f'{inside:.3f} ({same})' if inside else '-'):>22}{('-' if speedup is None else f'{speedup:.2f}x'):>20}")
        rows[label] = {"time_s": p["time_s"], "times_s": p["times_s"], "peak_rss_mb": p["peak_rss_mb"],
                       "in_process_s": inside, "in_process_method": same, "speedup_vs_classic_process": speedup,
                       "command": " ".join(p["command"])}
    closed = rows.get("cli-closed warm", {}).get("speedup_vs_classic_process")
    if closed is not None:
        print(f"  goal: closed-set CLI (warm) at least 2x faster than the classic process: {closed:.2f}x "
              f"({'met' if closed >= 2 else 'NOT met'})")
    return rows


def report_update(r: dict | None, n_gallery: int) -> dict | None:
    """The update table: per variant, update vs full re-evaluation of the grown gallery."""
    if r is None:
        return None
    if "error" in r:
        print(f"update: FAILED: {r['error']}")
        return r
    print(f"update after appending {r['rows_added']:,} rows ({r['rows_added'] / n_gallery:.1%}; distractor copies):")
    header = f"  {'variant':<12}{'update (s)':>11}{'full (s)':>10}{'update/full':>13}{'peak RSS (MB)':>15}  rescored  same result"
    print(header)
    for variant, v in r["variants"].items():
        print(f"  {variant:<12}{v['update_s']:>11.3f}{v['full_s']:>10.3f}{v['ratio']:>13.1%}{v['update_peak_rss_mb']:>15.0f}"
              f"  {v['facts']['queries_rescored']:>8}  {'yes' if v['same_result'] else 'NO'}")
    return r


PROTOCOL_LABELS = {
    "se-market": "market, one pass",
    "se-cuhk03": "cuhk03-sgs, {T} sampled repeats",
    "se-sysu": "sysu-like, {T} trials",
    "classic-market": "market (numba loop)",
    "classic-cuhk03": "cuhk03, torchreid Python",
    "classic-sysu": "sysu-like, mangye16 Python",
}
PROTOCOL_RATIOS = (  # (numerator, denominator, what, goal: (kind, value) or None)
    ("se-cuhk03", "se-market", "{T} sgs repeats vs one market evaluation", ("<=", PROTOCOL_GOAL_COST)),
    ("se-sysu", "se-market", "{T} SYSU-like trials vs one market evaluation", ("<=", PROTOCOL_GOAL_COST)),
    ("classic-cuhk03", "se-cuhk03", "classic CUHK03 loop vs streameval cuhk03-sgs", (">=", PROTOCOL_GOAL_SPEEDUP)),
    ("classic-sysu", "se-sysu", "classic SYSU per-trial re-sort vs streameval trials", None),
    ("classic-market", "se-market", "classic market vs streameval market", None),
)


def report_protocols(size, store_path, how, results: dict, args) -> dict:
    """The --protocols table: seconds, peak RSS and headline numbers per method, then the ratios, the
    breakdowns and the agreement of the numbers."""
    nq, ng, dim, ids = size
    T = args.trials
    print(f"=== protocols: {nq} x {ng} x {dim}  ({ids} ids, {args.cams} cams, {args.dtype} store, metric "
          f"{args.metric}, no GOM, T = {T}) ===")
    print(f"store   : {store_path} ({how})")
    header = (f"{'method':<16}{'protocol / implementation':<30}{'time (s)':>10}{'peak RSS (MB)':>15}"
              f"{'rank-1':>9}{'rank-10':>9}{'mAP':>9}{'mINP':>9}")
    print(header)
    print("-" * len(header))
    rows = {}
    for name in args.methods:
        r = results[name]
        if "error" in r:
            print(f"{name:<16}  FAILED: {r['error']}")
            rows[name] = {"error": r["error"]}
            continue
        m = r["metrics"]
        subset = m.get("subset")
        print(f"{name:<16}{PROTOCOL_LABELS[name].format(T=T):<30}{r['time_s']:>10.3f}{'*' if subset else ' '}"
              f"{r['peak_rss_mb']:>14.0f}{fmt(m['rank1'], '.4f'):>9}{fmt(m.get('rank10'), '.4f'):>9}"
              f"{fmt(m['mAP'], '.4f'):>9}{fmt(m['mINP'], '.4f'):>9}")
        rows[name] = {"time_s": r["time_s"], "times_s": r["times_s"], "peak_rss_mb": r["peak_rss_mb"],
                      "base_rss_mb": r["base_rss_mb"], "metrics": m, "detail": r.get("detail"),
                      "warmup": r.get("warmup"), "plan": r.get("plan"), "others_cores": r.get("others_cores")}
    for name, row in rows.items():
        subset = row.get("metrics", {}).get("subset")
        if subset:
            print(f"* {name}: its Python loop hit --classic-budget {args.classic_budget:g} s and ran "
                  f"{subset['done']} of {subset['of']} {subset['unit']} ({subset['measured_loop_s']:.1f} s); "
                  f"its time is EXTRAPOLATED linearly to all {subset['of']}")
    ratios = report_protocol_ratios(rows, T)
    for name, row in rows.items():
        if "error" in row:
            continue
        bits = [row["warmup"]]
        if row["detail"]:
            bits.append("breakdown " + ", ".join(f"{k} {v:.3f}s" for k, v in row["detail"].items()))
        if len(row["times_s"]) > 1:
            bits.append("runs " + " ".join(f"{t:.3f}" for t in row["times_s"]))
        if row["others_cores"] is not None and row["others_cores"] >= 0.1:
            bits.append(f"WARNING: other processes used {row['others_cores']:.1f} cores meanwhile")
        print(f"  {name}: " + "; ".join(bits))
    agreement = report_protocol_agreement(rows)
    print()
    return {"size": {"n_query": nq, "n_gallery": ng, "dim": dim, "n_ids": ids}, "store": store_path,
            "store_status": how, "trials": T, "sysu_like_protocol": sysu_like_protocol(T).to_record(),
            "rows": rows, "ratios": ratios, "agreement": agreement}


def report_protocol_ratios(rows: dict, T: int) -> list:
    print("ratios:")
    out = []
    for top, bottom, what, goal in PROTOCOL_RATIOS:
        if "time_s" not in rows.get(top, {}) or "time_s" not in rows.get(bottom, {}):
            continue
        ratio = rows[top]["time_s"] / rows[bottom]["time_s"]
        verdict = ""
        if goal:
            kind, value = goal
            met = ratio <= value if kind == "<=" else ratio >= value
            verdict = f"  (goal {kind} {value:g}x: {'met' if met else 'NOT met'})"
        print(f"  {top + ' / ' + bottom:<31}{ratio:>9.2f}x  {what.format(T=T)}{verdict}")
        out.append({"numerator": top, "denominator": bottom, "ratio": ratio, "goal": goal})
    return out


def report_protocol_agreement(rows: dict) -> dict:
    """Which numbers must agree: market (exactly), cuhk03-sgs's AP on the full kept list (= market's)
    and every SYSU-like trial (same galleries); the sampled sgs CMC only in distribution."""
    metrics = {name: row["metrics"] for name, row in rows.items() if "metrics" in row}
    out = {}

    def diffs(a, b, keys):
        return {k: (abs(a[k] - b[k]) if a.get(k) is not None and b.get(k) is not None else None) for k in keys}

    def verdict(d):
        return all(v is not None and v <= AGREE_TOL for v in d.values())

    if "se-market" in metrics and "classic-market" in metrics:
        d = diffs(metrics["se-market"], metrics["classic-market"], ("mAP", "rank1", "mINP"))
        out["market"] = {"abs_diff": d, "agree": verdict(d)}
        print(f"  agreement market, streameval vs classic: {'OK' if verdict(d) else 'DIFFER'} "
              f"(|d| mAP {fmt(d['mAP'], '.1e')}, rank-1 {fmt(d['rank1'], '.1e')}, mINP {fmt(d['mINP'], '.1e')})")
    if "se-cuhk03" in metrics:
        se = metrics["se-cuhk03"]
        notes = []
        for other in ("se-market", "classic-cuhk03"):
            if other not in metrics or metrics[other].get("subset"):
                continue
            d = diffs(se, metrics[other], ("mAP",))
            out[f"cuhk03 mAP vs {other}"] = {"abs_diff": d, "agree": verdict(d)}
            notes.append(f"mAP vs {other} {'OK' if verdict(d) else 'DIFFER'} (|d| {fmt(d['mAP'], '.1e')})")
        classic = metrics.get("classic-cuhk03")
        if classic:
            notes.append(f"rank-1 {fmt(se['rank1'], '.4f')} vs classic {fmt(classic['rank1'], '.4f')}"
                         f"{' (classic on a subset)' if classic.get('subset') else ''}: sampled draws, "
                         f"equal in distribution only")
        if notes:
            print("  agreement cuhk03-sgs: " + "; ".join(notes))
    if "se-sysu" in metrics and "classic-sysu" in metrics:
        se, classic = metrics["se-sysu"]["per_trial"], metrics["classic-sysu"]["per_trial"]
        keys = ("mAP", "rank1", "rank10", "mINP")
        worst = {k: max((diffs(a, b, keys)[k] for a, b in zip(se, classic)), key=lambda v: -1 if v is None else v)
                 for k in keys}
        ok = verdict(worst) and all(a["n_valid_queries"] == b["n_valid_queries"] for a, b in zip(se, classic))
        out["sysu-like"] = {"trials_compared": len(classic), "max_abs_diff": worst, "agree": ok}
        print(f"  agreement sysu-like per trial ({len(classic)} trials, same galleries): {'OK' if ok else 'DIFFER'} "
              f"(max |d| mAP {fmt(worst['mAP'], '.1e')}, rank-1 {fmt(worst['rank1'], '.1e')}, "
              f"rank-10 {fmt(worst['rank10'], '.1e')}, mINP {fmt(worst['mINP'], '.1e')})")
    return out


def print_scaling(sizes: list) -> None:
    """One line per problem: each method's time, M pairs/s and peak RSS, to see growth with the gallery."""
    methods = [m for m in METHODS if any(r["method"] == m and "time_s" in r for size in sizes for r in size["rows"])]
    print("=== scaling: time (s) / M pairs per s / peak RSS (MB) ===")
    print(f"{'size (noise)':<26}" + "".join(f"{m:>26}" for m in methods))
    for size in sizes:
        dims = size["size"]
        pairs = dims["n_query"] * dims["n_gallery"]
        cells = []
        for m in methods:
            row = next((r for r in size["rows"] if r["method"] == m and "time_s" in r), None)
            cells.append("-" if row is None else
                         f"{row['time_s']:.1f} / {pairs / row['time_s'] / 1e6:.0f} / {row['peak_rss_mb']:.0f}")
        label = f"{dims['n_query']}x{dims['n_gallery']}x{dims['dim']} ({size['noise']:g})"
        print(f"{label:<26}" + "".join(f"{c:>26}" for c in cells))
    print()


def main(argv=None) -> int:
    args = parse_args(argv)
    if args._run:
        return child_main(args)
    if args.evaluator_rss is not None:
        import bench_evaluator

        return bench_evaluator.main(["--rows", str(args.evaluator_rss), "--workdir", args.workdir])
    os.makedirs(args.workdir, exist_ok=True)
    facts = machine_facts()
    print_header(facts, args)
    out = {"machine": facts, "options": {k: getattr(args, k) for k in (
        "metric", "dtype", "cams", "seed", "repeat", "methods", "junk_frac", "distractor_frac",
        "open_query_frac", "chunk_rows", "classic_sort_threads", "workdir", "noises")}, "sizes": []}
    if args.protocols:
        out["options"].update(protocols=True, trials=args.trials, classic_budget=args.classic_budget)
    if args.device:
        out["options"].update(device=args.device, precision=args.precision or "float32", skip_cpu=args.skip_cpu,
                              memory_budget=args.memory_budget)
    rev = prepare_revision(args.against, args.workdir) if args.against else None
    if rev:
        print_revision(rev)
        print()
        out["options"]["against"] = {"commit": rev.commit, "subject": rev.subject, "folder": rev.folder,
                                     "versions": rev.versions}
    if "process" in args.methods:
        out["startup"] = {HEAD: startup_times(args)}
        print_startup(out["startup"][HEAD], f" {HEAD}" if rev else "")
        if rev:
            out["startup"][REV] = startup_times(args, rev.python)
            print_startup(out["startup"][REV], f" {REV} ")
        print()
    sys.stdout.flush()
    mismatch = False
    for size in args.sizes:
        for noise in args.noises:
            entry = run_problem(args, size, noise, rev)
            mismatch |= any(not check["agree"] for check in entry.get("numbers", ()))
            out["sizes"].append(entry)
            sys.stdout.flush()
    if len(out["sizes"]) > 1 and not (args.protocols or args.suite or args.rerank or rev):
        print_scaling(out["sizes"])
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
        print(f"results written to {args.json}")
    if mismatch:
        sides = "the device and the CPU path" if args.device else f"{HEAD} and {REV}"
        print(f"error: {sides} gave different numbers on the same rows (lines marked !!! above)", file=sys.stderr)
    return 1 if mismatch else 0


def run_problem(args, size, noise: float, rev) -> dict:
    """Every method on one problem (a size at a synth noise), in the mode chosen; its JSON record."""
    path, how = ensure_store(args, size, noise)
    how += f", {warm_page_cache(path):.0f} MB read once to warm the page cache"
    if args.suite:
        return run_suite_mode(args, size, path, how)
    if args.rerank:
        return run_rerank_mode(args, size, path, how, rev)
    if args.device:
        return run_device_mode(args, size, noise, path, how)
    if args.protocols:
        results = {name: run_child(args, PROTOCOL_METHODS[name], path) for name in args.methods}
        return report_protocols(size, path, how, results, args)
    if rev:
        rev_path, rev_how = revision_store(rev, path, size)
        if rev_path != path:
            rev_how += f", {warm_page_cache(rev_path):.0f} MB read once to warm the page cache"
        results = run_against(args, {HEAD: (sys.executable, path), REV: (rev.python, rev_path)})
        return report_against(size, noise, {HEAD: (path, how), REV: (rev_path, rev_how)}, results, args, rev)
    results = {method: run_processes(args, {HEAD: (sys.executable, path)}) if method == "process"
               else run_child(args, method, path) for method in args.methods}
    return report_size(size, noise, path, how, results, args)


if __name__ == "__main__":
    sys.exit(main())
