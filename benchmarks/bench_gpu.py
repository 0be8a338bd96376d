"""CPU versus GPU for featpipe's device paths, side by side in one run (issue 17's table).

Workloads (``--scale`` multiplies the item counts, for small machines):

    hrp        HierarchicalRankPooling() defaults on 32 sequences of 300 x 4096 (fc6-like)
    rankpool   RankPooling(directions="both") on 256 sequences of 100 x 4096
    deepfisher DeepFisherKernel, 200 train sets x 1,500 x 64, K = 64, 3 iterations
    ns         covariance pooling + 5 Newton-Schulz iterations, 64 x 196 x 512 float32
    vgg        VGG-16 up to fc6 (random weights), 128 frames of 224 x 224
    ucf101     hrp defaults on a sample of UCF101-sized sequences (T ~ 180 frames at 25 fps,
               D = 4096), extrapolated to the 13,320 clips (2.43 M frames)

Each workload runs on the CPU (numpy / torch CPU, all cores unless ``--threads``) and, when a
GPU is present, with ``device="cuda"`` (inputs handed over as numpy arrays, transfers
included); outputs are compared (minimum cosine of the rows).  On a shared machine use
``--threads 1``: multi-threaded OpenBLAS spinning on busy cores made the same CPU run 10x
slower (deep Fisher 0.7 s and 8.8 s within minutes).  Without a GPU the CUDA column
says so.  ``--count-ops`` instead counts the operator calls made from Python (top-level aten
ops: kernel launches on a GPU) per item of hrp, rankpool and deep Fisher with torch CPU
tensors, with the torch profiler; run it with ``PYTHONPATH`` pointing at another checkout to
compare versions.

    PYTHONPATH=. python benchmarks/bench_gpu.py [--scale 0.125] [--only hrp,rankpool]
    PYTHONPATH=. python benchmarks/bench_gpu.py --count-ops 32 [--count-dim 4096]
"""

from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np

UCF101_CLIPS = 13_320
UCF101_FRAMES = 2_434_000  # 27 hours at 25 fps (Soomro et al. 2012): 182.7 frames per clip


def gpu_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def synchronize():
    if gpu_available():
        import torch

        torch.cuda.synchronize()


def timed(fn, repeat=1):
    """Best of ``repeat`` (after one warm-up call), and the last output."""
    fn()
    best, out = math.inf, None
    for _ in range(repeat):
        synchronize()
        start = time.perf_counter()
        out = fn()
        synchronize()
        best = min(best, time.perf_counter() - start)
    return best, out


def min_cosine(a, b) -> float:
    a = np.asarray(a, np.float64).reshape(len(a), -1)
    b = np.asarray(b, np.float64).reshape(len(b), -1)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    ok = norms > 0
    return float(np.min(np.sum(a * b, axis=1)[ok] / norms[ok])) if ok.any() else 1.0


def fc6_walks(n, T, D, rng):
    """Smooth non-negative random walks: per-frame features that drift, like ReLU fc6."""
    out = []
    for length in np.broadcast_to(T, (n,)):
        walk = np.cumsum(rng.standard_normal((int(length), D)), axis=0)
        out.append((np.maximum(walk, 0) / np.sqrt(length)).astype(np.float32))
    return out


# -- workloads: each returns (label, {device: callable}) ---------------------------------------

def hrp_workload(scale, rng):
    from featpipe.encode.temporal import HierarchicalRankPooling

    n = max(1, round(32 * scale))
    seqs = fc6_walks(n, 300, 4096, rng)
    return (f"hrp defaults, {n} sequences 300x4096",
            lambda device: HierarchicalRankPooling(device=device).transform(seqs))


def rankpool_workload(scale, rng):
    from featpipe.encode.temporal import RankPooling

    n = max(1, round(256 * scale))
    seqs = fc6_walks(n, 100, 4096, rng)
    return (f"rankpool both directions, {n} x 100x4096",
            lambda device: RankPooling(directions="both", device=device).transform(seqs))


def fisher_sets(n, T, D, rng, classes=3):
    centres = rng.standard_normal((classes, 8, D)) * 2.0
    labels = np.arange(n) % classes
    sets = [centres[c][rng.integers(0, 8, T)] + rng.standard_normal((T, D)) for c in labels]
    return sets, labels


