"""Deep Fisher kernel through the command line on a second held-out-style set: handwritten
digits (scikit-learn's ``load_digits``), base vs learned GMM under both SVMs.

The data: the first ``--per-class`` digits of each of the ten classes, 8 × 8 images scaled to
0-255 and resized to 32 × 32 (bilinear), written as PNG files in ``WORK/images/<digit>/``.  Per
seed, every command a user runs:

    featpipe manifest build images -o M.csv --test-fraction 0.5 --seed S
    featpipe extract --manifest M.csv --features dsift --sizes 4 --step 2 --name dS
    featpipe fit pca --input dS --n-components 8 --seed S --name pS
    featpipe fit gmm --input dS --pca pS --n-components 4 --seed S --name gS
    featpipe fit deep-gmm --input dS --gmm gS --mode per-class --seed S --name deepS
    featpipe encode --input dS --method fisher --gmm gS|deepS --name fvbS|fvdS
    featpipe classify --input fvbS|fvdS --kernel linear --normalize l2 --C C --metric map

``fit deep-gmm`` runs at its defaults (C = 1, 20 iterations, the last GMM kept, 25 % of the
train items held out for validation).  Reported per seed: the validation mAP that ``fit
deep-gmm`` prints under the paper's SVM (squared hinge, no bias) and under the SVM ``classify``
trains (libsvm C-SVC with a bias, C = 1), base → learned; and the transfer: ``classify`` on
every train item → test mAP and accuracy, base GMM vs learned GMMs, at C = 1 (deep-gmm's C)
and C = 1000 (``classify``'s default).  Then mean ± sample std over seeds of each figure and
of the paired gains.

    python benchmarks/deep_fisher_cli.py --seeds 0 1 2 3 4 --work /tmp/deep-cli --out r.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CLASSIFY_C = (1.0, 1000.0)


def featpipe(*args) -> str:
    print(f"  $ featpipe {' '.join(map(str, args))}", flush=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "featpipe", *map(str, args)], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"featpipe {' '.join(map(str, args))} exited {proc.returncode}\n"
                         f"{proc.stdout}\n{proc.stderr}")
    return proc.stdout + proc.stderr


def write_digits(folder: Path, per_class: int) -> int:
    import cv2
    from sklearn.datasets import load_digits

    digits = load_digits()
    count = 0
    for digit in range(10):
        (folder / str(digit)).mkdir(parents=True, exist_ok=True)
        for n, index in enumerate(np.flatnonzero(digits.target == digit)[:per_class]):
            image = (digits.images[index] * (255.0 / 16.0)).astype(np.uint8)
            cv2.imwrite(str(folder / str(digit) / f"{n:03d}.png"),
                        cv2.resize(image, (32, 32), interpolation=cv2.INTER_LINEAR))
            count += 1
    return count


def run_seed(work: Path, seed: int) -> dict:
    from featpipe.store import Store

    store = work / "store"
    manifest = work / f"split{seed}.csv"
    common = ("--store", store, "-q")
    featpipe("manifest", "build", work / "images", "-o", manifest, "--test-fraction", 0.5,
             "--seed", seed)
    featpipe("extract", "--manifest", manifest, *common, "--features", "dsift", "--sizes", 4,
             "--step", 2, "--name", f"d{seed}")
    featpipe("fit", "pca", *common, "--input", f"d{seed}", "--n-components", 8, "--seed", seed,
             "--name", f"p{seed}")
    featpipe("fit", "gmm", *common, "--input", f"d{seed}", "--pca", f"p{seed}",
             "--n-components", 4, "--seed", seed, "--name", f"g{seed}")
    start = time.perf_counter()
    printed = featpipe("fit", "deep-gmm", "--store", store, "--input", f"d{seed}", "--gmm",
                       f"g{seed}", "--mode", "per-class", "--seed", seed, "--name",
                       f"deep{seed}")
    seconds = time.perf_counter() - start
    _, meta = Store(store).resolve(f"deep{seed}").load_model("gmm")
    evaluation = meta["evaluation"]
    transfer = {}
    for which, gmm in (("base", f"g{seed}"), ("learned", f"deep{seed}")):
        featpipe("encode", *common, "--input", f"d{seed}", "--method", "fisher", "--gmm", gmm,
                 "--name", f"fv-{which}{seed}")
        for C in CLASSIFY_C:
            report = work / f"{which}{seed}-C{C:g}.json"
            featpipe("classify", *common, "--input", f"fv-{which}{seed}", "--kernel", "linear",
                     "--normalize", "l2", "--C", C, "--metric", "map", "--report", report)
            data = json.loads(report.read_text())
            split = data["splits"][0] if "splits" in data else data["results"][0]
            transfer[f"{which} C={C:g}"] = {"map": data["summary"]["mean"],
                                            "accuracy": split.get("accuracy")}
    return {"seed": seed, "deep_gmm_seconds": seconds, "printed": [
        line for line in printed.splitlines() if "validation mAP" in line],
        "validation": {svm: {k: evaluation[svm][k] for k in ("base_map", "learned_map")}
                       for svm in ("paper", "classify")}, "transfer": transfer}


def stats(values) -> str:
    values = np.asarray(values, dtype=np.float64)
    std = values.std(ddof=1) if len(values) > 1 else 0.0
    return f"{values.mean():.4f} ± {std:.4f}"


def gains(values) -> str:
    values = 100 * np.asarray(values, dtype=np.float64)
    std = values.std(ddof=1) if len(values) > 1 else 0.0
    return f"{values.mean():+.2f} ± {std:.2f} ({' '.join(f'{v:+.1f}' for v in values)})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--per-class", type=int, default=120)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not (args.work / "images").exists():
        print(f"wrote {write_digits(args.work / 'images', args.per_class)} digit images")
    results = []
    for seed in args.seeds:
        r = run_seed(args.work, seed)
        results.append(r)
        print(f"seed {seed} (fit deep-gmm {r['deep_gmm_seconds']:.0f} s):")
        for line in r["printed"]:
            print(f"  {line.strip()}")
        for key, value in r["transfer"].items():
            print(f"  transfer {key}: test mAP {value['map']:.4f}, accuracy "
                  f"{value['accuracy']}")
    print(f"over seeds {args.seeds} (mean ± sample std; gains in points, paired per seed):")
    for svm in ("paper", "classify"):
        base = [r["validation"][svm]["base_map"] for r in results]
        learned = [r["validation"][svm]["learned_map"] for r in results]
        print(f"  validation mAP, {svm}'s SVM: {stats(base)} -> {stats(learned)}, gain "
              f"{gains(np.subtract(learned, base))}")
    for C in CLASSIFY_C:
        for metric in ("map", "accuracy"):
            base = [r["transfer"][f"base C={C:g}"][metric] for r in results]
            learned = [r["transfer"][f"learned C={C:g}"][metric] for r in results]
            if None in base + learned:
                continue
            print(f"  transfer, classify --C {C:g}, test {metric}: {stats(base)} -> "
                  f"{stats(learned)}, gain {gains(np.subtract(learned, base))}")
    if args.out:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                        "results": results}, indent=1))


if __name__ == "__main__":
    main()
