"""Metrics against scikit-learn and a literal transcription of VOC2007's VOCevalcls."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, average_precision_score
from sklearn.metrics import confusion_matrix as sk_confusion

from featpipe.classify import metrics
from featpipe.classify.fusion import average_kernels, fuse_features, normalised_weights
from featpipe.errors import InputError


def voc07_literal(gt, out):
    """VOCevalcls (VOC2007): sort, cumulate, 11-point max precision (transcribed)."""
    si = np.argsort(-out, kind="stable")
    tp = np.cumsum(gt[si] > 0)
    fp = np.cumsum(gt[si] <= 0)
    rec = tp / np.sum(gt > 0)
    prec = tp / (fp + tp)
    ap = 0.0
    for t in np.arange(0, 1.1, 0.1):
        p = prec[rec >= t]
        ap += (p.max() if p.size else 0.0) / 11
    return ap


@pytest.fixture
def multilabel():
    rng = np.random.default_rng(0)
    Y = rng.random((60, 7)) < 0.3
    Y[0] = True
    scores = Y * 0.8 + rng.normal(size=Y.shape)
    scores[:10, 2] = 0.5  # ties
    scores = np.round(scores, 1)  # many more ties
    return Y, scores


def test_map_equals_sklearn_average_precision(multilabel):
    Y, scores = multilabel
    ap = metrics.per_class_ap(Y, scores)
    expected = [average_precision_score(Y[:, c], scores[:, c]) for c in range(Y.shape[1])]
    np.testing.assert_allclose(ap, expected, rtol=1e-12)
    assert metrics.mean_average_precision(Y, scores) == pytest.approx(np.mean(expected),
                                                                      rel=1e-12)
    assert metrics.mean_average_precision(Y, scores) == pytest.approx(
        average_precision_score(Y, scores, average="macro"), rel=1e-12)


def test_voc07_eleven_point(multilabel):
    Y, scores = multilabel
    rng = np.random.default_rng(1)
    scores = scores + rng.normal(scale=1e-6, size=scores.shape)  # VOC ranks item by item
    ap = metrics.per_class_ap(Y, scores, mode="voc07")
    expected = [voc07_literal(Y[:, c].astype(int), scores[:, c]) for c in range(Y.shape[1])]
    np.testing.assert_allclose(ap, expected, rtol=1e-12)
    assert metrics.average_precision_voc07([1, 0, 1], [0.9, 0.8, 0.1]) == pytest.approx(
        (6 * 1.0 + 5 * (2 / 3)) / 11)


def test_absent_class_is_nan_and_excluded(multilabel):
    Y, scores = multilabel
    Y = Y.copy()
    Y[:, 3] = False
    ap = metrics.per_class_ap(Y, scores)
    assert np.isnan(ap[3])
    assert metrics.mean_average_precision(Y, scores) == pytest.approx(np.nanmean(ap))
    with pytest.raises(InputError, match="no class has a positive"):
        metrics.mean_average_precision(np.zeros((3, 2)), np.ones((3, 2)))


def test_accuracy_confusion_and_per_class():
    rng = np.random.default_rng(2)
    true = rng.integers(0, 5, 200)
    pred = np.where(rng.random(200) < 0.7, true, rng.integers(0, 5, 200))
    assert metrics.accuracy(true, pred) == pytest.approx(accuracy_score(true, pred))
    C = metrics.confusion_matrix(true, pred, 6)
    np.testing.assert_array_equal(C[:5, :5], sk_confusion(true, pred))
    per = metrics.per_class_accuracy(true, pred, 6)
    np.testing.assert_allclose(per[:5], np.diag(C)[:5] / C.sum(1)[:5])
    assert np.isnan(per[5])
    with pytest.raises(InputError):
        metrics.accuracy([], [])


def test_bad_metric_inputs():
    with pytest.raises(InputError, match="NaN"):
        metrics.average_precision([1, 0], [np.nan, 1.0])
    with pytest.raises(InputError, match="mode"):
        metrics.per_class_ap(np.ones((2, 2)), np.ones((2, 2)), mode="voc12")
    with pytest.raises(InputError, match="same"):
        metrics.per_class_ap(np.ones((2, 2)), np.ones((3, 2)))


def test_fusion_average_and_features():
    rng = np.random.default_rng(3)
    A, B = rng.normal(size=(5, 4)), rng.normal(size=(5, 6))
    w = normalised_weights(2, [1, 3])
    np.testing.assert_allclose(w, [0.25, 0.75])
    fused = average_kernels([A @ A.T, B @ B.T], w)
    np.testing.assert_allclose(fused, 0.25 * A @ A.T + 0.75 * B @ B.T)
    F = fuse_features([A, B], w)
    np.testing.assert_allclose(F @ F.T, fused)
    np.testing.assert_allclose(normalised_weights(3, None), [1 / 3] * 3)
    with pytest.raises(InputError, match="3 weights given for 2 inputs"):
        normalised_weights(2, [1, 2, 3])
    with pytest.raises(InputError, match="non-negative"):
        normalised_weights(2, [1, -2])
