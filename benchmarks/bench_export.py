"""``featpipe export`` to ``.mat`` versus ``.npz``, the same stage, measured in the same run.

A store with ``--items`` ragged items (T drawn in [T/2, 3T/2], D ``--dim``, float32, with a
timestamps sidecar) and as many equal-shape items; each is exported to ``.npz`` and to
``.mat`` (v5 with cell arrays for ragged items), interleaved, best of ``--repeats``.  Prints
the seconds of each and the ratio mat / npz (issue 23: within 2x; it was 15x with zlib
compression and one concatenated array).  Usage:

    python benchmarks/bench_export.py [--items 2000] [--frames 60] [--dim 256]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from featpipe.io.export import export_stage  # noqa: E402
from featpipe.manifest import from_rows  # noqa: E402
from featpipe.store import Store  # noqa: E402


def timed(stage, path: Path) -> float:
    started = time.perf_counter()
    export_stage(stage, path)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        store = Store(root / "store")
        ids = [f"v{i:05d}" for i in range(args.items)]
        items = from_rows([(i, "", ["a"], ["train"]) for i in ids], root)
        stages = {}
        for layout in ("ragged", "stacked"):
            stage = store.stage("import", {"layout": layout}, items=items)
            for i in ids:
                frames = (int(rng.integers(args.frames // 2, 3 * args.frames // 2 + 1))
                          if layout == "ragged" else args.frames)
                stage.write_item(i, rng.standard_normal((frames, args.dim), np.float32),
                                 extras={"timestamps": np.arange(frames) / 25.0})
            stages[layout] = stage
        print(f"{args.items} items of about {args.frames} x {args.dim} float32 with timestamps; "
              f"best of {args.repeats}")
        for layout, stage in stages.items():
            times = {fmt: [] for fmt in ("npz", "mat")}
            for _ in range(args.repeats):  # interleaved: both see the same machine load
                for fmt in times:
                    times[fmt].append(timed(stage, root / f"out.{fmt}"))
            npz, mat = min(times["npz"]), min(times["mat"])
            size = (root / "out.mat").stat().st_size / (root / "out.npz").stat().st_size
            print(f"{layout:8s} npz {npz:6.2f} s  mat {mat:6.2f} s  ratio mat/npz {mat / npz:.2f} "
                  f"(file size ratio {size:.2f})")


if __name__ == "__main__":
    main()
