"""The device mode of scripts/bench.py (``--device DEV``, issue 28): the GPU path (``evaluate(...,
device=DEV)``, DEV ``cuda``, ``cuda:N`` or ``torch:cpu``) timed side by side with the CPU path and
two floors, on each problem of the usual ``--size`` / ``--noise`` / ``--dtype`` / ``--metric``:

  device-closed      ``streameval.evaluate(store, no_gom=True, device=DEV)`` in-process (one pass);
  device             the same with the default options (GOM, minmax: two passes);
  device-all         the default plus open-set identification and verification (every statistic:
                     not run unless named in ``--methods``; for checking the numbers);
  cli-device-closed  ``streameval eval STORE -q --no-gom --device DEV`` as a whole process, warm: numba's
                     cache and the page cache filled by the in-process runs before it (else by one
                     untimed run);
  cli-device         the same with the default options;
  cpu-closed, cpu, cpu-all   the same three in-process runs on the CPU path (no device), left out with
                     ``--skip-cpu`` (at 10,000 x 10,000,000 they take far too long on a few cores);
  gemm-floor         the device's GEMM alone: the chunk plan of the first device run (else evaluate's
                     plan), every gallery chunk already in host memory, upcast to the precision,
                     uploaded and multiplied with its query block on the device (torch, TF32 off and
                     probed: streameval's ``engine.device.gemm_device``), synchronised, the product
                     discarded.  Its breakdown also gives the GEMMs alone on device-resident operands
                     and, outside the floor, the dot products copied back to the host by the
                     device's calls (``DeviceSource.call_rows`` queries), as the device path does
                     where a statistic reads every pair;
  read-floor         reading the store alone: every gallery chunk of the same plan read and upcast on
                     the plan's worker threads, as evaluate reads them, no GEMM.

The floor is max(gemm-floor, read-floor); every method's time is shown over it.  The numbers are
checked: each device run's result (every number of ``Result.to_dict(per_query=True)`` but the run's
facts) against the CPU path's of the same options, SAME or DIFFERENT; a difference is printed loudly
on stdout and stderr and the bench exits 1.  torch is imported only by the device's children.
"""

from __future__ import annotations

import os
import sys
import time

DEVICE_METHODS = ("device-closed", "device", "device-all", "cli-device-closed", "cli-device", "cpu-closed", "cpu",
                  "cpu-all", "gemm-floor", "read-floor")
DEFAULT_DEVICE_METHODS = ("device-closed", "device", "cli-device-closed", "cli-device", "cpu-closed", "cpu",
                          "gemm-floor", "read-floor")
# in-process method -> (bench.py's streameval variant, on the device?)
IN_PROCESS = {"device-closed": ("se-closed", True), "device": ("streameval", True), "device-all": ("se-all", True),
              "cpu-closed": ("se-closed", False), "cpu": ("streameval", False), "cpu-all": ("se-all", False)}
CLI_OPTIONS = {"cli-device-closed": ["--no-gom"], "cli-device": []}
FLOORS = ("gemm-floor", "read-floor")
FLOOR_CHILD = "device-floors"
SAME_NUMBERS = (("device-closed", "cpu-closed"), ("device", "cpu"), ("device-all", "cpu-all"))
# issue 28's goals on one GPU: whole process at Market size, and 10,000 x 10,000,000 x 256 within 2x the floor
GOAL_MARKET = ((3368, 19732, 2048), 1.5)
GOAL_LARGE = ((10000, 10_000_000, 256), 60.0)
GOAL_FLOOR_RATIO = 2.0


def device_methods(methods: str | None, skip_cpu: bool) -> tuple[list, list]:
    """(--methods in device mode, the unknown names among them); --skip-cpu drops the CPU path."""
    names = [m.strip() for m in (methods or ",".join(DEFAULT_DEVICE_METHODS)).split(",") if m.strip()]
    bad = [m for m in names if m not in DEVICE_METHODS]
    if skip_cpu:
        names = [m for m in names if not m.startswith("cpu")]
    return names, bad


