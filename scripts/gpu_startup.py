"""What a process on the device path spends before its first block (issue 28's goal: Market size as
a whole process in 1.5 s): the interpreter's start, importing torch, opening the device (CUDA's
context), its first GEMM (cuBLAS's handle and kernels), the first GEMM of each of ``--workers`` new
threads at once (as the Dask workers of a run make theirs), a page-locked host buffer of a device
call's size, and importing streameval's CLI.  Each row is timed once, in fresh processes, so it
includes what a first run pays.  Then ``streameval eval`` on a tiny store as whole processes (the
first one also compiles or loads the kernels), the phases of each, and one more run under
cProfile: where a process's fixed seconds go, the main thread's functions by cumulative and own
time.  Where Python may not write bytecode next to torch (a read-only image, or
PYTHONDONTWRITEBYTECODE), every process compiles torch's modules from source: the rows marked
"bytecode cached" are the second of two runs with a writable PYTHONPYCACHEPREFIX, what a machine
whose torch has its bytecode pays.
``scripts/gpu_check.sh`` runs it first.

Usage: python scripts/gpu_startup.py [--device DEV] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

TINY = {"n_query": 200, "n_gallery": 5000, "dim": 64, "n_ids": 100, "n_cams": 6}


def stages(device: str, workers: int) -> dict:
    """Seconds of each stage, in this (fresh) process."""
    out = {}

    def timed(name, fn):
        t = time.perf_counter()
        result = fn()
        out[name] = time.perf_counter() - t
        return result

    torch = timed("import torch", lambda: __import__("torch"))
    on_gpu = device.startswith("cuda")
    where = torch.device(device.replace("torch:", ""))

    def synchronise():
        if on_gpu:
            torch.cuda.synchronize(where)

    def first_tensor():
        torch.zeros(1, device=where)
        synchronise()

    def gemm():
        a = torch.ones((512, 256), device=where)
        torch.matmul(a, a.T)
        synchronise()

    def on_threads():
        threads = [threading.Thread(target=gemm) for _ in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    timed("device opened (first tensor)", first_tensor)
    timed("first GEMM", gemm)
    timed(f"first GEMM of {workers} new threads at once", on_threads)
    timed("32 MiB host buffer (page-locked on a GPU)",
          lambda: torch.empty(8 << 20, dtype=torch.float32, pin_memory=on_gpu).numpy().fill(0))
    timed("import streameval's CLI", lambda: __import__("streameval.cli"))
    return out


def process_seconds(args: list, env: dict | None = None) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, env=env)
    return time.perf_counter() - t


def bytecode_facts() -> str:
    """Whether this Python writes bytecode, and whether torch's is there."""
    import importlib.util

    folder = os.path.dirname(importlib.util.find_spec("torch").origin)
    cache = os.path.join(folder, "__pycache__")
    pycs = len([n for n in os.listdir(cache) if n.endswith(".pyc")]) if os.path.isdir(cache) else 0
    return (f"bytecode: dont_write_bytecode={sys.flags.dont_write_bytecode}, PYTHONPYCACHEPREFIX="
            f"{os.environ.get('PYTHONPYCACHEPREFIX')!r}, torch in {folder} (writable: {os.access(folder, os.W_OK)}), "
            f"{pycs} .pyc files in its __pycache__")


def cached_bytecode_env(prefix: str) -> dict:
    """The environment with bytecode written to and read from ``prefix``."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    return dict(env, PYTHONPYCACHEPREFIX=prefix)


def second_run(args: list, env: dict) -> float:
    """Seconds of the second of two runs (the first writes the bytecode)."""
    process_seconds(args, env)
    return process_seconds(args, env)


def cli_runs(device: str) -> None:
    """Whole ``streameval eval`` processes on a tiny store, their phases, and one under cProfile."""
    import pstats

    from streameval.tools.synth import synthesize

    with tempfile.TemporaryDirectory() as tmp:
        store, result, profile = (os.path.join(tmp, name) for name in ("tiny.zarr", "result.json", "cli.prof"))
        synthesize(store, default_metric="euclidean", **TINY)
        run = "import sys; from streameval.entry import main; sys.argv[0] = 'streameval'; main()"
        cached = cached_bytecode_env(os.path.join(tmp, "pycache"))
        for options, env in ((["--no-gom"], None), (["--no-gom"], None), (["--no-gom"], None), ([], None),
                             (["--no-gom"], cached)):
            command = ["eval", store, "-q", "--device", device, "--json", result, "--overwrite", *options]
            name = "streameval eval " + " ".join(options or ["(default options)"])
            if env is None:
                seconds = process_seconds(["-c", run, *command])
            else:
                name += ", bytecode cached"
                seconds = second_run(["-c", run, *command], env)
            with open(result) as fh:
                phases = json.load(fh)["run"].get("phases") or {}
            print(f"{name:<48}{seconds:>8.3f} s   phases " + ", ".join(f"{k} {v:.3f}" for k, v in phases.items()))
        profiled = (f"import cProfile, sys; sys.argv = ['streameval', *sys.argv[1:]]; "
                    f"cProfile.run('from streameval.entry import main; main()', {profile!r})")
        process_seconds(["-c", profiled, "eval", store, "-q", "--device", device, "--no-gom"])
        print("--- the last command again under cProfile (main thread), by cumulative time ---")
        pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
        print("--- the same by own time ---")
        pstats.Stats(profile).sort_stats("tottime").print_stats(20)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--_stages", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._stages:
        print(json.dumps(stages(args.device, args.workers)))
        return
    rows = {"python -c pass (whole process)": process_seconds(["-c", "pass"]),
            "python -c 'import torch' (whole process)": process_seconds(["-c", "import torch"])}
    with tempfile.TemporaryDirectory() as tmp:
        rows["the same, bytecode cached"] = second_run(["-c", "import torch"], cached_bytecode_env(tmp))
    found = subprocess.run([sys.executable, __file__, "--_stages", "--device", args.device, "--workers",
                            str(args.workers)], check=True, stdout=subprocess.PIPE, text=True).stdout
    rows.update(json.loads(found.strip().splitlines()[-1]))
    print(f"=== start-up on {args.device}: before a process's first block (each timed once, fresh processes) ===")
    print(bytecode_facts())
    for name, seconds in rows.items():
        print(f"{name:<48}{seconds:>8.3f} s")
    print(f"=== streameval eval on a tiny store ({TINY['n_query']} x {TINY['n_gallery']} x {TINY['dim']}), "
          f"whole processes, --device {args.device} ===", flush=True)
    cli_runs(args.device)


if __name__ == "__main__":
    main()
