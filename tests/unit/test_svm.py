"""One-vs-rest SVMs against scikit-learn's SVC and libsvm's/liblinear's own predict."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_digits
from sklearn.svm import SVC

from featpipe.classify import kernels as K
from featpipe.classify.svm import (
    OneVsRestLinearSVC,
    OneVsRestSVC,
    precomputed_problem,
    precomputed_problem_matrix,
    train_binary_libsvm,
)
from featpipe.errors import InputError


@pytest.fixture(scope="module")
def digits():
    """Real images: scikit-learn's 8×8 digits (pixel counts 0..16, non-negative)."""
    X, y = load_digits(return_X_y=True)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(y))[:260]
    X, y = X[order].astype(np.float32), y[order]
    return X[:160], y[:160], X[160:], y[160:]


def one_hot(y, classes):
    return np.asarray(y)[:, None] == np.asarray(classes)[None, :]


@pytest.mark.parametrize("C", [0.01, 1.0, 1000.0])
def test_binary_decision_values_equal_sklearn_svc(digits, C):
    X, y, Xt, _ = digits
    kern = K.PrecomputedKernel("chi2").fit(X)
    K_train, K_test = kern.train_kernel_, kern.transform(Xt)
    target = y == 3
    # both run libsvm's SMO; with a tight stopping tolerance both reach the same optimum
    ours = OneVsRestSVC(C=C, tol=1e-9).fit(K_train, target[:, None]).decision_function(
        K_test)[:, 0]
    ref = SVC(kernel="precomputed", C=C, tol=1e-9).fit(K_train, target).decision_function(
        K_test)  # positive means classes_[1] = True
    assert np.abs(ours - ref).max() <= 1e-6 * np.abs(ref).max()


def test_orientation_does_not_depend_on_first_training_label(digits):
    X, y, Xt, _ = digits
    kern = K.PrecomputedKernel("linear").fit(X)
    target = y == 7
    assert not target[0]  # libsvm's first label is then -1: its raw values point the other way
    scores = OneVsRestSVC(C=1.0).fit(kern.train_kernel_, target[:, None]).decision_function(
        kern.transform(Xt))[:, 0]
    first = int(np.flatnonzero(target)[0])
    perm = np.r_[first, np.delete(np.arange(len(y)), first)]
    kern2 = K.PrecomputedKernel("linear").fit(X[perm])
    scores2 = OneVsRestSVC(C=1.0).fit(kern2.train_kernel_, target[perm][:, None]) \
        .decision_function(kern2.transform(Xt))[:, 0]
    np.testing.assert_allclose(scores, scores2, rtol=1e-6, atol=1e-6 * np.abs(scores).max())


def test_vectorised_decision_equals_libsvm_predict(digits):
    from libsvm import svmutil

    X, y, Xt, _ = digits
    kern = K.PrecomputedKernel("ssr").fit(X)
    K_train, K_test = kern.train_kernel_, kern.transform(Xt)
    target = y == 5
    index, coef, rho = train_binary_libsvm(precomputed_problem(K_train), target, C=10.0)
    ours = K_test[:, index] @ coef - rho
    labels = np.where(target, 1.0, -1.0)
    problem = svmutil.svm_problem(labels, precomputed_problem_matrix(K_train), isKernel=True)
    model = svmutil.svm_train(problem, svmutil.svm_parameter("-s 0 -t 4 -c 10 -q"))
    rows = precomputed_problem_matrix(K_test)
    _, _, values = svmutil.svm_predict(np.zeros(len(Xt)), rows, model, "-q")
    raw = np.array(values)[:, 0] * (1 if model.get_labels()[0] == 1 else -1)
    np.testing.assert_allclose(ours, raw, rtol=1e-12, atol=1e-12)


def test_precomputed_rows_keep_zeros():
    K_mat = np.array([[1.0, 0.0], [0.0, 2.0]])
    rows = precomputed_problem_matrix(K_mat)
    assert isinstance(rows, sp.csr_matrix) and rows.nnz == 6  # zeros are stored explicitly
    np.testing.assert_array_equal(rows.toarray(), [[1, 1, 0], [2, 0, 2]])


