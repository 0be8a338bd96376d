"""Second-order pooling of local features: bilinear, covariance and compact bilinear encoders.

An item is a set of local features F ∈ R^{N×D} (VGG-16 conv5_3 positions, dense SIFT).

Pooling
    bilinear    B = FᵀF / N                                    (Lin et al., ICCV'15)
    cov         Σ = (F − 1μᵀ)ᵀ(F − 1μᵀ) / N                       (iSQRT-COV, Li et al., CVPR'18)
    cbp-ts      φ = (1/N) Σ_n FFT⁻¹(FFT(C₁x_n) ∘ FFT(C₂x_n)),  C_k count sketches D → d
    cbp-rm      φ = (1/N) Σ_n (1/√d)(W₁x_n) ∘ (W₂x_n),       W_k ∈ {±1}^{d×D}
                (both compact bilinear pooling, Gao et al., CVPR'16; E⟨φ(x), φ(y)⟩ = ⟨x, y⟩²)

Normalisations (``norm``)
    none    nothing
    ssr     element-wise sign(z)·√|z| of the pooled vector
    sqrtm   matrix square root by eigendecomposition, U diag(√λ) Uᵀ; for compact methods the
            SVD F = U S Vᵀ gives rows F' = √r · diag(√(S/√N)) Vᵀ with F'ᵀF'/r = (FᵀF/N)^{1/2},
            which are then sketched (r = min(N, D))
    ns      iSQRT-COV Newton–Schulz: A = M / tr(M); Y₀ = A, Z₀ = I;
            T_k = ½(3I − Z_{k−1}Y_{k−1}), Y_k = Y_{k−1}T_k, Z_k = T_k Z_{k−1};  output √tr(M)·Y_K
            (the truncated iteration is reproduced as published; it is not an exact square root)
    logm    log-Euclidean U diag(log max(λ, ε·λ_max)) Uᵀ (zero matrix when M = 0)
    run     RUN rank-1 update (Yu, Cai, Li, ECCV'20, Algorithm 3): K power iterations
            v ← Fᵀ(F v) from a seeded Gaussian v₀, F_K = F − η F v vᵀ / ‖v‖², then pool F_K;
            also before compact pooling.  Defaults K = 2, η = 0.6.  For bilinear/cov the same
            result is computed on the pooled matrix, (I − ηuuᵀ)M(I − ηuuᵀ), u = v/‖v‖, with
            v ← M v (same direction as Fᵀ(F v)): O(K D²) after pooling.

Matrix outputs (bilinear, cov) are vectorised by their upper triangle (diagonal included, no √2
on off-diagonal entries, as iSQRT-COV), D(D+1)/2 values.  Then optional element-wise SSR
(``post_ssr``) and L2 (``l2``, default on; a zero vector stays zero).

Every function takes its array namespace from its input (numpy, torch, CuPy, array_api_strict)
and works on a stack (..., N, D), so a GPU pools a batch of images in one call; torch autograd
differentiates ``newton_schulz_sqrtm`` and ``rank1_update`` directly.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from numbers import Integral, Real

import array_api_compat
import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils._param_validation import Interval, StrOptions

from featpipe.backend import device_namespace, namespace, to_numpy
from featpipe.encode.maps import l2_normalize, signed_square_root
from featpipe.encode.registry import EncodeMethod
from featpipe.errors import InputError, ParameterError
from featpipe.item_kinds import SECOND_ORDER
from featpipe.items import Frame, ItemSink, PerFrameStream, encode_per_frame
from featpipe.parameters import ValidatedEstimator, estimator_parameters

POOLINGS = ("bilinear", "cov", "cbp-ts", "cbp-rm")
MATRIX_POOLINGS = ("bilinear", "cov")
NORMS = ("none", "ssr", "sqrtm", "ns", "logm", "run")
COMPACT_NORMS = ("none", "ssr", "sqrtm", "run")
#: Elements per chunk of the (images, N, d) intermediate of compact pooling.
_CHUNK_ELEMENTS = 1 << 25


# -- pooling ----------------------------------------------------------------------------------
def bilinear_pool(F):
    """B = FᵀF / N for a stack F (..., N, D) -> (..., D, D)."""
    xp = namespace(F)
    return xp.matrix_transpose(F) @ F / F.shape[-2]


def triu_vectorise(M):
    """Upper triangle (diagonal included) of (..., D, D), row by row -> (..., D(D+1)/2)."""
    xp = namespace(M)
    D = M.shape[-1]
    rows, cols = np.triu_indices(D)
    index = xp.asarray(rows * D + cols, device=array_api_compat.device(M))
    return xp.take(xp.reshape(M, (*M.shape[:-2], D * D)), index, axis=-1)


# -- matrix normalisations --------------------------------------------------------------------
def _trace(M):
    xp = namespace(M)
    return xp.sum(xp.linalg.diagonal(M), axis=-1)[..., None, None]


def sqrtm_eigh(M):
    """Principal square root of symmetric PSD (..., D, D): U diag(√max(λ, 0)) Uᵀ.

    Decomposed in float64 whatever M's precision (result in M's dtype): a float32
    eigendecomposition of a singular M (rank < D) gives its zero eigenvalues as ±u·λ_max
    noise, whose square roots (√u ≈ 2.4e-4 relative) were 3.4e-4 from scipy.linalg.sqrtm."""
    xp = namespace(M)
    lam, U = xp.linalg.eigh(xp.astype(M, xp.float64))
    lam = xp.sqrt(xp.clip(lam, 0.0, None))
    return xp.astype((U * lam[..., None, :]) @ xp.matrix_transpose(U), M.dtype)


def logm_eigh(M, eps: float = 1e-6):
    """Log-Euclidean map U diag(log max(λ, ε·λ_max)) Uᵀ; a zero matrix maps to zero."""
    xp = namespace(M)
    lam, U = xp.linalg.eigh(M)
    top = xp.max(lam, axis=-1, keepdims=True)
    positive = top > 0
    floor = xp.where(positive, eps * top, xp.ones_like(top))
    lam = xp.where(positive, xp.log(xp.maximum(lam, floor)), xp.zeros_like(lam))
    return (U * lam[..., None, :]) @ xp.matrix_transpose(U)


def newton_schulz_sqrtm(M, n_iter: int = 5):
    """iSQRT-COV (Li, Xie, Wang, Gao, CVPR'18, eq. 4–6): trace pre-normalisation, ``n_iter``
    coupled Newton–Schulz iterations, √tr post-compensation.

    A = M/tr(M), Y₀ = A, Z₀ = I; T_k = ½(3I − Z_{k−1}Y_{k−1}), Y_k = Y_{k−1}T_k,
    Z_k = T_k Z_{k−1}; returns √tr(M)·Y_{n_iter}.  Only matrix products, so it runs batched on
    a GPU and torch autograd differentiates it.  A zero matrix maps to zero.
    """
    if int(n_iter) < 1:
        raise ParameterError("n_iter", f"must be >= 1, got {n_iter}")
    xp = namespace(M)
    eye = xp.eye(M.shape[-1], dtype=M.dtype, device=array_api_compat.device(M))
    tr = _trace(M)
    tr = xp.where(tr > 0, tr, xp.ones_like(tr))
    Y, Z = M / tr, eye
    for k in range(int(n_iter)):
        T = 0.5 * (3.0 * eye - Z @ Y)
        if k + 1 < n_iter:
            Z = T @ Z
        Y = Y @ T
    return Y * xp.sqrt(tr)


def gaussian_start(n_features: int, seed: int, dtype=np.float64) -> np.ndarray:
    """The seeded Gaussian v₀ ∈ R^D of RUN (one vector shared by all items, so an item's code
    does not depend on the batch it was computed in)."""
    return np.random.default_rng([int(seed), 1]).standard_normal(n_features).astype(dtype)


def _start_vector(v0, like, n_features):
    xp = namespace(like)
    if v0 is None:
        raise InputError("RUN needs a start vector v0 (see gaussian_start)")
    v = xp.asarray(v0, dtype=like.dtype, device=array_api_compat.device(like))
    return xp.broadcast_to(v, (*like.shape[:-2], n_features))[..., :, None]


def _unit(v):
    xp = namespace(v)
    norm = xp.sqrt(xp.sum(v * v, axis=-2, keepdims=True))
    return v / xp.where(norm > 0, norm, xp.ones_like(norm))


def rank1_update(F, n_iter: int = 2, eta: float = 0.6, v0=None):
    """RUN (Yu, Cai, Li, ECCV'20, Algorithm 3): F_K = F − η F v vᵀ/‖v‖² for F (..., N, D).

    v comes from ``n_iter`` power iterations v ← Fᵀ(F v) started at ``v0`` (shape (D,) or
    (..., D)); v is rescaled to unit norm after each step, which leaves F_K unchanged and keeps
    many iterations finite.  Cost O(K N D) instead of an O(D³) decomposition.  With v the top
    right singular vector, the top singular value is multiplied by (1 − η), the others kept.
    """
    if int(n_iter) < 0:
        raise ParameterError("n_iter", f"must be >= 0, got {n_iter}")
    xp = namespace(F)
    v = _unit(_start_vector(v0, F, F.shape[-1]))
    for _ in range(int(n_iter)):
        v = _unit(xp.matrix_transpose(xp.matrix_transpose(F @ v) @ F))
    return F - (eta * (F @ v)) * xp.matrix_transpose(v)


def rank1_update_gram(M, n_iter: int = 2, eta: float = 0.6, v0=None):
    """RUN applied to the pooled matrix: M_K = (I − η uuᵀ) M (I − η uuᵀ), u = v/‖v‖.

    For M = FᵀF/N this equals pooling :func:`rank1_update`'s F_K (the power iteration
    v ← Fᵀ(F v) = N·M v has the same direction), in O(K D² + D²) per image:
    M_K = M − u aᵀ − a uᵀ with w = M u, a = η w − ½η²(uᵀw) u.
    """
    if int(n_iter) < 0:
        raise ParameterError("n_iter", f"must be >= 0, got {n_iter}")
    xp = namespace(M)
    u = _unit(_start_vector(v0, M, M.shape[-1]))
    for _ in range(int(n_iter)):
        u = _unit(M @ u)
    w = M @ u
    a = eta * w - (0.5 * eta * eta) * (xp.matrix_transpose(u) @ w) * u
    # u aᵀ + a uᵀ as one rank-2 product: a single D×D temporary
    return M - xp.concat([u, a], axis=-1) @ xp.matrix_transpose(xp.concat([a, u], axis=-1))


def svd_sqrt_rows(F):
    """Rows F' (..., r, D) with F'ᵀF'/r = (FᵀF/N)^{1/2}, r = min(N, D), from the SVD of F."""
    xp = namespace(F)
    _, s, vt = xp.linalg.svd(F, full_matrices=False)
    n, r = F.shape[-2], s.shape[-1]
    scale = xp.sqrt(xp.clip(s, 0.0, None) * (r / n ** 0.5))
    return scale[..., :, None] * vt


# -- compact bilinear pooling -----------------------------------------------------------------
def tensor_sketch_params(n_features: int, dim: int, seed: int):
    """Two seeded count sketches (h_k: [D] → [d], s_k: [D] → {±1}), k = 1, 2."""
    rng = np.random.default_rng([int(seed), 2])
    return [(rng.integers(0, dim, n_features), rng.choice([-1.0, 1.0], n_features))
            for _ in range(2)]


def _gather_table(bins: np.ndarray, signs: np.ndarray, dim: int):
    """A signed scatter-add into ``dim`` bins written as gathers (the array API has no
    scatter-add): column j of ``index`` lists the inputs with bins == j, padded with the index
    ``len(bins)`` (a zero appended to the input), ``sign`` their signs (0 for padding)."""
    order = np.argsort(bins, kind="stable")
    counts = np.bincount(bins, minlength=dim)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    sorted_bins = bins[order]
    depth_of = np.arange(bins.shape[0]) - starts[sorted_bins]
    index = np.full((max(1, int(counts.max())), dim), bins.shape[0], dtype=np.int64)
    sign = np.zeros(index.shape)
    index[depth_of, sorted_bins] = order
    sign[depth_of, sorted_bins] = signs[order]
    return index, sign


def _signed_gather(x, index, sign):
    """Σ over the rows of ``index`` of sign · x[..., index] (x padded with one zero)."""
    xp = namespace(x)
    pad = xp.zeros((*x.shape[:-1], 1), dtype=x.dtype, device=array_api_compat.device(x))
    gathered = xp.take(xp.concat([x, pad], axis=-1), xp.reshape(index, (-1,)), axis=-1)
    gathered = xp.reshape(gathered, (*x.shape[:-1], *index.shape))
    return xp.sum(gathered * sign, axis=-2)


class _CountSketch:
    def __init__(self, h, s, dim, xp, dtype, device):
        index, sign = _gather_table(h, s, dim)
        self.index = xp.asarray(index, device=device)
        self.sign = xp.asarray(sign, dtype=dtype, device=device)

    def __call__(self, x):
        return _signed_gather(x, self.index, self.sign)


def tensor_sketch_pool(F, dim: int = 8192, seed: int = 0, params=None):
    """Compact bilinear pooling by tensor sketch (Pham & Pagh, KDD'13; Gao et al., CVPR'16):
    φ(F) = (1/N) Σ_n FFT⁻¹(FFT(C₁x_n) ∘ FFT(C₂x_n)), F (..., N, D) -> (..., d).
    The mean is taken in the frequency domain (the FFT is linear), so there is one inverse FFT
    per image."""
    xp = namespace(F)
    device = array_api_compat.device(F)
    params = params or tensor_sketch_params(F.shape[-1], dim, seed)
    sketches = [_CountSketch(h, s, dim, xp, F.dtype, device) for h, s in params]
    spectrum = xp.fft.rfft(sketches[0](F), axis=-1) * xp.fft.rfft(sketches[1](F), axis=-1)
    return xp.fft.irfft(xp.mean(spectrum, axis=-2), n=dim, axis=-1)


@functools.lru_cache(maxsize=4)
def _pair_table(n_features: int, dim: int, seed: int):
    (h1, s1), (h2, s2) = tensor_sketch_params(n_features, dim, seed)
    bins = ((h1[:, None] + h2[None, :]) % dim).reshape(-1)
    return _gather_table(bins, (s1[:, None] * s2[None, :]).reshape(-1), dim)


def tensor_sketch_matrix(M, dim: int = 8192, seed: int = 0):
    """The tensor sketch of a D×D matrix, Σ_ij M_ij s₁(i)s₂(j) e_{(h₁(i)+h₂(j)) mod d}.

    It is linear in M and maps x xᵀ to the sketch of x, so for M = FᵀF/N it equals
    :func:`tensor_sketch_pool` (F) at O(D²) per image after pooling instead of FFTs of N
    d-vectors; a normalised matrix (RUN, square root) can be sketched the same way.
    """
    xp = namespace(M)
    D = M.shape[-1]
    index, sign = _pair_table(D, int(dim), int(seed))
    device = array_api_compat.device(M)
    return _signed_gather(xp.reshape(M, (*M.shape[:-2], D * D)), xp.asarray(index, device=device),
                          xp.asarray(sign, dtype=M.dtype, device=device))


def random_maclaurin_params(n_features: int, dim: int, seed: int):
    """Two seeded Rademacher matrices W_k ∈ {±1}^{D×d}."""
    rng = np.random.default_rng([int(seed), 3])
    return [rng.choice([-1.0, 1.0], (n_features, dim)) for _ in range(2)]


def random_maclaurin_pool(F, dim: int = 8192, seed: int = 0, params=None):
    """Compact bilinear pooling by random Maclaurin (Kar & Karnick, AISTATS'12; Gao et al.):
    φ(F) = (1/N) Σ_n (1/√d)(x_nW₁) ∘ (x_nW₂), F (..., N, D) -> (..., d)."""
    xp = namespace(F)
    device = array_api_compat.device(F)
    W1, W2 = (xp.asarray(w, dtype=F.dtype, device=device)
              for w in (params or random_maclaurin_params(F.shape[-1], dim, seed)))
    return xp.mean((F @ W1) * (F @ W2), axis=-2) / dim ** 0.5


# -- the encoder ------------------------------------------------------------------------------
class SecondOrderPooling(ValidatedEstimator, TransformerMixin, BaseEstimator):
    """Second-order pooling of local features, batched on the array API.

    Parameters
    ----------
    method : {"bilinear", "cov", "cbp-ts", "cbp-rm"}
        Pooling: bilinear FᵀF/N, covariance, or compact bilinear by tensor sketch or random
        Maclaurin.
    norm : {"none", "ssr", "sqrtm", "ns", "logm", "run"}
        Normalisation (ns and logm need the D×D matrix of bilinear or cov).
    ns_iters : int
        Newton–Schulz iterations for norm ns (iSQRT-COV uses 5).
    run_iters : int
        RUN power iterations K for norm run.
    run_eta : float
        RUN shrink factor η for norm run.
    dim : int
        Output size d of the compact methods.
    random_state : int
        Seed of the sketches, the projections and RUN's start vector v₀.
    post_ssr : bool
        Element-wise SSR of the final vector.
    l2 : bool
        L2-normalise the final vector.
    log_eps : float
        Eigenvalue floor of logm, relative to the largest eigenvalue.

    ``transform(X)`` takes a stack (B, N, D) or a list of (N_i, D) arrays (numpy, torch, CuPy,
    array_api_strict) and returns (B, d) in the input's namespace.  The encoder is stateless:
    random parameters are a function of (random_state, D, dim), so ``fit`` only validates.

    References: Lin, RoyChowdhury, Maji, ICCV'15 (B-CNN); Gao et al., CVPR'16 (compact);
    Li et al., CVPR'18 (iSQRT-COV); Yu, Cai, Li, ECCV'20 (RUN).
    """

    _parameter_constraints = {
        "method": [StrOptions(set(POOLINGS))],
        "norm": [StrOptions(set(NORMS))],
        "ns_iters": [Interval(Integral, 1, None, closed="left")],
        "run_iters": [Interval(Integral, 0, None, closed="left")],
        "run_eta": [Interval(Real, 0, 1, closed="both")],
        "dim": [Interval(Integral, 1, None, closed="left")],
        "random_state": [Interval(Integral, 0, None, closed="left")],
        "post_ssr": ["boolean"],
        "l2": ["boolean"],
        "log_eps": [Interval(Real, 0, None, closed="neither")],
    }

    def __init__(self, method="bilinear", norm="ssr", ns_iters=5, run_iters=2, run_eta=0.6,
                 dim=8192, random_state=0, post_ssr=False, l2=True, log_eps=1e-6):
        self.method = method
        self.norm = norm
        self.ns_iters = ns_iters
        self.run_iters = run_iters
        self.run_eta = run_eta
        self.dim = dim
        self.random_state = random_state
        self.post_ssr = post_ssr
        self.l2 = l2
        self.log_eps = log_eps

    @classmethod
    def _check_param_rules(cls, params):
        method, norm = params.get("method", "bilinear"), params.get("norm")
        allowed = NORMS if method in MATRIX_POOLINGS else COMPACT_NORMS
        if norm is not None and norm not in allowed:
            raise ParameterError("norm", f"{norm} does not apply to method {method} (choose "
                                 f"from {', '.join(allowed)}; ns and logm need the D×D matrix "
                                 "of bilinear or cov)")
        if norm == "ssr" and params.get("post_ssr"):
            raise ParameterError("post_ssr", "repeats norm ssr, which already applies SSR")

    def fit(self, X=None, y=None):
        """Validate the parameters (nothing is learned); returns self."""
        self._validate_params()
        return self

    def transform(self, X):
        """Encode a stack (B, N, D) or a list of (N_i, D) arrays -> (B, d)."""
        self._validate_params()
        if isinstance(X, list | tuple):
            return self._transform_list(X)
        if X.ndim != 3:
            raise InputError(f"expected local features as (images, N, D), got shape "
                             f"{tuple(X.shape)}")
        if X.shape[-2] < 1 or X.shape[-1] < 1:
            raise InputError(f"need at least one local feature of at least one dimension, "
                             f"got shape {tuple(X.shape)}")
        xp = namespace(X)
        if not xp.all(xp.isfinite(X)):
            raise InputError("local features contain NaN or Inf")
        return self._finish(self._pool(X))

    def _transform_list(self, X):
        if not X:
            raise InputError("no items to encode")
        xp = namespace(*X)
        shapes = [tuple(x.shape) for x in X]
        if any(len(s) != 2 for s in shapes):
            raise InputError(f"expected (N, D) local features per item, got shapes {shapes}")
        out = [None] * len(X)
        for shape in dict.fromkeys(shapes):
            members = [i for i, s in enumerate(shapes) if s == shape]
            codes = self.transform(xp.stack([X[i] for i in members]))
            for row, i in enumerate(members):
                out[i] = codes[row, ...]
        return xp.stack(out)

    def _matrix_path(self, F) -> bool:
        """Pool to the D×D matrix: bilinear and cov always; cbp-ts when sketching the matrix
        (D² gathers) is cheaper than sketching the N features (N·d values and their FFTs)."""
        return self.method in MATRIX_POOLINGS or (
            self.method == "cbp-ts" and F.shape[-1] ** 2 <= F.shape[-2] * int(self.dim))

    def _features(self, F):
        """Compact pooling of the features: F, its RUN update, or its SVD square-root rows."""
        if self.norm == "run":
            v0 = gaussian_start(F.shape[-1], self.random_state)
            return rank1_update(F, self.run_iters, self.run_eta, v0)
        if self.norm == "sqrtm":
            return svd_sqrt_rows(F)
        return F

    def _pool(self, F):
        xp = namespace(F)
        D, dim = F.shape[-1], int(self.dim)
        if self._matrix_path(F):
            if self.method == "cov":
                F = F - xp.mean(F, axis=-2, keepdims=True)
            M = bilinear_pool(F)
            if self.norm == "run":
                M = rank1_update_gram(M, self.run_iters, self.run_eta,
                                      gaussian_start(D, self.random_state))
            elif self.norm == "sqrtm":
                M = sqrtm_eigh(M)
            elif self.norm == "ns":
                M = newton_schulz_sqrtm(M, self.ns_iters)
            elif self.norm == "logm":
                M = logm_eigh(M, self.log_eps)
            if self.method in MATRIX_POOLINGS:
                return triu_vectorise(M)
            return tensor_sketch_matrix(M, dim, self.random_state)
        if self.method == "cbp-ts":
            params = tensor_sketch_params(D, dim, self.random_state)
            pool = tensor_sketch_pool
        else:
            params = random_maclaurin_params(D, dim, self.random_state)
            pool = random_maclaurin_pool
        per_image = F.shape[-2] * dim * 4
        step = max(1, _CHUNK_ELEMENTS // per_image)
        n = F.shape[0]
        parts = [pool(self._features(F[i:min(i + step, n), ...]), dim, params=params)
                 for i in range(0, n, step)]
        return parts[0] if len(parts) == 1 else xp.concat(parts, axis=0)

    def _finish(self, z):
        if self.norm == "ssr" or self.post_ssr:
            z = signed_square_root(z)
        return l2_normalize(z) if self.l2 else z


# -- featpipe encode --method bilinear|cov|cbp-ts|cbp-rm ------------------------------------
class LocalFeatureEncoder(ValidatedEstimator):
    """``encode_batch`` for the CLI: items are read as :class:`~featpipe.items.LocalFeatures`;
    equal-shaped sets of a batch are stacked and pooled at once on the chosen device; an item
    with frames becomes a (T, d) sequence with ``frame_index`` (and ``timestamps`` when the
    input has them) sidecars, ready for any temporal encoder (frames without features are
    left out).  ``stream(sink)`` codes the frames of one item as extraction produces them.

    Parameters
    ----------
    pooling : SecondOrderPooling
        The pooling and its normalisation.
    device : {"cpu", "cuda"}
        Where to encode: cpu (numpy), or cuda (CuPy or torch; fails clearly without a GPU).
    """

    _parameter_constraints = {"pooling": [SecondOrderPooling],
                              "device": [StrOptions({"cpu", "cuda"})]}

    def __init__(self, pooling: SecondOrderPooling, device: str = "cpu"):
        self.pooling = pooling.fit()
        self.xp, self.device = device_namespace(device)

    def encode_sets(self, sets: Sequence[np.ndarray]) -> np.ndarray:
        """(len(sets), d) codes of local-feature sets (N_i, D)."""
        for s in sets:
            if s.shape[0] < 1:
                raise InputError("an image or frame has no local features")
            if not np.all(np.isfinite(s)):
                raise InputError("local features contain NaN or Inf")
        dtype = np.float64 if any(s.dtype == np.float64 for s in sets) else np.float32
        xs = [self.xp.asarray(s.astype(dtype, copy=False), device=self.device) for s in sets]
        return to_numpy(self.pooling.transform(xs))

    def _encode(self, frames: Sequence[Frame]) -> np.ndarray:
        return self.encode_sets([f.descriptors for f in frames])

    def stream(self, sink: ItemSink) -> PerFrameStream:
        return PerFrameStream(self._encode, sink)

    def encode_batch(self, arrays: Sequence[np.ndarray],
                     extras: Sequence[Mapping[str, np.ndarray]]) -> list:
        return encode_per_frame(self._encode, arrays, extras)


def _method(name: str, summary: str) -> EncodeMethod:
    exclude = ("method",) if name not in MATRIX_POOLINGS else ("method", "dim")

    def build(params, models):
        params = dict(params)
        device = params.pop("device")
        return LocalFeatureEncoder(SecondOrderPooling(method=name, **params), device=device)

    parameters = estimator_parameters(SecondOrderPooling, exclude=exclude) + \
        estimator_parameters(LocalFeatureEncoder, include=("device",))
    return EncodeMethod(name, summary, build, parameters, batch_size=32,
                        fixed={"method": name}, kinds=SECOND_ORDER)


ENCODE_METHODS = [
    _method("bilinear", "second-order pooling FᵀF/N of local features (upper triangle)"),
    _method("cov", "covariance pooling of local features (iSQRT-COV's Σ)"),
    _method("cbp-ts", "compact bilinear pooling by tensor sketch (--dim d)"),
    _method("cbp-rm", "compact bilinear pooling by random Maclaurin (--dim d)"),
]
