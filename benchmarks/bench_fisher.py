"""Fisher-vector benchmarks: featpipe vs cyvlfeat (VLFeat) and scikit-image, and the deep
Fisher gradient vs one FV pass and vs the paper's explicit-Jacobian formulation.

Data: real dense SIFT (OpenCV, 4-pixel grid, bin 6, RootSIFT-like square root) of
scikit-learn's two sample photographs at three scales, mirrored; PCA to D = 64 and 80; a
K = 256 diagonal GMM fitted by featpipe's EM (20 iterations) on a sample.  Every ratio is
measured in the same run.  Usage::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_fisher.py \
        [--repeat 3] [--threads N] [--only PART] [--em-rows 1000000]

(the two OpenBLAS variables, set on these machines, slow a current numpy: unset them in the
benchmark command only, never in tests or CI).  The BLAS kernel in use is printed.

Idle OpenMP threads sleep (OMP_WAIT_POLICY=passive, set before any library loads): cyvlfeat's
OpenMP workers otherwise spin after each call and take the cores from the next contender
(measured: featpipe 0.61 s passive vs 0.92 s spinning on the same data).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import argparse
import math
import time

import cv2
import numpy as np

from featpipe.encode.fisher import FisherAccumulator, GaussianMixtureModel, fisher_vector
from featpipe.learn.deep_fisher import fisher_backward, fisher_forward


def dense_sift(gray, step=4, bin_size=6):
    height, width = gray.shape
    margin = 2 * bin_size
    keypoints = [cv2.KeyPoint(float(x), float(y), bin_size / 1.5, 0)
                 for y in range(margin, height - margin + 1, step)
                 for x in range(margin, width - margin + 1, step)]
    _, desc = cv2.SIFT_create().compute(gray, keypoints)
    return np.sqrt(desc / 512.0).astype(np.float32)


def real_descriptors():
    from sklearn.datasets import load_sample_images

    images = []
    for img in load_sample_images().images:
        gray = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)
        for scale in (1.0, 0.75, 0.5):
            small = cv2.resize(gray, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
            images += [dense_sift(small), dense_sift(np.ascontiguousarray(small[:, ::-1]))]
    return images


def best_time(func, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return min(times)


def best_wall_and_cpu(func, repeat):
    """(wall, process CPU) seconds of the fastest of ``repeat`` calls by wall time: with
    worker threads, CPU above wall x threads is spin or contention, CPU above the one-thread
    CPU time is the threads' overhead."""
    best = (float("inf"), float("inf"))
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        func()
        best = min(best, (time.perf_counter() - wall, time.process_time() - cpu))
    return best


