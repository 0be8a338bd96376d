"""The same hrp job in process and through the command line: what a CLI job costs on top.

Ten (``--sequences``; issue 30 §2 asks 100) 300 × 4096 float32 sequences (non-negative
smooth walks, like ReLU fc6) are imported into a store; ``HierarchicalRankPooling().transform``
encodes them in this process (after a warm-up), then ``featpipe encode --method hrp`` encodes
them in a fresh process; a third process only imports what that command imports.  Prints
wall and CPU seconds (the CPU time of the child processes from ``getrusage``) and the ratio
CLI / in-process.

    python benchmarks/bench_encode_cli.py [--sequences 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def child_run(args) -> tuple[float, float]:
    """(wall, CPU) seconds of a child process running ``args``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    from threadpoolctl import threadpool_info

    from featpipe.encode.temporal import HierarchicalRankPooling
    from featpipe.store import Store

    print("BLAS:", [(i["internal_api"], i.get("architecture"), i["num_threads"])
                    for i in threadpool_info()])
    folder = Path(tempfile.mkdtemp(prefix="bench-encode-cli-"))
    rng = np.random.default_rng(0)
    (folder / "npy").mkdir()
    rows = ["id,path,label,split1"]
    for i in range(args.sequences):
        X = np.maximum(np.cumsum(rng.standard_normal((300, 4096)), axis=0), 0) / np.sqrt(300)
        np.save(folder / "npy" / f"v{i}.npy", X.astype(np.float32))
        rows.append(f"v{i},npy/v{i}.npy,{'ab'[i % 2]},train")
    (folder / "m.csv").write_text("\n".join(rows) + "\n")
    store = folder / "S"
    featpipe = [sys.executable, "-m", "featpipe"]
    subprocess.run([*featpipe, "import", "--manifest", folder / "m.csv", "--from",
                    folder / "npy", "-s", store, "--name", "fc6", "-q"], check=True)
    seqs = [Store(store).resolve("fc6").read_item(f"v{i}") for i in range(args.sequences)]
    encoder = HierarchicalRankPooling()
    encoder.transform(seqs[:1])  # warm-up
    results = {"in process": [], "featpipe encode": [], "imports only": []}
    for repeat in range(args.repeats):
        cpu, start = time.process_time(), time.perf_counter()
        encoder.transform(seqs)
        results["in process"].append((time.perf_counter() - start, time.process_time() - cpu))
        results["featpipe encode"].append(child_run(
            [*featpipe, "encode", "-s", store, "-i", "fc6", "-m", "hrp", "--name",
             f"hrp{repeat}", "--force", "-q"]))
        results["imports only"].append(child_run(
            [sys.executable, "-c", "import featpipe.cli.encode, featpipe.stages.encoding, "
             "featpipe.encode.functional.temporal, featpipe.encode._window_loop"]))
    best = {k: (min(w for w, _ in v), min(c for _, c in v)) for k, v in results.items()}
    for name, (wall, cpu) in best.items():
        print(f"{name:16s} wall {wall:6.2f} s   CPU {cpu:6.2f} s   (best of {args.repeats})")
    print(f"CLI / in process: wall {best['featpipe encode'][0] / best['in process'][0]:.2f}x, "
          f"CPU {best['featpipe encode'][1] / best['in process'][1]:.2f}x")


if __name__ == "__main__":
    main()
