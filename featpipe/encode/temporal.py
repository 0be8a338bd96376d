"""Temporal encoders: one vector per sequence of per-frame features (DESIGN.md section 4).

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

Each encoder is a scikit-learn transformer (``BaseEstimator``, ``_parameter_constraints``)
over a list of (T_i, D) sequences and a ``featpipe encode --method`` value whose options are
generated from the class (:mod:`featpipe.parameters`).  Numerics go through the array API:
``device="cuda"`` runs on CuPy or torch when a GPU is present and raises a clear error when
not.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils._param_validation import Interval, StrOptions

from featpipe.backend import device_namespace, namespace, to_numpy
from featpipe.encode.maps import (
    PSI_MAPS,
    apply_psi,
    l2_normalize,
    normalized_map,
    psi_dim,
    running_sum,
    time_varying_mean,
)
from featpipe.encode.registry import EncodeMethod, estimator_builder
from featpipe.encode.svr import (
    gram,
    rank_svr_dual,
    rank_svr_liblinear,
    rank_svr_primal,
    rank_svr_unit,
    rank_svr_unit_gram,
)
from featpipe.errors import InputError, ParameterError
from featpipe.parameters import ValidatedEstimator, estimator_parameters

SOLVERS = ("newton", "liblinear")
DIRECTIONS = ("fwd", "rev", "both")
#: Working memory for one chunk of windows (their mapped vectors), in bytes.
DEFAULT_CHUNK_BYTES = 64 * 2**20
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
    if not bool(xp.all(xp.isfinite(X))):
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
    W[b, :lengths[b]] (zero-padded beyond).
    """
    parts = []
    nonnegative = bool(namespace(W).all(W >= 0)) if psi != "none" else None
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
    if psi == "ser" and solver == "newton":
        if nonnegative is None:
            nonnegative = bool(xp.all(S >= 0))
        return _rank_pool_sums_ser(S, C, epsilon, lengths, nonnegative)
    # SSR of non-negative sums is their square root (one pass instead of three)
    V = xp.sqrt(S) if psi == "ssr" and nonnegative else apply_psi(S, psi)
    if lengths is not None:
        device = getattr(S, "device", None)
        mask = xp.arange(S.shape[1], device=device)[None, :] < \
            xp.asarray([int(n) for n in lengths], device=device)[:, None]
        V = V * xp.astype(mask, V.dtype)[:, :, None]
    if solver == "newton":
        return rank_svr_unit(V, C, epsilon, lengths)
    Vn = np.asarray(to_numpy(l2_normalize(V)), dtype=np.float64)
    U = np.zeros((Vn.shape[0], Vn.shape[2]))
    for b in range(Vn.shape[0]):
        T = Vn.shape[1] if lengths is None else int(lengths[b])
        U[b] = rank_svr_liblinear(Vn[b:b + 1, :T], C, epsilon)[0]
    return xp.asarray(U.astype(to_numpy(V).dtype), device=getattr(S, "device", None))


