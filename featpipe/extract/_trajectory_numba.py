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

from featpipe.extract.farneback_filters import (
    FUSED_MAX_WIDTH,
    expansion_filters,
    system_window,
)
from featpipe.numba_cache import load_blas_alone

load_blas_alone()

#: weights of the five outermost rows/columns in the Farnebäck system (OpenCV's values)
_BORDER = np.array([0.14, 0.14, 0.4472, 0.4472, 0.4472], dtype=np.float32)
#: pixels the general pass of the Farnebäck system takes at a time, through planes of PITCH
#: float32 values (a PITCH that is not a multiple of 512 bytes' worth of values keeps the
#: planes in different cache sets: at 256 float64 values, 2 KB apart, they evicted each other)
STRIP = 256
PITCH = 264
#: the planes: the bilinear weights along x and y, whether x + d falls inside (1.0 or 0.0),
#: then R1's five coefficients at the four corners, coefficient c at corner k (top left, top
#: right, bottom left, bottom right) in plane CORNERS + 4c + k
WEIGHT_X, WEIGHT_Y, INSIDE, CORNERS = 0, 1, 2, 3
PLANES = CORNERS + 20
_U = np.uint64


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
    weighted by ``_BORDER``; in float32, each operation rounded once: the release's own
    arithmetic (``float`` throughout, built ``-O3`` for x86-64, so without FMA contraction).

    Two passes per row (:func:`_system_row`), both vectorised by LLVM (every index unsigned
    and affine in the pixel; numba's wrap-around of negative indices would hide that, and the
    loops stay scalar): :func:`_system_near` takes the inner pixels of a row whose x + d lies
    in their 3 × 3 neighbourhood's upper-left 2 × 2 cells (-1 <= d < 1 along x and y: most
    pixels), R1's corners selected from the nine values; the others, the first and last rows
    and columns, go to :func:`_system_anywhere` in runs (R1's corners gathered into planes,
    then the same arithmetic).  Equal to the bit to the per-pixel formula (tests/unit/
    test_trajectory_kernels.py)."""
    height, width = flow.shape[0], flow.shape[1]
    columns, elsewhere, work = _system_work(width)
    r0f, r1f, flat_flow, flat_out = r0.reshape(-1), r1.reshape(-1), flow.reshape(-1), \
        out.reshape(-1)
    for y in range(height):
        _system_row(r0f, r1f, flat_flow, flat_out[_U(5 * y * width):], columns, elsewhere,
                    work, y, height, width)


@numba.njit(nogil=True)
def _system_work(width):
    """The work of :func:`_system_row` for rows of ``width`` pixels: each column's border
    weight (the product of ``_BORDER`` at both ends, float32), the marks of the pixels left to
    :func:`_system_anywhere`, and its planes."""
    border = _BORDER
    columns = np.empty(width, np.float32)
    for x in range(width):
        scale = np.float32(1.0)
        if x < 5:
            scale *= border[x]
        if x >= width - 5:
            scale *= border[width - x - 1]
        columns[x] = scale
    return columns, np.zeros(width, np.uint8), np.zeros(PLANES * PITCH, np.float32)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _system_row(r0f, r1f, flat_flow, out, columns, elsewhere, work, y, height, width):
    """Row y of the system (:func:`farneback_matrices`) into ``out`` (5 values per pixel from
    its start), from the flattened coefficients and flow."""
    border = _BORDER
    plane, stride = _U(height * width), _U(width)
    top = border[y] if y < 5 else np.float32(1.0)
    bottom = border[height - y - 1] if y >= height - 5 else np.float32(1.0)
    if y == 0 or y == height - 1 or width < 3:
        _system_anywhere(r0f, r1f, flat_flow, out, work, columns, top, bottom, plane, y, width,
                         height, 0, width)
        return
    start = _U(y * width + 1)
    _system_near(r1f, start - stride - _U(1), r0f, start, flat_flow, out, columns, elsewhere,
                 top, bottom, plane, stride, y, width - 2)
    elsewhere[0] = elsewhere[width - 1] = 1
    x = 0
    while x < width:
        if elsewhere[x]:
            first = x
            while x < width and elsewhere[x]:
                x += 1
            _system_anywhere(r0f, r1f, flat_flow, out, work, columns, top, bottom, plane, y,
                             width, height, first, x)
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
def _system_near(r1, corner, r0, start, flow, out, columns, elsewhere, top, bottom, plane,
                 stride, y, count):
    """The system of ``count`` inner pixels of row y from column 1 (pixel ``start`` of the
    frame; ``corner``: its upper-left neighbour) into the row's ``out``, computed as if x + d
    fell in the pixel's 3 × 3 neighbourhood (:func:`_pick_bilinear`); ``elsewhere`` marks
    those where it does not (their values here are not the system: :func:`_system_row`
    recomputes them).  Offsets, not views (a view costs two reference counts).  The floors
    and their comparisons stay in float32 (the release's cvFloor of a float, compared as
    floats): integers would cost conversions between int64 and floats that CPUs without
    AVX-512 make one lane at a time."""
    one = np.float32(1.0)
    row = np.float32(y)
    for i in range(count):
        u = _U(i)
        p = start + u
        x = _U(1) + u
        column = np.float32(x)
        dx = flow[_U(2) * p]
        dy = flow[_U(2) * p + _U(1)]
        fx = column + dx
        fy = row + dy
        x1 = np.floor(fx)
        y1 = np.floor(fy)
        ax = fx - x1
        ay = fy - y1
        left = x1 == column - one
        up = y1 == row - one
        elsewhere[x] = not ((left or x1 == column) and (up or y1 == row))
        a00 = (one - ax) * (one - ay)
        a01 = ax * (one - ay)
        a10 = (one - ax) * ay
        a11 = ax * ay
        c = corner + u
        s2 = _pick_bilinear(r1, c, stride, left, up, a00, a01, a10, a11)
        s3 = _pick_bilinear(r1, plane + c, stride, left, up, a00, a01, a10, a11)
        s4 = _pick_bilinear(r1, _U(2) * plane + c, stride, left, up, a00, a01, a10, a11)
        s5 = _pick_bilinear(r1, _U(3) * plane + c, stride, left, up, a00, a01, a10, a11)
        s6 = _pick_bilinear(r1, _U(4) * plane + c, stride, left, up, a00, a01, a10, a11)
        r2 = (r0[p] - s2) * np.float32(0.5)
        r3 = (r0[plane + p] - s3) * np.float32(0.5)
        r4 = (r0[_U(2) * plane + p] + s4) * np.float32(0.5)
        r5 = (r0[_U(3) * plane + p] + s5) * np.float32(0.5)
        r6 = (r0[_U(4) * plane + p] + s6) * np.float32(0.25)
        _store_system(out, _U(5) * x, r2, r3, r4, r5, r6, dx, dy, columns[x] * top * bottom)


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
    """The system of pixels ``first`` .. ``stop`` - 1 of row y (into ``out``, the row's),
    wherever x + d falls: up to STRIP at a time, :func:`_gather_corners` then
    :func:`_strip_system`."""
    while first < stop:
        count = min(STRIP, stop - first)
        start = _U(y * width + first)
        _gather_corners(r1f, flow, work, plane, start, first, y, width, height, count)
        _strip_system(work, r0f, start, flow, out, _U(first), columns, top, bottom, plane,
                      count)
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
        fx = np.float32(first + i) + flow[_U(2) * p]
        fy = np.float32(y) + flow[_U(2) * p + _U(1)]
        x1 = np.floor(fx)
        y1 = np.floor(fy)
        work[_U(WEIGHT_X * PITCH) + u] = fx - x1
        work[_U(WEIGHT_Y * PITCH) + u] = fy - y1
        if 0 <= x1 < width - 1 and 0 <= y1 < height - 1:  # as floats: NaN is outside
            work[_U(INSIDE * PITCH) + u] = 1.0
            corner = _U(int(y1) * width + int(x1))
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
def _strip_system(work, r0, start, flow, out, first, columns, top, bottom, plane, count):
    """The system of ``count`` pixels from column ``first`` (pixel ``start`` of the frame)
    from :func:`_gather_corners`' planes, R0, the flow and the border weights (``columns`` per
    pixel, ``top`` and ``bottom`` for the row: their float32 product), into the row's
    ``out``."""
    one = np.float32(1.0)
    for i in range(count):
        u = _U(i)
        p = start + u
        x = first + u
        ax = work[_U(WEIGHT_X * PITCH) + u]
        ay = work[_U(WEIGHT_Y * PITCH) + u]
        inside = work[_U(INSIDE * PITCH) + u] != 0.0
        a00 = (one - ax) * (one - ay)
        a01 = ax * (one - ay)
        a10 = (one - ax) * ay
        a11 = ax * ay
        s2 = _bilinear(work, a00, a01, a10, a11, CORNERS, u)
        s3 = _bilinear(work, a00, a01, a10, a11, CORNERS + 4, u)
        s4 = _bilinear(work, a00, a01, a10, a11, CORNERS + 8, u)
        s5 = _bilinear(work, a00, a01, a10, a11, CORNERS + 12, u)
        s6 = _bilinear(work, a00, a01, a10, a11, CORNERS + 16, u)
        q0 = r0[p]
        q1 = r0[plane + p]
        q2 = r0[_U(2) * plane + p]
        q3 = r0[_U(3) * plane + p]
        q4 = r0[_U(4) * plane + p]
        # every value computed, those outside the frame then left out (a select, not a
        # branch: the loop stays vectorised)
        r4 = (q2 + s4) * np.float32(0.5) if inside else q2
        r5 = (q3 + s5) * np.float32(0.5) if inside else q3
        r6 = (q4 + s6) * np.float32(0.25) if inside else q4 * np.float32(0.5)
        r2 = (q0 - (s2 if inside else np.float32(0.0))) * np.float32(0.5)
        r3 = (q1 - (s3 if inside else np.float32(0.0))) * np.float32(0.5)
        _store_system(out, _U(5) * x, r2, r3, r4, r5, r6, flow[_U(2) * p],
                      flow[_U(2) * p + _U(1)], columns[x] * top * bottom)


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
    _solve_row(blurred.reshape(-1), flow.reshape(-1), 0, flow.shape[0] * flow.shape[1])


# --------------------------------------------------------------------- fused Farnebäck passes
#
# OpenCV's ``sepFilter2D`` on float32 (``RowFilter`` with ``RowVec_32f``, ``SymmColumnFilter``
# with ``SymmColumnVec_32f``: filter.simd.hpp, its AVX2 build) filters a row's values (all its
# channels, interleaved) along x, then combines the filtered rows of the window along y, edges
# replicated.  Per value: along x, s = 0 then s = fma(v_k, tap_k, s) over the taps in order
# (8 values at a time); the values its vector loop leaves (fewer than 8) go to scalar loops,
# 4 at a time with the same FMAs from the first product, then one at a time with products and
# sums rounded apart but for the taps after the last whole four (which the compiler fused).
# Along y (symmetric taps): s = fma(c, tap_0, 0) then s = fma(up_k + down_k, tap_k, s), or
# for antisymmetric taps s = 0 then s = fma(down_k - up_k, tap_k, s); the scalar leftovers
# round products and sums apart.  The fused kernels below do the same operations in the same
# order (equal to the bit: tests/unit/test_trajectory_kernels.py), on the release's filters
# as constants, so that LLVM vectorises the loops (taps as array arguments are loads it
# cannot hoist, and the loops stay scalar).

#: the default filters (numba takes global arrays as constants)
(_G, _XG, _XXG), (_IG11, _IG03, _IG33, _IG55) = expansion_filters()
_WINDOW = system_window()
#: the values of a row that OpenCV's vector loops take at a time
_LANES = 8
#: a ring row: room for FUSED_MAX_WIDTH values of a plane (five interleaved channels for the
#: system), and 16 more, so that rows 8 KB apart do not fall in the same cache sets
_PLANE = FUSED_MAX_WIDTH + 16
_SYSTEM_ROW = 5 * FUSED_MAX_WIDTH + 16


@numba.njit(nogil=True)
def _row_tail(ext, taps, cn, first, count, out, at, twin):
    """OpenCV's row filter at values ``first`` .. ``count`` - 1 of a row, those its vector
    loop leaves (scalar loops: see above), from ``ext`` (the row with its edges replicated,
    ``cn`` values a pixel) into ``out`` from ``at`` and from ``at`` + ``twin``."""
    n_taps = taps.shape[0]
    fours = first + (count - first) // 4 * 4
    fused_from = 1 + (n_taps - 1) // 4 * 4
    for i in range(first, count):
        s = taps[0] * ext[i]
        for k in range(1, n_taps):
            v = ext[i + k * cn]
            if i < fours or k >= fused_from:
                s = _fma(taps[k], v, s)
            else:
                s = s + taps[k] * v
        out[at + i] = s
        out[at + twin + i] = s


@numba.njit(nogil=True, error_model="numpy")
def _copy(dst, to, src, source, count):
    """``count`` values of ``src`` from ``source`` to ``dst`` from ``to`` (offsets, not
    views: a view costs two reference counts)."""
    for i in range(count):
        dst[to + _U(i)] = src[source + _U(i)]


@numba.njit(nogil=True, error_model="numpy")
def _expansion_row(ext, ring, at, twin, vector):
    """The row filters g, t·g, t²·g of a row (``ext``: its pixels with 7 replicated each side)
    at its first ``vector`` values, into the ring's three planes from ``at`` and from its twin
    ``at`` + ``twin`` (two stores: a second pass copying them cost more)."""
    zero = np.float32(0.0)
    for i in range(vector):
        u = _U(i)
        sg = zero
        sxg = zero
        sxxg = zero
        for k in range(_G.shape[0]):
            v = ext[u + _U(k)]
            sg = _fma(v, _G[k], sg)
            sxg = _fma(v, _XG[k], sxg)
            sxxg = _fma(v, _XXG[k], sxxg)
        ring[at + u] = sg
        ring[at + _U(_PLANE) + u] = sxg
        ring[at + _U(2 * _PLANE) + u] = sxxg
        ring[at + twin + u] = sg
        ring[at + twin + _U(_PLANE) + u] = sxg
        ring[at + twin + _U(2 * _PLANE) + u] = sxxg


@numba.njit(nogil=True, error_model="numpy")
def _expansion_column(ring, at, scratch, vector):
    """The six correlations of an output row at its first ``vector`` values (the column
    filters over the 15 consecutive ring rows from ``at``: g on the g-filtered rows, t·g and
    t²·g on them, g on the t·g- and t²·g-filtered rows, t·g on the t·g-filtered rows),
    combined into the five coefficients (:func:`polynomial_coefficients`), into the five
    planes of ``scratch``."""
    zero = np.float32(0.0)
    half = _G.shape[0] // 2
    row = _U(3 * _PLANE)
    centre = at + _U(half) * row
    for i in range(vector):
        u = _U(i)
        cg = ring[centre + u]
        cxg = ring[centre + _U(_PLANE) + u]
        cxxg = ring[centre + _U(2 * _PLANE) + u]
        b1 = _fma(cg, _G[half], zero)
        byy = _fma(cg, _XXG[half], zero)
        bx = _fma(cxg, _G[half], zero)
        bxx = _fma(cxxg, _G[half], zero)
        by = zero
        bxy = zero
        for k in range(1, half + 1):
            up = at + _U(half - k) * row + u
            down = at + _U(half + k) * row + u
            ug, dg = ring[up], ring[down]
            uxg, dxg = ring[up + _U(_PLANE)], ring[down + _U(_PLANE)]
            sg = dg + ug
            b1 = _fma(sg, _G[half + k], b1)
            byy = _fma(sg, _XXG[half + k], byy)
            by = _fma(dg - ug, _XG[half + k], by)
            bx = _fma(dxg + uxg, _G[half + k], bx)
            bxy = _fma(dxg - uxg, _XG[half + k], bxy)
            bxx = _fma(ring[down + _U(2 * _PLANE)] + ring[up + _U(2 * _PLANE)], _G[half + k],
                       bxx)
        base = b1 * _IG03
        scratch[u] = by * _IG11
        scratch[_U(_PLANE) + u] = bx * _IG11
        scratch[_U(2 * _PLANE) + u] = base + byy * _IG33
        scratch[_U(3 * _PLANE) + u] = base + bxx * _IG33
        scratch[_U(4 * _PLANE) + u] = bxy * _IG55


@numba.njit(nogil=True, error_model="numpy")
def _expansion_column_tail(ring, at, scratch, vector, width):
    """:func:`_expansion_column` at the values ``vector`` .. ``width`` - 1 (OpenCV's scalar
    loops: products and sums rounded apart)."""
    zero = np.float32(0.0)
    half = _G.shape[0] // 2
    row = 3 * _PLANE
    centre = at + half * row
    for i in range(vector, width):
        cg, cxg, cxxg = ring[centre + i], ring[centre + _PLANE + i], ring[centre + 2 * _PLANE + i]
        b1 = _G[half] * cg + zero
        byy = _XXG[half] * cg + zero
        bx = _G[half] * cxg + zero
        bxx = _G[half] * cxxg + zero
        by = zero
        bxy = zero
        for k in range(1, half + 1):
            up = at + (half - k) * row + i
            down = at + (half + k) * row + i
            b1 = b1 + _G[half + k] * (ring[down] + ring[up])
            byy = byy + _XXG[half + k] * (ring[down] + ring[up])
            by = by + _XG[half + k] * (ring[down] - ring[up])
            bx = bx + _G[half + k] * (ring[down + _PLANE] + ring[up + _PLANE])
            bxy = bxy + _XG[half + k] * (ring[down + _PLANE] - ring[up + _PLANE])
            bxx = bxx + _G[half + k] * (ring[down + 2 * _PLANE] + ring[up + 2 * _PLANE])
        base = b1 * _IG03
        scratch[i] = by * _IG11
        scratch[_PLANE + i] = bx * _IG11
        scratch[2 * _PLANE + i] = base + byy * _IG33
        scratch[3 * _PLANE + i] = base + bxx * _IG33
        scratch[4 * _PLANE + i] = bxy * _IG55


@numba.njit(nogil=True, error_model="numpy")
def _copy_row(ring, to, source, slots, row, count, planes, pitch):
    """Ring row ``source`` (``planes`` planes of ``count`` values, ``pitch`` apart) copied to
    row ``to`` and its twin ``to`` + ``slots`` (an edge row replicated)."""
    for p in range(planes):
        at = _U(source * row + p * pitch)
        _copy(ring, _U(to * row + p * pitch), ring, at, count)
        _copy(ring, _U((to + slots) * row + p * pitch), ring, at, count)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def polynomial_expansion(image, out):
    """The five polynomial coefficients of a float32 image (H, W), W <= FUSED_MAX_WIDTH, into
    ``out`` ((5, H, W)): the six correlations of :class:`~featpipe.extract.optical_flow.
    FarnebackPyramid` (OpenCV's ``sepFilter2D`` with g, t·g, t²·g of the release's filters,
    edges replicated) combined as :func:`polynomial_coefficients` does, in one pass, equal to
    the bit.

    The rows stream through a ring of 2 × 15 rows of the three row-filtered planes: virtual
    row v (rows -7..-1 are row 0, rows H..H+6 the last) in slot (v + 7) mod 15 and its twin 15
    slots on, so that the 15 rows of an output row are 15 consecutive slots a fixed distance
    apart and the column loop is vectorised; each output row goes through ``scratch`` (planes
    a fixed distance apart) into ``out``."""
    height, width = image.shape
    taps = _G.shape[0]
    half = taps // 2
    row = 3 * _PLANE
    ring = np.empty(2 * taps * row, np.float32)
    ext = np.empty(width + 2 * half, np.float32)
    scratch = np.empty(5 * _PLANE, np.float32)
    vector = width // _LANES * _LANES
    flat = out.reshape(-1)
    plane = height * width
    for v in range(height + half):
        slot = (v + half) % taps
        if v < height:
            for x in range(half):
                ext[x] = image[v, 0]
                ext[width + half + x] = image[v, width - 1]
            for x in range(width):
                ext[half + x] = image[v, x]
            at = slot * row
            _expansion_row(ext, ring, _U(at), _U(taps * row), vector)
            _row_tail(ext, _G, 1, vector, width, ring, at, taps * row)
            _row_tail(ext, _XG, 1, vector, width, ring, at + _PLANE, taps * row)
            _row_tail(ext, _XXG, 1, vector, width, ring, at + 2 * _PLANE, taps * row)
            if v == 0:
                for edge in range(half):
                    _copy_row(ring, edge, slot, taps, row, width, 3, _PLANE)
        else:
            _copy_row(ring, slot, (height - 1 + half) % taps, taps, row, width, 3, _PLANE)
        y = v - half
        if y >= 0:
            at = (y % taps) * row
            _expansion_column(ring, _U(at), scratch, vector)
            _expansion_column_tail(ring, at, scratch, vector, width)
            for c in range(5):
                _copy(flat, _U(c * plane + y * width), scratch, _U(c * _PLANE), width)


@numba.njit(nogil=True, error_model="numpy")
def _solve_row(system, flow, at, count):
    """d = G⁻¹h of ``count`` pixels from their blurred systems (5 values each) into ``flow``
    (2 each, from ``at``): :func:`farneback_solve`."""
    flow_at = _U(at)
    for i in range(count):
        p = _U(i)
        g11 = np.float64(system[_U(5) * p])
        g12 = np.float64(system[_U(5) * p + _U(1)])
        g22 = np.float64(system[_U(5) * p + _U(2)])
        h1 = np.float64(system[_U(5) * p + _U(3)])
        h2 = np.float64(system[_U(5) * p + _U(4)])
        idet = 1.0 / (g11 * g22 - g12 * g12 + 1e-3)
        flow[flow_at + _U(2) * p] = (g11 * h2 - g12 * h1) * idet
        flow[flow_at + _U(2) * p + _U(1)] = (g22 * h1 - g12 * h2) * idet


@numba.njit(nogil=True, error_model="numpy")
def _window_row(ext, ring, at, twin, vector):
    """The window's row filter over a system row (``ext``: five values a pixel, 5 pixels
    replicated each side) at its first ``vector`` values, into the ring from ``at`` and from
    its twin ``at`` + ``twin``."""
    zero = np.float32(0.0)
    for i in range(vector):
        u = _U(i)
        s = zero
        for k in range(_WINDOW.shape[0]):
            s = _fma(ext[u + _U(5 * k)], _WINDOW[k], s)
        ring[at + u] = s
        ring[at + twin + u] = s


@numba.njit(nogil=True, error_model="numpy")
def _window_column(ring, at, out, vector):
    """The window's column filter over the 11 consecutive ring rows from ``at``, at the first
    ``vector`` values, into ``out``."""
    half = _WINDOW.shape[0] // 2
    row = _U(_SYSTEM_ROW)
    centre = at + _U(half) * row
    for i in range(vector):
        u = _U(i)
        s = _fma(ring[centre + u], _WINDOW[half], np.float32(0.0))
        for k in range(1, half + 1):
            s = _fma(ring[at + _U(half + k) * row + u] + ring[at + _U(half - k) * row + u],
                     _WINDOW[half + k], s)
        out[u] = s


@numba.njit(nogil=True, error_model="numpy")
def _window_column_tail(ring, at, out, vector, count):
    """:func:`_window_column` at the values ``vector`` .. ``count`` - 1 (products and sums
    rounded apart)."""
    half = _WINDOW.shape[0] // 2
    row = _SYSTEM_ROW
    for i in range(vector, count):
        s = _WINDOW[half] * ring[at + half * row + i] + np.float32(0.0)
        for k in range(1, half + 1):
            s = s + _WINDOW[half + k] * (ring[at + (half + k) * row + i]
                                         + ring[at + (half - k) * row + i])
        out[i] = s


@numba.njit(cache=True, nogil=True, error_model="numpy")
def farneback_update(r0, r1, flow):
    """One Farnebäck iteration on ``flow`` ((H, W, 2), W <= FUSED_MAX_WIDTH), in place: every
    pixel's system from the flow (:func:`farneback_matrices`), averaged by the window (OpenCV's
    ``sepFilter2D`` with the release's window along x and y, edges replicated), solved
    (:func:`farneback_solve`), equal to the bit to those three steps, in one pass over the rows.

    System rows stream through a ring of 2 × 11 row-filtered rows (as in
    :func:`polynomial_expansion`); output row y is solved once the system rows to y + 5 are
    made, and each system row reads only its own row of the flow, so the new flow can
    overwrite the old row by row."""
    height, width = flow.shape[0], flow.shape[1]
    taps = _WINDOW.shape[0]
    half = taps // 2
    values = 5 * width
    ring = np.empty(2 * taps * _SYSTEM_ROW, np.float32)
    ext = np.empty(values + 10 * half, np.float32)
    blurred = np.empty(values, np.float32)
    columns, elsewhere, work = _system_work(width)
    r0f, r1f, flat_flow = r0.reshape(-1), r1.reshape(-1), flow.reshape(-1)
    vector = values // _LANES * _LANES
    for v in range(height + half):
        slot = (v + half) % taps
        if v < height:
            _system_row(r0f, r1f, flat_flow, ext[5 * half:], columns, elsewhere, work, v,
                        height, width)
            for x in range(half):
                for c in range(5):
                    ext[5 * x + c] = ext[5 * half + c]
                    ext[5 * (half + width + x) + c] = ext[5 * (half + width - 1) + c]
            at = slot * _SYSTEM_ROW
            _window_row(ext, ring, _U(at), _U(taps * _SYSTEM_ROW), vector)
            _row_tail(ext, _WINDOW, 5, vector, values, ring, at, taps * _SYSTEM_ROW)
            if v == 0:
                for edge in range(half):
                    _copy_row(ring, edge, slot, taps, _SYSTEM_ROW, values, 1, 0)
        else:
            _copy_row(ring, slot, (height - 1 + half) % taps, taps, _SYSTEM_ROW, values, 1, 0)
        y = v - half
        if y >= 0:
            at = (y % taps) * _SYSTEM_ROW
            _window_column(ring, _U(at), blurred, vector)
            _window_column_tail(ring, at, blurred, vector, values)
            _solve_row(blurred, flat_flow, 2 * y * width, width)


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
    """Row y of the four vector fields into ``x_parts`` and ``y_parts`` (4W: a row a field):
    the grey image's gradient (HOG), the flow (HOF), the gradients of its x and y components
    (MBHx, MBHy).  Gradients are central differences, edges reflected (OpenCV's ``Sobel`` of
    size 1, BORDER_REFLECT_101): I(x + 1) − I(x − 1) along x, likewise along y.  Unsigned
    flat indices (the flow's channels interleaved), so that LLVM vectorises the loops."""
    height, width = grey.shape
    up = y - 1 if y > 0 else 1
    down = y + 1 if y < height - 1 else height - 2
    image, field = grey.reshape(-1), flow.reshape(-1)
    n = _U(width)
    row, above, below = _U(y * width), _U(up * width), _U(down * width)
    two = _U(2)
    for i in range(width):
        u = _U(i)
        x_parts[n + u] = field[two * (row + u)]
        y_parts[n + u] = field[two * (row + u) + _U(1)]
        y_parts[u] = np.float32(image[below + u]) - np.float32(image[above + u])
        y_parts[two * n + u] = field[two * (below + u)] - field[two * (above + u)]
        y_parts[_U(3) * n + u] = (field[two * (below + u) + _U(1)]
                                  - field[two * (above + u) + _U(1)])
    for i in range(width - 2):
        u = _U(i)
        left, right = row + u, row + u + two
        x_parts[u + _U(1)] = np.float32(image[right]) - np.float32(image[left])
        x_parts[two * n + u + _U(1)] = field[two * right] - field[two * left]
        x_parts[_U(3) * n + u + _U(1)] = field[two * right + _U(1)] - field[two * left + _U(1)]
    for x, left, right in ((0, 1, 1), (width - 1, width - 2, width - 2)):
        x_parts[x] = np.float32(grey[y, right]) - np.float32(grey[y, left])
        x_parts[2 * width + x] = flow[y, right, 0] - flow[y, left, 0]
        x_parts[3 * width + x] = flow[y, right, 1] - flow[y, left, 1]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _integral_row(grey, flow, y, zero_threshold, work, previous, current):
    """Integral row y + 1 of the orientation histograms of (``grey``, ``flow``): ``current``
    ((W + 1, 36)) = ``previous`` (row y) + the running sum along x of row y's pixel
    histograms (Viola & Jones's integral image; the release's ``BuildDescMat``).

    Each pixel's vector (magnitude m, angle θ: :func:`_polar`) of group g (HOG, HOF, MBHx,
    MBHy: :func:`_gradient_row`) goes to channels 9g .. 9g + 7: position θ·8/360 split
    between the two nearest bins, linearly, weighted by m; HOF's vectors with m <=
    ``zero_threshold`` add 1 to channel 17 (its zero bin) instead.  The running sum (36
    channels) takes each pixel's few non-zero entries as it passes: the same additions as
    summing whole pixel histograms, whose other entries are +0.  ``work`` holds four float32
    rows (4W), the lower bins (4W, int32) and the running sum (36)."""
    parts, lows, running = work
    width = grey.shape[1]
    _gradient_row(grey, flow, y, parts[0], parts[1])
    # one vectorised loop after another, then the running sum along x
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
    # the channel loops run to a bound numba cannot see, so that LLVM vectorises them
    channels = running.shape[0]
    for b in range(channels):
        running[b] = 0
        current[0, b] = 0
    for x in range(width):
        for g in range(GROUPS):
            i = g * width + x
            low = lows[i]
            offset = CHANNELS * g
            running[offset + low] += lower[i]
            running[offset + (0 if low == ORIENTATIONS - 1 else low + 1)] += upper[i]
        running[CHANNELS + ORIENTATIONS] += x_parts[width + x]
        for b in range(channels):
            current[x + 1, b] = previous[x + 1, b] + running[b]


@numba.njit(cache=True, nogil=True, inline="always")
def _add_blocks(ring, n_rows, pitch, n_channels, channels, bins, columns, left, top, cell,
                n_cells, epsilon, out, at_out, cell_sums, scales):
    """One point's normalised blocks (corner (left, top)) into ``out`` (flat) from
    ``at_out``; integral row r is the ``pitch`` values of ``ring`` (flat) from
    (r mod ``n_rows``) · ``pitch``, ``n_channels`` a pixel; ``cell_sums`` (n_cells² ·
    n_channels) and ``scales`` (n_channels) are work space.  The loops over the channels run
    to ``n_channels``, a bound LLVM cannot see, so that it vectorises them instead of
    unrolling them; every index is unsigned (numba wraps signed ones around, which made LLVM
    gather and scatter), and no array view is made (each costs two reference counts)."""
    width = _U(n_channels)
    for cx in range(n_cells):
        x0 = _U(left + cx * cell) * width
        x1 = x0 + _U(cell) * width
        for cy in range(n_cells):
            upper = _U((top + cy * cell) % n_rows * pitch)
            lower = _U((top + (cy + 1) * cell) % n_rows * pitch)
            at = _U((cx * n_cells + cy) * n_channels)
            for b in range(n_channels):
                u = _U(b)
                value = (ring[lower + x1 + u] + ring[upper + x0 + u] - ring[lower + x0 + u]
                         - ring[upper + x1 + u])
                cell_sums[at + u] = max(value, np.float32(0.0)) + epsilon
    for g in range(channels.shape[0]):
        first = _U(channels[g])
        total = np.float32(0.0)
        for k in range(n_cells * n_cells):
            at = _U(k) * width + first
            for b in range(bins[g]):
                total += cell_sums[at + _U(b)]
        scale = np.float32(1.0) / total
        for b in range(bins[g]):
            scales[first + _U(b)] = scale
    for k in range(n_cells * n_cells):
        at = _U(k) * width
        for b in range(n_channels):
            u = _U(b)
            cell_sums[at + u] = _sqrt(cell_sums[at + u] * scales[u])
    for g in range(channels.shape[0]):
        first = _U(channels[g])
        for k in range(n_cells * n_cells):
            start = at_out + _U(columns[g] + k * bins[g])
            at = _U(k) * width + first
            for b in range(bins[g]):
                out[start + _U(b)] = cell_sums[at + _U(b)]


@numba.njit(cache=True, nogil=True)
def integral_ring(rows, width):
    """Room for ``rows`` rows of integral histograms of frames up to ``width`` pixels wide: the
    ring :func:`advance_tracks` makes them in ((rows, width + 1, GROUP_CHANNELS) float32)."""
    return np.empty((rows, width + 1, GROUP_CHANNELS), np.float32)


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
    n_rows, n_channels = rows.shape[0], rows.shape[2]
    pitch = rows.shape[1] * n_channels
    work = (np.empty((4, GROUPS * width), np.float32), np.empty(GROUPS * width, np.int32),
            np.empty(GROUP_CHANNELS, np.float32))
    cell_sums = np.empty(n_cells * n_cells * n_channels, np.float32)
    block = sums.shape[2]
    blocks = np.empty(count * block, np.float32)
    scales = np.zeros(n_channels, np.float32)
    ring = rows.reshape(-1)
    rows[0, :, :] = 0
    for y in range(last + patch):
        _integral_row(grey, descriptor_flow, y, zero_threshold, work, rows[y % n_rows],
                      rows[(y + 1) % n_rows])
        top = y + 1 - patch
        if top >= 0:
            for j in range(starts[top], starts[top + 1]):
                _add_blocks(ring, n_rows, pitch, n_channels, channels, bins, columns,
                            lefts[order[j]], top, cell, n_cells, epsilon, blocks,
                            _U(j * block), cell_sums, scales)
    # added to the tracks' sums in slot order (a stream through memory, not a scatter)
    rank = np.empty(n, np.intp)
    for j in range(count):
        rank[order[j]] = j
    flat_sums = sums.reshape(-1)
    for j in range(count):
        i = describe[j]
        to = _U((i * sums.shape[1] + time_cells[i]) * block)
        source = _U(rank[i] * block)
        for b in range(block):
            flat_sums[to + _U(b)] += blocks[source + _U(b)]
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
