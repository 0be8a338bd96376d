"""The 5×5 median filter of a 2-channel optical flow, equal to ``cv2.medianBlur(flow, 5)``.

Each output value is rank 12 (0-based) of the 25 values of its channel in the 5×5 window,
rows and columns outside the image replicated (OpenCV's ``BORDER_REPLICATE``).  A median is a
selection: a correct selection network returns the window's 13th smallest value, the one
OpenCV's sorting network returns, so the result is equal to the bit, but for one case: -0.0
and +0.0 are equal values, and where a window's median is a zero and it holds both, the sign
may differ from OpenCV's (``np.array_equal`` holds).

Separable sorting networks (Adams, "Fast median filters using separable sorting networks",
ACM TOG 40(4), SIGGRAPH 2021), per output row, over its 5 source rows (clamped), in strips of
``2 * STRIP`` pixels:

1. each column of 5 values sorted: two output rows share 4 source rows, sorted once
   (:func:`sort4`), each row's fifth value merged in (:func:`insert`): 13 min/max per column
   and row (:func:`sort5`, 18, at the borders);
2. the columns 2s and 2s + 1 (s a pair of pixels; columns padded by 2 replicated ones each
   side) merged into a sorted 10-list (:func:`merge_pair`, 26 min/max per two pixels);
3. the pairs s and s + 1 merged and pruned to ranks 7..12 of their 20 values
   (:func:`middle_ranks`, 36 min/max per two pixels), the only ones that can be the median once
   a fifth column joins; these four (padded) columns 2s..2s + 3 serve two outputs, one with
   column 2s + 4 and one with column 2s - 1;
4. per output, rank 5 of those six and the fifth column (:func:`median_of`, 10 min/max).

13 + 13 + 18 + 10 = 54 min/max per output value.  The data are kept as planes (rank, pixel
parity, channel), so that every loop reads and writes contiguous values and LLVM vectorises
it; the networks are plain numba functions that LLVM inlines into the loops (numba's
``inline="always"`` left the loop functions' own machine code scalar, which is what a process
that compiles them runs).  The networks are derived, pruned and printed by
``benchmarks/gen_flow_median.py`` and checked on every 0-1 input (Knuth's 0-1 principle) by
``tests/unit/test_flow_median.py``.  min and max are ``a if a < b else b``: exact for every
float but NaN (a flow holds none; ±inf is fine).
"""

from __future__ import annotations

import numba
import numpy as np

from featpipe.numba_cache import load_blas_alone

load_blas_alone()

#: output pixel pairs per strip (a 320-pixel row in one; the work planes, 72 rows of PITCH
#: values, take 48 KB)
STRIP = 160
#: a plane's row: a strip's pairs and the 2 padded pairs after them, rounded up
PITCH = STRIP + 8
#: the vector width LLVM gives the loops (8 float32 of AVX2)
LANES = 8
_U = np.uint64
#: one, two, three and four plane rows (unsigned offsets)
_ROW, _ROWS2, _ROWS3, _ROWS4 = _U(PITCH), _U(2 * PITCH), _U(3 * PITCH), _U(4 * PITCH)


def median_blur5(flow: np.ndarray) -> np.ndarray:
    """``cv2.medianBlur(flow, 5)`` of an (H, W, 2) float32 flow, as a new C-contiguous array."""
    return flow_median(np.ascontiguousarray(flow))


@numba.njit(cache=True, nogil=True)
def flow_median(flow):
    """``cv2.medianBlur(flow, 5)`` of a C-contiguous (H, W, 2) flow, as a new array."""
    height, width = flow.shape[0], flow.shape[1]
    out = np.empty_like(flow)
    median5x5(flow.reshape((height, 2 * width)), out.reshape((height, 2 * width)),
              np.empty(72 * PITCH, flow.dtype))
    return out


