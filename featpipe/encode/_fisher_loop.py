"""The compiled per-descriptor pass of the Fisher-vector encoder (numba).

Kept apart from :mod:`featpipe.encode.fisher` so that numba is imported only when a Fisher
vector is computed.  The caller gives the float32 GEMM part of the Mahalanobis terms of a
block of descriptors (:func:`featpipe.encode.posterior.mahalanobis`); this pass does the rest
of the posterior routine (:mod:`featpipe.encode.posterior`: log joints, log-sum-exp) for one
descriptor at a time, exactly where it matters, and adds the FV sums.  See
:func:`featpipe.encode.fisher._accumulate` for the bounds.
"""

from __future__ import annotations

import math

import numba
import numpy as np

#: pairs more than 30 nats below a descriptor's best component are left out of its
#: normaliser: K·e^-30 < 1e-10 relative for K ≤ 10^3
_NEGLIGIBLE = -30.0


#: the bound loop assumes finite values (rows with a non-finite distance are handled apart), so
#: the compiler may vectorise it; its own rounding is in the bound's slack
_FAST = {"nnan", "ninf", "nsz", "reassoc", "contract"}


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _bounds(raw_t, bias, high, low, c_high, c_low, upper, lower):  # pragma: no cover
    """upper_k = l̃_k + e_k and lower_k = l̃_k − e_k for one descriptor (finite inputs):
    l̃ = log_norm − ½ max(m, 0), m = raw + bias, e = slope·max(m, 0) + offset, written as
    high − c_high·m and low − c_low·m.  Returns max_k lower_k (eight independent chains: the
    compiler does not vectorise a float max-reduction)."""
    k_total = raw_t.shape[0]
    for k in range(k_total):
        m = raw_t[k] + bias[k]
        m = m if m > np.float32(0.0) else np.float32(0.0)
        upper[k] = high[k] - c_high * m
        lower[k] = low[k] - c_low * m
    t = np.full(8, np.float32(-3e38))
    whole = k_total - k_total % 8
    for k in range(0, whole, 8):
        for j in range(8):
            t[j] = max(t[j], lower[k + j])
    top = max(max(max(t[0], t[1]), max(t[2], t[3])), max(max(t[4], t[5]), max(t[6], t[7])))
    for k in range(whole, k_total):
        top = max(top, lower[k])
    return top


@numba.njit(cache=True, nogil=True, error_model="numpy")
def accumulate(raw, finite, xc, mc, inv_sigma, log_norm, approx, limit, threshold,
               u_sum, v_sum, mass):  # pragma: no cover (compiled)
    """Add Σ γ d, Σ γ d² and Σ γ per component (float64) for the descriptors ``xc`` (N, D),
    float64, centred; returns (pairs computed exactly, descriptors whose distances overflow).

    raw (N, K) float32: the GEMM part of the Mahalanobis terms, m ≈ raw + bias; ``finite``
    (N,): rows without inf or NaN in raw.  ``approx`` = (bias, high, low, c_high, c_low) in
    float32 (:func:`_bounds`; −1e30 for skipped components): a pair's log joint
    l = log_norm − ½m lies within e = slope·max(m, 0) + offset_k of its approximate value
    (a bound on the float32 rounding).  Candidates are the pairs whose upper
    bound is within ``limit`` of the largest lower bound (all valid components on a row that
    is not finite); their l is recomputed in float64 from d = (xc − mc)·inv_sigma, and
    γ = exp(l − top) / Σ, the sum over the candidates' exact terms and the approximate terms
    of the other pairs (each below threshold·e^-margin of the best; those 30 nats below are
    dropped).  Pairs with γ ≥ ``threshold`` are accumulated.
    """
    bias, high, low, c_high, c_low = approx
    n, k_total = raw.shape
    dim = xc.shape[1]
    upper = np.empty(k_total, np.float32)
    lower = np.empty(k_total, np.float32)
    cand = np.empty(k_total, np.int64)
    exact = np.empty(k_total)
    d = np.empty((k_total, dim))
    n_exact = 0
    overflow = 0
    for t in range(n):
        rest = 0.0
        n_cand = 0
        top_low = -np.inf
        if finite[t]:
            top_low = _bounds(raw[t], bias, high, low, c_high, c_low, upper, lower)
            cut = top_low + limit
            for k in range(k_total):
                hi = upper[k]
                if hi >= cut:
                    cand[n_cand] = k
                    n_cand += 1
                elif hi > top_low + _NEGLIGIBLE:  # the midpoint l̃ of the bounds
                    rest += math.exp(0.5 * (hi + lower[k]) - top_low)
        else:
            for k in range(k_total):
                if log_norm[k] > -np.inf:
                    cand[n_cand] = k
                    n_cand += 1
        n_exact += n_cand
        top = -np.inf
        for j in range(n_cand):
            k = cand[j]
            s = 0.0
            for i in range(dim):
                di = (xc[t, i] - mc[k, i]) * inv_sigma[k, i]
                d[j, i] = di
                s += di * di
            exact[j] = log_norm[k] - 0.5 * s
            if exact[j] > top:
                top = exact[j]
        if not top > -np.inf:
            overflow += 1
            continue
        norm = rest * math.exp(top_low - top) if rest > 0.0 else 0.0
        for j in range(n_cand):
            exact[j] = math.exp(exact[j] - top)
            norm += exact[j]
        for j in range(n_cand):
            g = exact[j] / norm
            if g < threshold:
                continue
            k = cand[j]
            mass[k] += g
            for i in range(dim):
                u_sum[k, i] += g * d[j, i]
                v_sum[k, i] += g * d[j, i] * d[j, i]
    return n_exact, overflow
