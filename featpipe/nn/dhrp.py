"""The DHRP network (seed paper section 4.4): learned ψ(W x), rank pooling, soft-max scores.

For a padded batch X (B, T, D) with row mask (B, T)::

    v_t = L2(TVM(ψ(W x_t)))                                 (mapped_sequences)
    u*  = argmin_u ½‖u‖² + C Σ_t max(0, |t − uᵀv_t| − ε)²   (rank_pool)
    h   = coef · n(u*) + intercept                           (one row of coef per class)

n is the L2 normalisation (``normalize="l2"``, an all-zero u* stays zero) or the identity:
``classify --normalize l2 --kernel linear`` scores n(u*) the same way, with libsvm's bias.

W starts at the identity; the gradient reaches W through the argmin.
:class:`featpipe.learn.dhrp.DiscriminativeRankPooling` trains it and stores its tensors.
"""

from __future__ import annotations

import torch
from torch import nn

from featpipe.nn.functional import mapped_sequences, rank_pool


class DiscriminativeRankPoolingNet(nn.Module):
    """Parameters ``W`` (D, D), ``coef`` (n_classes, D') and ``intercept`` (n_classes);
    D' = 2D for ψ = ser."""

    def __init__(self, n_features: int, n_classes: int, psi: str = "ssr", delta: float = 1e-3,
                 C: float = 1.0, epsilon: float = 0.1, hessian: str = "exact",
                 solve_dtype=torch.float64, normalize: str = "l2"):
        super().__init__()
        width = 2 * n_features if psi == "ser" else n_features
        self.W = nn.Parameter(torch.eye(n_features))
        self.coef = nn.Parameter(torch.zeros(n_classes, width))
        self.intercept = nn.Parameter(torch.zeros(n_classes))
        self.psi, self.delta, self.C, self.epsilon = psi, delta, C, epsilon
        self.hessian, self.solve_dtype, self.normalize = hessian, solve_dtype, normalize

    def encode(self, X, mask, hessian: str | None = None):
        """u*(W) for padded X (B, T, D) and row mask (B, T) -> (B, D')."""
        V = mapped_sequences(X, mask, self.W, self.psi, self.delta)
        lengths = [int(n) for n in mask.sum(dim=1).tolist()]
        return rank_pool(V, self.C, self.epsilon, hessian or self.hessian, self.solve_dtype,
                         lengths)

    def scores(self, U):
        """Class scores h = coef · n(U) + intercept for encodings U (B, D') -> (B, n_classes)."""
        if self.normalize == "l2":
            norms = torch.linalg.vector_norm(U, dim=-1, keepdim=True)
            U = U / torch.where(norms > 0, norms, torch.ones_like(norms))
        return U @ self.coef.T + self.intercept

    def forward(self, X, mask):
        """Class scores h = coef · n(u*(W)) + intercept, (B, n_classes)."""
        return self.scores(self.encode(X, mask))
