"""Kernel matrices for precomputed-kernel SVMs: linear, SSR, chi-square, SER, chi2+SER, chi2-map.

Definitions (docs/methods.md, "Kernels and SVMs", with VLFeat's sign rule)::

    linear     k(x, y) = Σ x_i y_i
    ssr        linear on L2(SSR(x)),  SSR(x) = sign(x)·sqrt|x|
    chi2       k(x, y) = Σ 2 x_i y_i / (|x_i| + |y_i|)   (0 where both are 0)
               = Σ sign(x_i) sign(y_i) 2|x_i||y_i|/(|x_i| + |y_i|): VLFeat's rule for signed
               inputs; for non-negative inputs this is the usual additive chi-square kernel.
    chi2-exp   k(x, y) = exp(−γ Σ (x_i − y_i)²/(x_i + y_i)), non-negative inputs only,
               γ = 1 / (mean chi-square distance over all train×train pairs) by default
    ser        linear on L2(SER(x)),  SER(x) = [sqrt max(0, x), sqrt max(0, −x)]
    chi2+ser   chi2 on SER(x) = Σ [x_i y_i > 0] 2 sqrt|x_i y_i| / (sqrt|x_i| + sqrt|y_i|)
    chi2-map   linear on the explicit homogeneous kernel map (VLFeat, order n, see
               :mod:`featpipe.encode.homkermap`): an approximation of chi2

All sums are float64.  Every kernel is computed in blocks of the feature dimension D (and of
rows for the GEMM kernels), so memory beyond the inputs is the kernel matrix plus one block.
A train×train kernel computes the lower triangle only and mirrors it.

The chi-square family runs in a compiled (numba) loop, threads over row tiles.  Each term needs
a division; it is done as a float32 reciprocal refined by one Newton step in float64,
r ← r + r(1 − s r), which brings the error of 1/s from 2^-24 to about 2^-48: the kernel equals
the float64 definition to about 1e-15 relative, at the speed of float32 division.  Inputs are
scaled by a power of two (exact) so that |x_i| + |y_i| ≤ 2; a pair with
0 < |x_i| + |y_i| < 2^-126 times the largest input (float32's normal range) contributes its
term with 1/s replaced by 2^126, an absolute error below 2^-126 of the largest input.

The SSR and SER maps are those of :mod:`featpipe.encode.maps`.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils._param_validation import Interval, StrOptions

from featpipe.encode.homkermap import HomogeneousKernelMap
from featpipe.encode.maps import sign_expansion_root, signed_square_root
from featpipe.errors import InputError
from featpipe.parameters import ValidatedEstimator

KERNELS = ("linear", "ssr", "chi2", "chi2-exp", "ser", "chi2+ser", "chi2-map")
#: kernels computed as dot products of (mapped) features: liblinear can train on the features
EXPLICIT_KERNELS = ("linear", "ssr", "ser", "chi2-map")

_ADDITIVE, _DISTANCE, _SAME_SIGN = 0, 1, 2  # modes of _chi2_loop.chi2_accumulate


def _mirror_lower(out: np.ndarray, block: int = 256) -> None:
    """Copy the lower triangle onto the upper one, in blocks (temporaries of one block)."""
    n = out.shape[0]
    for i0 in range(0, n, block):
        i1 = min(i0 + block, n)
        out[i0:i1, i1:] = out[i1:, i0:i1].T
        tile = out[i0:i1, i0:i1]
        tile[...] = np.tril(tile) + np.tril(tile, -1).T


def check_features(X, what: str = "X") -> np.ndarray:
    """A finite 2-D float array (float32 kept, anything else as float64), or a clear error."""
    X = np.asarray(X)
    if X.dtype.kind not in "iuf":
        raise InputError(f"{what}: expected numeric encodings, got dtype {X.dtype}")
    if X.ndim != 2:
        raise InputError(f"{what}: expected a 2-D array (items × dimensions), got shape "
                         f"{X.shape}")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise InputError(f"{what}: empty array of shape {X.shape}")
    if X.dtype != np.float32:
        X = X.astype(np.float64, copy=False)
    finite = np.isfinite(X).all(axis=1)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        raise InputError(f"{what}: row {bad[0]} contains NaN or Inf ({len(bad)} rows affected)")
    return X


def _pair(X, Y):
    X = check_features(X, "X")
    if Y is None:
        return X, X, True
    Y = check_features(Y, "Y")
    if Y.shape[1] != X.shape[1]:
        raise InputError(f"dimension mismatch: Y has {Y.shape[1]} dimensions, X has "
                         f"{X.shape[1]}")
    return X, Y, False


def _require_nonnegative(X, kernel: str, what: str) -> None:
    low = float(X.min())
    if low < 0:
        raise InputError(
            f"kernel {kernel} needs non-negative inputs, but {what} has negative values "
            f"(min {low:g}); use 'chi2' (VLFeat's signed rule) or 'chi2+ser' for signed "
            "encodings")


def _chi2_family(X, Y, mode: int, factor: float = 1.0, rooted: bool = False, n_jobs=None,
                 block_dims: int = 1024):
    """factor · Σ_k num/s by the compiled loop, one D-block at a time; ``rooted`` applies SSR
    to each block first."""
    X, Y, symmetric = _pair(X, Y)
    peak = max(float(X.max()), -float(X.min()), float(Y.max()), -float(Y.min()))
    peak = math.sqrt(peak) if rooted else peak
    scale = 1.0 if peak == 0.0 else math.ldexp(1.0, -math.frexp(peak)[1])  # peak·scale <= 1
    from featpipe.classify import _chi2_loop
    from featpipe.numba_cache import announce

    out = np.zeros((X.shape[0], Y.shape[0]))
    previous = _chi2_loop.set_threads(n_jobs)
    try:
        for k0 in range(0, X.shape[1], block_dims):
            k1 = min(k0 + block_dims, X.shape[1])
            A = np.asarray(X[:, k0:k1], dtype=np.float64)
            B = A if symmetric else np.asarray(Y[:, k0:k1], dtype=np.float64)
            if rooted:
                A = signed_square_root(A)
                B = A if symmetric else signed_square_root(B)
            A = A * scale
            B = A if symmetric else B * scale
            announce("chi-square kernel",
                     (_chi2_loop.chi2_accumulate, (A, B, out, mode, symmetric)))
            _chi2_loop.chi2_accumulate(A, B, out, mode, symmetric)
    finally:
        _chi2_loop.set_threads(previous)
    if symmetric:
        _mirror_lower(out)
    out *= factor / scale
    return out


def chi2_kernel(X, Y=None, *, n_jobs: int | None = None) -> np.ndarray:
    """Additive chi-square kernel Σ 2 x_i y_i/(|x_i| + |y_i|) (VLFeat's signed rule), float64.

    ``Y=None`` gives the symmetric train×train matrix K(X, X).
    """
    return _chi2_family(X, Y, _ADDITIVE, factor=2.0, n_jobs=n_jobs)


def chi2_distance(X, Y=None, *, n_jobs: int | None = None) -> np.ndarray:
    """Chi-square distance Σ (x_i − y_i)²/(x_i + y_i) for non-negative inputs, float64."""
    X, Y, _ = _pair(X, Y)
    _require_nonnegative(X, "chi2-exp", "X")
    _require_nonnegative(Y, "chi2-exp", "Y")
    return _chi2_family(X, None if Y is X else Y, _DISTANCE, n_jobs=n_jobs)


def chi2_ser_kernel(X, Y=None, *, n_jobs: int | None = None) -> np.ndarray:
    """chi2 on SER(x): Σ [x_i y_i > 0] 2 sqrt|x_i y_i| / (sqrt|x_i| + sqrt|y_i|)."""
    return _chi2_family(X, Y, _SAME_SIGN, factor=2.0, rooted=True, n_jobs=n_jobs)


def _mapped_gram(X, Y, feature_map, n_jobs=None, block_dims: int = 1024,
                 block_rows: int = 2048) -> np.ndarray:
    """Σ over D-blocks of φ(X_b) φ(Y_b)ᵀ for a per-dimension map φ, float64."""
    X, Y, symmetric = _pair(X, Y)
    out = np.zeros((X.shape[0], Y.shape[0]))
    for k0 in range(0, X.shape[1], block_dims):
        k1 = min(k0 + block_dims, X.shape[1])
        A = feature_map(np.asarray(X[:, k0:k1], dtype=np.float64))
        B = A if symmetric else feature_map(np.asarray(Y[:, k0:k1], dtype=np.float64))
        for i0 in range(0, X.shape[0], block_rows):
            i1 = min(i0 + block_rows, X.shape[0])
            out[i0:i1] += A[i0:i1] @ B.T
    return out


def _inverse_sqrt_l1(X) -> np.ndarray:
    """1/||SSR(x)||₂ = 1/sqrt(Σ|x_i|) (the same for SER); 0 for an all-zero row."""
    norms = np.sqrt(np.concatenate([np.abs(X[i:i + 4096]).sum(axis=1, dtype=np.float64)
                                    for i in range(0, X.shape[0], 4096)]))
    return np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)


def linear_kernel(X, Y=None) -> np.ndarray:
    """Σ x_i y_i in float64."""
    return _mapped_gram(X, Y, lambda A: A)


def ssr_kernel(X, Y=None) -> np.ndarray:
    """Linear kernel on L2(SSR(x)): Σ sign(x_i y_i) sqrt|x_i y_i| / (||SSR x|| ||SSR y||)."""
    X, Y, _ = _pair(X, Y)
    K = _mapped_gram(X, Y, signed_square_root)
    K *= _inverse_sqrt_l1(X)[:, None]
    K *= _inverse_sqrt_l1(Y)[None, :]
    return K


def ser_kernel(X, Y=None) -> np.ndarray:
    """Linear kernel on L2(SER(x)): Σ [x_i y_i > 0] sqrt|x_i y_i| / (||SER x|| ||SER y||)."""
    X, Y, _ = _pair(X, Y)
    K = _mapped_gram(X, Y, sign_expansion_root)
    K *= _inverse_sqrt_l1(X)[:, None]
    K *= _inverse_sqrt_l1(Y)[None, :]
    return K


def chi2_map_kernel(X, Y=None, order: int = 1) -> np.ndarray:
    """Linear kernel on VLFeat's homogeneous kernel map of order ``order`` (≈ chi2)."""
    hkm = HomogeneousKernelMap(order=order).fit()
    return _mapped_gram(X, Y, hkm.transform)


def explicit_features(kernel: str, X, order: int = 1) -> np.ndarray:
    """The feature vectors whose dot products are ``kernel`` (for liblinear), float64."""
    X = check_features(X, "X").astype(np.float64)
    if kernel == "linear":
        return X
    if kernel == "ssr":
        return signed_square_root(X) * _inverse_sqrt_l1(X)[:, None]
    if kernel == "ser":
        return sign_expansion_root(X) * _inverse_sqrt_l1(X)[:, None]
    if kernel == "chi2-map":
        return HomogeneousKernelMap(order=order).fit().transform(X)
    raise InputError(f"kernel {kernel!r} has no explicit feature map; explicit kernels: "
                     f"{', '.join(EXPLICIT_KERNELS)}")


class PrecomputedKernel(ValidatedEstimator, TransformerMixin, BaseEstimator):
    """A named kernel fitted on training encodings: K(train, train) and K(test, train).

    Parameters
    ----------
    kernel : {"linear", "ssr", "chi2", "chi2-exp", "ser", "chi2+ser", "chi2-map"}
        The kernel (module docstring).
    gamma : float or None
        chi2-exp only: γ > 0; None means 1/mean train×train chi-square distance.
    order : int
        chi2-map only: order of the homogeneous kernel map.
    n_jobs : int or None
        Threads for the chi-square family (None or -1: all).

    Attributes
    ----------
    X_ : the training encodings; ``train_kernel_`` : (n_train, n_train) float64;
    gamma_ : the chi2-exp γ actually used (None for other kernels).
    """

    _parameter_constraints = {
        "kernel": [StrOptions(set(KERNELS))],
        "gamma": [Interval(Real, 0, None, closed="neither"), None],
        "order": [Interval(Integral, 0, None, closed="left")],
        "n_jobs": [Integral, None],
    }

    def __init__(self, kernel: str = "chi2", gamma: float | None = None, order: int = 1,
                 n_jobs: int | None = None):
        self.kernel = kernel
        self.gamma = gamma
        self.order = order
        self.n_jobs = n_jobs

    def _compute(self, X, Y=None) -> np.ndarray:
        kernel = self.kernel
        if kernel == "linear":
            return linear_kernel(X, Y)
        if kernel == "ssr":
            return ssr_kernel(X, Y)
        if kernel == "ser":
            return ser_kernel(X, Y)
        if kernel == "chi2":
            return chi2_kernel(X, Y, n_jobs=self.n_jobs)
        if kernel == "chi2+ser":
            return chi2_ser_kernel(X, Y, n_jobs=self.n_jobs)
        if kernel == "chi2-map":
            return chi2_map_kernel(X, Y, order=self.order)
        distance = chi2_distance(X, Y, n_jobs=self.n_jobs)
        np.multiply(distance, -self.gamma_, out=distance)
        return np.exp(distance, out=distance)

    def fit(self, X, y=None):
        self._validate_params()
        X = check_features(X, "train encodings")
        if self.kernel == "chi2-exp":
            _require_nonnegative(X, self.kernel, "the train encodings")
            distance = chi2_distance(X, n_jobs=self.n_jobs)
            if self.gamma is None:
                mean = float(distance.mean())
                if mean == 0.0:
                    raise InputError("chi2-exp: all train encodings are identical (mean "
                                     "chi-square distance 0); give --gamma explicitly")
                self.gamma_ = 1.0 / mean
            else:
                self.gamma_ = float(self.gamma)
            np.multiply(distance, -self.gamma_, out=distance)
            self.train_kernel_ = np.exp(distance, out=distance)
        else:
            self.gamma_ = None
            self.train_kernel_ = self._compute(X)
        self.X_ = X
        return self

    def transform(self, Y) -> np.ndarray:
        """K(Y, X_): rows are the given (test) items, columns the training items."""
        if not hasattr(self, "X_"):
            raise InputError("PrecomputedKernel is not fitted; call fit(train) first")
        Y = check_features(Y, "test encodings")
        if Y.shape[1] != self.X_.shape[1]:
            raise InputError(f"test encodings have {Y.shape[1]} dimensions, train encodings "
                             f"have {self.X_.shape[1]}")
        if self.kernel == "chi2-exp":
            _require_nonnegative(Y, self.kernel, "the test encodings")
        return self._compute(Y, self.X_)

