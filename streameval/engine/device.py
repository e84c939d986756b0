"""Devices a run's GEMMs may run on (``--device``): the CPU path (the default: numpy's BLAS), an
NVIDIA GPU through torch (``cuda``, ``cuda:N``: the ``gpu`` extra), or the same torch code on the
CPU (``torch:cpu``: the device path where no GPU is, for its tests).

Only the GEMM moves (``sources.DeviceSource``), with, where every statistic of a run reads only
the rows within its reach, a screen of them: its dot products (those within reach) come back to the
host, where every statistic runs its kernels as on the CPU path and settles the pairs the GEMM's
error window leaves open by the canonical float64 distance there.  So a device run's numbers equal the CPU path's bit
for bit, provided the device's GEMM keeps within ``kernels.dot_error_bound`` - which TF32 does not:
``opened`` switches it off and checks with a probe product that it is off (``check_strict``).
"""

from __future__ import annotations

import contextlib
import functools
import sys

import numpy as np

from . import scratch
from ..core.errors import OptionError, StreamevalError
from ..core.extras import require_extra

TORCH_CPU = "torch:cpu"


class DeviceError(StreamevalError):
    """The device asked for cannot run the GEMMs (no GPU, no torch, TF32 forced on)."""

    exit_code = 4


def parse_device(value) -> str | None:
    """``device=`` / ``--device``: None (the CPU path) for None or "cpu"; "cuda", "cuda:N" or
    "torch:cpu" as given."""
    if value is None or value == "cpu":
        return None
    text = str(value)
    kind, _, index = text.partition(":")
    if text in ("cuda", TORCH_CPU) or (kind == "cuda" and index.isdigit() and index == str(int(index))):
        return text
    raise OptionError(f"device must be cpu, cuda or cuda:N (N a GPU's index), or torch:cpu (the GPU path's code "
                      f"on the CPU), got {value!r}")


def torch_module():
    return require_extra("torch", package="torch", extra="gpu", purpose="--device (the GPU path)", error=DeviceError)


@functools.cache
def opened(name: str):
    """The torch device of ``name`` (``parse_device``), checked once per process: CUDA visible,
    the index in range, TF32 switched off.  "cuda" without an index: the worker's GPU
    (``worker_gpu``)."""
    torch = torch_module()
    if name == TORCH_CPU:
        torch.set_num_threads(1)  # Dask runs the tasks in parallel; a GEMM runs on one core, as numpy's does
        return torch.device("cpu")
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise DeviceError(f"--device {name}: torch {torch.__version__} ({build}) sees no CUDA GPU; leave --device out "
                          "to run on the CPU")
    count = torch.cuda.device_count()
    index = int(name.partition(":")[2] or worker_gpu(count))
    if index >= count:
        raise DeviceError(f"--device {name}: this machine has {count} CUDA GPU(s) (cuda:0 to cuda:{count - 1})")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    return torch.device("cuda", index)


@functools.cache
def gemm_device(name: str, dtype: np.dtype):
    """``opened(name)``, its float32 GEMMs checked strict when ``dtype`` is float32 (float64
    GEMMs have no reduced-precision mode to fear)."""
    device = opened(name)
    if dtype == np.float32:
        torch = torch_module()
        check_strict(lambda a, b: torch.matmul(torch.from_numpy(a).to(device), torch.from_numpy(b).to(device)).cpu()
                     .numpy(), name)
    return device


def open_where_run(client, name: str, dtype: np.dtype) -> str:
    """``gemm_device(name, dtype)`` where the GEMMs will run, before any work: in this process, or
    on every worker of ``client``'s cluster (a failure there raised here, naming a worker, rather
    than logged by each worker at its first task).  Returns the devices as the result reports them
    (``describe``), each once: told by the processes that opened them (the client of a cluster may
    have no GPU, and with ``cuda`` each worker takes its own)."""
    if client is None:
        gemm_device(name, dtype)
        return describe(name)
    found = client.run(_opened, name, dtype)
    failures = {worker: error for worker, (error, _) in found.items() if error}
    if failures:
        worker, error = next(iter(failures.items()))
        raise DeviceError(f"{len(failures)} Dask worker(s) cannot run the GEMMs, e.g. {worker}: {error}")
    return ", ".join(sorted({described for _, described in found.values()}))


