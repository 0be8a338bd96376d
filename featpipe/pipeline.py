"""Pipeline files: a declared sequence of stages, run by ``featpipe run PIPELINE.toml``.

A thin layer over :mod:`featpipe.stages`: each step is one call of a stage function, and the
stage keys make a rerun compute only what is missing, as for the single commands.  The file
(TOML, read with :mod:`tomllib`)::

    [pipeline]
    store = "store"                  # relative paths are relative to the current folder

    [steps.frames]                   # the step name is the stage's name in the store
    stage = "import_features"        # a function of featpipe.stages
    sources = ["BasicMotions_TRAIN.ts", "BasicMotions_TEST.ts"]

    [steps.hrp]
    stage = "encode"
    input = "frames"                 # names chain the steps
    method = "hrp"
    params = { window = 20, psi = "ser" }
    jobs = 2                         # run options of item stages: jobs, executor,
                                     # scheduler, shard, on_error, force
    [steps.result]
    stage = "classify"
    inputs = ["hrp"]
    kernels = ["chi2+ser"]
    report = "reports/hrp.json"

Every other key of a step is a keyword argument of its function, as documented there
(``help(featpipe.stages.encode)``).  ``name`` defaults to the step name; ``manifest`` of
``extract`` is a manifest path and ``sampling`` a table (``{ fps = 5 }``).  Steps run in
file order.  The whole file is checked (functions, parameter names, step names) before the
first step runs.

A dry run asks each step what it would compute (the item stages' dry run, listing the first
:data:`DRY_RUN_ITEMS` items of each; the fit stages' ``dry_run``); a step whose input is
computed by an earlier step of the same dry run cannot be planned yet and is listed as
running after it; a function without a dry run (``classify``, which stores no stage and
runs, in seconds, whenever the pipeline does) is listed as ``would run`` and never called.
"""

from __future__ import annotations

import inspect
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from featpipe import stages
from featpipe.errors import FeatpipeError, ParameterError
from featpipe.stages.base import Reporter, RunOptions, StageRun
from featpipe.store import Stage, Store

#: Stage functions a step may name (``featpipe.stages.<name>``).
STAGE_FUNCTIONS = ("import_features", "extract", "encode", "fit_pca", "fit_gmm", "fit_deep_gmm",
                   "fit_dhrp", "fit_gmsop", "fit_standardize", "classify")
RUN_OPTIONS = tuple(f.name for f in fields(RunOptions) if f.name != "dry_run")
#: Items a dry run lists per step (the count line gives the rest).
DRY_RUN_ITEMS = 3


class _ShortListReporter(Reporter):
    """Forwards to ``reporter``, keeping the first :data:`DRY_RUN_ITEMS` "would compute"
    lines of each step."""

    def __init__(self, reporter: Reporter):
        self.reporter = reporter
        self.listed = 0

    def info(self, text: str) -> None:
        if text.startswith("would compute "):
            self.listed += 1
            if self.listed > DRY_RUN_ITEMS:
                return
        self.reporter.info(text)

    def warn(self, text: str) -> None:
        self.reporter.warn(text)

    def error(self, text: str) -> None:
        self.reporter.error(text)

    def progress(self, total, label, unit="items"):
        return self.reporter.progress(total, label, unit)


class PipelineError(FeatpipeError):
    """A pipeline file or one of its steps failed; ``usage`` marks a bad file or parameter
    (exit status 2 on the command line)."""

    def __init__(self, message: str, usage: bool = False):
        super().__init__(message)
        self.usage = usage


@dataclass
class Step:
    """One step: its name, the stage function it calls and that function's arguments."""

    name: str
    function: str
    arguments: dict = field(default_factory=dict)

    def describe(self) -> str:
        return f"step {self.name!r} ({self.function})"


@dataclass
class Pipeline:
    """The steps of a pipeline file, in order, and its default store."""

    path: Path
    steps: list[Step]
    store: str | None = None


