"""The compiled per-descriptor pass of the Fisher-vector encoder (numba).

Kept apart from :mod:`featpipe.encode.fisher` so that numba is imported only when a Fisher
vector is computed.  The expensive distance part (all K components) comes from one GEMM
done by the caller (float64, stored as float32); this pass fuses everything after it into one
sweep over the descriptors: approximate log joints, candidate selection, exact log joints of
the candidates, posteriors and the u/v sums.  See :func:`featpipe.encode.fisher._accumulate`
for the maths.
"""

from __future__ import annotations

import math

import numba
import numpy as np

#: pairs more than 30 nats below a descriptor's best component are left out of its normaliser:
#: K·e^-30 < 1e-10 relative for K ≤ 10^3, far below float32 resolution
_NEGLIGIBLE = -30.0


@numba.njit(parallel=True, cache=True, nogil=True)
def accumulate(raw, bias, log_norm32, xc, mc, inv_sigma, log_norm, limit, threshold,
               u_sum, v_sum, mass, n_blocks):  # pragma: no cover (compiled)
    """Add Σ γ d, Σ γ d² and Σ γ per component for the descriptors ``xc`` (N, D).

    raw (N, K) float32: Σ_d inv_var·xc² − 2(m−c)·inv_var·xc from the GEMM; the approximate
    log joint is (raw + bias)·(−½) + log_norm32.  Candidates lie within ``limit`` of the best
    approximate one; their exact log joints use d = (xc − mc)·inv_sigma in float32 (as
    VLFeat).  The other pairs enter the normaliser with their approximate values (those more
    than 30 nats below the best are negligible and skipped).  Descriptors are split into
    ``n_blocks`` contiguous blocks (one per thread), each with its own sums.
    """
    n, k_total = raw.shape
    dim = xc.shape[1]
    u_part = np.zeros((n_blocks, k_total, dim))
    v_part = np.zeros((n_blocks, k_total, dim))
    m_part = np.zeros((n_blocks, k_total))
    for b in numba.prange(n_blocks):
        _block(raw, bias, log_norm32, xc, mc, inv_sigma, log_norm, limit, threshold,
               b * n // n_blocks, (b + 1) * n // n_blocks, u_part[b], v_part[b], m_part[b])
    for b in range(n_blocks):
        u_sum += u_part[b]
        v_sum += v_part[b]
        mass += m_part[b]


@numba.njit(cache=True, nogil=True)
def _block(raw, bias, log_norm32, xc, mc, inv_sigma, log_norm, limit, threshold, t0, t1,
           u_sum, v_sum, mass):  # pragma: no cover (compiled)
    k_total = raw.shape[1]
    dim = xc.shape[1]
    approx = np.empty(k_total, np.float32)
    cand = np.empty(k_total, np.int64)
    exact = np.empty(k_total, np.float64)
    d = np.empty((k_total, dim), np.float32)
    for t in range(t0, t1):
        top_a = -np.inf
        for k in range(k_total):
            a = (raw[t, k] + bias[k]) * np.float32(-0.5) + log_norm32[k]
            approx[k] = a
            if a > top_a:
                top_a = a
        rest = 0.0
        n_cand = 0
        for k in range(k_total):
            a = approx[k] - top_a
            if a >= limit and a > -np.inf:
                cand[n_cand] = k
                n_cand += 1
            elif a > _NEGLIGIBLE:
                rest += math.exp(a)
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
        norm = rest * math.exp(top_a - top)
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
