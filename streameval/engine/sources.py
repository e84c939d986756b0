"""Block sources: where the passes' distances come from (``Scoring.source``, one object per run).

The passes (``graph``) ask a source, never how it makes them: ``prepare`` the float64 terms and
norms of rows read for scoring (refusing rows it cannot score exactly); a ``block`` of values of
(query rows, the part's rows [start, stop), or the columns ``cols`` of them), each within the
window ``kernels.distance_window`` gives with the source's ``metric`` and ``c_dot`` (``c_refine``
after ``kernels.refined_dots``); what ``kernels.canonical_distance`` reads to recompute a pair
exactly (``exact``); and the exact distances of listed pairs (``pair_distances``).
``FeatureSource`` makes the values by GEMMs of the features, ``StoredSource`` reads a distance
store's.  Another source (distances re-ranked from a first-stage source) is another class with
these members, chosen in ``block_source``; ``DeviceSource`` runs ``FeatureSource``'s GEMM on a
device (``device``).  A source that ``screens`` (the device's) gives a scoring pass's blocks in
two steps instead of ``block``: the host buffer (``host_dots``), then the values (``fill``), only
those within the statistics' ``limits`` where every statistic declares some.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from . import device as devices, kernels, scratch
from .block import SCREEN_WORD, screen_terms, spread_hits
from .plan import QUERY_SUB_BLOCK
from ..core.errors import OptionError, StoreError
from ..store import FeatureSet, read_features, row_number


def block_source(metric: str, dim: int, precision, device: str | None = None):
    """The source of a run's distances: a distance store's own (its kind as the metric), else the
    features' GEMM in the working precision ``precision``, on ``device`` (``device.parse_device``;
    None: numpy's, on the CPU)."""
    code = kernels.METRIC_CODES[metric]
    if code == kernels.PRECOMPUTED:
        return StoredSource()
    bounds = (code, kernels.dot_error_bound(dim, precision), kernels.dot_error_bound(dim, np.float64))
    return FeatureSource(*bounds) if device is None else DeviceSource(*bounds, device)


@dataclass(frozen=True)
class FeatureSource:
    """Distances of the rows' features: a GEMM per block in the working precision, within
    ``c_dot`` |q| |g| of the canonical dot products (``kernels`` module docstring)."""

    metric: int  # kernels' metric code
    c_dot: float  # the GEMM's dot error bound (``kernels.dot_error_bound``)
    c_refine: float  # ``kernels.refined_dots``' (float64)
    screens = False

    def prepare(self, fs: FeatureSet, rows, features: np.ndarray) -> tuple:
        terms = kernels.row_terms(features, self.metric)
        if self.metric == kernels.COSINE and not terms.all():
            row = row_number(rows, int(np.flatnonzero(terms == 0)[0]))
            raise StoreError(f"{fs.name} row {row} is an all-zero feature vector: its cosine distance is undefined")
        norms = terms if self.metric == kernels.COSINE else np.sqrt(terms)
        bad = kernels.first_out_of_range(norms, features.dtype)
        if bad is not None:  # its dot products would overflow or underflow in the GEMM: silently wrong numbers
            lo, hi = kernels.NORM_RANGE[features.dtype]
            raise OptionError(
                f"{fs.name} row {row_number(rows, bad)} has norm {norms[bad]:.3g}, outside [{lo:.3g}, {hi:.3g}] "
                f"where {features.dtype} dot products neither overflow nor underflow; evaluate with --precision "
                "float64 (precision='float64')")
        return terms, norms

    def block(self, part, start: int, stop: int, queries, chunk, rows: slice, cols: slice = slice(None)) -> np.ndarray:
        """The GEMM, into this thread's scratch buffer (valid until the next block)."""
        a, b = queries.features[rows], chunk.features[cols]
        out = scratch.buffer("dots", a.dtype, (a.shape[0], b.shape[0]))
        return np.matmul(a, b.T, out=out)

    def exact(self, qf: np.ndarray, values: np.ndarray) -> np.ndarray:
        return qf

    def pair_distances(self, part, start: int, stop: int, queries, qrows: np.ndarray, grows: np.ndarray) -> np.ndarray:
        """Canonical distances (the part's rows' features read)."""
        features = read_features(part.fs, slice(start, stop), queries.features.dtype)
        terms = self.prepare(part.fs, slice(start, stop), features)[0]
        return kernels.pair_distances(queries.features, features, qrows, grows, queries.terms, terms, self.metric)