def load_pipeline(path: str | Path) -> Pipeline:
    """Read and check a pipeline file (module docstring); a problem is a PipelineError."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PipelineError(f"{path}: no such file", usage=True) from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise PipelineError(f"{path}: not a TOML file ({err})", usage=True) from None
    unknown = set(data) - {"pipeline", "steps"}
    settings = data.get("pipeline", {})
    if unknown or not isinstance(settings, dict) or set(settings) - {"store"}:
        raise PipelineError(f"{path}: expected a [pipeline] table (store) and [steps.NAME] "
                            f"tables, got {sorted(unknown | set(settings) - {'store'})}",
                            usage=True)
    tables = data.get("steps")
    if not isinstance(tables, dict) or not tables:
        raise PipelineError(f"{path}: no steps; add [steps.NAME] tables with stage = "
                            "\"FUNCTION\"", usage=True)
    steps = []
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise PipelineError(f"{path}: steps.{name} must be a table", usage=True)
        arguments = dict(table)
        function = arguments.pop("stage", None)
        if function not in STAGE_FUNCTIONS:
            raise PipelineError(f"{path}: step {name!r}: stage = {function!r} is not one of "
                                f"{', '.join(STAGE_FUNCTIONS)}", usage=True)
        step = Step(name, function, arguments)
        check_arguments(step, path)
        steps.append(step)
    return Pipeline(path, steps, settings.get("store"))


def _signature(function: str) -> inspect.Signature:
    return inspect.signature(getattr(stages, function))


def check_arguments(step: Step, path: Path) -> None:
    """Refuse arguments the stage function does not take, and missing required ones."""
    signature = _signature(step.function)
    accepted = set(signature.parameters) - {"store", "reporter", "options", "command"}
    if "options" in signature.parameters:
        accepted |= set(RUN_OPTIONS)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    for key in step.arguments:
        if key not in accepted and not takes_any:
            raise PipelineError(f"{path}: {step.describe()} has no parameter {key!r} "
                                f"(parameters: {', '.join(sorted(accepted))})", usage=True)
    given = set(step.arguments) | {"store"} | ({"name"} if "name" in accepted else set())
    missing = [p.name for p in signature.parameters.values()
               if p.default is p.empty and p.kind is not p.VAR_KEYWORD and p.name not in given]
    if missing:
        raise PipelineError(f"{path}: {step.describe()} needs {', '.join(missing)}",
                            usage=True)


def _converted(step: Step, dry_run: bool) -> dict:
    """The keyword arguments of the step's function call."""
    signature = _signature(step.function)
    arguments = dict(step.arguments)
    if "name" in signature.parameters:
        arguments.setdefault("name", step.name)
    if "options" in signature.parameters:
        options = {k: arguments.pop(k) for k in RUN_OPTIONS if k in arguments}
        arguments["options"] = RunOptions(**options, dry_run=dry_run)
    elif "dry_run" in signature.parameters:
        arguments["dry_run"] = dry_run
    if step.function == "extract":
        from featpipe.io.video import Sampling
        from featpipe.manifest import Manifest

        if isinstance(arguments.get("manifest"), str):
            arguments["manifest"] = Manifest.read(arguments["manifest"])
        if isinstance(arguments.get("sampling"), Mapping):
            arguments["sampling"] = Sampling(**arguments["sampling"])
    return arguments


def _references(value, names: set[str]) -> set[str]:
    """Step names mentioned by an argument value (strings, lists, tables)."""
    if isinstance(value, str):
        return {value} & names
    if isinstance(value, Mapping):
        return set().union(*(_references(v, names) for v in value.values()))
    if isinstance(value, list | tuple):
        return set().union(*(_references(v, names) for v in value))
    return set()


def _would_compute(result, dry_run_force: bool) -> bool:
    """Whether a step's dry-run result leaves work to do."""
    if isinstance(result, StageRun):
        return bool(result.todo)
    if isinstance(result, Stage):  # a fit stage: complete once it holds a model
        return dry_run_force or not any(result.path.glob("models/*.json"))
    return True


def run_pipeline(pipeline: Pipeline, store: Store, *, dry_run: bool = False,
                 only: Callable[[Step], bool] | None = None,
                 reporter: Reporter | None = None) -> list:
    """Run (or, with ``dry_run``, plan) the steps in order; returns each step's result.

    A step that fails raises a :class:`PipelineError` naming it; items already written stay,
    so running the pipeline again resumes.  A step whose items failed with ``on_error =
    "skip"`` stops the pipeline after it.
    """
    reporter = reporter or Reporter()
    names = {step.name for step in pipeline.steps}
    pending: set[str] = set()
    results = []
    for number, step in enumerate(pipeline.steps, start=1):
        if only is not None and not only(step):
            continue
        reporter.info(f"step {number}/{len(pipeline.steps)}: {step.name} ({step.function})")
        waits_for = sorted(_references(step.arguments, names - {step.name}) & pending)
        if dry_run and waits_for:
            reporter.info(f"dry run: would run after {', '.join(waits_for)} (its input is "
                          "not computed yet)")
            pending.add(step.name)
            results.append(None)
            continue
        parameters = _signature(step.function).parameters
        if dry_run and not {"options", "dry_run"} & set(parameters):  # classify: no stage
            reporter.info(f"dry run: would run {step.function}"
                          + (" on " + ", ".join(step.arguments.get("inputs", []))
                             if step.function == "classify" else ""))
            pending.add(step.name)
            results.append(None)
            continue
        arguments = _converted(step, dry_run)
        if step.function == "classify":
            arguments.setdefault("command", f"featpipe run {pipeline.path} (step {step.name})")
        step_reporter = _ShortListReporter(reporter) if dry_run else reporter
        try:
            result = getattr(stages, step.function)(store, reporter=step_reporter, **arguments)
        except ParameterError as err:
            raise PipelineError(f"{step.describe()}: {err}",
                                usage=True) from None
        except FeatpipeError as err:
            raise PipelineError(f"{step.describe()}: {err}") from None
        if dry_run and _would_compute(result, bool(step.arguments.get("force"))):
            pending.add(step.name)
        if isinstance(result, StageRun) and not result.ok:
            raise PipelineError(f"{step.describe()}: {len(result.summary.failed)} item(s) "
                                "failed; later steps not run (fix them and run the pipeline "
                                "again)")
        results.append(result)
    return results
