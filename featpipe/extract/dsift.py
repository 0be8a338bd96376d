"""Dense multi-scale SIFT with VLFeat's geometry and normalisation (``vl_dsift`` / ``vl_phow``).

Descriptor (Lowe IJCV'04 layout, VLFeat's flat-window "fast" variant, ``vl/dsift.c``):

* gradients by central differences (forward/backward at the image border), angle
  θ = atan2(g_y, g_x) with y pointing down, modulus m = ‖g‖;
* orientation binning is linear: with n = 8θ/2π, bin ⌊n⌋ gets (1 − (n − ⌊n⌋))·m and bin
  ⌊n⌋ + 1 (mod 8) gets the rest;
* spatial binning is bilinear: each orientation image is filtered along y and x by the
  unit-height triangle k(t) = max(0, 1 − |t|/s) (s = bin size, edge pixels replicated) and read
  at the 4×4 bin centres, which sit s pixels apart; the first descriptor's first bin centre is
  at the bound (``x_min``), so its centre is at ``x_min + 1.5·s``; a descriptor is kept only
  when all its bin centres lie inside the bounds; frames follow a grid of ``step`` pixels;
* flat window: bin (i, j) is multiplied by w_i·w_j, the mean over the bin's support of the
  Gaussian window exp(−½((t − s(i − 1.5))/(s·window_size))²);
* the contrast of a frame is the sum of its 128 entries divided by (3s + 1)²; the descriptor is
  L2-normalised (norm + FLT_EPSILON), clamped at 0.2 and L2-normalised again. Layout: entry
  ``t + 8·binx + 32·biny`` (VLFeat's order, x = column).

Multi-scale (``vl_phow``): for each bin size s the grey image (values in [0, 1]) is smoothed by
a Gaussian of σ = s / magnif (``vl_imsmooth``: kernel half-width ⌈4σ⌉, edge pixels replicated)
and its grid starts at ``start + ⌊1.5·(max(sizes) − s)⌋`` so that all sizes share descriptor
centres. MATLAB's ``vl_phow`` uses ``start = 0`` in 0-based pixels (featpipe's default);
cyvlfeat's ``phow`` starts one pixel later (``start = 1``). Frames whose contrast is below
``contrast_threshold`` (0.005) are set to zero (VLFeat) or dropped.

RootSIFT (Arandjelović & Zisserman, CVPR'12): L1-normalise, then take the element-wise square
root. Output descriptors are float32 and unit-L2 (cyvlfeat returns ``min(512·d, 255)``).

The OpenCV engine computes ``cv2.SIFT`` descriptors on the same grid (``kp.size = s / 1.5``
so that OpenCV's bin width 1.5·size equals s, angle 0, output divided by 512, orientation bins
reordered to VLFeat's y-down convention, t → (8 − t) mod 8); it does no
per-size smoothing and has no contrast measure, so its contrast threshold is 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

import cv2
import numpy as np

from featpipe.errors import InputError
from featpipe.extract.features import FeatureMethod
from featpipe.parameters import DeclaredEstimator, DeclaredInterval, DeclaredOptions

NUM_BINS = 4
NUM_ORIENTATIONS = 8
DESCRIPTOR_SIZE = NUM_BINS * NUM_BINS * NUM_ORIENTATIONS
_FLT_EPSILON = np.float32(np.finfo(np.float32).eps)
ENGINES = ("featpipe", "opencv")
LOW_CONTRAST = ("zero", "drop")


def to_grey(image: np.ndarray) -> np.ndarray:
    """A float32 grey image in [0, 1] from uint8/float grey or RGB (MATLAB ``rgb2gray`` weights).

    uint8 input is divided by 255; float input is taken as already in [0, 1].
    """
    image = np.asarray(image)
    if image.ndim == 3 and image.shape[2] == 1:
        image = image[:, :, 0]
    if image.ndim == 3 and image.shape[2] in (3, 4):
        weights = np.array([0.298936021293775, 0.587043074451121, 0.114020904255103])
        scale = 255.0 if image.dtype == np.uint8 else 1.0
        image = (image[:, :, :3].astype(np.float32) @ (weights / scale).astype(np.float32))
    elif image.ndim == 2:
        image = image.astype(np.float32) / (255.0 if image.dtype == np.uint8 else 1.0)
    else:
        raise InputError(f"expected a grey (H, W) or colour (H, W, 3) image, got shape "
                         f"{image.shape}")
    return np.ascontiguousarray(image, dtype=np.float32)


def vlfeat_smooth(image: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian smoothing as ``vl_imsmooth``: half-width ⌈4σ⌉, unit sum, edges replicated."""
    if sigma <= 0:
        return image
    half = int(math.ceil(4.0 * sigma))
    t = np.arange(-half, half + 1, dtype=np.float64)
    kernel = np.exp(-0.5 * (t / sigma) ** 2)
    kernel = (kernel / kernel.sum()).astype(np.float32)
    return cv2.sepFilter2D(image, cv2.CV_32F, kernel, kernel, borderType=cv2.BORDER_REPLICATE)


