"""Dense trajectories (``dt``) and improved dense trajectories (``idt``), streamed frame by frame.

Dense trajectories (Wang, Kläser, Schmid, Liu, IJCV 2013) and their improved version (Wang &
Schmid, ICCV 2013), re-implemented from the papers and the behaviour of the authors' releases
(DT v1.2 ``DenseTrack``, the improved ``DenseTrackStab``); no code of theirs is used.

Per video, :meth:`DenseTrajectories.start` gives a :class:`Tracker`; each frame given to
:meth:`Tracker.add` returns the trajectories that end there:

* scales s_k = (1/``scale_factor``)^k while the shorter side / s_k >= ``patch_size``; the grey
  frame resized bilinearly from scale to scale;
* points every ``step`` px where the minimum eigenvalue of the structure tensor exceeds
  ``quality`` × its frame maximum, in grid cells with no tracked point (first frame, then
  every frame: :func:`dense_sample`);
* p_{t+1} = p_t + ω_t(round(p_t)), ω the median-filtered flow of the scale
  (:mod:`featpipe.extract.optical_flow`); a point leaving the frame ends its track unseen;
* after ``track_length`` steps the track is pruned (:func:`trajectory_shapes`) or emitted:
  shape Δp / Σ‖Δp‖, and per frame the HOG, HOF, MBHx, MBHy blocks of ``n_xy_cells``² cells
  of a ``patch_size`` square at p_t (integral histograms, bins + 0.05, L1 then square root),
  averaged over each of ``n_t_cells`` time cells;
* ``idt`` (:class:`CameraMotion`): a homography per frame pair by RANSAC on keypoint and flow
  matches, people's boxes masked; the flow against the warped frame gives HOF, MBH and the
  shape, and drops tracks whose compensated steps are all <= 1 px.

The definitions in full: docs/methods.md; the choices and the differences from the release:
docs/extraction.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

import cv2
import numpy as np

from featpipe.errors import InputError, ParameterError
from featpipe.extract import _trajectory_kernels as kernels
from featpipe.extract.features import FeatureMethod
from featpipe.parameters import DeclaredEstimator, DeclaredInterval, DeclaredOptions

#: the descriptor groups and their sizes with the default parameters, in the release's order
GROUPS = {"trajectory": 30, "hog": 96, "hof": 108, "mbhx": 96, "mbhy": 96}
#: orientation bins of each histogram group (HOF's last bin is the zero-flow bin)
BINS = {"hog": 8, "hof": 9, "mbhx": 8, "mbhy": 8}
FLOWS = ("farneback", "dis")
KEYPOINTS = ("orb", "sift", "corners")
#: the release's ratio of neighbouring spatial scales
SCALE_FACTOR = 1 / math.sqrt(2)
#: the release's constants: a histogram cell's bins get EPSILON added before the L1
#: normalisation; flow no longer than MIN_FLOW px goes to HOF's zero bin; trajectories whose
#: x and y standard deviations are both below MIN_STD px are static, either above MAX_STD
#: erratic; a step longer than MAX_STEP px and 0.7 of the trajectory's length is a jump; an
#: idt trajectory whose camera-compensated steps are all at most CAMERA_MIN_MOVE px followed
#: the camera
EPSILON = 0.05
MIN_FLOW = 0.4
MIN_STD = math.sqrt(3)
MAX_STD = 50.0
MAX_STEP = 20.0
CAMERA_MIN_MOVE = 1.0


def parse_descriptors(spec: str) -> tuple[str, ...]:
    """The groups named by ``spec`` in :data:`GROUPS` order: ``"hog,hof,mbh"`` gives
    ``("hog", "hof", "mbhx", "mbhy")``; ``mbh`` is mbhx and mbhy; ``all`` (or an empty
    string) is every group."""
    if not isinstance(spec, str):
        raise ParameterError("descriptors", f"must be a comma-separated string of groups, got "
                             f"{spec!r}")
    names = [name.strip().lower() for name in spec.split(",") if name.strip()]
    chosen: set[str] = set()
    for name in names or ["all"]:
        if name == "all":
            chosen.update(GROUPS)
        elif name == "mbh":
            chosen.update(("mbhx", "mbhy"))
        elif name in GROUPS:
            chosen.add(name)
        else:
            raise ParameterError("descriptors", f"has an unknown group {name!r}: use "
                                 f"{', '.join([*GROUPS, 'mbh', 'all'])}")
    return tuple(name for name in GROUPS if name in chosen)


@dataclass
class TrajectoryFrame:
    """The trajectories that end at one frame: ``descriptors`` (N, n_features) float32, the
    selected groups concatenated; ``positions`` (N, 3) float32: mean x, mean y (frame
    pixels) and the scale (1, √2, 2, ...)."""

    descriptors: np.ndarray
    positions: np.ndarray


class DenseTrajectories(DeclaredEstimator):
    """Dense trajectories (Wang, Kläser, Schmid, Liu, IJCV 2013), one video at a time.

    Parameters
    ----------
    step : int
        Dense sampling stride in pixels at every scale (the release's ``-W``: 5).
    n_scales : int
        Most spatial scales (``-A``: 8); fewer where the frame is small (the smallest scale
        keeps its shorter side >= patch_size).
    scale_factor : float
        Size ratio of neighbouring scales (1/√2).
    quality : float
        Points whose minimum eigenvalue of the structure tensor is at most quality times the
        frame's largest are not sampled (homogeneous areas; 0.001).
    track_length : int
        Frames a trajectory is tracked (``-L``: 15).
    patch_size : int
        Side of the descriptor's volume in pixels of its scale (``-N``: 32).
    n_xy_cells : int
        Cells along x and y (``-s``: 2).
    n_t_cells : int
        Cells along time (``-t``: 3).
    flow : {"farneback", "dis"}
        Optical flow: OpenCV's Farnebäck with the release's parameters, per scale with a
        median filter, or OpenCV's DIS (ultrafast preset; faster, less accurate where
        motion is slow).
    descriptors : str
        Descriptor groups, comma-separated: trajectory, hog, hof, mbhx, mbhy, mbh (both),
        all.
    """

    #: whether :meth:`Tracker.add` uses people's boxes (idt's homography leaves them out)
    takes_boxes = False

    _parameter_constraints: dict = {
        "step": [DeclaredInterval(Integral, 1, None, closed="left")],
        "n_scales": [DeclaredInterval(Integral, 1, None, closed="left")],
        "scale_factor": [DeclaredInterval(Real, 0, 1, closed="neither")],
        "quality": [DeclaredInterval(Real, 0, 1, closed="left")],
        "track_length": [DeclaredInterval(Integral, 2, None, closed="left")],
        "patch_size": [DeclaredInterval(Integral, 2, None, closed="left")],
        "n_xy_cells": [DeclaredInterval(Integral, 1, None, closed="left")],
        "n_t_cells": [DeclaredInterval(Integral, 1, None, closed="left")],
        "flow": [DeclaredOptions(set(FLOWS))],
        "descriptors": [str],
    }

    def __init__(self, step=5, n_scales=8, scale_factor=SCALE_FACTOR, quality=0.001,
                 track_length=15, patch_size=32, n_xy_cells=2, n_t_cells=3, flow="farneback",
                 descriptors="trajectory,hog,hof,mbh"):
        self.step = step
        self.n_scales = n_scales
        self.scale_factor = scale_factor
        self.quality = quality
        self.track_length = track_length
        self.patch_size = patch_size
        self.n_xy_cells = n_xy_cells
        self.n_t_cells = n_t_cells
        self.flow = flow
        self.descriptors = descriptors

    @classmethod
    def _check_param_rules(cls, params) -> None:
        if "descriptors" in params:
            parse_descriptors(params["descriptors"])
        cells, size = params.get("n_xy_cells"), params.get("patch_size")
        if isinstance(cells, Integral) and isinstance(size, Integral) and cells > size:
            raise ParameterError("n_xy_cells", f"must be <= patch_size ({size}), got {cells}")
        cells, length = params.get("n_t_cells"), params.get("track_length")
        if isinstance(cells, Integral) and isinstance(length, Integral) and cells > length:
            raise ParameterError("n_t_cells", f"must be <= track_length ({length}), got "
                                 f"{cells}")

    def _check(self) -> None:
        self._validate_params()

    def group_sizes(self) -> dict[str, int]:
        """Values of every group with these parameters (:data:`GROUPS` with the defaults)."""
        cells = int(self.n_xy_cells) ** 2 * int(self.n_t_cells)
        sizes = {"trajectory": 2 * int(self.track_length)}
        sizes.update((name, bins * cells) for name, bins in BINS.items())
        return sizes

    def groups(self) -> list[tuple[str, slice]]:
        """The selected groups and their columns in a row of descriptors."""
        self._check()
        sizes = self.group_sizes()
        out, start = [], 0
        for name in parse_descriptors(self.descriptors):
            out.append((name, slice(start, start + sizes[name])))
            start += sizes[name]
        return out

    @property
    def n_features(self) -> int:
        """Values per trajectory: the sizes of the selected groups summed."""
        return sum(s.stop - s.start for _, s in self.groups())

    def scales(self, height: int, width: int) -> list[tuple[float, int, int]]:
        """(scale, height, width) of each spatial scale (the release's ``InitPry``): as many
        as ``n_scales`` while the shorter side, divided by the scale, stays >= patch_size;
        sizes rounded to the nearest pixel."""
        stride = 1.0 / float(self.scale_factor)
        side, layers = float(min(height, width)), 0
        while side >= int(self.patch_size):
            side /= stride
            layers += 1
        scales, out = 1.0, []
        for _ in range(min(int(self.n_scales), max(layers, 1))):
            out.append((scales, int(round(height / scales)), int(round(width / scales))))
            scales *= stride
        return out

    def usable(self, height: int, width: int) -> bool:
        """Whether a frame of that size holds a descriptor volume (and, for DIS flow, has a
        side of at least 12 px: OpenCV's DIS takes no smaller frame)."""
        from featpipe.extract.optical_flow import DISPyramid

        return (min(height, width) >= int(self.patch_size)
                and (self.flow != "dis" or max(height, width) >= DISPyramid.MIN_FRAME_SIDE))

    def count(self, height: int, width: int) -> int:
        """An upper bound of the trajectories that end at one frame: the sampling cells of
        every scale (a cell starts at most one trajectory per frame); 0 when too small."""
        self._check()
        if not self.usable(height, width):
            return 0
        step = int(self.step)
        return sum((h // step) * (w // step) for _, h, w in self.scales(height, width))

    def minimum_size(self) -> str:
        """The smallest usable frame, in words."""
        from featpipe.extract.optical_flow import DISPyramid

        side = int(self.patch_size)
        if self.flow == "dis" and side < DISPyramid.MIN_FRAME_SIDE:
            return (f"at least {side}x{side} with patch_size {side}, and a side of "
                    f"{DISPyramid.MIN_FRAME_SIDE} with flow dis")
        return f"at least {side}x{side} with patch_size {side}"

    def start(self, height: int, width: int) -> Tracker:
        """A tracker for one video of frames of that size."""
        self._check()
        return Tracker(self, int(height), int(width))


class ImprovedDenseTrajectories(DenseTrajectories):
    """Improved dense trajectories (Wang & Schmid, ICCV 2013): camera motion removed.

    Parameters
    ----------
    keypoints : {"orb", "sift", "corners"}
        Keypoints matched between frames for the homography, besides the flow's corner
        matches: ORB (500 per frame, Hamming distance: the fastest detector with descriptors
        in OpenCV's wheels, and what the release's ORB build uses), SIFT (500 per frame, L2
        distance: float descriptors like the release's SURF, several times slower) or
        corners (the flow's matches alone).  SURF is in neither the wheels nor Debian's
        OpenCV; AKAZE left OpenCV 5's main modules.
    """

    takes_boxes = True

    _parameter_constraints: dict = {
        **DenseTrajectories._parameter_constraints,
        "keypoints": [DeclaredOptions(set(KEYPOINTS))],
    }

    def __init__(self, step=5, n_scales=8, scale_factor=SCALE_FACTOR, quality=0.001,
                 track_length=15, patch_size=32, n_xy_cells=2, n_t_cells=3, flow="farneback",
                 descriptors="trajectory,hog,hof,mbh", keypoints="orb"):
        super().__init__(step=step, n_scales=n_scales, scale_factor=scale_factor,
                         quality=quality, track_length=track_length, patch_size=patch_size,
                         n_xy_cells=n_xy_cells, n_t_cells=n_t_cells, flow=flow,
                         descriptors=descriptors)
        self.keypoints = keypoints


class _ScaleTracks:
    """The trajectories being tracked at one scale, in slots: points (C, L + 1, 2) in the
    scale's pixels, how many steps each has made, its histogram sums per time cell and (idt)
    its camera-compensated displacements (C, L, 2); ``alive`` marks the slots in use.  New
    tracks take the lowest free slots (when none is left, the capacity grows by what is
    missing and a quarter: the sums, 3.4 KB a track, are most of a tracker's memory), so
    nothing is copied from frame to frame."""

    def __init__(self, length: int, n_t_cells: int, width: int, camera: bool):
        self.points = np.zeros((0, length + 1, 2), np.float32)
        self.steps = np.zeros(0, np.intp)
        self.sums = np.zeros((0, n_t_cells, width), np.float32)
        self.displacements = np.zeros((0, length, 2), np.float32)   # no rows for dt
        self.camera = camera
        self.alive = np.zeros(0, bool)

    def renew(self, grey: np.ndarray, step: int, quality: float) -> None:
        """Start new tracks at the points :func:`dense_sample` picks in ``grey`` around the
        live tracks, in the lowest free slots."""
        new = dense_sample(grey, step, quality, self.points, self.steps, self.alive)
        while not kernels.start_tracks(new, self.points, self.steps, self.sums,
                                       self.displacements, self.alive):
            grow = len(new) - int((~self.alive).sum()) + max(len(self.alive) // 4, 64)
            self.points = np.concatenate([self.points, np.zeros((grow,) + self.points.shape[1:],
                                                                np.float32)])
            self.steps = np.concatenate([self.steps, np.zeros(grow, np.intp)])
            self.sums = np.concatenate([self.sums, np.zeros((grow,) + self.sums.shape[1:],
                                                            np.float32)])
            if self.camera:
                self.displacements = np.concatenate([
                    self.displacements,
                    np.zeros((grow,) + self.displacements.shape[1:], np.float32)])
            self.alive = np.concatenate([self.alive, np.zeros(grow, bool)])


def dense_sample(grey: np.ndarray, step: int, quality: float, points: np.ndarray,
                 steps: np.ndarray, alive: np.ndarray) -> np.ndarray:
    """New points (M, 2) on a grid of ``step`` pixels, at (j·step + ⌊step/2⌋, i·step +
    ⌊step/2⌋), in cells that hold no live track's last point (``points[i, steps[i]]`` where
    ``alive[i]``) and where the minimum eigenvalue of the structure tensor (3×3 Sobel, 3×3
    window) exceeds ``quality`` times its maximum over the frame (Shi & Tomasi, CVPR 1994;
    the release's ``DenseSample``); row-major order."""
    height, width = grey.shape
    out = np.empty(((height // step) * (width // step), 2), np.float32)
    if not len(out):
        return out
    eig = cv2.cornerMinEigenVal(grey, 3, ksize=3)
    return out[:kernels.grid_points(eig, float(quality), step, points, steps, alive, out)]


def trajectory_shapes(points: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The release's ``IsValid`` on (M, L + 1, 2) points in frame pixels: (valid mask, shape
    (M, 2L) = displacements / Σ|displacement|, mean position (M, 2)).

    Static (std of x and of y both < √3), erratic (either std > 50) and jumping (a largest
    displacement > 20 px and > 0.7 of the whole length) trajectories are invalid."""
    mean = points.mean(axis=1)
    std = np.sqrt(((points - mean[:, None]) ** 2).mean(axis=1))
    steps = np.diff(points, axis=1)
    magnitude = np.sqrt((steps ** 2).sum(axis=2))
    length = magnitude.sum(axis=1)
    largest = magnitude.max(axis=1)
    valid = ~((std[:, 0] < MIN_STD) & (std[:, 1] < MIN_STD))
    valid &= ~((std[:, 0] > MAX_STD) | (std[:, 1] > MAX_STD))
    valid &= ~((largest > MAX_STEP) & (largest > 0.7 * length))
    shape = steps / np.where(length > 0, length, 1)[:, None, None]
    return valid, shape.reshape(len(points), -1).astype(np.float32), mean


class CameraMotion:
    """The homography between two frames (the improved trajectories' camera motion).

    Matches: keypoints of the previous and the current frame (ORB, Hamming distance, or
    SIFT, L2 distance; each current keypoint's nearest previous one within 25 px
    along x and y), plus Shi–Tomasi corners of the previous frame (at most 1000, quality
    0.001, 3 px apart) moved by the flow.  People's boxes are masked out of both.  With more
    than 50 matches, a RANSAC homography (OpenCV's ``findHomography``: 1 px reprojection
    threshold, confidence 0.995, at most 2000 iterations, Levenberg–Marquardt on the inliers)
    is kept when it has more than 25 inliers; otherwise the identity (the release's rules).

    Reproducible: OpenCV's RANSAC draws its samples from a generator it seeds with a fixed
    state at every call (``RNG((uint64)-1)`` in ``ptsetreg.cpp``), so equal matches give
    equal homographies, whatever the global seed (``cv2.setRNGSeed`` has no effect on it).
    OpenCV's USAC with a chosen seed was tried and left out: its homographies differ from the
    classic RANSAC's by about 1 px at the frame corners, enough to change 15 % of the
    trajectories of a clip against the release.
    """

    def __init__(self, keypoints: str):
        self.detector = {"orb": lambda: cv2.ORB_create(500),
                         "sift": lambda: cv2.SIFT_create(500),
                         "corners": lambda: None}[keypoints]()
        self.matcher = cv2.BFMatcher(cv2.NORM_L2 if keypoints == "sift" else cv2.NORM_HAMMING)
        self.previous = None

    def keypoints(self, grey: np.ndarray, mask: np.ndarray) -> None:
        """Detect the keypoints of the frame that becomes the previous one."""
        if self.detector is None:
            return
        keypoints, descriptors = self.detector.detectAndCompute(grey, mask)
        positions = (cv2.KeyPoint_convert(keypoints).reshape(-1, 2) if len(keypoints)
                     else np.zeros((0, 2), np.float32))
        self.previous = (positions, descriptors)

    def keypoint_matches(self, grey: np.ndarray, mask: np.ndarray):
        previous = self.previous
        self.keypoints(grey, mask)
        if self.detector is None or previous is None:
            return np.zeros((0, 2), np.float32), np.zeros((0, 2), np.float32)
        (prev_xy, prev_desc), (xy, desc) = previous, self.previous
        if prev_desc is None or desc is None or not len(prev_xy) or not len(xy):
            return np.zeros((0, 2), np.float32), np.zeros((0, 2), np.float32)
        window = np.empty((len(xy), len(prev_xy)), np.uint8)
        kernels.match_window(xy, prev_xy, np.float32(25), window)
        matches = self.matcher.match(desc, prev_desc, window)
        query = np.array([m.queryIdx for m in matches], np.intp)
        train = np.array([m.trainIdx for m in matches], np.intp)
        return prev_xy[train], xy[query]

    def homography(self, prev_grey: np.ndarray, grey: np.ndarray, flow: np.ndarray,
                   mask: np.ndarray) -> np.ndarray:
        """H (3 × 3) with current ≈ H · previous (homogeneous pixel coordinates)."""
        prev_kp, kp = self.keypoint_matches(grey, mask)
        corners = cv2.goodFeaturesToTrack(prev_grey, 1000, 0.001, 3, mask=mask)
        corners = (np.zeros((0, 2), np.float32) if corners is None
                   else corners.reshape(-1, 2).astype(np.float32))
        height, width = prev_grey.shape
        xi = np.clip(np.rint(corners[:, 0]), 0, width - 1).astype(np.intp)
        yi = np.clip(np.rint(corners[:, 1]), 0, height - 1).astype(np.intp)
        moved = np.stack([xi, yi], axis=1).astype(np.float32) + flow[yi, xi]
        src = np.concatenate([corners, prev_kp]).astype(np.float32)
        dst = np.concatenate([moved, kp]).astype(np.float32)
        if len(src) <= 50:
            return np.eye(3)
        found, inliers = cv2.findHomography(src, dst, cv2.RANSAC, 1.0, maxIters=2000,
                                            confidence=0.995)
        if found is None or inliers is None or int(inliers.sum()) <= 25:
            return np.eye(3)
        return found


def people_mask(height: int, width: int, boxes: np.ndarray | None) -> np.ndarray:
    """uint8 mask, 0 inside the boxes (x1, y1, x2, y2; pixels ⌈x1⌉..⌊x2⌋ inclusive)."""
    mask = np.ones((height, width), np.uint8)
    if boxes is None or not np.size(boxes):
        return mask
    for x1, y1, x2, y2 in np.atleast_2d(np.asarray(boxes, np.float64))[:, :4]:
        top, left = max(int(math.ceil(y1)), 0), max(int(math.ceil(x1)), 0)
        bottom, right = min(int(math.floor(y2)), height - 1), min(int(math.floor(x2)), width - 1)
        if bottom >= top and right >= left:
            mask[top:bottom + 1, left:right + 1] = 0
    return mask


def warp_current(prev_grey: np.ndarray, grey: np.ndarray, homography: np.ndarray
                 ) -> np.ndarray:
    """The current frame in the previous frame's coordinates, w(p) = current(H·p) (bilinear);
    where H·p falls within 5 px of the border (or outside) the previous frame's pixel."""
    height, width = grey.shape
    map_x, map_y = np.empty((height, width), np.float32), np.empty((height, width), np.float32)
    inside = np.empty((height, width), bool)
    kernels.homography_maps(np.asarray(homography, np.float64), np.float32(5), map_x, map_y,
                            inside)
    warped = cv2.remap(grey, map_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT,
                       borderValue=0)
    return np.where(inside, warped, prev_grey)


class Tracker:
    """The state of one video: the last frame's pyramids and the trajectories being tracked.

    :meth:`add` takes one frame after another and returns the trajectories that end there.
    It holds two frames' pyramids and at most one trajectory per sampling cell and frame of
    the last ``track_length`` frames, whatever the video's length.
    """

    def __init__(self, estimator: DenseTrajectories, height: int, width: int):
        from featpipe.extract.optical_flow import DISPyramid, FarnebackPyramid, level_scales

        self.height, self.width = height, width
        self.groups = estimator.groups()
        self.n_features = sum(s.stop - s.start for _, s in self.groups)
        self.length = int(estimator.track_length)
        self.step = int(estimator.step)
        self.quality = float(estimator.quality)
        self.patch = int(estimator.patch_size)
        self.n_cells = int(estimator.n_xy_cells)
        self.n_t_cells = int(estimator.n_t_cells)
        self.t_stride = self.length // self.n_t_cells
        self.usable = estimator.usable(height, width)
        levels = estimator.scales(height, width) if self.usable else []
        self.scales = level_scales(len(levels), 1 / float(estimator.scale_factor))
        self.sizes = [(int(round(height / s)), int(round(width / s))) for s in self.scales]
        self.histograms = [name for name, _ in self.groups if name in BINS]
        block = self.n_cells * self.n_cells
        self.columns, width_sum = {}, 0
        for name in self.histograms:
            self.columns[name] = width_sum
            width_sum += BINS[name] * block
        self.block_width = width_sum
        order = list(BINS)
        self.kernel_groups = (
            np.array([9 * order.index(name) for name in self.histograms], np.intp),
            np.array([BINS[name] for name in self.histograms], np.intp),
            np.array([self.columns[name] for name in self.histograms], np.intp))
        self.camera = None
        if isinstance(estimator, ImprovedDenseTrajectories):
            self.camera = CameraMotion(estimator.keypoints)
        stride = 1 / float(estimator.scale_factor)
        self.flow_engine = (None if not self.usable
                            else DISPyramid(self.sizes, self.scales) if estimator.flow == "dis"
                            else FarnebackPyramid(self.sizes, self.scales, stride))
        #: the ring of integral-histogram rows advance_tracks makes, shared by the scales
        ring = kernels.integral_ring(self.patch + 1, width)
        channels = ring.shape[2]
        self.rows = [ring.reshape(-1)[:(self.patch + 1) * (w + 1) * channels].reshape(
            self.patch + 1, w + 1, channels) for _, w in self.sizes]
        self.constants = np.float32(EPSILON), np.float32(MIN_FLOW)
        self.tracks = [_ScaleTracks(self.length, self.n_t_cells, self.block_width,
                                    self.camera is not None) for _ in self.scales]
        self.frame = 0
        self.previous = None

    def _empty(self) -> TrajectoryFrame:
        return TrajectoryFrame(np.zeros((0, self.n_features), np.float32),
                               np.zeros((0, 3), np.float32))

    def _pyramid(self, grey: np.ndarray) -> list[np.ndarray]:
        levels = [grey]
        for height, width in self.sizes[1:]:
            levels.append(cv2.resize(levels[-1], (width, height),
                                     interpolation=cv2.INTER_LINEAR))
        return levels

    def add(self, rgb_frame: np.ndarray, boxes: np.ndarray | None = None) -> TrajectoryFrame:
        """Track one (H, W, 3) uint8 RGB frame; ``boxes`` (B, 4) x1, y1, x2, y2 of people
        (idt: left out of the homography).  Returns the trajectories ending at this frame."""
        frame = np.asarray(rgb_frame)
        if frame.ndim < 2 or frame.shape[:2] != (self.height, self.width):
            raise InputError(f"frame {self.frame} has shape {frame.shape}, the video's first "
                             f"was {self.width}x{self.height}")
        if frame.dtype != np.uint8 or not (frame.ndim == 2 or frame.shape[2] in (1, 3, 4)):
            raise InputError(f"frame {self.frame} is {frame.dtype} of shape {frame.shape}: "
                             "dense trajectories take uint8 grey or RGB frames")
        if boxes is not None:
            boxes = np.asarray(boxes, np.float64)
            if boxes.size and (boxes.ndim != 2 or boxes.shape[1] < 4
                               or not np.isfinite(boxes[:, :4]).all()):
                raise InputError(f"frame {self.frame}: people's boxes must be finite rows of "
                                 f"x1, y1, x2, y2, got shape {boxes.shape}")
        self.frame += 1
        if not self.usable:
            return self._empty()
        if frame.ndim == 3 and frame.shape[2] >= 3:
            grey = cv2.cvtColor(np.ascontiguousarray(frame[:, :, :3]), cv2.COLOR_RGB2GRAY)
        else:
            grey = np.ascontiguousarray(frame.reshape(self.height, self.width))
        pyramid = self._pyramid(grey)
        expansion = self.flow_engine.expand(grey)
        mask = people_mask(self.height, self.width, boxes) if self.camera is not None else None
        if self.previous is None:
            for tracks, level in zip(self.tracks, pyramid, strict=True):
                tracks.renew(level, self.step, self.quality)
            if self.camera is not None:
                self.camera.keypoints(grey, mask)
            self.previous = (grey, pyramid, expansion)
            return self._empty()
        prev_grey, prev_pyramid, prev_expansion = self.previous
        flows = self.flow_engine.flow(prev_expansion, expansion)
        descriptor_flows = flows
        if self.camera is not None:
            homography = self.camera.homography(prev_grey, grey, flows[0], mask)
            warped = warp_current(prev_grey, grey, homography)
            descriptor_flows = self.flow_engine.flow(prev_expansion,
                                                     self.flow_engine.expand(warped))
        ended = []
        for k, tracks in enumerate(self.tracks):
            out = self._step(k, tracks, prev_pyramid[k], flows[k], descriptor_flows[k])
            if out is not None:
                ended.append(out)
            tracks.renew(pyramid[k], self.step, self.quality)
        self.previous = (grey, pyramid, expansion)
        if not ended:
            return self._empty()
        return self._describe(*(np.concatenate(parts) for parts in zip(*ended, strict=True)))

    def _step(self, k: int, tracks: _ScaleTracks, prev_level: np.ndarray, flow: np.ndarray,
              descriptor_flow: np.ndarray):
        """Move the tracks of scale k by one frame (those leaving the frame end, unseen), add
        their descriptors at their previous points, and return those that reach
        ``track_length`` steps: (points and displacements in frame pixels, histogram sums,
        scales) or None."""
        if not kernels.advance_tracks(tracks.points, tracks.steps, flow, prev_level,
                                      descriptor_flow, tracks.displacements,
                                      *self.kernel_groups, self.patch, self.n_cells,
                                      self.t_stride, self.n_t_cells, *self.constants,
                                      tracks.sums, tracks.alive, self.rows[k]):
            return None
        ended = np.flatnonzero(tracks.alive & (tracks.steps >= self.length))
        tracks.alive[ended] = False
        scale = np.float32(self.scales[k])
        moves = (tracks.displacements[ended] * scale if tracks.camera
                 else np.empty((len(ended), 0, 2), np.float32))
        return (tracks.points[ended] * scale, moves, tracks.sums[ended],
                np.full(len(ended), scale))

    def _describe(self, points: np.ndarray, moves: np.ndarray, sums: np.ndarray,
                  scales: np.ndarray) -> TrajectoryFrame:
        """The valid trajectories among those that ended (of every scale at once)."""
        valid, shape, mean = trajectory_shapes(points)
        if self.camera is not None:
            magnitude = np.sqrt((moves ** 2).sum(axis=2))
            valid &= magnitude.max(axis=1) > CAMERA_MIN_MOVE
            total = magnitude.sum(axis=1)
            shape = (moves / np.where(total > 0, total, 1)[:, None, None]).reshape(len(moves), -1)
        sums = sums[valid] / np.float32(self.t_stride)
        shape, mean = shape[valid], mean[valid]
        descriptors = np.empty((len(shape), self.n_features), np.float32)
        for name, columns in self.groups:
            if name == "trajectory":
                descriptors[:, columns] = shape
            else:
                start = self.columns[name]
                size = columns.stop - columns.start
                per_cell = size // self.n_t_cells
                descriptors[:, columns] = sums[:, :, start:start + per_cell].reshape(-1, size)
        positions = np.empty((len(shape), 3), np.float32)
        positions[:, :2] = mean
        positions[:, 2] = scales[valid]
        return TrajectoryFrame(descriptors, positions)


#: tracking needs consecutive frames: both methods read every frame unless told otherwise
FEATURE_METHODS = [
    FeatureMethod("dt", "dense trajectories (local: trajectory, HOG, HOF, MBH)",
                  DenseTrajectories, "dense trajectories"),
    FeatureMethod("idt", "improved dense trajectories (camera motion removed)",
                  ImprovedDenseTrajectories, "improved dense trajectories"),
]
