"""The compiled per-pixel passes of dense trajectories (numba, numpy inputs).

Kept apart from :mod:`featpipe.extract.trajectories` so that numba is imported only when a video
is tracked.  Three passes, each one loop over the pixels or the tracked points:

* :func:`farneback_matrices` and :func:`farneback_solve`: one Farnebäck iteration (Farnebäck,
  SCIA 2003; OpenCV's Gaussian-window variant, which the release copies): from the polynomial
  coefficients R0 (previous frame) and R1 (current frame, sampled bilinearly at x + d) the
  per-pixel 2×2 system A·d = b (its three distinct entries and b, 5 channels), then the
  displacement d = G⁻¹h from the Gaussian-blurred system (det + 10⁻³ keeps it finite);
* :func:`integral_histogram`: each pixel's vector (x, y) split by its angle between the two
  nearest of ``n`` orientation bins over 360° (linear in the angle, weighted by the magnitude;
  for HOF vectors of magnitude <= ``zero_threshold`` add 1 to an extra last bin), summed into
  an (H + 1, W + 1, bins) integral histogram (Viola & Jones; the release's ``BuildDescMat``);
* :func:`accumulate_cells`: for each point its 2×2 cells (four look-ups each), each bin
  max(sum, 0) + ε, L1-normalised over the block and square-rooted, added to the point's
  time cell.
"""

from __future__ import annotations

import math

import numba
import numpy as np

#: weights of the five outermost rows/columns in the Farnebäck system (OpenCV's values)
_BORDER = np.array([0.14, 0.14, 0.4472, 0.4472, 0.4472], dtype=np.float32)


@numba.njit(cache=True, nogil=True)
def farneback_matrices(r0, r1, flow, out):
    """The 5-channel system of one Farnebäck iteration at every pixel (into ``out``)."""
    height, width = flow.shape[0], flow.shape[1]
    border = _BORDER
    for y in range(height):
        for x in range(width):
            dx = flow[y, x, 0]
            dy = flow[y, x, 1]
            fx = x + dx
            fy = y + dy
            x1 = math.floor(fx)
            y1 = math.floor(fy)
            ax = fx - x1
            ay = fy - y1
            if 0 <= x1 < width - 1 and 0 <= y1 < height - 1:
                ix = int(x1)
                iy = int(y1)
                a00 = (1 - ax) * (1 - ay)
                a01 = ax * (1 - ay)
                a10 = (1 - ax) * ay
                a11 = ax * ay
                r2 = (a00 * r1[iy, ix, 0] + a01 * r1[iy, ix + 1, 0]
                      + a10 * r1[iy + 1, ix, 0] + a11 * r1[iy + 1, ix + 1, 0])
                r3 = (a00 * r1[iy, ix, 1] + a01 * r1[iy, ix + 1, 1]
                      + a10 * r1[iy + 1, ix, 1] + a11 * r1[iy + 1, ix + 1, 1])
                r4 = (a00 * r1[iy, ix, 2] + a01 * r1[iy, ix + 1, 2]
                      + a10 * r1[iy + 1, ix, 2] + a11 * r1[iy + 1, ix + 1, 2])
                r5 = (a00 * r1[iy, ix, 3] + a01 * r1[iy, ix + 1, 3]
                      + a10 * r1[iy + 1, ix, 3] + a11 * r1[iy + 1, ix + 1, 3])
                r6 = (a00 * r1[iy, ix, 4] + a01 * r1[iy, ix + 1, 4]
                      + a10 * r1[iy + 1, ix, 4] + a11 * r1[iy + 1, ix + 1, 4])
                r4 = (r0[y, x, 2] + r4) * np.float32(0.5)
                r5 = (r0[y, x, 3] + r5) * np.float32(0.5)
                r6 = (r0[y, x, 4] + r6) * np.float32(0.25)
            else:
                r2 = np.float32(0.0)
                r3 = np.float32(0.0)
                r4 = r0[y, x, 2]
                r5 = r0[y, x, 3]
                r6 = r0[y, x, 4] * np.float32(0.5)
            r2 = (r0[y, x, 0] - r2) * np.float32(0.5)
            r3 = (r0[y, x, 1] - r3) * np.float32(0.5)
            r2 += r4 * dy + r6 * dx
            r3 += r6 * dy + r5 * dx
            if x < 5 or x >= width - 5 or y < 5 or y >= height - 5:
                scale = np.float32(1.0)
                if x < 5:
                    scale *= border[x]
                if x >= width - 5:
                    scale *= border[width - x - 1]
                if y < 5:
                    scale *= border[y]
                if y >= height - 5:
                    scale *= border[height - y - 1]
                r2 *= scale
                r3 *= scale
                r4 *= scale
                r5 *= scale
                r6 *= scale
            out[y, x, 0] = r4 * r4 + r6 * r6
            out[y, x, 1] = (r4 + r5) * r6
            out[y, x, 2] = r5 * r5 + r6 * r6
            out[y, x, 3] = r4 * r2 + r6 * r3
            out[y, x, 4] = r6 * r2 + r5 * r3


