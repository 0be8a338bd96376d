"""Issue 32's recipe with Farnebäck and with DIS flow on the same clips and splits: accuracy
per encoding, the paired difference, and the extraction CPU time of each flow
(benchmarks/results/flow-accuracy.md, "issue 32: what DIS flow changes in accuracy").

``python benchmarks/recipes/flow_accuracy.py run FOLDER FEATURES FLOW`` runs
``trajectories_clips.toml`` in FOLDER (which holds ``clips.csv``) with ``features = FEATURES``
(``idt`` or ``dt``) and ``flow = FLOW`` in both trajectory steps, its reports under
``reports/FEATURES-FLOW/``; the variant is written as ``FOLDER/FEATURES-FLOW.toml`` from the
shipped file (substitutions, so the variants cannot drift from it).  FLOW ``farneback-gmm1``
is Farnebäck with the GMMs fitted from ``random_state = 1`` (the shipped file's is 0): the
difference a refit alone makes, the noise floor for the flows' difference.  A label may end in
``-everyN`` or ``-ruleN`` (issue 50 item 1, the sample rule): the GMMs fit on ``sample = N``
rows, drawn evenly from every train clip's sample (``every``: no ``sample_total``, the sample
step extracts every clip, as before the rule) or from the train clips the rule takes for
``sample_total = N`` (``rule``: as few train clips of split 1 as give N rows, the shipped
file's way); then ``-windowW``: the sample step decodes W consecutive frames of each clip
(``sample_window = W``, at a start seeded by the clip's id).  The steps that read
no trajectories (dense SIFT, HRP) have the same keys in every variant and are computed once
per store.  The CPU time (user + sys of the run and its workers) of each trajectory step goes
to ``FOLDER/times.tsv``.

``python benchmarks/recipes/flow_accuracy.py table FEATURES A B FOLDER...`` prints, for each
folder (one draw of clips or split), the accuracy of every encoding with the variants A and B
(``farneback dis``) and their difference B - A; the mean and sample sd over the draws; pooled
over the draws, the test clips that only one variant classifies correctly with the exact
two-sided sign (McNemar) test (clips taken as independent) beside the paired t-test over the
draws, and the correct clips per class; and per draw and variant the CPU time and how many
clips have trajectories at all.
"""

from __future__ import annotations

import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

RECIPE = Path(__file__).with_name("trajectories_clips.toml")
PARAMS = 'params = { descriptors = "hog,hof,mbh" }'
TRAJECTORY_STEPS = ("idt-sample", "idt-gmm", "idt-fv")
ENCODINGS = {"RP(HOG)": "rp-hog", "RP(HOF)": "rp-hof", "RP(MBH)": "rp-mbh",
             "RP(ALL)": "rp-all", "HRP(SIFT)": "hrp-sift",
             "RP(ALL)+HRP(SIFT)": "rp-all-hrp-sift"}
GMM_STEP = "[steps.idt-gmm]\n"
#: the shipped file's sample: the rule's total in the sample step, the GMM's rows
SAMPLE_TOTAL, GMM_SAMPLE = "sample_total = 8000\n", "sample = 8000\n"


def variant(features: str, label: str) -> str:
    """The shipped recipe with FEATURES and the flow of LABEL (``FLOW``, ``FLOW-gmmSEED``,
    either with ``-everyN`` or ``-ruleN``, then ``-windowW``) in its trajectory steps,
    reports moved to ``reports/FEATURES-LABEL/``."""
    match = re.fullmatch(r"(.+?)(?:-gmm(\d+))?(?:-(every|rule)(\d+))?(?:-window(\d+))?",
                         label)
    flow, seed, sample, rows, window = match.groups()
    text = RECIPE.read_text(encoding="utf-8")
    assert text.count(PARAMS) == 2 and text.count('features = "idt"') == 2
    assert text.count(GMM_STEP) == 1 and "random_state" not in text
    assert text.count(SAMPLE_TOTAL) == 1 and text.count(GMM_SAMPLE) == 1
    text = text.replace(PARAMS, PARAMS[:-2] + f', flow = "{flow}" }}')
    text = text.replace('features = "idt"', f'features = "{features}"')
    if seed:
        text = text.replace(GMM_STEP, GMM_STEP + f"random_state = {int(seed)}\n")
    if sample:
        text = text.replace(SAMPLE_TOTAL, f"sample_total = {int(rows)}\n" if sample == "rule"
                            else "").replace(GMM_SAMPLE, f"sample = {int(rows)}\n")
    if window:
        text = text.replace("sample_descriptors = 200\n",
                            f"sample_descriptors = 200\nsample_window = {int(window)}\n")
    return text.replace('report = "reports/', f'report = "reports/{features}-{label}/')


