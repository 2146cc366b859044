"""Rank statistics shared by the meter's fit (Spearman of predicted vs true Token-to-Go) and the robust credit's trust
(the within-group AUC of p̃ against outcomes): ranks with ties sharing their mean rank."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks 0..n−1 of ``values``, ties given the mean of the ranks they span."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values))
    _, tie, counts = np.unique(np.asarray(values), return_inverse=True, return_counts=True)
    return (np.bincount(tie, weights=ranks) / counts)[tie]


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (ties share their mean rank); NaN for fewer than three pairs or a constant side."""
    if len(a) < 3 or len(set(a)) < 2 or len(set(b)) < 2:
        return float("nan")
    return float(np.corrcoef(average_ranks(a), average_ranks(b))[0, 1])
