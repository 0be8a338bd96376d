"""Diagonal Gaussian mixtures (EM) and Fisher vectors, with VLFeat's conventions.

GMM (VLFeat ``vl_gmm``): diagonal covariances, k-means++ / k-means initialisation, E-step in
log space (the Fisher encoder's pass, :func:`_accumulate`; posteriors below 1e-10 left out of
the sums, as VLFeat leaves out those below 1e-2 / K), a variance floor
``max(data variance) * variance_floor`` applied after every M-step, stop when the relative
change of the mean log-likelihood is below ``tol`` or after ``max_iter`` iterations; a
component whose mass falls below ``1e-2 * max(1, n / K)`` (VLFeat's rule) is restarted
instead of dividing by zero: the component with the largest entropy contribution is split in
two along its largest-variance dimension (VLFeat splits the same component there by
reassigning its points on either side of the mean).

Fisher vector (Perronnin, Sánchez, Mensink ECCV'10; Sánchez et al. IJCV'13; VLFeat
``vl_fisher``).  With d_tk = (x_t - mu_k) / sigma_k and posteriors gamma_tk::

    u_k = 1 / (N sqrt(pi_k))   sum_t gamma_tk d_tk
    v_k = 1 / (N sqrt(2 pi_k)) sum_t gamma_tk (d_tk**2 - 1)

laid out ``[u_1..u_K, v_1..v_K]`` (2KD values, no prior block).  Components with
``pi_k < 1e-6`` and pairs with ``gamma_tk < 1e-6`` are skipped (VLFeat), and those components
take no part in the posteriors.  *Improved* FV = signed square root, then division by
``max(||z||_2, 1e-12)``; an item without descriptors encodes to zeros.

One posterior routine (:mod:`featpipe.encode.posterior`: log joints by the GEMM form,
log-sum-exp, variance floor) serves EM, the FV body and the encoder.  One FV body:
:func:`fisher_vectors` (array API, batched, differentiable) defines the FV and is used by deep
Fisher learning; :class:`FisherAccumulator` normalises its sums with the compiled copy of its
:func:`fisher_from_sums` (:func:`featpipe.encode._fisher_loop.fisher_rows`, tested against
it).  Its CPU fast path (:func:`_accumulate`) takes the Mahalanobis terms of all pairs from a
float32 GEMM with a rigorous per-pair rounding bound, recomputes in float64 every pair the
bound cannot rule out of γ >= 1e-6, and accumulates in float64: the FV is the float64 one, on
any BLAS kernel and any split of the descriptors.  Per-frame FVs encode the frames of a batch
together (:func:`fisher_vectors_of_parts`), each frame's FV the bits of its descriptors'
alone.
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator, DensityMixin, TransformerMixin
from sklearn.utils._param_validation import HasMethods, Interval, StrOptions
from sklearn.utils.validation import validate_data

from featpipe.backend import namespace, single_threaded_blas, worker_threads
from featpipe.encode.posterior import (
    floor_variances,
    gemm_operands,
    log_joint,
    log_normaliser,
    logsumexp,
    mahalanobis,
    mahalanobis_gemm,
    normalise,
    posteriors,
    squared_lhs,
)
from featpipe.errors import InputError, ParameterError
from featpipe.extract.pca import MODEL_NAME, PCAProjection, project
from featpipe.item_kinds import FISHER
from featpipe.items import (
    Frame,
    LocalFeatures,
    MemorySink,
    PerFrameStream,
    frame_rows,
    stream_item,
)
from featpipe.models import ArrayModel
from featpipe.parallel import ItemOutput
from featpipe.parameters import ValidatedEstimator, estimator_parameters, model_parameter

#: VLFeat's skip thresholds (``vl/fisher.c``): tiny priors and tiny posteriors.
PRIOR_THRESHOLD = 1e-6
POSTERIOR_THRESHOLD = 1e-6
#: Pyramid layouts for images: (columns, rows) of each level, VLFeat/Chatfield et al.'s 1x1+2x2+3x1.
PYRAMIDS = {"none": ((1, 1),), "1x1+2x2+3x1": ((1, 1), (2, 2), (1, 3))}
_LOG_2PI = math.log(2.0 * math.pi)
#: Pairs whose log posterior may be within this of log(threshold) are recomputed exactly.
_MARGIN = 0.5
#: Descriptors per call of the FV encoder's pass (bounded memory), most per task of a thread
#: (its own sums, added in task order), and per block of its GEMM and compiled pass (the
#: (block, K) float32 distances stay in cache).  A call's tasks are of equal size and, when
#: there are several, a multiple of ``_BALANCE`` in number, so that 1, 2 or 4 threads get equal
#: shares: two threads split an image of 8,625 descriptors 4 + 4, not 3 + 2 (the task
#: boundaries do not depend on the thread count, nor does the FV).
_CHUNK = 32768
_TASK = 2048
_BALANCE = 4
#: EM's posterior cut-off in the sums (the log-likelihood keeps every pair).
_EM_POSTERIOR = 1e-10
_BLOCK = 512
log = logging.getLogger(__name__)


def _check_descriptors(x, dim: int | None = None, what: str = "descriptors",
                       finite: bool = True) -> np.ndarray:
    """``x`` as a 2-D array of numbers (of ``dim`` columns), or a one-line InputError;
    ``finite=False`` leaves the NaN/Inf check to the caller (the encoder's pass does it in its
    operand pass: :func:`_accumulate`)."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise InputError(f"{what}: expected a 2-D array (n_descriptors, dim), got shape "
                         f"{x.shape}")
    if x.dtype.kind not in "biuf":
        raise InputError(f"{what}: expected numbers, got dtype {x.dtype}")
    if dim is not None and x.shape[1] != dim:
        raise InputError(f"{what}: dimension {x.shape[1]} does not match the GMM's {dim}")
    if finite and not np.all(np.isfinite(x)):
        raise InputError(f"{what}: contains NaN or Inf")
    return x


