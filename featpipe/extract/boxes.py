"""Human bounding boxes per frame for ``extract --features idt --human-boxes DIR``.

The improved trajectories leave people out of the camera-motion estimate: matches inside a
person's box are not used for the homography (Wang & Schmid, ICCV'13 §2.2; the release's
``-H`` option).  The boxes are given per item as one file ``DIR/<item id>.bb`` (an id with
``/`` names a sub-folder, as the manifest's ids of UCF101-shaped folders do), in the release's
format: one line per frame,

    frame_id x1 y1 x2 y2 score [x1 y1 x2 y2 score ...]

``frame_id`` the 0-based frame number in the video, then five numbers per box: the top-left
and bottom-right corners in frame pixels (the pixels from ⌈x1⌉ to ⌊x2⌋ and ⌈y1⌉ to ⌊y2⌋ are
covered, both ends included) and the detector's score (read, not used).  A line that does not
start with a frame number is skipped (the release skips it); a frame without a line has no
boxes.  The release indexes its lines by position and asserts one per frame; featpipe keys them
by their frame number, so a file with one line per frame reads the same, and frames may be left
out.  A line whose box numbers are not a multiple of five, a repeated frame number or a frame
number beyond the video is an error naming the file and the line.

The boxes are part of the stage key by content: :func:`boxes_digest` hashes every item's file
(its bytes, or its absence).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from featpipe.errors import InputError

#: suffix of a boxes file
SUFFIX = ".bb"


def boxes_path(folder: str | Path, item_id: str) -> Path:
    """The boxes file of ``item_id`` in ``folder``."""
    return Path(folder) / (item_id + SUFFIX)


def read_boxes(path: str | Path) -> dict[int, np.ndarray]:
    """The boxes of each frame of one file: frame number -> (B, 4) float32 x1, y1, x2, y2."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"no human boxes file {path}")
    boxes: dict[int, np.ndarray] = {}
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        fields = line.split()
        if not fields or not _is_int(fields[0]):
            continue
        frame = int(fields[0])
        try:
            values = np.array([float(v) for v in fields[1:]], np.float64)
        except ValueError:
            raise InputError(f"{path} line {number}: the box values are not numbers") from None
        if len(values) % 5:
            raise InputError(f"{path} line {number}: {len(values)} numbers after the frame "
                             "number; a box is 5 (x1 y1 x2 y2 score)")
        if frame < 0 or frame in boxes:
            raise InputError(f"{path} line {number}: frame {frame} is "
                             + ("negative" if frame < 0 else "listed twice"))
        if not np.all(np.isfinite(values)):
            raise InputError(f"{path} line {number}: a box value is not finite")
        boxes[frame] = values.reshape(-1, 5)[:, :4].astype(np.float32)
    return boxes


def _is_int(text: str) -> bool:
    return text.lstrip("+-").isdigit()


def boxes_digest(folder: str | Path, ids, file_hash) -> str:
    """sha256 of each item's boxes file by content (``file_hash(path)``: size and SHA-256, as
    the manifest's videos are hashed), in the manifest's order; a missing file as missing."""
    rows = []
    for item_id in ids:
        path = boxes_path(folder, item_id)
        rows.append([item_id, list(file_hash(path)) if path.is_file() else None])
    return hashlib.sha256(json.dumps(rows, ensure_ascii=True).encode()).hexdigest()[:16]


class FrameBoxes:
    """The boxes of one item's sampled frames: ``of(index)`` for the ``index``-th sampled
    frame, video frame ``index * step`` (``--every step``); ``check(frames)`` at the end
    refuses a file that names frames beyond the video's ``frames`` decoded ones."""

    def __init__(self, path: str | Path, step: int = 1):
        self.path = Path(path)
        self.boxes = read_boxes(path)
        self.step = int(step)

    def of(self, index: int) -> np.ndarray | None:
        return self.boxes.get(index * self.step)

    def check(self, frames: int) -> None:
        last = max(self.boxes, default=-1)
        if last >= frames * self.step:
            video = f"{frames} frames" if self.step == 1 else \
                f"at most {frames * self.step} frames ({frames} sampled, every {self.step})"
            raise InputError(f"{self.path} has boxes for frame {last} but the video has "
                             f"{video}: a boxes file of another video?")
