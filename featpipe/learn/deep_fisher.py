"""Deep Fisher kernel learning: the GMM learned together with the SVM.

Sydorov, Sakurada, Lampert, "Deep Fisher Kernels -- End to End Learning of the Fisher Kernel
GMM Parameters", CVPR 2014, Algorithm 1.  Block-coordinate descent on

    J(theta) = min_w  1/2 ||w||^2 + C sum_i max(0, 1 - y_i <w, phi_i(theta)>)^2

where phi_i is the improved Fisher vector (VLFeat layout, see :mod:`featpipe.encode.fisher`)
of image i under the diagonal GMM theta = (a, mu, s): unnormalised log weights a
(pi = softmax(a)), means mu and log standard deviations s = log sigma.  Each iteration: FVs for
the current GMM; the squared-hinge SVM by liblinear (``-s 2 -c C -B -1``, no bias); the
gradient of the loss with respect to theta at fixed w (the envelope theorem makes it the
gradient of J); a backtracking line search on the loss at fixed w; the update; renormalised
weights (a <- a - logsumexp a).

C is liblinear's and libsvm's C: the weight of the *summed* loss, the meaning ``featpipe
classify --C`` has (there with the hinge loss of libsvm's C-SVC).  The paper writes C/n with a
mean loss; its C is n times ours.

Stopping (``selection``): ``last``, the paper's rule, runs ``max_iter`` iterations (fewer
only when no step of the line search decreases the objective) and keeps the last GMM;
``validation`` keeps the GMM with the best validation mAP (the initial one counts) and stops
when it has not improved for ``patience`` iterations.  Every iteration records the
objective, the step, and the average precision of the task's own SVMs on the learning and the
validation items (per class, and their mean): the paper's evaluation (Table 2a: trained on
train, AP on val).  For the initial and the kept GMM the validation AP is also taken under the
classifier ``featpipe classify`` trains (libsvm C-SVC *with* a bias, linear kernel on the
unit-norm FVs, one-vs-rest, the same C): the paper's SVM has no bias, and part of its
validation gain is the learned GMM making up for the missing bias, which no ordinary SVM needs;
the gain under ``classify``'s SVM is the one that carries over to the kernel transfer
(``libsvm_validation_ap_``; measured in benchmarks/results/deep-fisher.md).

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

Batching (the device path): the images' descriptors stay on the device, concatenated; the FVs
of all images come from the FV body :func:`featpipe.encode.fisher.fisher_vectors` on length
buckets (one GEMM and one batched segment sum per bucket; ``BATCH_BYTES`` of working memory on
a GPU, ``CPU_BATCH_BYTES`` on the CPU, where cache-sized buckets are faster),
the gradient from one forward and one reverse pass per bucket of margin violators, and the
SVMs of all classes from one liblinear problem built from a CSR matrix.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import Interval, StrOptions

from featpipe.backend import device_namespace, namespace, refuse_grad, to_numpy
from featpipe.encode.fisher import (
    POSTERIOR_THRESHOLD,
    FisherCache,
    check_gmm,
    fisher_vectors,
    logsumexp,
)
from featpipe.errors import InputError
from featpipe.models import ArrayModel
from featpipe.parameters import ValidatedEstimator, check_params

log = logging.getLogger(__name__)

MODES = ("shared", "per-class")
SELECTIONS = ("last", "validation")
#: Working memory of one batch of images in the FV forward and reverse passes, in bytes: on a
#: GPU, and on the CPU (measured on 2 cores, 50 x 1,500 x 64, K = 64: 4-16 MiB buckets fit a
#: deep Fisher iteration in 1.1 s, 64-256 MiB in 1.5-1.7 s).
BATCH_BYTES = 256 * 2**20
CPU_BATCH_BYTES = 8 * 2**20


def fisher_forward(x, a, mu, s, threshold=POSTERIOR_THRESHOLD):
    """Improved FV of descriptors ``x`` (T, D) under theta = (a, mu, s), and its cache.

    One item of :func:`featpipe.encode.fisher.fisher_vectors` (the FV body shared with the
    encoder): pi = softmax(a), sigma = exp(s); pairs with gamma < ``threshold`` and components
    with pi < 1e-6 skipped.  Differentiable under torch autograd.
    """
    phi, cache = fisher_vectors(x[None, ...], a, mu, s, threshold=threshold)
    return phi[0, ...], cache


def fisher_backward(cache: FisherCache, g_phi, posterior_cutoff=0.0):
    """Vector-Jacobian product: d<g_phi, phi>/d(a, mu, s), summed over the items of the
    forward batch, as three arrays (K,), (K, D), (K, D).  ``g_phi`` is (2KD,) for one item or
    (B, 2KD).

    ``posterior_cutoff`` > 0 leaves pairs with gamma < cutoff out of the posterior term (the
    paper's speed trick; an approximation of order cutoff); 0 gives the exact gradient.  A
    gradient by hand, not an autograd graph: tensors that require grad are refused.
    """
    c = cache
    xp = namespace(g_phi, c.phi)
    refuse_grad(g_phi, c.phi, what="fisher_backward (a hand-written gradient)")
    if g_phi.ndim == 1:
        g_phi = g_phi[None, :]
    B, k, dim = c.sd.shape
    norm = c.norm[:, None]
    safe = xp.where(norm > 1e-12, norm, xp.full_like(norm, 1e-12))
    g_psi = xp.where(norm > 1e-12,
                     (g_phi - c.phi * xp.sum(c.phi * g_phi, axis=-1, keepdims=True)) / safe,
                     g_phi / 1e-12)
    absz = xp.abs(c.z)
    nonzero = absz > 0
    g_z = xp.where(nonzero, g_psi * 0.5 / xp.sqrt(xp.where(nonzero, absz, xp.ones_like(absz))),
                   xp.zeros_like(absz))
    gu = xp.reshape(g_z[:, :k * dim], (B, k, dim))
    gv = xp.reshape(g_z[:, k * dim:], (B, k, dim))
    # through c_k = 1/(T sqrt(pi_k)): dc_k/da_l = -c_k (delta_kl - pi_l) / 2
    amount = xp.sum(gu * c.u + gv * c.v, axis=-1)
    g_a = -0.5 * (amount - c.pi * xp.sum(amount, axis=-1, keepdims=True))
    # direct term at fixed posteriors: dd/dmu = -1/sigma, dd/ds = -d
    hu = c.cu * gu
    hv = 2.0 * c.cv * gv
    g_mu = -c.inv_sigma * (hu * c.s0 + hv * c.sd)
    g_s = -(hu * c.sd + hv * c.sdd)
    # posterior term: q_tk = d<g, z>/dgamma_tk, r_tk = gamma_tk (q_tk - sum_j gamma_tj q_tj)
    wv = c.cv * gv * c.inv_var
    wu = c.cu * gu * c.inv_sigma
    rhs = xp.concat([wv, wu - 2.0 * wv * c.mc], axis=-1)  # (B, K, 2D)
    const = xp.sum(wv * c.mc * c.mc - wu * c.mc, axis=-1) - xp.sum(c.cv * gv, axis=-1)
    q = c.lhs @ xp.permute_dims(rhs, (0, 2, 1)) + const[:, None, :]  # (B, T, K)
    q = xp.where(c.mask, q, xp.zeros_like(q))
    qbar = xp.sum(c.gamma * q, axis=-1, keepdims=True)
    r = c.gamma * (q - qbar)
    if posterior_cutoff > 0:
        r = xp.where(c.gamma >= posterior_cutoff, r, xp.zeros_like(r))
    r0 = xp.sum(r, axis=1)  # (B, K)
    g_a = g_a + r0 - c.pi * xp.sum(r0, axis=-1, keepdims=True)
    r_moments = xp.permute_dims(r, (0, 2, 1)) @ c.lhs  # (B, K, 2D): [sum r x^2, sum r x]
    rxx, rx = r_moments[..., :dim], r_moments[..., dim:]
    r0 = r0[:, :, None]
    g_mu = g_mu + (rx - c.mc * r0) * c.inv_var
    g_s = g_s + (rxx - 2.0 * c.mc * rx + c.mc * c.mc * r0) * c.inv_var - r0
    return xp.sum(g_a, axis=0), xp.sum(g_mu, axis=0), xp.sum(g_s, axis=0)


# -- the squared-hinge SVM -------------------------------------------------------------------

def train_squared_hinge(phi: np.ndarray, y: np.ndarray, C: float, tol: float) -> np.ndarray:
    """w minimising 1/2||w||^2 + C sum_i max(0, 1 - y_i <w, phi_i>)^2, by liblinear
    (``-s 2 -c C -B -1 -e tol``); ``y`` in {-1, +1}."""
    return train_squared_hinge_classes(phi, np.asarray(y, dtype=np.float64)[:, None], C, tol)[0]


def train_squared_hinge_classes(phi: np.ndarray, Y: np.ndarray, C: float,
                                tol: float) -> np.ndarray:
    """One squared-hinge SVM per column of Y (n, classes) in {-1, +1} -> W (classes, dim).

    The FVs reach liblinear once, as a ``scipy.sparse.csr_matrix``: liblinear's Python API
    copies a CSR matrix into its feature nodes by a compiled loop (``csr_to_problem`` in
    ``liblinear/liblinear.py``, numba-compiled once per process), where a dense array is
    converted row by row in Python (``gen_feature_nodearray``, 35 % of a deep Fisher
    iteration before).  The CSR matrix is the dense array with explicit column indices (no
    scan for zeros; a stored zero adds nothing to liblinear's products).  The problem is
    built once and only its labels change per class.
    """
    from liblinear import liblinear, liblinearutil
    from scipy import sparse

    n, dim = phi.shape
    Y = np.asarray(Y, dtype=np.float64)
    columns = np.tile(np.arange(dim, dtype=np.int32), n)
    rows = sparse.csr_matrix((np.ascontiguousarray(phi, dtype=np.float64).ravel(), columns,
                              np.arange(0, n * dim + 1, dim)), shape=(n, dim))
    problem = liblinear.problem(Y[:, 0], rows)
    labels = np.ctypeslib.as_array(problem.y, (n,))
    W = np.zeros((Y.shape[1], phi.shape[1]))
    for j in range(Y.shape[1]):
        labels[:] = Y[:, j]
        model = liblinearutil.train(problem, liblinear.parameter(
            f"-s 2 -c {float(C)!r} -B -1 -e {tol!r} -q"))
        w = np.ctypeslib.as_array(model.w, shape=(model.nr_feature,))
        W[j, :w.shape[0]] = w if model.get_labels()[0] == 1 else -w
    return W


def svm_objective(w: np.ndarray, phi: np.ndarray, y: np.ndarray, C: float) -> float:
    """1/2||w||^2 + C sum_i max(0, 1 - y_i <w, phi_i>)^2 (per class, summed over rows)."""
    w = np.atleast_2d(w)
    margins = np.maximum(0.0, 1.0 - y * (phi @ w.T))
    return float(0.5 * np.sum(w * w) + C * np.sum(margins * margins))


def _json_number(value):
    """JSON-safe: NaN (AP of a class without positives) becomes None."""
    return None if value is None or math.isnan(value) else value


def _ranked(score):
    """A validation mAP for comparisons: None (no positives) ranks lowest."""
    return -math.inf if score is None else score


def average_precisions(scores: np.ndarray, y: np.ndarray) -> list[float]:
    """Average precision of each column of ``scores`` (n, classes) for the labels ``y`` in
    {-1, +1} (scikit-learn's, the area under the non-interpolated precision-recall curve); NaN
    for a column without positives."""
    from sklearn.metrics import average_precision_score

    return [float(average_precision_score(y[:, j] > 0, scores[:, j])) if np.any(y[:, j] > 0)
            else float("nan") for j in range(y.shape[1])]


# -- items on the device, in length buckets --------------------------------------------------

@dataclass
class Bucket:
    """Items ``index`` (into the item list) padded to ``width`` descriptors; ``lengths`` is
    None when they all have ``width``."""

    index: np.ndarray
    width: int
    lengths: list[int] | None


def bucket_plan(lengths: Sequence[int], row_bytes: int, budget: int = BATCH_BYTES):
    """Items sorted by length, cut into buckets padded to their longest item: padding within
    25 % (+ 16 rows) and ``width × count × row_bytes`` within ``budget``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(lengths, kind="stable")
    buckets, start = [], 0
    for i in range(1, len(order) + 1):
        if i == len(order) or lengths[order[i]] > 1.25 * lengths[order[start]] + 16 or \
                (i + 1 - start) * max(1, int(lengths[order[i]])) * row_bytes > budget:
            index = order[start:i]
            width = int(lengths[index[-1]])
            same = bool(np.all(lengths[index] == width))
            buckets.append(Bucket(index, width, None if same else
                                  [int(n) for n in lengths[index]]))
            start = i
    return buckets


class _Items:
    """Descriptor sets held once on the device, concatenated (N, D), with host offsets; full
    sets are served padded per bucket (cached), subsets gathered by one ``take``."""

    def __init__(self, items, to_xp, n_components: int):
        arrays = [np.asarray(x, dtype=np.float64) for x in items]
        self.count = len(arrays)
        self.dim = arrays[0].shape[1]
        self.lengths = np.asarray([x.shape[0] for x in arrays], dtype=np.int64)
        self.offsets = np.cumsum(self.lengths) - self.lengths
        flat = np.concatenate(arrays + [np.zeros((1, self.dim))])  # a zero row pads
        self.flat = to_xp(flat)
        self.to_xp = to_xp
        # forward and reverse passes keep about 6 arrays of K and 3 of D per descriptor
        itemsize = namespace(self.flat).finfo(self.flat.dtype).bits // 8
        self.row_bytes = (6 * n_components + 3 * self.dim) * itemsize
        on_cpu = "cpu" in str(getattr(self.flat, "device", "cpu")).lower()
        self.budget = CPU_BATCH_BYTES if on_cpu else BATCH_BYTES
        self.buckets = bucket_plan(self.lengths, self.row_bytes, self.budget)
        self._padded = {}

    def gather(self, items, rows, width):
        """Rows ``rows[j]`` of item ``items[j]``, padded with zero rows -> (len(items), width,
        D)."""
        index = np.full((len(items), width), self.flat.shape[0] - 1, dtype=np.int64)
        for j, (item, picked) in enumerate(zip(items, rows, strict=True)):
            index[j, :len(picked)] = self.offsets[item] + picked
        xp = namespace(self.flat)
        device = getattr(self.flat, "device", None)
        taken = xp.take(self.flat, xp.asarray(index.reshape(-1), device=device), axis=0)
        return xp.reshape(taken, (len(items), width, self.dim))

    def padded(self, bucket):
        key = id(bucket)
        if key not in self._padded:
            self._padded[key] = self.gather(bucket.index, [np.arange(n) for n in
                                                          self.lengths[bucket.index]],
                                            bucket.width)
        return self._padded[key]


# -- the learner -----------------------------------------------------------------------------

class DeepFisherKernel(ArrayModel, ValidatedEstimator, BaseEstimator):
    """Learn the GMM of a Fisher-vector encoding together with linear SVMs (Algorithm 1).

    ``fit(train, y_train, val, y_val, gmm)`` takes the validation part and the starting GMM
    explicitly (not scikit-learn's ``fit(X, y)``), so ``GridSearchCV`` does not apply; ``clone``
    and ``get_params`` do.

    Parameters
    ----------
    C : float
        SVM cost C in 1/2||w||^2 + C sum of squared hinge losses (liblinear -c C): the
        meaning of ``classify --C`` (libsvm's C, hinge loss); the paper writes (C/n)·Σ over
        n items, so its C is n times this one.
    mode : {"shared", "per-class"}
        One multi-task GMM, or one GMM per class (one-vs-rest).
    max_iter : int
        Iterations of Algorithm 1 (the paper runs a fixed number, 100).
    selection : {"last", "validation"}
        The paper's stopping rule (run max_iter iterations, keep the last GMM), or keep the
        GMM with the best validation mAP and stop after ``patience`` iterations without one.
    patience : int
        With selection validation: iterations without a better validation mAP before
        stopping.
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
    history_ (per task, per iteration: objective, step, ``train`` and ``validation`` mAP of the
    task's own SVMs, ``train_ap`` and ``validation_ap`` per class), best_iteration_ (the kept
    iteration), svm_weights_ (per class, for the kept GMM), libsvm_validation_ap_ (per task,
    ``base`` and ``learned``: the validation AP per class of the classifier ``featpipe
    classify`` trains on the learning items' FVs of the initial and of the kept GMM; empty
    lists without validation items).
    """

    _model_name = "deep-gmm"
    _fitted_arrays = ("weights_", "means_", "variances_", "svm_weights_")
    _fitted_meta = ("classes_", "history_", "best_iteration_", "libsvm_validation_ap_")
    _parameter_constraints = {
        "C": [Interval(Real, 0, None, closed="neither")],
        "mode": [StrOptions(set(MODES))],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "selection": [StrOptions(set(SELECTIONS))],
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

    def __init__(self, C=1.0, mode="shared", max_iter=20, selection="last", patience=3,
                 posterior_cutoff=1e-5, subsample=0.1, max_step=0.5, line_search_steps=8,
                 svm_tol=1e-4, random_state=0, device="cpu", xp=None, dtype="float64"):
        self.C = C
        self.mode = mode
        self.max_iter = max_iter
        self.selection = selection
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
        """The FVs (n, 2KD) of all items, float64 numpy, one batched forward per bucket."""
        out = np.zeros((items.count, 2 * items.dim * theta[1].shape[0]))
        for bucket in items.buckets:
            phi, _ = fisher_vectors(items.padded(bucket), *theta, lengths=bucket.lengths)
            out[bucket.index] = to_numpy(phi)
        return out

    def _gradient(self, theta, items, g_phi, rng):
        """Σ over margin violators of the VJP of <g_phi_i, phi_i> on a seeded fraction of
        each violator's descriptors: batches of violators, one forward and one reverse pass
        each (segment sums over the concatenated descriptors)."""
        xp = self._ns[0]
        total = [xp.zeros_like(p) for p in theta]
        violators = np.flatnonzero(np.any(g_phi != 0, axis=1))
        picks = []
        for i in violators:
            t = int(items.lengths[i])
            if self.subsample < 1.0 and t > 1:
                m = max(1, int(math.ceil(self.subsample * t)))
                picks.append(np.sort(rng.choice(t, size=m, replace=False)))
            else:
                picks.append(np.arange(t))
        for bucket in bucket_plan([len(p) for p in picks], items.row_bytes, items.budget):
            X = items.gather(violators[bucket.index], [picks[j] for j in bucket.index],
                             bucket.width)
            _, cache = fisher_vectors(X, *theta, lengths=bucket.lengths)
            grads = fisher_backward(cache, self._to_xp(g_phi[violators[bucket.index]]),
                                    self.posterior_cutoff)
            total = [acc + g for acc, g in zip(total, grads, strict=True)]
        return total

    def _svms(self, phi, y):
        return train_squared_hinge_classes(phi, y, self.C, self.svm_tol)

    def _scores(self, w, phi, y):
        """Per-class AP of the SVMs ``w`` on (phi, y) and their mean (None without items)."""
        if phi.shape[0] == 0:
            return None, []
        ap = average_precisions(phi @ w.T, y)
        return float(np.nanmean(ap)) if not np.all(np.isnan(ap)) else float("nan"), ap

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
        if not len(train):
            raise InputError("need at least one train item")
        if not len(val) and self.selection == "validation":
            raise InputError("selection validation needs validation items")
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
        k = means.shape[0]
        train_x = _Items(train, self._to_xp, k)
        val_x = _Items(val, self._to_xp, k) if len(val) else None
        theta0 = (np.log(np.maximum(weights, 1e-300)), means, 0.5 * np.log(variances))
        if self.mode == "shared":
            column_sets = [list(range(len(classes)))]
        else:
            column_sets = [[j] for j in range(len(classes))]
        results = [self._learn(columns, theta0, train_x, y_tr[:, columns], val_x,
                               y_va[:, columns]) for columns in column_sets]
        arrays = [self._gmm_arrays(theta) for theta, *_ in results]
        stack = (lambda i: arrays[0][i]) if self.mode == "shared" else \
            (lambda i: np.stack([a[i] for a in arrays]))
        self.weights_, self.means_, self.variances_ = stack(0), stack(1), stack(2)
        self.svm_weights_ = np.concatenate([w for _, w, *_ in results])
        self.history_ = [h for _, _, h, _, _ in results]
        self.best_iteration_ = [b for _, _, _, b, _ in results]
        self.libsvm_validation_ap_ = [ap for _, _, _, _, ap in results]
        return self

    def _gmm_arrays(self, theta):
        a, mu, s = (to_numpy(p).astype(np.float64) for p in theta)
        pi = np.exp(a - a.max())
        return pi / pi.sum(), mu, np.exp(2.0 * s)

    def _renormalise(self, theta):
        a, mu, s = theta
        return a - logsumexp(a, axis=0), mu, s

    def _libsvm_validation_ap(self, theta, train_x, y_tr, val_x, y_va) -> list:
        """Validation AP per class of what ``featpipe classify --kernel linear --normalize l2``
        trains on the learning items' FVs of ``theta`` (libsvm C-SVC with a bias, one-vs-rest,
        C = this C; the FVs are unit-norm already); [] without validation items."""
        from featpipe.classify.svm import OneVsRestSVC

        if val_x is None:
            return []
        phi, val_phi = self._encode(theta, train_x), self._encode(theta, val_x)
        svc = OneVsRestSVC(C=self.C).fit(phi @ phi.T, y_tr > 0)
        return [_json_number(v) for v in
                average_precisions(svc.decision_function(val_phi @ phi.T), y_va)]

    def _record(self, it, theta, w, phi, y_tr, val_x, y_va, step):
        """One row of the history: objective, step, train and validation AP of w."""
        train, train_ap = self._scores(w, phi, y_tr)
        val_phi = self._encode(theta, val_x) if val_x is not None else np.zeros((0, 1))
        validation, val_ap = self._scores(w, val_phi, y_va)
        clean = _json_number
        return {"iteration": it, "objective": svm_objective(w, phi, y_tr, self.C),
                "step": step, "train": clean(train), "validation": clean(validation),
                "train_ap": [clean(v) for v in train_ap],
                "validation_ap": [clean(v) for v in val_ap]}

    def _learn(self, columns, theta0, train_x, y_tr, val_x, y_va):
        xp = self._ns[0]
        theta = initial = self._renormalise(tuple(self._to_xp(p) for p in theta0))
        phi = self._encode(theta, train_x)
        w = self._svms(phi, y_tr)
        history = [self._record(0, theta, w, phi, y_tr, val_x, y_va, 0.0)]
        objective = history[0]["objective"]
        best = (_ranked(history[0]["validation"]), theta, w, 0)
        stale = 0
        for it in range(1, self.max_iter + 1):
            rng = np.random.default_rng([self.random_state, it, columns[0]])
            slack = np.maximum(0.0, 1.0 - y_tr * (phi @ w.T))  # (n, classes)
            g_phi = -(2.0 * self.C) * (slack * y_tr) @ w
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
            history.append(self._record(it, theta, w, phi, y_tr, val_x, y_va, step))
            objective = history[-1]["objective"]
            log.info("iteration %d/%d: objective %.6g, train mAP %.4f, validation mAP %s, "
                     "step %.3g", it, self.max_iter, objective, history[-1]["train"],
                     history[-1]["validation"], step)
            if self.selection == "last":
                best = (None, theta, w, it)
            elif _ranked(history[-1]["validation"]) > best[0]:
                best, stale = (_ranked(history[-1]["validation"]), theta, w, it), 0
            else:
                stale += 1
                if stale >= self.patience:
                    break
        libsvm_ap = {"base": self._libsvm_validation_ap(initial, train_x, y_tr, val_x, y_va),
                     "learned": self._libsvm_validation_ap(best[1], train_x, y_tr, val_x, y_va)}
        return best[1], best[2], history, best[3], libsvm_ap

    @classmethod
    def from_arrays(cls, arrays, meta) -> DeepFisherKernel:
        model = super().from_arrays(arrays, meta)
        model.classes_ = np.asarray(model.classes_)
        return model
