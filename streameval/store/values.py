"""Checking rows before they are written: finite features that keep their precision in the
stored dtype, ids that fit int64 and are not the reserved fill value."""

from __future__ import annotations


import numpy as np

from ..core.choices import INT64_MAX, METRICS
from ..core.errors import OptionError, StoreError
from .layout import FEATURE_DTYPES, ID_FILL


def check_batch(features, pids, camids, where: str, dim: int | None = None, dtype=None, first_row: int = 0):
    """Validate an in-memory batch of rows and return it as (features in ``dtype``, int64 pids,
    int64 camids); ``dtype``: the stored feature dtype (default: keep the features' own).

    Features must be floating point, finite and representable in ``dtype`` (``check_features``); ids
    integers that fit int64, other than the reserved ``ID_FILL``; all three the same length.
    ``where`` names the batch in messages and ``first_row`` is the number of its first row.
    """
    features = np.asarray(features)
    pids = np.asarray(pids)
    camids = np.asarray(camids)
    if features.ndim != 2:
        raise StoreError(f"{where} features must be 2-D (rows x dim), got shape {features.shape}")
    if features.dtype.kind != "f":
        raise StoreError(f"{where} features have dtype {features.dtype}; expected floating point")
    for label, ids in (("pids", pids), ("camids", camids)):
        if ids.ndim != 1 or ids.shape[0] != features.shape[0]:
            raise StoreError(
                f"{where} {label} has shape {ids.shape} but features have {features.shape[0]} rows"
            )
        check_ids(ids, f"{where} {label}", first_row)
    if features.shape[0] == 0:
        raise StoreError(f"{where} set is empty")
    if features.shape[1] == 0 or (dim is not None and features.shape[1] != dim):
        raise StoreError(f"{where} features have dimension {features.shape[1]}, expected {dim or 'at least 1'}")
    dtype = features.dtype if dtype is None else np.dtype(dtype)
    check_features(features, dtype, where, first_row)
    return features.astype(dtype, copy=False), pids.astype(np.int64, copy=False), camids.astype(np.int64, copy=False)


def check_features(features: np.ndarray, dtype: np.dtype, where: str, first_row: int = 0) -> None:
    """Refuse rows that are not finite or would not survive the cast to the stored ``dtype``: a value
    beyond its largest (it would become inf), or a nonzero row whose largest magnitude is below its
    smallest normal (the whole row would become zeros or keep only a few significant bits).

    Single values below the smallest normal in a row of normal scale are accepted: their rounding
    error is below the one of the row's largest value, as for any rounding to ``dtype``.
    """
    finite = np.isfinite(features).all(axis=1)
    if not finite.all():
        raise StoreError(f"{where} features hold non-finite values (NaN or inf), "
                         f"first at row {first_row + int(np.flatnonzero(~finite)[0])}")
    info = np.finfo(dtype)
    tiny, huge = np.float64(info.tiny), np.float64(info.max)  # compared in float64, whatever the rows' dtype
    scale = np.maximum(features.max(axis=1), -features.min(axis=1))  # largest magnitude per row
    outside = (scale > huge) | ((scale > 0) & (scale < tiny))
    if not outside.any():
        return
    local = int(np.flatnonzero(outside)[0])
    row, largest = first_row + local, float(scale[local])
    representable = f"{dtype} represents magnitudes from {float(tiny):.4g} to {float(huge):.4g}"
    if largest > huge:
        fix = "store the features as float32" if dtype == np.float16 else "rescale the features"
        raise StoreError(f"{where} features row {row} holds values too large for {dtype} (largest magnitude "
                         f"{largest:.4g}; {representable}); {fix}")
    raise StoreError(f"{where} features row {row} is too small for {dtype}: its largest magnitude {largest:.4g} "
                     f"would be stored as zero or with few significant bits ({representable}); rescale the features")


def check_ids(ids: np.ndarray, where: str, first_row: int = 0) -> None:
    """Integer ids that keep their value as int64 (checked on the source dtype, before the cast:
    uint64 ids from 2**63 would wrap to negative ones), other than the reserved ``ID_FILL``."""
    if ids.dtype.kind not in "iu":
        raise StoreError(f"{where} have dtype {ids.dtype}; expected integers")
    if ids.dtype.itemsize < 8 or ids.size == 0:
        return  # every smaller integer type fits, above the reserved value
    bad = ids > INT64_MAX if ids.dtype.kind == "u" else ids == ID_FILL
    if bad.any():
        local = int(np.flatnonzero(bad)[0])
        why = "does not fit int64" if ids.dtype.kind == "u" else "is reserved to mark missing chunks"
        raise StoreError(f"{where} row {first_row + local} holds {int(ids[local])}, which {why}; "
                         f"ids must lie in [{ID_FILL + 1}, {INT64_MAX}]")


def row_number(rows, i: int) -> int:
    """The set's row number of the i-th row read by ``rows`` (a first row, a slice or an array)."""
    if isinstance(rows, slice):
        return (rows.start or 0) + i
    return int(rows[i]) if np.ndim(rows) else rows + i


def feature_dtype(dtype, choices=FEATURE_DTYPES[:2]) -> np.dtype:
    """A stored feature dtype named by the user (an option: OptionError otherwise): float16 or float32
    (``choices``: float64 too where streameval writes features it computed, query expansion's)."""
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        dtype = None
    if dtype not in choices:
        raise OptionError(f"dtype must be {' or '.join(str(choice) for choice in choices)}, got {dtype}")
    return dtype


def check_metric(name) -> None:
    """A store's default metric named by the user (an option: OptionError otherwise)."""
    if name not in METRICS:
        raise OptionError(f"default metric must be one of {', '.join(METRICS)}, got {name!r}")
