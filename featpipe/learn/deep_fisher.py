"""Deep Fisher kernel learning: the GMM learned together with the SVM.

Sydorov, Sakurada, Lampert, "Deep Fisher Kernels -- End to End Learning of the Fisher Kernel
GMM Parameters", CVPR 2014, Algorithm 1.  Block-coordinate descent on

    J(theta) = min_w  1/2 ||w||^2 + (C/n) sum_i max(0, 1 - y_i <w, phi_i(theta)>)^2

where phi_i is the improved Fisher vector (VLFeat layout, see :mod:`featpipe.encode.fisher`)
of image i under the diagonal GMM theta = (a, mu, s): unnormalised log weights a
(pi = softmax(a)), means mu and log standard deviations s = log sigma.  Each iteration: FVs for
the current GMM; the squared-hinge SVM by liblinear (``-s 2 -c C/n -B -1``: liblinear
minimises 1/2||w||^2 + C' sum_i loss_i, so C' = C/n; no bias); the gradient of the loss with
respect to theta at fixed w (the envelope theorem makes it the gradient of J); a backtracking
line search on the loss at fixed w; the update; renormalised weights (a <- a - logsumexp a).
Stops after ``max_iter`` iterations, when no step decreases the objective, or when the
validation score has not improved for ``patience`` iterations; the GMM with the best
validation score is kept (the initial one counts).

Modes: ``per-class`` learns one GMM per class (one-vs-rest, its own SVM); ``shared`` learns one
GMM for all classes, the multi-task objective being the sum of the per-class objectives
(paper eq. 6).

Gradient (reverse mode, O(T K D) like the FV itself, instead of the paper's explicit Jacobian):
with d_tk = (x_t - mu_k)/sigma_k, push g_phi back through the L2 normalisation
(g_psi = (g_phi - phi <phi, g_phi>)/||psi||), the signed square root
(g_z = g_psi / (2 sqrt|z|), zero where z = 0), then through u_k, v_k: a direct term at fixed
posteriors, a term through c_k = 1/(T sqrt(pi_k)), and the posterior term
dgamma_tk = gamma_tk (dl_tk - sum_j gamma_tj dl_tj) with l_tk = log pi_k N(x_t; mu_k, sigma_k).
All sums over t are GEMMs on [x^2, x], so the gradient costs about two FV passes.  Options of
the paper: ``posterior_cutoff`` leaves pairs with gamma < cutoff out of the posterior term
(an approximation; 0 = exact), ``subsample`` computes the gradient on a seeded fraction of each
image's descriptors.  Written against the array API: numpy, torch, CuPy, array_api_strict.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import Interval, StrOptions

from featpipe.backend import device_namespace, namespace, to_numpy
from featpipe.encode.fisher import POSTERIOR_THRESHOLD, PRIOR_THRESHOLD, check_gmm
from featpipe.errors import InputError
from featpipe.models import ArrayModel
from featpipe.parameters import ValidatedEstimator, check_params

log = logging.getLogger(__name__)

MODES = ("shared", "per-class")


def _logsumexp(xp, a, axis):
    top = xp.max(a, axis=axis, keepdims=True)
    return xp.squeeze(top, axis=axis) + xp.log(xp.sum(xp.exp(a - top), axis=axis))


@dataclass
class FisherCache:
    """Intermediate values of one forward pass, reused by the backward pass."""

    xc: object
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
    norm: float


def fisher_forward(x, a, mu, s, threshold=POSTERIOR_THRESHOLD):
    """Improved FV of descriptors ``x`` (T, D) under theta = (a, mu, s), and its cache.

    Same definition as :func:`featpipe.encode.fisher.fisher_vector` (VLFeat): pi = softmax(a),
    sigma = exp(s); pairs with gamma < ``threshold`` and components with pi < 1e-6 skipped.
    """
    xp = namespace(x, a, mu, s)
    k, dim = mu.shape
    t = x.shape[0]
    log_pi = a - _logsumexp(xp, a, 0)
    pi = xp.exp(log_pi)
    valid = pi >= PRIOR_THRESHOLD
    center = xp.mean(mu, axis=0)
    xc = x - center
    mc = mu - center
    inv_sigma = xp.exp(-s)
    inv_var = inv_sigma * inv_sigma
    lhs = xp.concat([xc * xc, xc], axis=1)
    rhs = xp.concat([inv_var, -2.0 * mc * inv_var], axis=1)
    maha = lhs @ xp.permute_dims(rhs, (1, 0)) + xp.sum(mc * mc * inv_var, axis=1)
    neg_inf = xp.full_like(log_pi, -math.inf)
    logp = xp.where(valid, log_pi, neg_inf) - xp.sum(s, axis=1) - 0.5 * maha
    logp = logp - xp.max(logp, axis=1, keepdims=True)
    # posteriors below e^-60 (float32) or e^-600 (float64) are irrelevant; flooring them keeps
    # every product of the backward pass a normal number (subnormals are 10-100x slower)
    floor = -60.0 if logp.dtype == xp.float32 else -600.0
    e = xp.exp(xp.where(logp > floor, logp, xp.full_like(logp, floor)))
    gamma = e / xp.sum(e, axis=1, keepdims=True)
    mask = gamma >= threshold
    g = xp.where(mask, gamma, xp.zeros_like(gamma))
    s0 = xp.sum(g, axis=0)[:, None]
    gt = xp.permute_dims(g, (1, 0))
    s1 = gt @ xc
    s2 = gt @ (xc * xc)
    sd = (s1 - mc * s0) * inv_sigma
    sdd = (s2 - 2.0 * mc * s1 + mc * mc * s0) * inv_var
    safe_pi = xp.where(valid, pi, xp.ones_like(pi))
    cu = xp.where(valid, 1.0 / (max(t, 1) * xp.sqrt(safe_pi)), xp.zeros_like(pi))[:, None]
    cv = cu / math.sqrt(2.0)
    u = cu * sd
    v = cv * (sdd - s0)
    z = xp.concat([xp.reshape(u, (-1,)), xp.reshape(v, (-1,))])
    psi = xp.sign(z) * xp.sqrt(xp.abs(z))
    norm = float(xp.sqrt(xp.sum(psi * psi)))
    phi = psi / max(norm, 1e-12)
    return phi, FisherCache(xc, lhs, mc, inv_sigma, inv_var, pi, gamma, mask, s0, sd, sdd, cu,
                            cv, u, v, z, phi, norm)


def fisher_backward(cache: FisherCache, g_phi, posterior_cutoff=0.0):
    """Vector-Jacobian product: d<g_phi, phi>/d(a, mu, s) as three arrays (K,), (K, D), (K, D).

    ``posterior_cutoff`` > 0 leaves pairs with gamma < cutoff out of the posterior term (the
    paper's speed trick; an approximation of order cutoff); 0 gives the exact gradient.
    """
    c = cache
    xp = namespace(g_phi, c.phi)
    k, dim = c.mc.shape
    if c.norm > 1e-12:
        g_psi = (g_phi - c.phi * xp.sum(c.phi * g_phi)) / c.norm
    else:
        g_psi = g_phi / 1e-12
    absz = xp.abs(c.z)
    nonzero = absz > 0
    g_z = xp.where(nonzero, g_psi * 0.5 / xp.sqrt(xp.where(nonzero, absz, xp.ones_like(absz))),
                   xp.zeros_like(absz))
    gu = xp.reshape(g_z[:k * dim], (k, dim))
    gv = xp.reshape(g_z[k * dim:], (k, dim))
    # through c_k = 1/(T sqrt(pi_k)): dc_k/da_l = -c_k (delta_kl - pi_l) / 2
    amount = xp.sum(gu * c.u + gv * c.v, axis=1)
    g_a = -0.5 * (amount - c.pi * xp.sum(amount))
    # direct term at fixed posteriors: dd/dmu = -1/sigma, dd/ds = -d
    hu = c.cu * gu
    hv = 2.0 * c.cv * gv
    g_mu = -c.inv_sigma * (hu * c.s0 + hv * c.sd)
    g_s = -(hu * c.sd + hv * c.sdd)
    # posterior term: q_tk = d<g, z>/dgamma_tk, r_tk = gamma_tk (q_tk - sum_j gamma_tj q_tj)
    wv = c.cv * gv * c.inv_var
    wu = c.cu * gu * c.inv_sigma
    rhs = xp.concat([wv, wu - 2.0 * wv * c.mc], axis=1)
    const = xp.sum(wv * c.mc * c.mc - wu * c.mc, axis=1) - xp.sum(c.cv * gv, axis=1)
    q = c.lhs @ xp.permute_dims(rhs, (1, 0)) + const
    q = xp.where(c.mask, q, xp.zeros_like(q))
    qbar = xp.sum(c.gamma * q, axis=1, keepdims=True)
    r = c.gamma * (q - qbar)
    if posterior_cutoff > 0:
        r = xp.where(c.gamma >= posterior_cutoff, r, xp.zeros_like(r))
    r0 = xp.sum(r, axis=0)
    g_a = g_a + r0 - c.pi * xp.sum(r0)
    r_moments = xp.permute_dims(r, (1, 0)) @ c.lhs  # [sum r x^2, sum r x]
    rxx, rx = r_moments[:, :dim], r_moments[:, dim:]
    r0 = r0[:, None]
    g_mu = g_mu + (rx - c.mc * r0) * c.inv_var
    g_s = g_s + (rxx - 2.0 * c.mc * rx + c.mc * c.mc * r0) * c.inv_var - r0
    return g_a, g_mu, g_s


# -- the squared-hinge SVM -------------------------------------------------------------------

def train_squared_hinge(phi: np.ndarray, y: np.ndarray, C: float, tol: float) -> np.ndarray:
    """w minimising 1/2||w||^2 + (C/n) sum_i max(0, 1 - y_i <w, phi_i>)^2, by liblinear
    (``-s 2 -c C/n -B -1 -e tol``); ``y`` in {-1, +1}."""
    from liblinear import liblinearutil

    n = phi.shape[0]
    model = liblinearutil.train(np.asarray(y, dtype=np.float64),
                                np.ascontiguousarray(phi, dtype=np.float64),
                                f"-s 2 -c {C / n!r} -B -1 -e {tol!r} -q")
    w = np.ctypeslib.as_array(model.w, shape=(model.nr_feature,)).copy()
    return w if model.get_labels()[0] == 1 else -w


def svm_objective(w: np.ndarray, phi: np.ndarray, y: np.ndarray, C: float) -> float:
    """1/2||w||^2 + (C/n) sum_i max(0, 1 - y_i <w, phi_i>)^2 (per class, summed over rows)."""
    w = np.atleast_2d(w)
    margins = np.maximum(0.0, 1.0 - y * (phi @ w.T))
    return float(0.5 * np.sum(w * w) + C / phi.shape[0] * np.sum(margins * margins))


# -- the learner -----------------------------------------------------------------------------

@dataclass
class _Task:
    """One GMM being learned and the columns (classes) of the label matrix it serves."""

    columns: list[int]
    theta: tuple
    history: list[dict] = field(default_factory=list)


class DeepFisherKernel(ArrayModel, ValidatedEstimator, BaseEstimator):
    """Learn the GMM of a Fisher-vector encoding together with linear SVMs (Algorithm 1).

    ``fit(train, y_train, val, y_val, gmm)`` takes the validation part and the starting GMM
    explicitly (not scikit-learn's ``fit(X, y)``), so ``GridSearchCV`` does not apply; ``clone``
    and ``get_params`` do.

    Parameters
    ----------
    C : float
        SVM cost C in 1/2||w||^2 + (C/n) sum sq. hinge (liblinear -c C/n).
    mode : {"shared", "per-class"}
        One multi-task GMM, or one GMM per class (one-vs-rest).
    max_iter : int
        Iteration budget.
    patience : int
        Stop after this many iterations without a better validation score.
    posterior_cutoff : float
        Leave pairs with posterior below this out of the gradient (the paper's
        approximation; 0 = exact).
    subsample : float
        Fraction of each item's descriptors used for the gradient.
    max_step : float
        First trial step: the largest change of a, mu/sigma or s.
    line_search_steps : int
        Step halvings tried before stopping.
    svm_tol : float
        liblinear -e.
    random_state : int
        Seed of the descriptor subsampling.
    device : {"cpu", "cuda"}
        cuda runs the FVs and gradients on CuPy (or torch) when present.
    xp : array-API namespace or None
        Overrides device (tests: array_api_strict, torch).
    dtype : {"float64", "float32"}
        Precision of the FVs and gradients during learning.

    Attributes
    ----------
    classes_, weights_, means_, variances_ (with a leading class axis in per-class mode),
    history_ (per task, per iteration: objective, validation score, step, accepted),
    best_iteration_, svm_weights_ (per class, for the kept GMM).
    """

    _model_name = "deep-gmm"
    _fitted_arrays = ("weights_", "means_", "variances_", "svm_weights_")
    _fitted_meta = ("classes_", "history_", "best_iteration_")
    _parameter_constraints = {
        "C": [Interval(Real, 0, None, closed="neither")],
        "mode": [StrOptions(set(MODES))],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "patience": [Interval(Integral, 1, None, closed="left")],
        "posterior_cutoff": [Interval(Real, 0, 1, closed="left")],
        "subsample": [Interval(Real, 0, 1, closed="right")],
        "max_step": [Interval(Real, 0, None, closed="neither")],
        "line_search_steps": [Interval(Integral, 1, None, closed="left")],
        "svm_tol": [Interval(Real, 0, None, closed="neither")],
        "random_state": [Interval(Integral, 0, None, closed="left")],
        "device": [StrOptions({"cpu", "cuda"})],
        "xp": "no_validation",
        "dtype": [StrOptions({"float64", "float32"})],
    }

    def __init__(self, C=1.0, mode="shared", max_iter=20, patience=3, posterior_cutoff=1e-5,
                 subsample=0.1, max_step=0.5, line_search_steps=8, svm_tol=1e-4,
                 random_state=0, device="cpu", xp=None, dtype="float64"):
        self.C = C
        self.mode = mode
        self.max_iter = max_iter
        self.patience = patience
        self.posterior_cutoff = posterior_cutoff
        self.subsample = subsample
        self.max_step = max_step
        self.line_search_steps = line_search_steps
        self.svm_tol = svm_tol
        self.random_state = random_state
        self.device = device
        self.xp = xp
        self.dtype = dtype

    # -- helpers ----------------------------------------------------------------------------
    def _namespace(self):
        if self.xp is not None:
            return self.xp, None
        return device_namespace(self.device)

    def _to_xp(self, array):
        xp, device = self._ns
        dtype = getattr(xp, self.dtype)
        if device is None or device == "cpu":
            return xp.asarray(np.asarray(array, dtype=np.float64), dtype=dtype)
        return xp.asarray(np.asarray(array, dtype=np.float64), dtype=dtype, device=device)

    def _encode(self, theta, items):
        return np.stack([to_numpy(fisher_forward(x, *theta)[0]).astype(np.float64)
                         for x in items])

    def _gradient(self, theta, items, g_phi, rng):
        xp = self._ns[0]
        total = [xp.zeros_like(p) for p in theta]
        for i, x in enumerate(items):
            if not np.any(g_phi[i]):
                continue  # not a margin violator: no contribution
            t = x.shape[0]
            if self.subsample < 1.0 and t > 1:
                m = max(1, int(math.ceil(self.subsample * t)))
                pick = np.sort(rng.choice(t, size=m, replace=False))
                x = xp.take(x, self._to_index(pick), axis=0)
            _, cache = fisher_forward(x, *theta)
            grads = fisher_backward(cache, self._to_xp(g_phi[i]), self.posterior_cutoff)
            total = [acc + g for acc, g in zip(total, grads, strict=True)]
        return total

    def _to_index(self, index):
        xp, device = self._ns
        if device is None or device == "cpu":
            return xp.asarray(index)
        return xp.asarray(index, device=device)

    def _svms(self, phi, y):
        return np.stack([train_squared_hinge(phi, y[:, j], self.C, self.svm_tol)
                         for j in range(y.shape[1])])

    def _score(self, w, phi, y, n_classes):
        scores = phi @ w.T
        if n_classes > 1 and y.shape[1] == n_classes:  # shared multi-class: accuracy
            return float(np.mean(np.argmax(scores, axis=1) == np.argmax(y, axis=1)))
        from sklearn.metrics import average_precision_score

        truth = y[:, 0] > 0
        if truth.any():
            return float(average_precision_score(truth, scores[:, 0]))
        return float(np.mean((scores[:, 0] > 0) == truth))

    # -- fitting ----------------------------------------------------------------------------
    def _validate(self, train, y_train, val, y_val, gmm):
        if self.xp is None:
            self._validate_params()
        else:  # a namespace overrides the device; checking the device would need a GPU
            check_params(self._parameter_constraints, self.get_params(deep=False))
        weights, means, variances = check_gmm(*gmm)
        for what, items, labels in (("train", train, y_train), ("validation", val, y_val)):
            if len(items) != len(labels):
                raise InputError(f"{what}: {len(items)} items but {len(labels)} labels")
            for j, x in enumerate(items):
                x = np.asarray(x)
                if x.ndim != 2 or x.shape[1] != means.shape[1]:
                    raise InputError(f"{what} item {j}: descriptors of shape {x.shape}, expected "
                                     f"(N, {means.shape[1]})")
        if not len(train) or not len(val):
            raise InputError("need at least one train and one validation item")
        classes = np.unique(np.asarray(y_train))
        if classes.size < 2:
            raise InputError(f"need at least 2 classes in the train labels, got {classes}")
        return weights, means, variances, classes

    def fit(self, train: Sequence[np.ndarray], y_train, val: Sequence[np.ndarray], y_val, gmm):
        """Learn from train descriptor sets (list of (T_i, D)) and labels, selecting on the
        validation sets; ``gmm`` = (weights, means, variances) to start from."""
        weights, means, variances, classes = self._validate(train, y_train, val, y_val, gmm)
        self._ns = self._namespace()
        self.classes_ = classes
        y_tr = np.where(np.asarray(y_train)[:, None] == classes[None, :], 1.0, -1.0)
        y_va = np.where(np.asarray(y_val)[:, None] == classes[None, :], 1.0, -1.0)
        train_x = [self._to_xp(x) for x in train]
        val_x = [self._to_xp(x) for x in val]
        theta0 = (np.log(np.maximum(weights, 1e-300)), means, 0.5 * np.log(variances))
        if self.mode == "shared":
            column_sets = [list(range(len(classes)))]
        else:
            column_sets = [[j] for j in range(len(classes))]
        results = [self._learn(columns, theta0, train_x, y_tr[:, columns], val_x,
                               y_va[:, columns], len(classes)) for columns in column_sets]
        arrays = [self._gmm_arrays(theta) for theta, _, _, _ in results]
        stack = (lambda i: arrays[0][i]) if self.mode == "shared" else \
            (lambda i: np.stack([a[i] for a in arrays]))
        self.weights_, self.means_, self.variances_ = stack(0), stack(1), stack(2)
        self.svm_weights_ = np.concatenate([w for _, w, _, _ in results])
        self.history_ = [h for _, _, h, _ in results]
        self.best_iteration_ = [b for _, _, _, b in results]
        return self

    def _gmm_arrays(self, theta):
        a, mu, s = (to_numpy(p).astype(np.float64) for p in theta)
        pi = np.exp(a - a.max())
        return pi / pi.sum(), mu, np.exp(2.0 * s)

    def _renormalise(self, theta):
        xp = self._ns[0]
        a, mu, s = theta
        return a - _logsumexp(xp, a, 0), mu, s

    def _learn(self, columns, theta0, train_x, y_tr, val_x, y_va, n_classes):
        xp = self._ns[0]
        theta = self._renormalise(tuple(self._to_xp(p) for p in theta0))
        phi = self._encode(theta, train_x)
        w = self._svms(phi, y_tr)
        objective = svm_objective(w, phi, y_tr, self.C)
        score = self._score(w, self._encode(theta, val_x), y_va, n_classes)
        history = [{"iteration": 0, "objective": objective, "validation": score, "step": 0.0}]
        best = (score, theta, w, 0)
        stale = 0
        n = phi.shape[0]
        for it in range(1, self.max_iter + 1):
            rng = np.random.default_rng([self.random_state, it, columns[0]])
            slack = np.maximum(0.0, 1.0 - y_tr * (phi @ w.T))  # (n, classes)
            g_phi = -(2.0 * self.C / n) * (slack * y_tr) @ w
            g_a, g_mu, g_s = self._gradient(theta, train_x, g_phi, rng)
            sigma = xp.exp(theta[2])
            direction = (-g_a, -(sigma * sigma) * g_mu, -g_s)
            largest = max(float(xp.max(xp.abs(direction[0]))),
                          float(xp.max(xp.abs(direction[1] / sigma))),
                          float(xp.max(xp.abs(direction[2]))))
            if not largest > 0:
                break
            step = self.max_step / largest
            accepted = None
            for _ in range(self.line_search_steps):
                trial = self._renormalise(tuple(p + step * d for p, d in
                                                zip(theta, direction, strict=True)))
                phi_trial = self._encode(trial, train_x)
                if svm_objective(w, phi_trial, y_tr, self.C) < objective:
                    accepted = trial
                    break
                step /= 2.0
            if accepted is None:
                break  # no step decreases the objective: a (local) optimum for this budget
            theta, phi = accepted, phi_trial
            w_new = self._svms(phi, y_tr)
            if svm_objective(w_new, phi, y_tr, self.C) <= svm_objective(w, phi, y_tr, self.C):
                w = w_new
            objective = svm_objective(w, phi, y_tr, self.C)
            score = self._score(w, self._encode(theta, val_x), y_va, n_classes)
            history.append({"iteration": it, "objective": objective, "validation": score,
                            "step": step})
            log.info("iteration %d/%d: objective %.6g, validation %.4f, step %.3g",
                     it, self.max_iter, objective, score, step)
            if score > best[0]:
                best, stale = (score, theta, w, it), 0
            else:
                stale += 1
                if stale >= self.patience:
                    break
        return best[1], best[2], history, best[3]

    @classmethod
    def from_arrays(cls, arrays, meta) -> DeepFisherKernel:
        model = super().from_arrays(arrays, meta)
        model.classes_ = np.asarray(model.classes_)
        return model
