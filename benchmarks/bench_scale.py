"""Item counts to 10^6 (issue 38 item 5): import, status, cache ls, verify, encode, extract.

Builds ``--items`` items of 4 x 8 float32 twice, in one HDF5 file (one dataset per item) and
in a folder of ``.npy`` files, with one manifest, then runs each command of the list below as
its own process under ``/usr/bin/time -v`` and prints its wall time, CPU time (user + sys) and
peak resident memory (``Maximum resident set size``), and the import rate in items/s:

    import --from items.h5 (store s), import --from npy/, status, cache ls, cache verify,
    encode --method avg, status of the encoding, and extract --features dsift of
    ``--images`` small images (a subset: dense SIFT costs milliseconds an image).

Targets (issue 38): at 10^6 items, peak resident memory <= 1 GB, ``status`` and ``cache ls``
<= 2 s, import >= 2,000 items/s on one core; the last line prints each figure as a ratio to
its target (the rate is of CPU seconds: the machine is shared).  Run it with ``env -u
OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE`` (the BLAS kernel is printed) and note ``uptime``
beside the figures.

    python benchmarks/bench_scale.py [--items 1000000] [--folder DIR] [--images 200]
        [--steps import-h5,import-npy,status,ls,verify,encode,status-avg,extract] [--keep]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("import-h5", "import-npy", "status", "ls", "verify", "encode", "status-avg",
         "extract")


def blas_kernel() -> str:
    """The BLAS library and kernel numpy runs (threadpoolctl), for the record."""
    from threadpoolctl import threadpool_info

    return "; ".join(f"{i.get('internal_api')} {i.get('architecture')}"
                     for i in threadpool_info() if i.get("user_api") == "blas") or "none"


def item_id(i: int) -> str:
    return f"v{i:07d}"


def make_data(folder: Path, n: int) -> None:
    """``manifest.csv``, ``items.h5`` and ``npy/<id>.npy``: n items of 4 x 8 float32."""
    import h5py

    rng = np.random.default_rng(0)
    header = None
    lines = ["id,path,label,split1\n"]
    (folder / "npy").mkdir(parents=True, exist_ok=True)
    with h5py.File(folder / "items.h5", "w") as h5:
        for start in range(0, n, 10_000):
            block = rng.standard_normal((min(10_000, n - start), 4, 8)).astype(np.float32)
            for k, array in enumerate(block):
                name = item_id(start + k)
                h5.create_dataset(name, data=array)
                if header is None:
                    import io

                    buffer = io.BytesIO()
                    np.lib.format.write_array_header_1_0(
                        buffer, np.lib.format.header_data_from_array_1_0(array))
                    header = buffer.getvalue()
                with open(folder / "npy" / f"{name}.npy", "wb") as handle:
                    handle.write(header + array.tobytes())
                split = "train" if (start + k) % 2 == 0 else "test"
                lines.append(f"{name},{name}.mp4,c{(start + k) % 10},{split}\n")
    (folder / "manifest.csv").write_text("".join(lines), encoding="utf-8")


def make_images(folder: Path, n: int) -> None:
    """``images.csv`` and ``images/<i>.png``: n 64 x 64 grey crops of scikit-learn's photos."""
    import cv2
    from sklearn.datasets import load_sample_images

    photos = [cv2.cvtColor(p, cv2.COLOR_RGB2GRAY) for p in load_sample_images().images]
    (folder / "images").mkdir(exist_ok=True)
    lines = ["id,path,label,split1\n"]
    rng = np.random.default_rng(1)
    for i in range(n):
        photo = photos[i % len(photos)]
        y, x = rng.integers(0, photo.shape[0] - 64), rng.integers(0, photo.shape[1] - 64)
        cv2.imwrite(str(folder / "images" / f"{i:06d}.png"), photo[y:y + 64, x:x + 64])
        lines.append(f"im{i:06d},images/{i:06d}.png,c{i % 10},{'train' if i % 2 else 'test'}\n")
    (folder / "images.csv").write_text("".join(lines), encoding="utf-8")


