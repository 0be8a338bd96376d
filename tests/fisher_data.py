"""Real dense SIFT for the Fisher-vector tests: OpenCV SIFT on a dense grid.

Keypoint size = bin width / 1.5 (OpenCV's bin width is 1.5 * size), angle 0, descriptors
divided by 512 (unit norm), then square-rooted (RootSIFT-like, as in the deep Fisher paper).
"""

from __future__ import annotations

import cv2
import numpy as np


def dense_sift(gray: np.ndarray, step: int = 4, bin_size: int = 4):
    """Descriptors (N, 128) float32 and positions (N, 2) of a dense grid over ``gray``."""
    gray = np.ascontiguousarray(gray, dtype=np.uint8)
    height, width = gray.shape
    margin = 2 * bin_size
    points = [(float(x), float(y)) for y in range(margin, height - margin + 1, step)
              for x in range(margin, width - margin + 1, step)]
    keypoints = [cv2.KeyPoint(x, y, bin_size / 1.5, 0) for x, y in points]
    _, desc = cv2.SIFT_create().compute(gray, keypoints)
    return np.sqrt(desc / 512.0).astype(np.float32), np.asarray(points, dtype=np.float32)


def digits_descriptors(classes=(3, 5, 8), per_class=40, scale=4, seed=0):
    """Dense SIFT of scikit-learn digits upsampled ``scale`` times: (list of (N, 128), labels)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(seed)
    descs, labels = [], []
    for c in classes:
        idx = rng.choice(np.flatnonzero(digits.target == c), per_class, replace=False)
        for i in idx:
            img = (digits.images[i] * (255.0 / 16.0)).astype(np.uint8)
            big = cv2.resize(img, None, fx=scale, fy=scale, interpolation=cv2.INTER_LINEAR)
            descs.append(dense_sift(big)[0])
            labels.append(c)
    return descs, np.asarray(labels)


def sample_image_descriptors(step=6, bin_size=6):
    """Dense SIFT of scikit-learn's two sample photographs (grey): [(desc, positions, shape)]."""
    from sklearn.datasets import load_sample_images

    out = []
    for img in load_sample_images().images:
        gray = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)
        desc, pos = dense_sift(gray, step=step, bin_size=bin_size)
        out.append((desc, pos, gray.shape))
    return out


def single_thread_blas():
    """Context limiting BLAS/OpenMP to one thread: on a shared, overloaded 2-core machine
    multi-threaded BLAS spins and makes small products 10x slower."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(1)
