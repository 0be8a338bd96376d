"""Discriminative hierarchical rank pooling (DHRP): a learned non-linearity ψ(W x) trained
through the rank-pooling argmin.

Seed paper: B. Fernando, P. Anderson, M. Hutter, S. Gould, "Discriminative Hierarchical Rank
Pooling for Activity Recognition", CVPR 2016, section 4.4 and its supplementary derivation;
the argmin gradient follows S. Gould et al., "On differentiating parameterized argmin and
argmax problems", 2016 (Lemma 3), as used by Fernando & Gould, ICML 2016.

Model, for one item X = <x_1..x_T> (the final-layer sequence X^(L) of hierarchical rank
pooling, or any per-frame sequence), in the paper's order (ψ before the smoothing)::

    z_t = ψ(W x_t)            W ∈ R^{D×D}, initialised to I
    m_t = (1/t) Σ_{τ≤t} z_τ    time-varying mean (TVM)
    v_t = m_t / ‖m_t‖          L2 (an all-zero row stays zero)
    u*  = argmin_u ½‖u‖² + C Σ_t max(0, |t − uᵀv_t| − ε)²     (liblinear -s 11, no bias)
    h_c = w_cᵀ n(u*) + b_c,  p(c|X) = softmax(h)_c

n is the L2 normalisation (``normalize="l2"``, as ``classify --normalize l2``) or the
identity.

ψ is one of (δ > 0 smooths the square root, whose slope is infinite at 0)::

    ssr:  sign(z)·(√(|z| + δ) − √δ)
    ser:  [√(max(z, 0) + δ) − √δ,  √(max(−z, 0) + δ) − √δ]       (doubles D)
    tanh: tanh(z)

The network (W, the argmin, the classifier) is the torch module
:class:`featpipe.nn.dhrp.DiscriminativeRankPoolingNet`; the argmin's autograd function is
:class:`featpipe.nn.functional.RankPoolArgmin`.  Training minimises the mean negative
log-likelihood plus
λ/2 (‖W − I‖²_F + Σ_c ‖w_c‖²) (the biases b_c unregularised) by mini-batch SGD (momentum 0.9)
or Adam with a cosine learning-rate schedule, stopping early on a validation fold of the train
items.  The classifier starts where the paper starts it, "to those obtained from the linear SVM
classifier", and that SVM is the one ``featpipe classify --kernel linear --normalize l2 --C
svm_C`` trains on the same encodings u*(I): one-vs-rest libsvm C-SVC with a bias on the linear
kernel of n(u*(I)), w_c = Σ_i α_ci y_ci n(u_i) and b_c = −ρ_c, so that at epoch 0 every score is
``classify``'s decision value and the predictions, hence the accuracy, are ``classify``'s.  The
soft-max then trains all classes jointly (cross-entropy), where ``classify`` keeps C separate
binary hinge-loss problems: the two agree at the start, not after training.

Gradient through the argmin: implicit differentiation of the SVR's optimality condition,
exact (T×T dual solve) or the paper's diagonal Hessian (``hessian``); the formulas and the
functions are in :mod:`featpipe.nn.functional`.  Everything before V (ψ, W, TVM, L2) is plain
autograd.  The forward solve is featpipe's rank-pooling SVR (:mod:`featpipe.encode.svr`).
"""

from __future__ import annotations

import math
import time
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils._param_validation import Interval, StrOptions

from featpipe.classify.svm import DEFAULT_C
from featpipe.encode.registry import EncodeMethod
from featpipe.errors import FeatpipeError, InputError, ParameterError
from featpipe.item_kinds import POOLS_TIME
from featpipe.learn.splits import stratified_split
from featpipe.models import ArrayModel
from featpipe.nn.choices import HESSIAN_CHOICES, PSI_CHOICES
from featpipe.parameters import ValidatedEstimator, estimator_parameters, model_parameter

OPTIMIZER_CHOICES = ("sgd", "adam")
NORMALIZE_CHOICES = ("l2", "none")
MODEL_NAME = "dhrp"


def _torch():
    import torch

    return torch


# -- the estimator -----------------------------------------------------------------------------

