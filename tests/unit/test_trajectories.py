"""Dense trajectories (dt, idt): known answers on synthetic videos of tiny frames."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest

from featpipe.errors import InputError, ParameterError
from featpipe.extract._trajectory_kernels import advance_tracks
from featpipe.extract.optical_flow import DISPyramid, FarnebackPyramid, level_scales
from featpipe.extract.trajectories import (
    GROUPS,
    DenseTrajectories,
    ImprovedDenseTrajectories,
    dense_sample,
    parse_descriptors,
    people_mask,
    trajectory_shapes,
)

HEIGHT, WIDTH = 48, 64


@pytest.fixture(scope="module")
def texture():
    """A smooth random texture (Gaussian-blurred noise, stretched to [0, 255])."""
    rng = np.random.default_rng(7)
    noise = cv2.GaussianBlur(rng.random((160, 200)).astype(np.float32) * 255, (0, 0), 2.0)
    return (noise - noise.mean()) * (120 / noise.std()) + 128


def shifted(texture, dx, dy, size=(HEIGHT, WIDTH)):
    """The texture moved by (dx, dy) px (bilinear), cut to a HEIGHT × WIDTH RGB frame."""
    matrix = np.float32([[1, 0, dx - 40], [0, 1, dy - 40]])
    grey = cv2.warpAffine(texture, matrix, size[::-1], flags=cv2.INTER_LINEAR)
    grey = np.clip(np.rint(grey), 0, 255).astype(np.uint8)
    return np.dstack([grey, grey, grey])


def run(estimator, frames, boxes=None):
    """Every frame's trajectories, concatenated: (descriptors, positions, ending frames)."""
    tracker = estimator.start(*frames[0].shape[:2])
    descriptors, positions, ends = [], [], []
    for t, frame in enumerate(frames):
        out = tracker.add(frame, None if boxes is None else boxes[t])
        assert out.descriptors.dtype == np.float32 and out.positions.dtype == np.float32
        assert out.descriptors.shape == (len(out.positions), estimator.n_features)
        descriptors.append(out.descriptors)
        positions.append(out.positions)
        ends += [t] * len(out.positions)
    return np.concatenate(descriptors), np.concatenate(positions), np.array(ends)


def columns(estimator, name):
    return dict(estimator.groups())[name]


@pytest.mark.parametrize("flow", ["farneback", "dis"])
def test_a_translating_texture_gives_straight_trajectories_of_its_displacement(texture, flow):
    dx, dy = 0.45, 0.45                       # 45 degrees (y down): HOF bin 1 exactly
    frames = [shifted(texture, dx * t, dy * t) for t in range(18)]
    dt = DenseTrajectories(flow=flow)
    descriptors, positions, ends = run(dt, frames)
    assert len(descriptors) > 30
    assert ends.min() == 15                   # 16 points: the first end at frame 15
    shape = descriptors[:, columns(dt, "trajectory")].reshape(-1, 15, 2)
    expected = np.array([dx, dy]) / (15 * math.hypot(dx, dy))
    # every normalised step is the displacement's direction, 1/15 of the whole length
    assert np.median(np.abs(shape - expected)) < 0.002
    assert np.abs(shape.mean(axis=(0, 1)) - expected).max() < 0.001
    # HOF: in every 2x2x3 cell, bin 1 (45 degrees) holds most of the histogram
    hof = descriptors[:, columns(dt, "hof")].reshape(-1, 12, 9)
    assert (hof.argmax(axis=2) == 1).mean() > 0.95
    # the square root of L1-normalised bins: squares give the share of each time cell's mass
    share = (hof[:, :, 1] ** 2).reshape(-1, 3, 4).sum(axis=2)
    assert np.median(share) > 0.9
    # positions: the mean of 16 points, inside the frame, at a scale of 1 or sqrt(2)
    assert set(np.round(positions[:, 2].astype(float), 4)) <= {1.0, 1.4142}
    assert (positions[:, 0] > 0).all() and (positions[:, 0] < WIDTH).all()


