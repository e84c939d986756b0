"""Drop-in adapters for the evaluators ReID training code already calls (docs/compat.md): one import
switches to streameval's exact numbers.

* ``streameval.compat.torchreid.evaluate_rank``: torchreid's ``torchreid.metrics.rank.evaluate_rank``;
* ``streameval.compat.fastreid.ReidEvaluator``: fast-reid's ``fastreid.evaluation.ReidEvaluator``.

Both sit on ``streameval.evaluate``.  Importing this package loads nothing heavy (no torch, numba or
zarr); torch tensors are recognised by their methods, so torch is never imported here.
"""

from __future__ import annotations

import numpy as np

from ..core.errors import StreamevalError

# the message both upstreams assert with when no query has a positive
NO_VALID_QUERY = "Error: all query identities do not appear in gallery"


class NoValidQueryError(StreamevalError, AssertionError):
    """No query has a positive in the gallery.  torchreid and fast-reid fail with an AssertionError
    there, so code that catches theirs catches this one too."""

    exit_code = 3


def host_array(values, dtype=None) -> np.ndarray:
    """``values`` (a numpy array, an array-like or a torch tensor on any device) as a numpy array:
    a tensor is detached and moved to the host (no copy when it already is on the CPU); ``dtype``
    converts (no copy when it already has it)."""
    if hasattr(values, "detach") and hasattr(values, "cpu"):  # a torch tensor
        values = values.detach().cpu()
        if str(values.dtype) == "torch.bfloat16":  # numpy has no bfloat16; float32 holds it exactly
            values = values.float()
        values = values.numpy()
    return np.asarray(values, dtype=dtype)
