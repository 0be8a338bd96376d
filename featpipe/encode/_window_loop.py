"""The compiled pass over the sliding windows of an ``hrp`` layer (numba, numpy inputs).

Kept apart from :mod:`featpipe.encode.temporal` so that numba is imported only when a layer of
windows is pooled on the CPU.  :func:`pool_windows` does, for one window after another (rows
``start .. start + M − 1`` of X), everything :func:`featpipe.encode.temporal.rank_pool_sums`
does for a batch of them:

1. the running sums s_t in X's dtype, summed in order of t exactly as
   :func:`featpipe.encode.temporal.window_running_sums` does, and their ψ rows, into one
   window buffer (M × D, or M × 2·D for SER: 320 KiB for 20 × 4096 float32, so it stays in
   the L2 cache; the (n, M, D) sums of a layer never go to memory);
2. the Gram matrix of the ψ rows (float64; each sum over a block of columns, formed right
   after the block's rows while they are in cache, is in X's dtype, as the float32 GEMM of
   the array-API path);
3. the SVR of the L2-normalised rows in Gram space (:func:`featpipe.encode.svr.rank_svr_unit_gram`)
   by :func:`_dual`, the same semismooth Newton as :func:`featpipe.encode.svr.rank_svr_dual`,
   step for step, for one window (a Cholesky solve in place of the batched ``solve``);
4. u = Σ_t β_t ψ(s_t) from the buffer.

ψ by mode: :data:`NONE` s; :data:`ROOT` √s (SER or SSR of non-negative sums: SER's negative
half is zero); :data:`SSR` sign(s)·√|s|; :data:`SER` [√max(s, 0), √max(−s, 0)] (2·D columns).
The array-API path of :mod:`featpipe.encode.temporal` is the reference this is tested against
(tests/unit/test_temporal.py::test_compiled_window_passes_match_the_array_api_path).
"""

from __future__ import annotations

import numba
import numpy as np

from featpipe.encode.svr import ARMIJO, MAX_BACKTRACK, MAX_NEWTON_ITER
from featpipe.numba_cache import ensure_cache_dir

ensure_cache_dir(__file__)

NONE, ROOT, SSR, SER = 0, 1, 2, 3

#: finite inputs (checked on entry); the dot products may be reassociated so they vectorise
_FAST = {"nnan", "ninf", "nsz", "reassoc", "contract"}
#: bytes of the ψ rows of one window and column block, formed and then multiplied while they
#: are in the L1/L2 caches (measured on the 2-core Zen 4, 32 KiB L1: 16 KiB 1.2x slower than
#: 32 KiB, 64 KiB 1.1x faster: fewer, longer dot products)
_BLOCK_BYTES = 65536


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
def _psi(s, psi_mode, positive, negative):  # pragma: no cover (compiled)
    """positive = ψ(s) (SER: its first half; the second half goes to ``negative``)."""
    if psi_mode == NONE:
        for j in range(s.shape[0]):
            positive[j] = s[j]
    elif psi_mode == ROOT:
        for j in range(s.shape[0]):
            positive[j] = np.sqrt(s[j])
    elif psi_mode == SSR:
        for j in range(s.shape[0]):
            positive[j] = np.copysign(np.sqrt(np.abs(s[j])), s[j])
    else:
        for j in range(s.shape[0]):
            v = s[j]
            nil = v - v  # 0 in X's dtype (v is finite)
            positive[j] = np.sqrt(v if v > nil else nil)
            negative[j] = np.sqrt(-v if v < nil else nil)


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _fill(X, start, M, c0, c1, psi_mode, sums, rows):  # pragma: no cover (compiled)
    """rows[t] = ψ(s_t) of columns c0 .. c1 − 1 (SER: the negative half at D + c0 ..);
    ``sums`` holds the running sums.  One-dimensional views: the compiler vectorises their
    loops (3x faster than two-dimensional indexing, measured)."""
    D = X.shape[1]
    s = sums[: c1 - c0]
    x = X[start, c0:c1]
    for j in range(c1 - c0):
        s[j] = x[j]
    for t in range(M):
        if t > 0:
            x = X[start + t, c0:c1]
            for j in range(c1 - c0):
                s[j] = s[j] + x[j]
        row = rows[t]
        _psi(s, psi_mode, row[c0:c1], row[D + c0: D + c1] if psi_mode == SER else row[:0])


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _tile(rows, i, k, c0, c1):  # pragma: no cover (compiled)
    """The dot products of rows i, i + 1 with rows k, k + 1 over columns c0 .. c1 − 1 (four
    sums that share their loads)."""
    a0, a1 = rows[i, c0:c1], rows[i + 1, c0:c1]
    b0, b1 = rows[k, c0:c1], rows[k + 1, c0:c1]
    zero = a0[0] - a0[0]
    s00, s01, s10, s11 = zero, zero, zero, zero
    for j in range(c1 - c0):
        s00 += a0[j] * b0[j]
        s01 += a0[j] * b1[j]
        s10 += a1[j] * b0[j]
        s11 += a1[j] * b1[j]
    return s00, s01, s10, s11


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _add_tiles(rows, M, c0, c1, G):  # pragma: no cover (compiled)
    """G (lower triangle) += the Gram matrix of rows[:M, c0:c1], in 2 × 2 tiles."""
    for i in range(0, M, 2):
        for k in range(0, i + 1, 2):
            s00, s01, s10, s11 = _tile(rows, i, k, c0, c1)
            G[i, k] += s00
            G[i, k + 1] += s01
            G[i + 1, k] += s10
            G[i + 1, k + 1] += s11


