"""Kernel fusion: the (weighted) average of per-encoding kernels.

K = Σ_i w_i K_i / Σ_i w_i (docs/methods.md, "Fusion: the average of per-encoding kernels";
equal weights by default).  For explicit-feature kernels the same fusion is the concatenation
[sqrt(w_1/W) φ_1(x), ..., sqrt(w_m/W) φ_m(x)], W = Σ w_i, whose dot products are the averaged
kernel; :func:`fuse_features` builds it for liblinear.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from featpipe.errors import InputError, ParameterError

FUSIONS = ("average",)


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
