"""`featpipe classify` as the Table 6 recipe runs it, at growing numbers of clips, and its CPU
projected to UCF101 (issue 50 item 5: the classifications' share of the trajectory stream).

The scale run (``bench_recipe_scale.py``) measures each classification at 202 clips, where its
start-up and reading dominate, and projects it by the square of the clips: an upper end.  This
script measures the same command (``featpipe classify -i X --normalize l2 --split all``: the
recipe's ``result-*`` steps, a linear kernel on l2-normalised vectors, libsvm on the
precomputed kernel, three splits) on vectors of the recipe's ``rp-all`` size (``--dim``) at
``--clips`` sizes in UCF101's shape (101 classes, three splits with about 70 % train), fits
CPU(n) = a + b n + c n² through the measured points and projects it to UCF101's 13,320 clips
and HMDB51's 6,766, beside the clips-squared projection of the smallest point.

The vectors are seeded class means plus noise, l2-normalised (the SVM's iterations depend on
the data; the kernel's arithmetic, n² x dim, does not).  Each point is imported once
(``featpipe import``, not timed), then ``classify`` runs under ``resource.getrusage`` of its
child (user + sys).

Usage: env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_classify_scale.py
       [--clips 832,1665,3330] [--dim 203264] [--work DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

#: clips of the full datasets
DATASETS = {"UCF101": 13_320, "HMDB51": 6_766}
CLASSES = 101


def write_set(folder: Path, clips: int, dim: int, seed: int = 0) -> Path:
    """``clips`` vectors (one .npy each) and a manifest of 101 classes and three splits."""
    rng = np.random.default_rng(seed)
    data = folder / "npy"
    data.mkdir(parents=True)
    means = rng.standard_normal((CLASSES, dim), dtype=np.float32)
    rows = ["id,path,label,split1,split2,split3"]
    for i in range(clips):
        label = i % CLASSES
        vector = means[label] * 0.3 + rng.standard_normal(dim, dtype=np.float32)
        np.save(data / f"c{i:05d}.npy", vector)
        splits = ["test" if (37 * i + 11 * s) % 10 < 3 else "train" for s in range(3)]
        rows.append(f"c{i:05d},c{i:05d}.npy,class{label:03d},{','.join(splits)}")
    manifest = folder / "manifest.csv"
    manifest.write_text("\n".join(rows) + "\n")
    return manifest


def child_cpu(command: list[str]) -> tuple[float, float]:
    """(CPU seconds of the finished child, wall seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def classify_cpu(folder: Path, clips: int, dim: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of the recipe's ``classify`` on ``clips`` seeded vectors
    of ``dim`` values (:func:`write_set`, imported into a store in ``folder``, not timed);
    ``folder`` is removed after."""
    featpipe = [sys.executable, "-m", "featpipe", "-q"]
    shutil.rmtree(folder, ignore_errors=True)
    manifest = write_set(folder, clips, dim)
    store = folder / "store"
    subprocess.run([*featpipe, "import", "--manifest", manifest, "--from", folder / "npy",
                    "--store", store, "--name", "x"], check=True)
    shutil.rmtree(folder / "npy")
    try:
        return child_cpu([*featpipe, "classify", "-s", store, "-i", "x", "--normalize", "l2",
                          "--split", "all", "-n", "result"])
    finally:
        shutil.rmtree(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", default="832,1665,3330")
    parser.add_argument("--dim", type=int, default=203_264)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    from threadpoolctl import threadpool_info

    print(f"BLAS: {[(i['internal_api'], i.get('architecture')) for i in threadpool_info()]}; "
          f"load {os.getloadavg()[0]:.2f}; {os.cpu_count()} cores; dim {args.dim:,}")
    work = args.work or Path(tempfile.mkdtemp(prefix="classify-scale-"))
    points = []
    for clips in map(int, args.clips.split(",")):
        cpu, wall = classify_cpu(work / f"n{clips}", clips, args.dim)
        points.append((clips, cpu))
        print(f"{clips:6,} clips: classify CPU {cpu:8.1f} s, wall {wall:8.1f} s; "
              f"load {os.getloadavg()[0]:.2f}", flush=True)
    n = np.array([p[0] for p in points], float)
    cpu = np.array([p[1] for p in points])
    design = np.stack([np.ones_like(n), n, n * n], 1)[:, :min(3, len(points))]
    coef = np.linalg.lstsq(design, cpu, rcond=None)[0]
    print("fit: CPU(n) = " + " + ".join(f"{c:.3g} n^{k}" for k, c in enumerate(coef)))
    for name, clips in DATASETS.items():
        fitted = sum(c * clips ** k for k, c in enumerate(coef))
        squared = cpu[0] * (clips / n[0]) ** 2
        print(f"{name} ({clips:,} clips): {fitted / 3600:.2f} core-hours fitted; clips squared "
              f"from {int(n[0]):,} clips: {squared / 3600:.2f} (x{squared / fitted:.1f})")


if __name__ == "__main__":
    main()