def rank_pool_long(X, psi="ser", C=1.0, epsilon=0.1, directions="fwd", solver="newton",
                   chunk_bytes=DEFAULT_CHUNK_BYTES):
    """Rank-pool one long sequence X (T, D) without its T×T Gram matrix: the vectors
    L2(ψ(TVM(X))) are built in row chunks (running sums carried across chunks) and the SVR is
    solved in the primal by :func:`featpipe.encode.svr.rank_svr_primal`."""
    xp = namespace(X)
    device = getattr(X, "device", None)
    T, D = X.shape
    work = _work_float(xp, X)
    rows = max(1, int(chunk_bytes // max(1, 4 * psi_dim(psi, D) * 8)))
    parts = []
    for direction in (("fwd", "rev") if directions == "both" else (directions,)):
        Xd = X if direction == "fwd" else xp.flip(X, axis=0)
        carry = xp.zeros((1, D), dtype=work, device=device)
        chunks = []
        for start in range(0, T, rows):
            sums = carry + xp.cumulative_sum(xp.astype(Xd[start: min(start + rows, T), ...], work),
                                             axis=0)
            carry = sums[-1:, ...]
            counts = xp.astype(xp.arange(start + 1, start + sums.shape[0] + 1, device=device),
                               work)
            smoothed = xp.astype(sums / counts[:, None], X.dtype)
            chunks.append(SerRows.from_smoothed(smoothed) if psi == "ser" and solver == "newton"
                          else normalized_map(smoothed, psi))
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


def _rank_pool_sums_ser(S, C, epsilon, lengths, nonnegative):
    """SER without forming it: with R = √|S| and Q = sign(S)·R, SER(S) = [(R+Q)/2, (R−Q)/2],
    whose Gram matrix is (R Rᵀ + Q Qᵀ)/2; three passes over S instead of eight and a concat.
    For non-negative S (sums of ReLU features such as VGG fc6) Q = R and the negative half of
    SER is zero, so one Gram product suffices.
    Padded rows (beyond ``lengths``) never become active, so their coefficients are zero."""
    xp = namespace(S)
    if nonnegative:
        R = xp.sqrt(S)
        beta = rank_svr_unit_gram(gram(R), C, epsilon, lengths)
        uR = (xp.astype(beta, S.dtype)[:, None, :] @ R)[:, 0, :]
        return xp.concat([uR, xp.zeros_like(uR)], axis=-1)
    R = xp.sqrt(xp.abs(S))
    Q = xp.copysign(R, S)
    beta = rank_svr_unit_gram(0.5 * (gram(R) + gram(Q)), C, epsilon, lengths)
    beta = xp.astype(beta, S.dtype)[:, None, :]
    uR, uQ = (beta @ R)[:, 0, :], (beta @ Q)[:, 0, :]
    return xp.concat([0.5 * (uR + uQ), 0.5 * (uR - uQ)], axis=-1)


def window_starts(T: int, window: int, stride: int) -> list[int]:
    """Starts of the windows of min(window, T) elements, stride apart (one if T < window)."""
    M = min(window, T)
    return list(range(0, T - M + 1, stride))


def _chunk_size(M: int, dim: int, itemsize: int, chunk_bytes: int) -> int:
    # the window copy, its TVM, ψ and L2 outputs: about 4 arrays of M × ψ-dim per window
    return max(1, int(chunk_bytes // max(1, 4 * M * dim * itemsize)))


def hrp_layer(X, window=20, stride=1, psi="ser", C=1.0, epsilon=0.1, solver="newton",
              chunk_bytes=DEFAULT_CHUNK_BYTES):
    """One hierarchical layer: rank-pool each sliding window of X (T, D) -> (n_windows, D')."""
    xp = namespace(X)
    device = getattr(X, "device", None)
    T, D = X.shape
    M = min(window, T)
    starts = window_starts(T, window, stride)
    per_chunk = _chunk_size(M, psi_dim(psi, D), 4, chunk_bytes)
    nonnegative = bool(xp.all(X >= 0))  # then every window sum is, too

    def pool_chunk(c):
        first = xp.asarray(starts[c: c + per_chunk], device=device)
        # running sums of every window of the chunk, one time step at a time
        sums = [xp.take(X, first, axis=0)]
        for t in range(1, M):
            sums.append(sums[-1] + xp.take(X, first + t, axis=0))
        return rank_pool_sums(xp.stack(sums, axis=1), psi, C, epsilon, solver,
                              nonnegative=nonnegative)

    chunks = range(0, len(starts), per_chunk)
    threads = min(len(chunks), os.cpu_count() or 1) if array_is_numpy(X) else 1
    if threads > 1:  # numpy releases the GIL in its kernels: one chunk per core at a time
        with ThreadPoolExecutor(threads) as pool:
            out = list(pool.map(pool_chunk, chunks))
    else:
        out = [pool_chunk(c) for c in chunks]
    return out[0] if len(out) == 1 else xp.concat(out, axis=0)


def _work_float(xp, X):
    """float64 for the prefix sums where available (exact enough over long chunks)."""
    try:
        return xp.float64 if xp.isdtype(xp.float64, "real floating") else X.dtype
    except AttributeError:
        return X.dtype


def recursive_layer(X, psi="ser", C=1.0, epsilon=0.1, solver="newton",
                    chunk_bytes=DEFAULT_CHUNK_BYTES):
    """x_t' = φ(⟨x_1..x_t⟩), t = 2..J (t = 1 when J = 1): (J, D) -> (max(J−1, 1), D').

    All prefixes share V = L2(ψ(TVM(X))) and its Gram matrix; prefix t uses G[:t, :t].
    """
    xp = namespace(X)
    device = getattr(X, "device", None)
    J = X.shape[0]
    V = normalized_map(time_varying_mean(X), psi)
    ends = list(range(2, J + 1)) if J > 1 else [1]
    if solver == "liblinear":
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
# transformers

_DEVICE = [StrOptions({"cpu", "cuda"})]
_POSITIVE_INT = [Interval(Integral, 1, None, closed="left")]


class TemporalEncoder(ValidatedEstimator, TransformerMixin, BaseEstimator):
    """Base of the temporal encoders: a scikit-learn transformer over a list of (T_i, D)
    sequences (numpy, torch or CuPy arrays).  ``fit`` only records the dimension.

    Parameters
    ----------
    device : {"cpu", "cuda"}
        Where to encode: cpu (numpy), or cuda (CuPy or torch; fails clearly without a GPU).
    """

    _parameter_constraints = {"device": _DEVICE}

    def fit(self, sequences, y=None):
        seqs = self._validated(sequences)
        self.n_features_in_ = seqs[0].shape[1]
        return self

    def transform(self, sequences):
        """Encode each sequence; returns an (n, dim) numpy array in the inputs' float dtype."""
        seqs = self._validated(sequences)
        encoded = self._encode_all(seqs)
        return np.stack([np.asarray(to_numpy(e)) for e in encoded])

    def _validated(self, sequences):
        self._validate_params()
        if isinstance(sequences, np.ndarray) and sequences.ndim == 2:
            raise InputError("expected a list of (T, D) sequences, got one 2-D array; "
                             "wrap it in a list")
        if len(sequences) == 0:
            raise InputError("expected at least one sequence, got none")
        first = check_sequence(sequences[0], 0, device=self.device)
        dim = first.shape[1]
        expected = getattr(self, "n_features_in_", None)
        if expected is not None and dim != expected:
            raise InputError(f"sequence 0: has {dim} features per frame, the encoder was fitted "
                             f"on {expected}")
        return [first] + [check_sequence(s, i, dim, self.device)
                          for i, s in enumerate(sequences) if i > 0]

    def _encode_all(self, seqs):
        return [self._encode_one(X) for X in seqs]


class _DeviceOnly(TemporalEncoder):
    """An encoder whose only parameter is the device."""

    def __init__(self, device="cpu"):
        self.device = device


class AveragePooling(_DeviceOnly):
    """Mean over time."""

    def _encode_one(self, X):
        return average_pool(X)


class MaxPooling(_DeviceOnly):
    """Maximum over time."""

    def _encode_one(self, X):
        return max_pool(X)


class TemporalPyramid(TemporalEncoder):
    """Two-level temporal pyramid: [pool(X); pool(first half); pool(second half)], 3·D.

    Parameters
    ----------
    pool : {"avg", "max"}
        Pooling in each cell of the pyramid.
    """

    _parameter_constraints = {**TemporalEncoder._parameter_constraints,
                              "pool": [StrOptions({"avg", "max"})]}

    def __init__(self, pool="avg", device="cpu"):
        self.pool = pool
        self.device = device

    def _encode_one(self, X):
        return temporal_pyramid(X, self.pool)


class ApproximateRankPooling(_DeviceOnly):
    """Dynamic-image coefficients on the raw frames: d = Σ_t α_t x_t (Bilen et al. CVPR'16)."""

    def _encode_one(self, X):
        return approximate_rank_pool(X)


class _RankPoolingParams(TemporalEncoder):
    """The SVR parameters every rank-pooling encoder shares.

    Parameters
    ----------
    psi : {"none", "ssr", "ser"}
        Map ψ applied to the time-varying mean before the SVR.
    C : float
        SVR cost (liblinear ``-c``; the HRP paper writes C/2).
    epsilon : float
        SVR insensitivity ε (liblinear ``-p``).
    directions : {"fwd", "rev", "both"}
        Rank-pool the sequence forward, reversed, or both concatenated (the final layer of
        hrp and recursive).
    solver : {"newton", "liblinear"}
        SVR solver: featpipe's exact batched Newton, or per-window liblinear (the reference).
    """

    _parameter_constraints = {
        **TemporalEncoder._parameter_constraints,
        "psi": [StrOptions(set(PSI_MAPS))],
        "C": [Interval(Real, 0, None, closed="neither")],
        "epsilon": [Interval(Real, 0, None, closed="left")],
        "directions": [StrOptions(set(DIRECTIONS))],
        "solver": [StrOptions(set(SOLVERS))],
    }

    @classmethod
    def _check_param_rules(cls, params):
        if params.get("solver") == "liblinear" and params.get("device", "cpu") != "cpu":
            raise ParameterError("solver", "liblinear runs on the CPU only; use device cpu")


class RankPooling(_RankPoolingParams):
    """Rank pooling of the whole sequence: u* of the SVR on L2(ψ(TVM(X))) (VideoDarwin).

    Sequences are solved ``batch_size`` at a time (sorted by length; shorter ones zero-padded
    and masked); small batches keep the working set in cache.

    Parameters
    ----------
    batch_size : int
        Sequences solved together.
    """

    _parameter_constraints = {**_RankPoolingParams._parameter_constraints,
                              "batch_size": _POSITIVE_INT}

    def __init__(self, directions="both", psi="ssr", C=1.0, epsilon=0.1, solver="newton",
                 device="cpu", batch_size=8):
        self.directions = directions
        self.psi = psi
        self.C = C
        self.epsilon = epsilon
        self.solver = solver
        self.device = device
        self.batch_size = batch_size

    def _encode_all(self, seqs):
        out = [None] * len(seqs)
        for i, X in enumerate(seqs):
            if X.shape[0] > DENSE_MAX_LENGTH:
                out[i] = rank_pool_long(X, self.psi, self.C, self.epsilon, self.directions,
                                        self.solver)
        order = sorted((i for i in range(len(seqs)) if out[i] is None),
                       key=lambda i: seqs[i].shape[0])
        for c in range(0, len(order), self.batch_size):
            group = order[c: c + self.batch_size]
            lengths = [seqs[i].shape[0] for i in group]
            T = max(lengths)
            xp = namespace(seqs[group[0]])
            padded = []
            for i in group:
                X = seqs[i]
                if X.shape[0] < T:
                    pad = xp.zeros((T - X.shape[0], X.shape[1]), dtype=X.dtype,
                                   device=getattr(X, "device", None))
                    X = xp.concat([X, pad], axis=0)
                padded.append(X)
            W = xp.stack(padded, axis=0)
            U = rank_pool_windows(W, self.psi, self.C, self.epsilon, self.directions,
                                  self.solver, None if min(lengths) == T else lengths)
            for k, i in enumerate(group):
                out[i] = U[k, ...]
        return out


class HierarchicalRankPooling(_RankPoolingParams):
    """Hierarchical rank pooling (Fernando et al. CVPR'16): depth−1 sliding-window layers,
    then rank pooling of the whole last sequence.

    Parameters
    ----------
    window : int
        Window length M of each sliding-window layer (a shorter sequence is one window).
    stride : int
        Stride S between windows.
    depth : int
        Number of layers L (depth − 1 sliding-window layers, then the final one).
    emit_layer : int or None
        Return the sequence X^(ℓ) of layer ℓ (1 = the input, depth = the sequence the final
        layer pools) instead of the final vector.
    chunk_bytes : int
        Working memory for one chunk of layer-1 windows, in bytes.
    """

    _parameter_constraints = {**_RankPoolingParams._parameter_constraints,
                              "window": _POSITIVE_INT, "stride": _POSITIVE_INT,
                              "depth": _POSITIVE_INT, "emit_layer": [*_POSITIVE_INT, None],
                              "chunk_bytes": _POSITIVE_INT}

    def __init__(self, window=20, stride=1, depth=2, psi="ser", C=1.0, epsilon=0.1,
                 directions="fwd", solver="newton", device="cpu", emit_layer=None,
                 chunk_bytes=DEFAULT_CHUNK_BYTES):
        self.window = window
        self.stride = stride
        self.depth = depth
        self.psi = psi
        self.C = C
        self.epsilon = epsilon
        self.directions = directions
        self.solver = solver
        self.device = device
        self.emit_layer = emit_layer
        self.chunk_bytes = chunk_bytes

    @classmethod
    def _check_param_rules(cls, params):
        super()._check_param_rules(params)
        emit, depth = params.get("emit_layer"), params.get("depth")
        if emit is not None and depth is not None and emit > depth:
            raise ParameterError("emit_layer", f"must be between 1 and depth={depth}, got "
                                 f"{emit}")

    def transform(self, sequences):
        if self.emit_layer is None:
            return super().transform(sequences)
        raise InputError("emit_layer is set: use transform_sequences(), which returns one "
                         "(T_i, D) array per input")

    def transform_sequences(self, sequences):
        """The layer-``emit_layer`` sequence of each input (a list of numpy arrays)."""
        seqs = self._validated(sequences)
        return [np.asarray(to_numpy(self._encode_one(X))) for X in seqs]

    def _layer(self, X):
        return hrp_layer(X, self.window, self.stride, self.psi, self.C, self.epsilon,
                         self.solver, self.chunk_bytes)

    def _encode_one(self, X):
        if not array_is_numpy(X):
            return self._encode_layers(X)
        # windows run one chunk per core (see hrp_layer); BLAS stays single-threaded, which
        # is also faster for the final layer's small products (measured: 0.12 s vs 0.16 s per
        # 300 × 4096 sequence on 2 cores)
        from threadpoolctl import threadpool_limits

        with threadpool_limits(1):
            return self._encode_layers(X)

    def _encode_layers(self, X):
        last = self.depth if self.emit_layer is None else self.emit_layer
        for _ in range(last - 1):
            X = self._layer(X)
        if self.emit_layer is not None:
            return X
        if X.shape[0] > DENSE_MAX_LENGTH:
            return rank_pool_long(X, self.psi, self.C, self.epsilon, self.directions,
                                  self.solver, self.chunk_bytes)
        return rank_pool_windows(X[None, ...], self.psi, self.C, self.epsilon,
                                 self.directions, self.solver)[0, ...]


class RecursiveRankPooling(HierarchicalRankPooling):
    """Recursive rank pooling: each layer rank-pools every prefix of its input; the final
    layer rank-pools the whole last sequence."""

    def __init__(self, depth=2, psi="ser", C=1.0, epsilon=0.1, directions="fwd",
                 solver="newton", device="cpu", emit_layer=None,
                 chunk_bytes=DEFAULT_CHUNK_BYTES):
        self.depth = depth
        self.psi = psi
        self.C = C
        self.epsilon = epsilon
        self.directions = directions
        self.solver = solver
        self.device = device
        self.emit_layer = emit_layer
        self.chunk_bytes = chunk_bytes

    window = 1
    stride = 1

    def _layer(self, X):
        return recursive_layer(X, self.psi, self.C, self.epsilon, self.solver,
                               self.chunk_bytes)


# ---------------------------------------------------------------------------------------------
# featpipe encode --method ...


def _method(name: str, summary: str, cls, batch_size: int = 16) -> EncodeMethod:
    return EncodeMethod(name, summary, estimator_builder(cls),
                        estimator_parameters(cls, exclude=("chunk_bytes", "batch_size")),
                        batch_size)


ENCODE_METHODS = [
    _method("avg", "average over time", AveragePooling),
    _method("max", "maximum over time", MaxPooling),
    _method("tpyramid", "temporal pyramid: whole + halves (--pool avg|max)", TemporalPyramid),
    _method("arp", "approximate rank pooling (dynamic image coefficients)",
            ApproximateRankPooling),
    _method("rankpool", "rank pooling, VideoDarwin (--directions both)", RankPooling,
            batch_size=64),
    _method("hrp", "hierarchical rank pooling (--window --stride --depth --psi)",
            HierarchicalRankPooling, batch_size=1),
    _method("recursive", "recursive rank pooling (--depth --psi)", RecursiveRankPooling,
            batch_size=1),
]
