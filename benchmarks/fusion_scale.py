"""Fused accuracies with each kernel taken as computed and scaled to a unit mean diagonal, on
the demo's encodings (issue 40; docs/classify.md, "Fusion").

    PYTHONPATH=. python benchmarks/fusion_scale.py featpipe-demo/store [featpipe-demo-quick/store]

For every task of the demo whose encodings the store holds (GunPoint, BasicMotions, rendered
motion through dense SIFT and through VGG-16 fc6) and every pair of its encoders (avg, max,
rankpool, arp, hrp), fused with the kernels (linear, linear), (chi2+ser, chi2+ser),
(linear, chi2+ser) and (chi2+ser, linear): the test accuracy of split 1 under each rule, as
the demo classifies (L2-normalised encodings, libsvm, C = 1000).  Prints, per task and kernel
pair, the mean accuracy under each rule and how many encoder pairs each rule wins, then the
totals; with ``--pairs`` every pair's two accuracies.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import numpy as np

from featpipe.classify.experiment import Settings, run_split
from featpipe.store import Store

TASKS = {"gunpoint": "GunPoint", "basicmotions": "BasicMotions",
         "motion-dsift": "rendered motion, dense SIFT", "motion-fc6": "rendered motion, fc6"}
ENCODERS = ("avg", "max", "rankpool", "arp", "hrp")
KERNEL_PAIRS = (("linear", "linear"), ("chi2+ser", "chi2+ser"), ("linear", "chi2+ser"),
                ("chi2+ser", "linear"))
RULES = ("none", "unit-diagonal")


def accuracy(store: Store, names: tuple[str, str], kernels: tuple[str, str], rule: str) -> float:
    stages = [store.resolve(n) for n in names]
    settings = Settings(normalize="l2", fusion_scale=rule, n_jobs=1)
    return run_split(stages, kernels, stages[0].items, 1, settings)["accuracy"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stores", nargs="+", help="demo stores (featpipe-demo/store)")
    parser.add_argument("--pairs", action="store_true", help="print every encoder pair")
    args = parser.parse_args(argv)
    totals = {rule: [] for rule in RULES}
    wins = dict.fromkeys(("none", "unit-diagonal", "tie"), 0)
    for path in args.stores:
        store = Store(path)
        names = store.names()
        for prefix, title in TASKS.items():
            if f"{prefix}-hrp" not in names:
                continue
            for kernels in KERNEL_PAIRS:
                found = {rule: [] for rule in RULES}
                counted = dict.fromkeys(wins, 0)
                for a, b in itertools.combinations(ENCODERS, 2):
                    pair = (f"{prefix}-{a}", f"{prefix}-{b}")
                    values = [accuracy(store, pair, kernels, rule) for rule in RULES]
                    for rule, value in zip(RULES, values, strict=True):
                        found[rule].append(value)
                        totals[rule].append(value)
                    best = "tie" if values[0] == values[1] else RULES[int(values[1] > values[0])]
                    counted[best] += 1
                    if args.pairs:
                        print(f"  {title}: {a} ({kernels[0]}) + {b} ({kernels[1]}): "
                              f"none {values[0]:.3f}, unit-diagonal {values[1]:.3f}")
                for key, n in counted.items():
                    wins[key] += n
                print(f"{path}: {title}, {kernels[0]} + {kernels[1]}: mean accuracy none "
                      f"{np.mean(found['none']):.3f}, unit-diagonal "
                      f"{np.mean(found['unit-diagonal']):.3f}; pairs won: none "
                      f"{counted['none']}, unit-diagonal {counted['unit-diagonal']}, tied "
                      f"{counted['tie']}")
    print(f"all: mean accuracy none {np.mean(totals['none']):.4f}, unit-diagonal "
          f"{np.mean(totals['unit-diagonal']):.4f} over {len(totals['none'])} fused runs; "
          f"won: none {wins['none']}, unit-diagonal {wins['unit-diagonal']}, tied {wins['tie']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