class DiscriminativeRankPooling(ArrayModel, ValidatedEstimator, ClassifierMixin, BaseEstimator):
    """DHRP: learn ψ(W x) and a soft-max classifier through the rank-pooling argmin.

    Parameters
    ----------
    psi : {"ssr", "ser", "tanh"}
        Learned non-linearity ψ(W x).
    delta : float
        Smoothing of the square root at 0 for ssr/ser: √(|z| + δ) − √δ.
    C : float
        Rank-pooling SVR C (liblinear's convention).
    epsilon : float
        Rank-pooling SVR ε.
    hessian : {"exact", "diagonal"}
        Gradient through the argmin: exact implicit differentiation, or the paper's diagonal
        approximation of the Hessian.
    optimizer : {"sgd", "adam"}
        sgd (momentum 0.9) or adam.
    lr : float
        Initial learning rate; a cosine schedule brings it to 0 over the epochs.
    epochs : int
        Training epochs.
    batch_size : int
        Sequences per SGD step.
    weight_decay : float
        λ in λ/2 (‖W − I‖² + Σ_c ‖w_c‖²).
    val_fraction : float
        Fraction of the training items held out (stratified) for early stopping; 0 disables.
    patience : int
        Epochs without a lower validation loss before stopping.
    svm_C : float
        C of the linear SVM that initialises the classifier (``classify --C``; its default).
    normalize : {"l2", "none"}
        Normalisation of u* before the classifier (``classify --normalize``).
    random_state : int
        Seed of the initialisation, the hold-out and the shuffling.
    device : {"cpu", "cuda"} or None
        None: CUDA when torch sees a GPU, else CPU.
    solve_dtype : {"float64", "float32"}
        Precision of the SVR forward solve (the model itself runs in float32).

    Attributes
    ----------
    W_ : ndarray (D, D); coef_ : ndarray (n_classes, D_out); intercept_ : ndarray (n_classes);
    classes_ : ndarray of str; coef_init_, intercept_init_ : the linear-SVM initialisation on
    u*(I) (what ``classify`` trains);
    history_ : list of dict (per epoch: train and validation loss and accuracy, seconds);
    best_epoch_ : int (0 = the initialisation); n_features_in_ : int.
    """

    _model_name = MODEL_NAME
    _fitted_arrays = ("W_", "coef_", "intercept_", "coef_init_", "intercept_init_", "classes_")
    _fitted_meta = ("n_features_in_", "best_epoch_", "history_")
    _parameter_constraints = {
        "psi": [StrOptions(set(PSI_CHOICES))],
        "delta": [Interval(Real, 0, None, closed="left")],
        "C": [Interval(Real, 0, None, closed="neither")],
        "epsilon": [Interval(Real, 0, None, closed="left")],
        "hessian": [StrOptions(set(HESSIAN_CHOICES))],
        "optimizer": [StrOptions(set(OPTIMIZER_CHOICES))],
        "lr": [Interval(Real, 0, None, closed="neither")],
        "epochs": [Interval(Integral, 1, None, closed="left")],
        "batch_size": [Interval(Integral, 1, None, closed="left")],
        "weight_decay": [Interval(Real, 0, None, closed="left")],
        "val_fraction": [Interval(Real, 0, 1, closed="left")],
        "patience": [Interval(Integral, 1, None, closed="left")],
        "svm_C": [Interval(Real, 0, None, closed="neither")],
        "normalize": [StrOptions(set(NORMALIZE_CHOICES))],
        "random_state": [Interval(Integral, 0, None, closed="left")],
        "device": [StrOptions({"cpu", "cuda"}), None],
        "solve_dtype": [StrOptions({"float64", "float32"})],
    }

    def __init__(self, psi="ssr", delta=1e-3, C=1.0, epsilon=0.1, hessian="exact",
                 optimizer="adam", lr=0.01, epochs=50, batch_size=16, weight_decay=1e-4,
                 val_fraction=0.2, patience=10, svm_C=DEFAULT_C, normalize="l2", random_state=0,
                 device=None, solve_dtype="float64"):
        self.psi = psi
        self.delta = delta
        self.C = C
        self.epsilon = epsilon
        self.hessian = hessian
        self.optimizer = optimizer
        self.lr = lr
        self.epochs = epochs
        self.batch_size = batch_size
        self.weight_decay = weight_decay
        self.val_fraction = val_fraction
        self.patience = patience
        self.svm_C = svm_C
        self.normalize = normalize
        self.random_state = random_state
        self.device = device
        self.solve_dtype = solve_dtype

    @classmethod
    def _check_param_rules(cls, params):
        if params.get("psi", "ssr") in ("ssr", "ser") and params.get("delta") == 0:
            raise ParameterError("delta", "must be > 0 for psi ssr/ser: the square root has an "
                                 "infinite slope at 0 (try 1e-3)")

    def _torch_device(self):
        torch = _torch()
        if self.device is None:
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise FeatpipeError("device cuda: torch sees no GPU; use device cpu")
        if self.device not in ("cpu", "cuda"):
            raise InputError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        return torch.device(self.device)

    def _check_sequences(self, seqs, ids=None, n_features=None) -> list[np.ndarray]:
        if len(seqs) == 0:
            raise InputError("no sequences given")
        checked = []
        for i, seq in enumerate(seqs):
            # error prefix: the item id, else the position (a lone sequence needs none)
            name = ids[i] if ids is not None else f"sequence {i}" if len(seqs) > 1 else ""
            arr = np.asarray(seq)
            if arr.ndim != 2:
                raise _named_error(name, f"expected a (T, D) sequence, got shape {arr.shape}")
            if arr.shape[0] == 0:
                raise _named_error(name, "empty sequence (T = 0)")
            if arr.dtype.kind not in "biuf" or not np.all(np.isfinite(arr)):
                raise _named_error(name, "sequence has non-finite or non-numeric values")
            d = n_features if n_features is not None else checked[0].shape[1] if checked \
                else arr.shape[1]
            if arr.shape[1] != d:
                raise _named_error(name, f"expected {d} features per frame, got {arr.shape[1]}")
            checked.append(arr)
        return checked

    # -- model pieces ------------------------------------------------------------------------
    def _network(self, n_features: int, n_classes: int, device):
        from featpipe.nn.dhrp import DiscriminativeRankPoolingNet

        torch = _torch()
        solve_dtype = torch.float64 if self.solve_dtype == "float64" else torch.float32
        return DiscriminativeRankPoolingNet(n_features, n_classes, self.psi, self.delta, self.C,
                                            self.epsilon, self.hessian, solve_dtype,
                                            self.normalize).to(device)

    def _encode(self, net, seqs, hessian=None):
        from featpipe.nn.functional import pad_sequences

        X, mask = pad_sequences(seqs, net.W.dtype, net.W.device)
        return net.encode(X, mask, hessian)

    def _batches(self, seqs, fn):
        return [fn(seqs[i:i + self.batch_size]) for i in range(0, len(seqs), self.batch_size)]

    def _fitted_network(self):
        torch = _torch()
        net = self._network(self.n_features_in_, len(self.classes_), self._torch_device())
        with torch.no_grad():
            net.W.copy_(torch.as_tensor(self.W_))
            net.coef.copy_(torch.as_tensor(self.coef_))
            net.intercept.copy_(torch.as_tensor(self.intercept_))
        return net

    # -- fit ---------------------------------------------------------------------------------
    def fit(self, seqs, labels, ids=None, log=None):
        """Learn W and the classifier on labelled sequences; returns self."""
        torch = _torch()
        self._validate_params()
        seqs = self._check_sequences(seqs, ids)
        labels = np.asarray([str(y) for y in labels])
        if len(labels) != len(seqs):
            raise InputError(f"{len(seqs)} sequences but {len(labels)} labels")
        self.classes_ = np.unique(labels)
        if len(self.classes_) < 2:
            raise InputError(f"need at least 2 classes to train, got {list(self.classes_)}")
        y_all = np.searchsorted(self.classes_, labels)
        device = self._torch_device()
        torch.manual_seed(self.random_state)
        rng = np.random.default_rng(self.random_state)
        fit_idx, val_idx = stratified_split(y_all, self.val_fraction, rng)
        fit_seqs = [seqs[i] for i in fit_idx]
        val_seqs = [seqs[i] for i in val_idx]
        y_fit = torch.as_tensor(y_all[fit_idx], device=device)
        y_val = torch.as_tensor(y_all[val_idx], device=device)

        D = seqs[0].shape[1]
        self.n_features_in_ = D
        net = self._network(D, len(self.classes_), device)
        W, coef, intercept = net.W, net.coef, net.intercept
        with torch.no_grad():
            U0 = torch.cat(self._batches(fit_seqs, lambda b: self._encode(net, b)))
        init = _svm_init(U0.cpu().numpy(), y_all[fit_idx], len(self.classes_), self.svm_C,
                         self.normalize)
        self.coef_init_, self.intercept_init_ = (a.astype(np.float32) for a in init)
        with torch.no_grad():
            coef.copy_(torch.as_tensor(self.coef_init_))
            intercept.copy_(torch.as_tensor(self.intercept_init_))
        eye = torch.eye(D, dtype=torch.float32, device=device)

        def objective(U, y, W, coef):
            nll = torch.nn.functional.cross_entropy(net.scores(U), y)
            reg = 0.5 * self.weight_decay * (((W - eye) ** 2).sum() + (coef ** 2).sum())
            return nll, reg

        def evaluate(seq_list, y):
            if not seq_list:
                return float("nan"), float("nan")
            with torch.no_grad():
                U = torch.cat(self._batches(seq_list, lambda b: self._encode(net, b)))
                scores = net.scores(U)
                nll = torch.nn.functional.cross_entropy(scores, y).item()
                acc = (scores.argmax(1) == y).float().mean().item()
            return nll, acc

        if self.optimizer == "adam":
            opt = torch.optim.Adam([W, coef, intercept], lr=self.lr)
        else:
            opt = torch.optim.SGD([W, coef, intercept], lr=self.lr, momentum=0.9)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=int(self.epochs))

        train_nll, train_acc = evaluate(fit_seqs, y_fit)
        val_nll, val_acc = evaluate(val_seqs, y_val)
        history = [{"epoch": 0, "train_loss": train_nll, "train_accuracy": train_acc,
                    "val_loss": val_nll, "val_accuracy": val_acc, "seconds": 0.0}]
        def state():
            return W.detach().clone(), coef.detach().clone(), intercept.detach().clone()

        best = (val_nll if val_seqs else train_nll, 0, state())
        if log:
            log(history[-1])
        stale = 0
        for epoch in range(1, int(self.epochs) + 1):
            start = time.perf_counter()
            order = rng.permutation(len(fit_seqs))
            total = 0.0
            for i in range(0, len(order), self.batch_size):
                chunk = order[i:i + self.batch_size]
                U = self._encode(net, [fit_seqs[j] for j in chunk])
                nll, reg = objective(U, y_fit[chunk], W, coef)
                loss = nll + reg
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += nll.item() * len(chunk)
            schedule.step()
            seconds = time.perf_counter() - start
            train_nll, train_acc = evaluate(fit_seqs, y_fit)
            val_nll, val_acc = evaluate(val_seqs, y_val)
            if not math.isfinite(train_nll):
                raise FeatpipeError(f"DHRP training diverged at epoch {epoch} (loss "
                                    f"{train_nll}); lower the learning rate (lr={self.lr})")
            history.append({"epoch": epoch, "train_loss": train_nll,
                            "train_accuracy": train_acc, "val_loss": val_nll,
                            "val_accuracy": val_acc, "batch_loss": total / len(order),
                            "seconds": seconds})
            if log:
                log(history[-1])
            score = val_nll if val_seqs else train_nll
            if score < best[0]:
                best = (score, epoch, state())
                stale = 0
            else:
                stale += 1
                if val_seqs and stale >= self.patience:
                    break
        _, self.best_epoch_, kept = best
        self.W_, self.coef_, self.intercept_ = (p.cpu().numpy() for p in kept)
        self.history_ = history
        self.n_fit_, self.n_val_ = len(fit_seqs), len(val_seqs)
        self.device_ = str(device)
        return self

    # -- use ---------------------------------------------------------------------------------
    def _check_fitted(self):
        if not hasattr(self, "W_"):
            raise FeatpipeError("this DiscriminativeRankPooling is not fitted yet; call fit")

    def transform(self, seqs, ids=None) -> np.ndarray:
        """u*(W) per sequence, (n, D_out) float32."""
        torch = _torch()
        self._check_fitted()
        seqs = self._check_sequences(seqs, ids, self.n_features_in_)
        net = self._fitted_network()
        with torch.no_grad():
            U = torch.cat(self._batches(seqs, lambda b: self._encode(net, b)))
        return U.cpu().numpy().astype(np.float32)

    def decision_function(self, seqs, ids=None) -> np.ndarray:
        """Soft-max classifier scores h_c = w_cᵀn(u*(W)) + b_c, (n, n_classes)."""
        return self.scores(self.transform(seqs, ids))

    def scores(self, U, initial: bool = False) -> np.ndarray:
        """h_c = w_cᵀn(u) + b_c for encodings U (n, D_out), with the learned classifier or,
        ``initial``, the linear SVM it started from."""
        U = np.asarray(U, dtype=np.float32)
        if self.normalize == "l2":
            norms = np.linalg.norm(U, axis=1, keepdims=True)
            U = U / np.where(norms > 0, norms, 1)
        coef, intercept = (self.coef_init_, self.intercept_init_) if initial else \
            (self.coef_, self.intercept_)
        return U @ coef.T.astype(np.float32) + intercept.astype(np.float32)

    def predict_proba(self, seqs, ids=None) -> np.ndarray:
        scores = self.decision_function(seqs, ids)
        scores = scores - scores.max(axis=1, keepdims=True)
        prob = np.exp(scores)
        return prob / prob.sum(axis=1, keepdims=True)

    def predict(self, seqs, ids=None) -> np.ndarray:
        return self.classes_[np.argmax(self.decision_function(seqs, ids), axis=1)]

    @classmethod
    def from_arrays(cls, arrays, meta) -> DiscriminativeRankPooling:
        """The model back (:mod:`featpipe.models`); it runs on CUDA when present, else CPU."""
        meta = {**meta, "params": {**meta.get("params", {}), "device": None}}
        model = super().from_arrays(arrays, meta)
        model.classes_ = model.classes_.astype(str)
        return model


