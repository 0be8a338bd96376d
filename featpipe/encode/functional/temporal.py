"""The temporal encoders as plain functions (docs/methods.md): their functional core.

The scikit-learn transformers of :mod:`featpipe.encode.temporal` are thin classes over these
functions (parameters declared, validated and cloned there), and ``featpipe encode --method``
calls them directly with the stage's canonical parameter record
(:data:`ENCODE_FUNCTIONS`, :func:`featpipe.encode.registry.load_method`), so that a run imports
neither scikit-learn nor torch.  Parameters have no defaults here: they are declared once, by
the estimators.

- ``avg``, ``max``: mean / max over time.
- ``tpyramid``: two-level temporal pyramid, [pool(X); pool(first half); pool(second half)].
- ``rankpool``: rank pooling (Fernando et al. CVPR'15, TPAMI'17; VideoDarwin): the SVR of
  :mod:`featpipe.encode.svr` on v_t = L2(ψ(TVM(X))_t); ``both`` directions (VideoDarwin's
  default) concatenates [u_fwd; u_rev], rev pooling the reversed sequence.
- ``arp``: approximate rank pooling (Bilen et al. CVPR'16 "Dynamic image networks", eq. 4 and
  its closed form): d = Σ_t α_t x_t, α_t = 2(T−t+1) − (T+1)(H_T − H_{t−1}), on the raw frames.
- ``hrp``: hierarchical rank pooling (Fernando, Anderson, Hutter, Gould CVPR'16, §3): layer ℓ
  slides a window of M elements with stride S over X^(ℓ) and rank-pools each window (TVM → ψ →
  L2 → SVR); the pooled vectors, in order, form X^(ℓ+1); after depth−1 such layers the final
  layer rank-pools the whole X^(depth) once.  A sequence shorter than the window gives one
  window covering it.  Layer-1 windows are processed in chunks (``chunk_bytes``), so a long
  sequence never has all its windows in memory at once.
- ``recursive``: recursive rank pooling: x_t^(ℓ+1) = φ(⟨x_1^(ℓ)..x_t^(ℓ)⟩), t = 2..J (t = 1
  when J = 1); every prefix shares the TVM vectors and Gram matrix of the whole sequence; then
  the final layer rank-pools X^(depth) as in ``hrp``.

Numerics go through the array API: ``device="cuda"`` runs on CuPy or torch when a GPU is
present and raises a clear error when not.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from featpipe.backend import (
    all_rows,
    device_namespace,
    memory_budget,
    namespace,
    refuse_grad,
    single_threaded_blas,
    spill_array,
    to_numpy,
    worker_threads,
)
from featpipe.encode.maps import (
    normalized_map,
    psi_dim,
    running_sum,
    time_varying_mean,
)
from featpipe.encode.registry import EncodeFunction
from featpipe.encode.svr import (
    MAX_NEWTON_ITER,
    check_svr_params,
    gram,
    rank_svr_dual,
    rank_svr_liblinear,
    rank_svr_primal,
    rank_svr_unit_gram,
)
from featpipe.errors import InputError, ParameterError
from featpipe.fileio import human_bytes, memory_bytes
from featpipe.item_kinds import POOLS_TIME

SOLVERS = ("newton", "liblinear")
#: Rows of a long sequence's vectors built at a time (:func:`rank_pool_long`): fixed, so
#: that the result does not depend on the memory budget.
LONG_CHUNK_ROWS = 128
DIRECTIONS = ("fwd", "rev", "both")
#: Windows longer than this are solved in the primal (rank_svr_primal) instead of the T×T dual.
DENSE_MAX_LENGTH = 2048


# ---------------------------------------------------------------------------------------------
# validation


def check_sequence(X, index, expected_dim: int | None = None, device="cpu"):
    """A (T, D) real floating array (T ≥ 1, all finite) in the device's namespace, or an error
    naming the sequence."""
    name = f"sequence {index}" if isinstance(index, int) else str(index)
    try:
        xp = namespace(X)
    except TypeError:
        X = np.asarray(X)
        xp = namespace(X)
    if array_is_numpy(X) and X.dtype.kind not in "biuf":
        raise InputError(f"{name}: expected a numeric (T, D) array, got dtype {X.dtype}")
    if not (xp.isdtype(X.dtype, "real floating") or xp.isdtype(X.dtype, "integral")
            or X.dtype == xp.bool):
        raise InputError(f"{name}: expected a numeric (T, D) array, got dtype {X.dtype}")
    if X.ndim != 2:
        raise InputError(f"{name}: expected a 2-D (frames, features) array, got shape "
                         f"{tuple(X.shape)}; reshape a single frame to (1, D)")
    if X.shape[0] == 0:
        raise InputError(f"{name}: empty sequence (0 frames)")
    if expected_dim is not None and X.shape[1] != expected_dim:
        raise InputError(f"{name}: has {X.shape[1]} features per frame, expected "
                         f"{expected_dim} like the first sequence")
    if not xp.isdtype(X.dtype, "real floating"):
        X = xp.astype(X, xp.float64)
    if not all_rows(X, xp.isfinite):
        raise InputError(f"{name}: contains NaN or Inf")
    if device != "cpu" and array_is_numpy(X):
        dxp, dev = device_namespace(device)
        X = dxp.asarray(X, device=dev)
    return X


def array_is_numpy(X) -> bool:
    return isinstance(X, np.ndarray)


# ---------------------------------------------------------------------------------------------
# pooling functions (array API)


def average_pool(X):
    return namespace(X).mean(X, axis=0)


def max_pool(X):
    return namespace(X).max(X, axis=0)


def temporal_pyramid(X, pool: str = "avg"):
    """[pool(X); pool(X[:h]); pool(X[h:])], h = max(1, T // 2) (length 1: both halves = X)."""
    xp = namespace(X)
    f = average_pool if pool == "avg" else max_pool
    T = X.shape[0]
    return xp.concat([f(X), f(X[: max(1, T // 2), ...]), f(X[T // 2:, ...])], axis=0)


def harmonic_numbers(T: int) -> np.ndarray:
    """H_0..H_T (H_0 = 0)."""
    return np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, T + 1))])


def arp_coefficients(T: int) -> np.ndarray:
    """α_t = 2(T−t+1) − (T+1)(H_T − H_{t−1}), t = 1..T (Bilen et al. CVPR'16); T = 1 gives 1."""
    if T == 1:
        return np.ones(1)
    H = harmonic_numbers(T)
    t = np.arange(1, T + 1)
    return 2.0 * (T - t + 1) - (T + 1) * (H[T] - H[t - 1])


def approximate_rank_pool(X):
    xp = namespace(X)
    alpha = xp.asarray(arp_coefficients(X.shape[0]), dtype=X.dtype,
                       device=getattr(X, "device", None))
    return (alpha[None, :] @ X)[0, :]


def _flip_valid(W, lengths):
    """Reverse each padded window's first lengths[b] rows (padding stays at the end)."""
    xp = namespace(W)
    if lengths is None:
        return xp.flip(W, axis=1)
    rows = []
    for b in range(W.shape[0]):
        n = int(lengths[b])
        rows.append(xp.concat([xp.flip(W[b, :n, :], axis=0), W[b, n:, :]], axis=0))
    return xp.stack(rows, axis=0)


def rank_pool_windows(W, psi="ser", C=1.0, epsilon=0.1, directions="fwd", solver="newton",
                      lengths=None):
    """Rank-pool a batch of windows W (B, T, D) -> (B, D') (2·D' for ``both``).

    Each window: v_t = L2(ψ(TVM(W_b))_t), then the SVR.  With ``lengths``, window b is
    W[b, :lengths[b]] (zero-padded beyond).  numpy float32/float64 with the Newton solver:
    :func:`pool_sequences`.
    """
    if lengths is None and compiles(W, solver):
        return pool_sequences([W[b] for b in range(W.shape[0])], psi, C, epsilon, directions)
    parts = []
    nonnegative = all_rows(W, lambda block: block >= 0) if psi != "none" else None
    for direction in (("fwd", "rev") if directions == "both" else (directions,)):
        Wd = W if direction == "fwd" else _flip_valid(W, lengths)
        parts.append(rank_pool_sums(running_sum(Wd), psi, C, epsilon, solver, lengths,
                                    nonnegative))
    return parts[0] if len(parts) == 1 else namespace(W).concat(parts, axis=-1)


def rank_pool_sums(S, psi="ser", C=1.0, epsilon=0.1, solver="newton", lengths=None,
                   nonnegative=None):
    """ψ, L2 and the SVR on the running sums S (B, T, D) of windows -> (B, D').

    TVM's division by t is left out: ψ is positively homogeneous and L2 removes the scale.
    ``nonnegative`` says whether S ≥ 0 is known (None: check).
    """
    xp = namespace(S)
    if nonnegative is None:
        nonnegative = bool(xp.all(S >= 0))
    if solver != "newton":
        refuse_grad(S, what="solver='liblinear'")
    if solver == "newton":
        parts = psi_parts(S, psi, nonnegative)
        beta = rank_svr_unit_gram(parts_gram(parts), C, epsilon, lengths)
        return psi_pool(xp.astype(beta, S.dtype), parts, psi, nonnegative)
    Vn = np.asarray(to_numpy(normalized_map(S, psi)), dtype=np.float64)
    U = np.zeros((Vn.shape[0], Vn.shape[2]))
    for b in range(Vn.shape[0]):
        T = Vn.shape[1] if lengths is None else int(lengths[b])
        U[b] = rank_svr_liblinear(Vn[b:b + 1, :T], C, epsilon)[0]
    return xp.asarray(U.astype(to_numpy(S).dtype), device=getattr(S, "device", None))


def psi_parts(S, psi, nonnegative):
    """Arrays whose Gram matrices add up to that of ψ(S), without forming SER's doubled rows.

    With R = √|S| and Q = sign(S)·R, SER(S) = [(R+Q)/2, (R−Q)/2], whose Gram matrix is
    (R Rᵀ + Q Qᵀ)/2: three passes over S instead of eight and a concat.  For non-negative S
    (sums of ReLU features such as VGG fc6) Q = R and the negative half of SER is zero, so R
    alone serves; SSR of non-negative sums is their square root.
    """
    xp = namespace(S)
    if psi == "none":
        return (S,)
    if nonnegative:
        return (xp.sqrt(S),)
    R = xp.sqrt(xp.abs(S))
    Q = xp.copysign(R, S)
    return (R, Q) if psi == "ser" else (Q,)


def parts_gram(parts):
    """The Gram matrices of ψ(S) from :func:`psi_parts` (B, T, T)."""
    if len(parts) == 1:
        return gram(parts[0])
    return 0.5 * (gram(parts[0]) + gram(parts[1]))


def psi_pool(beta, parts, psi, nonnegative):
    """u = Σ_t β_t ψ(s_t) from the coefficients β (B, T) and :func:`psi_parts` -> (B, D')."""
    xp = namespace(beta, *parts)
    pooled = [(beta[:, None, :] @ p)[:, 0, :] for p in parts]
    if psi != "ser":
        return pooled[0]
    if nonnegative:
        return xp.concat([pooled[0], xp.zeros_like(pooled[0])], axis=-1)
    uR, uQ = pooled
    return xp.concat([0.5 * (uR + uQ), 0.5 * (uR - uQ)], axis=-1)


def rank_pool_long(X, psi="ser", C=1.0, epsilon=0.1, directions="fwd", solver="newton"):
    """Rank-pool one long sequence X (T, D) without its T×T Gram matrix: the vectors
    L2(ψ(TVM(X))) are built in chunks of :data:`LONG_CHUNK_ROWS` rows (the running sums go
    on across chunks in order, as one sequential sum) and the SVR is solved in the primal by
    :func:`featpipe.encode.svr.rank_svr_primal`; the vectors are held in one array, a memory
    map of a temporary file once bigger than the memory budget
    (:func:`featpipe.backend.spill_array`).  The chunks are of a fixed size, so the result
    does not depend on the budget.  Not differentiable: tensors that require grad are
    refused."""
    refuse_grad(X, what="rank_pool_long (long sequences, solved in the primal)")
    xp = namespace(X)
    device = getattr(X, "device", None)
    T, D = X.shape
    work = _work_float(xp, X)
    rows = LONG_CHUNK_ROWS
    half = psi == "ser" and solver == "newton"  # SerRows: SER's rows at half size
    parts = []
    for direction in (("fwd", "rev") if directions == "both" else (directions,)):
        Xd = X if direction == "fwd" else xp.flip(X, axis=0)
        carry = xp.zeros((1, D), dtype=work, device=device)
        chunks = []
        # numpy: the rows of V in one array, a memory map once bigger than the memory budget
        V = spill_array((T, D if half else psi_dim(psi, D)), X.dtype) \
            if array_is_numpy(X) else None
        for start in range(0, T, rows):
            sums = xp.cumulative_sum(xp.concat(
                [carry, xp.astype(Xd[start: min(start + rows, T), ...], work)], axis=0),
                axis=0)[1:, ...]
            carry = sums[-1:, ...]
            counts = xp.astype(xp.arange(start + 1, start + sums.shape[0] + 1, device=device),
                               work)
            smoothed = xp.astype(sums / counts[:, None], X.dtype)
            chunk = SerRows.from_smoothed(smoothed) if half else normalized_map(smoothed, psi)
            if V is not None:
                block = V[start:start + smoothed.shape[0]]
                block[...] = chunk.array if half else chunk
                chunk = SerRows(block) if half else block
            chunks.append(chunk)
        if solver == "liblinear":
            V = np.asarray(to_numpy(xp.concat(chunks, axis=0)), dtype=np.float64)
            u = xp.asarray(rank_svr_liblinear(V[None], C, epsilon)[0].astype(
                to_numpy(chunks[0]).dtype), device=device)
        else:
            u = rank_svr_primal(chunks, C, epsilon)
        parts.append(u)
    return parts[0] if len(parts) == 1 else xp.concat(parts, axis=0)


class SerRows:
    """A block of rows L2(SER(s_t)) held at half size: with a = s/‖s‖₁ (so that
    ‖SER(a)‖₂ = 1) and Q = sign(a)·√|a|, the rows are [(|Q|+Q)/2, (|Q|−Q)/2], hence
    V u = (|Q|(u₁+u₂) + Q(u₁−u₂))/2 and Vᵀs = [(|Q|ᵀs + Qᵀs)/2, (|Q|ᵀs − Qᵀs)/2].
    A row block for :func:`featpipe.encode.svr.rank_svr_primal`."""

    def __init__(self, Q):
        self.array = Q
        self.shape = (Q.shape[0], 2 * Q.shape[1])

    @classmethod
    def from_smoothed(cls, S):
        xp = namespace(S)
        l1 = xp.sum(xp.abs(S), axis=-1, keepdims=True)
        A = S / xp.where(l1 > 0, l1, xp.ones_like(l1))
        return cls(xp.copysign(xp.sqrt(xp.abs(A)), A))

    def matvec(self, u):
        Q = self.array
        D = Q.shape[1]
        u1, u2 = u[:D], u[D:]
        return 0.5 * (namespace(Q).abs(Q) @ (u1 + u2) + Q @ (u1 - u2))

    def rmatvec(self, s):
        xp = namespace(self.array)
        Qt = xp.permute_dims(self.array, (1, 0))
        a, b = xp.abs(Qt) @ s, Qt @ s
        return xp.concat([0.5 * (a + b), 0.5 * (a - b)], axis=0)


def window_starts(T: int, window: int, stride: int) -> list[int]:
    """Starts of the windows of min(window, T) elements, stride apart (one if T < window)."""
    M = min(window, T)
    return list(range(0, T - M + 1, stride))


def window_bytes(M: int, dim: int, itemsize: int) -> int:
    """Working memory of one window of M rows of ``dim`` features: the gathered rows, their
    running sums, ψ's parts (√|S|, sign·√|S|) and a temporary, five arrays of M × dim
    (measured with tracemalloc: 4.8 for signed, 3.8 for non-negative features)."""
    return 5 * M * dim * itemsize


def window_running_sums(X, first: int, n: int, M: int, stride: int):
    """Running sums of the n windows of M rows of X (T, D) that start at rows first,
    first + stride, ... -> (n, M, D): entry (w, t) = Σ_{τ≤t} X[first + w·stride + τ], summed
    in order of τ (the rows at step t of every window are one strided slice, so nothing is
    gathered; numpy writes each step straight into the result)."""
    rows = [X[first + t: first + t + (n - 1) * stride + 1: stride, ...] for t in range(M)]
    if not array_is_numpy(X):
        sums = rows[:1]
        for row in rows[1:]:
            sums.append(sums[-1] + row)
        return namespace(X).stack(sums, axis=1)
    sums = np.empty((n, M, X.shape[1]), dtype=X.dtype)
    sums[:, 0] = rows[0]
    for t in range(1, M):
        np.add(sums[:, t - 1], rows[t], out=sums[:, t])
    return sums


def compiles(X, solver: str) -> bool:
    """Whether the compiled passes of :mod:`featpipe.encode._window_loop` pool X: numpy
    float32/float64 with the Newton solver."""
    return array_is_numpy(X) and solver == "newton" and X.dtype in (np.float32, np.float64)


def pool_sequences(seqs, psi="ssr", C=1.0, epsilon=0.1, directions="both"):
    """Rank pooling of whole numpy sequences of one length T (:func:`compiles`) -> (B, D')
    ([u_fwd; u_rev] for ``both``), by the compiled passes: per sequence, the Gram matrices of
    both directions (:func:`featpipe.encode._window_loop.sequence_grams`: running sums, ψ and
    Gram tiles one block of columns at a time, so no (T, D) temporary is formed), the SVRs of
    every sequence and direction in one :func:`featpipe.encode.svr.rank_svr_unit_gram` (each
    window's Newton its own: a sequence gets the same bits alone or in a batch), then
    u = Σ_t β_t ψ(s_t) (:func:`featpipe.encode._window_loop.sequence_pool`, ψ formed again).
    ψ of non-negative sums needs no special case: SER's negative half is skipped block by
    block where it is zero."""
    from featpipe.encode import _window_loop
    from featpipe.numba_cache import announce

    C, epsilon = check_svr_params(C, epsilon)
    T, D = seqs[0].shape
    reverse = np.asarray([0, 1] if directions == "both" else [int(directions == "rev")],
                         dtype=np.int64)
    mode = _window_loop.mode(psi, False)
    seqs = [np.ascontiguousarray(X) for X in seqs]  # one layout for the compiled passes
    blocks = [_window_loop.sequence_block(T, X.itemsize, mode) for X in seqs]
    Tp = _window_loop.sequence_rows(T)
    grams = np.empty((len(seqs), len(reverse), Tp, Tp))
    negative = [np.zeros((len(reverse), -(-D // block)), bool) for block in blocks]
    for X, block, below in zip(seqs, blocks, negative, strict=True):
        announce("rank-pooling kernels",
                 (_window_loop.sequence_grams, (X, reverse, mode, block, grams[0], below)),
                 (_window_loop.sequence_pool, (X, reverse, mode, block, below, np.empty(
                     (len(reverse), T), X.dtype), np.empty((len(reverse), 1), X.dtype))))
    for b, (X, block) in enumerate(zip(seqs, blocks, strict=True)):
        _window_loop.sequence_grams(X, reverse, mode, block, grams[b], negative[b])
    with single_threaded_blas():  # small T × T solves
        beta = rank_svr_unit_gram(grams[:, :, :T, :T].reshape(-1, T, T), C, epsilon)
    beta = beta.reshape(len(seqs), len(reverse), T)
    out = []
    for b, (X, block) in enumerate(zip(seqs, blocks, strict=True)):
        U = np.empty((len(reverse), psi_dim(psi, D)), X.dtype)
        _window_loop.sequence_pool(X, reverse, mode, block, negative[b],
                                   beta[b].astype(X.dtype), U)
        out.append(U.reshape(-1))
    return np.stack(out)


def pool_windows(X, starts, M, stride, psi="ser", C=1.0, epsilon=0.1, solver="newton",
                 nonnegative=None):
    """Rank-pool the windows of M rows of X (T, D) that start at ``starts`` (``stride``
    apart) -> (n, D').

    numpy float32/float64 with the Newton solver: the compiled pass
    :func:`featpipe.encode._window_loop.pool_windows` (running sums, ψ, Gram matrix, SVR and
    pooling one window at a time in the cache: the (n, M, D) sums never go to memory);
    otherwise, and as its reference, :func:`window_running_sums` and :func:`rank_pool_sums`.
    """
    if not compiles(X, solver):
        sums = window_running_sums(X, starts[0], len(starts), M, stride)
        return rank_pool_sums(sums, psi, C, epsilon, solver, nonnegative=nonnegative)
    from featpipe.encode import _window_loop
    from featpipe.numba_cache import announce

    C, epsilon = check_svr_params(C, epsilon)
    if nonnegative is None:
        nonnegative = bool(np.all(X >= 0))
    mode = _window_loop.mode(psi, nonnegative)
    # SER of non-negative sums (mode ROOT): the negative half stays zero
    U = np.zeros((len(starts), psi_dim(psi, X.shape[1])), dtype=X.dtype)
    args = (X, np.asarray(starts, dtype=np.int64), M, mode,
            _window_loop.block_columns(M, X.itemsize, mode), C, epsilon, U)
    announce("rank-pooling kernels", (_window_loop.pool_windows, args))
    failed = _window_loop.pool_windows(*args)
    if failed:
        raise RuntimeError(f"rank_svr_dual: active-set Newton did not settle in "
                           f"{MAX_NEWTON_ITER} iterations for {failed} windows")
    return U


def _itemsize(xp, X) -> int:
    return xp.finfo(X.dtype).bits // 8


def hrp_layer(X, window=20, stride=1, psi="ser", C=1.0, epsilon=0.1, solver="newton",
              chunk_bytes=None, threads=None):
    """One hierarchical layer: rank-pool each sliding window of X (T, D) -> (n_windows, D').

    Windows are pooled in chunks; numpy runs ``threads`` chunks at a time (default
    :func:`featpipe.backend.worker_threads`), each within ``chunk_bytes / threads``, so the
    working memory stays within ``chunk_bytes`` whatever the core count (at least one window
    per chunk).
    """
    chunk_bytes = memory_budget(chunk_bytes)
    xp = namespace(X)
    T, D = X.shape
    M = min(window, T)
    starts = window_starts(T, window, stride)
    on_cpu = array_is_numpy(X)
    if on_cpu:
        X = np.ascontiguousarray(X)  # one layout for the compiled passes
    threads = (threads or worker_threads()) if on_cpu else 1
    per_chunk = max(1, int(chunk_bytes // threads // window_bytes(M, D, _itemsize(xp, X))))
    nonnegative = all_rows(X, lambda block: block >= 0)  # then every window sum is, too

    def pool_chunk(c):
        return pool_windows(X, starts[c: c + per_chunk], M, stride, psi, C, epsilon, solver,
                            nonnegative)

    chunks = range(0, len(starts), per_chunk)
    threads = min(len(chunks), threads)
    if not on_cpu:
        out = [pool_chunk(c) for c in chunks]
        return out[0] if len(out) == 1 else xp.concat(out, axis=0)
    # chunks write into the output: no second copy of the layer when they are joined
    layer = np.empty((len(starts), psi_dim(psi, D)), dtype=X.dtype)

    def pool_into(c):
        layer[c: c + per_chunk] = pool_chunk(c)

    if threads > 1:  # numpy releases the GIL in its kernels: one chunk per thread at a time
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(pool_into, chunks))
    else:
        for c in chunks:
            pool_into(c)
    return layer


def _work_float(xp, X):
    """float64 for the prefix sums where available (exact enough over long chunks)."""
    try:
        return xp.float64 if xp.isdtype(xp.float64, "real floating") else X.dtype
    except AttributeError:
        return X.dtype


def recursive_layer(X, psi="ser", C=1.0, epsilon=0.1, solver="newton",
                    chunk_bytes=None):
    """x_t' = φ(⟨x_1..x_t⟩), t = 2..J (t = 1 when J = 1): (J, D) -> (max(J−1, 1), D').

    All prefixes share V = L2(ψ(TVM(X))) and its Gram matrix; prefix t uses G[:t, :t].
    """
    chunk_bytes = memory_budget(chunk_bytes)
    xp = namespace(X)
    device = getattr(X, "device", None)
    J = X.shape[0]
    V = normalized_map(time_varying_mean(X), psi)
    ends = list(range(2, J + 1)) if J > 1 else [1]
    if solver == "liblinear":
        refuse_grad(V, what="solver='liblinear'")
        Vn = np.asarray(to_numpy(V), dtype=np.float64)
        U = np.stack([rank_svr_liblinear(Vn[None, :t], C, epsilon)[0] for t in ends])
        return xp.asarray(U.astype(to_numpy(V).dtype), device=device)
    G = gram(V[None, ...])[0, ...]
    out = []
    per_chunk = max(1, int(chunk_bytes // (8 * 4 * J * J)))
    for c in range(0, len(ends), per_chunk):
        lengths = ends[c: c + per_chunk]
        n = lengths[-1]
        Gb = xp.broadcast_to(G[None, :n, :n], (len(lengths), n, n))
        alpha, _ = rank_svr_dual(Gb, C, epsilon, lengths)
        out.append(alpha @ V[:n, :])
    return out[0] if len(out) == 1 else xp.concat(out, axis=0)


# ---------------------------------------------------------------------------------------------
# the batched path (torch, CuPy, array_api_strict): every window of a batch of items at once
#
# The items of a batch are concatenated into one (N, D) array; a window is a list of its row
# numbers (host integers), so the windows of all items are gathered, summed, mapped and
# Gram-multiplied by a few batched operations, and their SVRs are solved by one batched Newton.

#: Bytes per window of the batched Newton solve, per T² (float64 G, the system, its LU, temps).
_SOLVE_BYTES = 8 * 8
#: A length group is cut when its longest window exceeds this multiple of its shortest (+ 8).
_PADDING = 1.25


def _length_groups(lengths, chunk_bytes):
    """Cut windows sorted by length into groups padded to a common length: padding stays
    within :data:`_PADDING` and a group's batched solve within ``chunk_bytes``."""
    groups, start = [], 0
    for i in range(1, len(lengths) + 1):
        if i == len(lengths) or lengths[i] > _PADDING * lengths[start] + 8 or \
                (i + 1 - start) * _SOLVE_BYTES * int(lengths[i]) ** 2 > chunk_bytes:
            groups.append((start, i))
            start = i
    return groups


def _window_sums(X, rows):
    """Running sums of the windows X[rows[w]] (rows: host (n, T)) -> (n, T, D)."""
    xp = namespace(X)
    n, T = rows.shape
    gathered = xp.take(X, xp.asarray(rows.reshape(-1), device=getattr(X, "device", None)),
                       axis=0)
    return xp.cumulative_sum(xp.reshape(gathered, (n, T, X.shape[1])), axis=1)


def rank_pool_rows(X, rows, lengths, psi="ser", C=1.0, epsilon=0.1,
                   chunk_bytes=None, nonnegative=None):
    """Rank-pool the windows X[rows[w, :lengths[w]]] of one (N, D) array -> (W, D').

    ``rows`` (W, T) and ``lengths`` (W,) are host (numpy) integers; entries beyond a window's
    length must be valid row numbers and are ignored.  Windows are sorted by length and cut
    into groups (:func:`_length_groups`); per group, pass 1 forms the Gram matrices of
    ψ(running sums) chunk by chunk (``chunk_bytes`` each), one batched Newton
    (:func:`featpipe.encode.svr.rank_svr_unit_gram`) solves every window, and pass 2 forms
    u = Σ_t β_t ψ(s_t) chunk by chunk (a group that fits in one chunk keeps its ψ parts).  The
    device work is a fixed number of batched operations per chunk and per group, whatever the
    number of windows and items.  Differentiable under torch autograd.
    """
    chunk_bytes = memory_budget(chunk_bytes)
    xp = namespace(X)
    if nonnegative is None:
        nonnegative = bool(xp.all(X >= 0))
    rows, lengths = np.asarray(rows), np.asarray(lengths)
    order = np.argsort(lengths, kind="stable")
    pooled = []
    for start, stop in _length_groups(lengths[order], chunk_bytes):
        group = order[start:stop]
        T = int(lengths[group[-1]])
        per_chunk = max(1, int(chunk_bytes // window_bytes(T, X.shape[1], _itemsize(xp, X))))
        chunks = [group[c: c + per_chunk] for c in range(0, len(group), per_chunk)]
        grams, kept = [], None
        for chunk in chunks:
            parts = psi_parts(_window_sums(X, rows[chunk, :T]), psi, nonnegative)
            grams.append(parts_gram(parts))
            kept = parts if len(chunks) == 1 else None
        short = lengths[group]
        beta = rank_svr_unit_gram(grams[0] if len(grams) == 1 else xp.concat(grams, axis=0),
                                  C, epsilon, None if short[0] == T else short)
        beta = xp.astype(beta, X.dtype)
        for c, chunk in enumerate(chunks):
            parts = kept or psi_parts(_window_sums(X, rows[chunk, :T]), psi, nonnegative)
            first = c * per_chunk
            pooled.append(psi_pool(beta[first: first + len(chunk), ...], parts, psi,
                                   nonnegative))
    U = pooled[0] if len(pooled) == 1 else xp.concat(pooled, axis=0)
    if np.all(order[1:] > order[:-1]):
        return U
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return xp.take(U, xp.asarray(inverse, device=getattr(X, "device", None)), axis=0)


def _offsets(lengths):
    return np.cumsum(lengths) - lengths


def layer_rows(lengths, window, stride):
    """Rows of every sliding window of items of ``lengths`` concatenated: (rows (W, M),
    window lengths (W,), windows per item (B,)); an item shorter than the window gives one
    window covering it (rows past its length repeat its last row)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    M = np.minimum(window, lengths)
    count = (lengths - M) // stride + 1
    item = np.repeat(np.arange(len(lengths)), count)
    step = np.arange(int(count.sum())) - np.repeat(_offsets(count), count)
    first = _offsets(lengths)[item] + stride * step
    t = np.arange(min(window, int(lengths.max())))
    return first[:, None] + np.minimum(t[None, :], M[item][:, None] - 1), M[item], count


def sequence_rows(lengths, offsets=None, reverse=False):
    """Rows of whole items, forward or reversed: (B, max length); item b starts at row
    ``offsets[b]`` (default: the items are concatenated in order)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    offsets = _offsets(lengths) if offsets is None else np.asarray(offsets, dtype=np.int64)
    t = np.minimum(np.arange(int(lengths.max()))[None, :], lengths[:, None] - 1)
    return offsets[:, None] + (lengths[:, None] - 1 - t if reverse else t)


def rank_pool_batch(X, lengths, psi="ssr", C=1.0, epsilon=0.1, directions="both",
                    chunk_bytes=None, offsets=None):
    """Rank pooling of whole items of X (N, D) (``lengths``, ``offsets`` as in
    :func:`sequence_rows`) -> (B, D'), [u_fwd; u_rev] for ``both``: both directions of every
    item in one batched solve."""
    xp = namespace(X)
    names = ("fwd", "rev") if directions == "both" else (directions,)
    rows = np.concatenate([sequence_rows(lengths, offsets, name == "rev") for name in names])
    U = rank_pool_rows(X, rows, np.tile(lengths, len(names)), psi, C, epsilon, chunk_bytes)
    B = len(lengths)
    if len(names) == 1:
        return U
    return xp.concat([U[:B, ...], U[B:, ...]], axis=-1)



def layer_columns(columns, width: int, psi: str) -> np.ndarray:
    """Where the output columns of ψ on ``columns`` (of a ``width``-wide input) sit in the
    output of ψ on the whole input: SER maps column c to c and width + c."""
    return np.concatenate([columns, width + columns]) if psi == "ser" else columns


def used_columns(X, columns, rows: int = 4096):
    """X (T, D) without its all-zero columns, and their positions among ``columns``.

    A column that is zero in every row adds nothing to any running sum, norm or Gram entry,
    and pools to zero (ψ(0) = 0), so leaving it out changes only the rounding order.  HRP on
    non-negative features (ReLU fc6) makes such columns in every layer: the negative half of
    SER is zero, half of each layer's output (measured: the final layer of a 300 × 4096
    sequence 30 -> 19 ms)."""
    used = np.zeros(X.shape[1], dtype=bool)
    for start in range(0, X.shape[0], rows):  # bounded temporaries
        used |= np.any(X[start:start + rows] != 0, axis=0)
    if np.all(used):
        return X, columns
    used[0] |= not used.any()  # an all-zero layer keeps one column
    # compress copies into a contiguous array (row chunks stay contiguous), 5x faster than
    # boolean indexing of the columns (measured on 281 x 8192 float32: 0.7 ms vs 3.4 ms)
    return np.compress(used, X, axis=1), columns[used]



# ---------------------------------------------------------------------------------------------
# whole encoders: a list of validated sequences in, one result per sequence out


def validated_sequences(sequences, device: str, expected_dim: int | None = None) -> list:
    """The sequences as (T, D) real arrays of one dimension (:func:`check_sequence`), or an
    error naming the bad one; ``expected_dim`` is the dimension of a fitted encoder."""
    if isinstance(sequences, np.ndarray) and sequences.ndim == 2:
        raise InputError("expected a list of (T, D) sequences, got one 2-D array; "
                         "wrap it in a list")
    if len(sequences) == 0:
        raise InputError("expected at least one sequence, got none")
    first = check_sequence(sequences[0], 0, device=device)
    dim = first.shape[1]
    if expected_dim is not None and dim != expected_dim:
        raise InputError(f"sequence 0: has {dim} features per frame, the encoder was fitted "
                         f"on {expected_dim}")
    return [first] + [check_sequence(s, i, dim, device)
                      for i, s in enumerate(sequences) if i > 0]


def average_pool_sequences(seqs, *, device):
    return [average_pool(X) for X in seqs]


def max_pool_sequences(seqs, *, device):
    return [max_pool(X) for X in seqs]


def temporal_pyramid_sequences(seqs, *, pool, device):
    return [temporal_pyramid(X, pool) for X in seqs]


def approximate_rank_pool_sequences(seqs, *, device):
    return [approximate_rank_pool(X) for X in seqs]


def rank_pool_sequences(seqs, *, directions, psi, C, epsilon, solver, device, batch_size):
    """Rank pooling of each whole sequence.  numpy: up to ``batch_size`` sequences of the
    same length solved together (no padding, and each window's Gram matrix and Newton steps
    are its own: a sequence gets the same bits alone or in any batch), longer than
    :data:`DENSE_MAX_LENGTH` in the primal; a device (Newton): every sequence in one
    :func:`rank_pool_batch`."""
    if not array_is_numpy(seqs[0]) and solver == "newton":
        return _rank_pool_batched(seqs, directions, psi, C, epsilon, solver)
    out = [None] * len(seqs)
    by_length: dict[int, list[int]] = {}
    for i, X in enumerate(seqs):
        if X.shape[0] > DENSE_MAX_LENGTH:
            out[i] = rank_pool_long(X, psi, C, epsilon, directions, solver)
        else:
            by_length.setdefault(X.shape[0], []).append(i)
    for same in by_length.values():
        for c in range(0, len(same), batch_size):
            group = same[c: c + batch_size]
            if all(compiles(seqs[i], solver) for i in group):  # the sequences, not stacked
                U = pool_sequences([seqs[i] for i in group], psi, C, epsilon, directions)
            else:
                W = namespace(seqs[group[0]]).stack([seqs[i] for i in group], axis=0)
                U = rank_pool_windows(W, psi, C, epsilon, directions, solver)
            for k, i in enumerate(group):
                out[i] = U[k, ...]
    return out


def _rank_pool_batched(seqs, directions, psi, C, epsilon, solver):
    """Device path: every sequence of the call in one :func:`rank_pool_batch` (grouped by
    length and memory there, not by ``batch_size``, which sizes the CPU path's batches)."""
    xp = namespace(seqs[0])
    lengths = np.asarray([X.shape[0] for X in seqs])
    dense = np.flatnonzero(lengths <= DENSE_MAX_LENGTH)
    out = [None] * len(seqs)
    if dense.size:
        X = xp.concat([seqs[i] for i in dense], axis=0) if dense.size > 1 else seqs[dense[0]]
        U = to_numpy(rank_pool_batch(X, lengths[dense], psi, C, epsilon, directions))
        for k, i in enumerate(dense):
            out[i] = U[k]
    for i in np.flatnonzero(lengths > DENSE_MAX_LENGTH):
        out[i] = rank_pool_long(seqs[i], psi, C, epsilon, directions, solver)
    return out


class _Layers:
    """The layers of ``hrp`` (sliding windows) or ``recursive`` (prefixes), with the final
    rank pooling they share."""

    def __init__(self, window, stride, depth, psi, C, epsilon, directions, solver, emit_layer,
                 chunk_bytes, recursive):
        self.window, self.stride, self.depth = window, stride, depth
        self.psi, self.C, self.epsilon = psi, C, epsilon
        self.directions, self.solver = directions, solver
        self.emit_layer, self.chunk_bytes, self.recursive = emit_layer, chunk_bytes, recursive

    def layer(self, X):
        if self.recursive:
            return recursive_layer(X, self.psi, self.C, self.epsilon, self.solver,
                                   self.chunk_bytes)
        return hrp_layer(X, self.window, self.stride, self.psi, self.C, self.epsilon,
                         self.solver, self.chunk_bytes)

    def layer_batch(self, X, lengths):
        """One layer on items concatenated in X with ``lengths`` -> (next X, next lengths)."""
        if self.recursive:
            offsets = _offsets(lengths)
            out = [self.layer(X[int(o): int(o + n), ...])
                   for o, n in zip(offsets, lengths, strict=True)]
            return namespace(X).concat(out, axis=0), np.asarray([Y.shape[0] for Y in out])
        rows, window_lengths, count = layer_rows(lengths, self.window, self.stride)
        return rank_pool_rows(X, rows, window_lengths, self.psi, self.C, self.epsilon,
                              self.chunk_bytes), count

    def encode_batched(self, seqs):
        """Device path: the items concatenated, each layer's windows of all items pooled by
        :func:`rank_pool_rows`, the final layer of all items by :func:`rank_pool_batch`;
        returns host (numpy) results, one per item."""
        xp = namespace(seqs[0])
        lengths = np.asarray([X.shape[0] for X in seqs])
        X = xp.concat(seqs, axis=0) if len(seqs) > 1 else seqs[0]
        last = self.depth if self.emit_layer is None else self.emit_layer
        for _ in range(last - 1):
            X, lengths = self.layer_batch(X, lengths)
        offsets = _offsets(lengths)
        if self.emit_layer is not None:
            return np.split(np.asarray(to_numpy(X)), offsets[1:])
        out = [None] * len(lengths)
        dense = np.flatnonzero(lengths <= DENSE_MAX_LENGTH)
        if dense.size:
            U = to_numpy(rank_pool_batch(X, lengths[dense], self.psi, self.C, self.epsilon,
                                         self.directions, self.chunk_bytes, offsets[dense]))
            for k, i in enumerate(dense):
                out[i] = U[k]
        for i in np.flatnonzero(lengths > DENSE_MAX_LENGTH):
            part = X[int(offsets[i]): int(offsets[i] + lengths[i]), ...]
            out[i] = to_numpy(rank_pool_long(part, self.psi, self.C, self.epsilon,
                                             self.directions, self.solver))
        return out

    def encode_one(self, X):
        if not array_is_numpy(X):
            return self.encode_layers(X)
        # windows run one chunk per core (see hrp_layer); BLAS stays single-threaded, which
        # is also faster for the final layer's small products (measured: 0.12 s vs 0.16 s per
        # 300 × 4096 sequence on 2 cores)
        with single_threaded_blas():
            return self.encode_layers(X)

    def encode_layers(self, X):
        last = self.depth if self.emit_layer is None else self.emit_layer
        if self.emit_layer is not None or not array_is_numpy(X) or self.solver != "newton":
            for _ in range(last - 1):
                X = self.layer(X)
            return X if self.emit_layer is not None else self.final(X)
        # numpy: each layer's all-zero columns are left out of the next (exact, see
        # used_columns); ``columns`` says where X's columns sit in the full-width layer.
        # Not before the primal solver of a long final layer: its float32 Newton-CG run time
        # depends on rounding (measured on 19,981 × 8,192: 45 s as is, 318 s compacted)
        width, columns = X.shape[1], np.arange(X.shape[1])
        for layer in range(1, last):
            X = self.layer(X)
            columns, width = layer_columns(columns, width, self.psi), psi_dim(self.psi, width)
            if layer < last - 1 or X.shape[0] <= DENSE_MAX_LENGTH:
                X, columns = used_columns(X, columns)
        u = np.asarray(self.final(X))
        if X.shape[1] == width:
            return u
        full = np.zeros(u.shape[0] // X.shape[1] * width, dtype=u.dtype)
        blocks = u.shape[0] // psi_dim(self.psi, X.shape[1])
        full[np.concatenate([b * psi_dim(self.psi, width) + layer_columns(columns, width, self.psi)
                             for b in range(blocks)])] = u
        return full

    def final(self, X):
        if X.shape[0] > DENSE_MAX_LENGTH:
            return rank_pool_long(X, self.psi, self.C, self.epsilon, self.directions,
                                  self.solver)
        return rank_pool_windows(X[None, ...], self.psi, self.C, self.epsilon,
                                 self.directions, self.solver)[0, ...]


def hierarchical_rank_pool_sequences(seqs, *, window, stride, depth, psi, C, epsilon,
                                     directions, solver, device, emit_layer, chunk_bytes,
                                     recursive=False):
    """``hrp`` (``recursive=False``: sliding windows of ``window`` rows, ``stride`` apart) or
    ``recursive`` (every prefix; ``window`` and ``stride`` unused) of each sequence: the final
    vector, or with ``emit_layer`` the sequence X^(emit_layer) (numpy arrays then)."""
    layers = _Layers(window, stride, depth, psi, C, epsilon, directions, solver, emit_layer,
                     chunk_bytes, recursive)
    if not array_is_numpy(seqs[0]) and solver == "newton":
        return layers.encode_batched(seqs)
    out = [layers.encode_one(X) for X in seqs]
    return out if emit_layer is None else [np.asarray(to_numpy(Y)) for Y in out]


def recursive_rank_pool_sequences(seqs, *, depth, psi, C, epsilon, directions, solver, device,
                                  emit_layer, chunk_bytes):
    return hierarchical_rank_pool_sequences(
        seqs, window=1, stride=1, depth=depth, psi=psi, C=C, epsilon=epsilon,
        directions=directions, solver=solver, device=device, emit_layer=emit_layer,
        chunk_bytes=chunk_bytes, recursive=True)


def check_rank_pooling_rules(params: Mapping[str, object]) -> None:
    """The rules between rank-pooling parameters (``params`` may hold some of them): the
    liblinear solver runs on the CPU only; ``emit_layer`` ≤ ``depth``; with psi ser, a depth
    whose vectors fit in this machine's memory (:func:`check_ser_depth_fits`)."""
    if params.get("solver") == "liblinear" and params.get("device", "cpu") != "cpu":
        raise ParameterError("solver", "liblinear runs on the CPU only; use device cpu")
    emit, depth = params.get("emit_layer"), params.get("depth")
    if emit is not None and depth is not None and emit > depth:
        raise ParameterError("emit_layer", f"must be between 1 and depth={depth}, got {emit}")
    if depth is not None and params.get("psi") == "ser":
        check_ser_depth_fits(depth, emit)


def check_ser_depth_fits(depth: int, emit: int | None) -> None:
    """SER doubles the dimension at every layer, so an item's vector has 2^layers times
    its input's values (ψ applied ``depth`` times, ``emit_layer`` − 1 for a layer's
    sequence): refuse, before anything is computed, a depth whose vectors exceed this
    machine's memory even for a one-dimensional input."""
    layers = depth if emit is None else emit - 1
    need, memory = 4 * 2 ** layers, memory_bytes()  # float32 values
    if need > memory:
        most = (memory // 4).bit_length() - 1
        raise ParameterError("depth", f"{depth} with psi ser doubles the dimension {layers} "
                             f"times: each item's vector needs {human_bytes(need)} per "
                             f"input feature, more than this machine's memory "
                             f"({human_bytes(memory)}); use depth <= {most} (fewer for "
                             "wide inputs) or psi ssr")


# ---------------------------------------------------------------------------------------------
# featpipe encode --method ...


def _items_per_call(cpu: int, cuda: int):
    """Items per ``encode_batch`` call: the CPU path threads within an item, the device path
    pools all windows of the call's items at once (memory bounded by the chunk budget)."""
    return lambda params: cuda if params.get("device") == "cuda" else cpu


def _core(function, batch_size=16, rules=None) -> EncodeFunction:
    return EncodeFunction(function, validated_sequences, batch_size, rules, POOLS_TIME)


#: each method's function, items per call and rules (its parameters: the estimators')
ENCODE_FUNCTIONS: dict[str, EncodeFunction] = {
    "avg": _core(average_pool_sequences),
    "max": _core(max_pool_sequences),
    "tpyramid": _core(temporal_pyramid_sequences),
    "arp": _core(approximate_rank_pool_sequences),
    "rankpool": _core(rank_pool_sequences, _items_per_call(64, 256), check_rank_pooling_rules),
    "hrp": _core(hierarchical_rank_pool_sequences, _items_per_call(1, 32),
                 check_rank_pooling_rules),
    "recursive": _core(recursive_rank_pool_sequences, _items_per_call(1, 32),
                       check_rank_pooling_rules),
}