@numba.njit(cache=True, nogil=True)
def _cholesky_solve(A, b, x):  # pragma: no cover (compiled)
    """x = A⁻¹ b for a symmetric positive definite A (overwritten by its Cholesky factor)."""
    n = A.shape[0]
    for j in range(n):
        d = A[j, j]
        for k in range(j):
            d -= A[j, k] * A[j, k]
        d = np.sqrt(d)
        A[j, j] = d
        for i in range(j + 1, n):
            v = A[i, j]
            for k in range(j):
                v -= A[i, k] * A[j, k]
            A[i, j] = v / d
    for i in range(n):
        v = b[i]
        for k in range(i):
            v -= A[i, k] * x[k]
        x[i] = v / A[i, i]
    for i in range(n - 1, -1, -1):
        v = x[i]
        for k in range(i + 1, n):
            v -= A[k, i] * x[k]
        x[i] = v / A[i, i]


@numba.njit(cache=True, nogil=True)
def _soft(y, Ga, epsilon, s):  # pragma: no cover (compiled)
    """s = r − clip(r, −ε, ε), r = y − Gα (:func:`featpipe.encode.svr._soft_threshold`)."""
    for t in range(y.shape[0]):
        r = y[t] - Ga[t]
        s[t] = r - min(max(r, -epsilon), epsilon)


@numba.njit(cache=True, nogil=True)
def _objective(a, Ga, s, C):  # pragma: no cover (compiled)
    quadratic, loss = 0.0, 0.0
    for t in range(a.shape[0]):
        quadratic += a[t] * Ga[t]
        loss += s[t] * s[t]
    return 0.5 * quadratic + C * loss