def best_cpu_time(func, repeat):
    """Least process CPU time of ``repeat`` calls: on a machine shared with other jobs a
    one-thread run's CPU time is what it would take alone, where its wall time is not."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        func()
        times.append(time.process_time() - start)
    return min(times)


def blas_kernel() -> str:
    from threadpoolctl import threadpool_info

    return ", ".join(f"{i['internal_api']} {i.get('version')} {i.get('architecture')}"
                     for i in threadpool_info() if i["user_api"] == "blas")


def float32_peak(repeat) -> float:
    """GFLOP/s of one core on a float32 GEMM (1024², one BLAS thread): the reference for the
    fraction of the peak the encoder reaches."""
    from threadpoolctl import threadpool_limits

    a = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
    with threadpool_limits(1, user_api="blas"):
        return 2 * 1024**3 / best_cpu_time(lambda: a @ a, repeat) / 1e9


def sklearn_gmm(weights, means, variances):
    from sklearn.mixture import GaussianMixture

    gmm = GaussianMixture(len(weights), covariance_type="diag")
    gmm.weights_, gmm.means_, gmm.covariances_ = weights, means, variances
    gmm.precisions_cholesky_ = 1.0 / np.sqrt(variances)
    return gmm


def project(images, dim):
    stacked = np.concatenate(images).astype(np.float64)
    mean = stacked.mean(axis=0)
    components = np.linalg.svd(stacked[::8] - mean, full_matrices=False)[2][:dim]
    return [((x - mean) @ components.T).astype(np.float32) for x in images]


def bench_encoding(images, dim, k, repeat, peak, threads, skimage=False):
    """featpipe's improved FV against cyvlfeat's in the same run, both on one thread (CPU
    time; BLAS and OpenMP, which VLFeat's encoder uses, limited to one thread), then featpipe
    on 1..``threads`` worker threads of its one pool (wall time, one BLAS thread each);
    descriptors/s, ratios, and the fraction of the float32 peak reached (6·K·D flops per
    descriptor, the issue's count of the arithmetic: the GEMM's 4KD and the rest)."""
    from threadpoolctl import threadpool_limits

    projected = project(images, dim)
    sample = np.concatenate(projected)[::4]
    start = time.perf_counter()
    gmm = GaussianMixtureModel(k, max_iter=20, random_state=0).fit(sample)
    fit_seconds = time.perf_counter() - start
    w, m, v = (a.astype(np.float32) for a in (gmm.weights_, gmm.means_, gmm.variances_))
    n = sum(len(x) for x in projected)
    print(f"\nD={dim}, K={k}: {len(projected)} images, {n} descriptors "
          f"(EM on {len(sample)} descriptors: {fit_seconds:.1f}s, {gmm.n_iter_} iterations)")

    def ours():
        return [fisher_vector(x, w, m, v) for x in projected]

    os.environ["FEATPIPE_THREADS"] = "1"
    one_thread = threadpool_limits(1)  # BLAS and OpenMP
    rows = {"featpipe": best_cpu_time(ours, repeat)}
    try:
        from cyvlfeat.fisher import fisher as vl_fisher
    except ImportError:
        vl_fisher = None
        print("  cyvlfeat not installed: VLFeat comparison skipped")
    if vl_fisher is not None:
        def vlfeat():
            return [vl_fisher(x, m, v, w, improved=True).ravel() for x in projected]

        rows["cyvlfeat"] = best_cpu_time(vlfeat, repeat)
        theta = (np.log(w.astype(np.float64)), m.astype(np.float64),
                 0.5 * np.log(v.astype(np.float64)))
        ref = [fisher_forward(x.astype(np.float64), *theta)[0] for x in projected]

        def worst(fvs):
            return max(np.abs(a - b).max() for a, b in zip(fvs, ref, strict=True))

        print(f"  max |FV - float64 reference|: featpipe {worst(ours()):.1e}, "
              f"cyvlfeat {worst(vlfeat()):.1e}")
    if skimage:
        from skimage.feature import fisher_vector as sk_fisher

        skgmm = sklearn_gmm(gmm.weights_, gmm.means_, gmm.variances_)
        rows["scikit-image"] = best_cpu_time(
            lambda: [sk_fisher(x.astype(np.float64), skgmm, improved=True) for x in projected],
            1)
    one_thread.restore_original_limits()
    print("  one thread (CPU time):")
    for name, seconds in rows.items():
        print(f"    {name:13s} {seconds:8.3f}s  {n / seconds / 1e3:8.1f}k descriptors/s  "
              f"featpipe x{seconds / rows['featpipe']:.2f}")
    serial = serial_part(projected, w, m, v, repeat)
    print(f"    featpipe per image outside the tasks (set-up, sums, normalisation; CPU): "
          f"{serial * 1e6 / len(projected):.0f} us = {serial / rows['featpipe']:.3f} of the "
          f"time: two threads at most x{2.0 / (1.0 + serial / rows['featpipe']):.2f}")
    flops = 6.0 * k * dim * n / rows["featpipe"] / 1e9
    print(f"    featpipe: {flops:.1f} GFLOP/s = {flops / peak:.2f} of the float32 GEMM peak "
          f"({peak:.1f} GFLOP/s)")
    print(f"  worker threads (wall time, CPU time beside; FEATPIPE_THREADS, one pool, one BLAS "
          f"thread each; load {os.getloadavg()[0]:.1f}):")
    curve = {}
    for count in range(1, threads + 1):
        os.environ["FEATPIPE_THREADS"] = str(count)
        seconds, cpu = best_wall_and_cpu(ours, repeat)
        curve[count] = seconds
        print(f"    {count} thread(s): {seconds:7.3f}s (CPU {cpu:.3f}s)  "
              f"{n / seconds / 1e3:8.1f}k descriptors/s  x{curve[1] / seconds:.2f} of one thread")
    del os.environ["FEATPIPE_THREADS"]
    SUMMARY.append((dim, k, n / rows["featpipe"], rows.get("cyvlfeat", math.nan) /
                    rows["featpipe"], flops / peak,
                    {c: curve[1] / t for c, t in curve.items()}))
    return projected, gmm


def serial_part(projected, w, m, v, repeat):
    """CPU seconds of the encoder's work per image that its worker threads do not share, for
    all images: an accumulator's set-up, adding one task's sums, the normalisation
    (``result``)."""
    sums = [FisherAccumulator(w, m, v).add(x) for x in projected]

    def outside():
        for done in sums:
            accumulator = FisherAccumulator(w, m, v)
            accumulator.first += done.first
            accumulator.second += done.second
            accumulator.mass += done.mass
            accumulator.result()

    return best_cpu_time(outside, repeat)


#: (D, K, featpipe descriptors/s on one thread, ratio to cyvlfeat, fraction of the float32
#: peak, speed-up over one thread by worker-thread count) of each encoding run
SUMMARY = []


def print_summary():
    print("\nSummary (one thread: CPU time; threads: wall time):")
    print("  | D | K | featpipe 1 thread | x cyvlfeat | fraction of float32 peak | "
          "threads: x of one thread |")
    for dim, k, rate, ratio, fraction, scaling in SUMMARY:
        curve = ", ".join(f"{c}: x{x:.2f}" for c, x in scaling.items())
        print(f"  | {dim} | {k} | {rate / 1e3:.0f}k desc/s | {ratio:.2f} | {fraction:.2f} | "
              f"{curve} |")


def bench_em(images, n_rows, k, iterations, repeat):
    """EM (diagonal) from one initialisation for the same number of iterations: featpipe
    against scikit-learn's GaussianMixture and cyvlfeat's gmm, one thread each; the final
    mean log-likelihoods (featpipe's score on the same data) must agree within 1e-4."""
    from sklearn.mixture import GaussianMixture
    from threadpoolctl import threadpool_limits

    x = np.concatenate(project(images, 64)).astype(np.float64)
    x = x[np.random.default_rng(0).integers(0, len(x), n_rows)]
    init = GaussianMixtureModel(k, max_iter=1, random_state=0).fit(x[::10])
    start = {"weights": init.weights_, "means": init.means_, "variances": init.variances_}
    print(f"\nGMM EM: {n_rows} x 64 (real dense SIFT, PCA 64), K={k}, {iterations} "
          f"iterations from one initialisation, one thread:")
    models, times = {}, {}
    os.environ["FEATPIPE_THREADS"] = "1"
    with threadpool_limits(1):
        def ours():
            models["featpipe"] = GaussianMixtureModel(
                k, max_iter=iterations, tol=0.0, variance_floor=0.0).fit(
                x, init_params=start)

        times["featpipe"] = best_cpu_time(ours, repeat)

        def sklearn():
            models["scikit-learn"] = GaussianMixture(
                k, covariance_type="diag", max_iter=iterations, tol=0.0, reg_covar=0.0,
                weights_init=start["weights"], means_init=start["means"],
                precisions_init=1.0 / start["variances"]).fit(x)

        times["scikit-learn"] = best_cpu_time(sklearn, repeat)
        try:  # cyvlfeat 0.7.1's gmm() refuses array initialisations (any() of arrays)
            from cyvlfeat.gmm.cygmm import cy_gmm
        except ImportError:
            cy_gmm = None
        if cy_gmm is not None:
            def vlfeat():
                models["cyvlfeat"] = cy_gmm(
                    x, k, iterations, b"custom", 1, 0, covariance_bound=np.full(64, 1e-10),
                    init_priors=start["weights"].copy(), init_means=start["means"].copy(),
                    init_covars=start["variances"].copy())

            times["cyvlfeat"] = best_cpu_time(vlfeat, repeat)

    def loglik(name):
        model = models[name]
        if name == "cyvlfeat":
            means, covars, priors = model[:3]
            arrays = (priors, means, covars)
        elif name == "scikit-learn":
            arrays = (model.weights_, model.means_, model.covariances_)
        else:
            arrays = (model.weights_, model.means_, model.variances_)
        ref = GaussianMixtureModel(k)
        ref.weights_, ref.means_, ref.variances_ = (np.asarray(a, np.float64) for a in arrays)
        return ref.score(x)

    del os.environ["FEATPIPE_THREADS"]
    base = loglik("featpipe")
    for name, seconds in times.items():
        ll = loglik(name)
        print(f"    {name:13s} {seconds:8.2f}s  featpipe x{seconds / times['featpipe']:.2f}  "
              f"mean log-likelihood {ll:.6f} (relative difference "
              f"{abs(ll - base) / abs(base):.1e})")


def bench_gradient(projected, gmm, repeat):
    """Deep-Fisher gradient (forward with cache + backward) vs the FV encoder, same data."""
    x_all = projected
    rng = np.random.default_rng(0)
    print("\nDeep-Fisher gradient vs FV encoding (same images, K=256, "
          f"D={gmm.means_.shape[1]}):")
    encode = best_time(lambda: [fisher_vector(x, gmm.weights_, gmm.means_, gmm.variances_)
                                for x in x_all], repeat)
    for dtype in (np.float32, np.float64):
        theta = tuple(p.astype(dtype) for p in (np.log(gmm.weights_), gmm.means_,
                                                0.5 * np.log(gmm.variances_)))
        xs = [x.astype(dtype) for x in x_all]
        g_phi = rng.normal(size=2 * gmm.means_.size).astype(dtype)

        def forward(xs=xs, theta=theta):
            for x in xs:
                fisher_forward(x, *theta)

        def gradient(xs=xs, theta=theta, g_phi=g_phi):
            for x in xs:
                fisher_backward(fisher_forward(x, *theta)[1], g_phi, 0.0)

        t_fwd, t_grad = best_time(forward, repeat), best_time(gradient, repeat)
        print(f"  {np.dtype(dtype).name}: array-API FV forward {t_fwd:.3f}s, forward+gradient "
              f"{t_grad:.3f}s; gradient / FV encoder = {t_grad / encode:.2f} "
              f"(encoder {encode:.3f}s), gradient / array-API forward = {t_grad / t_fwd:.2f}")


def explicit_jacobian_gradient(x, a, mu, s, g_phi):
    """The paper's formulation: build d phi / d theta explicitly (O(d^2 T)), then J^T g."""
    k, dim = mu.shape
    t = x.shape[0]
    n_par = k + 2 * k * dim
    pi = np.exp(a - a.max())
    pi /= pi.sum()
    sigma = np.exp(s)
    d = (x[:, None, :] - mu[None]) / sigma[None]                       # (T, K, D)
    logp = np.log(pi) - s.sum(axis=1) - 0.5 * np.sum(d * d, axis=2)
    gamma = np.exp(logp - logp.max(axis=1, keepdims=True))
    gamma /= gamma.sum(axis=1, keepdims=True)
    # dl_tk / dtheta, (T, K, P)
    dl = np.zeros((t, k, n_par))
    dl[:, :, :k] = np.eye(k)[None] - pi[None, None, :]
    for j in range(k):
        dl[:, j, k + j * dim:k + (j + 1) * dim] = d[:, j] / sigma[j]
        dl[:, j, k + k * dim + j * dim:k + k * dim + (j + 1) * dim] = d[:, j] ** 2 - 1
    dgamma = gamma[:, :, None] * (dl - np.einsum("tk,tkp->tp", gamma, dl)[:, None, :])
    cu = 1.0 / (t * np.sqrt(pi))
    cv = cu / np.sqrt(2.0)
    dc = -0.5 * (np.eye(k) - pi[None, :])                              # dlog c_k / da_l
    su = np.einsum("tk,tkd->kd", gamma, d)
    sv = np.einsum("tk,tkd->kd", gamma, d * d - 1)
    ju = cu[:, None, None] * np.einsum("tkd,tkp->kdp", d, dgamma)
    jv = cv[:, None, None] * np.einsum("tkd,tkp->kdp", d * d - 1, dgamma)
    ju[:, :, :k] += (cu[:, None] * su)[:, :, None] * dc[:, None, :]
    jv[:, :, :k] += (cv[:, None] * sv)[:, :, None] * dc[:, None, :]
    g_sum = gamma.sum(axis=0)
    for j in range(k):
        rows = np.arange(dim)
        ju[j, rows, k + j * dim + rows] -= cu[j] * g_sum[j] / sigma[j]
        ju[j, rows, k + k * dim + j * dim + rows] -= cu[j] * su[j]
        jv[j, rows, k + j * dim + rows] -= cv[j] * 2 * su[j] / sigma[j]
        jv[j, rows, k + k * dim + j * dim + rows] -= cv[j] * 2 * np.einsum(
            "t,td->d", gamma[:, j], d[:, j] ** 2)
    jz = np.concatenate([ju.reshape(-1, n_par), jv.reshape(-1, n_par)])
    z = np.concatenate([(cu[:, None] * su).ravel(), (cv[:, None] * sv).ravel()])
    psi = np.sign(z) * np.sqrt(np.abs(z))
    norm = np.linalg.norm(psi)
    phi = psi / norm
    j_norm = (np.eye(len(z)) - np.outer(phi, phi)) / norm
    j_phi = j_norm @ (jz / (2 * np.sqrt(np.abs(z)))[:, None])
    grad = j_phi.T @ g_phi
    return grad[:k], grad[k:k + k * dim].reshape(k, dim), grad[k + k * dim:].reshape(k, dim)


def bench_explicit_jacobian(repeat):
    rng = np.random.default_rng(0)
    k, dim, t = 8, 16, 1000
    mu = rng.normal(size=(k, dim))
    s = np.log(rng.uniform(0.7, 1.3, size=(k, dim)))
    a = rng.normal(size=k) * 0.2
    x = mu[rng.integers(0, k, t)] + rng.normal(size=(t, dim))
    g_phi = rng.normal(size=2 * k * dim)
    ours = fisher_backward(fisher_forward(x, a, mu, s, threshold=0.0)[1], g_phi, 0.0)
    ref = explicit_jacobian_gradient(x, a, mu, s, g_phi)
    error = max(np.abs(o - r).max() / np.abs(r).max() for o, r in zip(ours, ref, strict=True))
    if error > 1e-8:
        raise SystemExit(f"reverse-mode and explicit-Jacobian gradients differ: {error:.1e}")
    t_vjp = best_time(lambda: fisher_backward(fisher_forward(x, a, mu, s, threshold=0.0)[1],
                                              g_phi, 0.0), repeat)
    t_jac = best_time(lambda: explicit_jacobian_gradient(x, a, mu, s, g_phi), repeat)
    print(f"\nExplicit Jacobian (paper) vs reverse mode, K={k} D={dim} T={t} (float64): "
          f"{t_jac * 1e3:.1f} ms vs {t_vjp * 1e3:.2f} ms, ratio x{t_jac / t_vjp:.0f}; "
          f"max relative difference {error:.1e}")


def digits_experiment(classes=(3, 5, 8), per_class=100, k=16, dim=32, C=10.0, subsample=1.0,
                      max_iter=20):
    """Real data: dense SIFT on digits (x6 upsampled), FV + linear SVM, before and after
    deep Fisher learning (shared GMM); train/validation/test = 40/20/40 % per class."""
    from sklearn.datasets import load_digits

    from featpipe.learn.deep_fisher import DeepFisherKernel, svm_objective, train_squared_hinge

    digits = load_digits()
    rng = np.random.default_rng(0)
    descs, labels, part = [], [], []
    for c in classes:
        idx = rng.permutation(np.flatnonzero(digits.target == c))[:per_class]
        for j, i in enumerate(idx):
            img = (digits.images[i] * (255.0 / 16.0)).astype(np.uint8)
            big = cv2.resize(img, None, fx=6, fy=6, interpolation=cv2.INTER_LINEAR)
            descs.append(dense_sift(big, step=4, bin_size=4))
            labels.append(c)
            part.append(0 if j < 0.4 * len(idx) else 1 if j < 0.6 * len(idx) else 2)
    labels, part = np.asarray(labels), np.asarray(part)
    train, val, test = (np.flatnonzero(part == p) for p in range(3))
    stacked = np.concatenate([descs[i] for i in train]).astype(np.float64)
    mean = stacked.mean(axis=0)
    components = np.linalg.svd(stacked - mean, full_matrices=False)[2][:dim]
    projected = [(x - mean) @ components.T for x in descs]
    gmm = GaussianMixtureModel(k, random_state=0).fit(
        np.concatenate([projected[i] for i in train]))
    classes = np.asarray(classes)

    def evaluate(weights, means, variances):
        phi = np.stack([fisher_vector(x, weights, means, variances) for x in projected]
                       ).astype(np.float64)
        y = np.where(labels[:, None] == classes[None, :], 1.0, -1.0)
        w = np.stack([train_squared_hinge(phi[train], y[train, j], C, 1e-4)
                      for j in range(len(classes))])
        accuracy = {name: float(np.mean(classes[np.argmax(phi[idx] @ w.T, axis=1)]
                                        == labels[idx]))
                    for name, idx in (("val", val), ("test", test))}
        return svm_objective(w, phi[train], y[train], C), accuracy

    start = time.perf_counter()
    model = DeepFisherKernel(C=C, max_iter=max_iter, patience=5, subsample=subsample).fit(
        [projected[i] for i in train], labels[train], [projected[i] for i in val], labels[val],
        (gmm.weights_, gmm.means_, gmm.variances_))
    seconds = time.perf_counter() - start
    history = model.history_[0]
    objectives = [h["objective"] for h in history]
    before = evaluate(gmm.weights_, gmm.means_, gmm.variances_)
    after = evaluate(model.weights_, model.means_, model.variances_)
    print(f"\nDigits {'/'.join(map(str, classes))}, dense SIFT (x6 upsampled, "
          f"{len(descs[0])} descriptors/image), "
          f"PCA-{dim}, K={k}, C={C}, subsample={subsample}: {len(train)}/{len(val)}/"
          f"{len(test)} train/val/test images; deep Fisher {len(history) - 1} steps in "
          f"{seconds:.1f}s")
    print("  training objective per accepted step: "
          + " ".join(f"{o:.4f}" for o in objectives))
    decreasing = all(b < a for a, b in zip(objectives, objectives[1:], strict=False))
    print(f"  strictly decreasing: {decreasing}; validation per step: "
          + " ".join(f"{h['validation']:.3f}" for h in history))
    print(f"  initial GMM: objective {before[0]:.4f}, val acc {before[1]['val']:.3f}, "
          f"test acc {before[1]['test']:.3f}")
    print(f"  learned GMM (iteration {model.best_iteration_[0]}): objective {after[0]:.4f}, "
          f"val acc {after[1]['val']:.3f}, test acc {after[1]['test']:.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="largest worker-thread count of the scaling curve (default: "
                        "every core)")
    parser.add_argument("--only", choices=["encoding", "em", "gradient", "jacobian", "digits"],
                        default=None, help="run one part (digits: deep Fisher on real digits, "
                        "not part of the default run)")
    parser.add_argument("--em-rows", type=int, default=1_000_000)
    parser.add_argument("--em-iterations", type=int, default=10)
    parser.add_argument("--skimage", action="store_true", help="also time scikit-image")
    args = parser.parse_args()
    from threadpoolctl import threadpool_limits

    print(f"BLAS: {blas_kernel()}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')}, "
          f"OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE')}; {os.cpu_count()} cores, "
          f"{len(os.sched_getaffinity(0))} available; load {os.getloadavg()}", flush=True)
    if args.only == "digits":
        with threadpool_limits(1):
            digits_experiment()
            digits_experiment(classes=tuple(range(10)), per_class=50, k=8, dim=16)
        return
    images = real_descriptors() if args.only in (None, "encoding", "gradient", "em") else None
    if args.only in (None, "encoding"):
        peak = float32_peak(args.repeat)
        for dim in (64, 80):
            for k in (64, 256):
                bench_encoding(images, dim, k, args.repeat, peak, args.threads, args.skimage)
        print_summary()
    if args.only in (None, "em"):
        bench_em(images, args.em_rows, 256, args.em_iterations, 1)
    with threadpool_limits(1):
        if args.only in (None, "gradient"):
            projected = project(images, 80)
            gmm = GaussianMixtureModel(256, max_iter=20, random_state=0).fit(
                np.concatenate(projected)[::4])
            bench_gradient(projected, gmm, args.repeat)
        if args.only in (None, "jacobian"):
            bench_explicit_jacobian(args.repeat)


if __name__ == "__main__":
    main()
