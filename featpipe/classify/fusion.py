"""Kernel fusion: the (weighted) average of per-encoding kernels, each scaled first.

K = Σ_i w_i s_i K_i / Σ_i w_i (docs/methods.md, "Fusion: the average of per-encoding
kernels"; equal weights by default).  The scale s_i (:data:`SCALES`, :func:`scale_factor`):
``unit-diagonal`` divides each kernel by the mean of its train items' self-similarities
k(x, x), so every kernel gives the train items a mean k(x, x) of 1 before the average; ``none``
takes the kernels as computed.  Kernels differ in scale by orders of magnitude: on
L2-normalised encodings k(x, x) is 1 for linear, SSR and SER, but Σ_j |x_j| for chi2 and
Σ_j sqrt|x_j| for chi2+SER, so without scaling the largest kernel decides alone.  One kernel
(no fusion) is used as computed.  For explicit-feature kernels the same fusion is the
concatenation [sqrt(w_1 s_1/W) φ_1(x), ..., sqrt(w_m s_m/W) φ_m(x)], W = Σ w_i, whose dot
products are the averaged kernel; :func:`fuse_features` builds it for liblinear.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from featpipe.errors import InputError, ParameterError

FUSIONS = ("average",)
#: How each kernel is scaled before it is averaged with others (the first is the default).
SCALES = ("unit-diagonal", "none")


def normalised_weights(n_inputs: int, weights: Sequence[float] | None) -> np.ndarray:
    """Weights w_i / Σ w; equal when ``weights`` is None."""
    if weights is None or len(weights) == 0:
        return np.full(n_inputs, 1.0 / n_inputs)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (n_inputs,):
        raise ParameterError("weights", f"needs one value per input: {len(w)} weights given "
                             f"for {n_inputs} inputs")
    if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ParameterError("weights", f"must be finite and non-negative with a positive sum, "
                             f"got {[float(v) for v in w]}")
    return w / w.sum()


def scale_factor(self_similarities: np.ndarray, scale: str) -> float:
    """The factor of a kernel whose train items have these k(x, x): 1 / their mean for
    ``unit-diagonal`` (1 when the mean is not positive: an all-zero kernel), 1 for ``none``."""
    if scale == "none":
        return 1.0
    if scale != "unit-diagonal":
        raise ParameterError("fusion_scale", f"must be one of {SCALES}, got {scale!r}")
    mean = float(np.mean(self_similarities)) if len(self_similarities) else 0.0
    return 1.0 / mean if mean > 0 and np.isfinite(mean) else 1.0


def accumulate(total: np.ndarray | None, K: np.ndarray, weight: float) -> np.ndarray:
    """total + weight·K, scaling ``K`` in place (it is consumed): no temporary matrix."""
    np.multiply(K, weight, out=K)
    if total is None:
        return K
    if K.shape != total.shape:
        raise InputError(f"kernels of shapes {total.shape} and {K.shape} cannot be fused")
    total += K
    return total


def average_kernels(kernels: Iterable[np.ndarray], weights: np.ndarray) -> np.ndarray:
    """Σ_i w_i K_i for normalised ``weights``; the kernels are scaled in place (consumed)."""
    total = None
    for K, w in zip(kernels, weights, strict=True):
        total = accumulate(total, K, w)
    if total is None:
        raise InputError("no kernel to fuse")
    return total


def fuse_features(features: Sequence[np.ndarray], weights: np.ndarray) -> np.ndarray:
    """[sqrt(w_1) φ_1, ..., sqrt(w_m) φ_m]: dot products equal the averaged kernel."""
    return np.hstack([np.sqrt(w) * F for F, w in zip(features, weights, strict=True)])
