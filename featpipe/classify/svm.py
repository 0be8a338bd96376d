"""One-vs-rest SVMs: libsvm C-SVC on a precomputed kernel, liblinear on explicit features.

Classifier of docs/methods.md: for each class c a binary C-SVC (libsvm ``-s 0 -t 4 -c C``)
separates the items labelled c (+1) from all others (−1); an item's score for c is the
decision value f_c(x) = Σ_i α_i y_i K(x, x_i) − ρ, and single-label predictions take the class
with the highest score.  libsvm reports decision values for its *first* label, which is the
label of the first training item; the scores here are always oriented so that positive means
"class c" whatever the order of the training items.

The decision values are evaluated from the model (support-vector indices, coefficients, ρ) with
one matrix product instead of libsvm's per-item Python predict loop; they equal
``svm_predict``'s values (tested).

``OneVsRestLinearSVC`` trains liblinear ``-s 3`` (L2-regularised hinge loss, dual; libsvm's loss
with a regularised bias, ``-B 1``) on explicit features, for linear-type kernels at scale.
"""

from __future__ import annotations

from numbers import Real

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import Interval

from featpipe.errors import InputError
from featpipe.parameters import ValidatedEstimator

DEFAULT_C = 1000.0


def _check_targets(Y) -> np.ndarray:
    Y = np.asarray(Y)
    if Y.ndim != 2 or Y.shape[1] == 0:
        raise InputError(f"targets must be an (items × classes) 0/1 matrix, got shape {Y.shape}")
    Y = Y.astype(bool)
    for c in range(Y.shape[1]):
        if not Y[:, c].any():
            raise InputError(f"class {c} has no positive training item")
        if Y[:, c].all():
            raise InputError(f"class {c} has no negative training item (every train item "
                             "carries it)")
    return Y


def precomputed_problem_matrix(K: np.ndarray) -> sp.csr_matrix:
    """Rows [serial number, K(x, x_1..x_n)] as CSR with every zero kept (libsvm reads a
    precomputed row by position, so no entry may be dropped); column 0 holds 1..n."""
    n, m = K.shape
    data = np.empty((n, m + 1))
    data[:, 0] = np.arange(1, n + 1)
    data[:, 1:] = K
    indices = np.tile(np.arange(m + 1, dtype=np.int32), n)
    indptr = np.arange(0, n * (m + 1) + 1, m + 1, dtype=np.int64)
    return sp.csr_matrix((data.ravel(), indices, indptr), shape=(n, m + 1))


def precomputed_problem(K_train: np.ndarray):
    """A libsvm ``svm_problem`` holding the precomputed train kernel (labels set later).

    libsvm copies the kernel into its own nodes once; one-vs-rest reuses them for every class
    and only rewrites the label array.
    """
    from libsvm import svm as libsvm_svm
    from libsvm import svmutil

    # libsvm's numpy fallback copies the rows with one slice each; its numba path would
    # compile a helper in every new process (seconds) for no gain on full kernel rows.
    jit_enabled = libsvm_svm.jit_enabled
    libsvm_svm.jit_enabled = False
    try:
        rows = precomputed_problem_matrix(K_train)
        return svmutil.svm_problem(np.zeros(K_train.shape[0]), rows, isKernel=True)
    finally:
        libsvm_svm.jit_enabled = jit_enabled


def train_binary_libsvm(problem, y: np.ndarray, C: float, tol: float = 1e-3):
    """libsvm C-SVC (``-s 0 -t 4``) on a :func:`precomputed_problem` with labels ``y``;
    returns (sv_index, coef, rho) oriented so that a positive decision value means y = 1."""
    from libsvm import svmutil

    np.ctypeslib.as_array(problem.y, (problem.l,))[:] = np.where(y, 1.0, -1.0)
    param = svmutil.svm_parameter(f"-s 0 -t 4 -c {C!r} -e {tol!r} -q")
    model = svmutil.svm_train(problem, param)
    sign = 1.0 if model.get_labels()[0] == 1 else -1.0
    index = np.asarray(model.get_sv_indices(), dtype=np.int64) - 1
    coef = np.array([c[0] for c in model.get_sv_coef()]) * sign
    rho = model.rho[0] * sign
    return index, coef, rho