def _named_error(name: str, message: str) -> InputError:
    return InputError(f"{name}: {message}" if name else message)


def _svm_init(U: np.ndarray, y: np.ndarray, n_classes: int, C: float,
              normalize: str) -> tuple[np.ndarray, np.ndarray]:
    """Classifier (coef (n_classes, D), intercept (n_classes)) from what ``featpipe classify
    --kernel linear --normalize NORMALIZE --C C`` trains on the encodings U of labels y:
    one-vs-rest libsvm C-SVC on the linear kernel of n(U); w_c = Σ_i α_ci y_ci n(u_i),
    b_c = −ρ_c (:class:`featpipe.classify.svm.OneVsRestSVC`).  A class without an item in U
    keeps w_c = 0 and b_c = −1 (the decision value of a negative on its margin)."""
    from featpipe.classify.svm import OneVsRestSVC

    U = np.asarray(U, dtype=np.float64)
    if normalize == "l2":
        norms = np.linalg.norm(U, axis=1, keepdims=True)
        U = U / np.where(norms > 0, norms, 1)
    present = np.unique(y)
    svc = OneVsRestSVC(C=C).fit(U @ U.T, y[:, None] == present[None, :])
    coef = np.zeros((n_classes, U.shape[1]))
    intercept = np.full(n_classes, -1.0)
    for c, index, dual in zip(present, svc.support_, svc.dual_coef_, strict=True):
        coef[c] = dual @ U[index]
    intercept[present] = svc.intercept_
    return coef, intercept


