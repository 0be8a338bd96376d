"""The compiled passes over the sliding windows of an ``hrp`` layer (numba, numpy inputs).

Kept apart from :mod:`featpipe.encode.temporal` so that numba is imported only when a layer of
windows is pooled on the CPU.  For each window (rows ``start .. start + M − 1`` of X) and each
block of columns that stays in the L1 cache, a pass forms the running sums s_t in X's dtype,
summed in order of t exactly as :func:`featpipe.encode.temporal.window_running_sums` does, and
maps them by ψ; the (n, M, D) sums and their ψ never go to memory.

- :func:`window_grams`: the Gram matrix of the ψ rows of every window (float64, the sums over
  a block of columns in X's dtype), as :func:`featpipe.encode.temporal.parts_gram` forms it
  from :func:`featpipe.encode.temporal.psi_parts`;
- :func:`window_pool`: u = Σ_t β_t ψ(s_t) for every window, as
  :func:`featpipe.encode.temporal.psi_pool`.

ψ by mode: :data:`NONE` s; :data:`ROOT` √s (SER or SSR of non-negative sums: SER's negative
half is zero); :data:`SSR` sign(s)·√|s|; :data:`SER` [√max(s, 0), √max(−s, 0)] (2·D columns).
The array-API path of :mod:`featpipe.encode.temporal` is the reference these are tested
against (tests/test_temporal.py).
"""

from __future__ import annotations

import numba
import numpy as np

NONE, ROOT, SSR, SER = 0, 1, 2, 3

#: finite inputs (checked on entry); the dot products may be reassociated so they vectorise
_FAST = {"nnan", "ninf", "nsz", "reassoc", "contract"}
#: bytes of the ψ rows of one window and column block: they stay in the L1 cache (a block of
#: 32 KiB measured 1.2x faster than 16 KiB on the 2-core Zen 4, whose L1 holds 32 KiB)
_BLOCK_BYTES = 32768


def mode(psi: str, nonnegative: bool) -> int:
    """The compiled mode of the map ``psi`` on sums that are (or may not be) non-negative."""
    if psi == "none":
        return NONE
    if nonnegative:
        return ROOT
    return SSR if psi == "ssr" else SER


def block_columns(M: int, itemsize: int, psi_mode: int) -> int:
    """Columns per block: the M ψ rows of a block (two halves for SER) within
    :data:`_BLOCK_BYTES`, a multiple of 16."""
    per_column = (M + M % 2) * itemsize * (2 if psi_mode == SER else 1)
    return max(16, _BLOCK_BYTES // per_column // 16 * 16)


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _psi(s, psi_mode, row, width):  # pragma: no cover (compiled)
    """row[:width] = ψ(s) (SER: the negative half in row[width: 2·width])."""
    if psi_mode == NONE:
        for j in range(width):
            row[j] = s[j]
    elif psi_mode == ROOT:
        for j in range(width):
            row[j] = np.sqrt(s[j])
    elif psi_mode == SSR:
        for j in range(width):
            row[j] = np.copysign(np.sqrt(np.abs(s[j])), s[j])
    else:
        negative = row[width: 2 * width]
        for j in range(width):
            v = s[j]
            nil = v - v  # 0 in X's dtype (v is finite)
            row[j] = np.sqrt(v if v > nil else nil)
            negative[j] = np.sqrt(-v if v < nil else nil)


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _fill(X, start, M, c0, width, psi_mode, sums, rows):  # pragma: no cover (compiled)
    """rows[t] = ψ(s_t) of columns c0 .. c0 + width − 1 (:func:`_psi`); ``sums`` holds the
    running sums.  One-dimensional views: the compiler vectorises their loops (3x faster
    than two-dimensional indexing, measured)."""
    s = sums[:width]
    x = X[start, c0: c0 + width]
    for j in range(width):
        s[j] = x[j]
    _psi(s, psi_mode, rows[0], width)
    for t in range(1, M):
        x = X[start + t, c0: c0 + width]
        for j in range(width):
            s[j] = s[j] + x[j]
        _psi(s, psi_mode, rows[t], width)


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _tile(rows, i, k, n):  # pragma: no cover (compiled)
    """The dot products of rows i, i + 1 with rows k, k + 1 over their first n columns (four
    sums that share their loads)."""
    a0, a1, b0, b1 = rows[i, :n], rows[i + 1, :n], rows[k, :n], rows[k + 1, :n]
    zero = a0[0] - a0[0]
    s00, s01, s10, s11 = zero, zero, zero, zero
    for j in range(n):
        s00 += a0[j] * b0[j]
        s01 += a0[j] * b1[j]
        s10 += a1[j] * b0[j]
        s11 += a1[j] * b1[j]
    return s00, s01, s10, s11


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def window_grams(X, starts, M, psi_mode, block, G):  # pragma: no cover (compiled)
    """G[w] (float64, M × M) = Gram matrix of ψ of the running sums of rows
    starts[w] .. starts[w] + M − 1 of X (T, D), columns in blocks of ``block``.

    Lower triangle in 2 × 2 tiles (four dot products share their loads), mirrored."""
    D = X.shape[1]
    halves = 2 if psi_mode == SER else 1
    Mp = M + M % 2
    rows = np.zeros((Mp, halves * block), X.dtype)  # an odd M gets a zero row
    sums = np.empty(block, X.dtype)
    for w in range(starts.shape[0]):
        acc = G[w]
        acc[:, :] = 0.0
        for c0 in range(0, D, block):
            width = min(block, D - c0)
            _fill(X, starts[w], M, c0, width, psi_mode, sums, rows)
            for i in range(0, Mp, 2):
                for k in range(0, i + 1, 2):
                    s00, s01, s10, s11 = _tile(rows, i, k, halves * width)
                    acc[i, k] += s00
                    if k + 1 < M:
                        acc[i, k + 1] += s01
                    if i + 1 < M:
                        acc[i + 1, k] += s10
                        if k + 1 < M:
                            acc[i + 1, k + 1] += s11
        for i in range(M):
            for k in range(i + 1, M):
                acc[i, k] = acc[k, i]


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def window_pool(X, starts, M, psi_mode, block, beta, U):  # pragma: no cover (compiled)
    """U[w] = Σ_t beta[w, t] ψ(s_t) for the windows of :func:`window_grams` (beta in X's
    dtype): columns 0 .. D − 1 of U, and D .. 2·D − 1 for SER (the negative half); other
    columns are left as they are."""
    D = X.shape[1]
    halves = 2 if psi_mode == SER else 1
    row = np.empty(halves * block, X.dtype)
    sums = np.empty(block, X.dtype)
    pooled = np.empty(halves * block, X.dtype)
    for w in range(starts.shape[0]):
        for c0 in range(0, D, block):
            width = min(block, D - c0)
            n = halves * width
            s = sums[:width]
            out = pooled[:n]
            for t in range(M):
                x = X[starts[w] + t, c0: c0 + width]
                if t == 0:
                    for j in range(width):
                        s[j] = x[j]
                else:
                    for j in range(width):
                        s[j] = s[j] + x[j]
                _psi(s, psi_mode, row, width)
                b = beta[w, t]
                if t == 0:
                    for j in range(n):
                        out[j] = b * row[j]
                else:
                    for j in range(n):
                        out[j] += b * row[j]
            for h in range(halves):
                U[w, h * D + c0: h * D + c0 + width] = out[h * width: (h + 1) * width]