def cpu_run(arguments: list[str]) -> tuple[float, float]:
    """Run ``featpipe`` with ARGUMENTS at nice 19; (wall s, CPU s of it and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(["nice", "-n", "19", sys.executable, "-m", "featpipe", "-q", *arguments],
                   check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (time.perf_counter() - start,
            after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)


def run(folder: Path, features: str, flow: str) -> None:
    recipe = folder / f"{features}-{flow}.toml"
    recipe.write_text(variant(features, flow), encoding="utf-8")
    os.chdir(folder)
    with open("times.tsv", "a", encoding="utf-8") as times:
        for step in TRAJECTORY_STEPS:
            wall, cpu = cpu_run(["run", recipe.name, "--step", step, "--log-file", "run.log"])
            times.write(f"{features}\t{flow}\t{step}\t{wall:.1f}\t{cpu:.1f}\n")
            times.flush()
    cpu_run(["run", recipe.name, "--log-file", "run.log"])


def results(folder: Path, features: str, flow: str) -> dict:
    """{encoding: {clip id: (true class, correct)}} from the reports of one run."""
    out = {}
    for label, report in ENCODINGS.items():
        data = json.loads((folder / "reports" / f"{features}-{flow}" / f"{report}.json")
                          .read_text(encoding="utf-8"))
        split, = data["splits"]
        out[label] = {p["id"]: (p["labels"][0], p["predicted"] in p["labels"])
                      for p in split["predictions"]}
    return out


def coverage(folder: Path, features: str, flow: str) -> dict[str, tuple[str, int, int]]:
    """{clip id: (class, sampled rows, frames with a nonzero FV)} of every clip the sample
    holds; the sampled rows are at most 200 a clip, every trajectory of most clips; the frames
    None where the per-frame FVs are not stored (the fused pass pools them in memory)."""
    from featpipe.store import Stage, Store

    report = folder / "reports" / f"{features}-{flow}" / "rp-all.json"
    chain = [c["stage"] for c in json.loads(report.read_text(encoding="utf-8"))["inputs_chain"]]
    stages = Store(folder / "store").stages_dir
    sample, fv = Stage(stages / chain[0]), Stage(stages / chain[2])
    stored = fv.done_ids()
    return {item.id: (item.labels[0], sample.read_item(item.id).shape[0],
                      int(np.count_nonzero(np.abs(fv.read_item(item.id)).sum(axis=1)))
                      if item.id in stored else None)
            for item in sample.items.items}


def sign_test(b: int, c: int) -> float:
    """Exact two-sided binomial p of b against c discordant pairs (McNemar's exact test)."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired_t(differences: list[float]) -> str:
    """Two-sided p of the paired t-test over the draws (mean difference / its standard error,
    n - 1 degrees of freedom); '-' with fewer than two draws or no spread."""
    from scipy.stats import t

    n = len(differences)
    if n < 2 or statistics.stdev(differences) == 0:
        return "-"
    score = statistics.mean(differences) / (statistics.stdev(differences) / math.sqrt(n))
    return f"{2 * t.sf(abs(score), n - 1):.3g}"


def table(features: str, first: str, second: str, folders: list[Path]) -> None:
    flows = (first, second)
    runs = {f: {flow: results(f, features, flow) for flow in flows} for f in folders}
    print(f"Correct test clips, {first} / {second} (difference in accuracy)\n")
    print("| draw | test clips | " + " | ".join(ENCODINGS) + " |")
    print("|---|---|" + "---|" * len(ENCODINGS))
    differences = {label: [] for label in ENCODINGS}
    accuracies = {(label, flow): [] for label in ENCODINGS for flow in flows}
    discordant = {label: [0, 0, 0] for label in ENCODINGS}  # only fb, only dis, clips
    for folder, by_flow in runs.items():
        cells = []
        for label in ENCODINGS:
            fb = {i: ok for i, (_, ok) in by_flow[first][label].items()}
            dis = {i: ok for i, (_, ok) in by_flow[second][label].items()}
            assert fb.keys() == dis.keys()
            n = len(fb)
            a, b = sum(fb.values()) / n, sum(dis.values()) / n
            differences[label].append(b - a)
            accuracies[label, first].append(a)
            accuracies[label, second].append(b)
            discordant[label][0] += sum(fb[i] and not dis[i] for i in fb)
            discordant[label][1] += sum(dis[i] and not fb[i] for i in fb)
            discordant[label][2] += n
            cells.append(f"{sum(fb.values())} / {sum(dis.values())} ({b - a:+.3f})")
        print(f"| {folder.name} | {n} | " + " | ".join(cells) + " |")
    print()
    print(f"| encoding | {first} mean ± sd | {second} mean ± sd | {second} - {first} mean ± sd"
          f" | paired t-test p (draws) | clips right only with {first} / only with {second}"
          " (of N) | sign test p (clips) |")
    print("|---|---|---|---|---|---|---|")

    def spread(values):
        sd = statistics.stdev(values) if len(values) > 1 else float("nan")
        return f"{statistics.mean(values):.3f} ± {sd:.3f}"

    for label in ENCODINGS:
        b, c, n = discordant[label]
        print(f"| {label} | {spread(accuracies[label, first])} | "
              f"{spread(accuracies[label, second])} | {spread(differences[label])} | "
              f"{paired_t(differences[label])} | "
              f"{b} / {c} (of {n}) | {sign_test(b, c):.3g} |")
    print()
    classes = sorted({c for by_flow in runs.values()
                      for c, _ in by_flow[first]["RP(ALL)"].values()})
    print("| encoding | flow | " + " | ".join(classes) + " |")
    print("|---|---|" + "---|" * len(classes))
    for label in ENCODINGS:
        for flow in flows:
            cells = []
            for name in classes:
                hits = [ok for by_flow in runs.values()
                        for c, ok in by_flow[flow][label].values() if c == name]
                cells.append(f"{sum(hits)}/{len(hits)}")
            print(f"| {label} | {flow} | " + " | ".join(cells) + " |")
    clips = {(folder, flow): coverage(folder, features, flow) for folder in folders
             for flow in flows}
    for flow in flows:
        counts = [[(rows, frames) for (f, v), by_id in clips.items() if v == flow
                   for c, rows, frames in by_id.values() if c == name] for name in classes]
        print(f"| sampled rows, all clips | {flow} | "
              + " | ".join(str(sum(r for r, _ in cell)) for cell in counts) + " |")
        print(f"| clips without trajectories | {flow} | "
              + " | ".join(f"{sum(r == 0 for r, _ in cell)}/{len(cell)}" for cell in counts)
              + " |")
    print()
    print("| draw | flow | CPU s sample step | CPU s fv step | CPU s both | "
          "sampled rows of clips | clips without trajectories | clips with all-zero FVs | "
          "median frames with an FV |")
    print("|---|---|---|---|---|---|---|---|---|")
    for folder in folders:
        timed = [line.split("\t") for line in
                 (folder / "times.tsv").read_text(encoding="utf-8").splitlines()]
        for flow in flows:
            cpu = {r[2]: float(r[4]) for r in timed if r[0] == features and r[1] == flow}
            rows = np.array([r for _, r, _ in clips[folder, flow].values()])
            frames = np.array([n for _, _, n in clips[folder, flow].values() if n is not None])
            stored = frames.size == rows.size
            print(f"| {folder.name} | {flow} | {cpu['idt-sample']:.1f} | {cpu['idt-fv']:.1f} | "
                  f"{cpu['idt-sample'] + cpu['idt-fv']:.1f} | {rows.sum()} of {rows.size} | "
                  f"{(rows == 0).sum()} | {(frames == 0).sum() if stored else '-'} | "
                  f"{f'{np.median(frames):g}' if stored else '-'} |")


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(Path(sys.argv[2]).resolve(), sys.argv[3], sys.argv[4])
    else:
        table(sys.argv[2], sys.argv[3], sys.argv[4], [Path(f) for f in sys.argv[5:]])
