"""Average query expansion (fast-reid's ``aqe``, PROTOCOLS.md 6.3), out of core.

A round replaces every row f_i of U (queries, then gallery) by the mean of its top-k rows' current
features, each weighted by its cosine similarity to f_i raised to alpha::

    f_i' = (1/k) sum_{j in top_k(i)} f_j s(i, j)^alpha

top_k(i) by (-s(i, j), j) over all of U, f_i itself included (s(i, i) = 1): these are the kNN pass's
cosine lists (canonical d = 1 - s ascending, ties by U row), so s = 1 - d.  The features summed are
the unnormalised ones; each round's similarities are the cosine of its input's features, and its
output is a store, the next round's input.  Everything is float64 (the stored features exactly,
the expanded ones as computed), so the store written holds float64 features.

Memory: the kNN lists (N x k) and one block of rows, its expanded features and the rows its lists
name, read once per block from the chunks holding them (``read_u_rows``); never N x dim.
"""

from __future__ import annotations

import os
import shutil

import numpy as np

from ...core.errors import OptionError
from ...engine.neighbours import read_u_rows
from ...store import Store, commit_gallery, create_store, new_store, read_ids, write_rows

BLOCK_BYTES = 64 << 20  # a block's gathered neighbour rows and its expanded rows, float64
COSINE = "cosine"  # the metric of AQE's similarities, whatever metric evaluates the expanded features


def expand(store: Store, neighbour_pass, k: int, alpha: float, times: int, target, *,
           block_rows: int | None = None) -> Store:
    """``times`` rounds of AQE over ``store``'s features; returns the last round's store, opened.

    ``neighbour_pass(sets, k, metric) -> engine.neighbours.Neighbours``: the kNN pass over U of
    ``sets`` (query, gallery).  ``target``: a folder the caller owns and removes (made if absent);
    round r's store is written there as ``aqe-r.zarr`` and the previous round's is removed once the
    next is complete.  ``block_rows``: rows expanded (and chunk rows written) at a time; by default
    as many as fit ``BLOCK_BYTES``, at most the store's chunk rows.
    """
    os.makedirs(target, exist_ok=True)
    current = store
    for round_number in range(1, times + 1):
        neighbours = neighbour_pass((current.query, current.gallery), k, COSINE)
        rows = block_rows or default_block_rows(neighbours.k, current.dim, current.gallery.chunk_rows)
        expanded = write_round(current, neighbours, alpha, os.path.join(target, f"aqe-{round_number}.zarr"), rows)
        if current is not store:  # an earlier round's store, read for the last time
            shutil.rmtree(current.path)
        current = expanded
    return current


def default_block_rows(k: int, dim: int, chunk_rows: int) -> int:
    """Rows per block: their gathered neighbour rows (at most k each) and expanded rows fit BLOCK_BYTES."""
    return max(1, min(chunk_rows, BLOCK_BYTES // (8 * dim * (k + 1))))


def write_round(source: Store, neighbours, alpha: float, path: str, rows: int) -> Store:
    """One round: the expanded features of ``source`` with its ids, written block by block as a new
    store at ``path`` chunked by ``rows`` (every write fills whole chunks); returned opened."""
    sets = (source.query, source.gallery)
    with new_store(path, overwrite=False):
        written = create_store(path, len(source.query), len(source.gallery), source.dim, dtype="float64",
                               chunk_rows=rows, default_metric=source.default_metric, cameras=source.cameras)
        offset = 0
        for fs, out in zip(sets, (written.query, written.gallery)):
            for start in range(0, len(fs), rows):
                stop = min(start + rows, len(fs))
                features = expanded_rows(sets, neighbours, slice(offset + start, offset + stop), alpha)
                write_rows(out, start, features, *read_ids(fs, start, stop))
            offset += len(fs)
        return commit_gallery(path)


def expanded_rows(sets, neighbours, rows: slice, alpha: float) -> np.ndarray:
    """The expanded features of U rows ``rows``: each list's rows read once for the whole block."""
    index = neighbours.index[rows]
    weights = similarity_weights(1.0 - neighbours.dist[rows], alpha, index, rows.start)
    wanted, where = np.unique(index.ravel(), return_inverse=True)
    where = where.reshape(index.shape)
    features = read_u_rows(sets, wanted, np.float64)
    out = np.zeros((index.shape[0], features.shape[1]))
    for column in range(index.shape[1]):  # the list's order, as fast-reid's mean sums it
        out += weights[:, column, None] * features[where[:, column]]
    return out / index.shape[1]


def similarity_weights(similarity: np.ndarray, alpha: float, index: np.ndarray, first_row: int) -> np.ndarray:
    """s^alpha; a weight that is no real number (a negative similarity to a fractional power) is
    refused rather than summed as NaN."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        weights = np.power(similarity, alpha)
    bad = ~np.isfinite(weights)
    if bad.any():
        row, column = (int(i) for i in np.argwhere(bad)[0])
        raise OptionError(f"query expansion: U row {first_row + row}'s neighbour {column + 1} (U row "
                          f"{int(index[row, column])}) has cosine similarity {similarity[row, column]:.6g}, and "
                          f"its weight s^alpha with alpha {alpha:g} is not a real number; use an integer qe alpha "
                          "(--qe-alpha) or a smaller qe k (--qe-k)")
    return weights
