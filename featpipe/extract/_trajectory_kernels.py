"""The compiled per-pixel passes of dense trajectories (numba, numpy inputs).

Kept apart from :mod:`featpipe.extract.trajectories` so that numba is imported only when a video
is tracked.  Three passes, each one loop over the pixels or the tracked points:

* :func:`farneback_matrices` and :func:`farneback_solve`: one Farnebäck iteration (Farnebäck,
  SCIA 2003; OpenCV's Gaussian-window variant, which the release copies): from the polynomial
  coefficients R0 (previous frame) and R1 (current frame, sampled bilinearly at x + d) the
  per-pixel 2×2 system A·d = b (its three distinct entries and b, 5 channels), then the
  displacement d = G⁻¹h from the Gaussian-blurred system (det + 10⁻³ keeps it finite);
* :func:`integral_histograms`: each pixel's vector (magnitude, angle) split by its angle
  between the two nearest of 8 orientation bins over 360° (linear in the angle, weighted by
  the magnitude; for HOF vectors of magnitude <= ``zero_threshold`` add 1 to an extra last
  bin), summed into an (H + 1, W + 1, bins) integral histogram (Viola & Jones; the release's
  ``BuildDescMat``), the four groups at once;
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


#: channels of each group in the integral histograms: 8 orientations and HOF's zero bin (HOG
#: and MBH leave it 0); the groups HOG, HOF, MBHx, MBHy follow each other (36 channels), so
#: that a pixel's histograms are contiguous and the per-channel loops unroll
CHANNELS = 9
GROUPS = 4
GROUP_CHANNELS = GROUPS * CHANNELS
ORIENTATIONS = 8


@numba.njit(cache=True, nogil=True)
def integral_histograms(magnitude, angle, zero_threshold, out):
    """The integral orientation histograms of one scale into ``out`` ((H + 1, W + 1, 36)
    float32; first row and column zero) from the (4, H, W) magnitudes and angles (degrees,
    [0, 360]) of the four vector fields HOG, HOF, MBHx, MBHy: channels 9g .. 9g + 7 hold
    group g's 8 orientations; HOF's vectors no longer than ``zero_threshold`` add 1 to
    channel 17 (its zero bin) instead."""
    height, width = magnitude.shape[1], magnitude.shape[2]
    base = np.float32(ORIENTATIONS / 360.0)
    row = np.zeros(GROUP_CHANNELS, dtype=np.float32)
    out[0, :, :] = 0
    for y in range(height):
        for b in range(GROUP_CHANNELS):
            row[b] = 0
            out[y + 1, 0, b] = 0
        for x in range(width):
            for g in range(GROUPS):
                m = magnitude[g, y, x]
                offset = CHANNELS * g
                if g == 1 and m <= zero_threshold:
                    row[offset + ORIENTATIONS] += np.float32(1.0)
                    continue
                position = angle[g, y, x] * base
                low = np.int32(position)
                upper = (position - np.float32(low)) * m
                if low >= ORIENTATIONS:
                    low -= ORIENTATIONS
                high = low + 1
                if high >= ORIENTATIONS:
                    high -= ORIENTATIONS
                row[offset + low] += m - upper
                row[offset + high] += upper
            for b in range(GROUP_CHANNELS):
                out[y + 1, x + 1, b] = out[y, x + 1, b] + row[b]


@numba.njit(cache=True, nogil=True, inline="always")
def _add_blocks(integral, channels, bins, columns, left, top, cell, n_cells, epsilon, out,
                corners, block):
    """Add one point's normalised blocks (corner (left, top)) to ``out`` (one time cell)."""
    n_corners = n_cells + 1
    for cy in range(n_corners):
        for cx in range(n_corners):
            source = integral[top + cy * cell, left + cx * cell]
            for b in range(GROUP_CHANNELS):
                corners[cy, cx, b] = source[b]
    for g in range(channels.shape[0]):
        first = channels[g]
        n_bins = bins[g]
        k = 0
        total = np.float32(0.0)
        for cx in range(n_cells):
            for cy in range(n_cells):
                for b in range(first, first + n_bins):
                    value = (corners[cy + 1, cx + 1, b] + corners[cy, cx, b]
                             - corners[cy + 1, cx, b] - corners[cy, cx + 1, b])
                    value = max(value, np.float32(0.0)) + epsilon
                    block[k] = value
                    total += value
                    k += 1
        scale = np.float32(1.0) / total
        column = columns[g]
        for j in range(k):
            out[column + j] += np.sqrt(block[j] * scale)


