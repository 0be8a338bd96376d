"""Extraction memory is a few frames per item, whatever the video's length.

A long and a short synthetic video (textured frames written with OpenCV) go through
``featpipe extract --features dsift --every 1`` (raw descriptors stored, the largest output)
in a subprocess; the peak resident memory of every process involved (the command and its
decoding worker: ``RUSAGE_CHILDREN`` of a wrapper reports the largest) may grow with the
length by a few frames of descriptors at most, while the item on disk grows by the whole
length.  Bounds are in units of one frame's descriptors, not absolute numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys

import cv2
import numpy as np

from featpipe.extract.dsift import DenseSIFT
from featpipe.store import Store
from tests.cli.test_extract_cli import write_manifest
from tests.conftest import REPO

SIZE = (160, 120)
SIFT = {"sizes": (4,), "step": 1}

WRAPPER = """
import json, resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(json.dumps({"rc": proc.returncode, "out": proc.stdout + proc.stderr,
                  "maxrss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def textured_video(path, n_frames):
    rng = np.random.default_rng(0)
    base = rng.integers(0, 255, (SIZE[1] * 2, SIZE[0] * 2, 3), dtype=np.uint8)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 25.0, SIZE)
    for k in range(n_frames):  # a textured scene panning by one pixel per frame
        writer.write(np.ascontiguousarray(base[k % SIZE[1]:k % SIZE[1] + SIZE[1],
                                               k:k + SIZE[0]]))
    writer.release()
    return path


def peak_rss(tmp_path, n_frames) -> tuple[int, int]:
    """(peak RSS in bytes of the largest process, bytes of the stored item)."""
    folder = tmp_path / f"v{n_frames}"
    folder.mkdir()
    textured_video(folder / "v.mp4", n_frames)
    manifest = write_manifest(folder, [("v", "v.mp4", "a", "train")])
    command = [sys.executable, "-m", "featpipe", "extract", "-m", str(manifest), "-s",
               str(folder / "s"), "-f", "dsift", "--sizes", "4", "--step", "1", "--every", "1",
               "-n", "raw"]
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", WRAPPER, *command], capture_output=True,
                          text=True, env=env, timeout=600, cwd=folder)
    report = json.loads(proc.stdout)
    assert report["rc"] == 0, report["out"]
    stage = Store(folder / "s").resolve("raw")
    assert len(stage.extras_of("v")["timestamps"]) == n_frames
    return report["maxrss_kb"] * 1024, stage.item_path("v").stat().st_size


def test_peak_memory_does_not_grow_with_the_video(tmp_path):
    frame_bytes = DenseSIFT(**SIFT).count(SIZE[1], SIZE[0]) * 128 * 4
    short_rss, short_item = peak_rss(tmp_path, 8)
    long_rss, long_item = peak_rss(tmp_path, 80)
    assert long_item - short_item >= 70 * frame_bytes  # the item really is 72 frames longer
    # descriptors + positions + a resized copy of a few frames in flight; holding the item
    # (the old behaviour) would add 72 frames or more
    assert long_rss - short_rss <= 8 * frame_bytes, (long_rss - short_rss) / frame_bytes
