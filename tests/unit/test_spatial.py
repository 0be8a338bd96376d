"""Per-frame spatial-grid pooling against a literal loop over frames and cells."""

import numpy as np
import pytest

from featpipe.encode.spatial import grid_pool
from featpipe.errors import InputError


def literal(X, xy, frames, gx, gy, pool):
    low, high = xy.min(0), xy.max(0)
    out = []
    for t in range(frames.max() + 1):
        cells = []
        for cy in range(gy):
            for cx in range(gx):
                members = []
                for i in range(len(X)):
                    rx = (xy[i, 0] - low[0]) / (high[0] - low[0])
                    ry = (xy[i, 1] - low[1]) / (high[1] - low[1])
                    if (frames[i] == t and min(int(rx * gx), gx - 1) == cx
                            and min(int(ry * gy), gy - 1) == cy):
                        members.append(X[i])
                if not members:
                    cells.append(np.zeros(X.shape[1]))
                else:
                    cells.append(np.mean(members, 0) if pool == "avg" else np.max(members, 0))
        out.append(np.concatenate(cells))
    return np.array(out)


@pytest.mark.parametrize("pool", ["avg", "max"])
def test_grid_pool_equals_literal_loop(pool):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 4))
    xy = rng.uniform(0, 50, size=(60, 3))
    frames = np.repeat(np.arange(3), 20)
    got = grid_pool(X, xy, frames, (3, 2), pool)
    assert got.shape == (3, 24)
    np.testing.assert_allclose(got, literal(X, xy, frames, 3, 2, pool))


def test_missing_positions_is_a_clear_error():
    with pytest.raises(InputError, match="positions"):
        grid_pool(np.ones((3, 2)), None, None)


def test_a_frame_without_descriptors_pools_to_zeros():
    """Dense SIFT with low_contrast='drop' on a blank frame gives no rows: zeros, not a
    reshape error (the documented rule for a frame without descriptors)."""
    got = grid_pool(np.zeros((0, 4)), np.zeros((0, 3)), None, (2, 2), "avg", (48, 64),
                    n_frames=1)
    np.testing.assert_array_equal(got, np.zeros((1, 16)))
