"""The flow's 5×5 median (featpipe.extract._flow_median) against ``cv2.medianBlur(flow, 5)``:
bit-equal on random, tied, infinite and real flows of every pyramid size and of tiny images,
and its comparator networks checked on every 0-1 input (Knuth's 0-1 principle), both as the
generator derives them and as the compiled kernel runs them."""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import os

import cv2
import numpy as np
import pytest

from featpipe.extract import _flow_median
from featpipe.extract._flow_median import median_blur5
from featpipe.extract.optical_flow import median_flow

#: the dense-trajectory pyramid at 320 × 240 (height, width), then odd, tiny and wide sizes
#: (over 320 pixels: more than one strip)
PYRAMID = [(240, 320), (170, 226), (120, 160), (85, 113), (60, 80), (42, 57)]
SMALL = [(1, 1), (1, 2), (2, 1), (2, 3), (3, 2), (4, 7), (5, 5), (6, 9), (7, 4), (5, 130),
         (9, 129), (3, 257), (2, 300), (7, 333), (4, 650), (3, 963)]


def generator():
    """benchmarks/gen_flow_median.py as a module."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "gen_flow_median.py")
    spec = importlib.util.spec_from_file_location("gen_flow_median", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_as_opencv(flow):
    expect = cv2.medianBlur(flow, 5)
    got = median_blur5(flow)
    assert got.dtype == np.float32 and got.shape == flow.shape
    assert np.array_equal(got.view(np.int32), expect.view(np.int32)), \
        np.argwhere(got != expect)[:5]


@pytest.mark.parametrize("size", PYRAMID + SMALL, ids=str)
def test_random_flows_equal_opencv(size):
    rng = np.random.default_rng(sum(size))
    assert_as_opencv(rng.normal(0, 3, (*size, 2)).astype(np.float32))


@pytest.mark.parametrize("size", [(60, 80), (42, 57), (6, 9), (2, 3)], ids=str)
def test_ties_repeats_and_infinities_equal_opencv(size):
    rng = np.random.default_rng(1)
    few = rng.integers(-2, 3, (*size, 2)).astype(np.float32)      # every window full of ties
    assert_as_opencv(few)
    blocks = np.repeat(np.repeat(few[::4, ::4], 4, 0), 4, 1)[:size[0], :size[1]]
    assert_as_opencv(np.ascontiguousarray(blocks))                  # all-equal regions
    assert_as_opencv(np.zeros((*size, 2), np.float32))
    # -0.0 and +0.0 are equal values: the median's sign may differ from OpenCV's, not its value
    signed = np.where(rng.random((*size, 2)) < 0.5, -0.0, 0.0).astype(np.float32)
    assert np.array_equal(median_blur5(signed), cv2.medianBlur(signed, 5))
    infinite = rng.normal(0, 1, (*size, 2)).astype(np.float32)
    infinite[rng.random((*size, 2)) < 0.3] = np.inf
    infinite[rng.random((*size, 2)) < 0.3] = -np.inf
    assert_as_opencv(infinite)


def test_real_dis_flow_equals_opencv_at_every_scale():
    from tests.unit.test_trajectory_kernels import clip

    previous, current = (cv2.resize(frame, (320, 240), interpolation=cv2.INTER_AREA)
                         for frame in clip("bikes.mp4", 2))
    flow = cv2.DISOpticalFlow_create(cv2.DISOPTICAL_FLOW_PRESET_FAST).calc(previous, current,
                                                                           None)
    assert np.abs(flow).max() > 1  # it moves
    for height, width in PYRAMID:
        scaled = cv2.resize(flow, (width, height), interpolation=cv2.INTER_AREA)
        assert np.array_equal(median_flow(scaled), cv2.medianBlur(scaled, 5))


def test_median_flow_takes_any_layout_and_returns_a_new_array():
    flow = np.random.default_rng(2).normal(0, 1, (2, 30, 40)).astype(np.float32)
    strided = flow.transpose(1, 2, 0)                                 # not C-contiguous
    out = median_flow(strided)
    assert out.flags.c_contiguous and np.array_equal(out, cv2.medianBlur(
        np.ascontiguousarray(strided), 5))


def test_the_networks_select_their_ranks_on_every_0_1_input():
    """Each network of the generator, on every 0-1 input of sorted lists (a count of ones per
    list): sort5 32 inputs, sort4 16, insert 10, merge_pair 36, middle_ranks 121,
    median_of 42."""
    gen = generator()
    cases = {name: gen.check(comparators, inputs, outputs, ranks)
             for name, (comparators, inputs, outputs, ranks) in gen.networks().items()}
    assert cases == {"SORT5": 32, "SORT4": 16, "INSERT": 10, "PAIR": 36, "QUAD": 121,
                     "FINAL": 42}
    # the check would see a wrong rank: median_of's network asked for rank 4 or 6 fails
    comparators, inputs, outputs, _ = gen.networks()["FINAL"]
    for wrong in (range(4, 5), range(6, 7)):
        with pytest.raises(AssertionError):
            gen.check(comparators, inputs, outputs, wrong)


def test_the_module_holds_the_generated_networks():
    source = inspect.getsource(_flow_median)
    assert generator().module_functions() in source


def test_the_chain_of_networks_gives_the_median_of_five_sorted_columns():
    """The module's network functions (Python) chained as the kernel chains them, on every
    0-1 input of five sorted columns (6^5 counts): 1 exactly when 13 or more are 1."""
    def column(ones):
        return tuple(0.0 if k < 5 - ones else 1.0 for k in range(5))

    for counts in itertools.product(range(6), repeat=5):
        c = [column(ones) for ones in counts]
        middle = _flow_median.middle_ranks.py_func(_flow_median.merge_pair.py_func(c[0], c[1]),
                                                   _flow_median.merge_pair.py_func(c[2], c[3]))
        assert _flow_median.median_of.py_func(middle, c[4]) == (sum(counts) >= 13), counts


def de_bruijn(k, n):
    """A de Bruijn sequence over range(k) of order n: every n-tuple once, cyclically."""
    a, out = [0] * k * n, []

    def db(t, p):
        if t > n:
            if n % p == 0:
                out.extend(a[1:p + 1])
        else:
            a[t] = a[t - p]
            db(t + 1, p)
            for j in range(a[t - p] + 1, k):
                a[t] = j
                db(t + 1, t)
    db(1, 1)
    return out


@pytest.mark.parametrize("row", [2, 3], ids=["above", "below"])
@pytest.mark.parametrize("shift", [0, 1], ids=["even", "odd"])
def test_the_compiled_kernel_on_every_0_1_window_of_sorted_columns(shift, row):
    """Five rows whose columns hold 0..5 ones (a de Bruijn sequence of counts: every window of
    five counts once), the ones placed in every pattern of rows in turn (all 32 columns of 0s
    and 1s reach the column sort), in rows row - 2..row + 2 of 6: the median of ``row`` is 1
    exactly when the window holds 13 or more ones.  Both rows of a pass (the kernel makes rows
    2 and 3 together), both pixel parities (shift); channel 1 the sequence reversed."""
    counts = de_bruijn(6, 5)
    counts = [0] * shift + counts + counts[:4]                   # every window, linearly
    patterns = {ones: [p for p in itertools.product((0, 1), repeat=5) if sum(p) == ones]
                for ones in range(6)}
    flow = np.zeros((6, len(counts), 2), np.float32)
    for channel, sequence in enumerate((counts, counts[::-1])):
        for x, ones in enumerate(sequence):
            choices = patterns[ones]
            flow[row - 2:row + 3, x, channel] = choices[x % len(choices)]
    got = median_blur5(flow)
    assert np.array_equal(got, cv2.medianBlur(flow, 5))
    windows = np.lib.stride_tricks.sliding_window_view(flow[:, :, 0].sum(0), 5)
    assert np.array_equal(got[row, 2:-2, 0], (windows.sum(1) >= 13).astype(np.float32))
    assert len({tuple(w) for w in np.lib.stride_tricks.sliding_window_view(
        np.array(counts), 5)}) == 6 ** 5
