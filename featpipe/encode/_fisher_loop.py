"""The compiled per-descriptor pass of the Fisher-vector encoder (numba).

Kept apart from :mod:`featpipe.encode.fisher` so that numba is imported only when a Fisher
vector is computed.  :func:`squared_operand` builds the left operand of the float32 GEMM of
the Mahalanobis terms (:func:`featpipe.encode.posterior.mahalanobis_gemm`) for a block of
descriptors; :func:`accumulate` does the rest of the posterior routine
(:mod:`featpipe.encode.posterior`: log joints, log-sum-exp) for one descriptor at a time,
exactly where it matters, and adds the FV sums.  See :func:`featpipe.encode.fisher._accumulate`
for the bounds.

The helpers are inlined into :func:`accumulate` (``inline="always"``: a numba call between
compiled functions passes every array as a struct and is not inlined by LLVM, ~30 cycles a
call), so the whole pass is compiled with its flags: float64 sums reassociated so that they
vectorise (a dependent chain of D adds costs 4 cycles each), products contracted to FMAs;
no finite-math assumption (rows whose GEMM values are not finite take the exact path).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from featpipe.numba_cache import ensure_cache_dir

ensure_cache_dir(__file__)

#: pairs more than 30 nats below a descriptor's best component are left out of its
#: normaliser: K·e^-30 < 1e-10 relative for K ≤ 10^3
_NEGLIGIBLE = -30.0
#: float64 accuracy, the order of the sums fixed by the compiled code
_SUMS = {"reassoc", "contract"}


@numba.njit(cache=True, nogil=True)
def squared_operand(x, center, lhs):  # pragma: no cover (compiled)
    """lhs (N, 2D) float32 = [xc², xc] (:func:`featpipe.encode.posterior.squared_lhs`) with
    xc = float32(x − center), the difference taken in float64: one pass over x, no float64
    copy of the block.  Returns whether every value of x is finite (Σ x·0 is not NaN)."""
    dim = x.shape[1]
    check = 0.0
    for t in range(x.shape[0]):
        for i in range(dim):
            value = np.float64(x[t, i])
            check += value * 0.0
            v = np.float32(value - center[i])
            lhs[t, i] = v * v
            lhs[t, dim + i] = v
    return check == 0.0


@numba.njit(cache=True, nogil=True, inline="always")
def _bounds(raw, t, bias, high, low, c_high, c_low, upper, lower):  # pragma: no cover
    """upper_k = l̃_k + e_k and lower_k = l̃_k − e_k for descriptor t:
    l̃ = log_norm − ½ max(m, 0), m = raw + bias, e = slope·max(m, 0) + offset, written as
    high − c_high·m and low − c_low·m.  Returns (max_k lower_k, whether the row is finite):
    the max by eight independent chains (the compiler does not vectorise a float
    max-reduction), finiteness by Σ raw·0 (NaN for inf or NaN, a vectorised sum)."""
    k_total = raw.shape[1]
    zero = np.float32(0.0)
    check = zero
    for k in range(k_total):
        r = raw[t, k]
        check += r * zero
        m = r + bias[k]
        m = m if m > zero else zero
        upper[k] = high[k] - c_high * m
        lower[k] = low[k] - c_low * m
    t0 = t1 = t2 = t3 = t4 = t5 = t6 = t7 = np.float32(-3e38)
    whole = k_total - k_total % 8
    for k in range(0, whole, 8):
        t0 = max(t0, lower[k])
        t1 = max(t1, lower[k + 1])
        t2 = max(t2, lower[k + 2])
        t3 = max(t3, lower[k + 3])
        t4 = max(t4, lower[k + 4])
        t5 = max(t5, lower[k + 5])
        t6 = max(t6, lower[k + 6])
        t7 = max(t7, lower[k + 7])
    top = max(max(max(t0, t1), max(t2, t3)), max(max(t4, t5), max(t6, t7)))
    for k in range(whole, k_total):
        top = max(top, lower[k])
    return top, check == zero


@numba.njit(cache=True, nogil=True, inline="always")
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


@numba.njit(cache=True, nogil=True, inline="always")
def _distance(xc, mc, inv_sigma, k, d, j):  # pragma: no cover (compiled)
    """d[j] = (xc − mc[k])·inv_sigma[k] and Σ d[j]² (float64; rows by index: a row view
    costs two atomic reference counts)."""
    s = 0.0
    for i in range(xc.shape[0]):
        di = (xc[i] - mc[k, i]) * inv_sigma[k, i]
        d[j, i] = di
        s += di * di
    return s


@numba.njit(cache=True, nogil=True, inline="always")
def _add(g, d, j, u, v, k):  # pragma: no cover (compiled)
    """u[k] += γ d[j], v[k] += γ d[j]² (float64)."""
    for i in range(d.shape[1]):
        gd = g * d[j, i]
        u[k, i] += gd
        v[k, i] += gd * d[j, i]


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=_SUMS)
def accumulate(raw, x, offsets, center, mc, inv_sigma, log_norm, approx, limit, threshold,
               u_sum, v_sum, mass, overflow):  # pragma: no cover (compiled)
    """Add Σ γ d, Σ γ d² and Σ γ per component (float64) of each part p of the descriptors
    ``x`` (N, D), rows offsets[p] .. offsets[p + 1] − 1, into u_sum[p], v_sum[p], mass[p]
    ((P, K, D), (P, K, D), (P, K)), centred at ``center`` in float64, and the descriptors whose
    distances overflow into overflow[p]; returns (pairs computed exactly, Σ_t log Σ_k exp l_tk:
    the log-evidence of the descriptors without −D/2·log 2π).  A part's sums do not depend on
    the others (a frame's FV is the same alone or among the frames of a batch).

    raw (N, K) float32: the GEMM part of the Mahalanobis terms, m ≈ raw + bias.  ``approx``
    = (bias, high, low, c_high, c_low) in float32 (:func:`_bounds`; −1e30 for skipped
    components): a pair's log joint l = log_norm − ½m lies within e = slope·max(m, 0) +
    offset_k of its approximate value (a bound on the float32 rounding).  Candidates are the
    pairs whose upper bound is within ``limit`` of the largest lower bound (all valid
    components on a row of raw that is not finite); their l is recomputed in float64 from
    d = (xc − mc)·inv_sigma, and γ = exp(l − top) / Σ, the sum over the candidates' exact
    terms and the approximate terms of the other pairs (each below threshold·e^-margin of
    the best; those 30 nats below are dropped).  Pairs with γ ≥ ``threshold`` are
    accumulated.
    """
    bias, high, low, c_high, c_low = approx
    k_total = raw.shape[1]
    dim = x.shape[1]
    upper = np.empty(k_total, np.float32)
    lower = np.empty(k_total, np.float32)
    cand = np.empty(k_total, np.int64)
    exact = np.empty(k_total)
    d = np.empty((k_total, dim))
    xc = np.empty(dim)
    n_exact = 0
    evidence = 0.0
    for part in range(offsets.shape[0] - 1):
        u_part, v_part, m_part = u_sum[part], v_sum[part], mass[part]
        for t in range(offsets[part], offsets[part + 1]):
            rest = 0.0
            n_cand = 0
            top_low, finite = _bounds(raw, t, bias, high, low, c_high, c_low, upper, lower)
            if finite:
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
            for i in range(dim):
                xc[i] = np.float64(x[t, i]) - center[i]
            top = -np.inf
            for j in range(n_cand):
                k = cand[j]
                exact[j] = log_norm[k] - 0.5 * _distance(xc, mc, inv_sigma, k, d, j)
                top = max(top, exact[j])
            if not top > -np.inf:
                overflow[part] += 1
                continue
            norm = rest * math.exp(top_low - top) if rest > 0.0 else 0.0
            for j in range(n_cand):
                exact[j] = math.exp(exact[j] - top)
                norm += exact[j]
            evidence += top + math.log(norm)
            scale = 1.0 / norm  # one division per descriptor: γ within an ulp of exact / norm
            for j in range(n_cand):
                g = exact[j] * scale
                if g < threshold:
                    continue
                k = cand[j]
                m_part[k] += g
                _add(g, d, j, u_part, v_part, k)
    return n_exact, evidence


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=_SUMS)
def fisher_rows(u_sum, v_sum, mass, counts, pi, valid, improved, clear, out,
                column):  # pragma: no cover (compiled)
    """out[p, column : column + 2·K·D] (float32) = the FV of part p from its sums
    (:func:`accumulate`), as
    :func:`featpipe.encode.fisher.fisher_from_sums` defines it: u_k = Σγd / (N√π_k),
    v_k = (Σγd² − Σγ) / (N√(2π_k)) (N = counts[p], 0 counts as 1; components not ``valid``
    zero), laid out [u_1..u_K, v_1..v_K]; ``improved``: signed square root, then division by
    max(‖·‖₂, 1e-12), ‖SSR(z)‖₂² = Σ|z|, each value as sign(z)·√(|z| / max(‖·‖₂, 1e-12)²).
    In float64, two passes over the sums (the norm, then the values), components that took
    nothing (Σγ = 0: all their sums are 0) skipped; with ``clear`` the sums read are set back
    to 0.  ``out`` is C-ordered (a row's slice vectorises).  Returns the number of parts whose
    sums are not finite (their rows are not written)."""
    n_parts, k_total, dim = u_sum.shape
    half = k_total * dim
    bad = 0
    for part in range(n_parts):
        count = max(counts[part], 1.0)
        check = 0.0
        total = 0.0
        for k in range(k_total):
            m = mass[part, k]
            if m == 0.0:
                continue
            cu = 1.0 / (count * np.sqrt(pi[k])) if valid[k] else 0.0
            cv = cu / math.sqrt(2.0)
            first, second = u_sum[part, k], v_sum[part, k]
            for i in range(dim):
                a = cu * first[i]
                b = cv * (second[i] - m)
                check += (a + b) * 0.0
                total += abs(a) + abs(b)
        if check != 0.0:  # NaN: a sum overflowed
            bad += 1
            continue
        norm = max(np.sqrt(total), 1e-12)
        scale = 1.0 / (norm * norm)
        row = out[part, column:column + 2 * half]
        for k in range(k_total):
            m = mass[part, k]
            row_u, row_v = row[k * dim:(k + 1) * dim], row[half + k * dim: half + (k + 1) * dim]
            if m == 0.0:
                row_u[:] = 0.0
                row_v[:] = 0.0
                continue
            cu = 1.0 / (count * np.sqrt(pi[k])) if valid[k] else 0.0
            cv = cu / math.sqrt(2.0)
            first, second = u_sum[part, k], v_sum[part, k]
            if improved:
                for i in range(dim):
                    a = cu * first[i]
                    b = cv * (second[i] - m)
                    # sign(z)·√(|z|·scale), and 0 (not −0) for 0
                    row_u[i] = np.copysign(np.sqrt(abs(a) * scale), a) + 0.0
                    row_v[i] = np.copysign(np.sqrt(abs(b) * scale), b) + 0.0
            else:
                for i in range(dim):
                    row_u[i] = cu * first[i]
                    row_v[i] = cv * (second[i] - m)
            if clear:
                first[:] = 0.0
                second[:] = 0.0
                mass[part, k] = 0.0
    return bad
