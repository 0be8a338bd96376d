"""Kernel fusion scales each kernel to a unit mean diagonal before the weighted average
(issue 40; docs/classify.md, "Fusion"): against a literal transcription on real data, for the
precomputed kernels and the explicit features alike; one kernel is used as computed, and only
fused runs carry the rule in their key."""

from __future__ import annotations

import numpy as np
import pytest

from featpipe.classify import fusion
from featpipe.classify.experiment import Settings, _Fitted
from featpipe.encode.maps import l2_normalize
from featpipe.errors import ParameterError
from tests.cli.test_pipeline import literal_chi2


@pytest.fixture(scope="module")
def means():
    """aeon's BasicMotions, each series' per-channel means, L2-normalised as classify does."""
    aeon = pytest.importorskip("aeon.datasets")
    X_train, _ = aeon.load_basic_motions(split="train")
    X_test, _ = aeon.load_basic_motions(split="test")
    return (l2_normalize(X_train.mean(axis=2).astype(np.float32)).astype(np.float64),
            l2_normalize(X_test.mean(axis=2).astype(np.float32)).astype(np.float64))


def _ser(X):
    return np.hstack([np.sqrt(np.maximum(X, 0)), np.sqrt(np.maximum(-X, 0))])


def literal_fused(A, B, train, rule, weights=(0.25, 0.75)):
    """w_1 chi2+SER(A, B) / s_1 + w_2 A Bᵀ / s_2, s the mean k(x, x) of the train items."""
    chi2 = literal_chi2(_ser(A), _ser(B))
    linear = A @ B.T
    s1 = np.diagonal(literal_chi2(_ser(train), _ser(train))).mean() if rule != "none" else 1
    s2 = np.einsum("ij,ij->i", train, train).mean() if rule != "none" else 1
    return weights[0] * chi2 / s1 + weights[1] * linear / s2


@pytest.mark.parametrize("rule", fusion.SCALES)
def test_fused_kernels_equal_the_literal_scaled_average(means, rule):
    X_train, X_test = means
    fitted = _Fitted(Settings(weights=(1.0, 3.0), fusion_scale=rule), [X_train, X_train],
                     [X_test, X_test], ["chi2+ser", "linear"])
    np.testing.assert_allclose(fitted.train, literal_fused(X_train, X_train, X_train, rule),
                               rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(fitted.test, literal_fused(X_test, X_train, X_train, rule),
                               rtol=1e-9, atol=1e-12)
    if rule == "unit-diagonal":  # on L2-normalised encodings: chi2+SER's k(x, x) = Σ sqrt|x_j|
        assert fitted.scales[1] == pytest.approx(1.0)
        assert 1 / fitted.scales[0] == pytest.approx(np.sqrt(np.abs(X_train)).sum(1).mean())
        assert 1 / fitted.scales[0] > 1.5  # the chi2+SER kernel outweighed the linear one


def test_explicit_features_are_scaled_alike(means):
    X_train, X_test = means
    fitted = _Fitted(Settings(solver="liblinear"), [3 * X_train, X_train], [3 * X_test, X_test],
                     ["linear", "linear"])
    expected = 0.5 * (9 * X_test @ X_train.T) / 9 + 0.5 * (X_test @ X_train.T)
    np.testing.assert_allclose(fitted.test @ fitted.train.T, expected, rtol=1e-6)


def test_one_kernel_is_used_as_computed_and_a_bad_rule_is_refused(means):
    X_train, X_test = means
    alone = _Fitted(Settings(), [X_train], [X_test], ["chi2+ser"])
    assert alone.scales == [1.0]
    np.testing.assert_allclose(alone.train, literal_chi2(_ser(X_train), _ser(X_train)),
                               rtol=1e-9)
    assert fusion.scale_factor(np.zeros(4), "unit-diagonal") == 1.0  # an all-zero kernel
    with pytest.raises(ParameterError, match="fusion_scale must be one of"):
        fusion.scale_factor(np.ones(3), "trace")


def test_only_fused_runs_carry_the_rule_in_their_record():
    from featpipe.stages.classification import classify_record

    common = dict(weights=None, Cs=[1000.0], folds=[], split="1", metric="accuracy",
                  ap_mode="standard", solver="libsvm", gamma=None, order=1, normalize="l2")
    one = classify_record(["a"], ["linear"], "average", **common)
    assert "fusion_scale" not in one  # one kernel: the rule changes nothing, nor the key
    assert classify_record(["a"], ["linear"], "average", **common, fusion_scale="none") == one
    two = classify_record(["a", "b"], ["linear", "linear"], "average", **common)
    assert two["fusion_scale"] == "unit-diagonal" == fusion.SCALES[0]