# --breakdown: where an in-process run's worker threads spend their time, part -> (module, attribute
# path) of the function timed; the parts nest (spread hits within device calls, limits and device
# calls within the screened blocks), so they do not add up to the threads' time
BREAKDOWN_PARTS = {
    "reads": ("streameval.engine.graph", "load_rows"),  # query blocks and gallery chunks read, upcast, prepared
    "positives": ("streameval.engine.graph", "find_positive_pairs"),
    "gemm (host)": ("streameval.engine.sources", "FeatureSource.block"),  # the CPU path's GEMM
    "device blocks": ("streameval.engine.sources", "DeviceSource.block"),  # every dot product copied back
    "device screened": ("streameval.engine.sources", "DeviceSource.fill"),  # upload, GEMM, screen, copies, spread
    "spread hits": ("streameval.engine.sources", "spread_hits"),
    "limits": ("streameval.engine.graph", "_limits"),
    "distances": ("streameval.engine.graph", "fill_distances"),
    "statistics": ("streameval.engine.graph", "_update"),
    "state copies": ("streameval.engine.statistic", "StatState.copy"),
}


class Breakdown:
    """Thread-seconds in each of ``BREAKDOWN_PARTS`` while in effect (``with``): the functions
    wrapped by a timer (two clock reads and a lock, ~1 us a call; a task's calls take 0.1 ms and
    more), put back after.  An evaluation's rehearsal (a tiny problem, in its compiling phase)
    counts too: a few milliseconds."""

    def __init__(self):
        import threading

        self.seconds = dict.fromkeys(BREAKDOWN_PARTS, 0.0)
        self.lock = threading.Lock()
        self.saved = []

    def __enter__(self):
        import importlib

        for part, (module, path) in BREAKDOWN_PARTS.items():
            owner = importlib.import_module(module)
            *outer, name = path.split(".")
            for attribute in outer:
                owner = getattr(owner, attribute)
            original = owner.__dict__[name]
            self.saved.append((owner, name, original))
            setattr(owner, name, self.timed(part, original))
        return self

    def __exit__(self, *exc):
        for owner, name, original in reversed(self.saved):
            setattr(owner, name, original)

    def timed(self, part: str, fn):
        import functools

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - t
                with self.lock:
                    self.seconds[part] += spent
        return timed

    def parts(self) -> dict:
        """The parts that took any time, in thread-seconds."""
        return {part: round(t, 3) for part, t in self.seconds.items() if round(t, 3) > 0}


def child_options(args, on_device: bool) -> list:
    """The command-line options a child of this mode is given: the device (for the device's children),
    the precision (for every child: the CPU path must compute the same numbers) and the memory
    budget (every child: the same plan)."""
    device = ["--device", args.device] if on_device else []
    return (device + (["--precision", args.precision] if args.precision else [])
            + (["--memory-budget", args.memory_budget] if args.memory_budget else []))


# --------------------------------------------------------------------------------------------------
# the floors' child


def run_device_floors(args) -> dict:
    """read-floor and gemm-floor (those in ``args.methods``), each timed by ``bench.timed_runs``."""
    import numpy as np

    from streameval.engine import device as devices
    from streameval.store import open_store

    wanted = args.methods.split(",")
    store = open_store(args._store)
    q_fs, g_fs = store.query, store.gallery
    dtype = np.dtype(args.precision or "float32")
    plan = floor_plan(args, store, dtype)
    out = {"plan": {"query_block": plan.query_block, "gallery_chunk": plan.gallery_chunk, "workers": plan.workers}}
    ranges = list(plan.gallery_ranges(len(g_fs)))
    blocks = list(plan.query_ranges(len(q_fs)))
    if "read-floor" in wanted:
        out["read-floor"] = timed_read(args, g_fs, ranges, len(blocks), plan.workers, dtype)
    if "gemm-floor" in wanted:
        t = time.perf_counter()
        where = devices.gemm_device(args.device, dtype)  # TF32 off and probed, as the device path opens it
        chunks = read_chunks(g_fs, ranges, plan.workers, dtype)
        queries = np.ascontiguousarray(q_fs.features[:], dtype=dtype)
        staged = time.perf_counter() - t
        out["gemm-floor"] = timed_gemm(args, where, queries, blocks, chunks)
        out["gemm-floor"]["warmup"] = (f"device opened, every gallery chunk read and upcast into host memory "
                                       f"({staged:.1f} s, not timed); " + out["gemm-floor"]["warmup"])
        out["device"] = devices.describe(args.device)
    return out


def floor_plan(args, store, dtype):
    """The chunk plan the device run reported (``--_plan QB,GC,WORKERS``), else evaluate's own."""
    from streameval.engine.plan import make_plan

    query_block, gallery_chunk, workers = (int(v) for v in args._plan.split(",")) if args._plan else (None, None, None)
    return make_plan(len(store.query), len(store.gallery), store.dim, dtype.itemsize,
                     store.gallery.features.dtype.itemsize, store.gallery.chunk_rows, workers or os.cpu_count() or 1,
                     args.memory_budget,
                     query_block, gallery_chunk)