# -- ``featpipe encode --method dhrp`` ---------------------------------------------------------

DHRP_OUTPUTS = ("encoding", "scores")


def load_model(stage) -> DiscriminativeRankPooling:
    """The DHRP model saved by ``featpipe fit dhrp`` in ``stage``."""
    return stage.load_model(MODEL_NAME, DiscriminativeRankPooling)


class DHRPEncoder(ValidatedEstimator):
    """Encodes items with a fitted model: u*(W) (``encoding``) or h = w_cᵀu* (``scores``).

    Parameters
    ----------
    model : DiscriminativeRankPooling
        The fitted model.
    dhrp_output : {"encoding", "scores"}
        The learned encoding u*(W), or the soft-max classifier's scores w_cᵀu*.
    """

    _parameter_constraints = {"model": [DiscriminativeRankPooling],
                              "dhrp_output": [StrOptions(set(DHRP_OUTPUTS))]}

    def __init__(self, model: DiscriminativeRankPooling, dhrp_output: str = "encoding"):
        self.model = model
        self.dhrp_output = dhrp_output

    def encode_batch(self, arrays, extras):
        if self.dhrp_output == "scores":
            return list(self.model.decision_function(arrays))
        return list(self.model.transform(arrays))


def _build(params, models) -> DHRPEncoder:
    return DHRPEncoder(load_model(models["model"]), params["dhrp_output"])


ENCODE_METHODS = [EncodeMethod(
    "dhrp", "discriminative HRP: u*(W) of a model from `fit dhrp` (--model NAME)", _build,
    (model_parameter("model", "Name of a fitted model stage.", ("fit dhrp",)),
     *estimator_parameters(DHRPEncoder, include=("dhrp_output",))),
    batch_size=32, kinds=POOLS_TIME)]
