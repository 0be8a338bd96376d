"""Second-order normalisation speed: RUN (rank-1 update) against Newton-Schulz and eigh/SVD.

Batch of 32 images, N = 784 positions (28×28 conv map), D = 512 channels, float32, numpy.

Full bilinear: the normalisation step of each method, given the same pooled B = FᵀF/N --
    sqrtm   eigendecomposition U diag(√λ) Uᵀ
    ns      5 coupled Newton-Schulz iterations of iSQRT-COV
    run     K = 2 power iterations and the rank-1 update (I − ηuuᵀ) B (I − ηuuᵀ)
and end to end (pooling + normalisation + upper-triangle vectorisation).
Compact (tensor sketch, d = 8192): normalisation step of RUN on F against the SVD square-root
rows (F = U S Vᵀ -> diag(√S)Vᵀ), both to be sketched; end to end, cbp-ts sketches the pooled
(normalised) D×D matrix here (D² <= N·d), so sqrtm uses eigh there.

Prints seconds per batch (best of --repeat, methods interleaved) and the ratios; target: run
>= 20x faster than ns on 2 cores.  ``--classify`` instead prints test accuracies of the
normalisations on scikit-learn's digits (3×3 patches + position as local features).

    PYTHONPATH=. python benchmarks/bench_secondorder.py [--batch 32 --positions 784 --threads 2]
    PYTHONPATH=. python benchmarks/bench_secondorder.py --classify
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

from featpipe.encode.bilinear import (
    SecondOrderPooling,
    bilinear_pool,
    gaussian_start,
    newton_schulz_sqrtm,
    rank1_update,
    rank1_update_gram,
    sqrtm_eigh,
    svd_sqrt_rows,
)


def interleaved(functions: dict, repeat: int) -> dict:
    """Best-of-``repeat`` seconds per function, the functions taking turns (shared machine:
    the load changes, so each round measures all of them under similar conditions)."""
    best = dict.fromkeys(functions, float("inf"))
    for _ in range(repeat):
        for name, fn in functions.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def speed(args):
    rng = np.random.default_rng(0)
    # ReLU-like non-negative conv activations
    F = np.maximum(rng.standard_normal((args.batch, args.positions, args.channels)), 0)
    F = F.astype(np.float32)
    B = bilinear_pool(F)
    v0 = gaussian_start(args.channels, 0)
    print(f"# {platform.node()} {os.cpu_count()} cpus, {args.threads} BLAS threads, "
          f"numpy {np.__version__}; "
          f"batch {args.batch}, N {args.positions}, D {args.channels}, d {args.dim}")

    t = interleaved({
        "sqrtm": lambda: sqrtm_eigh(B),
        "ns": lambda: newton_schulz_sqrtm(B, 5),
        "run": lambda: rank1_update_gram(B, 2, 0.6, v0),
        "run_F": lambda: rank1_update(F, 2, 0.6, v0),
        "svd_rows": lambda: svd_sqrt_rows(F),
    }, args.repeat)
    print(f"normalisation step, full bilinear (given B): sqrtm(eigh) {t['sqrtm']:.3f} s, "
          f"ns(5) {t['ns']:.3f} s, run(K=2) {t['run']:.4f} s")
    print(f"  ratio ns/run {t['ns'] / t['run']:.1f}x, sqrtm/run {t['sqrtm'] / t['run']:.1f}x "
          f"(target ns/run >= 20x)")
    print(f"normalisation step, compact (given F): svd rows {t['svd_rows']:.3f} s, "
          f"run(K=2) on F {t['run_F']:.4f} s; ratio svd/run {t['svd_rows'] / t['run_F']:.1f}x")

    full = {norm: SecondOrderPooling("bilinear", norm, l2=False)
            for norm in ("sqrtm", "ns", "run")}
    ends = interleaved({norm: (lambda e=e: e.transform(F)) for norm, e in full.items()},
                       args.repeat)
    print(f"end to end, full bilinear (pool + norm + triu): sqrtm {ends['sqrtm']:.3f} s, "
          f"ns {ends['ns']:.3f} s, run {ends['run']:.3f} s; ratio ns/run "
          f"{ends['ns'] / ends['run']:.1f}x, sqrtm/run {ends['sqrtm'] / ends['run']:.1f}x")
    sketches = {norm: SecondOrderPooling("cbp-ts", norm, dim=args.dim, l2=False)
                for norm in ("none", "sqrtm", "run")}
    compact = interleaved({norm: (lambda e=e: e.transform(F)) for norm, e in sketches.items()},
                          1)
    print(f"end to end, compact cbp-ts d={args.dim}: none {compact['none']:.3f} s, "
          f"sqrtm(eigh of B) {compact['sqrtm']:.3f} s, run {compact['run']:.3f} s; "
          f"ratio sqrtm/run {compact['sqrtm'] / compact['run']:.2f}x")


def digit_patches(images):
    """Local features of 8×8 digits: each pixel's 3×3 neighbourhood and its (x, y), D = 11."""
    padded = np.pad(images, ((0, 0), (1, 1), (1, 1)))
    patches = np.stack([padded[:, dy:dy + 8, dx:dx + 8] for dy in range(3) for dx in range(3)],
                       axis=-1) / 16.0
    ys, xs = np.mgrid[0:8, 0:8] / 7.0
    coords = np.broadcast_to(np.stack([xs, ys], axis=-1), (len(images), 8, 8, 2))
    return np.concatenate([patches, coords], axis=-1).reshape(len(images), 64, 11)