def _gradient_orientation_images(image: np.ndarray) -> np.ndarray:
    """(H, W, 8) orientation images: gradient modulus split linearly between two angle bins."""
    gx = np.empty_like(image)
    gy = np.empty_like(image)
    if image.shape[1] > 1:
        gx[:, 1:-1] = 0.5 * (image[:, 2:] - image[:, :-2])
        gx[:, 0] = image[:, 1] - image[:, 0]
        gx[:, -1] = image[:, -1] - image[:, -2]
    else:
        gx[:] = 0
    if image.shape[0] > 1:
        gy[1:-1] = 0.5 * (image[2:] - image[:-2])
        gy[0] = image[1] - image[0]
        gy[-1] = image[-1] - image[-2]
    else:
        gy[:] = 0
    modulus, angle = cv2.cartToPolar(gx, gy)
    position = angle * np.float32(NUM_ORIENTATIONS / (2 * np.pi))
    low = np.floor(position)
    upper_weight = position - low
    low = low.astype(np.intp) % NUM_ORIENTATIONS
    high = (low + 1) % NUM_ORIENTATIONS
    height, width = image.shape
    bins = np.zeros((height * width, NUM_ORIENTATIONS), dtype=np.float32)
    rows = np.arange(height * width)
    bins[rows, low.ravel()] = ((1 - upper_weight) * modulus).ravel()
    bins[rows, high.ravel()] += (upper_weight * modulus).ravel()
    return bins.reshape(height, width, NUM_ORIENTATIONS)


def _window_means(size: int, window_size: float) -> np.ndarray:
    """VLFeat's flat-window weights: per bin, the mean of the Gaussian window over its support."""
    t = np.arange(-size + 1, size, dtype=np.float32)
    sigma = np.float32(size) * np.float32(window_size)
    means = []
    for b in range(NUM_BINS):
        delta = np.float32(size) * np.float32(b - 0.5 * (NUM_BINS - 1))
        z = (t - delta) / sigma
        means.append(np.exp(-0.5 * z * z).mean())
    return np.asarray(means, dtype=np.float32)


def _grid(lo: int, hi: int, size: int, step: int) -> int:
    """Number of frames along one axis between bounds ``lo..hi`` (inclusive)."""
    extent = hi - lo - (NUM_BINS - 1) * size
    return extent // step + 1 if extent >= 0 else 0


def l2_clamp_l2(descriptors: np.ndarray) -> np.ndarray:
    """SIFT normalisation in place: L2 (norm + FLT_EPSILON), clamp at 0.2, L2 again."""
    norms = np.sqrt(np.einsum("ij,ij->i", descriptors, descriptors)) + _FLT_EPSILON
    descriptors /= norms[:, None]
    np.minimum(descriptors, np.float32(0.2), out=descriptors)
    norms = np.sqrt(np.einsum("ij,ij->i", descriptors, descriptors)) + _FLT_EPSILON
    descriptors /= norms[:, None]
    return descriptors


