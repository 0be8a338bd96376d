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


#: float64 sums of D terms, reassociated so that they vectorise (a dependent chain of D adds
#: cost 4 cycles each): float64 accuracy, the order fixed by the compiled code
_SUMS = {"reassoc", "contract"}


@numba.njit(cache=True, nogil=True, fastmath=_SUMS)
def _distance(xc, t, mc, inv_sigma, k, d, j):  # pragma: no cover (compiled)
    """d[j] = (xc[t] − mc[k])·inv_sigma[k] and Σ d[j]² (float64; rows by index: a row view
    costs two atomic reference counts)."""
    s = 0.0
    for i in range(xc.shape[1]):
        di = (xc[t, i] - mc[k, i]) * inv_sigma[k, i]
        d[j, i] = di
        s += di * di
    return s


@numba.njit(cache=True, nogil=True, fastmath=_SUMS)
def _add(g, d, j, u, v, k):  # pragma: no cover (compiled)
    """u[k] += γ d[j], v[k] += γ d[j]² (float64)."""
    for i in range(d.shape[1]):
        gd = g * d[j, i]
        u[k, i] += gd
        v[k, i] += gd * d[j, i]


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _rest(upper, lower, top_low, cut):  # pragma: no cover (compiled)
    """Σ exp(l̃_k − top_low) over the pairs that are not candidates (upper bound below
    ``cut``) and not negligible (above top_low − 30), with l̃ the midpoint of the bounds.

    The exponential is exp(y/32)^32 by a degree-7 Taylor polynomial on [−1, 0] and five
    squarings, so that the loop vectorises (relative error 1e-6 at y = −15, 5e-4 at −30,
    below the bounds' own): these terms are each below threshold·e^-margin of the best, so
    they move the posteriors by less than K·1e-6 of that."""
    total = np.float32(0.0)
    for k in range(upper.shape[0]):
        y = np.float32(0.5) * (upper[k] + lower[k]) - top_low
        y = max(y, np.float32(_NEGLIGIBLE)) * np.float32(1.0 / 32.0)
        e = np.float32(1.0) + y * (np.float32(1.0) + y * (np.float32(1.0 / 2) + y * (
            np.float32(1.0 / 6) + y * (np.float32(1.0 / 24) + y * (np.float32(1.0 / 120) + y * (
                np.float32(1.0 / 720) + y * np.float32(1.0 / 5040)))))))
        e = e * e
        e = e * e
        e = e * e
        e = e * e
        e = e * e
        keep = (upper[k] < cut) & (upper[k] > top_low + np.float32(_NEGLIGIBLE))
        total += e if keep else np.float32(0.0)
    return total


@numba.njit(cache=True, nogil=True, error_model="numpy")
def accumulate(raw, finite, xc, mc, inv_sigma, log_norm, approx, limit, threshold,
               u_sum, v_sum, mass):  # pragma: no cover (compiled)
    """Add Σ γ d, Σ γ d² and Σ γ per component (float64) for the descriptors ``xc`` (N, D),
    float64, centred; returns (pairs computed exactly, descriptors whose distances overflow,
    Σ_t log Σ_k exp l_tk: the log-evidence of the descriptors without −D/2·log 2π).

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
    evidence = 0.0
    for t in range(n):
        rest = 0.0
        n_cand = 0
        top_low = -np.inf
        if finite[t]:
            top_low = _bounds(raw[t], bias, high, low, c_high, c_low, upper, lower)
            cut = np.float32(top_low + limit)
            rest = _rest(upper, lower, top_low, cut)
            for k in range(k_total):  # branch-free: few candidates among K
                cand[n_cand] = k
                n_cand += upper[k] >= cut
        else:
            for k in range(k_total):
                if log_norm[k] > -np.inf:
                    cand[n_cand] = k
                    n_cand += 1
        n_exact += n_cand
        top = -np.inf
        for j in range(n_cand):
            k = cand[j]
            exact[j] = log_norm[k] - 0.5 * _distance(xc, t, mc, inv_sigma, k, d, j)
            if exact[j] > top:
                top = exact[j]
        if not top > -np.inf:
            overflow += 1
            continue
        norm = rest * math.exp(top_low - top) if rest > 0.0 else 0.0
        for j in range(n_cand):
            exact[j] = math.exp(exact[j] - top)
            norm += exact[j]
        evidence += top + math.log(norm)
        for j in range(n_cand):
            g = exact[j] / norm
            if g < threshold:
                continue
            k = cand[j]
            mass[k] += g
            _add(g, d, j, u_sum, v_sum, k)
    return n_exact, overflow, evidence
