"""fast-reid's ``ReidEvaluator`` computed by streameval (docs/compat.md#fast-reid)::

    from streameval.compat.fastreid import ReidEvaluator   # was: from fastreid.evaluation import ReidEvaluator
    evaluator = ReidEvaluator(cfg, num_query)
    evaluator.reset()
    for inputs in loader:                     # queries first: the first num_query rows are the queries
        evaluator.process(inputs, model(inputs))
    results = evaluator.evaluate()            # OrderedDict: Rank-1, Rank-5, Rank-10, mAP, mINP, metric
"""

from __future__ import annotations

import sys
from collections import OrderedDict

import numpy as np

from . import NO_VALID_QUERY, NoValidQueryError, host_array
from ..core.errors import OptionError

try:  # fast-reid's own base class where it imports, so its trainer's checks accept this evaluator
    from fastreid.evaluation.evaluator import DatasetEvaluator
except ImportError:  # not installed, or its evaluation package fails (collections.Mapping, Python >= 3.10)
    class DatasetEvaluator:
        """fast-reid's base (fastreid/evaluation/evaluator.py): a round is reset, process per batch, evaluate."""

        def reset(self):
            pass

        def preprocess_inputs(self, inputs):
            pass

        def process(self, inputs, outputs):
            pass

        def evaluate(self):
            pass


# cfg.TEST.METRIC -> streameval's metric: fast-reid's "euclidean" is the squared distance (compute_dist.py)
METRICS = {"cosine": "cosine", "euclidean": "sqeuclidean"}
# fast-reid's evaluation: the camera rule of the market preset, no junk pid, GOM not reported, its
# ranks up to 10; cfg=None means fast-reid's defaults (TEST.METRIC cosine, no AQE, no re-ranking)
DEFAULTS = {"protocol": "market", "junk_pids": [], "max_rank": 10, "no_gom": True, "metric": "cosine"}
RANKS = (1, 5, 10)


class ReidEvaluator(DatasetEvaluator):
    """fast-reid's ``ReidEvaluator(cfg, num_query, output_dir=None)``: ``process(inputs, outputs)``
    keeps each batch's features (``outputs``, a tensor on any device, as float32) with
    ``inputs["targets"]`` (pids) and ``inputs["camids"]``; ``evaluate()`` takes the first
    ``num_query`` rows processed as the queries, the rest as the gallery (``streameval.Evaluator``:
    batches past its memory budget wait in a temporary store), and returns fast-reid's
    OrderedDict (percent): Rank-1, Rank-5, Rank-10, mAP, mINP and metric = (mAP + Rank-1) / 2.

    ``cfg.TEST`` is read as fast-reid reads it: METRIC (cosine, euclidean), AQE (QE_K, ALPHA,
    QE_TIME: ``qe``), RERANK (K1, K2, LAMBDA: ``rerank`` flavour fastreid); ROC is refused.  Other
    keywords are ``streameval.evaluate``'s options and override those.  ``result`` holds the last
    evaluation's full :class:`~streameval.run.result.Result`.
    """

    def __init__(self, cfg=None, num_query=None, output_dir=None, **options):
        if isinstance(num_query, bool) or not isinstance(num_query, (int, np.integer)) or num_query < 1:
            raise OptionError(f"num_query must be a positive integer (the first rows processed are the queries), "
                              f"got {num_query!r}")
        self.cfg = cfg
        self._num_query = int(num_query)
        self._output_dir = output_dir  # kept as fast-reid keeps it; neither writes there
        from ..run.evaluator import Evaluator  # batches past a memory budget go to a store (docs/evaluator.md)

        self._rows = Evaluator(**{**DEFAULTS, **cfg_options(cfg), **options})
        self._processed = 0  # rows processed since the last reset: the first num_query are the queries
        self.result = None

    def reset(self):
        self._rows.reset()
        self._processed = 0

    def process(self, inputs, outputs):
        batch = (host_array(outputs, np.float32), host_array(inputs["targets"]), host_array(inputs["camids"]))
        queries = max(0, min(self._num_query - self._processed, len(batch[1])))
        if queries:
            self._rows.add_queries(*(column[:queries] for column in batch))
        if queries < len(batch[1]):
            self._rows.add_gallery(*(column[queries:] for column in batch))
        self._processed += len(batch[1])

    def evaluate(self):
        check_single_process()
        if self._num_query >= self._processed:
            raise OptionError(f"num_query is {self._num_query} but {self._processed} rows were processed: "
                              "the gallery is empty")
        self.result = self._rows.compute()
        if self.result.mAP is None:
            raise NoValidQueryError(NO_VALID_QUERY)
        results = OrderedDict((f"Rank-{r}", self.result.rank(r) * 100) for r in RANKS)
        results["mAP"] = self.result.mAP * 100
        results["mINP"] = self.result.mINP * 100
        results["metric"] = (self.result.mAP + self.result.rank(1)) / 2 * 100
        return results


def cfg_options(cfg) -> dict:
    """streameval's options for fast-reid's ``cfg.TEST`` (a yacs CfgNode or any object with its attributes)."""
    test = getattr(cfg, "TEST", None)
    if test is None:
        return {}
    metric = getattr(test, "METRIC", DEFAULTS["metric"])
    if metric not in METRICS:
        raise OptionError(f"cfg.TEST.METRIC must be one of {', '.join(METRICS)}, got {metric!r}")
    options = {"metric": METRICS[metric]}
    if enabled(test, "AQE"):
        options["qe"] = {"k": test.AQE.QE_K, "alpha": test.AQE.ALPHA, "times": test.AQE.QE_TIME}
    if enabled(test, "RERANK"):
        options["rerank"] = {"flavour": "fastreid", "k1": test.RERANK.K1, "k2": test.RERANK.K2,
                             "lambda": test.RERANK.LAMBDA}
    if enabled(test, "ROC"):
        raise OptionError("cfg.TEST.ROC is not reproduced (fast-reid reads TPR at the ROC point nearest each FPR); "
                          "pass verification=True for exact TAR@FAR (docs/verification.md)")
    return options


def enabled(test, section: str) -> bool:
    return bool(getattr(getattr(test, section, None), "ENABLED", False))


def check_single_process() -> None:
    """fast-reid gathers every process's batches before it evaluates; this evaluator holds one
    process's, so under torch.distributed with several processes it refuses rather than report a
    part of the data as the whole."""
    torch = sys.modules.get("torch")  # never imported here: without torch loaded there is no process group
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        raise OptionError(f"torch.distributed runs {dist.get_world_size()} processes: gather the features, pids "
                          "and camids on one process and evaluate there (docs/compat.md#fast-reid)")