@numba.njit(cache=True, nogil=True)
def accumulate_cells(integral, channels, bins, columns, rows, left, top, cell, n_cells,
                     time_cell, epsilon, out):
    """Add each point's normalised blocks to its time cell: for each group g, the first
    ``bins[g]`` channels from ``channels[g]`` go to ``out[rows[i], time_cell[i], columns[g]:
    columns[g] + n_cells² · bins[g]]`` (points with a negative time cell are skipped).

    The block's corner is (``left[i]``, ``top[i]``) in pixels; cell (cx, cy) covers
    ``cell`` × ``cell`` pixels from (left + cx·cell, top + cy·cell); entries run over cx, then
    cy, then the bins (the release's order).  The (n_cells + 1)² corners are read once."""
    corners = np.empty((n_cells + 1, n_cells + 1, GROUP_CHANNELS), dtype=np.float32)
    block = np.empty(n_cells * n_cells * CHANNELS, dtype=np.float32)
    for i in range(left.shape[0]):
        if time_cell[i] >= 0:
            _add_blocks(integral, channels, bins, columns, left[i], top[i], cell, n_cells,
                        epsilon, out[rows[i], time_cell[i]], corners, block)


@numba.njit(cache=True, nogil=True)
def advance_tracks(points, steps, flow, descriptor_flow, displacements, integral, channels,
                   bins, columns, patch, n_cells, t_stride, n_t_cells, epsilon, sums, alive):
    """One frame of every live track of a scale (``alive``): the point p = ``points[i,
    steps[i]]`` moves to
    p + flow(round(p)) (rounded half to even and clamped to the frame, as ``cvRound``); a
    track whose new point is not strictly inside the frame is no longer ``alive``.  The others
    add their blocks at p (corner round(p) − patch/2 clamped into the frame) to their time
    cell of ``sums``, record ``descriptor_flow`` at round(p) in ``displacements`` (when it has
    rows), append the new point and count the step."""
    height, width = flow.shape[0], flow.shape[1]
    half = patch // 2
    cell = patch // n_cells
    corners = np.empty((n_cells + 1, n_cells + 1, GROUP_CHANNELS), dtype=np.float32)
    block = np.empty(n_cells * n_cells * CHANNELS, dtype=np.float32)
    for i in range(steps.shape[0]):
        if not alive[i]:
            continue
        s = steps[i]
        px = points[i, s, 0]
        py = points[i, s, 1]
        xi = min(max(int(np.rint(px)), 0), width - 1)
        yi = min(max(int(np.rint(py)), 0), height - 1)
        mx = px + flow[yi, xi, 0]
        my = py + flow[yi, xi, 1]
        if not (mx > 0 and mx < width and my > 0 and my < height):
            alive[i] = False
            continue
        if s < n_t_cells * t_stride and channels.shape[0] > 0:
            left = min(max(xi - half, 0), width - patch)
            top = min(max(yi - half, 0), height - patch)
            _add_blocks(integral, channels, bins, columns, left, top, cell, n_cells, epsilon,
                        sums[i, s // t_stride], corners, block)
        if displacements.shape[0] > 0:
            displacements[i, s, 0] = descriptor_flow[yi, xi, 0]
            displacements[i, s, 1] = descriptor_flow[yi, xi, 1]
        points[i, s + 1, 0] = mx
        points[i, s + 1, 1] = my
        steps[i] = s + 1
