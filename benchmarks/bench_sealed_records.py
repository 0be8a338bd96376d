"""What sealing every record (issue 39: ledger lines, ``stage.json``, names, the content-hash
cache; :func:`featpipe.checksums.seal_json`) costs where a store reads them most: a stage's
ledger, read whole by every run, ``status``, ``verify`` and ``cache ls``.

The same ledger (``--items`` done lines, as :meth:`featpipe.store.Stage.write_item` writes
them) is read by :meth:`featpipe.store.Stage.item_states` twice: sealed in a stage written
with checksums (each line's seal checked), and as a store written before issue 39 holds it
(no seals, ``stage.json`` without ``checksums``: :func:`tests._stores.make_old`).  Best of
``--repeats``, interleaved, CPU time of this process (what a loaded machine distorts least)
and wall time; the ratio sealed / unsealed is printed.  Usage:

    python benchmarks/bench_sealed_records.py [--items 100000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from featpipe.checksums import as_text  # noqa: E402
from featpipe.manifest import from_rows  # noqa: E402
from featpipe.store import Stage, Store  # noqa: E402
from tests._stores import make_old  # noqa: E402


def ledger_store(root: Path, n: int) -> Stage:
    """A stage of ``n`` done items whose ledger is written as featpipe writes it (the files
    themselves are not needed to read the ledger: one empty file stands for all)."""
    items = from_rows([(f"v{i:06d}", "", ["c"], ["train"]) for i in range(n)], root)
    stage = Store(root).stage("import", {"n": n}, items=items)
    for i in range(n):
        stage.record(f"v{i:06d}", "done", seconds=0.001,
                     sums={".npy": as_text(i * 2654435761)})
    return stage


def timed(run) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from threadpoolctl import threadpool_info

    print(f"load {os.getloadavg()[0]:.1f}; numpy {np.__version__}; {args.items} ledger lines")
    print("BLAS:", [(i["internal_api"], i.get("architecture"), i["num_threads"])
                    for i in threadpool_info()])
    with tempfile.TemporaryDirectory() as tmp:
        sealed = ledger_store(Path(tmp) / "new", args.items)
        shutil.copytree(Path(tmp) / "new", Path(tmp) / "old")
        make_old(Path(tmp) / "old")
        old = Store(Path(tmp) / "old").stage_by_folder(sealed.name)
        assert sealed.checksummed and not old.checksummed
        best = {"sealed": (float("inf"),) * 2, "unsealed": (float("inf"),) * 2}
        for _ in range(args.repeats):
            for label, stage in (("sealed", sealed), ("unsealed", old)):
                reopened = Stage(stage.path)
                wall, cpu = timed(reopened.item_states)
                assert len(reopened.item_states()) == args.items
                best[label] = (min(best[label][0], wall), min(best[label][1], cpu))
    for label, (wall, cpu) in best.items():
        print(f"{label:9s} item_states: {cpu * 1e6 / args.items:6.2f} us/line CPU, "
              f"{wall:6.3f} s wall")
    print(f"ratio sealed / unsealed: {best['sealed'][1] / best['unsealed'][1]:.2f} (CPU), "
          f"{best['sealed'][0] / best['unsealed'][0]:.2f} (wall)")


if __name__ == "__main__":
    main()
