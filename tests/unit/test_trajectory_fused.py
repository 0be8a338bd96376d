"""The fused Farnebäck passes against OpenCV's ``sepFilter2D`` and the separate kernels, to the
bit: the polynomial expansion (six correlations and their combination in one pass) and one
iteration (system, window, solve in one pass), on real frames at every width residue of
OpenCV's vector loops (the values it leaves to its scalar loops: 0 to 7 a row)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from featpipe.extract import optical_flow
from featpipe.extract._trajectory_kernels import (
    farneback_matrices,
    farneback_solve,
    farneback_update,
    polynomial_coefficients,
    polynomial_expansion,
)
from featpipe.extract.optical_flow import FarnebackPyramid
from tests.unit.test_trajectory_kernels import clip

#: heights and widths: below the taps (3, 5), every residue of the width (and of 5 x width,
#: the system's values a row) modulo 8, and a 320-wide frame
SIZES = [(3, 5), (9, 7), (12, 33), (20, 41), (17, 52), (31, 60), (24, 61), (40, 70),
         (26, 77), (33, 98), (15, 43), (60, 320)]


def frames(size):
    height, width = size
    return [cv2.resize(frame, (width, height), interpolation=cv2.INTER_AREA)
            for frame in clip("carphone_pristine.mp4", 2)]


@pytest.mark.parametrize("size", SIZES)
def test_the_fused_expansion_is_opencvs_correlations_to_the_bit(size):
    engine = FarnebackPyramid([size], [1.0], np.sqrt(2))
    image = frames(size)[1].astype(np.float32) * np.float32(1.37) + np.float32(0.25)
    g, xg, xxg = engine.g, engine.xg, engine.xxg
    expected = np.empty((5,) + size, np.float32)
    polynomial_coefficients(*(engine._correlate(image, kx, ky)
                              for kx, ky in ((g, g), (g, xg), (xg, g), (g, xxg), (xxg, g),
                                             (xg, xg))), *engine.inverse, expected)
    got = np.empty_like(expected)
    polynomial_expansion(image, got)
    assert got.tobytes() == expected.tobytes()


@pytest.mark.parametrize("size", SIZES)
def test_a_fused_iteration_is_the_system_the_window_and_the_solve_to_the_bit(size):
    engine = FarnebackPyramid([size], [1.0], np.sqrt(2))
    r0, r1 = (engine.expand(frame)[0] for frame in frames(size))
    rng = np.random.default_rng(size[1])
    # a flow within a pixel at most pixels, beyond it (and out of the frame) at some
    flow = (rng.normal(0, 0.5, size + (2,)) * np.where(rng.random(size + (1,)) < 0.1, 6, 1)
            ).astype(np.float32)
    system = np.empty(size + (5,), np.float32)
    expected = flow.copy()
    for _ in range(2):
        farneback_matrices(r0, r1, expected, system)
        blurred = cv2.sepFilter2D(system, cv2.CV_32F, engine.window, engine.window,
                                  borderType=cv2.BORDER_REPLICATE)
        farneback_solve(blurred, expected)
    got = flow.copy()
    for _ in range(2):
        farneback_update(r0, r1, got)
    assert got.tobytes() == expected.tobytes()


def test_frames_wider_than_the_fused_passes_take_get_the_same_flow(monkeypatch):
    """The separate passes (OpenCV's filters between the kernels), which frames wider than
    FUSED_MAX_WIDTH take, give the fused passes' bits: the same pyramid, both ways."""
    sizes, scales = [(48, 64), (34, 45)], [1.0, float(np.float32(np.sqrt(2)))]
    fused = FarnebackPyramid(sizes, scales, np.sqrt(2))
    monkeypatch.setattr(optical_flow, "FUSED_MAX_WIDTH", 40)
    separate = FarnebackPyramid(sizes, scales, np.sqrt(2))
    assert fused.fused and not separate.fused
    previous, current = frames((48, 64))
    flows = [engine.flow(engine.expand(previous), engine.expand(current))
             for engine in (fused, separate)]
    for a, b in zip(*flows, strict=True):
        assert a.tobytes() == b.tobytes()
    assert np.abs(flows[0][0]).max() > 0.1
