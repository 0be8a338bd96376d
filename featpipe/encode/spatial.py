"""Per-frame spatial-grid pooling of local descriptors: local features -> a frame sequence.

Input: an item of local features (:class:`featpipe.items.LocalFeatures`): N descriptors
(N, D) with sidecars ``frame_index`` (N,), ``positions`` (N, ≥2: x, y, ...) and
``image_size`` as written by ``featpipe extract --features dsift`` (or ``vgg16-conv5_3``).
The frame (0..width × 0..height, from ``image_size``; for items without it, the bounding box
of the item's descriptor centres) is cut into a gx × gy grid; for each frame t and cell c the
descriptors are averaged (``avg``) or max-pooled (``max``); an empty cell, or a frame without
descriptors, gives zeros.  Output: (T, gx·gy·D), cells in row-major order, with
``frame_index`` and ``timestamps`` sidecars, ready for any temporal encoder.  Images are
one-frame items (no ``frame_index``: every descriptor belongs to frame 0).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import StrOptions

from featpipe.encode.registry import EncodeMethod
from featpipe.errors import InputError, ParameterError
from featpipe.item_kinds import SPATIAL_GRID
from featpipe.items import LocalFeatures, PerFrameStream, frame_sidecars
from featpipe.parallel import ItemOutput
from featpipe.parameters import ValidatedEstimator, estimator_parameters


def parse_grid(text: str) -> tuple[int, int]:
    """``'4x2'`` -> (4, 2): columns by rows, both at least 1."""
    try:
        gx, gy = (int(v) for v in str(text).lower().split("x"))
    except ValueError:
        raise ParameterError("grid", f"must look like 2x2 (columns x rows), got {text!r}") \
            from None
    if gx < 1 or gy < 1:
        raise ParameterError("grid", f"must have both sizes >= 1, got {text!r}")
    return gx, gy


def grid_pool(descriptors: np.ndarray, positions: np.ndarray, frame_index: np.ndarray | None,
              grid: tuple[int, int] = (2, 2), pool: str = "avg",
              image_size: tuple[int, int] | None = None,
              n_frames: int | None = None) -> np.ndarray:
    """(T, gx·gy·D) per-frame grid pooling of (N, D) descriptors (see the module docstring);
    T = ``n_frames``, else the last frame in ``frame_index`` + 1."""
    X = np.asarray(descriptors, dtype=np.float64)
    if X.ndim != 2 or (X.shape[0] == 0 and n_frames is None):
        raise InputError(f"expected a non-empty (N, D) array of local descriptors, got shape "
                         f"{X.shape}")
    if positions is None or len(positions) != len(X):
        raise InputError("spatial-grid needs a 'positions' sidecar with one (x, y, ...) row per "
                         "descriptor (extract without --no-positions)")
    frames = (np.zeros(len(X), np.int64) if frame_index is None
              else np.asarray(frame_index, dtype=np.int64))
    if len(frames) != len(X) or (len(frames) and frames.min() < 0):
        raise InputError("the 'frame_index' sidecar must give one frame (≥ 0) per descriptor")
    gx, gy = grid
    xy = np.asarray(positions, dtype=np.float64).reshape(len(X), -1)[:, :2] if len(X) \
        else np.zeros((0, 2))
    if image_size is not None:
        low, extent = np.zeros(2), np.array([image_size[1], image_size[0]], dtype=np.float64)
    else:
        low = xy.min(axis=0)
        extent = np.maximum(xy.max(axis=0) - low, 1e-12)
    rel = (xy - low) / extent
    cx = np.clip((rel[:, 0] * gx).astype(np.int64), 0, gx - 1)
    cy = np.clip((rel[:, 1] * gy).astype(np.int64), 0, gy - 1)
    n_frames = int(frames.max(initial=-1)) + 1 if n_frames is None else int(n_frames)
    n_cells, dim = gx * gy, X.shape[1]
    slot = frames * n_cells + cy * gx + cx
    if pool == "avg":
        sums = np.zeros((n_frames * n_cells, dim))
        np.add.at(sums, slot, X)
        counts = np.bincount(slot, minlength=n_frames * n_cells)[:, None]
        pooled = sums / np.maximum(counts, 1)
    elif pool == "max":
        pooled = np.full((n_frames * n_cells, dim), -np.inf)
        np.maximum.at(pooled, slot, X)
        pooled[np.isinf(pooled)] = 0.0
    else:
        raise ParameterError("pool", f"must be avg or max, got {pool!r}")
    return pooled.reshape(n_frames, n_cells * dim)


class SpatialGridPooling(ValidatedEstimator, BaseEstimator):
    """Encoder for ``featpipe encode``: items of local features -> frame sequences;
    ``stream(sink)`` pools frames as extraction produces them.

    Parameters
    ----------
    grid : str
        Cells of the grid over the frame (``image_size``; else the descriptors' bounding
        box), columns x rows (``4x4``).
    pool : {"avg", "max"}
        Pooling of the descriptors in each cell (an empty cell gives zeros).
    """

    _parameter_constraints = {"grid": [str], "pool": [StrOptions({"avg", "max"})]}

    @classmethod
    def _check_param_rules(cls, params):
        if "grid" in params:
            parse_grid(params["grid"])

    def __init__(self, grid: str = "2x2", pool: str = "avg"):
        self.grid = grid
        self.pool = pool

    def _encode(self, frames):
        grid = parse_grid(self.grid)
        return np.concatenate([grid_pool(f.descriptors, f.positions, None, grid, self.pool,
                                         f.image_size, n_frames=1) for f in frames])

    def stream(self, sink):
        return PerFrameStream(self._encode, sink, skip_empty=False)

    def encode_batch(self, arrays, extras):
        grid = parse_grid(self.grid)
        outputs = []
        for array, extra in zip(arrays, extras, strict=True):
            record = LocalFeatures.from_item(array, extra)
            pooled = grid_pool(record.descriptors, record.positions, record.frame_index, grid,
                               self.pool, record.image_size, n_frames=record.n_frames)
            outputs.append(ItemOutput(pooled, frame_sidecars(list(record.frames()))))
        return outputs


def _build(params: Mapping, models: Mapping):
    return SpatialGridPooling(**params)


ENCODE_METHODS = [
    EncodeMethod("spatial-grid", "local descriptors -> per-frame grid-pooled sequence "
                 "(--grid --pool)", _build, estimator_parameters(SpatialGridPooling),
                 batch_size=8, kinds=SPATIAL_GRID),
]
