"""Reading a stage's items after `featpipe cache pack` (HDF5) versus loose .npy files.

Writes N items of shape (T, D) float32 into a stage, reads them all with Stage.read_item
(the reference: one .npy per item), packs the stage into HDF5 files, reads them all again,
and prints the time ratio packed / loose.  Usage:

    python benchmarks/bench_pack.py [--items 2000] [--frames 30] [--dim 512] [--shards 1]
                                    [--jobs 1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from featpipe.manifest import from_rows  # noqa: E402
from featpipe.store import Store  # noqa: E402
from featpipe.store.pack import pack_stage  # noqa: E402


def read_all(stage, ids) -> float:
    started = time.perf_counter()
    total = 0.0
    for item_id in ids:
        total += float(stage.read_item(item_id)[0, 0])
    elapsed = time.perf_counter() - started
    assert np.isfinite(total)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--frames", type=int, default=30)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "store")
        ids = [f"video/{i:06d}" for i in range(args.items)]
        stage = store.stage("bench", {}, items=from_rows(
            [(i, f"{i}.avi", ["c"], ["train"]) for i in ids], root=Path(tmp)))
        for item_id in ids:
            stage.write_item(item_id, rng.standard_normal((args.frames, args.dim)))
        loose = min(read_all(stage, ids) for _ in range(3))
        started = time.perf_counter()
        summary = pack_stage(stage, shards=args.shards, jobs=args.jobs)
        pack_seconds = time.perf_counter() - started
        packed = min(read_all(stage, ids) for _ in range(3))
    print(f"{args.items} items of ({args.frames}, {args.dim}) float32, {args.shards} HDF5 "
          f"file(s), {args.jobs} packing process(es)")
    print(f"pack (write + bit-exact check + remove): {pack_seconds:.2f} s; {summary.line()}")
    print(f"read all, loose .npy : {loose:.3f} s ({1e3 * loose / args.items:.3f} ms/item)")
    print(f"read all, packed HDF5: {packed:.3f} s ({1e3 * packed / args.items:.3f} ms/item)")
    print(f"ratio packed / loose: {packed / loose:.2f}")


if __name__ == "__main__":
    main()
