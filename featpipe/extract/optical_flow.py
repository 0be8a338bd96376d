"""Dense optical flow on a pyramid of scales, as dense trajectories need it: one flow per scale.

Farnebäck (SCIA 2003, "Two-frame motion estimation based on polynomial expansion"), the way the
dense-trajectory release runs it (``OpticalFlow.h``): each frame's polynomial expansion is
computed once per scale and serves two frame pairs, and the flow of every scale is kept.

* Scale k of size (h_k, w_k) = round(size / s_k), s_k = stride^k: the grey frame is smoothed by
  a Gaussian of σ_k = (s_k − 1)/2 (kernel max(3, round(5σ_k) | 1); σ_0 = 0 means OpenCV's 0.8 for
  a 3×3 kernel) and resized bilinearly.
* Polynomial expansion f(x) ≈ xᵀAx + bᵀx + c by weighted least squares over a
  (2n + 1)² window of Gaussian weights (n = 7, σ = 1.5): six separable correlations with g,
  x·g, x²·g (edges replicated), combined by the inverse Gram matrix; five coefficients per pixel.
* Coarse to fine: the coarsest scale starts from zero flow, each finer one from the coarser flow
  resized bilinearly and multiplied by the stride.  Per scale, ``iterations`` (2) updates: the
  system from R0 and R1 sampled at x + d (:func:`~featpipe.extract._trajectory_kernels.
  farneback_matrices`), blurred by a Gaussian window (``winsize`` 10: 11 taps, σ = 1.5),
  solved per pixel; then a 5×5 median filter of each component (Wang et al., IJCV 2013, §3.1),
  which is the flow kept for the scale and passed to the next one.

:class:`DISPyramid` (``flow="dis"``): OpenCV's DIS flow (Kroeger et al., ECCV 2016, ultrafast
preset: no variational refinement) where the preset computes its field, at a quarter of the
frame's size (its finest scale 2; half or the full size where a reduced side would be under 16
px): DIS runs with finest scale 0 on the frames reduced by area, and its field is resized
bilinearly to each scale and multiplied by reduction / s_k, then the same median filter.  One
flow computation per frame pair in place of a pyramid of Farnebäck iterations.  (On the whole
frame DIS computes this very field and upsamples it bilinearly: at 320 × 240 scale 0 is the
same to the bit; reading the other scales from the field itself spares upsampling it and
area-reducing it again.)
"""

from __future__ import annotations

import cv2
import numpy as np

from featpipe.extract import _trajectory_kernels as kernels
from featpipe.extract.farneback_filters import (
    FUSED_MAX_WIDTH,
    POLY_N,
    POLY_SIGMA,
    WINSIZE,
    expansion_filters,
    system_window,
)


def smoothed_pyramid(grey: np.ndarray, sizes: list[tuple[int, int]], scales: list[float]
                     ) -> list[np.ndarray]:
    """The float32 grey frame at each scale: Gaussian of σ = (s − 1)/2, then a bilinear
    resize (the release's flow pyramid; sizes (height, width))."""
    image = grey.astype(np.float32)
    out = []
    for (height, width), scale in zip(sizes, scales, strict=True):
        sigma = (scale - 1) * 0.5
        ksize = max(int(round(sigma * 5)) | 1, 3)
        blurred = cv2.GaussianBlur(image, (ksize, ksize), sigma, sigmaY=sigma)
        out.append(cv2.resize(blurred, (width, height), interpolation=cv2.INTER_LINEAR))
    return out


def median_flow(flow: np.ndarray) -> np.ndarray:
    """A 5×5 median filter of each flow component, equal to OpenCV's ``cv2.medianBlur(flow, 5)``
    (:mod:`featpipe.extract._flow_median`: separable sorting networks, faster)."""
    return kernels.flow_median(np.ascontiguousarray(flow))