class GaussianMixtureModel(ArrayModel, ValidatedEstimator, DensityMixin, BaseEstimator):
    """Diagonal GMM fitted by EM with VLFeat's conventions (see the module docstring).

    Parameters
    ----------
    n_components : int
        Number of Gaussians K.
    max_iter : int
        Most EM iterations.
    tol : float
        Relative change of the mean log-likelihood that stops EM.
    variance_floor : float
        Floor of every variance, relative to the largest data variance.
    init : {"kmeans", "kmeans++"}
        Initialisation: k-means (Lloyd) after k-means++ seeding, or the seeding alone.
    random_state : int
        Seed of the initialisation.
    dtype : {"float64", "float32"}
        Precision of the EM computations.
    chunk_size : int
        Rows per E-step block (bounds memory).

    Attributes
    ----------
    weights_ (K,), means_ (K, D), variances_ (K, D), log_likelihoods_ (mean log-likelihood per
    descriptor, before each M-step), n_iter_, n_restarts_, converged_, variance_floor_.
    """

    _model_name = "gmm"
    _fitted_arrays = ("weights_", "means_", "variances_")
    _fitted_meta = ("n_iter_", "n_restarts_", "converged_", "variance_floor_")
    _parameter_constraints = {
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "variance_floor": [Interval(Real, 0, None, closed="left")],
        "init": [StrOptions({"kmeans", "kmeans++"})],
        "random_state": ["random_state"],
        "dtype": [StrOptions({"float64", "float32"})],
        "chunk_size": [Interval(Integral, 1, None, closed="left")],
    }

    def __init__(self, n_components=256, max_iter=100, tol=1e-5, variance_floor=1e-4,
                 init="kmeans", random_state=0, dtype="float64", chunk_size=16384):
        self.n_components = n_components
        self.max_iter = max_iter
        self.tol = tol
        self.variance_floor = variance_floor
        self.init = init
        self.random_state = random_state
        self.dtype = dtype
        self.chunk_size = chunk_size

    # -- fitting ----------------------------------------------------------------------------
    def _validate(self, x):
        self._validate_params()
        x = _check_descriptors(x)
        if x.shape[0] < self.n_components:
            raise InputError(f"need at least n_components={self.n_components} descriptors to "
                             f"fit the GMM, got {x.shape[0]}")
        return x.astype(self.dtype, copy=False)

    def fit(self, X, y=None, init_params: Mapping[str, np.ndarray] | None = None):
        """Fit on descriptors ``X`` (n, D).  ``init_params`` (weights, means, variances)
        replaces the k-means initialisation (used by tests and warm starts)."""
        x = self._validate(X)
        n, dim = x.shape
        self.center_ = x.mean(axis=0)
        xc = x - self.center_
        data_var = xc.var(axis=0)
        floor = float(self.variance_floor) * float(np.max(data_var))
        # constant data: a tiny absolute floor keeps 1/sigma^2 finite
        self.variance_floor_ = max(floor, 1e-10 if self.dtype == "float64" else 1e-6)
        if init_params is not None:
            weights = np.asarray(init_params["weights"], dtype=self.dtype)
            means = np.asarray(init_params["means"], dtype=self.dtype) - self.center_
            variances = np.asarray(init_params["variances"], dtype=self.dtype)
        else:
            log.info("initialising K=%d by %s on %d descriptors", self.n_components, self.init, n)
            weights, means, variances = self._initialise(xc, data_var)
        variances = floor_variances(variances, self.variance_floor_)
        history, restarts, converged = [], 0, False
        for iteration in range(self.max_iter):
            stats, ll = self._e_step(xc, weights, means, variances)
            history.append(ll)
            log.info("EM iteration %d/%d: mean log-likelihood %.6g (K=%d, %d descriptors)",
                     iteration + 1, self.max_iter, ll, len(weights), n)
            if len(history) > 1 and abs(history[-1] - history[-2]) < self.tol * abs(history[-1]):
                converged = True
                break
            weights, means, variances, n_new = self._m_step(stats, n)
            restarts += n_new
        else:
            history.append(self._e_step(xc, weights, means, variances)[1])
        self.weights_ = weights.astype(np.float64)
        self.means_ = (means + self.center_).astype(np.float64)
        self.variances_ = variances.astype(np.float64)
        self.log_likelihoods_ = np.asarray(history)
        self.n_iter_ = len(history) - 1
        self.n_restarts_ = restarts
        self.converged_ = converged
        self.n_features_in_ = dim
        return self

    def _initialise(self, xc, data_var):
        from sklearn.cluster import KMeans, kmeans_plusplus

        k = self.n_components
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # duplicate points: fewer distinct clusters than K
            if self.init == "kmeans++":
                centers, _ = kmeans_plusplus(xc, k, random_state=self.random_state)
            else:
                centers = KMeans(k, init="k-means++", n_init=1, max_iter=20,
                                 random_state=self.random_state).fit(xc).cluster_centers_
        centers = centers.astype(self.dtype)
        labels = np.argmin(mahalanobis(xc, centers, np.ones_like(centers)), axis=1)
        counts = np.bincount(labels, minlength=k).astype(self.dtype)
        weights = np.maximum(counts, 1.0) / np.sum(np.maximum(counts, 1.0))
        variances = np.tile(data_var, (k, 1)).astype(self.dtype)
        for j in np.flatnonzero(counts > 1):
            variances[j] = xc[labels == j].var(axis=0)
        return weights, centers, variances

    def _log_joint(self, xc, weights, means, variances, lhs=None):
        """log(pi_k N(x_t | mu_k, sigma_k^2)) for all pairs (n, K), by the posterior routine
        (``lhs``: [xc², xc] when the caller keeps it)."""
        log_w = np.where(weights > 0, np.log(np.maximum(weights, 1e-300)), -np.inf)
        log_norm = log_normaliser(log_w, np.sum(np.log(variances), axis=1), xc.shape[1])
        return log_joint(xc, log_norm, means, 1.0 / variances, lhs)

    def _e_step(self, xc, weights, means, variances):
        """Sufficient statistics (N_k, sum gamma x, sum gamma x^2) and mean log-likelihood.

        The encoder's pass (:func:`_accumulate`: float32 GEMM with a per-pair rounding bound,
        float64 log joints wherever γ may reach ``_EM_POSTERIOR``, float64 sums): posteriors
        below 1e-10 are left out of the sums (VLFeat leaves out those below 1e-2 / K) but
        not out of the log-likelihood; the centred sums Σγd, Σγd² (d = (x − μ)/σ) give the
        raw ones."""
        k, dim = means.shape
        fast = _FastGMM(np.asarray(weights, np.float64), np.asarray(means, np.float64),
                        np.asarray(variances, np.float64), _EM_POSTERIOR)
        sd, sdd, s0 = np.zeros((k, dim)), np.zeros((k, dim)), np.zeros(k)
        total = 0.0
        for start in range(0, xc.shape[0], self.chunk_size):
            total += _accumulate(xc[start:start + self.chunk_size], fast, sd, sdd, s0)[1]
        mu = fast.center + fast.mc
        sigma = 1.0 / fast.inv_sigma
        s1 = s0[:, None] * mu + sigma * sd
        s2 = s0[:, None] * mu * mu + 2.0 * mu * sigma * sd + sigma * sigma * sdd
        return (s0, s1, s2), total / xc.shape[0] - 0.5 * dim * _LOG_2PI

    def _m_step(self, stats, n):
        s0, s1, s2 = stats
        k, dim = s1.shape
        # VLFeat (vl/gmm.c): a mode is empty when its mass < 1e-2 * max(1, n / K)
        alive = s0 >= 1e-2 * max(1.0, n / k)
        mass = np.where(alive, s0, 1.0)[:, None]
        means = s1 / mass
        variances = floor_variances(s2 / mass - means * means, self.variance_floor_)
        weights = np.where(alive, s0, 0.0) / n
        dead = np.flatnonzero(~alive)
        for j in dead:
            # split the mode with the largest entropy contribution pi (H(g) - log pi), as
            # VLFeat does, along its largest-variance dimension into the two halves of that
            # Gaussian: means mu -/+ sigma sqrt(2/pi), variance sigma^2 (1 - 2/pi) there
            entropy = 0.5 * dim * (1.0 + _LOG_2PI) + 0.5 * np.sum(np.log(variances), axis=1)
            score = np.where(weights >= PRIOR_THRESHOLD,
                             weights * (entropy - np.log(np.maximum(weights, 1e-300))), -np.inf)
            donor = int(np.argmax(score))
            if not np.isfinite(score[donor]) or donor == j:
                continue
            axis = int(np.argmax(variances[donor]))
            shift = math.sqrt(2.0 / math.pi * variances[donor, axis])
            variances[j] = variances[donor]
            variances[[j, donor], axis] = max(variances[donor, axis] * (1.0 - 2.0 / math.pi),
                                              self.variance_floor_)
            means[j] = means[donor]
            means[j, axis] -= shift
            means[donor, axis] += shift
            weights[j] = weights[donor] = weights[donor] / 2.0
        weights = weights / weights.sum()
        dtype = np.dtype(self.dtype)
        return (weights.astype(dtype), means.astype(dtype), variances.astype(dtype), len(dead))

    def score(self, x) -> float:
        """Mean log-likelihood of descriptors ``x`` under the fitted model."""
        x = _check_descriptors(x, self.means_.shape[1]).astype(np.float64)
        center = self.means_.mean(axis=0)  # any centre: the log-likelihood does not depend on it
        return float(np.mean(normalise(self._log_joint(
            x - center, self.weights_, self.means_ - center, self.variances_))[1]))


