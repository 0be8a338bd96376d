"""Kernels against literal numpy definitions and scikit-learn, to 1e-10 relative."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics.pairwise import additive_chi2_kernel
from sklearn.metrics.pairwise import chi2_kernel as sk_chi2_kernel

from featpipe.classify import kernels as K
from featpipe.encode.homkermap import HomogeneousKernelMap
from featpipe.errors import InputError

RTOL = 1e-10


def literal_chi2(X, Y):
    """Σ sign(x)sign(y) 2|x||y|/(|x|+|y|) term by term (0 where both are 0)."""
    x, y = X[:, None, :].astype(np.float64), Y[None, :, :].astype(np.float64)
    s = np.abs(x) + np.abs(y)
    term = np.sign(x) * np.sign(y) * 2 * np.abs(x) * np.abs(y) / np.where(s > 0, s, 1)
    return term.sum(-1)


def literal_ssr(X):
    z = np.sign(X) * np.sqrt(np.abs(X))
    n = np.linalg.norm(z, axis=1, keepdims=True)
    return np.divide(z, n, out=np.zeros_like(z), where=n > 0)


def literal_ser(X):
    z = np.hstack([np.sqrt(np.maximum(X, 0)), np.sqrt(np.maximum(-X, 0))])
    n = np.linalg.norm(z, axis=1, keepdims=True)
    return np.divide(z, n, out=np.zeros_like(z), where=n > 0)


def assert_rel(actual, expected, rtol=RTOL):
    scale = np.abs(expected).max()
    assert np.abs(actual - expected).max() <= rtol * scale, np.abs(actual - expected).max()


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X = (rng.random((37, 2100)) ** 3).astype(np.float32)  # several D blocks, odd sizes
    X[:, :50] = 0.0  # dimensions where x + y = 0
    X[3] = 0.0       # an all-zero item
    Y = (rng.random((23, 2100)) ** 3).astype(np.float32)
    Y[:, 40:60] = 0.0
    return X, Y


def test_chi2_equals_sklearn_additive_and_literal(data):
    X, Y = data
    ours = K.chi2_kernel(X, Y)
    x64, y64 = X.astype(np.float64), Y.astype(np.float64)
    # sklearn's additive_chi2_kernel is -Σ (x-y)²/(x+y) = 2·k(x, y) - Σx - Σy
    sk = (x64.sum(1)[:, None] + y64.sum(1)[None, :] + additive_chi2_kernel(x64, y64)) / 2
    assert_rel(ours, sk)
    assert_rel(ours, literal_chi2(X, Y))


def test_chi2_train_kernel_symmetric_and_threads(data):
    X, _ = data
    full = K.chi2_kernel(X)
    np.testing.assert_array_equal(full, full.T)
    assert_rel(full, literal_chi2(X, X))
    np.testing.assert_array_equal(K.chi2_kernel(X, n_jobs=1), full)
    assert not full[3].any()  # the all-zero item


def test_chi2_signed_follows_vlfeat_rule():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(11, 300))
    Y = rng.normal(size=(9, 300))
    X[0, :10] = 0.0
    assert_rel(K.chi2_kernel(X, Y), literal_chi2(X, Y))
    # and it is what the homogeneous kernel map approximates for signed data
    hkm = HomogeneousKernelMap(order=6).fit()
    approx = hkm.transform(X) @ hkm.transform(Y).T
    assert_rel(approx, K.chi2_kernel(X, Y), rtol=2e-3)


def test_chi2_extreme_magnitudes_stay_exact():
    rng = np.random.default_rng(2)
    X = rng.random((5, 64)) * 1e30
    Y = rng.random((4, 64)) * 1e30
    assert_rel(K.chi2_kernel(X, Y), literal_chi2(X, Y))
    assert_rel(K.chi2_kernel(X * 1e-60, Y * 1e-60), literal_chi2(X * 1e-60, Y * 1e-60))


def test_chi2_exp_equals_sklearn_chi2_kernel(data):
    X, Y = data
    kern = K.PrecomputedKernel("chi2-exp").fit(X)
    x64, y64 = X.astype(np.float64), Y.astype(np.float64)
    distance = -additive_chi2_kernel(x64)
    assert kern.gamma_ == pytest.approx(1.0 / distance.mean(), rel=1e-12)
    assert_rel(kern.train_kernel_, sk_chi2_kernel(x64, gamma=kern.gamma_))
    assert_rel(kern.transform(Y), sk_chi2_kernel(y64, x64, gamma=kern.gamma_))
    fixed = K.PrecomputedKernel("chi2-exp", gamma=0.5).fit(X)
    assert_rel(fixed.transform(Y), sk_chi2_kernel(y64, x64, gamma=0.5))


@pytest.mark.parametrize("name, literal", [
    ("linear", lambda X: X.astype(np.float64)),
    ("ssr", literal_ssr),
    ("ser", literal_ser),
])
def test_gram_kernels_equal_literal_maps(name, literal):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(20, 2500)).astype(np.float32)
    X[4] = 0.0
    Y = rng.normal(size=(7, 2500)).astype(np.float32)
    x64, y64 = X.astype(np.float64), Y.astype(np.float64)
    kern = K.PrecomputedKernel(name).fit(X)
    assert_rel(kern.train_kernel_, literal(x64) @ literal(x64).T)
    assert_rel(kern.transform(Y), literal(y64) @ literal(x64).T)
    assert not kern.train_kernel_[4].any()
    assert_rel(K.explicit_features(name, Y) @ K.explicit_features(name, X).T,
               kern.transform(Y))


def test_chi2_ser_is_chi2_on_ser_map():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(13, 1500))
    Y = rng.normal(size=(6, 1500))
    ser = lambda A: np.hstack([np.sqrt(np.maximum(A, 0)), np.sqrt(np.maximum(-A, 0))])  # noqa
    kern = K.PrecomputedKernel("chi2+ser").fit(X)
    assert_rel(kern.train_kernel_, literal_chi2(ser(X), ser(X)))
    assert_rel(kern.transform(Y), literal_chi2(ser(Y), ser(X)))


def test_chi2_map_approaches_exact_as_order_grows(data):
    X, Y = data[0][:, 30:500], data[1][:, 30:500]
    exact = K.chi2_kernel(Y, X)
    errors = []
    for order in (1, 2, 3, 5):
        approx = K.PrecomputedKernel("chi2-map", order=order).fit(X).transform(Y)
        errors.append(np.abs(approx - exact).max() / exact.max())
    assert errors == sorted(errors, reverse=True), errors
    assert errors[-1] < 1e-3


def test_bad_inputs_name_the_problem(data):
    X, Y = data
    with pytest.raises(InputError, match="dimensions"):
        K.PrecomputedKernel("chi2").fit(X).transform(Y[:, :100])
    bad = X.copy()
    bad[5, 7] = np.nan
    with pytest.raises(InputError, match="row 5 contains NaN"):
        K.PrecomputedKernel("linear").fit(bad)
    with pytest.raises(InputError, match=r"chi2-exp needs non-negative.*use 'chi2'"):
        K.PrecomputedKernel("chi2-exp").fit(X - 0.5)
    with pytest.raises(InputError, match="kernel must be one of chi2, .*, got 'rbf'"):
        K.PrecomputedKernel("rbf").fit(X)
    with pytest.raises(InputError, match="not fitted"):
        K.PrecomputedKernel("chi2").transform(X)
    with pytest.raises(InputError, match="identical"):
        K.PrecomputedKernel("chi2-exp").fit(np.ones((4, 3)))


def test_chi2_kernel_memory_is_the_matrix_plus_blocks():
    import tracemalloc

    rng = np.random.default_rng(5)
    X = rng.random((1500, 200), dtype=np.float32)
    K.chi2_kernel(X[:8])  # load the compiled loop outside the measurement
    tracemalloc.start()
    try:
        kernel = K.chi2_kernel(X)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    matrix = kernel.nbytes
    block = X.shape[0] * X.shape[1] * 8  # one float64 copy of a D-block
    assert peak <= matrix + 3 * block + 2**20, (peak, matrix)


@pytest.mark.parametrize("kernel", ["chi2", "chi2+ser", "chi2-exp", "linear", "ssr"])
def test_a_train_kernel_of_more_than_256_items_is_filled_and_symmetric(kernel):
    """The train×train matrix computes its lower triangle and mirrors it in blocks of 256
    rows: with 300 items every block off the diagonal must equal K(X, X) computed as a test
    kernel (no mirroring), and the chi2 one the literal definition (issue 31 §4)."""
    rng = np.random.default_rng(1)
    X = rng.random((300, 6)) ** 2
    if kernel in ("chi2", "chi2+ser"):
        X[::3] *= -1  # signed rows: VLFeat's rule
    fitted = K.PrecomputedKernel(kernel).fit(X)
    train = fitted.train_kernel_
    assert train.shape == (300, 300)
    if kernel.startswith("chi2"):  # mirrored: exactly symmetric
        np.testing.assert_array_equal(train, train.T)
    assert_rel(train, fitted.transform(X))
    assert np.abs(train[:256, 256:]).max() > 0
    if kernel == "chi2":
        assert_rel(train, literal_chi2(X, X))


def test_check_features_keeps_float32_widens_the_rest_and_refuses_empty_arrays():
    assert K.check_features(np.ones((2, 3), np.float32)).dtype == np.float32
    for dtype in (np.float64, np.float16, np.int32, np.uint8):
        assert K.check_features(np.ones((2, 3), dtype)).dtype == np.float64
    assert K.check_features(np.ones((1, 1))).shape == (1, 1)  # one item, one dimension
    for shape in ((0, 3), (3, 0)):
        with pytest.raises(InputError, match=rf"X: empty array of shape \({shape[0]}, "):
            K.check_features(np.ones(shape))
    with pytest.raises(InputError, match="expected a 2-D array"):
        K.check_features(np.ones(3))
    with pytest.raises(InputError, match="expected numeric encodings, got dtype"):
        K.check_features(np.array([["a"]]))
    with pytest.raises(InputError, match="dimension mismatch: Y has 2 dimensions, X has 3"):
        K.linear_kernel(np.ones((2, 3)), np.ones((2, 2)))


def test_chi2_exp_refuses_negative_train_or_test_encodings_and_uses_a_given_gamma():
    X = np.random.default_rng(2).random((6, 4))
    with pytest.raises(InputError, match="the train encodings has negative values"):
        K.PrecomputedKernel("chi2-exp").fit(X - 0.5)
    fitted = K.PrecomputedKernel("chi2-exp", gamma=0.25).fit(X)
    assert fitted.gamma_ == 0.25
    assert_rel(fitted.train_kernel_, np.exp(-0.25 * K.chi2_distance(X)))
    with pytest.raises(InputError, match="the test encodings has negative values"):
        fitted.transform(X - 0.5)
    with pytest.raises(InputError, match="chi2-exp needs non-negative inputs, but Y has"):
        K.chi2_distance(X, X - 0.5)


@pytest.mark.parametrize("order", [0, 2])
def test_explicit_features_follow_the_order_of_the_map(order):
    X = np.random.default_rng(3).random((5, 4))
    features = K.explicit_features("chi2-map", X, order=order)
    assert features.shape == (5, (2 * order + 1) * 4)
    np.testing.assert_array_equal(features,
                                  HomogeneousKernelMap(order=order).fit().transform(X))
    assert_rel(features @ features.T, K.chi2_map_kernel(X, order=order))
    with pytest.raises(InputError, match="kernel 'chi2' has no explicit feature map"):
        K.explicit_features("chi2", X)