def test_one_vs_rest_multiclass_on_digits(digits):
    X, y, Xt, yt = digits
    classes = np.unique(y)
    kern = K.PrecomputedKernel("chi2").fit(X)
    scores = OneVsRestSVC().fit(kern.train_kernel_, one_hot(y, classes)).decision_function(
        kern.transform(Xt))
    # independent one-vs-rest with scikit-learn's SVC on the same kernel
    ref = np.column_stack([
        SVC(kernel="precomputed", C=1000.0).fit(kern.train_kernel_, y == c).decision_function(
            kern.transform(Xt)) for c in classes])
    np.testing.assert_array_equal(scores.argmax(1), ref.argmax(1))
    assert np.mean(classes[scores.argmax(1)] == yt) > 0.9


def test_liblinear_scores_equal_liblinear_predict(digits):
    from liblinear import liblinearutil

    X, y, Xt, yt = digits
    F, Ft = K.explicit_features("ssr", X), K.explicit_features("ssr", Xt)
    classes = np.unique(y)
    # liblinear's dual solver shuffles with the C library's rand(), whose state the earlier
    # tests of the process leave behind: both trainings start from the same seed
    libc = ctypes.CDLL(None)
    libc.srand(1)
    model = OneVsRestLinearSVC(C=0.1, tol=1e-9).fit(F, one_hot(y, classes))
    scores = model.decision_function(Ft)
    labels = np.where(y == classes[2], 1.0, -1.0)
    libc.srand(1)
    for c in classes[:2]:  # the same rand() draws as the model's first two classes took
        liblinearutil.train(np.where(y == c, 1.0, -1.0), sp.csr_matrix(F),
                            "-s 3 -c 0.1 -e 1e-9 -B 1 -q")
    ref_model = liblinearutil.train(labels, sp.csr_matrix(F), "-s 3 -c 0.1 -e 1e-9 -B 1 -q")
    _, _, values = liblinearutil.predict(np.zeros(len(Ft)), sp.csr_matrix(Ft), ref_model, "-q")
    raw = np.array(values)[:, 0] * (1 if ref_model.get_labels()[0] == 1 else -1)
    np.testing.assert_allclose(scores[:, 2], raw, rtol=1e-6, atol=1e-6)
    assert np.mean(classes[scores.argmax(1)] == yt) > 0.8


def test_bad_targets_and_parameters():
    K_mat = np.eye(4)
    with pytest.raises(InputError, match="class 1 has no positive"):
        OneVsRestSVC().fit(K_mat, np.array([[1, 0], [1, 0], [0, 0], [0, 0]]))
    with pytest.raises(InputError, match="square"):
        OneVsRestSVC().fit(np.ones((3, 4)), np.eye(3))
    with pytest.raises(InputError, match=r"C must be a float in the range \(0.0, inf\), got -1"):
        OneVsRestSVC(C=-1).fit(K_mat, np.eye(4))
    model = OneVsRestSVC().fit(K_mat, np.array([[1, 0], [1, 0], [0, 1], [0, 1]]))
    with pytest.raises(InputError, match="4 columns"):
        model.decision_function(np.ones((2, 3)))


def test_the_default_C_is_the_documented_1000_everywhere():
    """docs/methods.md: libsvm C-SVC on the precomputed kernel, "default C = 1000"; the
    estimators, the experiment settings, ``stages.classify`` and ``classify --C`` agree."""
    import inspect

    from featpipe import stages
    from featpipe.classify.experiment import Settings
    from tests.conftest import REPO, invoke_cli

    assert "default C = 1000;" in (REPO / "docs" / "methods.md").read_text(encoding="utf-8")
    assert OneVsRestSVC().C == OneVsRestLinearSVC().C == 1000.0
    assert Settings().Cs == (1000.0,)
    assert inspect.signature(stages.classify).parameters["C"].default == (1000.0,)
    help_text = " ".join(invoke_cli("classify", "--help").output.split())
    assert "[default: 1000]" in help_text