def check_gmm(weights, means, variances):
    """Validate GMM arrays (K,), (K, D), (K, D) and return them as float64."""
    weights = np.asarray(weights, dtype=np.float64)
    means = np.asarray(means, dtype=np.float64)
    variances = np.asarray(variances, dtype=np.float64)
    if means.ndim != 2 or variances.shape != means.shape or weights.shape != means.shape[:1]:
        raise InputError(f"GMM arrays must be weights (K,), means (K, D), variances (K, D); got "
                         f"{weights.shape}, {means.shape}, {variances.shape}")
    if not (np.all(np.isfinite(means)) and np.all(variances > 0) and np.all(weights >= 0)):
        raise InputError("GMM needs finite means, positive variances and non-negative weights")
    return weights, means, variances


# -- the Fisher-vector body (array API: numpy, torch, CuPy; batched; differentiable) --------
#
# One definition of the FV, shared by the encoder (FisherAccumulator normalises its sums with
# fisher_from_sums' compiled copy, _fisher_loop.fisher_rows, tested against it) and by deep
# Fisher learning (learn/deep_fisher.py: forward = fisher_vectors, reverse pass on its cache).

def signed_root(z):
    """sign(z)·√|z|, with gradient 0 (not inf·0) at z = 0.  Any array-API namespace."""
    xp = namespace(z)
    nonzero = z != 0
    root = xp.sqrt(xp.where(nonzero, xp.abs(z), xp.ones_like(z)))
    return xp.where(nonzero, xp.sign(z) * root, xp.zeros_like(z))


def _unit(psi):
    """psi / max(‖psi‖₂, 1e-12) along the last axis, and the norms."""
    xp = namespace(psi)
    norm = xp.sqrt(xp.sum(psi * psi, axis=-1))
    return psi / xp.maximum(norm, xp.full_like(norm, 1e-12))[..., None], norm


def improve(z):
    """VLFeat's IMPROVED normalisation along the last axis: signed square root, then division
    by max(‖·‖₂, 1e-12) (an all-zero z stays zero).  Differentiable."""
    return _unit(signed_root(z))[0]


def fisher_from_sums(sd, sdd, s0, count, pi, valid, improved=True):
    """FVs from per-component sums: u_k = Σγd / (N√π_k), v_k = (Σγd² − Σγ) / (N√(2π_k)).

    sd, sdd (B, K, D), s0 (B, K, 1), count (B,) descriptors per item (0 counts as 1), pi and
    valid (K,).  Returns ``(phi, (u, v, z, cu, norm))``: phi (B, 2KD), improved or raw z, in
    VLFeat's layout [u_1..u_K, v_1..v_K], and what the reverse pass needs (norm = ‖SSR(z)‖).
    """
    xp = namespace(sd, pi)
    count = xp.astype(count, sd.dtype)
    count = xp.maximum(count, xp.ones_like(count))
    safe_pi = xp.where(valid, pi, xp.ones_like(pi))
    cu = xp.where(valid[None, :], 1.0 / (count[:, None] * xp.sqrt(safe_pi)[None, :]),
                  xp.zeros((count.shape[0], pi.shape[0]), dtype=sd.dtype,
                           device=getattr(sd, "device", None)))[:, :, None]
    u = cu * sd
    v = cu / math.sqrt(2.0) * (sdd - s0)
    B, k, dim = sd.shape
    z = xp.concat([xp.reshape(u, (B, k * dim)), xp.reshape(v, (B, k * dim))], axis=-1)
    phi, norm = _unit(signed_root(z))
    return (phi if improved else z), (u, v, z, cu, norm)


@dataclass
class FisherCache:
    """Intermediate values of :func:`fisher_vectors`, reused by the reverse pass.

    Shapes for B items padded to T descriptors, K components of dimension D: lhs (B, T, 2D)
    = [xc², xc] with xc the descriptors minus the centre of the means, mc (K, D),
    inv_sigma/inv_var (K, D), pi (K,), gamma/mask (B, T, K) (zero on padding rows), s0
    (B, K, 1), sd/sdd/u/v (B, K, D), cu/cv (B, K, 1), z/phi (B, 2KD), norm (B,).
    """

    lhs: object
    mc: object
    inv_sigma: object
    inv_var: object
    pi: object
    gamma: object
    mask: object
    s0: object
    sd: object
    sdd: object
    cu: object
    cv: object
    u: object
    v: object
    z: object
    phi: object
    norm: object


def fisher_vectors(X, a, mu, s, lengths=None, threshold=POSTERIOR_THRESHOLD, improved=True):
    """Fisher vectors of a batch of items X (B, T, D) (item b: its first ``lengths[b]`` rows;
    None: all T) under θ = (a, μ, s): π = softmax(a), σ = exp(s).  Returns (phi (B, 2KD),
    :class:`FisherCache`).

    VLFeat's definition (module docstring): components with π < 1e-6 and pairs with
    γ < ``threshold`` skipped.  The Mahalanobis terms of all pairs come from one GEMM on
    centred data, [xc², xc] (B·T, 2D) @ [1/σ²; −2 mc/σ²] (2D, K), and the posteriors, by the
    posterior routine (:mod:`featpipe.encode.posterior`); the sums Σγ, Σγx, Σγx² of every
    item by one batched product γᵀ[xc², xc] (segment sums over the items' descriptors).  Any
    array-API namespace; differentiable under torch autograd.
    """
    xp = namespace(X, a, mu, s)
    B, T, dim = X.shape
    log_pi = a - logsumexp(a, axis=0)
    pi = xp.exp(log_pi)
    valid = pi >= PRIOR_THRESHOLD
    center = xp.mean(mu, axis=0)
    xc = X - center
    mc = mu - center
    inv_sigma = xp.exp(-s)
    inv_var = inv_sigma * inv_sigma
    lhs = squared_lhs(xc)
    log_norm = log_normaliser(xp.where(valid, log_pi, xp.full_like(log_pi, -math.inf)),
                              2.0 * xp.sum(s, axis=1))
    gamma = posteriors(log_joint(xc, log_norm, mc, inv_var, lhs=lhs))
    device = getattr(X, "device", None)
    if lengths is None:
        count = xp.full((B,), float(T), dtype=X.dtype, device=device)
    else:
        count = xp.asarray([float(n) for n in lengths], dtype=X.dtype, device=device)
        rows = xp.astype(xp.arange(T, device=device)[None, :] < xp.astype(count, xp.int64)
                         [:, None], X.dtype)
        gamma = gamma * rows[:, :, None]
    mask = gamma >= threshold
    if lengths is not None:
        mask = mask & (gamma > 0)
    g = xp.where(mask, gamma, xp.zeros_like(gamma))
    narrow = X.dtype == xp.float32
    if narrow:
        # float32 moments cancel for a narrow component far from the centre (Σγx² ≈ mc²Σγ,
        # then × 1/σ², then √): the sums, their centring and the FV in float64, from the
        # float32 inputs; the results and the cache back in float32
        def wide(a):
            return xp.astype(a, xp.float64)

        g_w, centre_w = wide(g), wide(center)
        lhs_w, mc_w = squared_lhs(wide(X) - centre_w), wide(mu) - centre_w
        sigma_w, var_w, pi_w, count_w = wide(inv_sigma), wide(inv_var), wide(pi), wide(count)
    else:
        g_w, lhs_w, mc_w, sigma_w, var_w, pi_w, count_w = \
            g, lhs, mc, inv_sigma, inv_var, pi, count
    s0 = xp.sum(g_w, axis=1)[:, :, None]
    moments = xp.permute_dims(g_w, (0, 2, 1)) @ lhs_w  # (B, K, 2D): [Σγx², Σγx]
    s2, s1 = moments[..., :dim], moments[..., dim:]
    sd = (s1 - mc_w * s0) * sigma_w
    sdd = (s2 - 2.0 * mc_w * s1 + mc_w * mc_w * s0) * var_w
    phi, parts = fisher_from_sums(sd, sdd, s0, count_w, pi_w, valid, improved)
    if narrow:
        s0, sd, sdd, phi, *parts = (xp.astype(a, xp.float32) for a in (s0, sd, sdd, phi, *parts))
    u, v, z, cu, norm = parts
    return phi, FisherCache(lhs, mc, inv_sigma, inv_var, pi, gamma, mask, s0, sd, sdd, cu,
                            cu / math.sqrt(2.0), u, v, z, phi, norm)


