"""Layer 2: the exact engine: chunk plan, numba kernels, block sources, the statistic protocol
(state, update, merge), per-query state and the Dask passes.  It never names a feature."""