@numba.njit(cache=True, nogil=True)
def _dual(G, C, epsilon, a):  # pragma: no cover (compiled)
    """α (into ``a``) of :func:`featpipe.encode.svr.rank_svr_dual` for one Gram matrix G
    (T × T, float64): the same active-set Newton steps, Armijo backtracking, slack and
    stopping rule.  Returns False when it did not settle in MAX_NEWTON_ITER steps."""
    T = G.shape[0]
    two_c = 2.0 * C
    y = np.arange(1.0, T + 1.0)
    Ga = np.zeros(T)
    s = np.empty(T)
    s_new = np.empty(T)
    d = np.empty(T)
    Gd = np.empty(T)
    a_try = np.empty(T)
    rhs = np.empty(T)
    A = np.empty((T, T))
    a[:] = 0.0
    _soft(y, Ga, epsilon, s)
    f = _objective(a, Ga, s, C)
    for _iteration in range(MAX_NEWTON_ITER):
        for i in range(T):
            active_i = s[i] != 0.0
            for k in range(T):
                A[i, k] = two_c * G[i, k] if active_i and s[k] != 0.0 else 0.0
            A[i, i] += 1.0
            rhs[i] = two_c * (Ga[i] + s[i]) if active_i else 0.0
        _cholesky_solve(A, rhs, d)
        for t in range(T):
            d[t] -= a[t]
        slope = 0.0
        for i in range(T):
            v = 0.0
            for k in range(T):
                v += G[i, k] * d[k]
            Gd[i] = v
            slope += (a[i] - two_c * s[i]) * v
        slack = 1e-13 * abs(f)
        step = 1.0
        for _ in range(MAX_BACKTRACK):
            for t in range(T):
                a_try[t] = a[t] + step * d[t]
                s_new[t] = Ga[t] + step * Gd[t]  # Gα of the trial point
            quadratic = 0.0
            for t in range(T):
                quadratic += a_try[t] * s_new[t]
            _soft(y, s_new, epsilon, s_new)
            loss = 0.0
            for t in range(T):
                loss += s_new[t] * s_new[t]
            if 0.5 * quadratic + C * loss <= f + ARMIJO * step * slope + slack:
                break
            step = 0.5 * step
        a[:] = a_try
        for i in range(T):
            v = 0.0
            for k in range(T):
                v += G[i, k] * a[k]
            Ga[i] = v
        _soft(y, Ga, epsilon, s_new)
        f = _objective(a, Ga, s_new, C)
        same = True
        for t in range(T):
            if (s_new[t] != 0.0) != (s[t] != 0.0) or (
                    s[t] != 0.0 and (s_new[t] > 0.0) != (s[t] > 0.0)):
                same = False
        s[:] = s_new
        if same and step == 1.0:
            return True
    return False


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _fill_and_gram(X, start, M, psi_mode, block, sums, rows, G):  # pragma: no cover
    """rows[t] = ψ(s_t) (:func:`_fill`) and G = their Gram matrix (float64), one block of
    columns at a time while it is in the L1 cache: lower triangle in tiles, then mirrored."""
    D = X.shape[1]
    G[:, :] = 0.0
    for c0 in range(0, D, block):
        c1 = min(c0 + block, D)
        _fill(X, start, M, c0, c1, psi_mode, sums, rows)
        _add_tiles(rows, G.shape[0], c0, c1, G)
        if psi_mode == SER:
            _add_tiles(rows, G.shape[0], D + c0, D + c1, G)
    for i in range(G.shape[0]):
        for k in range(i + 1, G.shape[0]):
            G[i, k] = G[k, i]


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def pool_windows(X, starts, M, psi_mode, block, C, epsilon, U):  # pragma: no cover
    """U[w] = u of the window of M rows of X (T, D) that starts at starts[w]: columns
    0 .. D − 1, and D .. 2·D − 1 for SER (other columns are left as they are).  Returns the
    number of windows whose Newton did not settle."""
    D = X.shape[1]
    halves = 2 if psi_mode == SER else 1
    Mp = M + M % 2
    rows = np.zeros((Mp, halves * D), X.dtype)  # an odd M gets a zero row for the tiles
    sums = np.empty(min(block, D), X.dtype)
    G = np.zeros((Mp, Mp))
    Gn = np.empty((M, M))
    inverse = np.empty(M)
    alpha = np.empty(M)
    beta = np.empty(M, X.dtype)
    failed = 0
    for w in range(starts.shape[0]):
        _fill_and_gram(X, starts[w], M, psi_mode, block, sums, rows, G)
        # rank_svr_unit_gram: the SVR on the L2-normalised rows, in Gram space
        for t in range(M):
            norm = np.sqrt(G[t, t])
            inverse[t] = 1.0 / norm if norm > 0.0 else 0.0
        for i in range(M):
            for k in range(M):
                Gn[i, k] = G[i, k] * inverse[i] * inverse[k]
        if not _dual(Gn, C, epsilon, alpha):
            failed += 1
        for t in range(M):
            beta[t] = alpha[t] * inverse[t]
        out = U[w, : halves * D]
        row = rows[0]
        for j in range(halves * D):
            out[j] = beta[0] * row[j]
        for t in range(1, M):
            b = beta[t]
            row = rows[t]
            for j in range(halves * D):
                out[j] += b * row[j]
    return failed