@pytest.mark.parametrize("engine", ["farneback", "dis"])
def test_each_scale_gets_the_displacement_divided_by_its_scale(texture, engine):
    """Flow from a frame to the texture moved by (1.5, -0.7) px: at scale k, in the scale's
    pixels, the displacement divided by s_k (the middle half of each scale, where no edge
    is seen; DIS at a quarter of 128 x 96 is coarser than Farnebäck)."""
    size, displacement = (96, 128), np.array([1.5, -0.7])
    scales = level_scales(3, math.sqrt(2))
    sizes = [(int(round(size[0] / s)), int(round(size[1] / s))) for s in scales]
    flows = (FarnebackPyramid(sizes, scales, math.sqrt(2)) if engine == "farneback"
             else DISPyramid(sizes, scales))
    before, after = (cv2.cvtColor(shifted(texture, *d, size), cv2.COLOR_RGB2GRAY)
                     for d in ((0, 0), displacement))
    medians = []
    for flow, scale, (height, width) in zip(flows.flow(flows.expand(before),
                                                       flows.expand(after)),
                                            scales, sizes, strict=True):
        assert flow.shape == (height, width, 2) and flow.dtype == np.float32
        middle = flow[height // 4:3 * height // 4, width // 4:3 * width // 4].reshape(-1, 2)
        medians.append(np.median(middle, axis=0) * scale)
    np.testing.assert_allclose(medians, [displacement] * 3, atol=0.2)
    if engine == "dis":                       # one field, resized: the same motion at each scale
        np.testing.assert_allclose(medians, [medians[0]] * 3, atol=0.02)


def test_dis_runs_where_its_preset_computes_and_small_frames_reduce_less():
    """The ultrafast preset's finest scale is 2: the frame reduced by 4, by 2 or not at all
    where a reduced side would be under 16 px; a frame with no side of 12 px (OpenCV's DIS
    takes none) is too small for flow dis, and tracking it gives nothing."""
    reductions = {size: DISPyramid([size], [1.0]).reduction
                  for size in ((240, 320), (64, 64), (63, 200), (48, 64), (31, 40), (20, 30))}
    assert reductions == {(240, 320): 4, (64, 64): 4, (63, 200): 2, (48, 64): 2, (31, 40): 1,
                          (20, 30): 1}
    assert DISPyramid([(240, 320)], [1.0]).expand(np.zeros((240, 320), np.uint8)).shape == (
        60, 80)
    small = DenseTrajectories(patch_size=4, flow="dis")
    assert not small.usable(10, 11) and small.usable(10, 12)
    assert DenseTrajectories(patch_size=4).usable(10, 11)
    assert "side of 12 with flow dis" in small.minimum_size()
    tracker = small.start(10, 11)
    for _ in range(3):
        assert tracker.add(np.zeros((10, 11, 3), np.uint8)).positions.shape == (0, 3)


def test_a_static_scene_gives_no_trajectories(texture):
    frames = [shifted(texture, 0, 0)] * 18
    descriptors, _, _ = run(DenseTrajectories(), frames)
    assert len(descriptors) == 0


def reference_histogram(x, y, zero=None):
    """(H, W, 9) per-pixel orientation histograms by numpy's arctan2 (independent of the
    kernel's polynomial angle)."""
    angle = np.degrees(np.arctan2(y, x).astype(np.float64)) % 360
    magnitude = np.hypot(x, y).astype(np.float64)
    position = angle / 45
    low = np.floor(position).astype(int) % 8
    upper = position - np.floor(position)
    out = np.zeros(x.shape + (9,))
    rows, cols = np.indices(x.shape)
    np.add.at(out, (rows, cols, low), (1 - upper) * magnitude)
    np.add.at(out, (rows, cols, (low + 1) % 8), upper * magnitude)
    if zero is not None:
        slow = magnitude <= zero
        out[slow] = 0
        out[slow, 8] = 1
    return out


#: the four groups' first channels, bins and columns in a block row of 132 (HOG, HOF, MBHx,
#: MBHy of 2 x 2 cells)
KERNEL_GROUPS = (np.array([0, 9, 18, 27]), np.array([8, 9, 8, 8]), np.array([0, 32, 68, 100]))


def block_sums(grey, flow, points, patch=32):
    """advance_tracks' normalised HOG, HOF, MBHx, MBHy blocks (N, 132) of 2 x 2 cells at
    each point (N, 2) of (grey, flow), the points held in place (zero tracking flow)."""
    height, width = grey.shape
    n = len(points)
    tracked = np.zeros((n, 2, 2), np.float32)
    tracked[:, 0] = points
    steps, alive = np.zeros(n, np.intp), np.ones(n, bool)
    sums = np.zeros((n, 1, 132), np.float32)
    rows = np.empty((patch + 1, width + 1, 36), np.float32)
    advance_tracks(tracked, steps, np.zeros_like(flow), grey, flow,
                   np.zeros((0, 1, 2), np.float32), *KERNEL_GROUPS, patch, 2, 1, 1,
                   np.float32(0.05), np.float32(0.4), sums, alive, rows)
    assert alive.all() and (steps == 1).all()
    return sums[:, 0]


def reference_blocks(per_pixel, corners, patch=32):
    """The normalised blocks of per-pixel histograms (H, W, 9) with 2 x 2 cells from each
    corner (left, top): cx, then cy, then the bins; max(sum, 0) + 0.05, L1, square root."""
    cell = patch // 2
    out = []
    for left, top in corners:
        block = np.array([per_pixel[top + cy * cell:top + (cy + 1) * cell,
                                    left + cx * cell:left + (cx + 1) * cell, :].sum((0, 1))
                          for cx in range(2) for cy in range(2)])
        block = np.maximum(block, 0) + 0.05
        out.append(np.sqrt(block / block.sum()).ravel())
    return np.array(out)


def test_block_histograms_match_a_direct_computation():
    rng = np.random.default_rng(5)
    grey = rng.integers(0, 256, (40, 50)).astype(np.uint8)
    flow = rng.normal(0, 1, (40, 50, 2)).astype(np.float32)
    # points inside, near and on the borders (their blocks clamped into the frame)
    points = np.array([[25, 20], [0.2, 0.4], [49.6, 39.7], [16, 16], [17.5, 30.2], [33, 8],
                       [12.5, 2.5]], np.float32)
    got = block_sums(grey, flow, points)
    xi = np.clip(np.rint(points[:, 0]).astype(int), 0, 49)
    yi = np.clip(np.rint(points[:, 1]).astype(int), 0, 39)
    corners = np.stack([np.clip(xi - 16, 0, 50 - 32), np.clip(yi - 16, 0, 40 - 32)], axis=1)

    def sobel(image):
        return (cv2.Sobel(image, cv2.CV_32F, 1, 0, ksize=1),
                cv2.Sobel(image, cv2.CV_32F, 0, 1, ksize=1))

    per_pixel = [reference_histogram(*sobel(grey)),
                 reference_histogram(flow[..., 0], flow[..., 1], zero=0.4),
                 reference_histogram(*sobel(np.ascontiguousarray(flow[..., 0]))),
                 reference_histogram(*sobel(np.ascontiguousarray(flow[..., 1])))]
    for g, histogram in enumerate(per_pixel):
        bins, start = KERNEL_GROUPS[1][g], KERNEL_GROUPS[2][g]
        expected = reference_blocks(histogram[..., :bins], corners)
        # fastAtan2's 0.01 degree moves ~2e-4 of a magnitude between neighbouring bins
        np.testing.assert_allclose(got[:, start:start + 4 * bins], expected, rtol=2e-3,
                                   atol=1e-4)


def test_a_constant_flow_has_no_motion_boundaries():
    flow = np.empty((40, 50, 2), np.float32)
    flow[...] = (0.8, -0.3)
    grey = np.zeros((40, 50), np.uint8)
    got = block_sums(grey, flow, np.array([[21, 19], [3, 30]], np.float32))
    # MBH: each bin is 0 + epsilon: after L1 and the square root, every entry is sqrt(1/32)
    np.testing.assert_allclose(got[:, 68:], np.sqrt(1 / 32), rtol=1e-6)
    # and HOF puts all its mass in the two bins around the angle of (0.8, -0.3)
    hof = got[:, 32:68].reshape(2, 4, 9) ** 2 * (4 * (0.05 * 9 + 256 * math.hypot(0.8, -0.3)))
    position = (math.degrees(math.atan2(-0.3, 0.8)) % 360) / 45
    low = int(position)
    magnitude = math.hypot(0.8, -0.3) * 16 * 16
    np.testing.assert_allclose(hof[..., low], (1 - (position - low)) * magnitude + 0.05,
                               rtol=1e-3)
    np.testing.assert_allclose(hof[..., (low + 1) % 8], (position - low) * magnitude + 0.05,
                               rtol=1e-3)


def test_slow_flow_goes_to_the_zero_bin():
    flow = np.full((40, 40, 2), 0.2, np.float32)          # |flow| = 0.28 <= 0.4
    got = block_sums(np.zeros((40, 40), np.uint8), flow, np.array([[20, 20]], np.float32))
    hof = got[0, 32:68].reshape(4, 9) ** 2 * 4 * (0.05 * 9 + 256)
    np.testing.assert_allclose(hof, [[0.05] * 8 + [256.05]] * 4, rtol=1e-5)


def test_a_camera_pan_gives_many_trajectories_with_dt_and_few_with_idt(texture):
    frames = [shifted(texture, 0.9 * t, -0.4 * t) for t in range(18)]
    dt, _, _ = run(DenseTrajectories(), frames)
    idt, _, _ = run(ImprovedDenseTrajectories(), frames)
    assert len(dt) > 50
    assert len(idt) <= 0.05 * len(dt)


def test_idt_keeps_an_object_moving_over_a_panning_background(texture):
    rng = np.random.default_rng(3)
    patch = cv2.GaussianBlur(rng.random((24, 24)).astype(np.float32) * 255, (0, 0), 1.5)
    patch = np.clip((patch - patch.mean()) * 4 + 128, 0, 255).astype(np.uint8)
    frames = []
    for t in range(18):
        frame = shifted(texture, 0.9 * t, 0, (64, 112)).copy()
        x = 4 + 4 * t                             # 3.1 px per frame against the background
        frame[20:44, x:x + 24] = patch[..., None]
        frames.append(frame)
    idt = ImprovedDenseTrajectories()
    descriptors, positions, _ = run(idt, frames)
    assert len(descriptors) > 0
    # what survives moved with the object (right, relative to the background)
    shape = descriptors[:, columns(idt, "trajectory")].reshape(-1, 15, 2)
    assert np.median(shape[:, :, 0].sum(axis=1)) > 0.5


@pytest.mark.parametrize("keypoints", ["orb", "sift", "corners"])
def test_idt_is_reproducible_whatever_the_global_seed(texture, keypoints):
    """OpenCV's RANSAC seeds its own generator: the global seed changes nothing."""
    rng = np.random.default_rng(11)
    frames = [shifted(texture, 0.7 * t, 0.2 * t) for t in range(17)]
    for frame in frames[8:]:                      # a moving object: RANSAC has outliers
        frame[10:30, 20:40] = rng.integers(0, 255, (20, 20, 1), dtype=np.uint8)
    cv2.setRNGSeed(1)
    first = run(ImprovedDenseTrajectories(keypoints=keypoints), frames)
    cv2.setRNGSeed(2)
    second = run(ImprovedDenseTrajectories(keypoints=keypoints), frames)
    assert len(first[0])
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)


