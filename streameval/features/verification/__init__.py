"""Pair-level verification (docs/verification.md): TAR at FAR targets, AUC, ROC and DET curves.

spec (options, light) -> kernels -> statistic (the pass's fields; a window) -> placement (a
pilot's windows) -> select (the exact selection) -> report (its passes, the result's section).
"""
