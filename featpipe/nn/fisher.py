"""The improved Fisher vector as a torch layer of the GMM parameters (deep Fisher kernel).

theta = (a, μ, s): unnormalised log weights (π = softmax(a)), means and log standard
deviations (σ = exp(s)) of a diagonal GMM.  The forward pass is
:func:`featpipe.learn.deep_fisher.fisher_forward` (VLFeat's layout and thresholds, the same
definition as :func:`featpipe.encode.fisher.fisher_vector`); the backward pass is its
reverse-mode gradient :func:`~featpipe.learn.deep_fisher.fisher_backward` (Sydorov et al.
CVPR'14, computed as one vector-Jacobian product instead of the paper's explicit Jacobian).
The layer differentiates the GMM, not the descriptors: descriptors that require a gradient
are refused.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from featpipe.encode.fisher import POSTERIOR_THRESHOLD, check_gmm
from featpipe.errors import InputError
from featpipe.learn.deep_fisher import fisher_backward, fisher_forward


class FisherVectorFunction(torch.autograd.Function):
    """phi(x; a, μ, s), the improved FV (2KD); gradients for a, μ and s."""

    @staticmethod
    def forward(ctx, x, a, mu, s, threshold, posterior_cutoff):
        phi, cache = fisher_forward(x, a.detach(), mu.detach(), s.detach(), threshold)
        ctx.cache, ctx.cutoff = cache, posterior_cutoff
        return phi

    @staticmethod
    def backward(ctx, g_phi):
        g_a, g_mu, g_s = fisher_backward(ctx.cache, g_phi, ctx.cutoff)
        return None, g_a, g_mu, g_s, None, None


class FisherVectorLayer(nn.Module):
    """Improved Fisher vector of descriptors x (N, D) -> (2KD,), parameters a, μ, s.

    Built from a fitted GMM (``weights``, ``means``, ``variances``); ``posterior_cutoff`` > 0
    leaves pairs with γ < cutoff out of the gradient (the paper's speed-up; 0 = exact).
    """

    def __init__(self, weights, means, variances, threshold: float = POSTERIOR_THRESHOLD,
                 posterior_cutoff: float = 0.0, dtype=torch.float64):
        super().__init__()
        weights, means, variances = check_gmm(weights, means, variances)
        self.a = nn.Parameter(torch.as_tensor(np.log(np.maximum(weights, 1e-300)), dtype=dtype))
        self.mu = nn.Parameter(torch.as_tensor(means, dtype=dtype))
        self.s = nn.Parameter(torch.as_tensor(0.5 * np.log(variances), dtype=dtype))
        self.threshold, self.posterior_cutoff = threshold, posterior_cutoff

    def forward(self, x):
        if x.requires_grad:
            raise InputError("FisherVectorLayer differentiates the GMM parameters, not the "
                             "descriptors: pass descriptors that do not require grad")
        return FisherVectorFunction.apply(x.to(self.mu.dtype), self.a, self.mu, self.s,
                                          self.threshold, self.posterior_cutoff)
