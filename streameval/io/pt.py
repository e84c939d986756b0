"""PyTorch files (``torch.save``): a tensor, or a dict (nested dicts too: ``{"query": {"features":
...}}`` gives ``query/features``) of tensors, numpy arrays or lists of numbers.  Read whole, only
if torch is installed (streameval does not require it), with ``weights_only=True``: loading runs
no code from the file, so objects other than tensors, arrays and plain values are refused."""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping
from numbers import Number

import numpy as np

from ..core.errors import StoreError, one_line
from . import Source
from .arrays import MemoryArray, host_array


def open_source(src: str) -> Source:
    try:
        import torch
    except ImportError:
        raise StoreError(f"'{src}' is a PyTorch file; reading it needs torch, which is not installed: "
                         "pip install torch (or save the arrays with numpy.savez and convert the .npz)") from None
    try:
        with torch.serialization.safe_globals(_numpy_globals()), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. the pickle protocol of a file torch.save did not write
            content = torch.load(src, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a file it cannot unpickle
        raise StoreError(_load_error(src, exc)) from None
    arrays = {}
    _flatten(torch, content, "" if isinstance(content, Mapping) else os.path.splitext(os.path.basename(src))[0],
             arrays, src)
    return Source(src, f"{os.path.basename(src)} (PyTorch, read whole)",
                  {name: MemoryArray(name, values) for name, values in arrays.items()})


def _numpy_globals() -> list:
    """What unpickling numpy arrays and scalars needs, allowed in weights_only mode."""
    dtypes = [getattr(np.dtypes, name) for name in dir(np.dtypes) if name.endswith("DType")]
    return [np.zeros(1).__reduce__()[0], np.float64(0).__reduce__()[0], np.ndarray, np.dtype, *dtypes]


def _load_error(src: str, exc: Exception) -> str:
    """One line, without torch's advice to retry with weights_only=False: that would run the file's code."""
    unsupported = re.search(r"unsupported GLOBAL:? (?:GLOBAL )?([\w.]+)", str(exc), re.IGNORECASE)
    if unsupported:
        return (f"'{src}' holds a {unsupported.group(1)} object; streameval reads torch files with "
                "weights_only=True (no code from the file runs), so save a tensor or a dict of tensors")
    if "weights_only" in str(exc) or "Weights only" in str(exc):
        return (f"cannot read '{src}' with torch.load(weights_only=True), which runs no code from the file: "
                f"{_reason(str(exc))}; save a tensor or a dict of tensors")
    return f"cannot read '{src}' with torch.load: {one_line(exc)}"


def _reason(message: str) -> str:
    """The lines of torch's weights-only message that say what it met, not what to do about it."""
    advice = ("weights_only", "Weights only", "torch.load", "file an issue")
    lines = [line.strip().removeprefix("WeightsUnpickler error:").strip() for line in message.splitlines()]
    return " ".join(line for line in lines if line and not any(word in line for word in advice)) or "refused"


def _flatten(torch, value, name: str, out: dict, src: str) -> None:
    """Arrays of ``value`` into ``out`` by path (dict keys, list positions); other values are left out."""
    if isinstance(value, torch.Tensor):
        out[name] = host_array(value, f"'{src}': {name or 'the tensor'}")
    elif isinstance(value, np.ndarray):
        out[name] = value
    elif isinstance(value, (list, tuple)) and value and all(isinstance(v, Number) for v in value):
        out[name] = np.asarray(value)
    elif isinstance(value, (Mapping, list, tuple)):
        for key, item in value.items() if isinstance(value, Mapping) else enumerate(value):
            _flatten(torch, item, f"{name}/{key}" if name else str(key), out, src)
