"""Where the time of ``hrp`` goes (defaults: window 20, stride 1, depth 2, SER) on one
300 × 4096 float32 sequence, one thread, against the flops the method needs.

CPU time per part from cProfile (``time.process_time``, cumulative per function), averaged
over ``--repeats`` runs: window running sums, ψ (√, sign), Gram matrices, the dual SVR
solve, the pooling u = Σ β ψ(s), and the rest (the profiler's own cost included).  The Gram
flops are counted from the shapes the encoder really uses (after its all-zero columns are
left out), so the achieved GFLOP/s of that part can be set against a float32 GEMM measured
in the same run.

    python benchmarks/profile_hrp.py [--repeats 10]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import numpy as np

#: featpipe functions (none calls another) -> the part their cumulative time counts for
PARTS = {"window_running_sums": "window sums", "running_sum": "window sums",
         "psi_parts": "psi (sqrt, sign)", "gram": "Gram matrices",
         "rank_svr_unit_gram": "dual SVR solve", "psi_pool": "pooling u = sum beta psi",
         "used_columns": "zero columns"}


def gram_flops(T: int, D: int, window: int, nonnegative: bool) -> tuple[float, dict]:
    """2·M²·D per window and part: layer 1 (one part for non-negative input), layer 2 (two
    parts: SER of signed sums; D columns, the zero half left out), final (two parts, T'×T')."""
    n1 = T - window + 1
    n2 = n1 - window + 1
    layers = {"layer 1": n1 * 2 * window**2 * D * (1 if nonnegative else 2),
              "layer 2": n2 * 2 * window**2 * D * 2,
              "final": 2 * n2**2 * D * 2}
    return sum(layers.values()), layers


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    from threadpoolctl import threadpool_info, threadpool_limits

    from featpipe.encode.temporal import HierarchicalRankPooling

    rng = np.random.default_rng(0)
    X = np.maximum(np.cumsum(rng.standard_normal((300, 4096)), axis=0), 0) / np.sqrt(300)
    X = X.astype(np.float32)
    encoder = HierarchicalRankPooling(chunk_bytes=256 * 2**20)
    print("BLAS:", [(i["internal_api"], i.get("architecture")) for i in threadpool_info()])
    with threadpool_limits(1):
        encoder.transform([X])
        start = time.process_time()
        for _ in range(args.repeats):
            encoder.transform([X])
        total = (time.process_time() - start) / args.repeats
        profile = cProfile.Profile(time.process_time)
        start = time.process_time()
        profile.enable()
        for _ in range(args.repeats):
            encoder.transform([X])
        profile.disable()
        profiled = (time.process_time() - start) / args.repeats
        A = rng.standard_normal((2048, 2048)).astype(np.float32)
        A @ A
        start = time.process_time()
        A @ A
        peak = 2 * 2048**3 / (time.process_time() - start) / 1e9
    seconds: dict[str, float] = {}
    for (path, _, name), (_, _, _, cumulative, _) in pstats.Stats(profile).stats.items():
        if name in PARTS and "featpipe" in path:
            seconds[PARTS[name]] = seconds.get(PARTS[name], 0.0) + cumulative / args.repeats
    seconds["rest (Python, numpy glue, profiler)"] = profiled - sum(seconds.values())
    flops, layers = gram_flops(300, 4096, 20, nonnegative=True)
    print(f"hrp defaults, 1 x 300 x 4096 float32, one thread: {total * 1e3:.1f} ms CPU "
          f"({profiled * 1e3:.1f} ms under the profiler)")
    for part, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        print(f"  {part:36s} {s * 1e3:7.1f} ms  {100 * s / profiled:5.1f} %")
    gram_s = seconds.get("Gram matrices", float("nan"))
    print(f"Gram flops {flops / 1e9:.2f} G (" + ", ".join(f"{k} {v / 1e9:.2f} G"
                                                    for k, v in layers.items())
          + f"): {flops / gram_s / 1e9:.0f} GFLOP/s; a 2048^3 float32 GEMM here: "
          f"{peak:.0f} GFLOP/s")


if __name__ == "__main__":
    main()