class _SVMParameters(ValidatedEstimator, BaseEstimator):
    """The parameters both one-vs-rest SVMs take.

    Parameters
    ----------
    C : float
        SVM cost C (finite, > 0).
    tol : float
        Stopping tolerance (libsvm/liblinear ``-e``).
    """

    _parameter_constraints = {"C": [Interval(Real, 0, None, closed="neither")],
                              "tol": [Interval(Real, 0, None, closed="neither")]}


class OneVsRestSVC(_SVMParameters):
    """One-vs-rest libsvm C-SVC on precomputed kernels (``-t 4``), default C = 1000.

    ``fit(K_train, Y)`` with K_train (n × n) and Y an (n × classes) 0/1 matrix;
    ``decision_function(K_test)`` with K_test (m × n, columns = training items) returns
    (m × classes) scores.  Attributes: ``support_`` (list of index arrays), ``dual_coef_``
    (list of arrays), ``intercept_`` (−ρ per class).
    """

    def __init__(self, C: float = DEFAULT_C, tol: float = 1e-3):
        self.C = C
        self.tol = tol

    def fit(self, K_train, Y):
        self._validate_params()
        C = float(self.C)
        K_train = np.asarray(K_train, dtype=np.float64)
        if K_train.ndim != 2 or K_train.shape[0] != K_train.shape[1]:
            raise InputError(f"train kernel must be square, got shape {K_train.shape}")
        Y = _check_targets(Y)
        if Y.shape[0] != K_train.shape[0]:
            raise InputError(f"{Y.shape[0]} targets for a kernel of {K_train.shape[0]} items")
        problem = precomputed_problem(K_train)
        self.support_, self.dual_coef_, intercepts = [], [], []
        for c in range(Y.shape[1]):
            index, coef, rho = train_binary_libsvm(problem, Y[:, c], C, self.tol)
            self.support_.append(index)
            self.dual_coef_.append(coef)
            intercepts.append(-rho)
        self.intercept_ = np.array(intercepts)
        self.n_train_ = K_train.shape[0]
        return self

    def decision_function(self, K_test) -> np.ndarray:
        K_test = np.asarray(K_test, dtype=np.float64)
        if K_test.ndim != 2 or K_test.shape[1] != self.n_train_:
            raise InputError(f"test kernel must have {self.n_train_} columns (one per train "
                             f"item), got shape {K_test.shape}")
        scores = np.empty((K_test.shape[0], len(self.support_)))
        for c, (index, coef) in enumerate(zip(self.support_, self.dual_coef_, strict=True)):
            scores[:, c] = K_test[:, index] @ coef + self.intercept_[c]
        return scores


class OneVsRestLinearSVC(_SVMParameters):
    """One-vs-rest liblinear ``-s 3 -B 1`` on explicit features (linear-type kernels)."""

    def __init__(self, C: float = DEFAULT_C, tol: float = 0.1):
        self.C = C
        self.tol = tol

    def fit(self, X, Y):
        from liblinear import liblinearutil

        self._validate_params()
        C = float(self.C)
        X = np.ascontiguousarray(X, dtype=np.float64)
        Y = _check_targets(Y)
        if Y.shape[0] != X.shape[0]:
            raise InputError(f"{Y.shape[0]} targets for {X.shape[0]} items")
        features = sp.csr_matrix(X)
        weights, biases = [], []
        for c in range(Y.shape[1]):
            labels = np.where(Y[:, c], 1.0, -1.0)
            model = liblinearutil.train(labels, features, f"-s 3 -c {C!r} -e {self.tol!r} "
                                                          "-B 1 -q")
            sign = 1.0 if model.get_labels()[0] == 1 else -1.0
            w, b = model.get_decfun()
            weights.append(np.asarray(w) * sign)
            biases.append(b * sign)
        self.coef_ = np.array(weights)
        self.intercept_ = np.array(biases)
        return self

    def decision_function(self, X) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.coef_.shape[1]:
            raise InputError(f"features must have {self.coef_.shape[1]} dimensions, got shape "
                             f"{X.shape}")
        return X @ self.coef_.T + self.intercept_
