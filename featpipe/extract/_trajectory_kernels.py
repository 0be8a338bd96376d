"""The compiled per-pixel passes of dense trajectories (numba, numpy inputs).

Kept apart from :mod:`featpipe.extract.trajectories` so that numba is imported only when a video
is tracked.  The passes, each one loop over the pixels or the tracked points:

* :func:`polynomial_coefficients`: a frame's five polynomial coefficients per pixel from its
  six correlations (the expansion's last step);
* :func:`farneback_matrices` and :func:`farneback_solve`: one Farnebäck iteration (Farnebäck,
  SCIA 2003; OpenCV's Gaussian-window variant, which the release copies): from the polynomial
  coefficients R0 (previous frame) and R1 (current frame, sampled bilinearly at x + d) the
  per-pixel 2×2 system A·d = b (its three distinct entries and b, 5 channels), then the
  displacement d = G⁻¹h from the Gaussian-blurred system (det + 10⁻³ keeps it finite);
* :func:`advance_tracks`: one frame of a scale's tracks: each point moved by the flow, and
  its block of 2×2 cells (each bin max(sum, 0) + ε, L1-normalised over the block and
  square-rooted) added to its time cell, from integral orientation histograms (Viola &
  Jones; the release's ``BuildDescMat``) of the four vector fields made row by row
  (:func:`_integral_row`: central-difference gradients, OpenCV's ``cartToPolar`` to the bit
  by :func:`_polar`, each vector split between the two nearest of 8 orientation bins) into a
  ring of rows that the tracks read as soon as their block's last row is made;
* :func:`grid_points` and :func:`start_tracks`: dense sampling around the live tracks and
  new tracks in free slots.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from featpipe.numba_cache import load_blas_alone

load_blas_alone()

#: weights of the five outermost rows/columns in the Farnebäck system (OpenCV's values)
_BORDER = np.array([0.14, 0.14, 0.4472, 0.4472, 0.4472], dtype=np.float32)
#: pixels the general pass of the Farnebäck system takes at a time, through planes of PITCH
#: float64 values (a PITCH that is not a multiple of 512 bytes' worth of values keeps the
#: planes in different cache sets: at 256, 2 KB apart, they evicted each other)
STRIP = 256
PITCH = 264
#: the planes: the bilinear weights along x and y, whether x + d falls inside (1.0 or 0.0),
#: then R1's five coefficients at the four corners, coefficient c at corner k (top left, top
#: right, bottom left, bottom right) in plane CORNERS + 4c + k
WEIGHT_X, WEIGHT_Y, INSIDE, CORNERS = 0, 1, 2, 3
PLANES = CORNERS + 20
_U = np.uint64


@numba.njit(cache=True, nogil=True)
def polynomial_coefficients(b1, by, bx, byy, bxx, bxy, ig11, ig03, ig33, ig55, out):
    """The five polynomial coefficients of every pixel (into ``out``, (5, H, W) float32: a
    plane per coefficient) from the image's six correlations ((H, W) float32): with g along x
    and y (``b1``), t·g along y (``by``; g along x), t·g along x (``bx``), t²·g along y
    (``byy``), t²·g along x (``bxx``), t·g along both (``bxy``): by·ig11, bx·ig11,
    b1·ig03 + byy·ig33, b1·ig03 + bxx·ig33, bxy·ig55, in float32 (each product rounded, then
    the sum; the release's order of coefficients).  Unsigned indices, as in
    :func:`farneback_matrices`."""
    b1, by, bx = b1.reshape(-1), by.reshape(-1), bx.reshape(-1)
    byy, bxx, bxy = byy.reshape(-1), bxx.reshape(-1), bxy.reshape(-1)
    flat = out.reshape(-1)
    plane = _U(b1.shape[0])
    for i in range(b1.shape[0]):
        p = _U(i)
        base = b1[p] * ig03
        flat[p] = by[p] * ig11
        flat[plane + p] = bx[p] * ig11
        flat[_U(2) * plane + p] = base + byy[p] * ig33
        flat[_U(3) * plane + p] = base + bxx[p] * ig33
        flat[_U(4) * plane + p] = bxy[p] * ig55


@numba.njit(cache=True, nogil=True, error_model="numpy")
def farneback_matrices(r0, r1, flow, out):
    """The 5-channel system of one Farnebäck iteration at every pixel (into ``out``, (H, W, 5)).

    Per pixel (OpenCV's ``FarnebackUpdateMatrices``, which the release copies), with d the
    flow: R1 (the coefficients (5, H, W) of :func:`polynomial_coefficients`) sampled
    bilinearly at x + d when x + d and the pixel after it are in the frame (else zero, and
    R0's quadratic terms alone), averaged with R0, the five outermost rows and columns
    weighted by ``_BORDER``; float64 arithmetic on the float32 inputs, float32 results.

    Two passes, both vectorised by LLVM (every index unsigned and affine in the pixel;
    numba's wrap-around of negative indices would hide that, and the loops stay scalar):
    :func:`_system_near` takes the inner pixels of a row whose x + d lies in their 3 × 3
    neighbourhood's upper-left 2 × 2 cells (-1 <= d < 1 along x and y: most pixels), R1's
    corners selected from the nine values; the others, the first and last rows and columns,
    go to :func:`_system_anywhere` in runs (R1's corners gathered into planes, then the same
    arithmetic).  Equal to the bit to the per-pixel formula (tests/unit/
    test_trajectory_kernels.py)."""
    height, width = flow.shape[0], flow.shape[1]
    border = _BORDER
    columns = np.empty(width, np.float32)
    for x in range(width):
        scale = np.float32(1.0)
        if x < 5:
            scale *= border[x]
        if x >= width - 5:
            scale *= border[width - x - 1]
        columns[x] = scale
    elsewhere = np.zeros(width, np.uint8)
    work = np.zeros(PLANES * PITCH, np.float64)
    r0f, r1f = r0.reshape(-1), r1.reshape(-1)
    flat_flow, flat_out = flow.reshape(-1), out.reshape(-1)
    plane, stride = _U(height * width), _U(width)
    for y in range(height):
        top = border[y] if y < 5 else np.float32(1.0)
        bottom = border[height - y - 1] if y >= height - 5 else np.float32(1.0)
        if y == 0 or y == height - 1 or width < 3:
            _system_anywhere(r0f, r1f, flat_flow, flat_out, work, columns, top, bottom, plane,
                             y, width, height, 0, width)
            continue
        start = _U(y * width + 1)
        _system_near(r1f[start - stride - _U(1):], r0f[start:], flat_flow[_U(2) * start:],
                     flat_out[_U(5) * start:], columns[1:], elsewhere[1:], top, bottom, plane,
                     stride, y, width - 2)
        elsewhere[0] = elsewhere[width - 1] = 1
        x = 0
        while x < width:
            if elsewhere[x]:
                first = x
                while x < width and elsewhere[x]:
                    x += 1
                _system_anywhere(r0f, r1f, flat_flow, flat_out, work, columns, top, bottom,
                                 plane, y, width, height, first, x)
            else:
                x += 1


@numba.njit(error_model="numpy")
def _pick_bilinear(r1, at, stride, left, up, a00, a01, a10, a11):
    """a00·tl + a01·tr + a10·bl + a11·br (in that order), the corners picked from the 3 × 3
    values of a plane from ``at`` (rows ``stride`` apart): the upper-left 2 × 2 cell when
    ``left`` and ``up``, the one to the right when only ``up``, and so on."""
    v00, v01, v02 = r1[at], r1[at + _U(1)], r1[at + _U(2)]
    at += stride
    v10, v11, v12 = r1[at], r1[at + _U(1)], r1[at + _U(2)]
    at += stride
    v20, v21, v22 = r1[at], r1[at + _U(1)], r1[at + _U(2)]
    tl = (v00 if left else v01) if up else (v10 if left else v11)
    tr = (v01 if left else v02) if up else (v11 if left else v12)
    bl = (v10 if left else v11) if up else (v20 if left else v21)
    br = (v11 if left else v12) if up else (v21 if left else v22)
    return a00 * tl + a01 * tr + a10 * bl + a11 * br


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _system_near(r1, r0, flow, out, columns, elsewhere, top, bottom, plane, stride, y, count):
    """The system of ``count`` inner pixels of row y from column 1 (``r1`` from the first's
    upper-left neighbour, the other arrays from the first pixel), computed as if x + d fell
    in the pixel's 3 × 3 neighbourhood (:func:`_pick_bilinear`); ``elsewhere`` marks those
    where it does not (their values here are not the system: :func:`farneback_matrices`
    recomputes them)."""
    for i in range(count):
        u = _U(i)
        dx = flow[_U(2) * u]
        dy = flow[_U(2) * u + _U(1)]
        fx = (i + 1) + dx
        fy = y + dy
        x1 = math.floor(fx)
        y1 = math.floor(fy)
        ax = fx - x1
        ay = fy - y1
        left = x1 == i
        up = y1 == y - 1
        elsewhere[u] = not ((left or x1 == i + 1) and (up or y1 == y))
        a00 = (1 - ax) * (1 - ay)
        a01 = ax * (1 - ay)
        a10 = (1 - ax) * ay
        a11 = ax * ay
        s2 = _pick_bilinear(r1, u, stride, left, up, a00, a01, a10, a11)
        s3 = _pick_bilinear(r1, plane + u, stride, left, up, a00, a01, a10, a11)
        s4 = _pick_bilinear(r1, _U(2) * plane + u, stride, left, up, a00, a01, a10, a11)
        s5 = _pick_bilinear(r1, _U(3) * plane + u, stride, left, up, a00, a01, a10, a11)
        s6 = _pick_bilinear(r1, _U(4) * plane + u, stride, left, up, a00, a01, a10, a11)
        r2 = (r0[u] - s2) * np.float32(0.5)
        r3 = (r0[plane + u] - s3) * np.float32(0.5)
        r4 = (r0[_U(2) * plane + u] + s4) * np.float32(0.5)
        r5 = (r0[_U(3) * plane + u] + s5) * np.float32(0.5)
        r6 = (r0[_U(4) * plane + u] + s6) * np.float32(0.25)
        _store_system(out, _U(5) * u, r2, r3, r4, r5, r6, dx, dy, columns[u] * top * bottom)


@numba.njit(error_model="numpy")
def _store_system(out, at, r2, r3, r4, r5, r6, dx, dy, scale):
    """The system's five values from r2..r6 (the release's names), the flow and the border
    weight, at ``out[at:at + 5]``."""
    r2 += r4 * dy + r6 * dx
    r3 += r6 * dy + r5 * dx
    r2 *= scale
    r3 *= scale
    r4 *= scale
    r5 *= scale
    r6 *= scale
    out[at] = r4 * r4 + r6 * r6
    out[at + _U(1)] = (r4 + r5) * r6
    out[at + _U(2)] = r5 * r5 + r6 * r6
    out[at + _U(3)] = r4 * r2 + r6 * r3
    out[at + _U(4)] = r6 * r2 + r5 * r3


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _system_anywhere(r0f, r1f, flow, out, work, columns, top, bottom, plane, y, width, height,
                     first, stop):
    """The system of pixels ``first`` .. ``stop`` - 1 of row y, wherever x + d falls: up to
    STRIP at a time, :func:`_gather_corners` then :func:`_strip_system`."""
    while first < stop:
        count = min(STRIP, stop - first)
        start = _U(y * width + first)
        _gather_corners(r1f, flow, work, plane, start, first, y, width, height, count)
        _strip_system(work, r0f[start:], flow[_U(2) * start:], out[_U(5) * start:],
                      columns[first:], top, bottom, plane, count)
        first += count


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _gather_corners(r1f, flow, work, plane, start, first, y, width, height, count):
    """For ``count`` pixels of row y from column ``first`` (pixel ``start`` of the frame):
    the weights ax, ay of x + d = (x1 + ax, y1 + ay), x1 and y1 the floors, whether (x1, y1)
    and (x1 + 1, y1 + 1) are in the frame, and where they are R1's coefficients at the four
    corners, into ``work``'s planes."""
    stride = _U(width)
    for i in range(count):
        u = _U(i)
        p = start + u
        fx = (first + i) + flow[_U(2) * p]
        fy = y + flow[_U(2) * p + _U(1)]
        x1 = math.floor(fx)
        y1 = math.floor(fy)
        work[_U(WEIGHT_X * PITCH) + u] = fx - x1
        work[_U(WEIGHT_Y * PITCH) + u] = fy - y1
        if 0 <= x1 < width - 1 and 0 <= y1 < height - 1:
            work[_U(INSIDE * PITCH) + u] = 1.0
            corner = _U(y1 * width + x1)
            for c in range(5):
                at = _U(c) * plane + corner
                to = _U((CORNERS + 4 * c) * PITCH) + u
                work[to] = r1f[at]
                work[to + _U(PITCH)] = r1f[at + _U(1)]
                work[to + _U(2 * PITCH)] = r1f[at + stride]
                work[to + _U(3 * PITCH)] = r1f[at + stride + _U(1)]
        else:
            work[_U(INSIDE * PITCH) + u] = 0.0


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _strip_system(work, r0, flow, out, columns, top, bottom, plane, count):
    """The system of ``count`` pixels from :func:`_gather_corners`' planes, R0, the flow and
    the border weights (``columns`` per pixel, ``top`` and ``bottom`` for the row: their
    float32 product), into ``out``."""
    for i in range(count):
        u = _U(i)
        ax = work[_U(WEIGHT_X * PITCH) + u]
        ay = work[_U(WEIGHT_Y * PITCH) + u]
        inside = work[_U(INSIDE * PITCH) + u] != 0.0
        a00 = (1 - ax) * (1 - ay)
        a01 = ax * (1 - ay)
        a10 = (1 - ax) * ay
        a11 = ax * ay
        s2 = _bilinear(work, a00, a01, a10, a11, CORNERS, u)
        s3 = _bilinear(work, a00, a01, a10, a11, CORNERS + 4, u)
        s4 = _bilinear(work, a00, a01, a10, a11, CORNERS + 8, u)
        s5 = _bilinear(work, a00, a01, a10, a11, CORNERS + 12, u)
        s6 = _bilinear(work, a00, a01, a10, a11, CORNERS + 16, u)
        q0 = r0[u]
        q1 = r0[plane + u]
        q2 = r0[_U(2) * plane + u]
        q3 = r0[_U(3) * plane + u]
        q4 = r0[_U(4) * plane + u]
        # every value computed, those outside the frame then left out (a select, not a
        # branch: the loop stays vectorised)
        r4 = (q2 + s4) * np.float32(0.5) if inside else np.float64(q2)
        r5 = (q3 + s5) * np.float32(0.5) if inside else np.float64(q3)
        r6 = (q4 + s6) * np.float32(0.25) if inside else np.float64(q4 * np.float32(0.5))
        r2 = (q0 - (s2 if inside else 0.0)) * np.float32(0.5)
        r3 = (q1 - (s3 if inside else 0.0)) * np.float32(0.5)
        _store_system(out, _U(5) * u, r2, r3, r4, r5, r6, flow[_U(2) * u],
                      flow[_U(2) * u + _U(1)], columns[u] * top * bottom)


@numba.njit(error_model="numpy")
def _bilinear(work, a00, a01, a10, a11, plane, u):
    """a00·v0 + a01·v1 + a10·v2 + a11·v3 (in that order), v the four corner planes from
    ``plane`` at pixel u."""
    at = _U(plane * PITCH) + u
    return (a00 * work[at] + a01 * work[at + _U(PITCH)] + a10 * work[at + _U(2 * PITCH)]
            + a11 * work[at + _U(3 * PITCH)])


@numba.njit(cache=True, nogil=True, error_model="numpy")
def farneback_solve(blurred, flow):
    """d = G⁻¹h at every pixel from the blurred system (into ``flow``; unsigned indices and
    numpy's error model, no ZeroDivisionError check, so that LLVM vectorises the loop; the
    determinant + 10⁻³ is not zero on any real system)."""
    system = blurred.reshape(-1)
    flat = flow.reshape(-1)
    for i in range(flow.shape[0] * flow.shape[1]):
        p = _U(i)
        g11 = np.float64(system[_U(5) * p])
        g12 = np.float64(system[_U(5) * p + _U(1)])
        g22 = np.float64(system[_U(5) * p + _U(2)])
        h1 = np.float64(system[_U(5) * p + _U(3)])
        h2 = np.float64(system[_U(5) * p + _U(4)])
        idet = 1.0 / (g11 * g22 - g12 * g12 + 1e-3)
        flat[_U(2) * p] = (g11 * h2 - g12 * h1) * idet
        flat[_U(2) * p + _U(1)] = (g22 * h1 - g12 * h2) * idet


#: channels of each group in the integral histograms: 8 orientations and HOF's zero bin (HOG
#: and MBH leave it 0); the groups HOG, HOF, MBHx, MBHy follow each other (36 channels), so
#: that a pixel's histograms are contiguous
CHANNELS = 9
GROUPS = 4
GROUP_CHANNELS = GROUPS * CHANNELS
ORIENTATIONS = 8


#: OpenCV's ``fastAtan2`` polynomial (``atan_f32`` in its mathfuncs_core), in degrees
_ATAN_P1 = np.float32(np.float32(0.9997878412794807) * np.float32(180 / math.pi))
_ATAN_P3 = np.float32(np.float32(-0.3258083974640975) * np.float32(180 / math.pi))
_ATAN_P5 = np.float32(np.float32(0.1555786518463281) * np.float32(180 / math.pi))
_ATAN_P7 = np.float32(np.float32(-0.04432655554792128) * np.float32(180 / math.pi))
_ATAN_EPS = np.float32(np.finfo(np.float64).eps)


@intrinsic
def _fma(typingctx, a, b, c):
    """a·b + c rounded once (LLVM's ``llvm.fma.f32``: the FMA instruction, or libm's fmaf)."""
    signature = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, sig, args):
        f32 = ir.FloatType()
        function = builder.module.declare_intrinsic("llvm.fma", [f32],
                                                    ir.FunctionType(f32, [f32, f32, f32]))
        return builder.call(function, args)

    return signature, codegen


@intrinsic
def _sqrt(typingctx, a):
    """√a of a float32, correctly rounded (LLVM's ``llvm.sqrt.f32``: the instruction, which
    numba's ``np.sqrt`` leaves as a call to libm's sqrtf in some loops)."""
    signature = types.float32(types.float32)

    def codegen(context, builder, sig, args):
        f32 = ir.FloatType()
        function = builder.module.declare_intrinsic("llvm.sqrt", [f32],
                                                    ir.FunctionType(f32, [f32]))
        return builder.call(function, args)

    return signature, codegen


@numba.njit(cache=True, nogil=True, inline="always")
def _polar(x, y):
    """(magnitude, angle in degrees [0, 360]) of the float32 vector (x, y) as OpenCV's
    ``cartToPolar`` computes them with its vector instructions: √fma(x, x, y·y), and
    ``fastAtan2``: c = min(|x|, |y|) / (max(|x|, |y|) + DBL_EPSILON), a = c·(p1 + c²(p3 +
    c²(p5 + c²p7))) by FMAs, then 90 − a where |y| > |x|, 180 − a where x < 0, 360 − a where
    y < 0 (bit-equal to ``cv2.cartToPolar`` where OpenCV runs its FMA code, AVX2 CPUs:
    tests/unit/test_trajectory_kernels.py)."""
    magnitude = _sqrt(_fma(x, x, y * y))
    ax = abs(x)
    ay = abs(y)
    c = min(ax, ay) / (max(ax, ay) + _ATAN_EPS)
    cc = c * c
    a = _fma(_fma(_fma(cc, _ATAN_P7, _ATAN_P5), cc, _ATAN_P3), cc, _ATAN_P1) * c
    a = a if ax >= ay else np.float32(90.0) - a
    a = np.float32(180.0) - a if x < 0 else a
    a = np.float32(360.0) - a if y < 0 else a
    return magnitude, a


@numba.njit(cache=True, nogil=True, inline="always")
def _gradient_row(grey, flow, y, x_parts, y_parts):
    """Row y of the four vector fields into ``x_parts`` and ``y_parts`` ((4, W)): the grey
    image's gradient (HOG), the flow (HOF), the gradients of its x and y components (MBHx,
    MBHy).  Gradients are central differences, edges reflected (OpenCV's ``Sobel`` of size
    1, BORDER_REFLECT_101): I(x + 1) − I(x − 1) along x, likewise along y."""
    height, width = grey.shape
    up = y - 1 if y > 0 else 1
    down = y + 1 if y < height - 1 else height - 2
    for x in range(width):
        x_parts[1, x] = flow[y, x, 0]
        y_parts[1, x] = flow[y, x, 1]
        y_parts[0, x] = np.float32(grey[down, x]) - np.float32(grey[up, x])
        y_parts[2, x] = flow[down, x, 0] - flow[up, x, 0]
        y_parts[3, x] = flow[down, x, 1] - flow[up, x, 1]
    for x in range(1, width - 1):
        x_parts[0, x] = np.float32(grey[y, x + 1]) - np.float32(grey[y, x - 1])
        x_parts[2, x] = flow[y, x + 1, 0] - flow[y, x - 1, 0]
        x_parts[3, x] = flow[y, x + 1, 1] - flow[y, x - 1, 1]
    for x, left, right in ((0, 1, 1), (width - 1, width - 2, width - 2)):
        x_parts[0, x] = np.float32(grey[y, right]) - np.float32(grey[y, left])
        x_parts[2, x] = flow[y, right, 0] - flow[y, left, 0]
        x_parts[3, x] = flow[y, right, 1] - flow[y, left, 1]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _integral_row(grey, flow, y, zero_threshold, work, previous, current):
    """Integral row y + 1 of the orientation histograms of (``grey``, ``flow``): ``current``
    ((W + 1, 36)) = ``previous`` (row y) + the running sum along x of row y's pixel
    histograms (Viola & Jones's integral image; the release's ``BuildDescMat``).

    Each pixel's vector (magnitude m, angle θ: :func:`_polar`) of group g (HOG, HOF, MBHx,
    MBHy: :func:`_gradient_row`) goes to channels 9g .. 9g + 7: position θ·8/360 split
    between the two nearest bins, linearly, weighted by m; HOF's vectors with m <=
    ``zero_threshold`` add 1 to channel 17 (its zero bin) instead.  ``work`` holds four
    float32 rows (4W), the lower bins (4W, int32) and the pixel histograms ((W, 36))."""
    parts, lows, histograms = work
    width = grey.shape[1]
    _gradient_row(grey, flow, y, parts[0].reshape(GROUPS, width),
                  parts[1].reshape(GROUPS, width))
    # one vectorised loop after another, then the scatter into the pixel histograms
    x_parts, y_parts, lower, upper = parts[0], parts[1], parts[2], parts[3]
    base = np.float32(ORIENTATIONS / 360.0)
    for i in range(x_parts.shape[0]):
        m, angle = _polar(x_parts[i], y_parts[i])
        position = angle * base
        low = np.int32(position)
        upper[i] = (position - np.float32(low)) * m
        lower[i] = m - upper[i]
        lows[i] = low - ORIENTATIONS if low >= ORIENTATIONS else low
        x_parts[i] = m
    for i in range(width, 2 * width):                 # HOF's slow vectors: the zero bin
        slow = x_parts[i] <= zero_threshold
        x_parts[i] = np.float32(1.0) if slow else np.float32(0.0)
        lower[i] = np.float32(0.0) if slow else lower[i]
        upper[i] = np.float32(0.0) if slow else upper[i]
    histograms[:, :] = 0
    for g in range(GROUPS):
        offset = CHANNELS * g
        for x in range(width):
            i = g * width + x
            low = lows[i]
            histograms[x, offset + low] = lower[i]
            histograms[x, offset + (0 if low == ORIENTATIONS - 1 else low + 1)] = upper[i]
    for x in range(width):
        histograms[x, CHANNELS + ORIENTATIONS] = x_parts[width + x]
    # the channel loops run to a bound numba cannot see, so that LLVM vectorises them
    channels = histograms.shape[1]
    for b in range(channels):
        current[0, b] = 0
        current[1, b] = previous[1, b] + histograms[0, b]
    for x in range(1, width):
        for b in range(channels):
            histograms[x, b] = histograms[x - 1, b] + histograms[x, b]
            current[x + 1, b] = previous[x + 1, b] + histograms[x, b]


@numba.njit(cache=True, nogil=True, inline="always")
def _add_blocks(rows, channels, bins, columns, left, top, cell, n_cells, epsilon, out, cells,
                scales):
    """One point's normalised blocks (corner (left, top)) into ``out``;
    integral row r is ``rows[r % len(rows)]``; ``cells`` ((n_cells², 36)) and ``scales``
    (36) are work space.  The loops over the channels run to ``rows.shape[2]``, a bound
    LLVM cannot see, so that it vectorises them instead of unrolling them."""
    n_rows, n_channels = rows.shape[0], rows.shape[2]
    for cx in range(n_cells):
        x0 = left + cx * cell
        x1 = x0 + cell
        for cy in range(n_cells):
            upper = rows[(top + cy * cell) % n_rows]
            lower = rows[(top + (cy + 1) * cell) % n_rows]
            sums = cells[cx * n_cells + cy]
            for b in range(n_channels):
                value = lower[x1, b] + upper[x0, b] - lower[x0, b] - upper[x1, b]
                sums[b] = max(value, np.float32(0.0)) + epsilon
    for g in range(channels.shape[0]):
        first = channels[g]
        total = np.float32(0.0)
        for k in range(n_cells * n_cells):
            for b in range(first, first + bins[g]):
                total += cells[k, b]
        scale = np.float32(1.0) / total
        for b in range(first, first + bins[g]):
            scales[b] = scale
    for k in range(n_cells * n_cells):
        for b in range(n_channels):
            cells[k, b] = _sqrt(cells[k, b] * scales[b])
    for g in range(channels.shape[0]):
        first = channels[g]
        for k in range(n_cells * n_cells):
            start = columns[g] + k * bins[g] - first
            for b in range(first, first + bins[g]):
                out[start + b] = cells[k, b]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def advance_tracks(points, steps, flow, grey, descriptor_flow, displacements, channels, bins,
                   columns, patch, n_cells, t_stride, n_t_cells, epsilon, zero_threshold,
                   sums, alive, rows):
    """One frame of every live track of a scale (``alive``): the point p = ``points[i,
    steps[i]]`` moves to p + flow(round(p)) (rounded half to even and clamped to the frame,
    as ``cvRound``); a track whose new point is not strictly inside the frame is no longer
    ``alive``.  The others record ``descriptor_flow`` at round(p) in ``displacements`` (when
    it has rows), append the new point, count the step, and add their blocks at p to their
    time cell of ``sums``: for each group g, the first ``bins[g]`` channels from
    ``channels[g]`` of the integral histograms of (``grey``, ``descriptor_flow``) go to
    ``sums[i, time cell, columns[g]: columns[g] + n_cells² · bins[g]]``.

    The block's corner is round(p) − patch/2 clamped into the frame; cell (cx, cy) covers
    cell × cell pixels (cell = patch / n_cells) from there; entries run over cx, then cy,
    then the bins (the release's order); each bin max(sum, 0) + ε, L1-normalised over the
    block and square-rooted.  The integral histograms are made row by row into ``rows``
    (a ring of at least patch + 1 rows of (W + 1, 36)) and each track is added as soon as
    the last row of its block is made, the tracks taken in the order of their block's top
    row: no whole (H + 1, W + 1, 36) integral is stored.  Returns how many tracks reached
    their last point (L + 1 of ``points``' L + 1) with this step."""
    height, width = flow.shape[0], flow.shape[1]
    half = patch // 2
    cell = patch // n_cells
    n = steps.shape[0]
    describe = np.empty(n, np.intp)
    lefts = np.empty(n, np.intp)
    tops = np.empty(n, np.intp)
    time_cells = np.empty(n, np.intp)
    starts = np.zeros(height + 2, np.intp)
    count = 0
    done = 0
    for i in range(n):
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
            describe[count] = i
            lefts[i] = min(max(xi - half, 0), width - patch)
            tops[i] = min(max(yi - half, 0), height - patch)
            time_cells[i] = s // t_stride
            starts[tops[i] + 1] += 1
            count += 1
        if displacements.shape[0] > 0:
            displacements[i, s, 0] = descriptor_flow[yi, xi, 0]
            displacements[i, s, 1] = descriptor_flow[yi, xi, 1]
        points[i, s + 1, 0] = mx
        points[i, s + 1, 1] = my
        steps[i] = s + 1
        done += s + 2 == points.shape[1]
    if count == 0:
        return done
    # counting sort of the described tracks by their block's top row
    for top in range(height + 1):
        starts[top + 1] += starts[top]
    order = np.empty(count, np.intp)
    filled = starts.copy()
    last = 0
    for j in range(count):
        i = describe[j]
        order[filled[tops[i]]] = i
        filled[tops[i]] += 1
        last = max(last, tops[i])
    n_rows = rows.shape[0]
    work = (np.empty((4, GROUPS * width), np.float32), np.empty(GROUPS * width, np.int32),
            np.empty((width, GROUP_CHANNELS), np.float32))
    cells = np.empty((n_cells * n_cells, GROUP_CHANNELS), np.float32)
    blocks = np.empty((count, sums.shape[2]), np.float32)
    scales = np.zeros(GROUP_CHANNELS, np.float32)
    rows[0, :, :] = 0
    for y in range(last + patch):
        _integral_row(grey, descriptor_flow, y, zero_threshold, work, rows[y % n_rows],
                      rows[(y + 1) % n_rows])
        top = y + 1 - patch
        if top >= 0:
            for j in range(starts[top], starts[top + 1]):
                _add_blocks(rows, channels, bins, columns, lefts[order[j]], top, cell,
                            n_cells, epsilon, blocks[j], cells, scales)
    # added to the tracks' sums in slot order (a stream through memory, not a scatter)
    rank = np.empty(n, np.intp)
    for j in range(count):
        rank[order[j]] = j
    for j in range(count):
        i = describe[j]
        cell_sums = sums[i, time_cells[i]]
        block = blocks[rank[i]]
        for b in range(block.shape[0]):
            cell_sums[b] += block[b]
    return done


@numba.njit(cache=True, nogil=True)
def grid_points(eig, quality, step, points, steps, alive, out):
    """The grid points (x, y) = (j·step + ⌊step/2⌋, i·step + ⌊step/2⌋), row-major, whose
    ``eig`` exceeds ``quality`` × its maximum (compared in float64) and whose cell of step ×
    step pixels holds no live track's last point ⌊``points[i, steps[i]]``⌋, into ``out``;
    returns how many."""
    rows, cols = eig.shape[0] // step, eig.shape[1] // step
    threshold = np.float64(eig.max()) * quality
    occupied = np.zeros((rows, cols), np.bool_)
    for i in range(alive.shape[0]):
        if alive[i]:
            cx = math.floor(points[i, steps[i], 0])
            cy = math.floor(points[i, steps[i], 1])
            if 0 <= cx < cols * step and 0 <= cy < rows * step:
                occupied[cy // step, cx // step] = True
    offset = step // 2
    count = 0
    for i in range(rows):
        y = i * step + offset
        for j in range(cols):
            x = j * step + offset
            if not occupied[i, j] and np.float64(eig[y, x]) > threshold:
                out[count, 0] = x
                out[count, 1] = y
                count += 1
    return count


@numba.njit(cache=True, nogil=True)
def start_tracks(new, points, steps, sums, displacements, alive):
    """Start a track at each of ``new`` (M, 2) in the lowest free slots (not ``alive``):
    first point, no steps, zero sums and (when it has rows) displacements; False, and
    nothing changed, when fewer than M slots are free."""
    free = 0
    for i in range(alive.shape[0]):
        free += not alive[i]
    if free < new.shape[0]:
        return False
    j = 0
    for i in range(alive.shape[0]):
        if j == new.shape[0]:
            break
        if alive[i]:
            continue
        points[i, 0, 0] = new[j, 0]
        points[i, 0, 1] = new[j, 1]
        steps[i] = 0
        sums[i] = 0
        if displacements.shape[0] > 0:
            displacements[i] = 0
        alive[i] = True
        j += 1
    return True


@numba.njit(cache=True, nogil=True)
def match_window(xy, prev_xy, radius, out):
    """``out[i, j]`` = 1 where current keypoint i and previous keypoint j ((N, 2), (M, 2)
    float32) are less than ``radius`` apart along x and along y, else 0."""
    for i in range(xy.shape[0]):
        for j in range(prev_xy.shape[0]):
            out[i, j] = (abs(xy[i, 0] - prev_xy[j, 0]) < radius
                         and abs(xy[i, 1] - prev_xy[j, 1]) < radius)


@numba.njit(cache=True, nogil=True)
def homography_maps(h, margin, map_x, map_y, inside):
    """Where each pixel (x, y) of the previous frame lands in the current one, H·(x, y, 1)
    divided by its third coordinate w (0 where w = 0), in float64 then float32 (``map_x``,
    ``map_y``), and whether it lands more than ``margin`` px inside the frame (``inside``)."""
    height, width = map_x.shape
    for y in range(height):
        fy = np.float64(y)
        for x in range(width):
            fx = np.float64(x)
            w = h[2, 0] * fx + h[2, 1] * fy + h[2, 2]
            w = 1 / w if w != 0 else 0.0
            mx = np.float32((h[0, 0] * fx + h[0, 1] * fy + h[0, 2]) * w)
            my = np.float32((h[1, 0] * fx + h[1, 1] * fy + h[1, 2]) * w)
            map_x[y, x] = mx
            map_y[y, x] = my
            inside[y, x] = (mx > margin and mx < width - 1 - margin and my > margin
                            and my < height - 1 - margin)
