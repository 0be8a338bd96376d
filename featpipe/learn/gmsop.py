"""GM-SOP: global gated mixture of second-order pooling (Wang, Gao, Xie, Zuo, Li, NeurIPS'18).

A learned encoder of conv maps X ∈ R^{N×D} (N positions, D channels), trained with torch on
precomputed maps (the backbone stays fixed):

    components   Σ_j = (X P_j)ᵀ(X P_j) / N,  P_j ∈ R^{D×d}, j = 1..M      (parametric SOP)
                 z_j = triu(NS(Σ_j)),  NS = iSQRT-COV: trace pre-normalisation, ``ns_iters``
                 coupled Newton–Schulz steps, √tr post-compensation (the authors use 3)
    gating       H(X) = g W_g + γ · softplus(g W_n), where the gate reads
                 g = triu(NS((X Q)ᵀ(X Q) / N)), Q ∈ R^{D×g} (``gate="sr-sop"``, the paper's
                 default: a second-order branch, square-root normalised), or
                 g = x̄, the mean of X over positions (``gate="average"``, first order);
                 γ ~ N(0, 1) one draw per image while training, γ = 0 when encoding
                 G = softmax over the top-K entries of H (the others are 0)
    code         z = Σ_j G_j z_j ∈ R^{d(d+1)/2}
    training     softmax classifier on BatchNorm(z); loss = cross-entropy
                 + w · CV(importance)², importance_j = Σ_batch G_j, CV = std (n−1) / mean
                 (the balance loss of the authors' code, w = 100, M = 16, K = 8).

Where featpipe departs from the authors' MatConvNet code, and why: the SR-SOP gate reduces
the channels by one linear map Q (a 1×1 convolution, no bias, no ReLU, no centring) and uses
the components' Newton–Schulz iterations; the components follow the formula above (a linear
projection, no centring, no ReLU), as docs/methods.md states it; gating weights
start from a small seeded Gaussian instead of equal weights (equal weights tie the top-K
choice).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils._param_validation import Interval, StrOptions

from featpipe.backend import to_numpy
from featpipe.encode.registry import EncodeMethod
from featpipe.errors import FeatpipeError, InputError, ParameterError
from featpipe.item_kinds import SECOND_ORDER
from featpipe.items import PerFrameStream, encode_per_frame
from featpipe.models import check_model_kind, json_params
from featpipe.nn.choices import GATES
from featpipe.parameters import ValidatedEstimator, estimator_parameters, model_parameter

log = logging.getLogger(__name__)

MODEL_NAME = "gmsop"


def _torch():
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is in the cnn extra
        raise FeatpipeError("GM-SOP needs torch: pip install 'featpipe[cnn]'") from None
    return torch


class GatedMixtureSOP(ValidatedEstimator, ClassifierMixin, BaseEstimator):
    """GM-SOP encoder (NeurIPS'18) trained on precomputed conv maps; the network is
    :class:`featpipe.nn.gmsop.GatedMixtureSOPNet`.

    Parameters
    ----------
    n_components : int
        M, number of parametric SOP components.
    top_k : int
        K, components mixed per image (at most n_components).
    dim : int
        d, channels after each component's projection; codes have d(d+1)/2 values.
    ns_iters : int
        Newton–Schulz iterations of each component and of the SR-SOP gate (the authors use 3).
    gate : {"sr-sop", "average"}
        What the gate reads: a square-root normalised second-order pooling of the input
        reduced to gate_dim channels (the paper's), or the global average of the input.
    gate_dim : int
        g, channels of the SR-SOP gate's reduction (g(g+1)/2 gate inputs).
    balance_weight : float
        w of the balance loss w·CV(importance)².
    epochs : int
        Training epochs (Adam).
    lr : float
        Adam learning rate.
    batch_size : int
        Images per step.
    weight_decay : float
        Adam weight decay.
    random_state : int
        Seed of the initialisation, the shuffling and the gate noise.
    device : {"cpu", "cuda"}
        Where torch runs the model.

    Fitted attributes: ``projections_`` (M, D, d), ``gate_weight_`` and ``noise_weight_``
    (F, M), ``gate_projection_`` (D, g; None for the average gate), ``classes_``,
    ``loss_curve_`` and the classifier head (``classifier_``, ``intercept_``, ``norm_``: the
    BatchNorm statistics and affine).
    """

    _parameter_constraints = {
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "top_k": [Interval(Integral, 1, None, closed="left")],
        "dim": [Interval(Integral, 1, None, closed="left")],
        "ns_iters": [Interval(Integral, 1, None, closed="left")],
        "gate": [StrOptions(set(GATES))],
        "gate_dim": [Interval(Integral, 1, None, closed="left")],
        "balance_weight": [Interval(Real, 0, None, closed="left")],
        "epochs": [Interval(Integral, 1, None, closed="left")],
        "lr": [Interval(Real, 0, None, closed="neither")],
        "batch_size": [Interval(Integral, 1, None, closed="left")],
        "weight_decay": [Interval(Real, 0, None, closed="left")],
        "random_state": [Interval(Integral, 0, None, closed="left")],
        "device": [StrOptions({"cpu", "cuda"})],
    }

    def __init__(self, n_components=16, top_k=8, dim=32, ns_iters=3, gate="sr-sop", gate_dim=8,
                 balance_weight=100.0, epochs=30, lr=0.01, batch_size=32, weight_decay=1e-4,
                 random_state=0, device="cpu"):
        self.n_components = n_components
        self.top_k = top_k
        self.dim = dim
        self.ns_iters = ns_iters
        self.gate = gate
        self.gate_dim = gate_dim
        self.balance_weight = balance_weight
        self.epochs = epochs
        self.lr = lr
        self.batch_size = batch_size
        self.weight_decay = weight_decay
        self.random_state = random_state
        self.device = device

    @classmethod
    def _check_param_rules(cls, params):
        k, m = params.get("top_k"), params.get("n_components", 16)
        if k is not None and m is not None and k > m:
            raise ParameterError("top_k", f"must lie in 1..n_components ({m}), got {k}")

    # -- the network ------------------------------------------------------------------------
    def _network(self, n_features: int, n_classes: int, generator=None):
        from featpipe.nn.gmsop import GatedMixtureSOPNet

        return GatedMixtureSOPNet(n_features, n_classes, int(self.n_components),
                                  int(self.top_k), int(self.dim), int(self.ns_iters), self.gate,
                                  int(self.gate_dim), generator)

    def _validate(self, X):
        self._validate_params()
        if not X:
            raise InputError("no conv maps given")
        widths = {x.shape[-1] for x in X}
        if any(x.ndim != 2 or x.shape[0] < 1 for x in X) or len(widths) != 1:
            raise InputError(f"expected (N, D) conv maps with one D, got shapes "
                             f"{sorted({tuple(x.shape) for x in X})[:4]}")
        if not all(np.all(np.isfinite(x)) for x in X):
            raise InputError("conv maps contain NaN or Inf")

    def fit(self, X: Sequence[np.ndarray], y: Sequence):
        """Train on conv maps ``X`` (list of (N_i, D)) with labels ``y``; returns self."""
        torch = _torch()
        from featpipe.nn.functional import balance_loss

        X = [np.asarray(x, dtype=np.float32) for x in X]
        self._validate(X)
        y = np.asarray(y)
        if y.shape[0] != len(X):
            raise InputError(f"{len(X)} conv maps but {y.shape[0]} labels")
        self.classes_, targets = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise InputError("GM-SOP training needs at least two classes")
        device = torch.device(self.device)
        torch.manual_seed(int(self.random_state))
        generator = torch.Generator().manual_seed(int(self.random_state))
        net = self._network(X[0].shape[1], len(self.classes_), generator).to(device)
        optimiser = torch.optim.Adam(net.parameters(), lr=self.lr,
                                     weight_decay=self.weight_decay)
        rng = np.random.default_rng(int(self.random_state))
        by_shape: dict[tuple, list[int]] = {}
        for i, x in enumerate(X):
            by_shape.setdefault(x.shape, []).append(i)
        self.loss_curve_ = []
        for _ in range(int(self.epochs)):
            batches = []
            for members in by_shape.values():
                order = rng.permutation(members)
                batches += [order[i:i + int(self.batch_size)]
                            for i in range(0, len(order), int(self.batch_size))]
            total = 0.0
            for b in rng.permutation(len(batches)):
                index = batches[b]
                xb = torch.from_numpy(np.stack([X[i] for i in index])).to(device)
                yb = torch.from_numpy(targets[index]).to(device)
                scores, gates = net(xb, generator)
                loss = torch.nn.functional.cross_entropy(scores, yb)
                if len(index) > 1:
                    loss = loss + balance_loss(gates, float(self.balance_weight))
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                total += loss.item() * len(index)
            self.loss_curve_.append(total / len(X))
            log.info("epoch %d/%d: loss %.6g", len(self.loss_curve_), int(self.epochs),
                     self.loss_curve_[-1])
        net.eval()
        self._set_state({k: v.detach().cpu().numpy() for k, v in net.state_dict().items()})
        return self

    def _set_state(self, state):
        """Fitted attributes from the network's state dict."""
        self.projections_ = state["projections"]
        self.gate_weight_ = state["gate_weight"]
        self.noise_weight_ = state["noise_weight"]
        self.gate_projection_ = state.get("gate_projection")
        self.classifier_ = state["head.weight"]
        self.intercept_ = state["head.bias"]
        self.norm_ = {k[5:]: v for k, v in state.items()
                      if k.startswith("norm.") and k != "norm.num_batches_tracked"}

    def _fitted_network(self, device):
        torch = _torch()
        net = self._network(self.projections_.shape[1], len(self.classes_))
        state = {"projections": self.projections_, "gate_weight": self.gate_weight_,
                 "noise_weight": self.noise_weight_,
                 **({} if self.gate_projection_ is None else
                    {"gate_projection": self.gate_projection_}),
                 "head.weight": self.classifier_,
                 "head.bias": self.intercept_,
                 **{f"norm.{k}": v for k, v in self.norm_.items()}}
        net.load_state_dict({k: torch.as_tensor(np.asarray(v, dtype=np.float32))
                             for k, v in state.items()}, strict=False)
        return net.to(device).eval()

    def transform(self, X: Sequence[np.ndarray]) -> np.ndarray:
        """Codes z = Σ_j G_j triu(NS(Σ_j)) (no gate noise) of conv maps (N_i, D) -> (B, d')."""
        torch = _torch()
        if not hasattr(self, "projections_"):
            raise FeatpipeError("GatedMixtureSOP is not fitted yet: call fit first")
        X = [np.asarray(x, dtype=np.float32) for x in X]
        self._validate(X)
        if X[0].shape[1] != self.projections_.shape[1]:
            raise InputError(f"conv maps have D = {X[0].shape[1]} channels, the model was "
                             f"fitted on D = {self.projections_.shape[1]}")
        net = self._fitted_network(torch.device(self.device))
        out = np.empty((len(X), self.projections_.shape[2] * (self.projections_.shape[2] + 1)
                        // 2), dtype=np.float32)
        shapes = [x.shape for x in X]
        with torch.no_grad():
            for shape in dict.fromkeys(shapes):
                members = [i for i, s in enumerate(shapes) if s == shape]
                xb = torch.from_numpy(np.stack([X[i] for i in members])).to(net.projections.device)
                out[members] = to_numpy(net.codes(xb)[0])
        return out

    def decision_function(self, X) -> np.ndarray:
        """Class scores of the trained head (BatchNorm in eval mode, then linear)."""
        z = self.transform(X)
        n = self.norm_
        hidden = (z - n["running_mean"]) / np.sqrt(n["running_var"] + 1e-5) * n["weight"] \
            + n["bias"]
        return hidden @ self.classifier_.T + self.intercept_

    def predict(self, X) -> np.ndarray:
        return self.classes_[np.argmax(self.decision_function(X), axis=1)]

    # -- persistence (npz arrays + json meta; no pickle: featpipe.models) ------------------
    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict]:
        if not hasattr(self, "projections_"):
            raise FeatpipeError("GatedMixtureSOP is not fitted yet: call fit first")
        arrays = {k: getattr(self, k + "_") for k in
                  ("projections", "gate_weight", "noise_weight", "classifier", "intercept")}
        if self.gate_projection_ is not None:
            arrays["gate_projection"] = self.gate_projection_
        arrays.update({f"norm_{k}": v for k, v in self.norm_.items()})
        meta = {"model": MODEL_NAME, "params": json_params(self.get_params(deep=False)),
                "classes": [str(c) for c in self.classes_],
                "loss_curve": [float(v) for v in self.loss_curve_]}
        return arrays, meta

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], meta: Mapping) -> GatedMixtureSOP:
        check_model_kind(MODEL_NAME, meta)
        # models saved before the gate option had the average gate
        model = cls(**{"gate": "average", **meta["params"]})
        model._set_state({**{k: arrays[k] for k in ("projections", "gate_weight",
                                                     "noise_weight", "gate_projection")
                             if k in arrays},
                          "head.weight": arrays["classifier"], "head.bias": arrays["intercept"],
                          **{f"norm.{k[5:]}": v for k, v in arrays.items()
                             if k.startswith("norm_")}})
        model.classes_ = np.asarray(meta["classes"])
        model.loss_curve_ = list(meta["loss_curve"])
        return model


# -- featpipe encode --method gmsop --model NAME ----------------------------------------------
class GatedMixtureEncoder:
    """``encode_batch`` for the CLI: conv maps (N, D) or (H, W, D) per image, or per frame
    ((T, H, W, D), or (N, D) with a ``frame_index`` sidecar), read as
    :class:`~featpipe.items.LocalFeatures` -> codes; frames become (T, d') with ``frame_index``
    (and ``timestamps``) sidecars.  ``stream(sink)`` codes frames as extraction produces them."""

    def __init__(self, model: GatedMixtureSOP):
        self.model = model

    def _encode(self, frames):
        return self.model.transform([f.descriptors for f in frames])

    def stream(self, sink):
        return PerFrameStream(self._encode, sink)

    def encode_batch(self, arrays, extras):
        return encode_per_frame(self._encode, arrays, extras)


def _build(params, models):
    model = models["model"].load_model(MODEL_NAME, GatedMixtureSOP)
    return GatedMixtureEncoder(model.set_params(device=params["device"]))


ENCODE_METHODS = [
    EncodeMethod(
        "gmsop", "gated mixture of second-order pooling (fit gmsop first; --model NAME)",
        _build, (model_parameter("model", "Name of a fitted model stage.", ("fit gmsop",)),
                 *estimator_parameters(GatedMixtureSOP, include=("device",))),
        batch_size=32, kinds=SECOND_ORDER),
]
