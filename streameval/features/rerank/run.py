"""A re-ranked run's preparation (PROTOCOLS.md 6.2, 6.3), before its ordinary passes: query
expansion writes the expanded features to a temporary store; re-ranking runs the U x U kNN pass
(or reads its lists from ``--knn-cache``), builds the sparse Jaccard distances of the query rows
and hands the passes the re-ranked distances as their block source."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np

from ...core.errors import OptionError
from ...engine.neighbours import neighbour_pass, pair_distances
from ...engine.sources import block_source
from .flavours import FLAVOURS
from .source import RerankedSource, twins


def prepare_run(store, settings, runner, temporary):
    """(store, settings) for the passes: the expanded store, the re-ranked distances in
    ``settings.rerank`` (scored in float64); ``temporary``: an ExitStack the run's temporary
    folders are removed by."""
    spec = settings.rerank
    dtype = knn_dtype(store, settings)
    if spec.qe is not None:
        from ...core.outputs import temporary_folder
        from .expansion import expand

        if spec.qe.k > len(store.query) + len(store.gallery):
            raise OptionError(f"--qe-k {spec.qe.k} is more than the {len(store.query) + len(store.gallery):,} queries "
                              "and gallery rows it averages over")
        folder = temporary.enter_context(temporary_folder())
        store = expand(store, partial(knn, runner=runner, dtype=dtype), spec.qe.k, spec.qe.alpha, spec.qe.times, folder)
        dtype = np.float64
    facts = {}
    if spec.flavour is not None:
        source, facts = reranked(store, settings, runner, dtype)
        spec = replace(spec, distances=source)
    return store, replace(settings, precision="float64", rerank=replace(spec, facts=facts))


def knn(sets, k, metric, runner, dtype):
    """The kNN pass over ``sets``, in float64 GEMMs where their features are float64 (expanded)."""
    return neighbour_pass(sets, k, metric, runner, np.float64 if sets[0].features.dtype == np.float64 else dtype)


def knn_dtype(store, settings):
    """The kNN pass's GEMMs: float32 unless the run asks for float64 or the features are float64
    (a float32 GEMM would round them, and the exact lists are of the stored values)."""
    stored = store.query.features.dtype if store.query.features is not None else np.float32
    return np.float64 if settings.precision == "float64" or stored == np.float64 else np.float32


def reranked(store, settings, runner, dtype):
    """(The re-ranked distances' block source, the facts the result reports of them)."""
    from .sparse import jaccard

    spec = settings.rerank
    flavour = FLAVOURS[spec.flavour]
    base = flavour.base_metric(settings.metric)
    sets, n_queries = (store.query, store.gallery), len(store.query)
    lists = min(max(flavour.lists(spec.k1), spec.k2), n_queries + len(store.gallery))  # all of U at most
    compute = partial(neighbour_pass, sets, lists, base, runner, dtype)
    cached = False
    if runner.knn_cache is None:
        neighbours = compute()
    else:
        from .cache import cached_neighbours

        neighbours, cached = cached_neighbours(runner.knn_cache, store, base, dtype, lists, compute)
    found = jaccard(neighbours, n_queries, flavour, settings.metric, spec.k1, spec.k2,
                    partial(pair_distances, sets, base, dtype, runner=runner))
    row_max = (flavour.b(neighbours.farthest[:n_queries], settings.metric) if flavour.normalised
               else np.ones(n_queries))
    source = RerankedSource(block_source(base, store.dim, np.float64), flavour, settings.metric, spec.lam, found,
                            row_max, n_queries, len(store.gallery), twins(neighbours))
    facts = {"metric": settings.metric, "base_distance": base, "L1": flavour.lists(spec.k1),
             "h": flavour.expansion(spec.k1), "N": n_queries + len(store.gallery), "precision": "float64",
             **found.facts, "knn": {"list_length": lists, "settled_pairs": int(neighbours.refined),
                                    "gemm": np.dtype(dtype).name, "from_cache": cached}}
    return source, facts
