"""The dense-trajectory kernels compiled ahead of time (featpipe.extract._trajectory_kernels):
the module's functions give numba's bits, take exactly the arguments the tracker passes, leave
other arguments to numba, and a module that cannot be built leaves every call to numba."""

from __future__ import annotations

import logging
import os

import numba
import numpy as np
import pytest
from numba.core import sigutils

from featpipe.extract import _trajectory_kernels as kernels
from featpipe.extract.trajectories import DenseTrajectories, ImprovedDenseTrajectories
from tests.unit.test_trajectory_kernels import clip

#: the trackers whose calls are compared: both methods, both flows, every keypoint kind, a
#: subset of the descriptors
TRACKERS = [DenseTrajectories(), DenseTrajectories(flow="dis"), ImprovedDenseTrajectories(),
            ImprovedDenseTrajectories(flow="dis", keypoints="sift", descriptors="hog,mbh"),
            ImprovedDenseTrajectories(keypoints="corners", descriptors="trajectory")]


def built_module():
    module = kernels._compiled_module()
    if module is None:
        pytest.skip(f"the ahead-of-time module could not be built here: "
                    f"{kernels.module_path()}.failed")
    return module


def track(estimator, frames):
    tracker = estimator.start(*frames[0].shape[:2])
    out = [tracker.add(frame) for frame in frames]
    return (np.concatenate([o.descriptors for o in out]),
            np.concatenate([o.positions for o in out]))


@pytest.fixture(scope="module")
def frames():
    return [np.repeat(f[:, :, None], 3, axis=2) for f in clip("carphone_pristine.mp4", 20)]


@pytest.fixture
def numba_kernels(monkeypatch):
    """Every kernel name of the module bound to numba's function, each call's argument types
    recorded."""
    seen: dict[str, set] = {}

    def recording(name):
        function = kernels._numba_kernel(name)

        def call(*args):
            seen.setdefault(name, set()).add(tuple(numba.typeof(a) for a in args))
            return function(*args)
        return call

    for name in kernels.KERNELS:
        monkeypatch.setattr(kernels, name, recording(name))
    return seen


@pytest.mark.parametrize("estimator", TRACKERS, ids=repr)
def test_the_modules_kernels_give_numbas_bits(estimator, frames, monkeypatch):
    built_module()
    ahead = track(estimator, frames)
    for name in kernels.KERNELS:
        monkeypatch.setattr(kernels, name, kernels._numba_kernel(name))
    jit = track(estimator, frames)
    assert len(ahead[0]) > 0
    for a, b in zip(ahead, jit, strict=True):
        assert a.tobytes() == b.tobytes()


def test_the_tracker_passes_each_kernel_its_declared_types(frames, numba_kernels):
    """Every call of every tracker above (and a frame too small to use) has exactly the
    argument types of its kernel's signature: the module's function takes them all."""
    for estimator in TRACKERS:
        track(estimator, frames)
    DenseTrajectories().start(20, 20).add(frames[0][:20, :20])
    for name, calls in numba_kernels.items():
        declared = sigutils.normalize_signature(kernels.numba_signature(name))[0]
        assert calls == {tuple(declared)}, name
    assert set(numba_kernels) == set(kernels.KERNELS) - {"polynomial_coefficients",
                                                         "farneback_matrices",
                                                         "farneback_solve"}


def test_other_arguments_go_to_numba(monkeypatch):
    """Arrays of another dtype, not C-contiguous or not writable where the kernel writes go
    to numba's function (which compiles for them): no crash, the same result."""
    built_module()
    rng = np.random.default_rng(0)
    xy, previous = (rng.random((40, 2)) * 60).astype(np.float32), (rng.random((30, 2)) * 60)
    called = []
    real = kernels._numba_kernel
    monkeypatch.setattr(kernels, "_numba_kernel", lambda name: called.append(name) or real(name))
    match_window = kernels.kernel("match_window")
    expected = np.empty((40, 30), np.uint8)
    real("match_window")(xy, previous.astype(np.float32), np.float32(25), expected)
    got = np.empty((40, 30), np.uint8)
    match_window(xy, previous.astype(np.float32), np.float32(25), got)
    assert called == [] and np.array_equal(got, expected)
    for args in ((xy, previous, np.float32(25), got),                       # float64
                 (xy, previous.astype(np.float32).T.copy().T, np.float32(25), got),  # F order
                 (xy, previous.astype(np.float32), np.float32(25),
                  np.lib.stride_tricks.as_strided(got, writeable=False))):  # read-only output
        got[:] = 7
        if not args[3].flags.writeable:
            with pytest.raises(numba.core.errors.TypingError, match="readonly"):
                match_window(*args)   # numba's own refusal, not a write through
            continue
        match_window(*args)
        assert np.array_equal(got, expected)
    assert called == ["match_window"] * 3


def test_a_module_that_cannot_be_built_leaves_the_calls_to_numba(tmp_path, monkeypatch,
                                                                  caplog):
    """The build's failure is logged and kept beside the module's path: later processes use
    numba's functions without trying again; a module file that does not load is one too."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    assert kernels.cache_folder() == str(tmp_path / "featpipe")
    path = kernels.module_path()
    monkeypatch.setattr(kernels.sys, "executable", str(tmp_path / "no-python"))
    with caplog.at_level(logging.WARNING, logger="featpipe.numba_cache"):
        assert kernels._compiled_module() is None
    assert "could not start Python" in open(path + ".failed").read()
    assert "numba's functions are used" in caplog.text
    caplog.clear()
    assert kernels._compiled_module() is None and caplog.text == ""   # not tried again
    os.remove(path + ".failed")
    with open(path, "w") as f:
        f.write("not a shared object")
    assert kernels._compiled_module() is None
    assert "does not load" in open(path + ".failed").read()


def test_the_module_is_keyed_by_its_sources_and_cpu(monkeypatch):
    path = kernels.module_path()
    monkeypatch.setattr(kernels, "_cpu", lambda: b"another cpu")
    assert kernels.module_path() != path
