"""Rank-pooling speed: featpipe's batched exact solver versus per-window liblinear, same run.

1. ``hrp`` with the defaults (window 20, stride 1, depth 2, ψ = SER, C = 1, ε = 0.1) on one
   300 × 4096 float32 sequence (VGG fc6-sized); the reference is the same pipeline with one
   liblinear ``-s 11 -B -1`` call per window (liblinear's default -e 0.001, as the original
   MATLAB code runs it).
2. ``rankpool --directions both`` on N sequences of 100 × 4096; liblinear runs on the first
   ``--ref-sequences`` of them and its time is extrapolated per sequence (said in the output).

Prints frames/s for both sides, the speed ratio (wall time; for hrp also process CPU time, the
per-core comparison on a loaded machine), and how close the results are (cosine to the
liblinear result; liblinear at -e 0.001 is itself only approximately optimal), and the BLAS
in use (threadpoolctl).

    python benchmarks/bench_rankpool.py [--sequences 1000] [--ref-sequences 20] [--blas-threads 1]

BLAS runs single-threaded by default (``--blas-threads``), like liblinear: a per-core
comparison, and OpenBLAS's spinning threads collapse on an oversubscribed machine.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from featpipe.encode.temporal import HierarchicalRankPooling, RankPooling


def timed(fn, repeat=1, cpu=None):
    """Least wall seconds of ``repeat`` runs and fn's last result; with a list ``cpu``, the
    least process CPU seconds (all threads) is appended to it."""
    best, best_cpu, out = float("inf"), float("inf"), None
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        out = fn()
        best = min(best, time.perf_counter() - start)
        best_cpu = min(best_cpu, time.process_time() - start_cpu)
    if cpu is not None:
        cpu.append(best_cpu)
    return best, out


def cosines(A, B):
    A, B = np.asarray(A, np.float64), np.asarray(B, np.float64)
    return np.sum(A * B, -1) / (np.linalg.norm(A, axis=-1) * np.linalg.norm(B, axis=-1))


def report(name, frames, ours_s, ref_s, cos, note="", before_after=None, cpu=None):
    if before_after:
        print(f"  (featpipe before the reference {before_after[0]:.3f} s, after "
              f"{before_after[1]:.3f} s; the slower counts)")
    print(f"{name}: featpipe {ours_s:.3f} s ({frames / ours_s:,.0f} frames/s), "
          f"liblinear {ref_s:.3f} s ({frames / ref_s:,.1f} frames/s){note}")
    print(f"  speed-up {ref_s / ours_s:.1f}x; cosine to liblinear: min {np.min(cos):.6f}")
    if cpu:
        ours_cpu, ref_cpu = max(cpu[0], cpu[2]), cpu[1]
        print(f"  process CPU time (all threads): featpipe {ours_cpu:.3f} s (the slower of "
              f"{cpu[0]:.3f} / {cpu[2]:.3f}), liblinear {ref_cpu:.3f} s: "
              f"{ref_cpu / ours_cpu:.1f}x")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--sequences", type=int, default=1000)
    parser.add_argument("--length", type=int, default=100)
    parser.add_argument("--ref-sequences", type=int, default=20)
    parser.add_argument("--skip", choices=["hrp", "rankpool"], action="append", default=[])
    parser.add_argument("--blas-threads", type=int, default=1)
    parser.add_argument("--long", type=int, default=0, metavar="T",
                        help="also encode one T x --dim sequence with hrp (streaming) and "
                             "report its peak memory (run alone: peak RSS is per process)")
    args = parser.parse_args(argv)
    from threadpoolctl import threadpool_info, threadpool_limits

    print("BLAS:", [(i["internal_api"], i.get("architecture")) for i in threadpool_info()])
    with threadpool_limits(args.blas_threads):
        run(args)


def run(args):
    rng = np.random.default_rng(0)
    if args.long:
        long_sequence(args.long, args.dim, rng)

    if "hrp" not in args.skip:
        # smooth random walks: per-frame features that drift, like CNN features of a video
        X = np.cumsum(rng.standard_normal((args.frames, args.dim)), axis=0).astype(np.float32)
        X = (np.maximum(X, 0) / np.sqrt(args.frames)).astype(np.float32)  # like ReLU fc6
        ours = HierarchicalRankPooling()
        ref = HierarchicalRankPooling(solver="liblinear")
        ours.transform([X])  # warm-up (imports, allocator)
        # featpipe timed before and after liblinear; the slower of the two counts, so a load
        # change during the long reference run cannot flatter the ratio
        cpu = []
        before_s, u = timed(lambda: ours.transform([X]), repeat=3, cpu=cpu)
        ref_s, r = timed(lambda: ref.transform([X]), cpu=cpu)
        after_s, _ = timed(lambda: ours.transform([X]), repeat=3, cpu=cpu)
        ours_s = max(before_s, after_s)
        report(f"hrp defaults, 1 x {args.frames} x {args.dim} float32", args.frames, ours_s,
               ref_s, cosines(u, r), before_after=(before_s, after_s), cpu=cpu)

    if "rankpool" not in args.skip:
        seqs = [np.maximum(np.cumsum(rng.standard_normal((args.length, args.dim)), axis=0), 0)
                .astype(np.float32) for _ in range(args.sequences)]
        ours = RankPooling(directions="both")
        ref = RankPooling(directions="both", solver="liblinear")
        ours.transform(seqs[:2])
        before_s, U = timed(lambda: ours.transform(seqs))
        n_ref = min(args.ref_sequences, args.sequences)
        ref_sub_s, R = timed(lambda: ref.transform(seqs[:n_ref]))
        after_s, _ = timed(lambda: ours.transform(seqs))
        ours_s = max(before_s, after_s)
        ref_s = ref_sub_s * args.sequences / n_ref
        report(f"rankpool both, {args.sequences} x {args.length} x {args.dim} float32",
               args.sequences * args.length, ours_s, ref_s, cosines(U[:n_ref], R),
               note=f" (extrapolated from {n_ref} sequences, {ref_sub_s:.2f} s)",
               before_after=(before_s, after_s))


def long_sequence(T, dim, rng):
    import resource

    X = np.empty((T, dim), dtype=np.float32)
    walk = np.zeros(dim)
    for start in range(0, T, 1000):  # a smooth non-negative walk, made without big temporaries
        steps = np.cumsum(rng.standard_normal((min(1000, T - start), dim)), axis=0) + walk
        walk = steps[-1]
        X[start: start + len(steps)] = np.maximum(steps, 0) / np.sqrt(T)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    u = HierarchicalRankPooling().transform([X])
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"hrp defaults, 1 x {T} x {dim} float32 (input {X.nbytes / 2**20:.0f} MiB): "
          f"{seconds:.1f} s ({T / seconds:,.0f} frames/s); peak RSS {peak / 2**20:.0f} MiB "
          f"= {peak / X.nbytes:.1f}x the input (before encoding: {before / X.nbytes:.1f}x); "
          f"output {u.shape}, finite {bool(np.all(np.isfinite(u)))}")


if __name__ == "__main__":
    main()
