"""Rendered motion over real photographs: a patch of one of scikit-learn's sample images moves
left-to-right or right-to-left over random crops of them.  Each clip appears in both directions,
so both classes hold identical frame sets: avg and max pooling sit at chance (exactly 0.5, since
a clip and its reversal get the same encoding), rank pooling and hrp must classify (>= 0.9)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_sample_images
from sklearn.svm import SVC

from featpipe.encode.temporal import (
    AveragePooling,
    HierarchicalRankPooling,
    MaxPooling,
    RankPooling,
)


def motion_clips(n_clips, rng, T=10, size=24, obj=6):
    """Flattened grey frames (T, size²); returns sequences and labels (0: rightwards)."""
    images = [im.mean(axis=2) / 255.0 for im in load_sample_images().images]
    patch = images[0][200:200 + obj, 300:300 + obj]
    seqs, labels = [], []
    for _ in range(n_clips):
        photo = images[rng.integers(0, len(images))]
        y0 = rng.integers(0, photo.shape[0] - size)
        x0 = rng.integers(0, photo.shape[1] - size)
        row = rng.integers(0, size - obj)
        frames = []
        for t in range(T):
            frame = photo[y0:y0 + size, x0:x0 + size].copy()
            x = round(t * (size - obj) / (T - 1))
            frame[row:row + obj, x:x + obj] = patch
            frames.append(frame.ravel())
        frames = np.asarray(frames, dtype=np.float32)
        seqs += [frames, frames[::-1].copy()]
        labels += [0, 1]
    return seqs, np.asarray(labels)


def accuracy(encoder, train, ytr, test, yte):
    Z = encoder.fit_transform(train + test)
    Z = Z / np.maximum(np.linalg.norm(Z, axis=1, keepdims=True), 1e-12)
    clf = SVC(kernel="linear", C=1000).fit(Z[: len(train)], ytr)
    return float(np.mean(clf.predict(Z[len(train):]) == yte))


@pytest.fixture(scope="module")
def clips():
    rng = np.random.default_rng(0)
    return (*motion_clips(30, rng), *motion_clips(30, rng))


def test_order_blind_at_chance(clips):
    assert accuracy(AveragePooling(), *clips) == 0.5
    assert accuracy(MaxPooling(), *clips) == 0.5


def test_rank_pooling_and_hrp_classify_direction(clips):
    # measured: rankpool (both) 1.0, hrp (window 5) 1.0
    assert accuracy(RankPooling(), *clips) >= 0.9
    assert accuracy(HierarchicalRankPooling(window=5), *clips) >= 0.9