def read_chunks(g_fs, ranges: list, workers: int, dtype, keep: bool = True) -> list | None:
    """Every gallery chunk of ``ranges`` read and upcast to ``dtype`` on ``workers`` threads (zarr's
    reads and numpy's casts release the GIL); the chunks, or None when not ``keep``."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    def one(bounds):
        chunk = np.ascontiguousarray(g_fs.features[bounds[0]:bounds[1]], dtype=dtype)
        return chunk if keep else None

    with ThreadPoolExecutor(workers) as pool:
        chunks = list(pool.map(one, ranges))
    return chunks if keep else None


def timed_read(args, g_fs, ranges: list, n_blocks: int, workers: int, dtype) -> dict:
    """The store read alone: the gallery once per query block of the plan, as evaluate reads it."""
    from bench import timed_runs

    def once():
        t = time.perf_counter()
        for _ in range(n_blocks):
            read_chunks(g_fs, ranges, workers, dtype, keep=False)
        return None, {"read+upcast": time.perf_counter() - t}

    out = timed_runs(once, args.repeat)
    out.pop("result")
    out["warmup"] = f"{len(ranges)} gallery chunks x {n_blocks} query block(s) on {workers} threads"
    out["warmup_s"] = 0.0
    return out


def timed_gemm(args, where, queries, blocks: list, chunks: list) -> dict:
    """Upload + GEMM over the plan (the floor), then, in the breakdown, the GEMMs alone on resident
    operands and the dot products copied back to the host by the device's calls (not in the floor)."""
    from bench import timed_runs
    from streameval.engine import device as devices
    from streameval.engine.sources import block_source

    torch = devices.torch_module()

    def synchronise():
        if where.type == "cuda":
            torch.cuda.synchronize(where)

    def upload(array):
        return torch.from_numpy(array).to(where)

    t = time.perf_counter()
    for _ in range(2):  # the GEMM's kernels chosen and the allocator's pool filled, not timed
        product = torch.matmul(upload(queries[:blocks[0][1]]), upload(chunks[0]).T)
    del product
    synchronise()
    warm = time.perf_counter() - t

    def uploaded_products():
        t = time.perf_counter()
        for qa, qb in blocks:
            q = upload(queries[qa:qb])
            for chunk in chunks:
                torch.matmul(q, upload(chunk).T)  # the product discarded
        synchronise()
        return None, {"upload+gemm": time.perf_counter() - t}

    out = timed_runs(uploaded_products, args.repeat)
    out.pop("result")
    detail = out["detail"]
    q, g = upload(queries[:blocks[0][1]]), upload(chunks[0])
    synchronise()
    t = time.perf_counter()
    for qa, qb in blocks:
        for chunk in chunks:
            torch.matmul(q[:qb - qa], g[:chunk.shape[0]].T)  # the same shapes, operands resident
    synchronise()
    detail["gemm resident"] = time.perf_counter() - t
    del q, g
    t = time.perf_counter()
    source = block_source(args.metric, queries.shape[1], queries.dtype, args.device)  # for its calls' shape
    widest = max(c.shape[0] for c in chunks)
    host = devices.host_allocator(args.device)(source.call_rows(widest) * widest, queries.dtype)
    for qa, qb in blocks:
        q = upload(queries[qa:qb])
        for chunk in chunks:
            g = upload(chunk)
            step = source.call_rows(chunk.shape[0])
            for first in range(0, qb - qa, step):
                dots = torch.matmul(q[first:first + step], g.T)
                torch.from_numpy(host[:dots.numel()].reshape(dots.shape)).copy_(dots)
    synchronise()
    detail["dots copied back (not in the floor)"] = time.perf_counter() - t
    out["warmup"] = f"GEMM kernels warmed ({warm:.2f} s, not timed)"
    out["warmup_s"] = warm
    return out


# --------------------------------------------------------------------------------------------------
# parent: the runs, the table, the check of the numbers


