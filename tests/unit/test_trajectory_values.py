"""Dense trajectories' values pinned against hand computation (issue 39 §6: each test kills
mutants of ``featpipe/extract/trajectories.py`` that the other tests let live;
``benchmarks/mutation_sample.py``).

The descriptors of a tracker whose flow is known: the flow engine is replaced by one that
returns a constant field, the sampling by one point, the frames by a ramp of constant
gradient, so that every histogram has a value computed here by hand from the release's rules
(``Tracker``, ``advance_tracks``): a cell's bins summed over its pixels, ε = EPSILON added to
each bin, the block L1-normalised and square-rooted, the blocks of a time cell averaged
(summed, then divided by its ``track_length / n_t_cells`` frames)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import featpipe.extract.optical_flow as optical_flow
import featpipe.extract.trajectories as trajectories
from featpipe.errors import InputError, ParameterError
from featpipe.extract.trajectories import (
    DenseTrajectories,
    ImprovedDenseTrajectories,
    parse_descriptors,
    people_mask,
    trajectory_shapes,
    warp_current,
)

#: the release's constants (written here, not read from the module, so that a changed
#: constant in the module is a failing test)
EPSILON, MIN_STD, MAX_STD, MAX_STEP = 0.05, math.sqrt(3), 50.0, 20.0
HEIGHT, WIDTH, PATCH, CELLS, LENGTH, T_CELLS = 20, 96, 16, 2, 6, 3
SLOPE = 2  # grey = SLOPE * x: a central difference of 2 * SLOPE along x, 0 along y


class ConstantFlow:
    """A flow engine whose field is ``move`` pixels everywhere, at every scale (in the pixels
    of the scale); ``made`` keeps the arguments it was made with."""

    move = (1.0, 0.0)
    made: list = []

    def __init__(self, sizes, scales, *args):
        self.sizes = sizes
        ConstantFlow.made.append((sizes, scales, *args))

    def expand(self, grey):
        return grey

    def flow(self, previous, current):
        return [np.broadcast_to(np.float32(self.move), (h, w, 2)).copy()
                for h, w in self.sizes]


@pytest.fixture
def constant_flow(monkeypatch):
    """One point sampled at (40, 10) on the first frame only (at each scale); every flow
    ``ConstantFlow``."""
    sampled = []

    def one_point(grey, step, quality, points, steps, alive):
        first = len(sampled) < len(ConstantFlow.made[-1][0])
        sampled.append(1)
        return np.array([[40.0, 10.0]] if first else np.zeros((0, 2)), np.float32)

    monkeypatch.setattr(trajectories, "dense_sample", one_point)
    monkeypatch.setattr(optical_flow, "FarnebackPyramid", ConstantFlow)
    return ConstantFlow


def ramp() -> np.ndarray:
    grey = np.tile(np.arange(WIDTH, dtype=np.uint8) * SLOPE, (HEIGHT, 1))
    return np.repeat(grey[:, :, None], 3, axis=2)


def run(estimator, frames: int = LENGTH + 1):
    tracker = estimator.start(HEIGHT, WIDTH)
    out = [tracker.add(ramp()) for _ in range(frames)]
    return tracker, out


def block(values_per_cell: np.ndarray) -> np.ndarray:
    """A block's bins by hand: each cell's bins + ε, L1 over the block, square root."""
    cells = np.tile(np.asarray(values_per_cell, np.float64) + EPSILON, (CELLS * CELLS, 1))
    return np.sqrt(cells / cells.sum())


@pytest.mark.parametrize("length", [LENGTH, LENGTH + 1])  # 7 steps: 3 time cells of 2
def test_hog_hof_mbh_and_shape_are_the_hand_computed_values(constant_flow, length):
    estimator = DenseTrajectories(step=8, patch_size=PATCH, track_length=length,
                                  n_t_cells=T_CELLS, n_scales=1)
    _, out = run(estimator, length + 1)
    assert all(len(frame.descriptors) == 0 for frame in out[:-1])
    (row,) = out[-1].descriptors
    groups = dict(estimator.groups())
    pixels = (PATCH // CELLS) ** 2
    hog = np.zeros(8)
    hog[0] = 2 * SLOPE * pixels  # every pixel's gradient: angle 0, magnitude 2 * SLOPE
    hof = np.zeros(9)
    hof[0] = 1.0 * pixels  # the flow (1, 0): angle 0, magnitude 1 > MIN_FLOW
    expected = {
        "trajectory": np.tile([1 / length, 0.0], length),
        "hog": np.tile(block(hog).ravel(), T_CELLS),
        "hof": np.tile(block(hof).ravel(), T_CELLS),
        "mbhx": np.tile(block(np.zeros(8)).ravel(), T_CELLS),  # a constant flow: no gradient
        "mbhy": np.tile(block(np.zeros(8)).ravel(), T_CELLS),
    }
    for name, columns in groups.items():
        np.testing.assert_allclose(row[columns], expected[name], rtol=2e-6, atol=1e-7,
                                   err_msg=name)
    np.testing.assert_allclose(out[-1].positions, [[40 + length / 2, 10, 1]], rtol=1e-6)


def test_slow_flow_goes_to_hofs_zero_bin(constant_flow, monkeypatch):
    monkeypatch.setattr(constant_flow, "move", (0.3, 0.0))  # under MIN_FLOW = 0.4 px
    estimator = DenseTrajectories(step=8, patch_size=PATCH, track_length=LENGTH,
                                  n_t_cells=T_CELLS, n_scales=1, descriptors="hof")
    # 0.3 px a frame is a static trajectory (std < √3): only its descriptor is computed
    tracker = estimator.start(HEIGHT, WIDTH)
    for _ in range(LENGTH + 1):
        tracker.add(ramp())
    hof = np.zeros(9)
    hof[8] = (PATCH // CELLS) ** 2  # the zero bin counts the pixels
    sums = tracker.tracks[0].sums[0] / np.float32(LENGTH // T_CELLS)
    np.testing.assert_allclose(sums.ravel(), np.tile(block(hof).ravel(), T_CELLS), rtol=2e-6)


@pytest.mark.parametrize(("move", "kept"), [(1.0, False), (1.5, True)])
def test_idt_drops_a_trajectory_that_moves_no_more_than_the_camera(constant_flow, monkeypatch,
                                                                   move, kept):
    """idt compares each camera-compensated step with CAMERA_MIN_MOVE = 1 px: a trajectory
    whose steps are all at most that followed the camera (the homography is the identity
    here: too few matches on a ramp)."""
    monkeypatch.setattr(constant_flow, "move", (move, 0.0))
    estimator = ImprovedDenseTrajectories(step=8, patch_size=PATCH, track_length=LENGTH,
                                          n_t_cells=T_CELLS, n_scales=1, keypoints="corners")
    _, out = run(estimator)
    assert len(out[-1].descriptors) == kept
    if kept:
        shape = out[-1].descriptors[0][dict(estimator.groups())["trajectory"]]
        np.testing.assert_allclose(shape, np.tile([1 / LENGTH, 0.0], LENGTH), rtol=1e-6)


# -- the validity rules, at their limits ----------------------------------------------------------
def straight(dx: float, dy: float, length: int = 15) -> np.ndarray:
    return np.stack([np.arange(length + 1) * dx, np.arange(length + 1) * dy], axis=1)


def std_of(dx: float, length: int = 15) -> float:
    return float(np.std(np.arange(length + 1) * dx))


def test_a_trajectory_is_static_only_below_min_std_along_both_axes():
    at = MIN_STD / std_of(1.0)  # the step whose positions have std exactly √3
    points = np.stack([straight(at * (1 - 1e-6), 0), straight(at * (1 + 1e-6), 0),
                       straight(0, at * (1 + 1e-6)), straight(1.9 / std_of(1.0), 0)])
    valid, _, _ = trajectory_shapes(points.astype(np.float64))
    assert valid.tolist() == [False, True, True, True]  # std 1.9 > √3: not static


def test_a_trajectory_is_erratic_above_max_std_along_either_axis():
    def step(std):
        return std / std_of(1.0)

    valid, _, _ = trajectory_shapes(np.stack([straight(step(MAX_STD - 0.01), 0),
                                              straight(0, step(MAX_STD + 0.5)),
                                              straight(step(MAX_STD + 0.5), 0)]))
    assert valid.tolist() == [True, False, False]


def test_a_std_exactly_at_a_limit_is_neither_static_nor_erratic():
    """The release compares strictly (``< MIN_STD`` on both axes, ``> MAX_STD`` on either):
    positions alternating +-a have a std of exactly ``a`` in float64."""
    def alternating(a: float, axis: int) -> np.ndarray:
        points = np.zeros((16, 2))
        points[::2, axis], points[1::2, axis] = a, -a
        return points

    points = np.stack([alternating(MIN_STD, 0), alternating(MIN_STD, 1),
                       alternating(MAX_STD, 0), alternating(MAX_STD, 1)])
    assert (points.std(axis=1).max(axis=1) == [MIN_STD, MIN_STD, MAX_STD, MAX_STD]).all()
    valid, _, _ = trajectory_shapes(points)
    assert valid.tolist() == [True, True, True, True]


def test_a_jump_is_a_step_over_max_step_and_over_seven_tenths_of_the_length():
    def one_jump(size):
        points = straight(0.1, 0.2)
        points[8:, 0] += size
        return points

    # a 20.5 px jump in a 3 px path: most of its length -> a jump; a 19 px one is not
    valid, shape, mean = trajectory_shapes(np.stack([one_jump(MAX_STEP + 0.5),
                                                     one_jump(MAX_STEP - 1)]))
    assert valid.tolist() == [False, True]
    steps = np.diff(one_jump(MAX_STEP - 1), axis=0)
    length = np.sqrt((steps ** 2).sum(axis=1)).sum()
    np.testing.assert_allclose(shape[1], (steps / length).ravel(), rtol=1e-6)
    np.testing.assert_allclose(mean[1], one_jump(MAX_STEP - 1).mean(axis=0))
    long_path = straight(0.0, 3.0, 15)  # 45 px long: a 21 px step is under 0.7 of it
    long_path[8:, 0] += MAX_STEP + 1
    assert trajectory_shapes(long_path[None])[0].tolist() == [True]


def test_a_trajectory_that_does_not_move_has_a_zero_shape():
    valid, shape, _ = trajectory_shapes(np.zeros((1, 16, 2)))
    assert not valid[0] and np.all(shape == 0)


# -- scales, sizes, counts ----------------------------------------------------------------------
@pytest.mark.parametrize(("side", "layers"), [(31, 1), (32, 1), (45, 1), (46, 2), (64, 2),
                                              (65, 3), (90, 3), (91, 4)])
def test_the_number_of_scales_at_the_exact_boundary(side, layers):
    """A scale is kept while the shorter side, divided by √2 once per scale before it, is
    at least patch_size (32): one scale from 32 px (and below: one, too small to track),
    two from 46, three from 65 (64 / √2 / √2 is 31.999... in floating point), four from
    91."""
    estimator = DenseTrajectories()
    scales = estimator.scales(side, 200)
    assert len(scales) == layers
    assert scales[0] == (1.0, side, 200)
    for k, (scale, height, width) in enumerate(scales):
        assert scale == pytest.approx(math.sqrt(2) ** k)
        assert (height, width) == (round(side / scale), round(200 / scale))


def test_n_scales_caps_the_scales_and_count_sums_the_cells_of_each():
    estimator = DenseTrajectories(n_scales=2, step=5)
    scales = estimator.scales(120, 160)
    assert len(scales) == 2
    assert estimator.count(120, 160) == sum((h // 5) * (w // 5) for _, h, w in scales)
    assert estimator.count(31, 400) == 0 and not estimator.usable(31, 400)
    assert estimator.usable(32, 32)
    assert estimator.minimum_size() == "at least 32x32 with patch_size 32"


def test_dis_flow_needs_a_side_of_twelve_pixels():
    from featpipe.extract.optical_flow import DISPyramid

    side = DISPyramid.MIN_FRAME_SIDE
    small = DenseTrajectories(patch_size=4, flow="dis")
    assert small.usable(4, side) and not small.usable(4, side - 1)
    assert small.minimum_size() == (f"at least 4x4 with patch_size 4, and a side of {side} "
                                    "with flow dis")
    assert DenseTrajectories(patch_size=side, flow="dis").minimum_size() == \
        f"at least {side}x{side} with patch_size {side}"


def test_group_sizes_columns_and_feature_count():
    estimator = DenseTrajectories(track_length=10, n_xy_cells=3, n_t_cells=2,
                                  descriptors="hof,trajectory")
    assert estimator.group_sizes() == {"trajectory": 20, "hog": 8 * 18, "hof": 9 * 18,
                                       "mbhx": 8 * 18, "mbhy": 8 * 18}
    assert estimator.groups() == [("trajectory", slice(0, 20)), ("hof", slice(20, 182))]
    assert estimator.n_features == 182
    assert DenseTrajectories().n_features == sum(trajectories.GROUPS.values())


@pytest.mark.parametrize(("spec", "groups"), [
    ("hog,hof,mbh", ("hog", "hof", "mbhx", "mbhy")), ("", tuple(trajectories.GROUPS)),
    ("all", tuple(trajectories.GROUPS)), (" MBHY , trajectory", ("trajectory", "mbhy"))])
def test_descriptor_specs(spec, groups):
    assert parse_descriptors(spec) == groups


@pytest.mark.parametrize(("params", "message"), [
    ({"descriptors": "hog,sift"}, "unknown group 'sift'"),
    ({"descriptors": 3}, "descriptors must be an instance of 'str'"),
    ({"n_xy_cells": 5, "patch_size": 4}, "n_xy_cells must be <= patch_size (4), got 5"),
    ({"n_t_cells": 6, "track_length": 5}, "n_t_cells must be <= track_length (5), got 6"),
])
def test_parameter_rules(params, message):
    with pytest.raises(ParameterError, match=message.replace("(", r"\(").replace(")", r"\)")):
        DenseTrajectories(**params).groups()


def test_cells_equal_to_their_bound_are_allowed():
    assert DenseTrajectories(n_xy_cells=4, patch_size=4, n_t_cells=5, track_length=5) \
        .n_features > 0


# -- frames, boxes, the camera ------------------------------------------------------------------
def test_frames_of_another_size_type_or_bad_boxes_are_refused():
    tracker = ImprovedDenseTrajectories(patch_size=8, n_scales=1).start(16, 24)
    frame = np.zeros((16, 24, 3), np.uint8)
    tracker.add(frame)
    with pytest.raises(InputError, match=r"frame 1 has shape \(16, 25, 3\), the video's first "
                                         r"was 24x16"):
        tracker.add(np.zeros((16, 25, 3), np.uint8))
    with pytest.raises(InputError, match="frame 1 is float32"):
        tracker.add(frame.astype(np.float32))
    with pytest.raises(InputError, match="frame 1 is uint8 of shape"):
        tracker.add(np.zeros((16, 24, 2), np.uint8))
    with pytest.raises(InputError, match="people's boxes must be finite rows"):
        tracker.add(frame, boxes=np.array([[0, 0, np.nan, 4]]))
    with pytest.raises(InputError, match="people's boxes must be finite rows"):
        tracker.add(frame, boxes=np.array([0, 0, 4, 4]))
    tracker.add(frame, boxes=np.zeros((0, 4)))
    tracker.add(frame[:, :, 0])  # grey frames too


def test_a_frame_too_small_gives_no_trajectories():
    tracker = DenseTrajectories().start(20, 20)
    assert not tracker.usable and tracker.flow_engine is None
    out = tracker.add(np.zeros((20, 20, 3), np.uint8))
    assert out.descriptors.shape == (0, DenseTrajectories().n_features)
    assert out.positions.shape == (0, 3)


def test_people_masks_cover_the_pixels_of_each_box_inclusive():
    mask = people_mask(6, 8, np.array([[1.2, 0.5, 3.0, 2.9], [6.5, 4.0, 20.0, 9.0]]))
    expected = np.ones((6, 8), np.uint8)
    expected[1:3, 2:4] = 0  # x 2..3 (ceil 1.2 .. floor 3.0), y 1..2 (ceil 0.5 .. floor 2.9)
    expected[4:6, 7:8] = 0  # clipped to the frame
    np.testing.assert_array_equal(mask, expected)
    assert people_mask(6, 8, None).all() and people_mask(6, 8, np.zeros((0, 4))).all()
    assert people_mask(6, 8, np.array([[5.0, 5.0, 4.0, 4.0]])).all()  # an empty box


def test_the_warp_follows_the_homography_and_keeps_the_previous_frame_at_the_border():
    rng = np.random.default_rng(0)
    previous = rng.integers(0, 256, (24, 32), np.uint8)
    current = rng.integers(0, 256, (24, 32), np.uint8)
    same = warp_current(previous, current, np.eye(3))
    np.testing.assert_array_equal(same[6:-6, 6:-6], current[6:-6, 6:-6])
    np.testing.assert_array_equal(same[:4], previous[:4])  # within 5 px of the border
    shift = np.array([[1.0, 0, 2], [0, 1, 0], [0, 0, 1]])  # w(p) = current(p + (2, 0))
    moved = warp_current(previous, current, shift)
    np.testing.assert_array_equal(moved[8:-8, 8:-8], current[8:-8, 10:-6])


def test_the_camera_is_still_without_enough_matches_and_found_with_them():
    from featpipe.extract.trajectories import CameraMotion

    rng = np.random.default_rng(1)
    texture = (rng.random((80, 100)) * 255).astype(np.uint8)
    texture = np.asarray(np.kron(texture, np.ones((2, 2))), np.uint8)[:120, :160]
    camera = CameraMotion("corners")
    flat = np.full((120, 160), 128, np.uint8)
    no_flow = np.zeros((120, 160, 2), np.float32)
    mask = np.ones((120, 160), np.uint8)
    np.testing.assert_array_equal(camera.homography(flat, flat, no_flow, mask), np.eye(3))
    pan = np.zeros((120, 160, 2), np.float32)
    pan[..., 0] = 3.0  # every corner moves 3 px to the right
    found = camera.homography(texture, texture, pan, mask)
    np.testing.assert_allclose(found, [[1, 0, 3], [0, 1, 0], [0, 0, 1]], atol=1e-6)
    for keypoints in ("orb", "sift"):
        matcher = CameraMotion(keypoints)
        matcher.keypoints(texture, mask)
        before, after = matcher.keypoint_matches(texture, mask)
        assert len(before) > 50
        np.testing.assert_allclose(before, after, atol=1e-4)  # the same frame: themselves


def _corners_moved(monkeypatch, n_inliers: int, n_outliers: int):
    """Frames whose Shi-Tomasi corners are the points given here, inliers moved 3 px right
    by the flow and outliers 10-40 px each in its own direction (no other consensus)."""
    rng = np.random.default_rng(2)
    grid = np.array([(8 + 6 * (k % 20), 8 + 6 * (k // 20)) for k in range(n_inliers +
                                                                          n_outliers)],
                    np.float32)
    flow = np.zeros((120, 160, 2), np.float32)
    for k, (x, y) in enumerate(grid.astype(int)):
        if k < n_inliers:
            flow[y, x] = (3.0, 0.0)
        else:
            angle, length = rng.uniform(0, 2 * np.pi), rng.uniform(10, 40)
            flow[y, x] = (length * np.cos(angle), length * np.sin(angle))
    monkeypatch.setattr(trajectories.cv2, "goodFeaturesToTrack",
                        lambda *args, **kwargs: grid.reshape(-1, 1, 2).copy())
    return flow


@pytest.mark.parametrize(("inliers", "outliers", "moved"), [
    (50, 0, False), (51, 0, True),  # more than 50 matches are needed
    (25, 35, False), (26, 34, True),  # and more than 25 inliers of RANSAC's homography
])
def test_the_camera_needs_over_fifty_matches_and_over_twenty_five_inliers(
        monkeypatch, inliers, outliers, moved):
    from featpipe.extract.trajectories import CameraMotion

    flow = _corners_moved(monkeypatch, inliers, outliers)
    grey = np.zeros((120, 160), np.uint8)
    found = CameraMotion("corners").homography(grey, grey, flow, np.ones_like(grey))
    expected = [[1, 0, 3], [0, 1, 0], [0, 0, 1]] if moved else np.eye(3)
    np.testing.assert_allclose(found, expected, atol=1e-4)


def test_the_release_defaults_and_which_method_takes_peoples_boxes():
    assert DenseTrajectories().get_params() == {
        "step": 5, "n_scales": 8, "scale_factor": 1 / math.sqrt(2), "quality": 0.001,
        "track_length": 15, "patch_size": 32, "n_xy_cells": 2, "n_t_cells": 3,
        "flow": "farneback", "descriptors": "trajectory,hog,hof,mbh"}
    assert ImprovedDenseTrajectories().keypoints == "orb"
    assert DenseTrajectories.takes_boxes is False and ImprovedDenseTrajectories.takes_boxes


@pytest.mark.parametrize(("name", "value"), [
    ("step", 0), ("n_scales", 0), ("scale_factor", 1.0), ("quality", -0.1),
    ("quality", 1.0), ("track_length", 1), ("patch_size", 1), ("n_xy_cells", 0),
    ("n_t_cells", 0), ("flow", "lucas-kanade")])
def test_each_parameter_out_of_its_range_is_refused(name, value):
    with pytest.raises(ParameterError, match=name):
        DenseTrajectories.check_param_values({name: value})
    for use in (lambda e: e.count(64, 64), lambda e: e.start(64, 64), lambda e: e.groups()):
        with pytest.raises(ParameterError, match=name):
            use(DenseTrajectories(**{name: value}))


def test_a_descriptor_spec_is_checked_with_the_other_parameters():
    with pytest.raises(ParameterError, match="unknown group 'sift'"):
        DenseTrajectories.check_param_values({"descriptors": "hog,sift"})
    with pytest.raises(ParameterError, match="must be a comma-separated string of groups, got 3"):
        parse_descriptors(3)


def test_dense_samples_are_float32_points_and_none_in_a_frame_smaller_than_a_cell():
    from featpipe.extract.trajectories import dense_sample

    grey = np.asarray(np.random.default_rng(0).random((20, 30)) * 255, np.uint8)
    empty = np.zeros((0, 20, 2), np.float32)
    points = dense_sample(grey, 5, 0.001, empty, np.zeros(0, np.intp), np.zeros(0, bool))
    assert points.dtype == np.float32 and len(points) > 0
    assert set(points[:, 0] % 5) == {2.0} and set(points[:, 1] % 5) == {2.0}
    tiny = dense_sample(grey[:3, :3], 5, 0.001, empty, np.zeros(0, np.intp),
                        np.zeros(0, bool))
    assert tiny.shape == (0, 2) and tiny.dtype == np.float32


def test_keypoints_are_matched_with_the_frame_before():
    from featpipe.extract.trajectories import CameraMotion

    rng = np.random.default_rng(3)
    texture = np.asarray(np.kron(rng.random((60, 80)) * 255, np.ones((2, 2))), np.uint8)
    shifted = np.zeros_like(texture)
    shifted[:, 5:] = texture[:, :-5]  # the scene 5 px to the right
    mask = np.ones_like(texture)
    camera = CameraMotion("orb")
    camera.keypoints(texture, mask)
    before, after = camera.keypoint_matches(shifted, mask)
    moves = after - before
    assert len(moves) > 50 and np.median(moves[:, 0]) == pytest.approx(5, abs=0.5)
    flat = np.full_like(texture, 128)  # no keypoint at all: no match, no error
    before, after = camera.keypoint_matches(flat, mask)
    assert before.shape == after.shape == (0, 2)
    before, after = camera.keypoint_matches(texture, mask)  # after a frame without any
    assert before.shape == (0, 2)


def test_idt_takes_every_parameter_and_dt_s_defaults():
    params = {"step": 3, "n_scales": 2, "scale_factor": 0.5, "quality": 0.01,
              "track_length": 9, "patch_size": 16, "n_xy_cells": 4, "n_t_cells": 3,
              "flow": "dis", "descriptors": "hog", "keypoints": "sift"}
    assert ImprovedDenseTrajectories(**params).get_params() == params
    assert ImprovedDenseTrajectories().get_params() == {
        **DenseTrajectories().get_params(), "keypoints": "orb"}


def test_tracks_are_kept_in_float32_slots():
    from featpipe.extract.trajectories import _ScaleTracks

    tracks = _ScaleTracks(15, 3, 10, camera=True)
    assert tracks.points.shape == (0, 16, 2) and tracks.sums.shape == (0, 3, 10)
    assert tracks.displacements.shape == (0, 15, 2)
    assert {a.dtype for a in (tracks.points, tracks.sums, tracks.displacements)} == \
        {np.dtype(np.float32)}


def test_dense_samples_are_the_grid_points_over_the_eigenvalue_threshold():
    """The release's DenseSample: the cell centres (x, y) = (j·step + ⌊step/2⌋, i·step +
    ⌊step/2⌋) whose minimum eigenvalue (3×3 Sobel, 3×3 block) is over quality × the largest,
    row by row, but in cells where a live track ends."""
    import cv2

    from featpipe.extract.trajectories import dense_sample

    rng = np.random.default_rng(5)
    grey = np.asarray(np.kron(rng.random((12, 16)) * 255, np.ones((3, 3))), np.uint8)
    eig = cv2.cornerMinEigenVal(grey, 3, ksize=3)
    step, quality = 4, 0.2
    expected = [(x, y) for y in range(step // 2, 36 - step // 2 + 1, step)
                for x in range(step // 2, 48 - step // 2 + 1, step)
                if y < (36 // step) * step and x < (48 // step) * step
                and eig[y, x] > quality * eig.max()]
    live = np.array([[[float(expected[0][0]), float(expected[0][1])]]], np.float32)
    points = dense_sample(grey, step, quality, live, np.zeros(1, np.intp),
                          np.ones(1, bool))
    assert [tuple(p) for p in points.tolist()] == expected[1:]  # the first cell is taken
    points = dense_sample(grey, step, quality, live, np.zeros(1, np.intp),
                          np.zeros(1, bool))  # a track that ended frees its cell
    assert [tuple(p) for p in points.tolist()] == expected


def test_keypoints_are_matched_within_25_pixels_only():
    from featpipe.extract.trajectories import CameraMotion

    rng = np.random.default_rng(3)
    texture = np.asarray(np.kron(rng.random((60, 80)) * 255, np.ones((2, 2))), np.uint8)
    shifted = np.zeros_like(texture)
    shifted[:, 40:] = texture[:, :-40]  # the scene 40 px to the right: beyond the window
    mask = np.ones_like(texture)
    camera = CameraMotion("orb")
    camera.keypoints(texture, mask)
    before, after = camera.keypoint_matches(shifted, mask)
    assert len(before) and np.abs(after - before).max() <= 25
    fresh = CameraMotion("orb")  # no frame before: no match
    assert fresh.keypoint_matches(texture, mask)[0].shape == (0, 2)


def test_the_camera_leaves_people_out_of_the_corners(monkeypatch):
    from featpipe.extract.trajectories import CameraMotion

    seen = []
    monkeypatch.setattr(trajectories.cv2, "goodFeaturesToTrack",
                        lambda *args, **kwargs: seen.append(kwargs.get("mask")))
    grey = np.zeros((20, 30), np.uint8)
    mask = people_mask(20, 30, np.array([[2.0, 2.0, 9.0, 9.0]]))
    found = CameraMotion("corners").homography(grey, grey, np.zeros((20, 30, 2), np.float32),
                                               mask)
    np.testing.assert_array_equal(found, np.eye(3))
    assert seen[0] is mask


def test_ransac_counts_as_inliers_only_matches_within_one_pixel(monkeypatch):
    """10 matches moved 3 px right, 41 moved 3 px right and then 1.6 px in a direction of
    their own: within 2 or 3 px (OpenCV's default threshold) over 25 agree, within the
    release's 1 px fewer than 20 (too few for a homography)."""
    from featpipe.extract.trajectories import CameraMotion

    flow = _corners_moved(monkeypatch, 51, 0)
    grid = trajectories.cv2.goodFeaturesToTrack(None).reshape(-1, 2).astype(int)
    angles = np.random.default_rng(2).uniform(0, 2 * np.pi, 41)
    for (x, y), angle in zip(grid[10:], angles, strict=True):
        flow[y, x] = (3.0 + 1.6 * np.cos(angle), 1.6 * np.sin(angle))
    grey = np.zeros((120, 160), np.uint8)
    found = CameraMotion("corners").homography(grey, grey, flow, np.ones_like(grey))
    np.testing.assert_allclose(found, np.eye(3))


def test_the_parameters_lowest_values_are_allowed():
    DenseTrajectories.check_param_values({"step": 1, "n_scales": 1, "quality": 0.0,
                                          "track_length": 2, "patch_size": 2,
                                          "n_xy_cells": 1, "n_t_cells": 1})


def test_the_validity_limits_are_exclusive():
    """A std of exactly √3 is not static, one of exactly 50 not erratic, a largest step of
    exactly 20 px (or of exactly 0.7 of the length) not a jump."""
    deviations = np.array([3.0, -1.0, -1.0, -1.0])  # mean square 3: std √3 exactly
    at_min = np.stack([10 + deviations, 10 + deviations], axis=1)
    at_max = np.array([[0.0, 0.0], [100.0, 0.0], [0.0, 0.0], [100.0, 0.0]])  # std 50
    step_20 = np.array([[0.0, 0.0], [20.0, 0.0], [21.0, 0.0], [22.0, 0.0]])
    seven_tenths = np.array([[0.0, 0.0], [35.0, 0.0], [50.0, 0.0]])  # 35 = 0.7 x 50
    for points in (at_min, at_max, step_20, seven_tenths):
        assert trajectory_shapes(points[None].astype(np.float64))[0].tolist() == [True]


def test_a_short_trajectorys_shape_is_divided_by_its_length_under_one_pixel():
    points = np.array([[[0.0, 0.0], [0.25, 0.0], [0.5, 0.0]]])
    _, shape, _ = trajectory_shapes(points)
    np.testing.assert_allclose(shape, [[0.5, 0.0, 0.5, 0.0]])


def test_the_release_s_camera_parameters(monkeypatch):
    """Shi-Tomasi corners: at most 1000, quality 0.001, 3 px apart; keypoints matched within
    25 px; the flow engine made with the scales' ratio √2."""
    import featpipe.extract._trajectory_kernels as kernels
    from featpipe.extract.trajectories import CameraMotion

    calls = []
    monkeypatch.setattr(trajectories.cv2, "goodFeaturesToTrack",
                        lambda *args, **kwargs: calls.append(args[1:]))
    grey = np.zeros((20, 30), np.uint8)
    CameraMotion("corners").homography(grey, grey, np.zeros((20, 30, 2), np.float32),
                                       np.ones_like(grey))
    assert calls == [(1000, 0.001, 3)]
    radii = []
    real = kernels.match_window
    monkeypatch.setattr(kernels, "match_window",
                        lambda xy, prev, radius, out: radii.append(radius) or
                        real(xy, prev, radius, out))
    rng = np.random.default_rng(3)
    texture = np.asarray(np.kron(rng.random((60, 80)) * 255, np.ones((2, 2))), np.uint8)
    camera = CameraMotion("orb")
    camera.keypoints(texture, np.ones_like(texture))
    camera.keypoint_matches(texture, np.ones_like(texture))
    assert radii == [25]


def test_a_corner_on_the_last_pixel_takes_the_flow_there(monkeypatch):
    from featpipe.extract.trajectories import CameraMotion

    corners = np.array([[[159.6, 119.6]], [[-0.4, -0.4]]] * 30, np.float32)
    monkeypatch.setattr(trajectories.cv2, "goodFeaturesToTrack",
                        lambda *args, **kwargs: corners.copy())
    flow = np.zeros((120, 160, 2), np.float32)
    grey = np.zeros((120, 160), np.uint8)
    found = CameraMotion("corners").homography(grey, grey, flow, np.ones_like(grey))
    assert found.shape == (3, 3)


def test_new_trajectories_start_at_every_frame(constant_flow, monkeypatch):
    def every_frame(grey, step, quality, points, steps, alive):
        return np.array([[40.0, 10.0]], np.float32)

    monkeypatch.setattr(trajectories, "dense_sample", every_frame)
    estimator = DenseTrajectories(step=8, patch_size=PATCH, track_length=LENGTH,
                                  n_t_cells=T_CELLS, n_scales=1, descriptors="trajectory")
    _, out = run(estimator, LENGTH + 4)
    assert [len(frame.descriptors) for frame in out] == [0] * LENGTH + [1, 1, 1, 1]


def test_tracks_stay_float32_when_their_slots_grow():
    from featpipe.extract.trajectories import _ScaleTracks

    tracks = _ScaleTracks(15, 3, 10, camera=True)
    grey = np.asarray(np.random.default_rng(0).random((200, 200)) * 255, np.uint8)
    tracks.renew(grey, 5, 0.0)
    assert tracks.alive.sum() > 64
    assert {a.dtype for a in (tracks.points, tracks.sums, tracks.displacements)} == \
        {np.dtype(np.float32)}


def test_idt_leaves_peoples_boxes_out_of_the_camera_corners(monkeypatch, constant_flow):
    masks = []
    monkeypatch.setattr(trajectories.cv2, "goodFeaturesToTrack",
                        lambda *args, **kwargs: masks.append(kwargs["mask"]))
    tracker = ImprovedDenseTrajectories(step=8, patch_size=PATCH, track_length=LENGTH,
                                        n_t_cells=T_CELLS, n_scales=1,
                                        keypoints="corners").start(HEIGHT, WIDTH)
    for _ in range(2):
        tracker.add(ramp(), boxes=np.array([[10.0, 2.0, 30.0, 12.0]]))
    assert masks[0][2:13, 10:31].max() == 0 and masks[0][:, 40:].min() == 1
    masks.clear()
    dt = DenseTrajectories(step=8, patch_size=PATCH, track_length=LENGTH, n_scales=1)
    dt.start(HEIGHT, WIDTH).add(ramp())
    assert masks == []  # dt has no camera


def test_a_one_pixel_box_masks_its_pixel():
    mask = people_mask(6, 8, np.array([[4.0, 3.0, 4.0, 3.0]]))
    assert mask[3, 4] == 0 and mask.sum() == 6 * 8 - 1


@pytest.mark.parametrize("camera", [False, True])
def test_a_coarser_scales_trajectories_are_in_frame_pixels(constant_flow, monkeypatch,
                                                           camera):
    """Two scales (√2 apart): each keeps its point and moves 1 px a frame in its own pixels;
    the coarser one's positions, and (idt) its camera-compensated moves, are √2 times as
    large in frame pixels: idt keeps it (1.41 px > 1 px a frame) and drops the other."""
    height = 24
    monkeypatch.setattr(trajectories.cv2, "goodFeaturesToTrack",
                        lambda *args, **kwargs: None)
    cls = ImprovedDenseTrajectories if camera else DenseTrajectories
    estimator = cls(step=8, patch_size=PATCH, track_length=LENGTH, n_t_cells=T_CELLS,
                    n_scales=2, descriptors="trajectory",
                    **({"keypoints": "corners"} if camera else {}))
    tracker = estimator.start(height, WIDTH)
    frames = [tracker.add(np.repeat(ramp()[:1], height, axis=0)) for _ in range(LENGTH + 1)]
    sizes, scales, stride = ConstantFlow.made[-1][:3]
    assert scales == pytest.approx([1, math.sqrt(2)]) and stride == pytest.approx(math.sqrt(2))
    positions = frames[-1].positions
    coarse = [40 + LENGTH / 2, 10]
    expected = [[*(np.array(coarse) * math.sqrt(2)), math.sqrt(2)]]
    if not camera:
        expected = [[*coarse, 1.0], *expected]
    np.testing.assert_allclose(positions, expected, rtol=1e-5)
