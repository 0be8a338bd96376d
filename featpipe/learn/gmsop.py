"""GM-SOP: global gated mixture of second-order pooling (Wang, Gao, Xie, Zuo, Li, NeurIPS'18).

A learned encoder of conv maps X ∈ R^{N×D} (N positions, D channels), trained with torch on
precomputed maps (the backbone stays fixed):

    components   Σ_j = (X P_j)ᵀ(X P_j) / N,  P_j ∈ R^{D×d}, j = 1..M      (parametric SOP)
                 z_j = triu(NS(Σ_j)),  NS = iSQRT-COV: trace pre-normalisation, ``ns_iters``
                 coupled Newton–Schulz steps, √tr post-compensation (the authors use 3)
    gating       H(X) = x̄ W_g + γ · softplus(x̄ W_n),  x̄ = mean of X over positions,
                 γ ~ N(0, 1) one draw per image while training, γ = 0 when encoding
                 G = softmax over the top-K entries of H (the others are 0)
    code         z = Σ_j G_j z_j ∈ R^{d(d+1)/2}
    training     softmax classifier on BatchNorm(z); loss = cross-entropy
                 + w · CV(importance)², importance_j = Σ_batch G_j, CV = std (n−1) / mean
                 (the balance loss of the authors' code, w = 100, M = 16, K = 8).

Where featpipe departs from the authors' MatConvNet code, and why: the gate is computed on the
global average x̄ (their first-order gating branch) rather than on an SR-SOP of two extra 1×1
convolutions, and the components follow the formula above (a linear projection, no centring,
no ReLU), as featpipe's DESIGN.md section 4 states it; gating weights start from a small seeded
Gaussian instead of equal weights (equal weights tie the top-K choice).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

import click
import numpy as np

from featpipe.backend import to_numpy
from featpipe.encode.bilinear import newton_schulz_sqrtm, triu_vectorise
from featpipe.encode.registry import EncodeMethod
from featpipe.errors import FeatpipeError, InputError
from featpipe.items import PerFrameStream, encode_per_frame

log = logging.getLogger(__name__)

MODEL_NAME = "gmsop"


def _torch():
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is in the cnn extra
        raise FeatpipeError("GM-SOP needs torch: pip install 'featpipe[cnn]'") from None
    return torch


def balance_loss(weights, weight: float = 100.0):
    """w · (std(importance) / mean(importance))², importance = column sums of the gate
    weights (batch × components); std with n − 1 as the authors' MATLAB code."""
    importance = weights.sum(dim=0)
    return weight * (importance.std(unbiased=True) / importance.mean()) ** 2


def top_k_softmax(logits, k: int):
    """Softmax over the ``k`` largest logits of each row; the other entries are exactly 0."""
    torch = _torch()
    top, index = torch.topk(logits, k, dim=-1)
    return torch.zeros_like(logits).scatter(-1, index, torch.softmax(top, dim=-1))


