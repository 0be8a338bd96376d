"""Classification reports: JSON (everything), a Markdown report and PNG plots beside it.

``REPORT.json`` holds the exact command line, the configuration, the chain of input stages
(every stage the inputs were computed from, with its parameters), package versions, per-split
numbers (per-class accuracy or AP, confusion matrix, chosen C, cross-validation scores) and
every test item's scores and prediction.  ``REPORT.md`` is the readable form and embeds the
plots, drawn with matplotlib's Agg backend (no display needed):

- ``REPORT.split<K>.confusion.png``: the confusion matrix normalised per row (row t: the
  fraction of class t's test items predicted as each class, so the diagonal is per-class
  accuracy), drawn by scikit-learn's ``ConfusionMatrixDisplay`` with every class name; the
  figure grows with the class count (0.16 in per class), values are printed up to 20
  classes; up to 30 classes keep their sorted order, above that classes are grouped by
  confusion (average-linkage clustering of the symmetrised off-diagonal confusions, optimal
  leaf order), so classes mistaken for each other sit together.
- ``REPORT.split<K>.ap.png``: per-class average precision as horizontal bars sorted from the
  best class down, each with its value; classes without a positive test item are listed as
  n/a at the bottom.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path

import numpy as np

from featpipe import __version__
from featpipe.fileio import write_if_changed

#: Distributions whose versions a report records (the first OpenCV one found is used).
_PACKAGES = ("numpy", "scipy", "scikit-learn", "torch", "libsvm-official", "liblinear-official",
             "numba", "h5py", "matplotlib")
_OPENCV = ("opencv-python-headless", "opencv-python", "opencv-contrib-python-headless",
           "opencv-contrib-python")
#: Class counts above which values are left out of the cells / classes are grouped.
VALUES_UP_TO = 20
SORTED_UP_TO = 30


def versions() -> dict[str, str]:
    """featpipe, Python and the packages that decide the numbers (torch and OpenCV too)."""
    found = {"featpipe": __version__, "python": platform.python_version()}
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    for name in _OPENCV:
        try:
            found["opencv"] = f"{metadata.version(name)} ({name})"
            break
        except metadata.PackageNotFoundError:
            continue
    return found


def stage_chain(stages: Sequence) -> list[dict]:
    """Every stage the ``stages`` were computed from, inputs before the stages that use them:
    folder name, kind, parameters, inputs, names pointing at it, creation time."""
    names: dict[str, list[str]] = {}
    for stage in stages[:1]:
        for name, folder in stage.store.names().items():
            names.setdefault(folder, []).append(name)
    chain, seen = [], set()

    def visit(stage) -> None:
        if stage.name in seen:
            return
        seen.add(stage.name)
        for parent in stage.inputs():
            visit(parent)
        chain.append({"stage": stage.name, "kind": stage.kind, "params": stage.params,
                      "inputs": stage.input_names, "names": names.get(stage.name, []),
                      "created": stage.meta.get("created")})

    for stage in stages:
        visit(stage)
    return chain


def build_report(config: Mapping, results: list[dict], summary: Mapping,
                 chain: list[dict] | None = None, command: str | None = None,
                 created: str | None = None) -> dict:
    """The JSON report; ``command`` is the exact command line (None: a library call);
    ``created`` when the results were computed (default: now)."""
    return {
        "created": created or _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command": command,
        "config": dict(config),
        "inputs_chain": chain or [],
        "versions": versions(),
        "summary": dict(summary),
        "splits": results,
    }


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def describe_inputs(config: Mapping) -> str:
    """``hrp (chi2+ser) + avg (linear), average fusion``."""
    text = " + ".join(f"{i} ({k})" for i, k in zip(config["inputs"], config["kernels"],
                                                   strict=True))
    if len(config["inputs"]) > 1:
        text += f", {config['fusion']} fusion"
        if config.get("fusion_scale") == "unit-diagonal":
            text += " of kernels scaled to a unit mean diagonal"
    return text


def plot_paths(path: str | Path, result: Mapping) -> dict[str, Path]:
    """The PNG files of one split's plots (``confusion`` for single-label results, ``ap``
    whenever some class has a positive test item)."""
    stem = Path(path).with_suffix("")
    found = {}
    if "confusion" in result:
        found["confusion"] = Path(f"{stem}.split{result['split']}.confusion.png")
    if result["map"] is not None:
        found["ap"] = Path(f"{stem}.split{result['split']}.ap.png")
    return found


def markdown(report: Mapping, plots: Mapping[int, Mapping[str, Path]] | None = None) -> str:
    """The Markdown report; ``plots`` (split -> plot kind -> file) are embedded by file name,
    so the report and its PNGs move together."""
    config, summary = report["config"], report["summary"]
    command = report.get("command")
    lines = [
        "# featpipe classify report",
        "",
        f"- result: **{summary['mean']:.4f} ± {summary['std']:.4f}** {summary['metric']} over "
        f"{len(summary['splits'])} split(s)",
        f"- inputs: {describe_inputs(config)}; weights {config['weights'] or 'equal'}",
        f"- solver: {config['solver']}, C candidates {config['C']}, cv {config['cv']}, "
        f"normalize {config.get('normalize', 'none')}",
        f"- metric: {summary['metric']}"
        + (f" (AP: {config['ap']})" if summary["metric"] == "map" else ""),
        f"- created: {report.get('created', '')}",
        *([f"- kept in the store as stage `{config['stage']}`"
           + (f", name `{config['name']}`" if config.get("name") else " (unnamed: `cache gc` "
              "collects it; `classify --name` keeps it)")] if config.get("stage") else []),
        "",
        "Command:" if command else "Equivalent library call (no command line):",
        "",
        "```",
        command or f"featpipe.stages.classify(Store({config['store']!r}), {config['inputs']!r}, "
                   f"{config['kernels']!r}, ...)",
        "```",
        "",
        "| split | train | test | C | " + summary["metric"] + " |",
        "|---|---|---|---|---|",
    ]
    for r in report["splits"]:
        lines.append(f"| {r['split']} | {r['n_train']} | {r['n_test']} | {r['C']:g} | "
                     f"{r['score']:.4f} |")
    for r in report["splits"]:
        lines += ["", f"## Split {r['split']}", ""]
        for kind, file in (plots or {}).get(r["split"], {}).items():
            title = "Confusion matrix (rows normalised)" if kind == "confusion" else \
                "Average precision per class"
            lines += [f"![{title}, split {r['split']}]({file.name})", ""]
        lines += ["| class | accuracy | AP |", "|---|---|---|"]
        per_acc = r.get("per_class_accuracy") or [None] * len(r["classes"])
        for name, acc, ap in zip(r["classes"], per_acc, r["per_class_ap"], strict=True):
            lines.append(f"| {name} | {_fmt(acc)} | {_fmt(ap)} |")
    lines += ["", "## Inputs and the stages they come from", ""]
    for entry in report.get("inputs_chain", []):
        named = f" (names: {', '.join(entry['names'])})" if entry["names"] else ""
        source = f" from {', '.join(entry['inputs'])}" if entry["inputs"] else ""
        lines += [f"- `{entry['stage']}`{named}{source}, created {entry['created']}: "
                  f"`{json.dumps(entry['params'], sort_keys=True)}`"]
    lines += ["", "## Versions", "", ", ".join(f"{k} {v}" for k, v in
                                               report["versions"].items())]
    return "\n".join(lines) + "\n"


def class_order(normalised: np.ndarray) -> np.ndarray:
    """Display order of the classes: as given up to :data:`SORTED_UP_TO` classes, else grouped
    by confusion (see the module docstring)."""
    n = normalised.shape[0]
    if n <= SORTED_UP_TO:
        return np.arange(n)
    from scipy.cluster.hierarchy import leaves_list, linkage, optimal_leaf_ordering
    from scipy.spatial.distance import squareform

    similarity = (normalised + normalised.T) / 2
    np.fill_diagonal(similarity, 0.0)
    distance = similarity.max() - similarity
    np.fill_diagonal(distance, 0.0)
    condensed = squareform(distance, checks=False)
    tree = optimal_leaf_ordering(linkage(condensed, method="average"), condensed)
    return leaves_list(tree)


def row_normalised(counts: np.ndarray) -> np.ndarray:
    """Each row divided by its total (a class without test items stays a row of zeros)."""
    counts = np.asarray(counts, dtype=np.float64)
    totals = counts.sum(axis=1, keepdims=True)
    return np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_confusion(result: Mapping, config: Mapping, path: Path) -> None:
    """The row-normalised confusion matrix of one split (module docstring)."""
    from sklearn.metrics import ConfusionMatrixDisplay

    plt = _pyplot()
    classes = list(result["classes"])
    n = len(classes)
    normalised = row_normalised(result["confusion"])
    order = class_order(normalised)
    side = max(5.0, 2.5 + 0.16 * n)
    label_size = 8 if n <= SORTED_UP_TO else 6
    fig, ax = plt.subplots(figsize=(side + 1.0, side))
    display = ConfusionMatrixDisplay(normalised[np.ix_(order, order)],
                                     display_labels=[classes[i] for i in order])
    display.plot(ax=ax, cmap="Blues", include_values=n <= VALUES_UP_TO, values_format=".2f",
                 xticks_rotation="vertical", colorbar=False, im_kw={"vmin": 0.0, "vmax": 1.0},
                 text_kw={"fontsize": 7})
    fig.colorbar(display.im_, ax=ax, shrink=min(1.0, 4.0 / side + 0.2), pad=0.02,
                 label="fraction of the true class's test items")
    ax.tick_params(labelsize=label_size)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    grouping = "sorted by name" if n <= SORTED_UP_TO else "grouped by confusion"
    ax.set_title(f"{describe_inputs(config)}\nsplit {result['split']}: accuracy "
                 f"{result['accuracy']:.3f} ({result['n_correct']}/{result['n_test']}); "
                 f"rows normalised, {n} classes {grouping}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight", format="png")
    plt.close(fig)


def plot_ap(result: Mapping, config: Mapping, path: Path) -> None:
    """Per-class AP as sorted horizontal bars with their values (module docstring)."""
    plt = _pyplot()
    pairs = [(name, ap) for name, ap in zip(result["classes"], result["per_class_ap"],
                                            strict=True)]
    known = sorted((p for p in pairs if p[1] is not None), key=lambda p: (-p[1], p[0]))
    missing = sorted(name for name, ap in pairs if ap is None)
    names = [name for name, _ in known] + missing
    values = [ap for _, ap in known] + [0.0] * len(missing)
    n = len(names)
    fig, ax = plt.subplots(figsize=(7.0, max(2.5, 1.4 + 0.2 * n)))
    positions = np.arange(n)
    ax.barh(positions, values, color="tab:blue", height=0.7)
    for y, (value, name) in enumerate(zip(values, names, strict=True)):
        text = "n/a" if name in missing else f"{value:.3f}"
        ax.text(value + 0.01, y, text, va="center", fontsize=7)
    ax.set_yticks(positions, names, fontsize=8 if n <= SORTED_UP_TO else 6)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.1)
    ax.set_ylim(n - 0.5, -0.5)
    ax.axvline(result["map"], color="tab:red", linewidth=1)
    ax.set_xlabel("average precision")
    ax.set_title(f"{describe_inputs(config)}\nsplit {result['split']}: mAP {result['map']:.3f} "
                 "(red line), classes sorted by AP", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight", format="png")
    plt.close(fig)


def write_report(path: str | Path, report: Mapping) -> list[Path]:
    """Write REPORT.json, the PNG plots and REPORT.md, each only where the file is missing or
    differs (:func:`featpipe.fileio.write_if_changed`); returns the report's files."""
    import io

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = [path]
    write_if_changed(path, json.dumps(report, indent=1).encode("utf-8"))
    plots = {}
    for result in report["splits"]:
        plots[result["split"]] = plot_paths(path, result)
        for kind, target in plots[result["split"]].items():
            draw = plot_confusion if kind == "confusion" else plot_ap
            image = io.BytesIO()
            draw(result, report["config"], image)
            write_if_changed(target, image.getvalue())
            written.append(target)
    write_if_changed(path.with_suffix(".md"), markdown(report, plots).encode("utf-8"))
    written.insert(1, path.with_suffix(".md"))
    return written
