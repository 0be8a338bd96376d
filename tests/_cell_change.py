"""A toy stateful feature method (``FEATPIPE_FEATURES=tests._cell_change``): the change of
each ``cell`` x ``cell`` square's mean grey value since the previous frame.

It follows the worker protocol of a method with one tracker per video, as dense trajectories
do (:class:`featpipe.extract.streaming.LocalFeatureProgram`): ``start(height, width)`` gives a
tracker, whose ``add(frame, boxes=None)`` returns the rows that end at that frame: none at a
video's first frame, then one per cell; a cell whose centre lies in one of ``boxes`` gives no
row.  Each row is (change, frames seen so far), so a test sees whether the tracker was made
afresh for each video (and after a restart).
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import Interval

from featpipe.extract.features import FeatureMethod
from featpipe.parameters import ValidatedEstimator


@dataclass
class Rows:
    descriptors: np.ndarray
    positions: np.ndarray


class CellChange(ValidatedEstimator, BaseEstimator):
    """Change of the mean grey value (0..1) of the cells of a grid since the previous frame.

    Parameters
    ----------
    cell : int
        Side of the square cells in pixels.
    """

    _parameter_constraints = {"cell": [Interval(Integral, 1, None, closed="left")]}
    takes_boxes = True

    def __init__(self, cell=8):
        self.cell = cell

    @property
    def n_features(self) -> int:
        return 2

    def count(self, height: int, width: int) -> int:
        return (height // self.cell) * (width // self.cell)

    def start(self, height: int, width: int) -> Tracker:
        return Tracker(self.cell, height, width)


class Tracker:
    def __init__(self, cell: int, height: int, width: int):
        self.cell, self.shape = cell, (height, width)
        self.previous = None
        self.seen = 0

    def add(self, frame: np.ndarray, boxes: np.ndarray | None = None) -> Rows:
        if frame.shape[:2] != self.shape:
            raise ValueError(f"frame of {frame.shape[1]}x{frame.shape[0]} pixels in a video of "
                             f"{self.shape[1]}x{self.shape[0]}")
        c = self.cell
        rows, cols = frame.shape[0] // c, frame.shape[1] // c
        grey = frame[:rows * c, :cols * c].astype(np.float64).mean(axis=2) / 255
        means = grey.reshape(rows, c, cols, c).mean(axis=(1, 3)).ravel()
        previous, self.previous = self.previous, means
        self.seen += 1
        i, j = np.divmod(np.arange(rows * cols), cols)
        x, y = (j + 0.5) * c, (i + 0.5) * c
        keep = np.ones(len(x), bool) if previous is not None else np.zeros(len(x), bool)
        for x1, y1, x2, y2 in [] if boxes is None else boxes:
            keep &= ~((x >= x1) & (x <= x2) & (y >= y1) & (y <= y2))
        change = means - (previous if previous is not None else means)
        descriptors = np.stack([change, np.full(len(x), self.seen)], axis=1)[keep]
        positions = np.stack([x, y, np.full(len(x), c)], axis=1)[keep]
        return Rows(descriptors.astype(np.float32), positions.astype(np.float32))


FEATURE_METHODS = [FeatureMethod("cell-change", "change of a grid's cells since the previous "
                                 "frame (toy, stateful)", CellChange, "cell-change")]
