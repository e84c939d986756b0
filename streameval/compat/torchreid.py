"""torchreid's ``evaluate_rank`` computed by streameval (docs/compat.md#torchreid)::

    from streameval.compat.torchreid import evaluate_rank   # was: from torchreid.metrics import evaluate_rank
    cmc, mAP = evaluate_rank(distmat, q_pids, g_pids, q_camids, g_camids)
"""

from __future__ import annotations

import warnings

import numpy as np

from . import NO_VALID_QUERY, NoValidQueryError, host_array

# torchreid's eval_market1501 and eval_cuhk03 as protocol presets; neither knows a junk pid (its
# dataset readers drop Market-1501's pid -1 images before), so pid -1 stays an ordinary pid
PROTOCOLS = {False: "market", True: "cuhk03-sgs"}


def evaluate_rank(distmat, q_pids, g_pids, q_camids, g_camids, max_rank=50, use_metric_cuhk03=False,
                  use_cython=True):
    """(cmc, mAP) as torchreid's ``torchreid.metrics.rank.evaluate_rank`` returns them: the CMC
    curve as a float32 array of length ``max_rank`` (the gallery size where that is smaller, with
    torchreid's note as a warning) and the mAP as a float, over the queries with a positive.

    ``distmat``: query x gallery distances (smaller is closer), a numpy array or a torch tensor on
    any device; the ids: arrays, lists or tensors.  A gallery image with the query's pid and camera
    is removed for it (torchreid's rule, the ``market`` preset); ``use_metric_cuhk03`` reads the CMC
    on one drawn image per gallery identity, 10 seeded draws (the ``cuhk03-sgs`` preset; torchreid
    draws unseeded).  ``use_cython`` changes nothing: the numbers are exact either way (float64,
    ties by gallery index; docs/compat.md lists how torchreid's two paths differ from them).
    Raises :class:`~streameval.compat.NoValidQueryError` (an AssertionError, as torchreid's) when
    no query has a positive.
    """
    from ..run.evaluation import evaluate

    distances = host_array(distmat)
    n_gallery = distances.shape[-1]
    if n_gallery < max_rank:
        warnings.warn(f"Note: number of gallery samples is quite small, got {n_gallery}", stacklevel=2)
        max_rank = n_gallery
    arrays = {"distances": distances, "q_pids": host_array(q_pids), "g_pids": host_array(g_pids),
              "q_camids": host_array(q_camids), "g_camids": host_array(g_camids)}
    result = evaluate(arrays, protocol=PROTOCOLS[bool(use_metric_cuhk03)], junk_pids=[], max_rank=max_rank,
                      no_gom=True)
    if result.mAP is None:
        raise NoValidQueryError(NO_VALID_QUERY)
    return result.cmc.astype(np.float32), float(result.mAP)