def fisher_vector(x, weights, means, variances, improved=True,
                  posterior_threshold=POSTERIOR_THRESHOLD) -> np.ndarray:
    """Fisher vector of descriptors ``x`` (N, D) under a diagonal GMM, VLFeat's layout.

    Returns float32 ``[u_1..u_K, v_1..v_K]`` (2KD); ``improved`` applies the signed square
    root and L2 normalisation.  Same definition as VLFeat ``vl_fisher`` (module docstring),
    accumulated in float64.
    """
    accumulator = FisherAccumulator(weights, means, variances, improved, posterior_threshold)
    return accumulator.add(x).result()


class FisherAccumulator:
    """The Fisher vector of descriptors that arrive in parts (the frames of a video).

    ``add(x)`` accumulates the sums Σ_t γ_tk d_tk, Σ_t γ_tk d_tk² and Σ_t γ_tk of a part
    (float64, :func:`_accumulate`); ``result()`` divides by the total count N and the priors
    (module docstring), so any split of the descriptors into parts gives the FV of all of them
    (to float64 rounding).
    """

    def __init__(self, weights, means, variances, improved=True,
                 posterior_threshold=POSTERIOR_THRESHOLD):
        self.weights, self.means, self.variances = check_gmm(weights, means, variances)
        self.improved = improved
        self.threshold = posterior_threshold
        self.gmm = _FastGMM.of(self.weights, self.means, self.variances, posterior_threshold)
        k, dim = self.means.shape
        self.first = np.zeros((k, dim))
        self.second = np.zeros((k, dim))
        self.mass = np.zeros(k)
        self.count = 0
        self.exact_pairs = 0

    def add(self, x) -> FisherAccumulator:
        """Accumulate descriptors ``x`` (n, D); returns ``self``."""
        x = _check_descriptors(x, self.means.shape[1], finite=False)  # in _accumulate
        for start in range(0, x.shape[0], _CHUNK):  # bounded memory
            self.exact_pairs += _accumulate(x[start:start + _CHUNK], self.gmm, self.first,
                                            self.second, self.mass)[0]
        self.count += x.shape[0]
        return self

    def result(self) -> np.ndarray:
        """The float32 FV of everything added (zeros when nothing was), by
        :func:`fisher_from_sums`'s compiled copy (:func:`_fisher_rows`)."""
        out = np.empty((1, 2 * self.first.size), np.float32)
        _fisher_rows(self.first[None], self.second[None], self.mass[None],
                     np.asarray([self.count], np.float64), self.gmm, self.improved, out)
        return out[0]


class _FastGMM:
    """What :func:`_accumulate` needs of a GMM, computed once: the centre c (mean of the
    means), mc = μ − c, 1/σ, the log normaliser (posterior routine), the GEMM's float32 right
    operand and float64 bias, and the rounding bound's slope and offsets."""

    #: the GMMs prepared last, most recent first: (weights, means, variances, threshold, self)
    _recent: list[tuple] = []
    #: how many are kept: the descriptor groups of a grouped GMM take turns, frame by frame
    _KEPT = 8

    @classmethod
    def of(cls, weights, means, variances, threshold) -> _FastGMM:
        """The prepared GMM of these float64 arrays, reused while the same GMM comes back (the
        images of a data set, the groups of a video's frames: preparing it takes 2-3 % of an
        image's time on two threads, the comparison a fifth of that)."""
        for i, kept in enumerate(cls._recent):
            if kept[3] == threshold and all(
                    np.array_equal(a, b)
                    for a, b in zip(kept[:3], (weights, means, variances), strict=True)):
                cls._recent.insert(0, cls._recent.pop(i))
                return kept[4]
        fast = cls(weights, means, variances, threshold)
        cls._recent.insert(0, (weights.copy(), means.copy(), variances.copy(), threshold, fast))
        del cls._recent[cls._KEPT:]
        return fast

    def __init__(self, weights, means, variances, threshold):
        k, dim = means.shape
        self.arrays = tuple(np.array(a, np.float64) for a in (weights, means, variances))
        self.pi = self.arrays[0]
        self.valid = self.pi >= PRIOR_THRESHOLD
        self.center = means.mean(axis=0)
        self.mc = means - self.center
        inv_var = 1.0 / variances
        self.inv_sigma = np.sqrt(inv_var)
        valid = weights >= PRIOR_THRESHOLD
        self.log_norm = log_normaliser(
            np.where(valid, np.log(np.maximum(weights, 1e-300)), -np.inf),
            np.sum(np.log(variances), axis=1))
        self.means_shape = (k, dim)
        rhs, self.bias = gemm_operands(self.mc, inv_var)
        self.rhs = rhs.astype(np.float32)
        # float32 GEMM of [xc², xc] (2D terms, each within 5 u of its float64 value) against
        # the float64 distance m: |Δm| <= g Σ|terms| <= g (4 m + 5 ‖mc/σ‖²), g = (2D + 8) u;
        # in log-joint units (½ m), over m's float32 value; plus the float32 bound loop's own
        # rounding (bias and log normaliser stored in float32, a few operations on each term)
        u = 2.0**-24
        g = (2 * dim + 8) * u
        slope = 2.0 * g / (1.0 - 4.0 * g) + 4.0 * u
        finite_norm = np.where(valid, self.log_norm, 0.0)
        offset = (2.5 * g / (1.0 - 4.0 * g) + 2.0 * u) * self.bias \
            + 8.0 * u * np.abs(finite_norm) + 1e-6
        offset *= 1.0 + 8.0 * u
        finite_norm = np.where(valid, self.log_norm, -1e30)
        self.approx = (self.bias.astype(np.float32), (finite_norm + offset).astype(np.float32),
                       (finite_norm - offset).astype(np.float32), np.float32(0.5 - slope),
                       np.float32(0.5 + slope))
        self.limit = math.log(threshold) - _MARGIN if threshold > 0 else -math.inf
        self.threshold = threshold
        #: the GMM's arguments of :func:`featpipe.encode._fisher_loop.accumulate`
        self.kernel_args = (self.center, self.mc, self.inv_sigma, self.log_norm, self.approx,
                            self.limit, self.threshold)


