"""Classification reports: JSON (everything), a Markdown summary and PNG plots beside it.

``REPORT.json`` holds the configuration, package versions, per-split numbers (per-class
accuracy or AP, confusion matrix, chosen C, cross-validation scores) and every test item's
scores and prediction.  ``REPORT.md`` summarises it; ``REPORT.split<K>.confusion.png`` and
``REPORT.split<K>.ap.png`` are drawn with matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

import numpy as np

from featpipe import __version__
from featpipe.fileio import atomic_write_bytes

_PACKAGES = ("numpy", "scipy", "scikit-learn", "libsvm-official", "liblinear-official", "numba")


def versions() -> dict[str, str]:
    found = {"featpipe": __version__}
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def build_report(config: Mapping, results: list[dict], summary: Mapping) -> dict:
    return {
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "config": dict(config),
        "versions": versions(),
        "summary": dict(summary),
        "splits": results,
    }


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def markdown(report: Mapping) -> str:
    config, summary = report["config"], report["summary"]
    lines = [
        "# featpipe classify report",
        "",
        f"- inputs: {', '.join(f'{i} ({k})' for i, k in zip(config['inputs'], config['kernels'], strict=True))}",  # noqa: E501
        f"- fusion: {config['fusion']}, weights {config['weights'] or 'equal'}",
        f"- solver: {config['solver']}, C candidates {config['C']}, cv {config['cv']}",
        f"- metric: {summary['metric']}"
        + (f" (AP: {config['ap']})" if summary["metric"] == "map" else ""),
        f"- result: **{summary['mean']:.4f} ± {summary['std']:.4f}** over "
        f"{len(summary['splits'])} split(s)",
        "",
        "| split | train | test | C | " + summary["metric"] + " |",
        "|---|---|---|---|---|",
    ]
    for r in report["splits"]:
        lines.append(f"| {r['split']} | {r['n_train']} | {r['n_test']} | {r['C']:g} | "
                     f"{r['score']:.4f} |")
    for r in report["splits"]:
        lines += ["", f"## Split {r['split']}", "", "| class | accuracy | AP |", "|---|---|---|"]
        per_acc = r.get("per_class_accuracy") or [None] * len(r["classes"])
        for name, acc, ap in zip(r["classes"], per_acc, r["per_class_ap"], strict=True):
            lines.append(f"| {name} | {_fmt(acc)} | {_fmt(ap)} |")
    return "\n".join(lines) + "\n"


def _plot_confusion(result: Mapping, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matrix = np.asarray(result["confusion"])
    n = len(result["classes"])
    fig, ax = plt.subplots(figsize=(2 + 0.35 * n, 2 + 0.35 * n))
    ax.imshow(matrix, cmap="Blues")
    if n <= 30:
        ax.set_xticks(range(n), result["classes"], rotation=90, fontsize=7)
        ax.set_yticks(range(n), result["classes"], fontsize=7)
        for (t, p), count in np.ndenumerate(matrix):
            if count:
                ax.text(p, t, str(count), ha="center", va="center", fontsize=6,
                        color="white" if count > matrix.max() / 2 else "black")
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(f"split {result['split']}: accuracy {result['accuracy']:.3f}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_ap(result: Mapping, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ap = [np.nan if v is None else v for v in result["per_class_ap"]]
    n = len(ap)
    fig, ax = plt.subplots(figsize=(3 + 0.3 * n, 3))
    ax.bar(range(n), ap)
    ax.set_xticks(range(n), result["classes"], rotation=90, fontsize=7)
    ax.set_ylim(0, 1)
    ax.set_ylabel("average precision")
    ax.set_title(f"split {result['split']}: mAP {result['map']:.3f}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(path: str | Path, report: Mapping) -> list[Path]:
    """Write REPORT.json, REPORT.md and the PNG plots; returns the files written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = [path, path.with_suffix(".md")]
    atomic_write_bytes(path, json.dumps(report, indent=1).encode("utf-8"))
    atomic_write_bytes(written[1], markdown(report).encode("utf-8"))
    for result in report["splits"]:
        stem = path.with_suffix("")
        if "confusion" in result:
            target = Path(f"{stem}.split{result['split']}.confusion.png")
            _plot_confusion(result, target)
            written.append(target)
        if result["map"] is not None:
            target = Path(f"{stem}.split{result['split']}.ap.png")
            _plot_ap(result, target)
            written.append(target)
    return written