def _opened(name: str, dtype: np.dtype) -> tuple:
    """On a worker: (None, ``describe(name)``) once the device is open, else (the DeviceError's
    message, None)."""
    try:
        gemm_device(name, dtype)
    except DeviceError as exc:
        return str(exc), None
    return None, describe(name)


def worker_gpu(count: int) -> int:
    """The GPU of this process: a Dask worker named n (a LocalCluster's are 0, 1, ...) takes GPU
    n mod ``count``, so ``--cluster local --n-workers <GPUs>`` runs one worker per GPU; any other
    process (the threaded scheduler, a worker started with CUDA_VISIBLE_DEVICES) GPU 0."""
    if "distributed" not in sys.modules:  # not a worker: importing distributed costs 0.3 s
        return 0
    from distributed import get_worker

    try:
        name = get_worker().name
    except ValueError:
        return 0
    return int(name) % count if str(name).isdigit() else 0


# 1 + 2^-12 has 13 significant bits: float32 keeps it, TF32 (10 stored bits) rounds it to 1.
PROBE = np.float32(1.0 + 2.0**-12)


def check_strict(matmul, name: str) -> None:
    """Raise DeviceError unless ``matmul`` (numpy float32 in and out, run on the device) multiplies
    float32 inputs unrounded: TF32 can be forced on behind the caller's back (NVIDIA_TF32_OVERRIDE,
    a library's default), and its products err ~100x the float32 bound the windows assume."""
    a = np.eye(64, dtype=np.float32) * PROBE
    product = matmul(a, np.eye(64, dtype=np.float32))
    if not np.array_equal(np.diagonal(product), np.full(64, PROBE)):
        raise DeviceError(f"--device {name}: the GPU's float32 GEMM rounds its inputs (TF32: is NVIDIA_TF32_OVERRIDE "
                          "set?), so its dot products could leave the error bound the exact ranking relies on; unset "
                          "it, or evaluate with --precision float64")


def thread_stream(name: str):
    """The context a worker thread's calls on the device run in: on a GPU, a CUDA stream of the
    thread's own (from torch's pool), kept across its calls; nothing on torch:cpu.

    A call waits for the device four times (its results copied back, the count of its screen's
    hits). On the default stream, which every thread shares, each wait is also for the work every
    other thread has queued before it: 16 threads' calls took ~15 ms each at 2,000,000 rows on an
    H200 (36 thread-s), where a call's GEMM (2,048 x 4,096 x 256: 4.3 GFLOP) is ~0.1 ms at
    50 TFLOP/s. On its own stream a thread waits for its own work only (not yet measured on a GPU)."""
    if name == TORCH_CPU:
        return contextlib.nullcontext()
    torch = torch_module()
    own = scratch.kept("device-stream", opened(name), lambda device: torch.cuda.Stream(device=device))
    return torch.cuda.stream(own)


def host_allocator(name: str):
    """How host buffers the device's results are copied into are made: page-locked (pinned) for a
    GPU, whose copies from pageable memory run at about half the bus's rate; numpy's for torch:cpu."""
    if name == TORCH_CPU:
        return np.empty
    torch = torch_module()
    return lambda size, dtype: torch.empty(size, dtype=getattr(torch, np.dtype(dtype).name), pin_memory=True).numpy()


def describe(name: str) -> str:
    """An opened device as the result reports it: torch:cpu, or cuda:N with its GPU's model."""
    if name == TORCH_CPU:
        return name
    torch = torch_module()
    device = opened(name)
    return f"cuda:{device.index} ({torch.cuda.get_device_name(device)})"
