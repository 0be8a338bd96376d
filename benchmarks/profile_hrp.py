"""Where the time of ``hrp`` goes (defaults: window 20, stride 1, depth 2, SER) on one
300 × 4096 float32 sequence, one thread, against the flops the method needs.

CPU time per part from cProfile (``time.process_time``, cumulative per function), averaged
over ``--repeats`` runs, with ``FEATPIPE_THREADS=1`` (the profiler sees the main thread only):
layer one's compiled pass over its 281 windows (running sums, ψ, Gram matrices, SVRs and
pooled vectors, one window at a time), the final layer's running sums, ψ, Gram matrix (BLAS),
dual solve and pooling, the all-zero columns left out, and the rest (the profiler's own cost
included).  The Gram flops are counted from the shapes the encoder really
uses (lower triangles; the final layer without its all-zero columns), so the achieved
GFLOP/s (for layer one: of its whole compiled pass) can be set against a float32 GEMM measured
in the same run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=. \
        python benchmarks/profile_hrp.py [--repeats 10]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time

import numpy as np

#: (featpipe file, function) -> the part its cumulative time counts for (none calls another)
PARTS = {("temporal.py", "pool_windows"): "layer 1, compiled (sums, psi, Gram, SVR, pooling)",
         ("svr.py", "rank_svr_unit_gram"): "final layer: dual SVR solve",
         ("maps.py", "running_sum"): "final layer: sums",
         ("temporal.py", "psi_parts"): "final layer: psi",
         ("svr.py", "gram"): "final layer: Gram (BLAS)",
         ("temporal.py", "psi_pool"): "final layer: pooling",
         ("temporal.py", "used_columns"): "zero columns"}


def gram_flops(T: int, D: int, window: int, nonnegative: bool) -> tuple[float, dict]:
    """Gram flops of depth 2: layer 1, n windows × M(M+1)/2 dot products of D (2·D for SER of
    signed input) columns; the final layer, the lower triangle of n × n on the D used columns
    of SER of the signed layer output, two parts (2·D)."""
    n = T - window + 1
    layers = {"layer 1": n * window * (window + 1) * D * (1 if nonnegative else 2),
              "final": n * (n + 1) * D * 2}
    return sum(layers.values()), layers


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    os.environ["FEATPIPE_THREADS"] = "1"  # every chunk on the profiled (main) thread
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
        part = PARTS.get((path.rsplit("/", 1)[-1], name)) if "featpipe" in path else None
        if part:
            seconds[part] = seconds.get(part, 0.0) + cumulative / args.repeats
    seconds["rest (Python, numpy glue, profiler)"] = profiled - sum(seconds.values())
    flops, layers = gram_flops(300, 4096, 20, nonnegative=True)
    print(f"hrp defaults, 1 x 300 x 4096 float32, one thread: {total * 1e3:.1f} ms CPU "
          f"({profiled * 1e3:.1f} ms under the profiler)")
    for part, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        print(f"  {part:36s} {s * 1e3:7.1f} ms  {100 * s / profiled:5.1f} %")
    print(f"Gram flops {flops / 1e9:.2f} G; a 2048^3 float32 GEMM here: {peak:.0f} GFLOP/s")
    for (name, layer_flops), part in zip(layers.items(), (PARTS["temporal.py", "pool_windows"],
                                                          PARTS["svr.py", "gram"]), strict=True):
        part_s = seconds.get(part, float("nan"))
        print(f"  {name}: {layer_flops / 1e9:.2f} GFLOP in {part_s * 1e3:.1f} ms, "
              f"{layer_flops / part_s / 1e9:.0f} GFLOP/s ({layer_flops / peak / 1e6:.1f} ms "
              "at the GEMM rate)")


if __name__ == "__main__":
    main()