def classify(args):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.svm import LinearSVC

    digits = load_digits()
    X = digit_patches(digits.images)
    train, test = train_test_split(np.arange(len(X)), train_size=0.3, random_state=0,
                                   stratify=digits.target)
    print(f"# digits: {len(train)} train / {len(test)} test images, N 64, D 11; LinearSVC C=1")
    for method, norms in (("bilinear", ("none", "ssr", "sqrtm", "ns", "logm", "run")),
                          ("cov", ("none", "ssr", "sqrtm", "ns", "run")),
                          ("cbp-ts", ("none", "ssr", "run"))):
        scores = []
        for norm in norms:
            codes = SecondOrderPooling(method, norm, dim=256).transform(X)
            svm = LinearSVC(C=1.0, max_iter=20000).fit(codes[train], digits.target[train])
            scores.append(f"{norm} {np.mean(svm.predict(codes[test]) == digits.target[test]):.3f}")
        print(f"{method:9s} " + ", ".join(scores))
    gmsop_gates(X, digits.target, train, test, seeds=(0,), weights=(1.0, 100.0))


def gmsop_gates(X, y, train, test, seeds, weights):
    """GM-SOP test accuracy with the paper's SR-SOP gate and with the global-average gate
    (M = 8, K = 4, d = 8, gate_dim 8, Adam lr 0.01, batch 32, 60 epochs, balance weight
    w in ``weights``), per seed and as mean ± std (sample std over seeds)."""
    import torch

    from featpipe.learn.gmsop import GatedMixtureSOP

    torch.set_num_threads(1)  # small batches: one thread (two spin on a shared machine)
    for weight in weights:
        for gate in ("sr-sop", "average"):
            accuracies = []
            for seed in seeds:
                start = time.perf_counter()
                model = GatedMixtureSOP(n_components=8, top_k=4, dim=8, epochs=60, lr=0.01,
                                        batch_size=32, balance_weight=weight, gate=gate,
                                        gate_dim=8, random_state=seed)
                model.fit(list(X[train].astype(np.float32)), y[train])
                predicted = model.predict(list(X[test].astype(np.float32)))
                accuracies.append(float(np.mean(predicted == y[test])))
                print(f"gmsop gate {gate:7s} w={weight:g} seed {seed}: accuracy "
                      f"{accuracies[-1]:.4f} ({time.perf_counter() - start:.0f} s)", flush=True)
            std = np.std(accuracies, ddof=1) if len(accuracies) > 1 else 0.0
            print(f"gmsop gate {gate:7s} w={weight:g}: {np.mean(accuracies):.4f} ± "
                  f"{std:.4f} over seeds {list(seeds)}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--positions", type=int, default=784)
    parser.add_argument("--channels", type=int, default=512)
    parser.add_argument("--dim", type=int, default=8192)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2,
                        help="BLAS threads (threadpoolctl); the target is for 2 cores.")
    parser.add_argument("--classify", action="store_true",
                        help="Instead: accuracy of the normalisations on scikit-learn digits.")
    parser.add_argument("--gmsop-gates", type=int, nargs="*", default=None, metavar="SEED",
                        help="Instead: GM-SOP's SR-SOP gate vs the average gate on the same "
                             "digits split, over these seeds.")
    parser.add_argument("--gmsop-weights", type=float, nargs="+", default=[1.0, 100.0],
                        help="Balance-loss weights w for --gmsop-gates.")
    args = parser.parse_args()
    from threadpoolctl import threadpool_limits

    with threadpool_limits(args.threads):
        if args.gmsop_gates is not None:
            from sklearn.datasets import load_digits
            from sklearn.model_selection import train_test_split

            digits = load_digits()
            X = digit_patches(digits.images)
            train, test = train_test_split(np.arange(len(X)), train_size=0.3, random_state=0,
                                           stratify=digits.target)
            gmsop_gates(X, digits.target, train, test, tuple(args.gmsop_gates or (0, 1, 2)),
                        tuple(args.gmsop_weights))
        else:
            classify(args) if args.classify else speed(args)


if __name__ == "__main__":
    main()
