"""The differentiable functions of featpipe's learned encoders (torch).

Kornia's pattern: the functions live here; the modules of :mod:`featpipe.nn` and the trainers
of :mod:`featpipe.learn` import them, and nothing here imports either.

Rank pooling through its argmin (seed paper: Fernando, Anderson, Hutter, Gould, CVPR'16,
section 4.4 and supplement; Gould et al. 2016, "On differentiating parameterized argmin and
argmax problems", Lemma 3)::

    u*(V) = argmin_u ½‖u‖² + C Σ_t max(0, |t − uᵀv_t| − ε)²   (liblinear -s 11, no bias)

On the active set A = {t : |t − uᵀv_t| > ε}, with s_t = sign(t − uᵀv_t),
r_t = t − uᵀv_t − ε s_t and c = 2C (liblinear's C; the paper writes C/2), stationarity reads
u − c Σ_{t∈A} r_t v_t = 0, and implicit differentiation gives, with q = H⁻¹ ∂L/∂u and
H = I + c Σ_{t∈A} v_t v_tᵀ::

    ∂L/∂v_t = c (r_t q − (qᵀv_t) u*)   for t ∈ A,   0 otherwise.

``hessian="exact"`` solves for q in the T×T dual space (Woodbury):
q = g − V_Aᵀ (I/c + V_A V_Aᵀ)⁻¹ V_A g; ``hessian="diagonal"`` is the paper's approximation
(supplement eqs. 21–27): q_i = g_i / (1 + c Σ_{t∈A} v_{t,i}²).

- :func:`solve_rank_svr`, :func:`argmin_input_gradient`: the forward solve and the backward.
- :class:`RankPoolArgmin` and :func:`rank_pool`: the argmin as an autograd function.
- :func:`psi_map`, :func:`mapped_sequences`, :func:`pad_sequences`: DHRP's v_t = L2(TVM(ψ(W x_t))).
- :func:`top_k_softmax`, :func:`balance_loss`: GM-SOP's gate and its balance loss.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from featpipe.backend import solve_spd
from featpipe.errors import InputError
from featpipe.nn.choices import HESSIAN_CHOICES, PSI_CHOICES

# -- rank pooling through its argmin ---------------------------------------------------------


def solve_rank_svr(V, C: float, epsilon: float, solve_dtype=None, lengths=None):
    """u*(V) by featpipe's SVR solver on the Gram matrices; returns ``(U, active)``.

    V is a torch tensor (B, T, D); the Gram matrices are formed (in ``solve_dtype`` when
    given, e.g. float64) and handed to :func:`featpipe.encode.svr.rank_svr_dual`.  With
    ``lengths``, rows t ≥ lengths[b] are padding: no constraint, never active.
    """
    from featpipe.encode.svr import rank_svr_dual

    work = V if solve_dtype is None else V.to(solve_dtype)
    G = work @ work.transpose(1, 2)
    alpha, active = rank_svr_dual(G, C=C, epsilon=epsilon, lengths=lengths)
    alpha = torch.as_tensor(alpha, dtype=work.dtype, device=V.device)
    active = torch.as_tensor(active, dtype=torch.bool, device=V.device)
    U = (alpha.unsqueeze(1) @ work).squeeze(1)
    return U.to(V.dtype), active


def argmin_input_gradient(V, U, active, grad_U, C: float, epsilon: float,
                          hessian: str = "exact"):
    """∂L/∂V from ∂L/∂u* by implicit differentiation of the SVR optimality condition.

    ``hessian="exact"``: q = H⁻¹ g by Woodbury in the T×T dual space;
    ``hessian="diagonal"``: q = g / diag(H) (the paper's approximation).  See module doc.
    """
    c = 2.0 * C
    mask = active.to(V.dtype)                                    # (B, T)
    T = V.shape[1]
    targets = torch.arange(1, T + 1, dtype=V.dtype, device=V.device)
    residual = targets - (V @ U.unsqueeze(-1)).squeeze(-1)        # t − uᵀv_t
    r = residual - epsilon * torch.sign(residual)                 # r_t on A
    if hessian == "exact":
        gram = V @ V.transpose(1, 2)
        system = mask.unsqueeze(2) * gram * mask.unsqueeze(1)
        system = system + torch.eye(T, dtype=V.dtype, device=V.device) / c
        rhs = mask * (V @ grad_U.unsqueeze(-1)).squeeze(-1)
        y = solve_spd(system, rhs.unsqueeze(-1)).squeeze(-1)  # SPD: mask·G·mask + I/c
        q = grad_U - ((mask * y).unsqueeze(1) @ V).squeeze(1)
    elif hessian == "diagonal":
        diag = 1.0 + c * (mask.unsqueeze(-1) * V * V).sum(dim=1)
        q = grad_U / diag
    else:
        raise InputError(f"hessian must be one of {HESSIAN_CHOICES}, got {hessian!r}")
    qv = (V @ q.unsqueeze(-1)).squeeze(-1)                        # qᵀv_t
    return c * mask.unsqueeze(-1) * (r.unsqueeze(-1) * q.unsqueeze(1)
                                     - qv.unsqueeze(-1) * U.unsqueeze(1))


class RankPoolArgmin(torch.autograd.Function):
    """u*(V) forward by featpipe's SVR solver; backward by implicit differentiation.

    Inputs: V (B, T, D), C, ε, ``hessian`` ("exact" or "diagonal"), the dtype of the solve
    (None: V's), ``lengths`` (rows t ≥ lengths[b] are padding: no constraint, no gradient).
    """

    @staticmethod
    def forward(ctx, V, C, epsilon, hessian, solve_dtype, lengths):
        U, active = solve_rank_svr(V.detach(), C, epsilon, solve_dtype, lengths)
        ctx.save_for_backward(V, U, active)
        ctx.settings = (C, epsilon, hessian)
        return U

    @staticmethod
    def backward(ctx, grad_U):
        V, U, active = ctx.saved_tensors
        C, epsilon, hessian = ctx.settings
        grad_V = argmin_input_gradient(V, U, active, grad_U, C, epsilon, hessian)
        return grad_V, None, None, None, None, None


def rank_pool(V, C: float = 1.0, epsilon: float = 0.1, hessian: str = "exact",
              solve_dtype=None, lengths=None):
    """Differentiable rank pooling u*(V) for V (B, T, D): :class:`RankPoolArgmin`."""
    if hessian not in HESSIAN_CHOICES:
        raise InputError(f"hessian must be one of {HESSIAN_CHOICES}, got {hessian!r}")
    return RankPoolArgmin.apply(V, float(C), float(epsilon), hessian, solve_dtype, lengths)


# -- DHRP: the learned map before the argmin -------------------------------------------------

def psi_map(Z, psi: str, delta: float):
    """ψ of DHRP, δ > 0 smoothing the square root (whose slope is infinite at 0)::

        ssr:  sign(z)·(√(|z| + δ) − √δ)
        ser:  [√(max(z, 0) + δ) − √δ,  √(max(−z, 0) + δ) − √δ]       (doubles D)
        tanh: tanh(z)

    ssr is differentiable everywhere; ser has a kink at 0 (slope 1/(2√δ) on one side, 0 on
    the other), where the gradient is the subgradient 0.
    """
    root_delta = math.sqrt(delta)
    if psi == "ssr":  # = z / (√(|z| + δ) + √δ): autograd then gives the slope 1/(2√δ) at 0
        return Z / (torch.sqrt(Z.abs() + delta) + root_delta)
    if psi == "ser":
        pos = torch.sqrt(torch.relu(Z) + delta) - root_delta
        neg = torch.sqrt(torch.relu(-Z) + delta) - root_delta
        return torch.cat([pos, neg], dim=-1)
    if psi == "tanh":
        return torch.tanh(Z)
    raise InputError(f"psi must be one of {PSI_CHOICES}, got {psi!r}")


def mapped_sequences(X, mask, W, psi: str, delta: float):
    """v_t = L2(TVM(ψ(W x_t))) for padded X (B, T, D) with row mask (B, T)."""
    Z = psi_map(X @ W.T, psi, delta) * mask.unsqueeze(-1)
    counts = torch.arange(1, X.shape[1] + 1, dtype=Z.dtype, device=Z.device)
    M = torch.cumsum(Z, dim=1) / counts.view(1, -1, 1) * mask.unsqueeze(-1)
    norms = torch.linalg.vector_norm(M, dim=-1, keepdim=True)
    return M / torch.where(norms > 0, norms, torch.ones_like(norms))


def pad_sequences(seqs: Sequence[np.ndarray], dtype, device):
    """Sequences (T_i, D) -> zero-padded X (B, max T, D) and row mask (B, max T)."""
    T = max(len(s) for s in seqs)
    X = torch.zeros((len(seqs), T, seqs[0].shape[1]), dtype=dtype, device=device)
    mask = torch.zeros((len(seqs), T), dtype=dtype, device=device)
    for i, seq in enumerate(seqs):
        X[i, :len(seq)] = torch.as_tensor(np.asarray(seq), dtype=dtype, device=device)
        mask[i, :len(seq)] = 1
    return X, mask


# -- GM-SOP: the gate -----------------------------------------------------------------------

def top_k_softmax(logits, k: int):
    """Softmax over the ``k`` largest logits of each row; the other entries are exactly 0."""
    top, index = torch.topk(logits, k, dim=-1)
    return torch.zeros_like(logits).scatter(-1, index, torch.softmax(top, dim=-1))


def balance_loss(weights, weight: float = 100.0):
    """w · (std(importance) / mean(importance))², importance = column sums of the gate
    weights (batch × components); std with n − 1 as the authors' MATLAB code."""
    importance = weights.sum(dim=0)
    return weight * (importance.std(unbiased=True) / importance.mean()) ** 2