def test_human_boxes_are_taken_and_checked(texture):
    frames = [shifted(texture, 0.7 * t, 0.2 * t) for t in range(17)]
    boxes = [np.array([[10.2, 5.0, 30.0, 40.7]], np.float32)] * len(frames)
    descriptors, _, _ = run(ImprovedDenseTrajectories(), frames, boxes)
    assert descriptors.shape[1] == 426
    # the release's lines carry a confidence: a fifth column is ignored
    mask = people_mask(48, 64, np.array([[10.2, 5.0, 30.0, 40.7, 0.9], [-5, -5, 2.5, 1, 1]]))
    assert mask[5:41, 11:31].sum() == 0 and mask[:2, :3].sum() == 0
    assert mask.sum() == 48 * 64 - 36 * 20 - 2 * 3


def test_selected_groups_are_the_columns_of_all_groups(texture):
    frames = [shifted(texture, 0.45 * t, 0.3 * t) for t in range(17)]
    full, positions, _ = run(DenseTrajectories(), frames)
    chosen = DenseTrajectories(descriptors="mbh,hof")
    part, part_positions, _ = run(chosen, frames)
    assert [name for name, _ in chosen.groups()] == ["hof", "mbhx", "mbhy"]
    np.testing.assert_array_equal(part_positions, positions)
    np.testing.assert_allclose(part, full[:, 126:], rtol=1e-6)