def dsift(image: np.ndarray, size: int, step: int, bounds: tuple[int, int, int, int] | None
          = None, window_size: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    """Single-scale flat-window dense SIFT of a grey float32 image (``vl_dsift(..., 'fast')``).

    Parameters
    ----------
    image : (H, W) float32, values in [0, 1].
    size : bin width s in pixels.  step : grid step in pixels.
    bounds : ``(x_min, y_min, x_max, y_max)``, 0-based inclusive (default: the whole image).
    window_size : Gaussian window σ in bins (``vl_dsift`` default 2; ``vl_phow`` uses 1.5).

    Returns
    -------
    frames : (N, 3) float32 ``x, y, contrast`` (0-based centres, row-major order: y outer).
    descriptors : (N, 128) float32, L2 → clamp 0.2 → L2, VLFeat's entry order.
    """
    image = np.ascontiguousarray(image, dtype=np.float32)
    if image.ndim != 2:
        raise InputError(f"dsift needs a grey (H, W) image, got shape {image.shape}")
    if size < 1 or step < 1:
        raise InputError(f"dsift size and step must be >= 1, got size={size}, step={step}")
    height, width = image.shape
    x_min, y_min, x_max, y_max = bounds if bounds is not None else (0, 0, width - 1, height - 1)
    x_min, y_min = max(int(x_min), 0), max(int(y_min), 0)
    x_max, y_max = min(int(x_max), width - 1), min(int(y_max), height - 1)
    nx, ny = _grid(x_min, x_max, size, step), _grid(y_min, y_max, size, step)
    if nx == 0 or ny == 0:
        return np.zeros((0, 3), np.float32), np.zeros((0, DESCRIPTOR_SIZE), np.float32)

    orientations = _gradient_orientation_images(image)
    t = np.arange(-size + 1, size, dtype=np.float32)
    triangle = (1 - np.abs(t) / np.float32(size)).astype(np.float32)
    filtered = cv2.sepFilter2D(orientations, cv2.CV_32F, triangle, triangle,
                               borderType=cv2.BORDER_REPLICATE)
    if filtered.ndim == 2:  # cv2 drops a trailing axis of length 1 only; keep the shape explicit
        filtered = filtered[:, :, None]
    weights = _window_means(size, window_size)

    descriptors = np.empty((ny, nx, NUM_BINS, NUM_BINS, NUM_ORIENTATIONS), dtype=np.float32)
    for by in range(NUM_BINS):
        y0 = y_min + by * size
        rows = filtered[y0:y0 + (ny - 1) * step + 1:step]
        for bx in range(NUM_BINS):
            x0 = x_min + bx * size
            np.multiply(rows[:, x0:x0 + (nx - 1) * step + 1:step], weights[by] * weights[bx],
                        out=descriptors[:, :, by, bx])
    descriptors = descriptors.reshape(ny * nx, DESCRIPTOR_SIZE)
    frame_size = (NUM_BINS - 1) * size + 1
    contrast = descriptors.sum(axis=1) / np.float32(frame_size * frame_size)
    l2_clamp_l2(descriptors)

    centre = 0.5 * size * (NUM_BINS - 1)
    xs = x_min + centre + step * np.arange(nx, dtype=np.float32)
    ys = y_min + centre + step * np.arange(ny, dtype=np.float32)
    frames = np.empty((ny * nx, 3), dtype=np.float32)
    frames[:, 0] = np.tile(xs, ny)
    frames[:, 1] = np.repeat(ys, nx)
    frames[:, 2] = contrast
    return frames, descriptors


def _opencv_dsift(image_uint8: np.ndarray, centres: np.ndarray, size: int) -> np.ndarray:
    """cv2.SIFT descriptors at ``centres`` with bin width ``size``, scaled to unit norm."""
    keypoints = [cv2.KeyPoint(float(x), float(y), size / 1.5, 0) for x, y in centres]
    _, descriptors = cv2.SIFT_create().compute(image_uint8, keypoints)
    if descriptors is None or len(descriptors) != len(keypoints):
        raise RuntimeError("OpenCV SIFT dropped keypoints on the dense grid")
    # OpenCV measures angles with y pointing up: orientation bin t is VLFeat's bin (8 - t) % 8
    flip = (NUM_ORIENTATIONS - np.arange(NUM_ORIENTATIONS)) % NUM_ORIENTATIONS
    descriptors = descriptors.reshape(-1, NUM_BINS, NUM_BINS, NUM_ORIENTATIONS)[..., flip]
    return descriptors.reshape(-1, DESCRIPTOR_SIZE).astype(np.float32) / np.float32(512.0)


@dataclass
class DenseSIFTResult:
    """Descriptors (N, 128) float32 and their frames (N, 3): x, y (input-image pixels), size."""

    descriptors: np.ndarray
    positions: np.ndarray


class DenseSIFT(DeclaredEstimator):
    """Multi-scale dense SIFT (``vl_phow`` with ``'fast'``), scikit-learn style.

    Parameters
    ----------
    sizes : list of int
        Bin sizes in pixels (``vl_phow``: 4, 6, 8, 10).
    step : int
        Grid step in pixels (``vl_phow``: 2; the deep Fisher kernel paper: 4).
    magnif : float
        Smoothing sigma = size / magnif.
    window_size : float
        Flat-window Gaussian sigma in bins (1.5 as ``vl_phow``).
    contrast_threshold : float or None
        Descriptors with contrast below it are zeroed or dropped [0.005; 0 for the opencv
        engine, which has no contrast measure].
    low_contrast : {"zero", "drop"}
        Low-contrast descriptors kept as zero vectors (VLFeat) or dropped.
    root_sift : bool
        RootSIFT (L1 then square root).
    max_pixels : int or None
        Rescale larger frames (area interpolation) to at most this many pixels; positions
        stay in the original frame's pixels.
    start : int
        0-based pixel where the largest size's grid starts (0 as MATLAB ``vl_phow``, 1 as
        cyvlfeat's ``phow``).
    engine : {"featpipe", "opencv"}
        featpipe's vectorised flat window, or cv2.SIFT on the grid.
    """

    #: the declared types (scikit-learn's vocabulary): they type the stage key's record
    #: (:func:`featpipe.parameters.parameter_record`); :meth:`_check` validates.
    _parameter_constraints: dict = {
        "sizes": [list, tuple],
        "step": [DeclaredInterval(Integral, 1, None, closed="left")],
        "magnif": [DeclaredInterval(Real, 0, None, closed="neither")],
        "window_size": [DeclaredInterval(Real, 0, None, closed="neither")],
        "contrast_threshold": [DeclaredInterval(Real, 0, None, closed="left"), None],
        "low_contrast": [DeclaredOptions(set(LOW_CONTRAST))],
        "root_sift": ["boolean"],
        "max_pixels": [DeclaredInterval(Integral, 16, None, closed="left"), None],
        "start": [DeclaredInterval(Integral, 0, None, closed="left")],
        "engine": [DeclaredOptions(set(ENGINES))],
    }

    def __init__(self, sizes=(4, 6, 8, 10), step=2, magnif=6.0, window_size=1.5,
                 contrast_threshold=None, low_contrast="zero", root_sift=False,
                 max_pixels=None, start=0, engine="featpipe"):
        self.sizes = sizes
        self.step = step
        self.magnif = magnif
        self.window_size = window_size
        self.contrast_threshold = contrast_threshold
        self.low_contrast = low_contrast
        self.root_sift = root_sift
        self.max_pixels = max_pixels
        self.start = start
        self.engine = engine

    def _check(self) -> float:
        sizes = [int(s) for s in self.sizes]
        if not sizes or min(sizes) < 1:
            raise InputError(f"dense SIFT sizes must be positive integers, got {self.sizes}")
        if int(self.step) < 1:
            raise InputError(f"dense SIFT step must be >= 1, got {self.step}")
        if self.magnif <= 0:
            raise InputError(f"dense SIFT magnif must be > 0, got {self.magnif}")
        if self.engine not in ENGINES:
            raise InputError(f"dense SIFT engine must be one of {ENGINES}, got {self.engine!r}")
        if self.low_contrast not in LOW_CONTRAST:
            raise InputError(f"low_contrast must be one of {LOW_CONTRAST}, got "
                             f"{self.low_contrast!r}")
        if self.max_pixels is not None and self.max_pixels < 16:
            raise InputError(f"max_pixels must be >= 16, got {self.max_pixels}")
        threshold = self.contrast_threshold
        if self.engine == "opencv":
            if threshold not in (None, 0, 0.0):
                raise InputError("the opencv engine has no contrast measure: use "
                                 "contrast_threshold 0 (or the featpipe engine)")
            return 0.0
        return 0.005 if threshold is None else float(threshold)

    def working_size(self, height: int, width: int) -> tuple[int, int, float]:
        """(height, width, scale) of an image of that size after the ``max_pixels`` rescale."""
        if self.max_pixels is None or height * width <= self.max_pixels:
            return height, width, 1.0
        scale = math.sqrt(self.max_pixels / (height * width))
        new_w, new_h = max(1, int(width * scale)), max(1, int(height * scale))
        while new_w * new_h > self.max_pixels:  # a side kept at 1 pixel: shorten the other
            if new_w > new_h:
                new_w -= 1
            else:
                new_h -= 1
        return new_h, new_w, scale

    def count(self, height: int, width: int) -> int:
        """Descriptors of an image of that size (with ``low_contrast='drop'``: at most)."""
        self._check()
        height, width, _ = self.working_size(height, width)
        sizes = [int(s) for s in self.sizes]
        total = 0
        for size in sizes:
            offset = int(self.start) + int(math.floor(1.5 * (max(sizes) - size)))
            total += (_grid(offset, width - 1, size, int(self.step))
                      * _grid(offset, height - 1, size, int(self.step)))
        return total

    def effective_params(self) -> dict:
        """The parameters as used: the contrast threshold's default filled in (0.005, or 0
        for the opencv engine); a bad value raises InputError."""
        return {**self.get_params(deep=False), "contrast_threshold": self._check()}

    @property
    def n_features(self) -> int:
        """Values per descriptor (4 x 4 bins x 8 orientations)."""
        return DESCRIPTOR_SIZE

    def minimum_size(self) -> str:
        """The smallest frame with a descriptor, in words (for messages)."""
        side = self.min_side()
        return f"at least {side}x{side} with sizes {','.join(str(s) for s in self.sizes)}"

    def min_side(self) -> int:
        """The smallest side (pixels, after the ``max_pixels`` rescale) of an image with at
        least one descriptor: 4 bins of the size plus the size's grid offset."""
        sizes = [int(s) for s in self.sizes]
        return min(int(self.start) + int(math.floor(1.5 * (max(sizes) - size)))
                   + (NUM_BINS - 1) * size + 1 for size in sizes)

    def compute(self, image: np.ndarray) -> DenseSIFTResult:
        """Descriptors of one image (uint8 or [0, 1] float, grey or RGB)."""
        threshold = self._check()
        grey = to_grey(image)
        new_h, new_w, scale = self.working_size(*grey.shape)
        scale_x, scale_y = new_w / grey.shape[1], new_h / grey.shape[0]
        if scale != 1.0:
            grey = cv2.resize(grey, (new_w, new_h), interpolation=cv2.INTER_AREA)
        sizes = [int(s) for s in self.sizes]
        step = int(self.step)
        height, width = grey.shape
        all_desc, all_pos = [], []
        grey_uint8 = None
        for size in sizes:
            offset = int(self.start) + int(math.floor(1.5 * (max(sizes) - size)))
            bounds = (offset, offset, width - 1, height - 1)
            if self.engine == "featpipe":
                smoothed = vlfeat_smooth(grey, size / float(self.magnif))
                frames, desc = dsift(smoothed, size, step, bounds, self.window_size)
            else:
                nx = _grid(offset, width - 1, size, step)
                ny = _grid(offset, height - 1, size, step)
                centre = offset + 1.5 * size
                xs = np.tile(centre + step * np.arange(nx), ny)
                ys = np.repeat(centre + step * np.arange(ny), nx)
                frames = np.stack([xs, ys, np.ones_like(xs)], axis=1).astype(np.float32)
                if grey_uint8 is None:
                    grey_uint8 = np.clip(np.rint(grey * 255), 0, 255).astype(np.uint8)
                desc = (_opencv_dsift(grey_uint8, frames[:, :2], size) if len(frames)
                        else np.zeros((0, DESCRIPTOR_SIZE), np.float32))
            low = frames[:, 2] < threshold
            if self.low_contrast == "zero":
                desc[low] = 0
            else:
                desc, frames = desc[~low], frames[~low]
            positions = np.empty((len(frames), 3), dtype=np.float32)
            positions[:, 0] = frames[:, 0] / scale_x
            positions[:, 1] = frames[:, 1] / scale_y
            positions[:, 2] = size / scale
            all_desc.append(desc)
            all_pos.append(positions)
        descriptors = np.concatenate(all_desc) if all_desc else np.zeros((0, DESCRIPTOR_SIZE))
        positions = np.concatenate(all_pos) if all_pos else np.zeros((0, 3))
        if self.root_sift:
            descriptors = root_sift(descriptors)
        return DenseSIFTResult(descriptors.astype(np.float32, copy=False),
                               positions.astype(np.float32, copy=False))


def root_sift(descriptors: np.ndarray) -> np.ndarray:
    """RootSIFT: sqrt(d / ‖d‖₁) per row (all-zero rows stay zero)."""
    descriptors = np.abs(np.asarray(descriptors, dtype=np.float32))
    l1 = descriptors.sum(axis=1, keepdims=True)
    return np.sqrt(descriptors / np.maximum(l1, _FLT_EPSILON))


#: video dense SIFT samples one frame per second unless told otherwise: neighbouring frames at
#: 25-30 fps give nearly the same descriptors, and every frame costs about 30 MB of raw
#: descriptors (320x240, step 2) and 0.15 s of one core; 1 fps cuts both 25-30x and still
#: gives a 7 s UCF101 clip 7 frames (ask for more with --fps, --every or --frames).
FEATURE_METHODS = [FeatureMethod("dsift", "dense multi-scale SIFT (local, 128 values per "
                                 "descriptor)", DenseSIFT, "dense SIFT", default_fps=1.0)]