@numba.njit(cache=True, nogil=True)
def median5x5(src, dst, work):
    """The 5×5 median of ``src`` (height, 2 × width: the channels interleaved) into ``dst``,
    borders replicated, two rows at a time.  ``work``: 72 planes, rows of ``PITCH`` values:
    ``above`` and ``below`` (20 each) the sorted columns of the two rows, rank k, parity p
    (of the padded pixel), channel c at 4k + 2p + c; ``pairs`` (20) a pixel pair's merged
    columns, rank k, channel c at 2k + c; ``middles`` (12) ranks 7..12 of two neighbouring
    pairs, at 2k + c.  The loops take unsigned offsets into these views, made once (a view
    costs two reference counts; the rows' took 38 a row pair), but distinct arrays: stores
    and loads in one array at offsets LLVM cannot compare stay scalar."""
    above, below = work[:20 * PITCH], work[20 * PITCH:40 * PITCH]
    pairs, middles = work[40 * PITCH:60 * PITCH], work[60 * PITCH:72 * PITCH]
    height, width = src.shape[0], src.shape[1] // 2
    out = dst.reshape(-1)
    for y in range(0, height, 2):
        r0, r1, r2 = src[max(y - 2, 0)], src[max(y - 1, 0)], src[y]
        r3, r4, r5 = src[min(y + 1, height - 1)], src[min(y + 2, height - 1)], \
            src[min(y + 3, height - 1)]
        for first in range(0, width, 2 * STRIP):
            count = min(2 * STRIP, width - first)
            half = (count + 1) // 2
            _columns(r0, r1, r2, r3, r4, r5, above, below, first, half + 2)
            for output in range(y, min(y + 2, height)):
                columns = above if output == y else below
                whole, tail, more = _split(half + 2)
                _merges(columns, pairs, _U(0), whole)
                _merges(columns, pairs, _U(tail), more)
                whole, tail, more = _split(half + 1)
                _middles(pairs, middles, _U(0), whole)
                _middles(pairs, middles, _U(tail), more)
                at = _U(output * 2 * width + 2 * first)
                whole, tail, more = _split(count // 2)
                _medians(columns, middles, _U(0), out, at, whole)
                _medians(columns, middles, _U(tail), out, at + _U(4 * tail), more)
                if count % 2:
                    _last_median(columns, middles, out, at, _U(count // 2))


@numba.njit(nogil=True)
def _split(total):
    """A loop of ``total`` as (the iterations in whole vectors of ``LANES``, the start and
    length of one more whole vector that ends the loop, overlapping the one before: its values
    are computed and written twice, where LLVM's remainder would take them one at a time)."""
    if total <= LANES:
        return total, 0, 0
    whole = total - total % LANES
    return whole, total - LANES, LANES if whole < total else 0


@numba.njit(cache=True, nogil=True)
def _columns(r0, r1, r2, r3, r4, r5, above, below, first, total):
    """The sorted columns (rows r0..r4 ``above``, r1..r5 ``below``) of a strip's padded pixel
    pairs 0..total - 1 (pair u holds the pixels first + 2u - 2 and first + 2u - 1, clamped
    to the row)."""
    width = r0.shape[0] // 2
    lo = 1 if first == 0 else 0
    hi = min(total, (width - first) // 2 + 1)
    start = _U(2 * (first + 2 * lo - 2))
    whole, tail, more = _split(hi - lo)
    _inside(r0, r1, r2, r3, r4, r5, start, above, below, _U(lo), whole)
    _inside(r0, r1, r2, r3, r4, r5, start + _U(4 * tail), above, below, _U(lo + tail), more)
    _borders(r0, r1, r2, r3, r4, r5, above, below, first, 0, lo)
    _borders(r0, r1, r2, r3, r4, r5, above, below, first, max(hi, lo), total)


@numba.njit(nogil=True)
def _borders(r0, r1, r2, r3, r4, r5, above, below, first, start, stop):
    """The sorted columns of the padded pairs start..stop - 1, their pixels clamped to the
    row (one call for them all: a call per pair cost as much as the columns inside)."""
    width = r0.shape[0] // 2
    for u in range(start, stop):
        for p in range(2):
            x = min(max(first + 2 * u - 2 + p, 0), width - 1)
            for c in range(2):
                i = 2 * x + c
                at = _U((2 * p + c) * PITCH + u)
                _store5(above, at, _ROWS4, sort5(r0[i], r1[i], r2[i], r3[i], r4[i]))
                _store5(below, at, _ROWS4, sort5(r1[i], r2[i], r3[i], r4[i], r5[i]))


@numba.njit(cache=True, nogil=True)
def _inside(s0, s1, s2, s3, s4, s5, start, above, below, at, total):
    """The sorted columns of ``total`` pixel pairs inside the row (the rows' values from
    ``start``, the pairs from ``at``): rows s1..s4 sorted once, then s0 merged in for the row
    above, s5 for the row below."""
    for v in range(total):
        i = start + _U(4 * v)
        u = at + _U(v)
        _two_columns(s0[i], s1[i], s2[i], s3[i], s4[i], s5[i], above, below, u)
        i += _U(1)
        _two_columns(s0[i], s1[i], s2[i], s3[i], s4[i], s5[i], above, below, _ROW + u)
        i += _U(1)
        _two_columns(s0[i], s1[i], s2[i], s3[i], s4[i], s5[i], above, below, _ROWS2 + u)
        i += _U(1)
        _two_columns(s0[i], s1[i], s2[i], s3[i], s4[i], s5[i], above, below, _ROWS3 + u)


@numba.njit(nogil=True)
def _two_columns(v0, v1, v2, v3, v4, v5, above, below, at):
    """The sorted columns v0..v4 (into ``above``) and v1..v5 (``below``) at ``at``."""
    shared = sort4(v1, v2, v3, v4)
    _store5(above, at, _ROWS4, insert(shared, v0))
    _store5(below, at, _ROWS4, insert(shared, v5))


@numba.njit(cache=True, nogil=True)
def _merges(columns, pairs, at, total):
    """Each padded pixel pair's two sorted columns merged, per channel (pairs from ``at``)."""
    for v in range(total):
        u = at + _U(v)
        _store10(pairs, u, _ROWS2, merge_pair(_load5(columns, u, _ROWS4),
                                              _load5(columns, _ROWS2 + u, _ROWS4)))
        _store10(pairs, _ROW + u, _ROWS2, merge_pair(_load5(columns, _ROW + u, _ROWS4),
                                                     _load5(columns, _ROWS3 + u, _ROWS4)))


@numba.njit(cache=True, nogil=True)
def _middles(pairs, middles, at, total):
    """Ranks 7..12 of the pairs u and u + 1 (four columns), per channel (from ``at``)."""
    for v in range(total):
        u = at + _U(v)
        _store6(middles, u, _ROWS2, middle_ranks(_load10(pairs, u, _ROWS2),
                                                 _load10(pairs, u + _U(1), _ROWS2)))
        _store6(middles, _ROW + u, _ROWS2,
                middle_ranks(_load10(pairs, _ROW + u, _ROWS2),
                             _load10(pairs, _ROW + u + _U(1), _ROWS2)))


@numba.njit(cache=True, nogil=True)
def _medians(columns, middles, at, out, to, total):
    """A strip's outputs (pairs from ``at``; into ``out`` from ``to``): pixel 2u from the
    middle ranks of pair u and the even column of pair u + 2, pixel 2u + 1 from those of pair
    u + 1 and the odd column of pair u."""
    for v in range(total):
        u = at + _U(v)
        o = to + _U(4 * v)
        out[o] = median_of(_load6(middles, u, _ROWS2), _load5(columns, u + _U(2), _ROWS4))
        out[o + _U(1)] = median_of(_load6(middles, _ROW + u, _ROWS2),
                                   _load5(columns, _ROW + u + _U(2), _ROWS4))
        out[o + _U(2)] = median_of(_load6(middles, u + _U(1), _ROWS2),
                                   _load5(columns, _ROWS2 + u, _ROWS4))
        out[o + _U(3)] = median_of(_load6(middles, _ROW + u + _U(1), _ROWS2),
                                   _load5(columns, _ROWS3 + u, _ROWS4))


@numba.njit(nogil=True)
def _last_median(columns, middles, out, to, u):
    """Pixel 2u alone, the last of a strip of an odd width."""
    o = to + _U(4) * u
    out[o] = median_of(_load6(middles, u, _ROWS2), _load5(columns, u + _U(2), _ROWS4))
    out[o + _U(1)] = median_of(_load6(middles, _ROW + u, _ROWS2),
                               _load5(columns, _ROW + u + _U(2), _ROWS4))


@numba.njit(nogil=True)
def _load5(work, at, step):
    return (work[at], work[at + step], work[at + _U(2) * step], work[at + _U(3) * step],
            work[at + _U(4) * step])


@numba.njit(nogil=True)
def _load6(work, at, step):
    return (work[at], work[at + step], work[at + _U(2) * step], work[at + _U(3) * step],
            work[at + _U(4) * step], work[at + _U(5) * step])


@numba.njit(nogil=True)
def _load10(work, at, step):
    return (work[at], work[at + step], work[at + _U(2) * step], work[at + _U(3) * step],
            work[at + _U(4) * step], work[at + _U(5) * step], work[at + _U(6) * step],
            work[at + _U(7) * step], work[at + _U(8) * step], work[at + _U(9) * step])


@numba.njit(nogil=True)
def _store5(work, at, step, values):
    v0, v1, v2, v3, v4 = values
    work[at] = v0
    work[at + step] = v1
    work[at + _U(2) * step] = v2
    work[at + _U(3) * step] = v3
    work[at + _U(4) * step] = v4


@numba.njit(nogil=True)
def _store6(work, at, step, values):
    v0, v1, v2, v3, v4, v5 = values
    work[at] = v0
    work[at + step] = v1
    work[at + _U(2) * step] = v2
    work[at + _U(3) * step] = v3
    work[at + _U(4) * step] = v4
    work[at + _U(5) * step] = v5


@numba.njit(nogil=True)
def _store10(work, at, step, values):
    v0, v1, v2, v3, v4, v5, v6, v7, v8, v9 = values
    work[at] = v0
    work[at + step] = v1
    work[at + _U(2) * step] = v2
    work[at + _U(3) * step] = v3
    work[at + _U(4) * step] = v4
    work[at + _U(5) * step] = v5
    work[at + _U(6) * step] = v6
    work[at + _U(7) * step] = v7
    work[at + _U(8) * step] = v8
    work[at + _U(9) * step] = v9


# The networks below are printed by benchmarks/gen_flow_median.py (do not edit by hand).


@numba.njit(nogil=True)
def sort5(v0, v1, v2, v3, v4):
    """The 5 values sorted (18 min/max)."""
    m0l = v0 if v0 < v1 else v1
    m0h = v1 if v0 < v1 else v0
    m1l = v3 if v3 < v4 else v4
    m1h = v4 if v3 < v4 else v3
    m2l = v2 if v2 < m1h else m1h
    m2h = m1h if v2 < m1h else v2
    m3l = m2l if m2l < m1l else m1l
    m3h = m1l if m2l < m1l else m2l
    m4l = m0l if m0l < m3h else m3h
    m4h = m3h if m0l < m3h else m0l
    m5l = m4l if m4l < m3l else m3l
    m5h = m3l if m4l < m3l else m4l
    m6l = m0h if m0h < m2h else m2h
    m6h = m2h if m0h < m2h else m0h
    m7l = m6l if m6l < m4h else m4h
    m7h = m4h if m6l < m4h else m6l
    m8l = m7l if m7l < m5h else m5h
    m8h = m5h if m7l < m5h else m7l
    return (m5l, m8l, m8h, m7h, m6h)


@numba.njit(nogil=True)
def sort4(v0, v1, v2, v3):
    """The 4 values sorted (10 min/max)."""
    m0l = v0 if v0 < v1 else v1
    m0h = v1 if v0 < v1 else v0
    m1l = v2 if v2 < v3 else v3
    m1h = v3 if v2 < v3 else v2
    m2l = m0l if m0l < m1l else m1l
    m2h = m1l if m0l < m1l else m0l
    m3l = m0h if m0h < m1h else m1h
    m3h = m1h if m0h < m1h else m0h
    m4l = m2h if m2h < m3l else m3l
    m4h = m3l if m2h < m3l else m2h
    return (m2l, m4l, m4h, m3h)


@numba.njit(nogil=True)
def insert(a, x):
    """``x`` merged into the sorted 4-tuple ``a`` (8 min/max)."""
    a0, a1, a2, a3 = a
    m0l = a0 if a0 < x else x
    m0h = x if a0 < x else a0
    m1l = m0h if m0h < a2 else a2
    m1h = a2 if m0h < a2 else m0h
    m2l = m1l if m1l < a1 else a1
    m2h = a1 if m1l < a1 else m1l
    m3l = m1h if m1h < a3 else a3
    m3h = a3 if m1h < a3 else m1h
    return (m0l, m2l, m2h, m3l, m3h)


@numba.njit(nogil=True)
def merge_pair(a, b):
    """Two sorted 5-tuples merged (26 min/max)."""
    a0, a1, a2, a3, a4 = a
    b0, b1, b2, b3, b4 = b
    m0l = a0 if a0 < b0 else b0
    m0h = b0 if a0 < b0 else a0
    m1l = a4 if a4 < b4 else b4
    m1h = b4 if a4 < b4 else a4
    m2l = m0h if m0h < m1l else m1l
    m2h = m1l if m0h < m1l else m0h
    m3l = a2 if a2 < b2 else b2
    m3h = b2 if a2 < b2 else a2
    m4l = m2l if m2l < m3l else m3l
    m4h = m3l if m2l < m3l else m2l
    m5l = m2h if m2h < m3h else m3h
    m5h = m3h if m2h < m3h else m2h
    m6l = a1 if a1 < b1 else b1
    m6h = b1 if a1 < b1 else a1
    m7l = a3 if a3 < b3 else b3
    m7h = b3 if a3 < b3 else a3
    m8l = m6h if m6h < m7l else m7l
    m8h = m7l if m6h < m7l else m6h
    m9l = m4l if m4l < m6l else m6l
    m9h = m6l if m4l < m6l else m4l
    m10l = m4h if m4h < m8l else m8l
    m10h = m8l if m4h < m8l else m4h
    m11l = m5l if m5l < m8h else m8h
    m11h = m8h if m5l < m8h else m5l
    m12l = m5h if m5h < m7h else m7h
    m12h = m7h if m5h < m7h else m5h
    return (m0l, m9l, m9h, m10l, m10h, m11l, m11h, m12l, m12h, m1h)


@numba.njit(nogil=True)
def middle_ranks(a, b):
    """Ranks 7..12 of two sorted 10-tuples (36 min/max)."""
    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9 = a
    b0, b1, b2, b3, b4, b5, b6, b7, b8, b9 = b
    m0h = b0 if a0 < b0 else a0
    m1l = a8 if a8 < b8 else b8
    m2l = m0h if m0h < m1l else m1l
    m2h = m1l if m0h < m1l else m0h
    m3l = a4 if a4 < b4 else b4
    m3h = b4 if a4 < b4 else a4
    m4h = m3l if m2l < m3l else m2l
    m5l = m2h if m2h < m3h else m3h
    m6h = b2 if a2 < b2 else a2
    m7l = a6 if a6 < b6 else b6
    m8l = m6h if m6h < m7l else m7l
    m8h = m7l if m6h < m7l else m6h
    m9h = m8l if m4h < m8l else m4h
    m10l = m5l if m5l < m8h else m8h
    m10h = m8h if m5l < m8h else m5l
    m11h = b1 if a1 < b1 else a1
    m12l = a9 if a9 < b9 else b9
    m13l = m11h if m11h < m12l else m12l
    m13h = m12l if m11h < m12l else m11h
    m14l = a5 if a5 < b5 else b5
    m14h = b5 if a5 < b5 else a5
    m15h = m14l if m13l < m14l else m13l
    m16l = m13h if m13h < m14h else m14h
    m17h = b3 if a3 < b3 else a3
    m18l = a7 if a7 < b7 else b7
    m19l = m17h if m17h < m18l else m18l
    m19h = m18l if m17h < m18l else m17h
    m20l = m15h if m15h < m19l else m19l
    m20h = m19l if m15h < m19l else m15h
    m21l = m16l if m16l < m19h else m19h
    m22l = m9h if m9h < m20l else m20l
    m22h = m20l if m9h < m20l else m9h
    m23l = m10l if m10l < m20h else m20h
    m23h = m20h if m10l < m20h else m10l
    m24l = m10h if m10h < m21l else m21l
    m24h = m21l if m10h < m21l else m10h
    return (m22l, m22h, m23l, m23h, m24l, m24h)


@numba.njit(nogil=True)
def median_of(q, c):
    """Rank 5 of ``q`` (ranks 7..12 of 20) and ``c`` (5 sorted): rank 12 of the 25 (10 min/max)."""
    q0, q1, q2, q3, q4, q5 = q
    c0, c1, c2, c3, c4 = c
    m0h = c0 if q0 < c0 else q0
    m1l = q4 if q4 < c4 else c4
    m2h = m1l if m0h < m1l else m0h
    m3h = c2 if q2 < c2 else q2
    m4l = m2h if m2h < m3h else m3h
    m5h = c1 if q1 < c1 else q1
    m6l = m5h if m5h < q5 else q5
    m7l = q3 if q3 < c3 else c3
    m8h = m7l if m6l < m7l else m6l
    m9l = m4l if m4l < m8h else m8h
    return m9l

