"""GM-SOP network (Wang et al. NeurIPS'18): gated mixture of parametric second-order pooling.

For conv maps X (B, N, D)::

    Σ_j = (X P_j)ᵀ(X P_j) / N,  z_j = triu(NS(Σ_j))     (P_j ∈ R^{D×d}, NS = iSQRT-COV)
    g   = triu(NS((X Q)ᵀ(X Q) / N))   gate "sr-sop" (the paper's; Q ∈ R^{D×g}), or
    g   = x̄, the mean of X over positions   gate "average"
    H   = g W_g + γ · softplus(g W_n),  γ ~ N(0, 1) per image while training, 0 when encoding
    G   = softmax over the top-K entries of H,  z = Σ_j G_j z_j
    scores = Linear(BatchNorm(z))

:class:`featpipe.learn.gmsop.GatedMixtureSOP` trains it (with the balance loss) and stores its
tensors; the formulas and the departures from the authors' code are documented there.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from featpipe.encode.bilinear import newton_schulz_sqrtm, triu_vectorise
from featpipe.errors import InputError
from featpipe.nn.choices import GATES
from featpipe.nn.functional import top_k_softmax


class GatedMixtureSOPNet(nn.Module):
    """Parameters ``projections`` (M, D, d), ``gate_weight`` and ``noise_weight`` (F, M) with
    F = g(g+1)/2 for ``gate="sr-sop"`` (and its ``gate_projection`` Q, (D, g)) or F = D for
    ``gate="average"``, and the head ``norm`` (BatchNorm1d) + ``head`` (Linear) over d(d+1)/2
    code values.

    Initialisation (drawn from ``generator`` in this order): projections N(0, 1/D), gate and
    noise weights N(0, 0.01²), then Q N(0, 1/D); the head starts at zero.
    """

    def __init__(self, n_features: int, n_classes: int, n_components: int = 16,
                 top_k: int = 8, dim: int = 32, ns_iters: int = 3, gate: str = "sr-sop",
                 gate_dim: int = 8, generator: torch.Generator | None = None):
        super().__init__()
        if gate not in GATES:
            raise InputError(f"gate must be one of {GATES}, got {gate!r}")
        D, M, d = n_features, n_components, dim
        width = d * (d + 1) // 2
        gate_in = gate_dim * (gate_dim + 1) // 2 if gate == "sr-sop" else D
        self.projections = nn.Parameter(torch.randn(M, D, d, generator=generator)
                                        / math.sqrt(D))
        self.gate_weight = nn.Parameter(0.01 * torch.randn(gate_in, M, generator=generator))
        self.noise_weight = nn.Parameter(0.01 * torch.randn(gate_in, M, generator=generator))
        if gate == "sr-sop":
            self.gate_projection = nn.Parameter(torch.randn(D, gate_dim, generator=generator)
                                                / math.sqrt(D))
        self.gate = gate
        self.norm = nn.BatchNorm1d(width)
        self.head = nn.Linear(width, n_classes)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.top_k, self.ns_iters = top_k, ns_iters

    def gate_input(self, X):
        """What the gate reads: triu(NS((X Q)ᵀ(X Q)/N)) (sr-sop) or the mean x̄ (average)."""
        if self.gate == "average":
            return X.mean(dim=1)
        reduced = X @ self.gate_projection
        return triu_vectorise(newton_schulz_sqrtm(
            reduced.transpose(-1, -2) @ reduced / X.shape[1], self.ns_iters))

    def codes(self, X, generator: torch.Generator | None = None):
        """Codes z (B, d(d+1)/2) and gate weights G (B, M); gate noise only with a generator."""
        g = self.gate_input(X)
        logits = g @ self.gate_weight
        if generator is not None:
            gamma = torch.randn(X.shape[0], 1, generator=generator, dtype=X.dtype)
            logits = logits + gamma.to(X.device) * nn.functional.softplus(
                g @ self.noise_weight)
        gates = top_k_softmax(logits, self.top_k)
        projected = torch.einsum("bnd,mde->bmne", X, self.projections)
        sigma = projected.transpose(-1, -2) @ projected / X.shape[1]
        z = triu_vectorise(newton_schulz_sqrtm(sigma, self.ns_iters))
        return torch.einsum("bm,bmk->bk", gates, z), gates

    def forward(self, X, generator: torch.Generator | None = None):
        """Class scores (B, n_classes) and gate weights (B, M); a batch of one skips the
        BatchNorm (its statistics need two images)."""
        z, gates = self.codes(X, generator)
        hidden = self.norm(z) if z.shape[0] > 1 or not self.training else z
        return self.head(hidden), gates