class FarnebackPyramid:
    """Farnebäck flow at every scale, polynomial expansions shared between frame pairs.

    With the release's filters (the defaults) on frames up to ``FUSED_MAX_WIDTH`` wide, each
    expansion and each iteration is one compiled pass (:func:`~featpipe.extract.
    _trajectory_numba.polynomial_expansion`, :func:`~featpipe.extract._trajectory_numba.
    farneback_update`); otherwise OpenCV's ``sepFilter2D`` does the correlations and the
    window between the kernels of the system and the solve.  Both give the same bits."""

    def __init__(self, sizes: list[tuple[int, int]], scales: list[float], stride: float,
                 poly_n: int = POLY_N, poly_sigma: float = POLY_SIGMA, winsize: int = WINSIZE,
                 iterations: int = 2):
        self.sizes, self.scales, self.stride = sizes, scales, float(stride)
        self.iterations = iterations
        (self.g, self.xg, self.xxg), self.inverse = expansion_filters(poly_n, poly_sigma)
        self.window = system_window(winsize)
        #: whether the fused passes apply (the release's filters, frames they take)
        self.fused = ((poly_n, poly_sigma, winsize) == (POLY_N, POLY_SIGMA, WINSIZE)
                      and max(w for _, w in sizes) <= FUSED_MAX_WIDTH)
        #: per scale, the system and its blurred copy, reused from frame to frame (the
        #: separate passes only)
        self._work = [] if self.fused else [
            (np.empty((h, w, 5), np.float32), np.empty((h, w, 5), np.float32))
            for h, w in sizes]

    def _correlate(self, image, kx, ky):
        return cv2.sepFilter2D(image, cv2.CV_32F, kx, ky, borderType=cv2.BORDER_REPLICATE)

    def expand(self, grey: np.ndarray) -> list[np.ndarray]:
        """The (5, h_k, w_k) polynomial coefficients of a uint8 grey frame at every scale (a
        plane per coefficient)."""
        out = []
        g, xg, xxg = self.g, self.xg, self.xxg
        for image in smoothed_pyramid(grey, self.sizes, self.scales):
            coeffs = np.empty((5,) + image.shape, np.float32)
            if self.fused:
                kernels.polynomial_expansion(image, coeffs)
            else:
                kernels.polynomial_coefficients(
                    self._correlate(image, g, g), self._correlate(image, g, xg),
                    self._correlate(image, xg, g), self._correlate(image, g, xxg),
                    self._correlate(image, xxg, g), self._correlate(image, xg, xg),
                    *self.inverse, coeffs)
            out.append(coeffs)
        return out

    def flow(self, previous: list[np.ndarray], current: list[np.ndarray]) -> list[np.ndarray]:
        """(h_k, w_k, 2) flow from the previous frame to the current one at every scale."""
        flows: list[np.ndarray] = [None] * len(self.sizes)
        coarser = None
        for k in range(len(self.sizes) - 1, -1, -1):
            height, width = self.sizes[k]
            if coarser is None:
                flow = np.zeros((height, width, 2), np.float32)
            else:
                flow = cv2.resize(coarser, (width, height), interpolation=cv2.INTER_LINEAR)
                flow *= np.float32(self.stride)
            if self.fused:
                for _ in range(self.iterations):
                    kernels.farneback_update(previous[k], current[k], flow)
            else:
                system, blurred = self._work[k]
                for _ in range(self.iterations):
                    kernels.farneback_matrices(previous[k], current[k], flow, system)
                    cv2.sepFilter2D(system, cv2.CV_32F, self.window, self.window, dst=blurred,
                                    borderType=cv2.BORDER_REPLICATE)
                    kernels.farneback_solve(blurred, flow)
            coarser = flows[k] = median_flow(flow)
        return flows


class DISPyramid:
    """OpenCV's DIS flow on the area-reduced frame, resized to every scale and median-filtered."""

    #: a reduced frame's shorter side stays at least this long
    MIN_REDUCED_SIDE = 16
    #: OpenCV's DIS needs a frame with a side at least this long
    MIN_FRAME_SIDE = 12

    def __init__(self, sizes: list[tuple[int, int]], scales: list[float],
                 preset: int = cv2.DISOPTICAL_FLOW_PRESET_ULTRAFAST):
        self.sizes, self.scales = sizes, scales
        self.dis = cv2.DISOpticalFlow_create(preset)
        height, width = sizes[0]
        self.reduction = 2 ** self.dis.getFinestScale()
        while self.reduction > 1 and min(height, width) // self.reduction < self.MIN_REDUCED_SIDE:
            self.reduction //= 2
        self.reduced = (width // self.reduction, height // self.reduction)
        self.dis.setFinestScale(0)

    def expand(self, grey: np.ndarray) -> np.ndarray:
        """The frame reduced by area, as DIS's pyramid reduces it."""
        if self.reduction == 1:
            return grey
        return cv2.resize(grey, self.reduced, interpolation=cv2.INTER_AREA)

    def flow(self, previous: np.ndarray, current: np.ndarray) -> list[np.ndarray]:
        """(h_k, w_k, 2) flow from the previous frame to the current one at every scale."""
        field = self.dis.calc(previous, current, None)
        flows = []
        for (height, width), scale in zip(self.sizes, self.scales, strict=True):
            flow = cv2.resize(field, (width, height), interpolation=cv2.INTER_LINEAR)
            flow *= np.float32(self.reduction / scale)
            flows.append(median_flow(flow))
        return flows


def level_scales(count: int, stride: float) -> list[float]:
    """s_k = stride^k as the release forms them (a float32 running product)."""
    scales, scale = [], np.float32(1.0)
    for _ in range(count):
        scales.append(float(scale))
        scale = np.float32(scale * np.float32(stride))
    return scales