def deep_fisher_workload(scale, rng, svm_timer=None):
    from featpipe.encode.fisher import GaussianMixtureModel
    from featpipe.learn.deep_fisher import DeepFisherKernel

    n = max(3, round(200 * scale))
    train, y_train = fisher_sets(n, 1500, 64, rng)
    val, y_val = fisher_sets(max(3, n // 4), 1500, 64, rng)
    gmm = GaussianMixtureModel(64, max_iter=10, random_state=0).fit(
        np.concatenate(train)[::10])
    init = (gmm.weights_, gmm.means_, gmm.variances_)

    def run(device):
        model = DeepFisherKernel(C=10.0, max_iter=3, patience=10, device=device)
        model.fit(train, y_train, val, y_val, init)
        return model.means_

    return f"deep Fisher, {n} train sets x 1,500 x 64, K=64, 3 iterations", run


def ns_workload(scale, rng):
    from featpipe.backend import device_namespace
    from featpipe.encode.bilinear import bilinear_pool, newton_schulz_sqrtm

    n = max(1, round(64 * scale))
    F = np.maximum(rng.standard_normal((n, 196, 512)), 0).astype(np.float32)

    def run(device):
        xp, dev = device_namespace(device)
        X = xp.asarray(F, device=dev) if device != "cpu" else F
        covariance = bilinear_pool(X - xp.mean(X, axis=-2, keepdims=True))
        out = newton_schulz_sqrtm(covariance, 5)
        return np.asarray(out.cpu() if hasattr(out, "cpu") else out)

    return f"cov + Newton-Schulz, {n} x 196 x 512", run


def vgg_workload(scale, rng):
    from featpipe.extract.vgg import VGG16Features

    n = max(2, round(128 * scale))
    crops = rng.integers(0, 256, (n, 224, 224, 3), dtype=np.uint8)
    models = {}

    def run(device):
        if device not in models:
            models[device] = VGG16Features(weights="random:0", device=device,
                                           batch_size=32).fit()
        return models[device].transform(crops)

    return f"VGG-16 fc6 model, {n} frames", run


WORKLOADS = {"hrp": hrp_workload, "rankpool": rankpool_workload,
             "deepfisher": deep_fisher_workload, "ns": ns_workload, "vgg": vgg_workload}


def svm_share(scale):
    """Share of the deep Fisher fit spent in the SVM step and in liblinear's conversion of
    the FVs (building its problem), CPU, measured by wrapping those functions."""
    from liblinear import liblinear

    import featpipe.learn.deep_fisher as deep_fisher

    spent = {"svm": 0.0, "conversion": 0.0}
    if not hasattr(deep_fisher, "train_squared_hinge_classes"):
        print("\n(this featpipe has no train_squared_hinge_classes: SVM share not measured)")
        return

    def timing(key, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[key] += time.perf_counter() - start
        return wrapper

    svm, problem_init = deep_fisher.train_squared_hinge_classes, liblinear.problem.__init__
    deep_fisher.train_squared_hinge_classes = timing("svm", svm)
    liblinear.problem.__init__ = timing("conversion", problem_init)
    try:
        label, run = deep_fisher_workload(scale, np.random.default_rng(0))
        start = time.perf_counter()
        run("cpu")
        total = time.perf_counter() - start
    finally:
        deep_fisher.train_squared_hinge_classes = svm
        liblinear.problem.__init__ = problem_init
    print(f"\n{label}, CPU: fit {total:.2f} s; SVM step {spent['svm']:.2f} s "
          f"({100 * spent['svm'] / total:.1f} %), of which liblinear's conversion of the FVs "
          f"{spent['conversion']:.3f} s ({100 * spent['conversion'] / total:.2f} %); once per "
          f"process liblinear compiles its CSR copy loop (numba): {first_problem():.2f} s")


def first_problem() -> float:
    """Seconds of the first liblinear problem built from a CSR matrix in a fresh process."""
    import subprocess
    import sys

    code = ("import time, numpy as np; from scipy import sparse; from liblinear import "
            "liblinear; x = sparse.csr_matrix(np.ones((2, 3))); t = time.perf_counter(); "
            "liblinear.problem(np.ones(2), x); print(time.perf_counter() - t)")
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout)


def ucf101(sample, rng, gpu):
    """hrp defaults on ``sample`` clips of UCF101-like lengths, extrapolated by frames."""
    from featpipe.encode.temporal import HierarchicalRankPooling

    lengths = np.clip(np.round(rng.lognormal(np.log(170.0), 0.45, sample)), 29, 1776)
    seqs = fc6_walks(sample, lengths.astype(int), 4096, rng)
    frames = int(lengths.sum())
    print(f"\nUCF101-sized hrp (defaults; {sample} sampled clips, {frames} frames, mean T "
          f"{frames / sample:.0f}; extrapolated to {UCF101_CLIPS:,} clips = "
          f"{UCF101_FRAMES:,} frames):")
    devices = ["cpu"] + (["cuda"] * gpu)
    for device in devices:
        seconds, _ = timed(lambda device=device: HierarchicalRankPooling(
            device=device).transform(seqs))
        total = seconds * UCF101_FRAMES / frames
        print(f"  {device}: {seconds:.2f} s for the sample ({frames / seconds:,.0f} frames/s) "
              f"-> {total / 3600:.2f} h for UCF101")
    if not gpu:
        print("  cuda: no GPU")


def count_ops(n_items, dim):
    """Top-level aten operator calls per item (torch CPU tensors)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from featpipe.encode.temporal import HierarchicalRankPooling, RankPooling

    def calls(fn):
        fn()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
        events = [e for e in prof.events() if e.name.startswith("aten::")]
        return sum(1 for e in events
                   if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))

    rng = np.random.default_rng(0)
    seqs = [torch.from_numpy(s) for s in fc6_walks(n_items, 300, dim, rng)]
    short = [torch.from_numpy(s) for s in fc6_walks(n_items, 100, dim, rng)]
    rows = [("hrp defaults", f"{n_items} x 300 x {dim}", HierarchicalRankPooling(), seqs),
            ("rankpool both", f"{n_items} x 100 x {dim}", RankPooling(directions="both"),
             short)]
    print("operator calls (top-level aten ops = kernel launches on a GPU), torch CPU:")
    for name, shape, encoder, data in rows:
        total = calls(lambda encoder=encoder, data=data: encoder.transform(data))
        print(f"  {name}, {shape}: {total} calls, {total / n_items:.0f} per item")
    import array_api_compat.torch as torch_xp

    from featpipe.encode.fisher import GaussianMixtureModel
    from featpipe.learn.deep_fisher import DeepFisherKernel

    train, labels = fisher_sets(n_items, 300, 16, rng)
    gmm = GaussianMixtureModel(8, max_iter=5).fit(np.concatenate(train))
    init = (gmm.weights_, gmm.means_, gmm.variances_)
    model = DeepFisherKernel(C=10.0, max_iter=1, patience=10, xp=torch_xp)
    total = calls(lambda: model.fit(train, labels, train[:3], labels[:3], init))
    print(f"  deep Fisher, 1 iteration, {n_items} sets x 300 x 16, K=8: {total} calls, "
          f"{total / n_items:.0f} per image")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply the item counts (e.g. 0.125 on a 2-core machine)")
    parser.add_argument("--only", default=",".join(WORKLOADS),
                        help=f"comma-separated subset of {','.join(WORKLOADS)}")
    parser.add_argument("--threads", type=int, default=0,
                        help="CPU threads (torch, BLAS); default: all cores")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--ucf-sample", type=int, default=32,
                        help="clips in the UCF101 sample (0: skip)")
    parser.add_argument("--count-ops", type=int, nargs="?", const=16, default=0,
                        metavar="ITEMS", help="count operator calls per item instead")
    parser.add_argument("--count-dim", type=int, default=4096,
                        help="feature dimension of the --count-ops sequences")
    args = parser.parse_args(argv)
    import torch
    from threadpoolctl import threadpool_limits

    threads = args.threads or len(os.sched_getaffinity(0))
    if args.threads:  # featpipe's own worker threads (hrp chunks) as well
        os.environ["FEATPIPE_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    with threadpool_limits(threads):
        if args.count_ops:
            count_ops(args.count_ops, args.count_dim)
            return
        run(args, threads)


def run(args, threads):
    gpu = gpu_available()
    print(f"CPU: {threads} threads; GPU: "
          f"{__import__('torch').cuda.get_device_name() if gpu else 'none'}; "
          f"load average {os.getloadavg()[0]:.2f}")
    print("| workload | CPU | CUDA | GPU / CPU | min cosine |\n|---|---|---|---|---|")
    for name in args.only.split(","):
        rng = np.random.default_rng(0)
        label, fn = WORKLOADS[name](args.scale, rng)
        cpu_s, cpu_out = timed(lambda fn=fn: fn("cpu"), args.repeat)
        if gpu:
            gpu_s, gpu_out = timed(lambda fn=fn: fn("cuda"), args.repeat)
            print(f"| {label} | {cpu_s:.3f} s | {gpu_s:.3f} s | {cpu_s / gpu_s:.1f}x | "
                  f"{min_cosine(cpu_out, gpu_out):.6f} |")
        else:
            print(f"| {label} | {cpu_s:.3f} s | no GPU | | |")
    if "deepfisher" in args.only.split(","):
        svm_share(args.scale)
    if args.ucf_sample:
        ucf101(args.ucf_sample, np.random.default_rng(1), gpu)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