def test_groups_shapes_and_parsing():
    dt = DenseTrajectories()
    assert dt.n_features == sum(GROUPS.values()) == 426
    assert [(n, s.stop - s.start) for n, s in dt.groups()] == list(GROUPS.items())
    assert parse_descriptors("hog,hof,mbh") == ("hog", "hof", "mbhx", "mbhy")
    assert parse_descriptors("mbhy, trajectory") == ("trajectory", "mbhy")
    assert parse_descriptors("all") == tuple(GROUPS)
    small = DenseTrajectories(track_length=10, n_xy_cells=3, n_t_cells=2, descriptors="all")
    assert dict((n, s.stop - s.start) for n, s in small.groups()) == {
        "trajectory": 20, "hog": 144, "hof": 162, "mbhx": 144, "mbhy": 144}
    # 320x240: six scales (the shorter side stays >= 32), 64x48 + 45x34 + 32x24 + ... cells
    assert [round(s, 3) for s, _, _ in dt.scales(240, 320)] == [1, 1.414, 2, 2.828, 4, 5.657]
    assert dt.count(240, 320) == sum((h // 5) * (w // 5) for _, h, w in dt.scales(240, 320))
    assert dt.count(20, 200) == 0 and "32x32" in dt.minimum_size()


def test_a_frame_too_small_gives_nothing_and_a_wrong_size_an_error():
    tracker = DenseTrajectories().start(20, 30)
    assert tracker.add(np.zeros((20, 30, 3), np.uint8)).descriptors.shape == (0, 426)
    tracker = DenseTrajectories().start(HEIGHT, WIDTH)
    tracker.add(np.zeros((HEIGHT, WIDTH, 3), np.uint8))
    with pytest.raises(InputError, match=r"frame 1 has shape \(20, 30, 3\), the video's first"):
        tracker.add(np.zeros((20, 30, 3), np.uint8))
    with pytest.raises(InputError, match="frame 1 is float32 .* take uint8"):
        tracker.add(np.zeros((HEIGHT, WIDTH, 3), np.float32))
    idt = ImprovedDenseTrajectories().start(HEIGHT, WIDTH)
    with pytest.raises(InputError, match="frame 0: people's boxes"):
        idt.add(np.zeros((HEIGHT, WIDTH, 3), np.uint8), np.array([[1.0, 2.0, 3.0]]))
    with pytest.raises(InputError, match="frame 0: people's boxes"):
        idt.add(np.zeros((HEIGHT, WIDTH, 3), np.uint8), np.array([[1.0, np.nan, 3.0, 4.0]]))
    assert idt.add(np.zeros((HEIGHT, WIDTH), np.uint8), np.zeros((0, 4))).positions.shape == (
        0, 3)


@pytest.mark.parametrize("params, name", [
    ({"step": 0}, "step"), ({"flow": "lk"}, "flow"), ({"descriptors": "hog,sift"}, "descriptors"),
    ({"n_t_cells": 20}, "n_t_cells"), ({"n_xy_cells": 40}, "n_xy_cells"),
    ({"scale_factor": 1.5}, "scale_factor"), ({"keypoints": "surf"}, "keypoints")])
def test_parameter_errors_name_the_parameter(params, name):
    with pytest.raises(ParameterError) as err:
        ImprovedDenseTrajectories(**params).groups()
    assert err.value.param == name


def test_dense_sampling_skips_flat_areas_and_occupied_cells():
    grey = np.zeros((30, 40), np.uint8)
    grey[:, 20:] = np.random.default_rng(0).integers(0, 255, (30, 20), dtype=np.uint8)
    none = np.zeros((0, 1, 2), np.float32), np.zeros(0, np.intp), np.zeros(0, bool)
    points = dense_sample(grey, 5, 0.001, *none)
    assert (points[:, 0] >= 17).all()            # nothing in the flat left half
    assert {tuple(p) for p in points} >= {(22.0, 2.0), (37.0, 27.0)}
    # a live track's last point occupies its cell; its earlier points and dead tracks don't
    tracks = np.array([[[37.0, 27.0], [21.3, 3.9]], [[32.0, 7.0], [32.0, 7.0]]], np.float32)
    again = dense_sample(grey, 5, 0.001, tracks, np.array([1, 0]), np.array([True, False]))
    assert {tuple(p) for p in points} - {tuple(p) for p in again} == {(22.0, 2.0)}
    assert len(again) == len(points) - 1


def test_pruning_rules():
    t = np.arange(16, dtype=np.float32)[:, None]
    line = np.concatenate([t * 0.5, t * 0], axis=1)           # 7.5 px in 15 steps
    static = line * 0.1                                         # std 0.23 px
    jump = line.copy()
    jump[8:, 0] += 25                                           # one 25 px step
    valid, shape, mean = trajectory_shapes(np.stack([line, static, jump]))
    assert valid.tolist() == [True, False, False]
    np.testing.assert_allclose(shape[0].reshape(15, 2), [[1 / 15, 0]] * 15, rtol=1e-6)
    np.testing.assert_allclose(mean[0], [3.75, 0])


def test_a_tracker_checks_the_parameters_set_after_construction():
    """scikit-learn's rule: parameters are checked when used, so a value set after the
    estimator was made (``set_params``) is refused when a video starts, not run."""
    estimator = DenseTrajectories().set_params(track_length=0)
    with pytest.raises(ParameterError, match="track_length"):
        estimator.start(64, 64)


def test_a_scale_whose_shorter_side_equals_the_patch_size_is_kept():
    """The release's ``InitPry``: a scale is kept while its shorter side is >= patch_size,
    the boundary included (scale factor 0.5: 32 -> 16 -> 8 with patch_size 16 is two
    scales, the second exactly 16 pixels)."""
    estimator = DenseTrajectories(scale_factor=0.5, patch_size=16, n_scales=8)
    assert [s for s, _, _ in estimator.scales(32, 48)] == [1.0, 2.0]
    assert [s for s, _, _ in estimator.scales(31, 48)] == [1.0]


@pytest.mark.parametrize("keypoints", ["orb", "sift"])
def test_the_first_frame_pair_is_matched_with_keypoints_too(texture, keypoints):
    """idt's camera motion matches keypoints of the previous frame with the current one's:
    the first frame's keypoints are kept, so the homography of frames 0 -> 1 uses them as
    every later pair's does (the release detects them on every frame)."""
    estimator = ImprovedDenseTrajectories(step=4, n_scales=1, keypoints=keypoints)
    big = (120, 160)
    tracker = estimator.start(*big)
    tracker.add(shifted(texture, 0, 0, big), None)
    grey = cv2.cvtColor(shifted(texture, 1, 0, big), cv2.COLOR_RGB2GRAY)
    previous, current = tracker.camera.keypoint_matches(grey, None)
    assert len(previous) > 10
    np.testing.assert_allclose(np.median(current - previous, axis=0), [1, 0], atol=0.25)


def test_an_rgba_frame_is_read_as_its_rgb(texture):
    """Frames with an alpha channel (PNG sequences) are accepted; alpha is ignored."""
    estimator = DenseTrajectories(step=4, n_scales=1)
    frames = [shifted(texture, t, 0) for t in range(17)]
    rgba = [np.dstack([f, np.full(f.shape[:2], 7, np.uint8)]) for f in frames]
    expected, got = run(estimator, frames), run(estimator, rgba)
    assert len(expected[0]) > 0
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a, b)


def test_idt_keeps_the_500_strongest_orb_keypoints_of_a_frame(texture):
    estimator = ImprovedDenseTrajectories(step=4, n_scales=1, keypoints="orb")
    big = (480, 640)
    rng = np.random.default_rng(3)
    noise = cv2.resize((rng.random((240, 320)) * 255).astype(np.uint8), big[::-1],
                       interpolation=cv2.INTER_NEAREST)  # 2 px blocks: corners everywhere
    tracker = estimator.start(*big)
    tracker.camera.keypoints(noise, None)
    assert len(tracker.camera.previous[0]) == 500
