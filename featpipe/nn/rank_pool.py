"""Rank pooling as torch modules, differentiable through the SVR's argmin.

u*(V) = argmin_u ½‖u‖² + C Σ_t max(0, |t − uᵀv_t| − ε)² (liblinear ``-s 11``, no bias;
:mod:`featpipe.encode.svr` solves it exactly).  The backward pass differentiates the optimality
condition (Gould et al. 2016, Lemma 3; Fernando & Gould ICML'16): see
:mod:`featpipe.nn.functional` (:func:`~featpipe.nn.functional.rank_pool`), exact (T×T dual
solve) or the HRP paper's diagonal approximation.

- :class:`RankPool`: v_t = L2(ψ(TVM(X))_t), then u*: (B, T, D) -> (B, D') (D' = 2D for SER).
- :class:`HierarchicalRankPool`: hierarchical rank pooling (Fernando et al. CVPR'16):
  depth − 1 sliding-window layers of rank pooling, then rank pooling of the whole last
  sequence; the same numbers as :class:`featpipe.encode.temporal.HierarchicalRankPooling`,
  with gradients.
"""

from __future__ import annotations

import torch
from torch import nn

from featpipe.encode.maps import PSI_MAPS, rank_pool_vectors
from featpipe.errors import InputError
from featpipe.nn.functional import rank_pool


class RankPool(nn.Module):
    """Rank pooling of sequences X (B, T, D) -> (B, D') with v_t = L2(ψ(TVM(X))_t).

    ``forward(X, lengths=None)``: with ``lengths`` (B,), sequence b is X[b, :lengths[b]] and the
    rows after it are zero padding.  ψ is ``none``, ``ssr`` or ``ser`` (D' = 2D).  The square
    root of ψ is not differentiable at 0: its backward pass uses the subgradient 0 there
    (:func:`featpipe.encode.maps.root`), so a zero running sum gives a finite gradient.
    """

    def __init__(self, psi: str = "ssr", C: float = 1.0, epsilon: float = 0.1,
                 hessian: str = "exact", solve_dtype=torch.float64):
        super().__init__()
        if psi not in PSI_MAPS:
            raise InputError(f"psi must be one of {PSI_MAPS}, got {psi!r}")
        self.psi, self.C, self.epsilon = psi, C, epsilon
        self.hessian, self.solve_dtype = hessian, solve_dtype

    def forward(self, X, lengths=None):
        V = rank_pool_vectors(X, self.psi)
        if lengths is not None:
            mask = torch.arange(X.shape[1], device=X.device)[None, :] < \
                torch.as_tensor(lengths, device=X.device)[:, None]
            V = V * mask.unsqueeze(-1).to(V.dtype)
        return rank_pool(V, self.C, self.epsilon, self.hessian, self.solve_dtype, lengths)


class HierarchicalRankPool(nn.Module):
    """Hierarchical rank pooling of equal-length sequences X (B, T, D) -> (B, D').

    Layer ℓ < depth rank-pools every window of ``window`` elements (stride ``stride``; one
    window when the sequence is shorter) into the sequence of layer ℓ + 1; the last layer
    rank-pools its whole sequence.  Defaults as the seed paper: M = 20, S = 1, L = 2, ψ = SER.
    """

    def __init__(self, window: int = 20, stride: int = 1, depth: int = 2, psi: str = "ser",
                 C: float = 1.0, epsilon: float = 0.1, hessian: str = "exact",
                 solve_dtype=torch.float64):
        super().__init__()
        if min(window, stride, depth) < 1:
            raise InputError(f"window, stride and depth must be >= 1, got {window}, {stride}, "
                             f"{depth}")
        self.window, self.stride, self.depth = window, stride, depth
        self.pool = RankPool(psi, C, epsilon, hessian, solve_dtype)

    def forward(self, X):
        for _ in range(self.depth - 1):
            B, T, D = X.shape
            M = min(self.window, T)
            windows = X.unfold(1, M, self.stride)                   # (B, n, D, M)
            n = windows.shape[1]
            pooled = self.pool(windows.permute(0, 1, 3, 2).reshape(B * n, M, D))
            X = pooled.reshape(B, n, -1)
        return self.pool(X)