# pairs of one call on a GPU at most: 32 MiB of float32 products in a worker thread's host buffer
# (and the pairs that pass the screen in one more, as large as they need; a CPU path's sub-block
# takes 512 x 4,096 pairs x 52 bytes, ``plan.PAIR_SCRATCH_BYTES``): a task of 10,000 queries x
# 16,384 gallery rows (the default plan on 16 workers) is 4 x 5 calls of 2,048 queries x 4,096 rows
DEVICE_CALL_PAIRS = 1 << 23


@dataclass(frozen=True)
class DeviceSource(FeatureSource):
    """``FeatureSource`` with its GEMM on a device (``device`` module): each worker thread keeps its
    query block and its current gallery chunk there, so a chunk is uploaded once for all the query
    sub-blocks and a query block once for all the chunks, and makes its calls on a CUDA stream of
    its own (``device.thread_stream``).  The device's GEMM sums in another order than numpy's,
    within the same ``c_dot`` bound, so the statistics' windows and settling give the same numbers.

    What comes back to the host is what the statistics read: every dot product for a block whose
    statistics read every pair, else (``fill``) the device screens the block as ``block.within``
    does, for the statistics' limits, and copies back a bit a pair (the screen's words) and the dot
    products of the pairs that pass (ranking: the rows before each query's last positive, a few
    percent of the pairs on corrupted features) instead of 4 or 8 bytes a pair."""

    device: str = devices.TORCH_CPU  # ``device.parse_device``'s name
    screens = True

    def call_rows(self, n_cols: int) -> int:
        """Query rows one call on the device covers (``fill``), against ``n_cols`` gallery rows.  A
        GPU's call is about thirty launches and copies, four of them waits, whatever its size
        (on an H100, Market size in 546 calls of 512 x 256 pairs took 1.98 s, the CPU path 1.40 s),
        so as many rows as ``DEVICE_CALL_PAIRS`` allow, a whole number of sub-blocks.  On the CPU,
        a sub-block's, whose products, masks and bits stay in cache (torch:cpu took 7.3 s instead
        of 4.4 on 10,000 x 100,000 x 256 with calls of every query row)."""
        if self.device == devices.TORCH_CPU:
            return QUERY_SUB_BLOCK
        return max(1, DEVICE_CALL_PAIRS // (n_cols * QUERY_SUB_BLOCK)) * QUERY_SUB_BLOCK

    def block(self, part, start: int, stop: int, queries, chunk, rows: slice, cols: slice = slice(None)) -> np.ndarray:
        out = self.host_dots(queries, chunk, rows, cols)
        with devices.thread_stream(self.device):
            devices.torch_module().from_numpy(out).copy_(self._product(queries, chunk, rows, cols))
        return out

    def host_dots(self, queries, chunk, rows: slice, cols: slice) -> np.ndarray:
        """This thread's host buffer for a block's dot products (page-locked for a GPU)."""
        shape = (queries.features[rows].shape[0], chunk.features[cols].shape[0])
        return scratch.buffer("device-dots", queries.features.dtype, shape, devices.host_allocator(self.device))

    def fill(self, blk, queries, chunk, rows: slice, cols: slice, limits):
        """``blk`` (its dots ``host_dots``) with its dot products: every one where ``limits`` is None,
        else those the device's screen (``block.screen_terms``) passes, with its words as
        ``blk.hits`` (whole words: the row's last bits zero); the others are left as they were.
        On the thread's own stream (``device.thread_stream``)."""
        with devices.thread_stream(self.device):
            return self._fill(blk, queries, chunk, rows, cols, limits)

    def _fill(self, blk, queries, chunk, rows: slice, cols: slice, limits):
        product = self._product(queries, chunk, rows, cols)
        torch = devices.torch_module()
        if limits is None:
            torch.from_numpy(blk.dots).copy_(product)
            return blk
        where = product.device
        kind, columns, low, slope, sign = screen_terms(blk, limits)
        kind, columns, low, slope = (torch.from_numpy(x).to(where) for x in (kind, columns, low, slope))
        threshold = torch.addcmul(low[:, None], slope[:, None], columns[kind])  # a NaN column fails
        passed = (product if sign > 0 else -product) >= threshold
        n_rows, n_cols = product.shape
        allocate = devices.host_allocator(self.device)
        hits = scratch.buffer("device-hits", np.uint8, (n_rows, -(-n_cols // SCREEN_WORD) * SCREEN_WORD // 8), allocate)
        torch.from_numpy(hits).copy_(packed_bits(torch, passed, SCREEN_WORD))
        found = product[passed]
        room = 1 << max(found.shape[0] - 1, 0).bit_length()  # grown by doubling: few page-locked allocations
        values = scratch.buffer("device-hit-dots", blk.dots.dtype, (room,), allocate)[:found.shape[0]]
        torch.from_numpy(values).copy_(found)
        words = hits.view(np.uint64)
        spread_hits(words, values, blk.dots)
        return blk._replace(hits=words)

    def _product(self, queries, chunk, rows: slice, cols: slice):
        """The block's dot products, a tensor on the device."""
        torch = devices.torch_module()
        where = devices.gemm_device(self.device, queries.features.dtype)
        on_device = functools.partial(resident, torch, where)
        a = scratch.kept("device-queries", queries.features, on_device)[rows]
        b = scratch.kept("device-chunk", chunk.features, on_device)[cols]
        return torch.matmul(a, b.T)


def packed_bits(torch, passed, word: int):
    """The bits of a boolean tensor (rows, columns) as uint8 (rows, bytes), column 8 k + t as bit t
    of byte k, each row padded with zero bits to whole words of ``word`` bits: on a little-endian
    host, eight bytes read as one uint64 are ``block.within``'s word."""
    n_rows, n_cols = passed.shape
    bits = torch.zeros((n_rows, -(-n_cols // word) * word), dtype=torch.uint8, device=passed.device)
    bits[:, :n_cols] = passed
    packed = bits[:, 0::8].clone()
    for t in range(1, 8):  # eight shifts and ors of an eighth of the bits: a fifth of a product and sum's time
        packed |= bits[:, t::8] << t
    return packed


def resident(torch, where, features: np.ndarray):
    """``features`` copied to the device ``where``."""
    return torch.from_numpy(np.ascontiguousarray(features)).to(where)


@dataclass(frozen=True)
class StoredSource:
    """A distance store's values (similarities negated: ``store.distances``): exact as read, so a
    pair's window is zero and its canonical distance is its own value."""

    metric: int = kernels.PRECOMPUTED
    c_dot: float = 0.0
    c_refine: float = 0.0
    screens = False

    def prepare(self, fs: FeatureSet, rows, features: np.ndarray) -> tuple:
        zeros = np.zeros(features.shape[0])
        return zeros, zeros

    def block(self, part, start: int, stop: int, queries, chunk, rows: slice, cols: slice = slice(None)) -> np.ndarray:
        first, last, _ = cols.indices(stop - start)
        return self.read(part, start + first, start + last, queries.index[rows])

    def exact(self, qf: np.ndarray, values: np.ndarray) -> np.ndarray:
        return values

    def pair_distances(self, part, start: int, stop: int, queries, qrows: np.ndarray, grows: np.ndarray) -> np.ndarray:
        return self.read(part, start, stop, queries.index)[qrows, grows]

    @staticmethod
    def read(part, start: int, stop: int, query_index: np.ndarray) -> np.ndarray:
        """The float64 distances of the queries (rows ``query_index``) to the part's rows [start, stop)."""
        first = int(query_index[0]) if query_index.size else 0
        contiguous = np.array_equal(query_index, np.arange(first, first + query_index.size))
        rows = slice(first, first + query_index.size) if contiguous else query_index
        return part.fs.reader.read(part.fs, rows, start, stop)