def _accumulate(x, gmm: _FastGMM, first, second, mass) -> tuple[int, float]:
    """Add the sums Σ γ d, Σ γ d² and Σ γ of descriptors ``x`` into ``first``, ``second``,
    ``mass`` (float64 (K, D), (K, D), (K,)); returns the number of pairs computed exactly and
    the descriptors' summed log-evidence Σ_t log Σ_k π_k N(x_t) + N·D/2·log 2π.

    The posterior routine (:mod:`featpipe.encode.posterior`) in two precisions:

    1. Per block of ``_BLOCK`` descriptors, the Mahalanobis terms m_tk of all pairs from one
       float32 GEMM on data centred at the mean of the means, with a rigorous bound on its
       rounding, e_tk = slope·m_tk + offset_k (:class:`_FastGMM`: per pair, so narrow
       components far from the centre get wide bounds and wide components tight ones).
    2. Candidate pairs, whose upper bound lies within log(threshold) − ``_MARGIN`` of the
       descriptor's largest lower bound, get their log joints recomputed in float64 from
       direct differences; the posteriors (log-sum-exp over the candidates' exact terms and
       the others' approximate ones, each below threshold·e^-margin of the best) and the
       cut-off γ >= threshold are float64, and the kept pairs are accumulated in float64
       (:func:`featpipe.encode._fisher_loop.accumulate`).

    So no pair with γ >= threshold is missed whatever the GEMM kernel, the FV is within
    float64 rounding of the float64 definition (but for the approximate terms of the
    normaliser, below threshold·e^-margin each), and descriptors far from every Gaussian
    (a float32 GEMM that loses every digit or overflows) make all their pairs candidates.
    Equal tasks of at most ``_TASK`` descriptors (a multiple of ``_BALANCE`` of them) run on
    :func:`featpipe.backend.worker_threads` threads: the caller's and helpers of one pool, each
    taking the next task until none is left (one BLAS thread each, the compiled code without
    the GIL), each task into its own zeroed sums (:class:`_Workspace`), checked for NaN/Inf
    and overflow on its thread; the sums are added in task order once every task is known to
    be valid, so the result does not depend on the thread count and a refused part leaves the
    caller's sums as they were.
    """
    from featpipe.encode import _fisher_loop
    from featpipe.numba_cache import announce

    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    if x.shape[0] == 0:
        return 0, 0.0
    n_tasks = -(-x.shape[0] // _TASK)
    if n_tasks > 1:
        n_tasks = -(-n_tasks // _BALANCE) * _BALANCE
    bounds = [i * x.shape[0] // n_tasks for i in range(n_tasks + 1)]
    k, dim = gmm.means_shape
    results = [None] * n_tasks

    def run(task, lhs, gemm):
        sums = _Workspace.take(("sums", k, dim), lambda: (np.empty((1, k, dim)),
                                                          np.empty((1, k, dim)),
                                                          np.empty((1, k))))
        for s in sums:
            s.fill(0.0)
        n_exact = 0
        overflow = np.zeros(1, np.int64)
        evidence = 0.0
        finite = True
        for start in range(bounds[task], bounds[task + 1], _BLOCK):
            block = x[start:min(start + _BLOCK, bounds[task + 1])]
            rows = block.shape[0]
            parts = np.asarray([0, rows], dtype=np.int64)
            announce("Fisher-vector kernels",
                     (_fisher_loop.squared_operand, (block, gmm.center, lhs[:rows])),
                     (_fisher_loop.accumulate, (gemm[:rows], block, parts, *gmm.kernel_args,
                                                *sums, overflow)))
            finite &= _fisher_loop.squared_operand(block, gmm.center, lhs[:rows])
            with np.errstate(over="ignore", invalid="ignore"):
                raw = mahalanobis_gemm(lhs[:rows], gmm.rhs, out=gemm[:rows])
            counts = _fisher_loop.accumulate(raw, block, parts, *gmm.kernel_args, *sums,
                                             overflow)
            n_exact += counts[0]
            evidence += counts[1]
        overflow = overflow[0] or not (np.all(np.isfinite(sums[0])) and
                                       np.all(np.isfinite(sums[1])))
        results[task] = sums, n_exact, overflow, evidence, finite

    tasks = iter(range(n_tasks))  # shared: next() on it is atomic under the GIL

    def drain():
        scratch = _Workspace.take(("block", _BLOCK, k, dim), lambda: (
            np.empty((_BLOCK, 2 * dim), np.float32), np.empty((_BLOCK, k), np.float32)))
        for task in tasks:
            run(task, *scratch)
        _Workspace.give(("block", _BLOCK, k, dim), scratch)

    with single_threaded_blas():
        helpers = [_thread_pool(worker_threads()).submit(drain)
                   for _ in range(min(worker_threads(), n_tasks) - 1)]
        drain()
        for helper in helpers:  # one still queued (the pool busy with other calls) is not needed
            if not helper.cancel():
                helper.result()
    for _, _, overflow, _, finite in results:  # nothing is added unless all is valid
        if not finite:
            raise InputError("descriptors: contains NaN or Inf")
        if overflow:
            raise _too_large(x)
    exact, evidence = 0, 0.0
    for sums, n_exact, _, log_evidence, _ in results:  # in task order
        u, v, m = sums
        first += u[0]
        second += v[0]
        mass += m[0]
        exact += n_exact
        evidence += log_evidence
        _Workspace.give(("sums", k, dim), sums)
    return exact, evidence


def _too_large(x) -> InputError:
    return InputError(f"descriptors too large to encode: largest |value| "
                      f"{np.max(np.abs(x)):.3g} overflows float64 (distance squared)")


def _fisher_rows(first, second, mass, counts, gmm: _FastGMM, improved, out, column=0,
                 clear=False) -> int:
    """out[p, column:] = the float32 FV of part p's sums ((P, K, D), (P, K, D), (P, K);
    ``counts`` float64 (P,); ``out`` C-ordered), by
    :func:`featpipe.encode._fisher_loop.fisher_rows`, the compiled copy of
    :func:`fisher_from_sums` (``clear``: the sums set back to 0); returns the number of parts
    whose sums are not finite."""
    from featpipe.encode import _fisher_loop
    from featpipe.numba_cache import announce

    args = (first, second, mass, counts, gmm.pi, gmm.valid, bool(improved), bool(clear), out,
            int(column))
    types = ("rows", out.flags.c_contiguous)  # the others: float64 sums, this module's arrays
    if types not in _ANNOUNCED:
        announce("Fisher-vector kernels", (_fisher_loop.fisher_rows, args))
        _ANNOUNCED.add(types)
    return _fisher_loop.fisher_rows(*args)


def fisher_vectors_of_parts(x, offsets, weights, means, variances, improved=True,
                            posterior_threshold=POSTERIOR_THRESHOLD, out=None,
                            column=0) -> np.ndarray:
    """The FV of each part p of the descriptors ``x`` (N, D), rows offsets[p] ..
    offsets[p + 1] − 1 (the frames of a video) -> (P, 2KD) float32 (into
    ``out[:, column:column + 2KD]`` when given, ``out`` C-ordered), each to the bit
    :func:`fisher_vector` of the part alone.

    Parts of at most ``_TASK`` rows are encoded together: one operand pass over all their
    rows, the GEMM block by block of each part (the blocks :func:`_accumulate` forms, so the
    same float32 values), one compiled pass for the sums of every part and one for their FVs
    (buffers kept for the next call: fresh memory costs page faults, ~1 ms for the sums of 8
    frames at K = 256); a longer part goes through :func:`fisher_vector` (its tasks on the
    worker threads)."""
    weights, means, variances = check_gmm(weights, means, variances)
    if out is None:
        out, column = np.empty((len(offsets) - 1, 2 * means.size), np.float32), 0
    with single_threaded_blas():
        _encode_parts(x, offsets, _FastGMM.of(weights, means, variances, posterior_threshold),
                      improved, out, column)
    return out


def _encode_parts(x, offsets, gmm: _FastGMM, improved, out, column) -> None:
    """:func:`fisher_vectors_of_parts` with a prepared GMM (BLAS limited to one thread by the
    caller: its GEMMs are small)."""
    k, dim = gmm.means_shape
    x = _check_descriptors(x, dim, finite=False)  # in the operand pass
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    counts = np.diff(offsets)
    width = 2 * k * dim
    long = counts > _TASK
    for p in np.flatnonzero(long):
        out[p, column:column + width] = fisher_vector(x[offsets[p]:offsets[p + 1]],
                                                      *gmm.arrays, improved, gmm.threshold)
    short = np.flatnonzero(~long)
    if short.size == len(counts):
        _short_parts(x, offsets, gmm, improved, out, column)
    elif short.size:  # the short parts' rows together
        rows = np.concatenate([x[offsets[p]:offsets[p + 1]] for p in short])
        fvs = np.empty((short.size, width), np.float32)
        _short_parts(rows, np.concatenate([[0], np.cumsum(counts[short])]), gmm, improved,
                     fvs, 0)
        out[short, column:column + width] = fvs


def _short_parts(x, offsets, gmm: _FastGMM, improved, out, column) -> None:
    """:func:`fisher_vectors_of_parts` of parts of at most ``_TASK`` rows each."""
    from featpipe.encode import _fisher_loop
    from featpipe.numba_cache import announce

    k, dim = gmm.means_shape
    n, parts = x.shape[0], len(offsets) - 1
    kind = ("parts", _capacity(n), _capacity(parts), k, dim)
    buffers = _Workspace.take(kind, lambda: (  # the sums are kept at zero between calls
        np.empty((kind[1], 2 * dim), np.float32), np.empty((kind[1], k), np.float32),
        np.zeros((kind[2], k, dim)), np.zeros((kind[2], k, dim)), np.zeros((kind[2], k)),
        np.zeros(kind[2], np.int64)))
    lhs, raw = buffers[0][:n], buffers[1][:n]
    sums = tuple(b[:parts] for b in buffers[2:5])
    overflow = buffers[5][:parts]
    # the arguments' types follow from x's and out's (the others are this module's arrays)
    types = (x.dtype, x.flags.c_contiguous, x.flags.writeable, out.flags.c_contiguous)
    if types not in _ANNOUNCED:
        announce("Fisher-vector kernels", (_fisher_loop.squared_operand, (x, gmm.center, lhs)),
                 (_fisher_loop.accumulate, (raw, x, offsets, *gmm.kernel_args, *sums,
                                            overflow)))
        _ANNOUNCED.add(types)
    if not _fisher_loop.squared_operand(x, gmm.center, lhs):
        raise InputError("descriptors: contains NaN or Inf")
    with np.errstate(over="ignore", invalid="ignore"):
        for p in range(parts):
            for start in range(offsets[p], offsets[p + 1], _BLOCK):
                stop = min(start + _BLOCK, offsets[p + 1])
                mahalanobis_gemm(lhs[start:stop], gmm.rhs, out=raw[start:stop])
    _fisher_loop.accumulate(raw, x, offsets, *gmm.kernel_args, *sums, overflow)
    if np.any(overflow) or _fisher_rows(*sums, np.diff(offsets).astype(np.float64), gmm,
                                        improved, out, column, clear=True):
        raise _too_large(x)  # (the buffers, not cleared, are left to the collector)
    _Workspace.give(kind, buffers)


#: the argument types of :func:`_short_parts`'s kernels already announced
_ANNOUNCED: set = set()


def _capacity(n: int) -> int:
    """n rounded up to a power of two (at least 8): the sizes of kept buffers."""
    return max(8, 1 << (int(n) - 1).bit_length())


class _Workspace:
    """Buffers of :func:`_accumulate` kept for its next tasks and calls (fresh memory costs
    page faults: ~160 per task at K = 256, D = 64, a quarter of a 1,024-descriptor task): a
    thread's GEMM operand and result for a block, a task's sums.  Each kind is kept up to the
    most that were in use at once."""

    _free: dict[tuple, list] = {}

    @classmethod
    def take(cls, kind: tuple, make):
        """A kept buffer of ``kind``, else ``make()``."""
        try:
            return cls._free.setdefault(kind, []).pop()
        except IndexError:
            return make()

    @classmethod
    def give(cls, kind: tuple, buffers) -> None:
        cls._free.setdefault(kind, []).append(buffers)


@functools.cache
def _thread_pool(threads: int):
    """The pool whose threads help the caller's with the tasks of :func:`_accumulate` (one
    per thread count)."""
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(threads, thread_name_prefix="featpipe-fisher")


def pyramid_regions(positions, image_size, pyramid: str) -> list[np.ndarray]:
    """Boolean masks of the descriptors in each pyramid cell, level by level.

    ``positions`` (N, >=2) holds x, y (pixels); ``image_size`` is (height, width), or None to use
    the descriptors' bounding box.  Cells are ``columns x rows`` (``3x1`` = three horizontal
    bands).  A descriptor on a cell border belongs to the cell on its right/below.
    """
    levels = PYRAMIDS[pyramid]
    positions = np.asarray(positions, dtype=np.float64)
    xs, ys = positions[:, 0], positions[:, 1]
    if image_size is not None:
        height, width = float(image_size[0]), float(image_size[1])
        x0 = y0 = 0.0
    else:
        x0, y0 = (float(xs.min()), float(ys.min())) if xs.size else (0.0, 0.0)
        width = float(xs.max()) - x0 + 1.0 if xs.size else 1.0
        height = float(ys.max()) - y0 + 1.0 if xs.size else 1.0
    masks = []
    for cols, rows in levels:
        cx = np.clip(((xs - x0) / width * cols).astype(int), 0, cols - 1)
        cy = np.clip(((ys - y0) / height * rows).astype(int), 0, rows - 1)
        for r in range(rows):
            for c in range(cols):
                masks.append((cx == c) & (cy == r))
    return masks


class FisherVector(ValidatedEstimator, TransformerMixin, BaseEstimator):
    """Fisher-vector encoder (VLFeat layout; improved by default), scikit-learn's contract.

    ``FisherVector(n_components=256).fit(descriptors).transform(items)``: ``fit`` takes the
    descriptors to fit a :class:`GaussianMixtureModel` on, as one (n, D) array or a list of
    them; with ``gmm`` it uses that fitted diagonal GMM instead (a
    :class:`GaussianMixtureModel` or scikit-learn's
    ``GaussianMixture(covariance_type="diag")``).  ``transform`` takes a *list* of (n_i, D)
    descriptor arrays, one per item, or a stack (items, n, D), and returns (items, 2KD) float32.
    A single 2-D array is refused: it would be one image's descriptors, and encoding its rows
    as separate items would be silently wrong (this is also why scikit-learn's
    ``check_estimator``, which feeds 2-D arrays, cannot run every check on it).

    Parameters
    ----------
    n_components : int
        Number of Gaussians K of the GMM fitted by ``fit`` (unused with ``gmm``).
    improved : bool
        Signed square root, then L2 normalisation (VLFeat's improved FV).
    posterior_threshold : float
        Pairs with a posterior below this are skipped (VLFeat: 1e-6).
    max_iter : int
        Most EM iterations of the GMM fitted by ``fit``.
    random_state : int
        Seed of the GMM fitted by ``fit``.
    gmm : GaussianMixtureModel, sklearn.mixture.GaussianMixture or None
        A fitted diagonal GMM to use instead of fitting one.

    Attributes
    ----------
    weights_ (K,), means_ (K, D), variances_ (K, D): the GMM used; gmm_: the fitted GMM
    object; n_iter_: EM iterations of the fitted GMM (0 with ``gmm``); n_features_in_.
    """

    _parameter_constraints = {
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "improved": ["boolean"],
        "posterior_threshold": [Interval(Real, 0, 1, closed="left")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "random_state": ["random_state"],
        "gmm": [HasMethods(["fit"]), None],
    }

    def __init__(self, n_components=256, improved=True, posterior_threshold=POSTERIOR_THRESHOLD,
                 max_iter=100, random_state=0, gmm=None):
        self.n_components = n_components
        self.improved = improved
        self.posterior_threshold = posterior_threshold
        self.max_iter = max_iter
        self.random_state = random_state
        self.gmm = gmm

    def fit(self, X, y=None):
        """Fit the GMM on descriptors ``X``: one (n, D) array or a list of them (with ``gmm``
        the data only has to match its dimension)."""
        self._validate_params()
        if isinstance(X, list | tuple):
            X = np.concatenate([_check_descriptors(d) for d in X])
        try:
            X = validate_data(self, X, dtype=[np.float64, np.float32])
        except ValueError as err:
            raise InputError(f"descriptors: {err}") from None
        if self.gmm is not None:
            self.gmm_ = self.gmm
            self.weights_, self.means_, self.variances_ = diagonal_gmm_arrays(self.gmm)
            self.n_iter_ = 0
            if self.means_.shape[1] != X.shape[1]:
                raise InputError(f"descriptors: dimension {X.shape[1]} does not match the "
                                 f"GMM's {self.means_.shape[1]}")
        else:
            self.gmm_ = GaussianMixtureModel(self.n_components, max_iter=self.max_iter,
                                             random_state=self.random_state).fit(X)
            self.weights_, self.means_, self.variances_ = check_gmm(
                self.gmm_.weights_, self.gmm_.means_, self.gmm_.variances_)
            self.n_iter_ = self.gmm_.n_iter_
        return self

    def transform(self, X: Sequence[np.ndarray]) -> np.ndarray:
        if not hasattr(self, "means_"):
            raise InputError("FisherVector is not fitted: call fit() first")
        if isinstance(X, np.ndarray) and X.ndim == 2:
            raise InputError("transform expects a list of (n_i, D) descriptor arrays, one per "
                             "item; got one 2-D array (wrap it in a list)")
        out = [fisher_vector(x, self.weights_, self.means_, self.variances_, self.improved,
                             self.posterior_threshold) for x in X]
        return np.stack(out) if out else np.zeros((0, 2 * self.means_.size), np.float32)


def diagonal_gmm_arrays(gmm) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights, means, variances) of a fitted diagonal GMM: a :class:`GaussianMixtureModel`
    or scikit-learn's ``GaussianMixture(covariance_type="diag")``."""
    if not hasattr(gmm, "means_"):
        raise ParameterError("gmm", f"must be a fitted GMM, got an unfitted "
                             f"{type(gmm).__name__}")
    if hasattr(gmm, "variances_"):
        variances = gmm.variances_
    elif getattr(gmm, "covariance_type", None) == "diag":
        variances = gmm.covariances_
    else:
        raise ParameterError("gmm", "must have diagonal covariances (scikit-learn: "
                             f"covariance_type='diag'), got "
                             f"{getattr(gmm, 'covariance_type', type(gmm).__name__)!r}")
    return check_gmm(gmm.weights_, gmm.means_, variances)


# -- `featpipe encode --method fisher` -------------------------------------------------------

class FisherItemEncoder(ValidatedEstimator):
    """Encodes stage items with a stored GMM (``fit gmm`` or ``fit deep-gmm``).

    Parameters
    ----------
    arrays : dict of ndarray
        The GMM (``weights``, ``means``, ``variances``, with a leading class axis for per-class
        models) and optionally a projection applied first (``pca_mean``, ``pca_components``).
    improved : bool
        Signed square root, then L2 normalisation (VLFeat's improved FV).
    pyramid : {"none", "1x1+2x2+3x1"}
        Spatial pyramid from the ``positions`` sidecar: one FV per cell, concatenated.
    posterior_cutoff : float
        Pairs with a posterior below this are skipped (VLFeat: 1e-6).
    per_frame : bool
        One FV per frame (``frame_index`` sidecar or (F, n, D) items) instead of per item.

    Item layouts accepted:

    * ``(N, D)`` descriptors of one image; with ``pyramid`` the ``positions`` sidecar
      (N, >=2: x, y[, scale]) places them, and an optional ``image_size`` sidecar (height,
      width) fixes the extent (else the descriptors' bounding box);
    * per frame (``per_frame``): ``(N, D)`` with a ``frame_index`` sidecar (N,) of 0-based frame
      indices, giving ``(F, 2KD)`` with F = length of the ``timestamps`` sidecar when present,
      else ``max(frame) + 1`` (frames without descriptors encode to zeros); or ``(F, n, D)``;
      ``frame_index`` and ``timestamps`` sidecars go with the frames.

    Items are read as :class:`~featpipe.items.LocalFeatures`; ``stream(sink)`` encodes the
    frames of one item as extraction produces them (the same accumulation as the whole item).

    A GMM with a class axis (per-class deep Fisher models) encodes the concatenation of the
    per-class FVs, in the model's class order.
    """

    _parameter_constraints = {
        "arrays": [dict],
        "improved": ["boolean"],
        "pyramid": [StrOptions(set(PYRAMIDS))],
        "posterior_cutoff": [Interval(Real, 0, 1, closed="left")],
        "per_frame": ["boolean"],
    }

    @classmethod
    def _check_param_rules(cls, params):
        if params.get("per_frame") and params.get("pyramid", "none") != "none":
            raise ParameterError("per_frame", "cannot be combined with a pyramid")

    def __init__(self, arrays: Mapping[str, np.ndarray], improved=True, pyramid="none",
                 posterior_cutoff=POSTERIOR_THRESHOLD, per_frame=False):
        means = np.asarray(arrays["means"])
        stack = means.ndim == 3
        self.gmms = [check_gmm(w, m, v) for w, m, v in zip(
            *(np.asarray(arrays[k]) if stack else np.asarray(arrays[k])[None]
              for k in ("weights", "means", "variances")), strict=True)]
        # in the float64 layout the projection takes (exact: they are float32 or float64), so
        # that no frame converts them again
        self.pca_mean, self.pca_components = (
            None if arrays.get(k) is None else np.ascontiguousarray(arrays[k], np.float64)
            for k in ("pca_mean", "pca_components"))
        self.improved = improved
        self.pyramid = pyramid
        self.threshold = posterior_cutoff
        self.per_frame = per_frame
        self._prepared = None  # the GMMs as the encoder's pass takes them (_FastGMM)
        self.check_param_values({"improved": improved, "pyramid": pyramid,
                                 "posterior_cutoff": posterior_cutoff, "per_frame": per_frame})

    @property
    def input_dim(self) -> int:
        if self.pca_components is not None:
            return int(self.pca_components.shape[1])
        return int(self.gmms[0][1].shape[1])

    def _check(self, x) -> None:
        if x.ndim != 2 or x.shape[1] != self.input_dim:
            raise InputError(f"descriptors of shape {x.shape}: expected (N, {self.input_dim})")

    def _project(self, x):
        self._check(x)
        if self.pca_components is None:
            return x
        return project(x, self.pca_mean, self.pca_components)

    @property
    def width(self) -> int:
        """Values of one FV: 2·K·D per GMM."""
        return 2 * sum(m.size for _, m, _ in self.gmms)

    def _encode(self, frames):
        """The FVs of ``frames`` (F, width): their descriptors encoded together
        (:meth:`encode_parts`)."""
        for frame in frames:
            self._check(np.asarray(frame.descriptors))
        x, offsets = frame_rows(frames)
        out = np.empty((len(frames), self.width), np.float32)
        with single_threaded_blas():  # one limit for the projection and the GEMMs
            self.encode_parts(x, offsets, out)
        return out

    def encode_parts(self, x, offsets, out, column=0) -> None:
        """out[p, column:column + width] = the FV of rows offsets[p] .. offsets[p + 1] − 1 of
        the descriptors ``x`` (the frames of a video; ``out`` C-ordered), projected together,
        by :func:`fisher_vectors_of_parts` (each part's FV to the bit that of the part
        alone); the GMMs are prepared once per encoder.  Call with BLAS limited to one thread
        (:func:`featpipe.backend.single_threaded_blas`)."""
        if self._prepared is None:
            self._prepared = [_FastGMM(w, m, v, self.threshold) for w, m, v in self.gmms]
        x = self._project(x)
        for gmm in self._prepared:
            _encode_parts(x, offsets, gmm, self.improved, out, column)
            column += 2 * gmm.mc.size

    def stream(self, sink):
        """Encode one item frame by frame (:class:`~featpipe.items.FrameStream`): per-frame
        FVs as they come, or the item's FV accumulated over its frames."""
        if self.per_frame:
            return PerFrameStream(self._encode, sink, skip_empty=False)
        return _FisherItemStream(self, sink)

    def _encode_record(self, array, extra):
        array = np.asarray(array)
        if self.per_frame:
            record = LocalFeatures.from_item(array, extra, stacked="frames")
            if record.frame_index is None:
                raise InputError("--per-frame needs (F, n, D) items or a 'frame_index' sidecar "
                                 "(one frame index per descriptor)")
            return stream_item(self, record, 2 * sum(m.size for _, m, _ in self.gmms))
        # the whole item is one part of the accumulation: the bounding box of all its
        # descriptors places the pyramid when the item has no image_size
        image_size = extra.get("image_size")
        frame = Frame(array, 0, None, extra.get("positions"),
                      None if image_size is None else tuple(np.ravel(image_size)[:2]))
        sink = MemorySink()
        stream = self.stream(sink)
        stream.add(frame)
        stream.finish()
        return sink.output()

    def encode_one(self, array, extra: Mapping[str, np.ndarray]) -> np.ndarray:
        out = self._encode_record(array, extra)
        return out.array if isinstance(out, ItemOutput) else out

    def encode_batch(self, arrays, extras):
        return [self._encode_record(a, e) for a, e in zip(arrays, extras, strict=True)]


class _FisherItemStream:
    """The FV of one item accumulated frame by frame: an accumulator per pyramid cell and per
    GMM, each frame's descriptors projected and added to the cells it covers."""

    def __init__(self, encoder: FisherItemEncoder, sink):
        self.encoder = encoder
        self.sink = sink
        cells = sum(cols * rows for cols, rows in PYRAMIDS[encoder.pyramid])
        self.parts = [[FisherAccumulator(w, m, v, encoder.improved, encoder.threshold)
                       for w, m, v in encoder.gmms] for _ in range(cells)]

    def add(self, frame) -> None:
        x = self.encoder._project(np.asarray(frame.descriptors))
        if self.encoder.pyramid == "none":
            masks = [slice(None)]
        else:
            positions = frame.positions
            if positions is None or len(positions) != len(x) or np.ndim(positions) != 2:
                raise InputError("--pyramid needs a 'positions' sidecar (N, >=2: x, y) with "
                                 "one row per descriptor")
            masks = pyramid_regions(positions, frame.image_size, self.encoder.pyramid)
        for mask, accumulators in zip(masks, self.parts, strict=True):
            for accumulator in accumulators:
                accumulator.add(x[mask])

    def finish(self) -> None:
        self.sink.write(np.concatenate([a.result() for cell in self.parts for a in cell]))


def _build(params, models):
    params = {k: v for k, v in params.items() if k != "gmm"}
    from featpipe.encode.fisher_groups import GroupedFisherEncoder, is_grouped

    if is_grouped(models["gmm"]):  # fit gmm --groups: one GMM per descriptor group
        return GroupedFisherEncoder(models["gmm"], lambda arrays: FisherItemEncoder(
            arrays, **params), params.get("per_frame", False))
    return FisherItemEncoder(gmm_stage_arrays(models["gmm"]), **params)


def gmm_stage_arrays(stage) -> dict[str, np.ndarray]:
    """The GMM arrays of a ``fit gmm`` or ``fit deep-gmm`` stage, with the projection of its
    ``pca`` model (whitening folded in) as ``pca_mean`` and ``pca_components``."""
    arrays, _ = stage.load_model("gmm")
    if stage.has_model(MODEL_NAME):
        mean, components = stage.load_model(MODEL_NAME, PCAProjection).projection()
        arrays.update(pca_mean=mean, pca_components=components)
    return arrays


def _encode_methods():
    from featpipe.encode.registry import EncodeMethod

    gmm = model_parameter("gmm", "GMM model stage.", ("fit gmm", "fit deep-gmm"))
    return [EncodeMethod(
        "fisher", "Fisher vectors on a GMM (VLFeat layout, improved FV)", _build,
        (gmm, *estimator_parameters(FisherItemEncoder, exclude=("arrays",))), batch_size=8,
        kinds=FISHER)]


ENCODE_METHODS = _encode_methods()
