"""A toy feature method, registered as a plugin (``FEATPIPE_FEATURES=tests._grey_grid``):
the raw grey values of each ``cell`` x ``cell`` square of a grid over the frame.

The whole of a feature method: one estimator whose parameters are declared once (signature,
constraints, numpydoc), the worker protocol (``n_features``, ``count``, ``compute``) and one
registry line (``FEATURE_METHODS``).
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
class Cells:
    descriptors: np.ndarray
    positions: np.ndarray


class GreyGrid(ValidatedEstimator, BaseEstimator):
    """Grey values (the mean of R, G and B, divided by 255) of the cells of a grid.

    Parameters
    ----------
    cell : int
        Side of the square cells in pixels; a cell gives cell² values, row by row.
    """

    _parameter_constraints = {"cell": [Interval(Integral, 1, None, closed="left")]}

    def __init__(self, cell=8):
        self.cell = cell

    @property
    def n_features(self) -> int:
        return self.cell * self.cell

    def count(self, height: int, width: int) -> int:
        return (height // self.cell) * (width // self.cell)

    def compute(self, frame: np.ndarray) -> Cells:
        c = self.cell
        rows, cols = frame.shape[0] // c, frame.shape[1] // c
        grey = frame[:rows * c, :cols * c].astype(np.float32).mean(axis=2) / 255
        blocks = grey.reshape(rows, c, cols, c).transpose(0, 2, 1, 3).reshape(-1, c * c)
        i, j = np.divmod(np.arange(rows * cols), cols)
        positions = np.stack([(j + 0.5) * c, (i + 0.5) * c, np.full(len(i), c)], axis=1)
        return Cells(blocks.astype(np.float32), positions.astype(np.float32))


FEATURE_METHODS = [FeatureMethod("grey-grid", "raw grey values of a grid's cells (toy)",
                                 GreyGrid, "grey-grid")]
