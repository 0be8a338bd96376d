"""Accuracy, per-class accuracy, confusion matrices, average precision (AP) and mAP.

- Accuracy: fraction of test items whose highest-scoring class is their label; per-class
  accuracy: the same fraction among the items of each class (recall of that class).
- AP, non-interpolated (scikit-learn's ``average_precision_score``): with the test items sorted
  by decreasing score and tied scores forming one threshold,
  AP = Σ_n (R_n − R_{n−1}) P_n over thresholds n.
- AP, VOC2007 11-point (Everingham et al. IJCV 2010, VOCdevkit ``VOCevalcls``): items ranked one
  by one, AP = (1/11) Σ_{t ∈ {0, 0.1, .., 1}} max{P_r : R_r ≥ t} (0 when no rank reaches t).
- mAP: the mean of per-class AP over classes that have a positive test item.

scikit-learn computes what it has (``average_precision_score``, ``accuracy_score``,
``confusion_matrix``); this module adds the input checks, NaN for a class without a positive
item, and the VOC2007 11-point AP, which scikit-learn does not have.
"""

from __future__ import annotations

import numpy as np
import sklearn.metrics

from featpipe.errors import InputError

AP_MODES = ("standard", "voc07")


def _binary_inputs(y_true, scores):
    y_true = np.asarray(y_true).astype(bool).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    if y_true.shape != scores.shape:
        raise InputError(f"{y_true.size} labels for {scores.size} scores")
    if not np.all(np.isfinite(scores)):
        raise InputError("scores contain NaN or Inf")
    return y_true, scores


def average_precision(y_true, scores) -> float:
    """Non-interpolated AP; NaN when there is no positive item."""
    y_true, scores = _binary_inputs(y_true, scores)
    if not y_true.any():
        return float("nan")
    return float(sklearn.metrics.average_precision_score(y_true, scores))


def average_precision_voc07(y_true, scores) -> float:
    """VOC2007 11-point interpolated AP; NaN when there is no positive item."""
    y_true, scores = _binary_inputs(y_true, scores)
    n_pos = int(y_true.sum())
    if n_pos == 0:
        return float("nan")
    order = np.argsort(-scores, kind="stable")
    tp = np.cumsum(y_true[order])
    precision = tp / np.arange(1, len(tp) + 1)
    recall = tp / n_pos
    total = 0.0
    for t in np.arange(0.0, 1.1, 0.1):  # as VOCevalcls (0:0.1:1) and py-faster-rcnn
        reached = precision[recall >= t]
        total += reached.max() if reached.size else 0.0
    return total / 11.0


def per_class_ap(Y_true, scores, mode: str = "standard") -> np.ndarray:
    """AP of each column of an (items × classes) 0/1 matrix against its score column."""
    if mode not in AP_MODES:
        raise InputError(f"AP mode must be one of {AP_MODES}, got {mode!r}")
    Y_true = np.asarray(Y_true)
    scores = np.asarray(scores)
    if Y_true.shape != scores.shape or Y_true.ndim != 2:
        raise InputError(f"targets {Y_true.shape} and scores {scores.shape} must be the same "
                         "(items × classes) shape")
    func = average_precision if mode == "standard" else average_precision_voc07
    return np.array([func(Y_true[:, c], scores[:, c]) for c in range(Y_true.shape[1])])


def mean_average_precision(Y_true, scores, mode: str = "standard") -> float:
    """mAP over the classes with at least one positive test item."""
    ap = per_class_ap(Y_true, scores, mode)
    if np.all(np.isnan(ap)):
        raise InputError("no class has a positive test item: mAP is undefined")
    return float(np.nanmean(ap))


def accuracy(true_index, predicted_index) -> float:
    true_index = np.asarray(true_index)
    predicted_index = np.asarray(predicted_index)
    if true_index.shape != predicted_index.shape or true_index.size == 0:
        raise InputError(f"{true_index.size} true labels for {predicted_index.size} predictions")
    return float(sklearn.metrics.accuracy_score(true_index, predicted_index))


def confusion_matrix(true_index, predicted_index, n_classes: int) -> np.ndarray:
    """Counts C[t, p] of items of class t predicted as p (classes 0..n_classes − 1)."""
    return sklearn.metrics.confusion_matrix(true_index, predicted_index,
                                            labels=np.arange(n_classes)).astype(np.int64)


def per_class_accuracy(true_index, predicted_index, n_classes: int) -> np.ndarray:
    """Fraction of each class's test items predicted correctly (NaN for an absent class)."""
    matrix = confusion_matrix(true_index, predicted_index, n_classes)
    totals = matrix.sum(axis=1)
    correct = np.diag(matrix).astype(np.float64)
    return np.divide(correct, totals, out=np.full(n_classes, np.nan), where=totals > 0)