def timed(command: list[str], cwd: Path) -> dict:
    """Run ``featpipe COMMAND`` under ``/usr/bin/time -v``: wall, CPU seconds, peak RSS."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200")
    full = ["/usr/bin/time", "-v", sys.executable, "-m", "featpipe", *command]
    started = time.perf_counter()
    done = subprocess.run(full, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    text = done.stderr

    def field(name: str) -> float:
        match = re.search(rf"{re.escape(name)}: ([0-9.:]+)", text)
        return float(match.group(1)) if match else float("nan")

    if done.returncode != 0:
        tail = "\n".join(text.splitlines()[-25:])
        raise SystemExit(f"featpipe {' '.join(command)} exited {done.returncode}:\n{tail}")
    return {"wall": wall, "cpu": field("User time (seconds)") + field("System time (seconds)"),
            "rss": field("Maximum resident set size (kbytes)") * 1024, "out": done.stdout}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--folder", type=Path, default=None,
                        help="where the data and the store go (reused when the data exist)")
    parser.add_argument("--steps", default=",".join(STEPS))
    parser.add_argument("--keep", action="store_true", help="keep the folder afterwards")
    args = parser.parse_args()
    steps = args.steps.split(",")
    unknown = set(steps) - set(STEPS)
    if unknown:
        raise SystemExit(f"unknown steps {sorted(unknown)}; choose from {', '.join(STEPS)}")
    folder = args.folder or Path(tempfile.mkdtemp(prefix="bench-scale-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"BLAS: {blas_kernel()}; load: {os.getloadavg()}; folder {folder}")
    n = args.items
    if not (folder / "manifest.csv").exists():
        started = time.perf_counter()
        make_data(folder, n)
        print(f"made {n} items (HDF5 and .npy folder) in {time.perf_counter() - started:.0f} s")
    if "extract" in steps and not (folder / "images.csv").exists():
        make_images(folder, args.images)
    store = str(folder / "store")
    commands = {
        "import-h5": ["import", "--manifest", "manifest.csv", "--from", "items.h5",
                      "--store", store, "--name", "h5", "-q"],
        "import-npy": ["import", "--manifest", "manifest.csv", "--from", "npy",
                       "--store", store, "--name", "npy", "-q"],
        "status": ["status", "--store", store, "h5"],
        "ls": ["cache", "ls", "--store", store],
        "verify": ["cache", "verify", "--store", store, "h5"],
        "encode": ["encode", "--store", store, "--input", "h5", "--method", "avg",
                   "--name", "avg", "-q"],
        "status-avg": ["status", "--store", store, "avg"],
        "extract": ["extract", "--manifest", "images.csv", "--store", store, "--features",
                    "dsift", "--name", "sift", "-q"],
    }
    per_item = {"import-h5": n, "import-npy": n, "encode": n, "verify": n,
                "extract": args.images}
    print(f"{'step':<11} {'items':>8} {'wall s':>8} {'CPU s':>8} {'peak RSS':>10} "
          f"{'items/s (CPU)':>14} {'items/s (wall)':>15}")
    results = {}
    for step in steps:
        result = results[step] = timed(commands[step], folder)
        count = per_item.get(step)
        rate = f"{count / result['cpu']:.0f}" if count and result["cpu"] > 0 else "-"
        wall_rate = f"{count / result['wall']:.0f}" if count else "-"
        print(f"{step:<11} {count or n:>8} {result['wall']:>8.2f} {result['cpu']:>8.2f} "
              f"{result['rss'] / 2**20:>8.0f} MB {rate:>14} {wall_rate:>15}", flush=True)
    # each figure as a ratio to its target (issue 38: <= 1 GB, <= 2 s, >= 2,000 items/s)
    rss = max(r["rss"] for r in results.values()) / 2**30
    print(f"ratios to the targets: peak RSS {rss:.2f} GB / 1 GB = {rss:.2f}", end="")
    for step in ("status", "ls"):
        if step in results:
            print(f"; {step} {results[step]['wall']:.2f} s / 2 s = "
                  f"{results[step]['wall'] / 2:.2f}", end="")
    for step in ("import-h5", "import-npy"):
        if step in results:
            print(f"; {step} {n / results[step]['cpu']:.0f} items/s (CPU) / 2000 = "
                  f"{n / results[step]['cpu'] / 2000:.2f}", end="")
    print(f"\nload after: {os.getloadavg()}")
    if not args.keep and args.folder is None:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
