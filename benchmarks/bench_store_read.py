"""Reading store items with their header checked against the file size versus ``np.load``.

Every item read from a store goes through :func:`featpipe.fileio.load_npy`, which checks
that the file holds the data its header declares before allocating (issue 16 item 6), then
reads the data through the same open file.  This prints the time per item of both, measured
in the same run, interleaved, best of ``--repeats``, and their ratio.  Usage:

    python benchmarks/bench_store_read.py [--items 2000] [--frames 20] [--dim 64]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from featpipe.fileio import load_npy  # noqa: E402


def timed(read, paths) -> float:
    started = time.perf_counter()
    for path in paths:
        read(path)
    return (time.perf_counter() - started) / len(paths)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--frames", type=int, default=20)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for i in range(args.items):
            path = Path(folder) / f"{i}.npy"
            np.save(path, rng.standard_normal((args.frames, args.dim)).astype(np.float32))
            paths.append(path)
        for path in paths[:10]:
            np.testing.assert_array_equal(load_npy(path), np.load(path))
        reference, checked = [], []
        for _ in range(args.repeats):
            reference.append(timed(lambda p: np.load(p, allow_pickle=False), paths))
            checked.append(timed(load_npy, paths))
    ref, new = min(reference), min(checked)
    print(f"{args.items} items of ({args.frames}, {args.dim}) float32 on a local disk")
    print(f"np.load: {ref * 1e6:.1f} us/item; load_npy (header checked): {new * 1e6:.1f} "
          f"us/item; ratio load_npy / np.load = {new / ref:.2f}")


if __name__ == "__main__":
    main()
