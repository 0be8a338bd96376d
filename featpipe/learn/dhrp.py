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
    h_c = w_cᵀ u*,  p(c|X) = softmax(h)_c

ψ is one of (δ > 0 smooths the square root, whose slope is infinite at 0)::

    ssr:  sign(z)·(√(|z| + δ) − √δ)
    ser:  [√(max(z, 0) + δ) − √δ,  √(max(−z, 0) + δ) − √δ]       (doubles D)
    tanh: tanh(z)

The network (W, the argmin, the classifier) is the torch module
:class:`featpipe.nn.dhrp.DiscriminativeRankPoolingNet`; the argmin's autograd function is
:class:`featpipe.nn.functional.RankPoolArgmin`.  Training minimises the mean negative
log-likelihood plus
λ/2 (‖W − I‖²_F + Σ_c ‖w_c‖²) by mini-batch SGD (momentum 0.9) or Adam with a cosine
learning-rate schedule, stopping early on a validation fold of the train items; the w_c are
initialised from a linear SVM (liblinear through scikit-learn's LinearSVC, no intercept) on
u*(I).

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

from featpipe.encode.registry import EncodeMethod
from featpipe.errors import FeatpipeError, InputError, ParameterError
from featpipe.learn.splits import stratified_split
from featpipe.models import ArrayModel
from featpipe.nn.choices import HESSIAN_CHOICES, PSI_CHOICES
from featpipe.parameters import ValidatedEstimator, estimator_parameters, model_parameter

OPTIMIZER_CHOICES = ("sgd", "adam")
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
        C of the linear SVM that initialises the classifier.
    random_state : int
        Seed of the initialisation, the hold-out and the shuffling.
    device : {"cpu", "cuda"} or None
        None: CUDA when torch sees a GPU, else CPU.
    solve_dtype : {"float64", "float32"}
        Precision of the SVR forward solve (the model itself runs in float32).

    Attributes
    ----------
    W_ : ndarray (D, D); coef_ : ndarray (n_classes, D_out); classes_ : ndarray of str;
    coef_init_ : ndarray (n_classes, D_out), the linear-SVM initialisation on u*(I);
    history_ : list of dict (per epoch: train and validation loss and accuracy, seconds);
    best_epoch_ : int (0 = the initialisation); n_features_in_ : int.
    """

    _model_name = MODEL_NAME
    _fitted_arrays = ("W_", "coef_", "coef_init_", "classes_")
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
        "random_state": [Interval(Integral, 0, None, closed="left")],
        "device": [StrOptions({"cpu", "cuda"}), None],
        "solve_dtype": [StrOptions({"float64", "float32"})],
    }

    def __init__(self, psi="ssr", delta=1e-3, C=1.0, epsilon=0.1, hessian="exact",
                 optimizer="adam", lr=0.01, epochs=50, batch_size=16, weight_decay=1e-4,
                 val_fraction=0.2, patience=10, svm_C=1.0, random_state=0, device=None,
                 solve_dtype="float64"):
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
                                            self.epsilon, self.hessian, solve_dtype).to(device)

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
        W, coef = net.W, net.coef
        with torch.no_grad():
            U0 = torch.cat(self._batches(fit_seqs, lambda b: self._encode(net, b)))
        self.coef_init_ = _svm_init(U0.cpu().numpy(), y_all[fit_idx], len(self.classes_),
                                    self.svm_C, self.random_state).astype(np.float32)
        with torch.no_grad():
            coef.copy_(torch.as_tensor(self.coef_init_))
        eye = torch.eye(D, dtype=torch.float32, device=device)

        def objective(U, y, W, coef):
            nll = torch.nn.functional.cross_entropy(U @ coef.T, y)
            reg = 0.5 * self.weight_decay * (((W - eye) ** 2).sum() + (coef ** 2).sum())
            return nll, reg

        def evaluate(seq_list, y):
            if not seq_list:
                return float("nan"), float("nan")
            with torch.no_grad():
                U = torch.cat(self._batches(seq_list, lambda b: self._encode(net, b)))
                scores = U @ coef.T
                nll = torch.nn.functional.cross_entropy(scores, y).item()
                acc = (scores.argmax(1) == y).float().mean().item()
            return nll, acc

        if self.optimizer == "adam":
            opt = torch.optim.Adam([W, coef], lr=self.lr)
        else:
            opt = torch.optim.SGD([W, coef], lr=self.lr, momentum=0.9)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=int(self.epochs))

        train_nll, train_acc = evaluate(fit_seqs, y_fit)
        val_nll, val_acc = evaluate(val_seqs, y_val)
        history = [{"epoch": 0, "train_loss": train_nll, "train_accuracy": train_acc,
                    "val_loss": val_nll, "val_accuracy": val_acc, "seconds": 0.0}]
        best = (val_nll if val_seqs else train_nll, 0, W.detach().clone(),
                coef.detach().clone())
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
                best = (score, epoch, W.detach().clone(), coef.detach().clone())
                stale = 0
            else:
                stale += 1
                if val_seqs and stale >= self.patience:
                    break
        _, self.best_epoch_, W_best, coef_best = best
        self.W_ = W_best.cpu().numpy()
        self.coef_ = coef_best.cpu().numpy()
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
        """Soft-max classifier scores h_c = w_cᵀu*(W), (n, n_classes)."""
        return self.transform(seqs, ids) @ self.coef_.T.astype(np.float32)

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


def _svm_init(U: np.ndarray, y: np.ndarray, n_classes: int, C: float, seed: int) -> np.ndarray:
    """Classifier weights (n_classes, D) from a linear SVM without intercept on u*(I).

    One-vs-rest LinearSVC (liblinear); with two classes the single hyperplane f becomes
    w_0 = −f/2, w_1 = f/2, so that h_1 − h_0 = f.
    """
    from sklearn.svm import LinearSVC

    present = np.unique(y)
    svm = LinearSVC(C=C, fit_intercept=False, max_iter=100_000, tol=1e-6, random_state=seed)
    svm.fit(U, y)
    coef = np.zeros((n_classes, U.shape[1]))
    if len(present) == 2:
        coef[present[0]] = -svm.coef_[0] / 2
        coef[present[1]] = svm.coef_[0] / 2
    else:
        coef[present] = svm.coef_
    return coef


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
    batch_size=32)]