@numba.njit(cache=True, nogil=True)
def farneback_solve(blurred, flow):
    """d = G⁻¹h at every pixel from the blurred system (into ``flow``)."""
    height, width = flow.shape[0], flow.shape[1]
    for y in range(height):
        for x in range(width):
            g11 = np.float64(blurred[y, x, 0])
            g12 = np.float64(blurred[y, x, 1])
            g22 = np.float64(blurred[y, x, 2])
            h1 = np.float64(blurred[y, x, 3])
            h2 = np.float64(blurred[y, x, 4])
            idet = 1.0 / (g11 * g22 - g12 * g12 + 1e-3)
            flow[y, x, 0] = (g11 * h2 - g12 * h1) * idet
            flow[y, x, 1] = (g22 * h1 - g12 * h2) * idet


_ATAN_P1 = np.float32(0.9997878412794807 * 180 / math.pi)
_ATAN_P3 = np.float32(-0.3258083974640975 * 180 / math.pi)
_ATAN_P5 = np.float32(0.1555786518463281 * 180 / math.pi)
_ATAN_P7 = np.float32(-0.04432655554792128 * 180 / math.pi)
_ATAN_EPS = np.float32(np.finfo(np.float64).eps)


@numba.njit(cache=True, nogil=True, inline="always")
def fast_atan2(y, x):
    """atan2(y, x) in degrees in [0, 360) by OpenCV's polynomial (``cv::fastAtan2``, error
    about 0.01 degree; the release bins its angles with it)."""
    ax = abs(x)
    ay = abs(y)
    if ax >= ay:
        c = ay / (ax + _ATAN_EPS)
        c2 = c * c
        a = (((_ATAN_P7 * c2 + _ATAN_P5) * c2 + _ATAN_P3) * c2 + _ATAN_P1) * c
    else:
        c = ax / (ay + _ATAN_EPS)
        c2 = c * c
        a = np.float32(90.0) - (((_ATAN_P7 * c2 + _ATAN_P5) * c2 + _ATAN_P3) * c2
                                + _ATAN_P1) * c
    if x < 0:
        a = np.float32(180.0) - a
    if y < 0:
        a = np.float32(360.0) - a
    return a


@numba.njit(cache=True, nogil=True)
def integral_histogram(xcomp, ycomp, n_orientations, zero_threshold, out):
    """The integral orientation histogram of the vector field (xcomp, ycomp) into ``out``
    ((H + 1, W + 1, bins) float32; first row and column zero).  ``zero_threshold`` >= 0 adds
    the zero bin (HOF): vectors no longer than it add 1 to the last bin."""
    height, width = xcomp.shape
    bins = out.shape[2]
    base = np.float32(n_orientations / 360.0)
    row = np.zeros(bins, dtype=np.float32)
    out[0, :, :] = 0
    for y in range(height):
        row[:] = 0
        out[y + 1, 0, :] = 0
        for x in range(width):
            vx = xcomp[y, x]
            vy = ycomp[y, x]
            magnitude = np.float32(math.sqrt(vx * vx + vy * vy))
            if zero_threshold >= 0 and magnitude <= zero_threshold:
                row[n_orientations] += 1
            else:
                angle = fast_atan2(vy, vx)
                if angle >= 360:
                    angle -= np.float32(360.0)
                position = angle * base
                low = int(math.floor(position))
                upper = (position - low) * magnitude
                high = low + 1
                if high >= n_orientations:
                    high -= n_orientations
                if low >= n_orientations:
                    low -= n_orientations
                row[low] += magnitude - upper
                row[high] += upper
            for b in range(bins):
                out[y + 1, x + 1, b] = out[y, x + 1, b] + row[b]


@numba.njit(cache=True, nogil=True)
def accumulate_cells(integral, rows, left, top, cell, n_cells, time_cell, epsilon, out, column):
    """Add each point's normalised block to its time cell: ``out[rows[i], time_cell[i],
    column: column + n_cells² · bins]`` (points with a negative time cell are skipped).

    The block's corner is (``left[i]``, ``top[i]``) in pixels; cell (cx, cy) covers
    ``cell`` × ``cell`` pixels from (left + cx·cell, top + cy·cell); entries run over cx, then
    cy, then the bins (the release's order)."""
    bins = integral.shape[2]
    size = n_cells * n_cells * bins
    block = np.empty(size, dtype=np.float32)
    for i in range(left.shape[0]):
        t = time_cell[i]
        if t < 0:
            continue
        k = 0
        total = np.float32(0.0)
        for cx in range(n_cells):
            x0 = left[i] + cx * cell
            x1 = x0 + cell
            for cy in range(n_cells):
                y0 = top[i] + cy * cell
                y1 = y0 + cell
                for b in range(bins):
                    value = (integral[y1, x1, b] + integral[y0, x0, b]
                             - integral[y1, x0, b] - integral[y0, x1, b])
                    value = max(value, np.float32(0.0)) + epsilon
                    block[k] = value
                    total += value
                    k += 1
        scale = np.float32(1.0) / total
        for k in range(size):
            out[rows[i], t, column + k] += math.sqrt(block[k] * scale)
