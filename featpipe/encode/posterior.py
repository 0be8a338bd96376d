"""The posterior of a diagonal GMM, written once (VLFeat ``vl_gmm`` / ``vl_fisher``).

For descriptors centred at a point c (xc = x − c, mc_k = μ_k − c) and inverse variances
1/σ²_k (floored: :func:`floor_variances`), the log joint of every pair is

    l_tk = log π_k − ½ Σ_d log σ²_kd − ½ m_tk,
    m_tk = ‖(xc_t − mc_k)/σ_k‖² = [xc², xc]_t · [1/σ²_k; −2 mc_k/σ²_k] + ‖mc_k/σ_k‖²

(the Mahalanobis terms of all pairs from one GEMM: :func:`gemm_operands`,
:func:`mahalanobis`), and the posteriors and the log-evidence are its log-sum-exp over the
components (:func:`normalise`; the largest term is factored out, so a descriptor far from
every Gaussian keeps posteriors that sum to one).  The constant −D/2·log 2π is left out of l
(:func:`log_normaliser` adds it on request): it cancels in the posteriors.

Every caller goes through these functions: GMM EM (:class:`featpipe.encode.fisher
.GaussianMixtureModel`), the Fisher-vector body :func:`featpipe.encode.fisher.fisher_vectors`
(deep Fisher learning's forward and reverse passes use its posteriors), and the Fisher
encoder's CPU pass (:func:`featpipe.encode.fisher._accumulate`, which takes its float32
Mahalanobis terms from :func:`mahalanobis` and refines them in the compiled
:mod:`featpipe.encode._fisher_loop`, the one compiled copy of the log-sum-exp, fused with the
FV sums).  Array API: numpy, torch, CuPy, array_api_strict.
"""

from __future__ import annotations

import math

import numpy as np

from featpipe.backend import namespace

_LOG_2PI = math.log(2.0 * math.pi)
#: terms below this log ratio to the largest are dropped (0), float32 / float64: irrelevant to
#: any sum, and zeros keep the reverse pass out of subnormal numbers (10-100x slower)
_LOG_FLOOR = {4: -60.0, 8: -600.0}


def floor_variances(variances, floor):
    """max(σ², floor): the variance floor applied after every M-step (VLFeat)."""
    xp = namespace(variances)
    return xp.maximum(variances, xp.full_like(variances, floor))


def log_normaliser(log_pi, log_var_sum, dim: int | None = None):
    """log π_k − ½ Σ_d log σ²_kd (− D/2 log 2π when ``dim`` is given): the part of the log
    joint that does not depend on the descriptor.  ``log_pi`` may hold −inf (skipped
    components)."""
    out = log_pi - 0.5 * log_var_sum
    return out if dim is None else out - 0.5 * dim * _LOG_2PI


def squared_lhs(xc):
    """[xc², xc] (..., 2D): the left operand of the Mahalanobis GEMM (and of the moments
    γᵀ[xc², xc] = [Σγx², Σγx])."""
    xp = namespace(xc)
    return xp.concat([xc * xc, xc], axis=-1)


def gemm_operands(mc, inv_var):
    """Right operand (2D, K) = [1/σ²; −2 mc/σ²]ᵀ and bias (K,) = ‖mc/σ‖² of the GEMM form."""
    xp = namespace(mc, inv_var)
    rhs = xp.permute_dims(xp.concat([inv_var, -2.0 * mc * inv_var], axis=1), (1, 0))
    return rhs, xp.sum(mc * mc * inv_var, axis=1)


def mahalanobis_gemm(lhs, rhs, out=None):
    """The GEMM part of the Mahalanobis terms, ``lhs @ rhs`` (..., N, K) (m = this + bias):
    ``lhs`` from :func:`squared_lhs`, ``rhs`` from :func:`gemm_operands`.  ``out`` (numpy, 2-D
    ``lhs``): a buffer to write it into (a fresh (N, K) result of 128 KiB or more costs the
    encoder's block ~100 ns per descriptor in page faults)."""
    if out is not None:
        return np.matmul(lhs, rhs, out=out)
    xp = namespace(lhs, rhs)
    shape = lhs.shape
    flat = xp.reshape(lhs, (math.prod(shape[:-1]), shape[-1])) @ rhs
    return xp.reshape(flat, (*shape[:-1], rhs.shape[-1]))


def mahalanobis(xc, mc, inv_var, lhs=None):
    """m_tk = ‖(xc_t − mc_k)/σ_k‖² for all pairs (..., N, K), by the GEMM form (``lhs`` =
    :func:`squared_lhs` (xc), passed when the caller keeps it)."""
    rhs, bias = gemm_operands(mc, inv_var)
    return mahalanobis_gemm(squared_lhs(xc) if lhs is None else lhs, rhs) + bias


def log_joint(xc, log_norm, mc, inv_var, lhs=None):
    """l_tk = log_norm_k − ½ max(0, m_tk) (..., N, K) (module docstring; ``log_norm`` from
    :func:`log_normaliser`; rounding cannot make a distance negative)."""
    xp = namespace(xc, log_norm)
    maha = mahalanobis(xc, mc, inv_var, lhs)
    if isinstance(maha, np.ndarray):  # numpy: in place on the fresh distances
        np.maximum(maha, 0.0, out=maha)
        maha *= -0.5
        maha += log_norm
        return maha
    return log_norm - 0.5 * xp.maximum(maha, xp.zeros_like(maha))


def normalise(log_joint, axis: int = -1, overwrite: bool = False):
    """(γ, log Σ_k exp l_k): posteriors softmax(l) and log-evidence along ``axis``.

    The largest term is factored out (it contributes exp(0) = 1, so γ never underflows to all
    zeros even for log joints of −1e26); terms below ``_LOG_FLOOR`` relative to it are zero.
    A row of −inf gives γ = 0 and −inf, never NaN.  ``overwrite`` (numpy): γ replaces
    ``log_joint`` in place, five passes and no temporaries (EM's E-step; terms below the floor,
    e^-600 of the largest in float64, then stay as exp gives them instead of 0)."""
    xp = namespace(log_joint)
    top = xp.max(log_joint, axis=axis, keepdims=True)
    top = xp.where(xp.isfinite(top), top, xp.zeros_like(top))
    if overwrite and isinstance(log_joint, np.ndarray):
        log_joint -= top
        e = np.exp(log_joint, out=log_joint)
        total = np.sum(e, axis=axis, keepdims=True)
        positive = total > 0
        e /= np.where(positive, total, 1.0)
        with np.errstate(divide="ignore"):
            return e, np.squeeze(top + np.log(total), axis=axis)
    shifted = log_joint - top
    floor = _LOG_FLOOR[xp.finfo(log_joint.dtype).bits // 8]
    keep = shifted >= floor
    e = xp.where(keep, xp.exp(xp.where(keep, shifted, xp.zeros_like(shifted))),
                 xp.zeros_like(shifted))
    total = xp.sum(e, axis=axis, keepdims=True)
    positive = total > 0
    safe = xp.where(positive, total, xp.ones_like(total))
    log_total = xp.where(positive, xp.log(safe), xp.full_like(safe, -math.inf))
    return e / safe, xp.squeeze(top + log_total, axis=axis)


def posteriors(log_joint, axis: int = -1):
    """γ = softmax(l) along ``axis`` (:func:`normalise`)."""
    return normalise(log_joint, axis)[0]


def logsumexp(a, axis: int = -1):
    """log Σ exp(a) along ``axis`` (:func:`normalise`); a row of −inf gives −inf."""
    return normalise(a, axis)[1]
