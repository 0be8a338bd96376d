"""DHRP training speed: one epoch with the exact argmin gradient versus the paper's diagonal
approximation, and the share of the epoch spent in the SVR forward solve and in the argmin
backward.

An epoch = for each mini-batch: v_t = L2(TVM(ψ(W x_t))), u* by featpipe's SVR solver, soft-max
NLL, backward (implicit differentiation), Adam step.  Prints the fastest of ``--repeats``
epochs (the machine is shared: the minimum is the least disturbed run), the ratio
exact / diagonal, and the forward solve of one epoch's windows by featpipe's solver versus
liblinear ``-s 11 -B -1`` (the original code's solver), all measured in the same run.

    python benchmarks/bench_dhrp.py [--repeats 3] [--device cpu|cuda] [--threads 1]

``--accuracy`` instead trains DHRP (default hyper-parameters: Adam, lr 0.01, 50 epochs,
patience 10, 20% validation fold) on the HRP layer-2 sequences of aeon's BasicMotions and
JapaneseVowels (their own train/test files, channels standardised with train statistics) and prints
its test accuracy next to plain HRP (same window, stride and map) + the SVM ``classify --kernel
linear --normalize l2`` trains (C = 1000), and the accuracy of its initialisation (that SVM on
u*(I) of the 80 % of the train items DHRP fits on).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import featpipe.learn.dhrp as dhrp
import featpipe.nn.functional as F
from featpipe.nn.functional import rank_pool


class Timers:
    """Wraps the forward solve and the backward gradient of featpipe.nn.functional to time them
    (RankPoolArgmin looks them up in that module at each call)."""

    def __init__(self):
        self.solve = 0.0
        self.backward = 0.0
        self._solve = F.solve_rank_svr
        self._backward = F.argmin_input_gradient

    def __enter__(self):
        def solve(*args, **kwargs):
            start = time.perf_counter()
            out = self._solve(*args, **kwargs)
            self._sync(out[0])
            self.solve += time.perf_counter() - start
            return out

        def backward(*args, **kwargs):
            start = time.perf_counter()
            out = self._backward(*args, **kwargs)
            self._sync(out)
            self.backward += time.perf_counter() - start
            return out

        F.solve_rank_svr, F.argmin_input_gradient = solve, backward
        return self

    def __exit__(self, *exc):
        F.solve_rank_svr, F.argmin_input_gradient = self._solve, self._backward

    @staticmethod
    def _sync(tensor):
        if tensor.is_cuda:
            torch.cuda.synchronize()


def one_epoch(seqs, labels, n_classes, hessian, device, batch_size=16, psi="ssr", seed=0):
    """Seconds of one training epoch, and the seconds spent in the solve and the backward."""
    torch.manual_seed(seed)
    D = seqs[0].shape[1]
    D_out = 2 * D if psi == "ser" else D
    W = torch.eye(D, device=device).requires_grad_(True)
    coef = (0.01 * torch.randn(n_classes, D_out, device=device)).requires_grad_(True)
    opt = torch.optim.Adam([W, coef], lr=1e-3)
    y = torch.as_tensor(labels, device=device)
    order = np.random.default_rng(seed).permutation(len(seqs))
    with Timers() as timers:
        start = time.perf_counter()
        for i in range(0, len(order), batch_size):
            chunk = order[i:i + batch_size]
            batch = [seqs[j] for j in chunk]
            X, mask = F.pad_sequences(batch, torch.float32, device)
            V = F.mapped_sequences(X, mask, W, psi, 1e-3)
            U = rank_pool(V, 1.0, 0.1, hessian, torch.float64, [len(s) for s in batch])
            loss = torch.nn.functional.cross_entropy(U @ coef.T, y[chunk])
            opt.zero_grad()
            loss.backward()
            opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        total = time.perf_counter() - start
    return total, timers.solve, timers.backward


def forward_solve_times(seqs, device, repeats, batch_size=16, psi="ssr"):
    """Seconds to rank-pool one epoch's windows at W = I: featpipe's batched solver versus one
    liblinear call per window (default tolerance, as VideoDarwin runs it)."""
    from featpipe.encode.svr import rank_svr_liblinear

    W = torch.eye(seqs[0].shape[1], device=device)
    batches = []
    for i in range(0, len(seqs), batch_size):
        X, mask = F.pad_sequences(seqs[i:i + batch_size], torch.float32, device)
        batches.append(F.mapped_sequences(X, mask, W, psi, 1e-3))
    ours, theirs = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        for V in batches:
            F.solve_rank_svr(V, 1.0, 0.1, torch.float64)
        ours.append(time.perf_counter() - start)
        start = time.perf_counter()
        for V in batches:
            rank_svr_liblinear(V.cpu().numpy(), 1.0, 0.1)
        theirs.append(time.perf_counter() - start)
    return min(ours), min(theirs)


def basic_motions_layer2():
    from aeon.datasets import load_basic_motions

    from featpipe.encode.temporal import HierarchicalRankPooling

    X, y = load_basic_motions(split="train")
    mean, std = X.mean(axis=(0, 2))[:, None], X.std(axis=(0, 2))[:, None]
    seqs = [((x - mean) / std).T.astype(np.float32) for x in X]
    layer = HierarchicalRankPooling(window=20, stride=5, depth=2, psi="ssr", emit_layer=2)
    return layer.transform_sequences(seqs), np.unique(y, return_inverse=True)[1]


def synthetic(n=64, T=60, D=256, n_classes=8, seed=0):
    rng = np.random.default_rng(seed)
    seqs = [rng.standard_normal((T, D)).astype(np.float32) for _ in range(n)]
    return seqs, rng.integers(0, n_classes, n)


#: dataset -> (loader name, HRP window, HRP stride)
AEON_SETS = {"BasicMotions": ("load_basic_motions", 20, 5),
             "JapaneseVowels": ("load_japanese_vowels", 5, 2)}


def load_aeon(name):
    """Train/test sequences (T, D) of an aeon set, channels standardised with train stats."""
    import aeon.datasets

    load = getattr(aeon.datasets, AEON_SETS[name][0])
    (Xtr, ytr), (Xte, yte) = load(split="train"), load(split="test")
    frames = np.concatenate([np.asarray(x).T for x in Xtr])
    mean, std = frames.mean(axis=0), frames.std(axis=0)

    def to_seqs(X):
        return [((np.asarray(x).T - mean) / std).astype(np.float32) for x in X]

    return to_seqs(Xtr), np.asarray(ytr), to_seqs(Xte), np.asarray(yte)


def accuracy_table(device):
    from featpipe.classify.svm import OneVsRestSVC
    from featpipe.encode.temporal import HierarchicalRankPooling

    def l2(X):
        X = np.asarray(X, dtype=np.float64)
        return X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-300)

    for name, (_, window, stride) in AEON_SETS.items():
        tr, ytr, te, yte = load_aeon(name)
        hrp = {"window": window, "stride": stride, "depth": 2, "psi": "ssr"}
        base = HierarchicalRankPooling(**hrp)
        # what `classify --kernel linear --normalize l2` trains (C = 1000, its default)
        A, B = l2(base.transform(tr)), l2(base.transform(te))
        classes = np.unique(ytr)
        svc = OneVsRestSVC().fit(A @ A.T, ytr[:, None] == classes[None, :])
        base_acc = np.mean(classes[svc.decision_function(B @ A.T).argmax(axis=1)] == yte)
        print(f"{name} ({len(tr)} train, {len(te)} test, D={tr[0].shape[1]}): HRP (M={window}, "
              f"S={stride}, ssr) + classify's SVM (linear, --normalize l2, C = 1000) test "
              f"accuracy {base_acc:.3f}")
        layer = HierarchicalRankPooling(**hrp, emit_layer=2)
        tr2, te2 = layer.transform_sequences(tr), layer.transform_sequences(te)
        for psi in ("ssr", "tanh"):
            for hessian in ("exact", "diagonal"):
                start = time.perf_counter()
                model = dhrp.DiscriminativeRankPooling(psi=psi, hessian=hessian,
                                                       device=str(device)).fit(tr2, ytr)
                seconds = time.perf_counter() - start
                acc = np.mean(model.predict(te2) == yte)
                init = dhrp.DiscriminativeRankPooling.from_arrays(*model.to_arrays())
                init.W_ = np.eye(tr2[0].shape[1], dtype=np.float32)
                init_scores = init.scores(init.transform(te2), initial=True)
                init_acc = np.mean(model.classes_[init_scores.argmax(axis=1)] == yte)
                print(f"  DHRP psi={psi:4s} {hessian:8s}: test accuracy {acc:.3f} (at W = I, "
                      f"classify's SVM init: {init_acc:.3f}); best epoch {model.best_epoch_}/"
                      f"{len(model.history_) - 1}, {seconds:.1f} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (on a loaded shared machine, more than one "
                             "thread can be far slower for these small batched ops)")
    parser.add_argument("--accuracy", action="store_true",
                        help="print the test-accuracy comparison instead of timings")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.accuracy:
        accuracy_table(device)
        return
    cases = {"BasicMotions X^(2) (40 items, T=17, D=6)": basic_motions_layer2(),
             "synthetic (64 items, T=60, D=256)": synthetic()}
    print(f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    for name, (seqs, labels) in cases.items():
        n_classes = int(labels.max()) + 1
        one_epoch(seqs[:16], labels[:16], n_classes, "exact", device)  # warm-up
        results = {}
        for hessian in ("exact", "diagonal"):
            runs = [one_epoch(seqs, labels, n_classes, hessian, device)
                    for _ in range(args.repeats)]
            total, solve, backward = min(runs)
            results[hessian] = total
            print(f"{name}, {hessian:8s}: epoch {total * 1e3:8.1f} ms; SVR solve "
                  f"{solve * 1e3:7.1f} ms ({solve / total:5.1%}); argmin backward "
                  f"{backward * 1e3:6.1f} ms ({backward / total:5.1%})")
        print(f"{name}: exact / diagonal epoch time = "
              f"{results['exact'] / results['diagonal']:.2f}")
        ours, theirs = forward_solve_times(seqs, device, args.repeats)
        print(f"{name}: forward solve of one epoch, featpipe {ours * 1e3:.1f} ms, liblinear "
              f"{theirs * 1e3:.1f} ms: liblinear / featpipe = {theirs / ours:.2f}")


if __name__ == "__main__":
    main()