class GatedMixtureSOP:
    """GM-SOP encoder (NeurIPS'18) trained on precomputed conv maps.

    Parameters
    ----------
    n_components : M, number of parametric SOP components (16).
    top_k : K, components mixed per image (8).
    dim : d, channels after each component's projection; codes have d(d+1)/2 values (32).
    ns_iters : Newton–Schulz iterations of each component (3, as the authors).
    balance_weight : w of the balance loss (100).
    epochs, lr, batch_size, weight_decay : Adam training on the given items.
    seed : initialisation, shuffling and gate noise.
    device : 'cpu' or 'cuda'.

    Fitted attributes: ``projections_`` (M, D, d), ``gate_weight_`` (D, M),
    ``noise_weight_`` (D, M), ``classes_``, ``loss_curve_`` and the classifier head.
    """

    def __init__(self, n_components=16, top_k=8, dim=32, ns_iters=3, balance_weight=100.0,
                 epochs=30, lr=0.01, batch_size=32, weight_decay=1e-4, seed=0, device="cpu"):
        self.n_components = n_components
        self.top_k = top_k
        self.dim = dim
        self.ns_iters = ns_iters
        self.balance_weight = balance_weight
        self.epochs = epochs
        self.lr = lr
        self.batch_size = batch_size
        self.weight_decay = weight_decay
        self.seed = seed
        self.device = device

    # -- the network ------------------------------------------------------------------------
    def _codes(self, X, params, generator=None):
        """(B, N, D) tensor -> codes (B, d(d+1)/2) and gate weights (B, M)."""
        torch = _torch()
        mean = X.mean(dim=1)
        logits = mean @ params["gate_weight"]
        if generator is not None:
            gamma = torch.randn(X.shape[0], 1, generator=generator, dtype=X.dtype)
            logits = logits + gamma.to(X.device) * torch.nn.functional.softplus(
                mean @ params["noise_weight"])
        gates = top_k_softmax(logits, int(self.top_k))
        projected = torch.einsum("bnd,mde->bmne", X, params["projections"])
        sigma = projected.transpose(-1, -2) @ projected / X.shape[1]
        z = triu_vectorise(newton_schulz_sqrtm(sigma, int(self.ns_iters)))
        return torch.einsum("bm,bmk->bk", gates, z), gates

    def _validate(self, X):
        if not 1 <= int(self.top_k) <= int(self.n_components):
            raise InputError(f"--top-k must lie in 1..--components ({self.n_components}), "
                             f"got {self.top_k}")
        if int(self.dim) < 1 or int(self.ns_iters) < 1:
            raise InputError("--dim and --ns-iters must be >= 1")
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
        X = [np.asarray(x, dtype=np.float32) for x in X]
        self._validate(X)
        y = np.asarray(y)
        if y.shape[0] != len(X):
            raise InputError(f"{len(X)} conv maps but {y.shape[0]} labels")
        self.classes_, targets = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise InputError("GM-SOP training needs at least two classes")
        device = torch.device(self.device)
        torch.manual_seed(int(self.seed))
        generator = torch.Generator().manual_seed(int(self.seed))
        D, M, d = X[0].shape[1], int(self.n_components), int(self.dim)
        width = d * (d + 1) // 2
        params = {
            "projections": torch.randn(M, D, d, generator=generator) / math.sqrt(D),
            "gate_weight": 0.01 * torch.randn(D, M, generator=generator),
            "noise_weight": 0.01 * torch.randn(D, M, generator=generator),
            "classifier": torch.zeros(len(self.classes_), width),
            "intercept": torch.zeros(len(self.classes_)),
        }
        params = {k: v.to(device).requires_grad_() for k, v in params.items()}
        norm = torch.nn.BatchNorm1d(width).to(device)
        optimiser = torch.optim.Adam([*params.values(), *norm.parameters()], lr=self.lr,
                                     weight_decay=self.weight_decay)
        rng = np.random.default_rng(int(self.seed))
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
                codes, gates = self._codes(xb, params, generator)
                hidden = norm(codes) if len(index) > 1 else codes
                scores = hidden @ params["classifier"].T + params["intercept"]
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
        norm.eval()
        self._set_params({k: v.detach().cpu().numpy() for k, v in params.items()})
        self.norm_ = {k: v.detach().cpu().numpy() for k, v in norm.state_dict().items()
                      if k != "num_batches_tracked"}
        return self

    def _set_params(self, arrays):
        self.projections_ = arrays["projections"]
        self.gate_weight_ = arrays["gate_weight"]
        self.noise_weight_ = arrays["noise_weight"]
        self.classifier_ = arrays["classifier"]
        self.intercept_ = arrays["intercept"]

    def _fitted(self, device):
        torch = _torch()
        if not hasattr(self, "projections_"):
            raise FeatpipeError("GatedMixtureSOP is not fitted yet: call fit first")
        return {k: torch.from_numpy(np.asarray(getattr(self, k + "_"), dtype=np.float32)
                                    ).to(device)
                for k in ("projections", "gate_weight", "noise_weight")}

    def transform(self, X: Sequence[np.ndarray]) -> np.ndarray:
        """Codes z = Σ_j G_j triu(NS(Σ_j)) (no gate noise) of conv maps (N_i, D) -> (B, d')."""
        torch = _torch()
        X = [np.asarray(x, dtype=np.float32) for x in X]
        self._validate(X)
        if X[0].shape[1] != self.projections_.shape[1]:
            raise InputError(f"conv maps have D = {X[0].shape[1]} channels, the model was "
                             f"fitted on D = {self.projections_.shape[1]}")
        device = torch.device(self.device)
        params = self._fitted(device)
        out = np.empty((len(X), self.projections_.shape[2] * (self.projections_.shape[2] + 1)
                        // 2), dtype=np.float32)
        shapes = [x.shape for x in X]
        with torch.no_grad():
            for shape in dict.fromkeys(shapes):
                members = [i for i, s in enumerate(shapes) if s == shape]
                xb = torch.from_numpy(np.stack([X[i] for i in members])).to(device)
                out[members] = to_numpy(self._codes(xb, params)[0])
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

    # -- persistence (npz arrays + json meta; no pickle) ------------------------------------
    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict]:
        arrays = {k: getattr(self, k + "_") for k in
                  ("projections", "gate_weight", "noise_weight", "classifier", "intercept")}
        arrays.update({f"norm_{k}": v for k, v in self.norm_.items()})
        meta = {"params": {k: getattr(self, k) for k in (
                    "n_components", "top_k", "dim", "ns_iters", "balance_weight", "epochs",
                    "lr", "batch_size", "weight_decay", "seed")},
                "classes": [str(c) for c in self.classes_],
                "loss_curve": [float(v) for v in self.loss_curve_]}
        return arrays, meta

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], meta: Mapping, device="cpu"):
        model = cls(**meta["params"], device=device)
        model._set_params(arrays)
        model.norm_ = {k[5:]: v for k, v in arrays.items() if k.startswith("norm_")}
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
    arrays, meta = models["model"].load_model(MODEL_NAME)
    return GatedMixtureEncoder(GatedMixtureSOP.from_arrays(arrays, meta, params["device"]))


ENCODE_METHODS = [
    EncodeMethod(
        name="gmsop",
        summary="gated mixture of second-order pooling (fit gmsop first; --model NAME)",
        build=_build,
        options=(
            click.Option(["--model"], default=None,
                         help="Name of a fitted model stage (featpipe fit gmsop / ...)."),
            click.Option(["--device"], type=click.Choice(["cpu", "cuda"]), default=None,
                         help="Where to run the model: cpu or cuda (torch) [cpu]."),
        ),
        defaults={"model": None, "device": "cpu"},
        model_options=("model",),
        batch_size=32,
    ),
]
