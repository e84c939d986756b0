"""What a process on the device path spends before its first block (issue 28's goal: Market size as
a whole process in 1.5 s): the interpreter's start, importing torch, opening the device (CUDA's
context), its first GEMM (cuBLAS's handle and kernels), the first GEMM of each of ``--workers`` new
threads at once (as the Dask workers of a run make theirs), a page-locked host buffer of a device
call's size, and importing streameval's CLI.  Each row is timed once, in fresh processes, so it
includes what a first run pays.  ``scripts/gpu_check.sh`` runs it first.

Usage: python scripts/gpu_startup.py [--device DEV] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time


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


def process_seconds(args: list) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True)
    return time.perf_counter() - t


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
    found = subprocess.run([sys.executable, __file__, "--_stages", "--device", args.device, "--workers",
                            str(args.workers)], check=True, stdout=subprocess.PIPE, text=True).stdout
    rows.update(json.loads(found.strip().splitlines()[-1]))
    print(f"=== start-up on {args.device}: before a process's first block (each timed once, fresh processes) ===")
    for name, seconds in rows.items():
        print(f"{name:<48}{seconds:>8.3f} s")


if __name__ == "__main__":
    main()