def run_device_mode(args, size, noise: float, store_path: str, how: str) -> dict:
    """Every method of ``args.methods`` on one problem: in-process runs first (the device's first, so
    the floors take its chunk plan and the CLI processes find numba's cache warm), then the CLI
    processes, then the floors; the table and the check of the numbers."""
    from bench import run_child

    results = {}
    for method in (m for m in args.methods if m in IN_PROCESS):
        variant, on_device = IN_PROCESS[method]
        timers = ["--breakdown"] if args.breakdown else []
        results[method] = progress(method, run_child(args, variant, store_path,
                                                     extra=child_options(args, on_device) + timers))
    warmed = any(IN_PROCESS[m][1] and "time_s" in r for m, r in results.items())
    for method in (m for m in args.methods if m in CLI_OPTIONS):
        results[method] = progress(method, time_cli(cli_command(args, store_path, method), args.repeat, warmed))
        warmed = warmed or "time_s" in results[method]
    floors = [m for m in args.methods if m in FLOORS]
    if floors:
        plan = next((r["plan"] for m, r in results.items() if IN_PROCESS.get(m, (0, False))[1] and "plan" in r), None)
        extra = child_options(args, True) + ["--methods", ",".join(floors)]
        if plan:
            extra += ["--_plan", "{query_block},{gallery_chunk},{workers}".format(**plan)]
        child = run_child(args, FLOOR_CHILD, store_path, extra=extra)
        for method in floors:
            results[method] = progress(method, {"error": child["error"]} if "error" in child
                                       else dict(child[method], plan=child["plan"], device=child.get("device")))
    return report_device(size, noise, store_path, how, results, args)


def progress(method: str, result: dict) -> dict:
    """``result``, after a line saying what it measured, printed at once: a run stopped by a
    lease's end (gpu_check.sh --stop-after) keeps the methods that finished before it."""
    from bench import run_facts

    done = result.get("error") or "; ".join([f"{result['time_s']:.3f} s", *filter(None, [result.get("warmup")]),
                                             *run_facts(result)])
    print(f"done    : {method}: {done}", flush=True)
    return result


def cli_command(args, store_path: str, method: str) -> list:
    from bench import streameval_command

    return (streameval_command() + ["eval", store_path, "-q", "--metric", args.metric, *CLI_OPTIONS[method]]
            + child_options(args, True))


def time_cli(cmd: list, repeat: int, warmed: bool) -> dict:
    """Best of ``repeat`` whole processes, after one untimed run unless the caches are warm already."""
    from bench import best_of_processes, best_process_time, time_process

    if not warmed:
        return best_process_time(cmd, repeat)
    return best_of_processes([time_process(cmd) for _ in range(repeat)], cmd)


def report_device(size, noise: float, store_path: str, how: str, results: dict, args) -> dict:
    """The table: each method's time, peak RSS, x floor and its scoring passes; the floors; the goals;
    the check of the numbers.  Its JSON record (``numbers``: the checks, with ``agree``)."""
    from bench import fmt, problem_line, problem_title

    nq, ng, dim, ids = size
    print(f"=== device {args.device}: {problem_title(size, noise, args)} ===")
    print(f"store   : {store_path} ({how})")
    device = next((r["device"] for r in results.values() if r.get("device")), None)  # the floors': with the model
    device = device or next((r["run_device"] for m, r in results.items() if m in IN_PROCESS and IN_PROCESS[m][1]
                             and r.get("run_device")), args.device)
    print(f"device  : {device}; precision {args.precision or 'float32'}")
    first = next((m for m in IN_PROCESS if "metrics" in results.get(m, {})), None)
    variant = IN_PROCESS[first][0] if first else None
    print(problem_line({variant: results[first]} if first else {}).replace(f"({variant})", f"({first})"))
    floor_parts = {m: results[m]["time_s"] for m in FLOORS if "time_s" in results.get(m, {})}
    floor = max(floor_parts.values()) if floor_parts else None
    header = f"{'method':<19}{'time (s)':>10}{'peak RSS (MB)':>15}{'x floor':>9}{'passes (s)':>12}"
    print(header)
    print("-" * len(header))
    rows = []
    for method in args.methods:
        r = results[method]
        if "error" in r:
            print(f"{method:<19}  FAILED: {r['error']}")
            rows.append({"method": method, "error": r["error"]})
            continue
        passes = (r.get("phases") or {}).get("passes")
        x_floor = r["time_s"] / floor if floor else None
        print(f"{method:<19}{r['time_s']:>10.3f}{r['peak_rss_mb']:>15.0f}{fmt(x_floor, '.2f'):>9}{fmt(passes, '.3f'):>12}")
        rows.append({"method": method, "time_s": r["time_s"], "times_s": r["times_s"], "peak_rss_mb": r["peak_rss_mb"],
                     "x_floor": x_floor, "phases": r.get("phases"), "plan": r.get("plan"), "detail": r.get("detail"),
                     "metrics": r.get("metrics"), "warmup": r.get("warmup"), "command": r.get("command"),
                     "others_cores": r.get("others_cores")})
    if floor_parts:
        bound = max(floor_parts, key=floor_parts.get)
        print(f"floor   : {floor:.3f} s = max(" + ", ".join(f"{m} {t:.3f} s" for m, t in floor_parts.items())
              + f"): bound by {bound}")
    goals = report_goals(size, results, floor)
    print_device_details(results, args.methods)
    numbers = check_device_numbers(results)
    print()
    return {"size": {"n_query": nq, "n_gallery": ng, "dim": dim, "n_ids": ids}, "noise": noise, "device": device,
            "precision": args.precision or "float32", "store": store_path, "store_status": how, "rows": rows,
            "floor_s": floor, "floors": floor_parts, "goals": goals, "numbers": numbers}


