"""Dense trajectories (``dt``) and improved dense trajectories (``idt``), streamed frame by frame.

Dense trajectories (Wang, Kläser, Schmid, Liu, IJCV 2013) and their improved version (Wang &
Schmid, ICCV 2013), re-implemented from the papers and the behaviour of the authors' releases
(DT v1.2 ``DenseTrack``, the improved ``DenseTrackStab``); no code of theirs is used.

Work in progress: the API (parameters, groups, shapes); the algorithm follows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import Interval, StrOptions

from featpipe.errors import ParameterError
from featpipe.parameters import ValidatedEstimator

#: the descriptor groups and their sizes with the default parameters, in the release's order
GROUPS = {"trajectory": 30, "hog": 96, "hof": 108, "mbhx": 96, "mbhy": 96}
#: orientation bins of each histogram group (HOF's last bin is the zero-flow bin)
BINS = {"hog": 8, "hof": 9, "mbhx": 8, "mbhy": 8}
FLOWS = ("farneback", "dis")
KEYPOINTS = ("orb", "akaze", "corners")
#: the release's ratio of neighbouring spatial scales
SCALE_FACTOR = 1 / math.sqrt(2)


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


class DenseTrajectories(ValidatedEstimator, BaseEstimator):
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
        median filter, or OpenCV's DIS (faster).
    descriptors : str
        Descriptor groups, comma-separated: trajectory, hog, hof, mbhx, mbhy, mbh (both),
        all.
    """

    _parameter_constraints: dict = {
        "step": [Interval(Integral, 1, None, closed="left")],
        "n_scales": [Interval(Integral, 1, None, closed="left")],
        "scale_factor": [Interval(Real, 0, 1, closed="neither")],
        "quality": [Interval(Real, 0, 1, closed="left")],
        "track_length": [Interval(Integral, 2, None, closed="left")],
        "patch_size": [Interval(Integral, 2, None, closed="left")],
        "n_xy_cells": [Interval(Integral, 1, None, closed="left")],
        "n_t_cells": [Interval(Integral, 1, None, closed="left")],
        "flow": [StrOptions(set(FLOWS))],
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
        """Whether a frame of that size holds a descriptor volume."""
        return min(height, width) >= int(self.patch_size) + 1

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
        side = int(self.patch_size) + 1
        return f"at least {side}x{side} with patch_size {int(self.patch_size)}"

    def start(self, height: int, width: int) -> Tracker:
        """A tracker for one video of frames of that size."""
        self._check()
        return Tracker(self, int(height), int(width))


class ImprovedDenseTrajectories(DenseTrajectories):
    """Improved dense trajectories (Wang & Schmid, ICCV 2013): camera motion removed.

    Parameters
    ----------
    keypoints : {"orb", "akaze", "corners"}
        Keypoints matched between frames for the homography, with the flow matches.
    ransac_seed : int
        Seed of OpenCV's random generator before each RANSAC (reproducible results).
    """

    _parameter_constraints: dict = {
        **DenseTrajectories._parameter_constraints,
        "keypoints": [StrOptions(set(KEYPOINTS))],
        "ransac_seed": [Interval(Integral, 0, None, closed="left")],
    }

    def __init__(self, step=5, n_scales=8, scale_factor=SCALE_FACTOR, quality=0.001,
                 track_length=15, patch_size=32, n_xy_cells=2, n_t_cells=3, flow="farneback",
                 descriptors="trajectory,hog,hof,mbh", keypoints="orb", ransac_seed=0):
        super().__init__(step=step, n_scales=n_scales, scale_factor=scale_factor,
                         quality=quality, track_length=track_length, patch_size=patch_size,
                         n_xy_cells=n_xy_cells, n_t_cells=n_t_cells, flow=flow,
                         descriptors=descriptors)
        self.keypoints = keypoints
        self.ransac_seed = ransac_seed


class Tracker:
    """The state of one video: the last frame's pyramid and the trajectories being tracked.

    :meth:`add` takes one frame after another and returns the trajectories that end there.
    """

    def __init__(self, estimator: DenseTrajectories, height: int, width: int):
        self.estimator = estimator
        self.height, self.width = height, width
        self.n_features = estimator.n_features
        self.frame = 0

    def add(self, rgb_frame: np.ndarray, boxes: np.ndarray | None = None) -> TrajectoryFrame:
        """Track one (H, W, 3) uint8 RGB frame; ``boxes`` (B, 4) x1, y1, x2, y2 of people
        (idt: left out of the homography).  Returns the trajectories ending at this frame."""
        self.frame += 1
        return TrajectoryFrame(np.zeros((0, self.n_features), np.float32),
                               np.zeros((0, 3), np.float32))
