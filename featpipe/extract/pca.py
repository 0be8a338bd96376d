"""PCA of local or per-frame descriptors, fitted on a seeded sample of train descriptors.

y = (x − μ) Wᵀ with W the top ``n_components`` principal axes (rows, unit norm) of the
sample covariance (scikit-learn's ``PCA`` with the full SVD is the engine); optional whitening
divides each output by √λ_k.  The deep Fisher kernel paper (Sydorov et al., CVPR'14, §5)
projects dense SIFT to 64 dimensions; Fisher-vector pipelines (Sánchez et al., IJCV'13 §3)
do the same before the GMM.

The model is stored in a ``pca`` stage as ``models/pca.npz`` (``components``, ``mean``,
``explained_variance``) with its metadata (the model contract of :mod:`featpipe.models`);
:func:`load_pca` gives it back to any helper (extraction with ``--pca``, Fisher-vector
encoders).  The descriptors it is fitted on come from
:func:`featpipe.stages.fitting.sample_descriptors`.
"""

from __future__ import annotations

from numbers import Integral

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils._param_validation import Interval

from featpipe.backend import single_threaded_blas
from featpipe.errors import FeatpipeError, InputError
from featpipe.models import ArrayModel
from featpipe.parameters import ValidatedEstimator
from featpipe.store import Stage

MODEL_NAME = "pca"


class PCAProjection(ArrayModel, ValidatedEstimator, TransformerMixin, BaseEstimator):
    """Linear projection onto the top principal axes (scikit-learn's PCA, full SVD).

    Parameters
    ----------
    n_components : int
        Output dimension (64 in the deep Fisher kernel paper).
    whiten : bool
        Divide each projected coordinate by the square root of its variance.
    """

    _model_name = MODEL_NAME
    _fitted_arrays = ("components_", "mean_", "explained_variance_",
                      "explained_variance_ratio_")
    _parameter_constraints = {"n_components": [Interval(Integral, 1, None, closed="left")],
                              "whiten": ["boolean"]}

    def __init__(self, n_components=64, whiten=False):
        self.n_components = n_components
        self.whiten = whiten

    def fit(self, X, y=None):
        from sklearn.decomposition import PCA

        self._validate_params()
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2:
            raise InputError(f"PCA expects a 2-D array (descriptors x dims), got shape {X.shape}")
        k = int(self.n_components)
        if not 1 <= k <= min(X.shape):
            raise InputError(f"PCA dim {k} must be between 1 and min(samples, dims) = "
                             f"{min(X.shape)} (data {X.shape[0]} x {X.shape[1]})")
        if not np.all(np.isfinite(X)):
            raise InputError("PCA input contains NaN or Inf")
        if not np.any(X.var(axis=0) > 0):
            raise InputError(f"PCA input has zero variance: all {X.shape[0]} sampled rows are "
                             "identical (e.g. all-zero low-contrast SIFT)")
        engine = PCA(n_components=k, svd_solver="full").fit(X)
        self.components_ = engine.components_.astype(np.float32)
        self.mean_ = engine.mean_.astype(np.float32)
        self.explained_variance_ = engine.explained_variance_.astype(np.float32)
        self.explained_variance_ratio_ = engine.explained_variance_ratio_.astype(np.float32)
        self.n_features_in_ = X.shape[1]
        return self

    def projection(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, matrix P) with y = (x − mean) Pᵀ, whitening folded into P (rows / √λ)."""
        components = self.components_
        if self.whiten:
            components = components / np.sqrt(np.maximum(
                self.explained_variance_, np.finfo(np.float32).tiny))[:, None]
        return self.mean_, components

    def transform(self, X) -> np.ndarray:
        if not hasattr(self, "components_"):
            raise FeatpipeError("PCAProjection is not fitted yet: call fit() or load_pca()")
        X = np.asarray(X)
        if X.ndim != 2 or X.shape[1] != self.mean_.shape[0]:
            raise InputError(f"PCA was fitted on {self.mean_.shape[0]}-dim rows, got shape "
                             f"{X.shape}")
        return project(X, *self.projection())


#: rows projected together, on one BLAS thread: their float64 temporaries (rows × D) stay in
#: cache.  A frame of 62,011 × 128 (one core, load 5): whole, 48 ms; in parts, 30 ms; with
#: OpenBLAS's own threads beside the extraction's, 140 ms whole and 340 ms in parts.
_ROWS = 1024


def project(x, mean, matrix) -> np.ndarray:
    """y = (x − mean) Pᵀ, rounded to float32 from a float64 product.

    A row's float32 result does not depend on how many rows are projected together (one frame
    or a whole video) nor on the BLAS kernel: those change a float32 GEMM's rows by an ulp
    (OpenBLAS's Haswell/Zen kernels block by the row count), and the Fisher vector's posterior
    cut-off at 1e-6 turns an ulp into 6e-5 after the signed square root; in float64 they
    change only the 16th digit, which the rounding to float32 removes.
    """
    x = np.asarray(x)
    mean = np.asarray(mean, dtype=np.float64)
    matrix_t = np.asarray(matrix, dtype=np.float64).T
    out = np.empty((x.shape[0], matrix_t.shape[1]), np.float32)
    rows = min(_ROWS, x.shape[0])
    centred = np.empty((rows, x.shape[1]))
    product = np.empty((rows, matrix_t.shape[1]))
    with single_threaded_blas():
        for start in range(0, x.shape[0], _ROWS):  # float64 temporaries that stay in cache
            part = x[start:start + _ROWS]
            n = part.shape[0]
            np.subtract(part, mean, out=centred[:n], dtype=np.float64)
            np.matmul(centred[:n], matrix_t, out=product[:n])
            out[start:start + n] = product[:n]
    return out


def load_pca(stage: Stage) -> PCAProjection:
    """The fitted :class:`PCAProjection` of a ``pca`` stage (``transform(X)`` ready)."""
    from featpipe.extract.groups import MODEL_NAME as GROUPS_MODEL

    if not stage.has_model(MODEL_NAME) and stage.has_model(GROUPS_MODEL):
        raise FeatpipeError(f"stage {stage.name} holds one PCA per descriptor group (fit pca "
                            "--groups): use it with fit gmm --groups")
    return stage.load_model(MODEL_NAME, PCAProjection)
