"""A toy feature method with descriptor groups (``FEATPIPE_FEATURES=tests._cell_groups``), as
dense trajectories have: each ``cell`` x ``cell`` square of a grid gives one row holding the
groups ``colour`` (its mean R, G, B over 255) and ``grey`` (its grey values, row by row),
selected by ``descriptors`` ("colour,grey", "grey"...).  It makes the grouped models of
``fit gmm --groups`` testable without the trajectories' values.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import Interval

from featpipe.extract.features import FeatureMethod
from featpipe.parameters import ValidatedEstimator

ORDER = ("colour", "grey")


@dataclass
class Cells:
    descriptors: np.ndarray
    positions: np.ndarray


class CellGroups(ValidatedEstimator, BaseEstimator):
    """Colour means and grey values of the cells of a grid, in groups.

    Parameters
    ----------
    cell : int
        Side of the square cells in pixels.
    descriptors : str
        Groups, comma-separated: colour, grey.
    """

    _parameter_constraints = {"cell": [Interval(Integral, 1, None, closed="left")],
                              "descriptors": [str]}

    def __init__(self, cell=4, descriptors="colour,grey"):
        self.cell = cell
        self.descriptors = descriptors

    def groups(self) -> list[tuple[str, slice]]:
        sizes = {"colour": 3, "grey": self.cell * self.cell}
        names = [n for n in ORDER if n in self.descriptors.split(",")]
        out, start = [], 0
        for name in names:
            out.append((name, slice(start, start + sizes[name])))
            start += sizes[name]
        return out

    @property
    def n_features(self) -> int:
        return self.groups()[-1][1].stop

    def count(self, height: int, width: int) -> int:
        return (height // self.cell) * (width // self.cell)

    def compute(self, frame: np.ndarray) -> Cells:
        c = self.cell
        rows, cols = frame.shape[0] // c, frame.shape[1] // c
        rgb = frame[:rows * c, :cols * c].astype(np.float32) / 255
        blocks = rgb.reshape(rows, c, cols, c, 3).transpose(0, 2, 1, 3, 4).reshape(-1, c * c, 3)
        parts = {"colour": blocks.mean(axis=1), "grey": blocks.mean(axis=2)}
        i, j = np.divmod(np.arange(rows * cols), cols)
        positions = np.stack([(j + 0.5) * c, (i + 0.5) * c, np.full(len(i), c)], axis=1)
        return Cells(np.concatenate([parts[n] for n, _ in self.groups()], axis=1),
                     positions.astype(np.float32))


FEATURE_METHODS = [FeatureMethod("cell-groups", "colour and grey values of a grid's cells "
                                 "(toy, in groups)", CellGroups, "cell-groups")]