def report_goals(size, results: dict, floor: float | None) -> list:
    """Issue 28's goals where this problem is theirs: Market size's whole process <= 1.5 s; the
    10,000 x 10,000,000 x 256 run <= 60 s including the store read, and within 2x the floor."""
    goals = []
    for (shape, limit), methods in ((GOAL_MARKET, ("cli-device-closed", "cli-device")),
                                    (GOAL_LARGE, ("cli-device-closed", "cli-device", "device-closed", "device"))):
        if tuple(size[:3]) != shape:
            continue
        for method in (m for m in methods if "time_s" in results.get(m, {})):
            t = results[method]["time_s"]
            goals.append({"method": method, "time_s": t, "limit_s": limit, "met": t <= limit})
            text = f"goal    : {method} {t:.2f} s <= {limit:g} s: {'met' if t <= limit else 'NOT met'}"
            if floor and shape == GOAL_LARGE[0]:
                ratio = t / floor
                goals[-1].update(x_floor=ratio, floor_met=ratio <= GOAL_FLOOR_RATIO)
                text += f"; {ratio:.2f}x the floor <= {GOAL_FLOOR_RATIO:g}x: {'met' if ratio <= GOAL_FLOOR_RATIO else 'NOT met'}"
            print(text)
    return goals


def print_device_details(results: dict, methods: list) -> None:
    """A line per method: its warm-up or command, plan, breakdown or phases, every run."""
    from bench import run_facts

    for method in methods:
        r = results[method]
        if "error" in r:
            continue
        bits = [r["warmup"]] if r.get("warmup") else [" ".join(r["command"])] if r.get("command") else []
        bits += run_facts(r)
        if len(r["times_s"]) > 1:
            bits.append("runs " + " ".join(f"{t:.3f}" for t in r["times_s"]))
        if (r.get("others_cores") or 0) >= 0.1:
            bits.append(f"WARNING: other processes used {r['others_cores']:.1f} cores meanwhile")
        print(f"  {method}: " + "; ".join(bits))


def check_device_numbers(results: dict) -> list:
    """Each device run against the CPU path's run of the same options, where both ran: SAME when
    every number of their results (per query too) is the same; one line, and a loud one on stdout
    and stderr for a difference."""
    from bench import fmt

    checks = []
    for device, cpu in SAME_NUMBERS:
        a, b = results.get(device, {}), results.get(cpu, {})
        if "numbers_sha256" not in a or "numbers_sha256" not in b:
            continue
        same = a["numbers_sha256"] == b["numbers_sha256"]
        checks.append({"device": device, "cpu": cpu, "same": same, "agree": same, "device_metrics": a["metrics"],
                       "cpu_metrics": b["metrics"]})
    if not checks:
        return checks
    m = checks[0]["device_metrics"]
    print("numbers device vs CPU path (every number of the result, per query too): "
          + ", ".join(f"{c['device']} vs {c['cpu']} {'SAME' if c['same'] else 'DIFFERENT'}" for c in checks)
          + f"  [{checks[0]['device']}: mAP {fmt(m['mAP'], '.6f')}, rank-1 {fmt(m['rank1'], '.6f')}, "
            f"mINP {fmt(m['mINP'], '.6f')}]")
    for c in (c for c in checks if not c["same"]):
        a, b = c["device_metrics"], c["cpu_metrics"]
        loud = (f"!!! the device and the CPU path gave DIFFERENT numbers on the same rows, {c['device']} vs {c['cpu']}: "
                + ", ".join(f"{k} {fmt(a[k], '.9f')} vs {fmt(b[k], '.9f')}" for k in ("mAP", "rank1", "mINP"))
                + f", valid queries {a['n_valid_queries']} vs {b['n_valid_queries']}")
        print(loud)
        print(loud, file=sys.stderr)
    return checks
