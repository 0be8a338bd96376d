"""The filters of the dense-trajectory Farnebäck flow, and the frame widths its fused kernels take.

Farnebäck (SCIA 2003) as the dense-trajectory release runs it (OpenCV's Gaussian-window
variant, ``OpticalFlow.h``): the polynomial expansion correlates a frame with g, t·g and t²·g,
g the Gaussian of σ = ``poly_sigma`` over t = -n..n, n = ``poly_n`` (sum 1), and combines the six
correlations by four entries of the inverse Gram matrix of the basis (1, x, y, x², y², xy)
under the weights g(x)·g(y); each pixel's 2 × 2 system is averaged by the Gaussian window of
``winsize`` + 1 taps, σ = 0.3 · (winsize / 2) (sum 1).  All taps float64, then float32.

Kept apart from :mod:`featpipe.extract.optical_flow` so that the compiled kernels
(:mod:`featpipe.extract._trajectory_numba`) take the default filters as constants.
"""

from __future__ import annotations

import numpy as np

#: the release's polynomial expansion (n, σ) and system window
POLY_N = 7
POLY_SIGMA = 1.5
WINSIZE = 10
#: the widest frame the fused kernels take (their rows have a fixed pitch); wider frames go
#: through OpenCV's ``sepFilter2D`` and the separate kernels, to the same bits
FUSED_MAX_WIDTH = 2048


def expansion_filters(poly_n: int = POLY_N, poly_sigma: float = POLY_SIGMA):
    """(g, t·g, t²·g) as float32 arrays of 2n + 1 taps, and the float32 entries (ig11, ig03,
    ig33, ig55) of the inverse Gram matrix (Farnebäck's thesis, §4.3; OpenCV's
    ``FarnebackPrepareGaussian``)."""
    t = np.arange(-poly_n, poly_n + 1, dtype=np.float64)
    g = np.exp(-t * t / (2 * poly_sigma * poly_sigma))
    g /= g.sum()
    gram = np.zeros((6, 6))
    gx, gy = np.meshgrid(t, t)
    w = np.outer(g, g)
    gram[0, 0] = w.sum()
    gram[1, 1] = (w * gx * gx).sum()
    gram[3, 3] = (w * gx ** 4).sum()
    gram[5, 5] = (w * gx * gx * gy * gy).sum()
    gram[2, 2] = gram[0, 3] = gram[0, 4] = gram[3, 0] = gram[4, 0] = gram[1, 1]
    gram[4, 4] = gram[3, 3]
    gram[3, 4] = gram[4, 3] = gram[5, 5]
    inverse = np.linalg.inv(gram)
    taps = (g.astype(np.float32), (t * g).astype(np.float32), (t * t * g).astype(np.float32))
    return taps, tuple(np.float32(inverse[i, j]) for i, j in ((1, 1), (0, 3), (3, 3), (5, 5)))


def system_window(winsize: int = WINSIZE) -> np.ndarray:
    """The float32 Gaussian window (winsize // 2 · 2 + 1 taps, σ = 0.3 · winsize // 2, sum 1)
    that averages each pixel's system (OpenCV's ``FarnebackUpdateFlow_GaussianBlur``)."""
    half = winsize // 2
    sigma = half * 0.3
    k = np.exp(-np.arange(-half, half + 1) ** 2 / (2 * sigma * sigma))
    return (k / k.sum()).astype(np.float32)
