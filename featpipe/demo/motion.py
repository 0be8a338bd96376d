"""Rendered motion clips over real photographs, written as real mp4 files.

An object (a crop of one of scikit-learn's sample photographs) moves over a background (a crop
of the other photograph) in one of four directions: ``left``, ``right``, ``towards`` (it grows)
or ``away`` (it shrinks).  ``left`` clips are ``right`` clips played backwards and ``away``
clips are ``towards`` clips played backwards, so reversed classes share their frame sets:
order-blind encoders (average, max pooling) cannot tell them apart, order-aware ones can.
The motion is rendered, not filmed; reports must say so.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from featpipe.errors import FeatpipeError
from featpipe.manifest import Manifest, from_rows

DIRECTIONS = ("left", "right", "towards", "away")


def _photos() -> list[np.ndarray]:
    from sklearn.datasets import load_sample_images

    return [cv2.cvtColor(img, cv2.COLOR_RGB2BGR) for img in load_sample_images().images]


def render_clip(direction: str, rng: np.random.Generator, frames: int = 24,
                size: tuple[int, int] = (128, 96), photos: list[np.ndarray] | None = None
                ) -> np.ndarray:
    """One clip as a (frames, height, width, 3) uint8 BGR array."""
    if direction not in DIRECTIONS:
        raise FeatpipeError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    photos = photos or _photos()
    width, height = size
    back_i = int(rng.integers(len(photos)))
    back, source = photos[back_i], photos[1 - back_i]
    y0 = int(rng.integers(0, back.shape[0] - height))
    x0 = int(rng.integers(0, back.shape[1] - width))
    background = back[y0:y0 + height, x0:x0 + width]
    side = height // 2
    candidates = [(int(rng.integers(0, source.shape[0] - side)),
                   int(rng.integers(0, source.shape[1] - side))) for _ in range(8)]
    oy, ox = max(candidates, key=lambda c: source[c[0]:c[0] + side, c[1]:c[1] + side].std())
    sprite = source[oy:oy + side, ox:ox + side]  # the most textured of 8 random crops
    cy = int(rng.integers(side // 2, height - side // 2))
    clip = np.empty((frames, height, width, 3), np.uint8)
    for t in range(frames):
        f = t / max(frames - 1, 1)
        frame = background.copy()
        if direction in ("left", "right"):
            scale, cx = 1.0, side / 2 + f * (width - side)
        else:
            scale, cx = 0.35 + 0.65 * f, width / 2
        s = max(4, int(round(side * scale)))
        patch = cv2.resize(sprite, (s, s), interpolation=cv2.INTER_AREA)
        x = int(round(cx - s / 2))
        y = int(round((cy if direction in ("left", "right") else height / 2) - s / 2))
        xa, ya = max(x, 0), max(y, 0)
        xb, yb = min(x + s, width), min(y + s, height)
        frame[ya:yb, xa:xb] = patch[ya - y:yb - y, xa - x:xb - x]
        clip[t] = frame
    if direction in ("left", "away"):
        clip = clip[::-1]
    return clip


def write_mp4(clip: np.ndarray, path: Path, fps: float = 12.0) -> None:
    """Write a (T, H, W, 3) uint8 BGR clip as an mp4 (MPEG-4 part 2) with OpenCV."""
    height, width = clip.shape[1:3]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
    if not writer.isOpened():
        raise FeatpipeError(f"OpenCV cannot write mp4 files here ({path})")
    for frame in clip:
        writer.write(np.ascontiguousarray(frame))
    writer.release()


def render_dataset(folder: str | Path, per_class: int = 10, frames: int = 24,
                   directions: tuple[str, ...] = DIRECTIONS, seed: int = 0,
                   write_manifest: bool = True) -> Manifest:
    """Render ``per_class`` clips per direction into ``folder`` (``folder/<direction>/*.mp4``)
    and, with ``write_manifest``, write ``manifest.csv`` there.

    Split 1 puts the first half of each class in train and the rest in test.  Clips that
    already exist are kept, so a second call is instant.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    photos = _photos()
    rows = []
    for direction in directions:
        for i in range(per_class):
            clip_rng = np.random.default_rng(rng.integers(2**32))
            path = folder / direction / f"{direction}_{i:03d}.mp4"
            if not path.exists():
                path.parent.mkdir(exist_ok=True)
                write_mp4(render_clip(direction, clip_rng, frames=frames, photos=photos), path)
            split = "train" if i < (per_class + 1) // 2 else "test"
            rows.append((f"{direction}/{i:03d}", str(path.relative_to(folder)), [direction],
                         [split]))
    manifest = from_rows(rows, root=folder)
    if write_manifest:
        manifest.write(folder / "manifest.csv")
    return manifest
