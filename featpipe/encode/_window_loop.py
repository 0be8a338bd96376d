"""The compiled passes of rank pooling on the CPU (numba, numpy inputs): the sliding windows of
an ``hrp`` layer, and whole sequences (``rankpool``, the final layer of ``hrp``).

Kept apart from :mod:`featpipe.encode.temporal` so that numba is imported only when rank pooling
runs on the CPU.  :func:`pool_windows` does, for one window after another (rows
``start .. start + M − 1`` of X), everything :func:`featpipe.encode.temporal.rank_pool_sums`
does for a batch of them:

1. the running sums s_t in X's dtype, summed in order of t exactly as
   :func:`featpipe.encode.temporal.window_running_sums` does, and their ψ rows, into one
   window buffer (M × D, or M × 2·D for SER: 320 KiB for 20 × 4096 float32, so it stays in
   the L2 cache; the (n, M, D) sums of a layer never go to memory);
2. the Gram matrix of the ψ rows (float64; each sum over a block of columns, formed right
   after the block's rows while they are in cache, is in X's dtype, as the float32 GEMM of
   the array-API path), in 4 × 4 tiles;
3. the SVR of the L2-normalised rows in Gram space (:func:`featpipe.encode.svr.rank_svr_unit_gram`)
   by :func:`_dual`, the same semismooth Newton as :func:`featpipe.encode.svr.rank_svr_dual`,
   step for step, for one window (a Cholesky solve in place of the batched ``solve``);
4. u = Σ_t β_t ψ(s_t) from the buffer.

A whole sequence (T up to a few thousand rows of up to ~10^5 features: the per-frame Fisher
vectors of a video) is too big for one buffer: :func:`sequence_grams` forms the ψ rows of
both directions one block of columns at a time and adds their Gram tiles (the T × T Gram
matrix is the only thing kept), the SVRs are solved by the array-API solver, and
:func:`sequence_pool` forms the rows again to pool them.

ψ by mode: :data:`NONE` s; :data:`ROOT` √s (SER or SSR of non-negative sums: SER's negative
half is zero); :data:`SSR` sign(s)·√|s|; :data:`SER` [√max(s, 0), √max(−s, 0)] (2·D columns;
a block of columns whose sums are all non-negative skips its zero negative half).
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
#: a whole sequence's block of rows of X and their ψ rows (:func:`sequence_block`), and the
#: fewest columns of a block
_SEQUENCE_BYTES = 786432
_SEQUENCE_MIN_COLUMNS = 256
#: rows of a panel of the Gram tiles (:func:`_add_tiles`)
_PANEL = 64


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
def _fill(X, first, step, M, c0, c1, psi_mode, sums, rows, at, half):  # pragma: no cover
    """rows[t, at : at + c1 − c0] = ψ(s_t) of columns c0 .. c1 − 1, with s_t the running sum
    of rows first, first + step, ..., first + t·step of X (step 1: forward, −1: reversed); SER's
    negative half at ``at + half``.  ``sums`` holds the running sums.  Returns whether a sum
    was negative (else SER's negative half of these columns is zero).  One-dimensional views:
    the compiler vectorises their loops (3x faster than two-dimensional indexing, measured)."""
    width = c1 - c0
    s = sums[:width]
    x = X[first, c0:c1]
    for j in range(width):
        s[j] = x[j]
    negative = False
    for t in range(M):
        if t > 0:
            x = X[first + t * step, c0:c1]
            for j in range(width):
                s[j] = s[j] + x[j]
        row = rows[t]
        _psi(s, psi_mode, row[at:at + width],
             row[at + half: at + half + width] if psi_mode == SER else row[:0])
        if psi_mode == SER and not negative:
            smallest = s[0]
            for j in range(width):
                smallest = min(smallest, s[j])
            negative = smallest < 0
    return negative


@numba.njit(cache=True, nogil=True, fastmath=_FAST, inline="always")
def _tile(rows, i, k, c0, c1):  # pragma: no cover (compiled)
    """The 16 dot products of rows i .. i + 3 with rows k .. k + 3 over columns c0 .. c1 − 1,
    sharing their loads (16 vector accumulators: 2x the rate of 2 × 2 tiles, measured)."""
    a0, a1, a2, a3 = rows[i, c0:c1], rows[i + 1, c0:c1], rows[i + 2, c0:c1], rows[i + 3, c0:c1]
    b0, b1, b2, b3 = rows[k, c0:c1], rows[k + 1, c0:c1], rows[k + 2, c0:c1], rows[k + 3, c0:c1]
    zero = a0[0] - a0[0]
    s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = zero
    s20 = s21 = s22 = s23 = s30 = s31 = s32 = s33 = zero
    for j in range(c1 - c0):
        p0, p1, p2, p3 = a0[j], a1[j], a2[j], a3[j]
        q0, q1, q2, q3 = b0[j], b1[j], b2[j], b3[j]
        s00 += p0 * q0
        s01 += p0 * q1
        s02 += p0 * q2
        s03 += p0 * q3
        s10 += p1 * q0
        s11 += p1 * q1
        s12 += p1 * q2
        s13 += p1 * q3
        s20 += p2 * q0
        s21 += p2 * q1
        s22 += p2 * q2
        s23 += p2 * q3
        s30 += p3 * q0
        s31 += p3 * q1
        s32 += p3 * q2
        s33 += p3 * q3
    return ((s00, s01, s02, s03), (s10, s11, s12, s13), (s20, s21, s22, s23),
            (s30, s31, s32, s33))


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _add_tiles(rows, M, c0, c1, G):  # pragma: no cover (compiled)
    """G (lower triangle) += the Gram matrix of rows[:M, c0:c1] (M a multiple of 4), in
    4 × 4 tiles, panel by panel of :data:`_PANEL` rows (two panels' rows stay in the L2
    cache however long the sequence)."""
    for p in range(0, M, _PANEL):
        for q in range(0, p + 1, _PANEL):
            for i in range(p, min(p + _PANEL, M), 4):
                for k in range(q, min(q + _PANEL, i + 1), 4):
                    tile = _tile(rows, i, k, c0, c1)
                    for a in range(4):
                        for b in range(4):
                            G[i + a, k + b] += tile[a][b]


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
        negative = _fill(X, start, 1, M, c0, c1, psi_mode, sums, rows, c0, D)
        _add_tiles(rows, G.shape[0], c0, c1, G)
        if negative:
            _add_tiles(rows, G.shape[0], D + c0, D + c1, G)
    _mirror(G)


@numba.njit(cache=True, nogil=True)
def _mirror(G):  # pragma: no cover (compiled)
    """The upper triangle of G from its lower triangle."""
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
    Mp = M + (-M) % 4
    rows = np.zeros((Mp, halves * D), X.dtype)  # rows beyond M stay zero for the tiles
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


# -- whole sequences (rankpool, and the final layer of hrp) ------------------------------------


def sequence_block(T: int, itemsize: int, psi_mode: int) -> int:
    """Columns per block of a whole sequence of T rows: the block's rows of X and their ψ rows
    (two halves for SER) within :data:`_SEQUENCE_BYTES`, a multiple of 16, at least
    :data:`_SEQUENCE_MIN_COLUMNS` (long dot products for the tiles; a long sequence's blocks
    then outgrow the L2 cache, and the tiles go panel by panel)."""
    per_column = (T + (-T) % 4) * itemsize * (3 if psi_mode == SER else 2)
    return max(_SEQUENCE_MIN_COLUMNS, _SEQUENCE_BYTES // per_column // 16 * 16)


def sequence_rows(T: int) -> int:
    """Rows of the Gram matrices of :func:`sequence_grams`: T padded to a multiple of 4."""
    return T + (-T) % 4


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def sequence_grams(X, reverse, psi_mode, block, G, negative):  # pragma: no cover (compiled)
    """G[d] = the Gram matrix (float64, padded to :func:`sequence_rows`, zero beyond T) of the
    ψ rows of the whole sequence X (T, D) in direction d: ``reverse[d]`` 0, the running sums
    s_t = x_1 + ... + x_t; 1, those of the reversed sequence, x_T + ... + x_{T−t+1} (each
    summed in order in X's dtype, as :func:`featpipe.encode.maps.running_sum` of the flipped
    rows).  One block of ``block`` columns at a time: its ψ rows are formed and multiplied
    while they are in the L2 cache; each block's dot products are in X's dtype, their sum
    over the blocks in float64.  negative[d, b]: whether block b had a negative sum (SER:
    else its negative half is zero, and left out)."""
    T, D = X.shape
    Tp = G.shape[1]
    halves = 2 if psi_mode == SER else 1
    rows = np.zeros((Tp, halves * block), X.dtype)  # rows beyond T stay zero for the tiles
    sums = np.empty(block, X.dtype)
    G[:, :, :] = 0.0
    for c0 in range(0, D, block):
        c1 = min(c0 + block, D)
        for d in range(reverse.shape[0]):
            first, step = (T - 1, -1) if reverse[d] else (0, 1)
            below = _fill(X, first, step, T, c0, c1, psi_mode, sums, rows, 0, block)
            negative[d, c0 // block] = below
            _add_tiles(rows, Tp, 0, c1 - c0, G[d])
            if below:
                _add_tiles(rows, Tp, block, block + c1 - c0, G[d])
    for d in range(G.shape[0]):
        _mirror(G[d])


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def sequence_pool(X, reverse, psi_mode, block, negative, beta, U):  # pragma: no cover
    """U[d] = Σ_t beta[d, t] ψ(s_t) in X's dtype, with the running sums and ψ of
    :func:`sequence_grams` formed again row by row, block by block (in the L1 cache; blocks
    with ``negative[d, b]`` false skip SER's zero negative half): columns 0 .. D − 1, and
    D .. 2·D − 1 for SER."""
    T, D = X.shape
    sums = np.empty(block, X.dtype)
    positive = np.empty(block, X.dtype)
    below = np.empty(block, X.dtype)
    for c0 in range(0, D, block):
        c1 = min(c0 + block, D)
        width = c1 - c0
        s, q, r = sums[:width], positive[:width], below[:width]
        for d in range(reverse.shape[0]):
            first, step = (T - 1, -1) if reverse[d] else (0, 1)
            halves = 2 if psi_mode == SER and negative[d, c0 // block] else 1
            # SER of non-negative sums: √s and a zero half (ROOT)
            mode = ROOT if psi_mode == SER and halves == 1 else psi_mode
            out = U[d, c0:c1]
            rest = U[d, D + c0: D + c1] if psi_mode == SER else U[d, :0]
            rest[:] = 0.0
            for t in range(T):
                x = X[first + t * step, c0:c1]
                if t == 0:
                    for j in range(width):
                        s[j] = x[j]
                else:
                    for j in range(width):
                        s[j] = s[j] + x[j]
                _psi(s, mode, q, r)
                b = beta[d, t]
                if t == 0:
                    for j in range(width):
                        out[j] = b * q[j]
                else:
                    for j in range(width):
                        out[j] += b * q[j]
                if halves == 2:
                    for j in range(width):
                        rest[j] += b * r[j]
