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
``extract`` is a manifest path, ``sampling`` a table (``{ fps = 5 }``) and the fields of its
``settings`` record are keys of the step (``dtype = "float16"``, ``encode = "fisher"``,
``encode_params = { gmm = "g" }``: :class:`~featpipe.extract.settings.ExtractSettings`).
Steps run in file order.

The whole file is checked before the first step runs (:func:`load_pipeline`; a problem is a
usage error): the functions; every key, of the step and of its ``params`` and
``sampling`` tables and the estimator parameters of a fit (an unknown one with the closest
known name); the values, with the checks the command line runs; and the references: an
``input``, ``inputs``, ``gmm``, ``pca`` or model parameter (``params = { model = "std" }``)
must name an *earlier* step by its key (``[steps.KEY]``, whatever the step's ``name``), so
a step never picks up a name left in the store by an earlier run, and steps cannot form a
cycle; and no two steps give their stages one name (:func:`check_names`).  A stage made
outside the file is named explicitly: ``"@fc6"`` is the stage the store's name ``fc6`` points
to, resolved to its folder (``kind-key``) before the first step runs and printed (``@fc6 =
extract-5c0e...``, by ``--dry-run`` too); a folder name works as well.

A dry run asks each step what it would compute (the item stages' dry run, listing the first
:data:`DRY_RUN_ITEMS` items of each; the fit stages' ``dry_run``) and prints its stage and
key; a later step plans on the stages planned for the earlier ones
(:attr:`featpipe.store.Store.planned`), so every key is printed before anything is
computed, except where a step needs what an earlier one computes (a fitted GMM's arrays):
it is listed as running after it.  A function without a dry run (``classify``, whose
result a rerun reuses from its stage) is listed as ``would run`` and never called.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from featpipe import stages
from featpipe.errors import FeatpipeError, ParameterError
from featpipe.extract.estimate import human_bytes
from featpipe.grids import GRID_KEY, Expansion, expand
from featpipe.interrupts import Interrupted
from featpipe.plan import MODEL, Node, Plan, print_plan
from featpipe.stages.base import Reporter, RunOptions, StageRun, check_name, shared_hashes
from featpipe.store import NAME_PATTERN, STAGE_FOLDER, Stage, Store

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
    """The steps of a pipeline file, in order (its grids expanded: :mod:`featpipe.grids`),
    its default store, and the points each step with a grid (or reading one) became."""

    path: Path
    steps: list[Step]
    store: str | None = None
    grids: Expansion | None = None

    def step_names(self, name: str) -> list[str]:
        """The steps a name of the file stands for: the points of a gridded step, or it."""
        if self.grids is not None and name in self.grids.points:
            return [point.name for point in self.grids.points[name]]
        return [name] if any(step.name == name for step in self.steps) else []


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
        check_grid(step, path)
        steps.append(step)
    check_references(steps, path)
    expansion = expand(steps, lambda step: [name for _, name in references(step)], _point)
    for step in expansion.steps:
        try:
            check_values(step)
        except ParameterError as err:
            raise PipelineError(f"{path}: {step.describe()}: {err}", usage=True) from None
    check_names(expansion.steps, path)
    return Pipeline(path, expansion.steps, settings.get("store"), expansion)


def check_grid(step: Step, path: Path) -> None:
    """A step's ``grid`` is a table of non-empty lists of values (:mod:`featpipe.grids`)."""
    grid = step.arguments.get(GRID_KEY)
    if grid is None:
        return
    if not isinstance(grid, Mapping) or not grid:
        raise PipelineError(f"{path}: {step.describe()}: grid must be a table of the values to "
                            f"sweep, e.g. grid = {{ window = [5, 10, 20] }}, got {grid!r}",
                            usage=True)
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise PipelineError(f"{path}: {step.describe()}: grid {key} must be a non-empty "
                                f"list of values, got {values!r}", usage=True)


def _point(step: Step, name: str, values: Mapping, rename: Mapping[str, str]) -> Step:
    """One point of a grid (:func:`featpipe.grids.expand`): ``step`` named ``name``, with
    ``values`` set (a key of the step, of an extraction's ``sampling``, else of its ``params``
    table) and the steps it reads renamed."""
    arguments = {k: v for k, v in step.arguments.items() if k != GRID_KEY}
    accepted = accepted_arguments(step.function)
    for key, value in values.items():
        if key in accepted or _takes_any(step.function):
            arguments[key] = value
        else:
            table = "sampling" if step.function == "extract" and key in _sampling_keys() \
                else "params"
            arguments[table] = {**(arguments.get(table) or {}), key: value}
    if isinstance(arguments.get("name"), str):
        arguments["name"] += name[len(step.name):]
    return renamed(Step(name, step.function, arguments), rename)


def _sampling_keys() -> list[str]:
    """The keys of an extract step's ``sampling`` table: :class:`Sampling`'s declared
    fields (its ``window`` is set by ``sample_window``)."""
    from featpipe.io.video import Sampling
    from featpipe.parameters import record_parameters

    return [p.name for p in record_parameters(Sampling)]


def _takes_any(function: str) -> bool:
    """Whether the stage function takes any keyword (a fit's estimator parameters)."""
    return any(p.kind is p.VAR_KEYWORD for p in _signature(function).parameters.values())


def _signature(function: str) -> inspect.Signature:
    return inspect.signature(getattr(stages, function))


def _flat_record(function: str) -> tuple[str, type] | None:
    """(parameter, record class) of a stage function whose record's fields a step gives as
    keys of its own: ``extract``'s ``settings``."""
    if function == "extract":
        from featpipe.extract.settings import ExtractSettings

        return "settings", ExtractSettings
    return None


def accepted_arguments(function: str) -> set[str]:
    """The keys a step of ``function`` may have (besides ``stage``)."""
    signature = _signature(function)
    accepted = set(signature.parameters) - {"store", "reporter", "options", "command"}
    record = _flat_record(function)
    if record is not None:  # its fields, but the steps of a pass (made from other steps)
        accepted = accepted - {record[0]} | {f.name for f in fields(record[1])} - {"then"}
    if "options" in signature.parameters:
        accepted |= set(RUN_OPTIONS)
    if function in FUSABLE:
        accepted |= {"keep"}
    return accepted


def check_arguments(step: Step, path: Path) -> None:
    """Refuse arguments the stage function does not take (with the closest one it takes),
    and missing required ones."""
    signature = _signature(step.function)
    accepted = accepted_arguments(step.function) | {GRID_KEY}
    takes_any = _takes_any(step.function)
    for key in step.arguments:
        if key not in accepted and not takes_any:
            close = difflib.get_close_matches(key, sorted(accepted), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise PipelineError(f"{path}: {step.describe()} has no parameter {key!r} "
                                f"({hint}parameters: {', '.join(sorted(accepted))})",
                                usage=True)
    given = set(step.arguments) | {"store"} | ({"name"} if "name" in accepted else set())
    missing = [p.name for p in signature.parameters.values()
               if p.default is p.empty and p.kind is not p.VAR_KEYWORD and p.name not in given]
    if missing:
        raise PipelineError(f"{path}: {step.describe()} needs {', '.join(missing)}",
                            usage=True)


#: Stage functions whose steps may run in one pass: an extraction and the encode steps after it.
FUSABLE = ("extract", "encode")


@dataclass
class Fusion:
    """The passes of a pipeline (:func:`plan_fusion`): for each extraction step that others
    run inside, those steps in order, and for each step whether its stage is written."""

    members: dict[str, list[str]] = field(default_factory=dict)  # extract step -> fused steps
    pass_of: dict[str, str] = field(default_factory=dict)  # fused step -> its extract step
    kept: dict[str, bool] = field(default_factory=dict)  # every step of a pass


def plan_fusion(steps: list[Step]) -> Fusion:
    """Which steps run in one pass (a chain of per-item steps is one
    computation): an ``encode`` step joins the pass of the ``extract`` step its input comes
    from (directly or through steps of that pass) when it sets no run option of its own
    and every model it names is computed before that extraction.  A step of a pass is
    written (kept) when a step outside the pass reads it, no step reads it (a result), or
    it says ``keep = true``; the others' stages are never written."""
    order = {step.name: number for number, step in enumerate(steps)}
    readers: dict[str, list[str]] = {}
    for step in steps:
        for _, name in references(step):
            readers.setdefault(name, []).append(step.name)
    fusion = Fusion()
    for step in steps:
        if step.function != "extract" or step.arguments.get("executor") == "dask":
            continue
        members, inside = [], {step.name}
        for later in steps[order[step.name] + 1:]:
            if later.function != "encode" or later.arguments.get("input") not in inside:
                continue
            if any(option in later.arguments for option in RUN_OPTIONS):
                continue
            models = [name for argument, name in references(later) if argument != "input"]
            if any(order.get(name, -1) > order[step.name] for name in models):
                continue
            members.append(later.name)
            inside.add(later.name)
        if not members:
            continue
        fusion.members[step.name] = members
        for name in [step.name, *members]:
            fusion.pass_of.setdefault(name, step.name)
            outside = [r for r in readers.get(name, []) if r not in inside]
            fusion.kept[name] = bool(outside) or not readers.get(name) or \
                bool(next(s for s in steps if s.name == name).arguments.get("keep"))
        fusion.pass_of.pop(step.name)
    return fusion


def check_values(step: Step) -> None:
    """Check a step's values as the command line checks them, before any step runs (a
    :class:`ParameterError`): its store ``name`` and ``keep`` too; what needs the store (an
    input's items) is checked by the plan (:func:`plan_pipeline`)."""
    arguments = step.arguments
    if "name" in _signature(step.function).parameters:
        check_name(arguments.get("name", step.name))
    if "keep" in arguments and not isinstance(arguments["keep"], bool):
        raise ParameterError("keep", f"must be true or false (a TOML boolean, no quotes), got "
                             f"{arguments['keep']!r}")
    if "options" in _signature(step.function).parameters:
        RunOptions(**{k: arguments[k] for k in RUN_OPTIONS if k in arguments})
    if step.function == "encode":
        _check_method(arguments["method"], arguments.get("params") or {})
    elif step.function == "extract":
        _check_extract(arguments)
    elif step.function == "classify":
        from featpipe.stages.classification import check_arguments as check_classify

        known = set(inspect.signature(check_classify).parameters)
        check_classify(**{k: v for k, v in arguments.items() if k in known})
    elif step.function != "fit_standardize" and step.function.startswith("fit_"):
        from featpipe.stages.fitting import estimator_of, estimator_record

        own = set(_signature(step.function).parameters)
        estimator_record(estimator_of(step.function),
                         {k: v for k, v in arguments.items() if k not in own})


def _check_method(method, params) -> None:
    from featpipe.encode.registry import load_methods
    from featpipe.stages.encoding import method_record

    methods = load_methods()
    if method not in methods:
        close = difflib.get_close_matches(str(method), sorted(methods), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ParameterError("method", f"must be one of {', '.join(sorted(methods))}, got "
                             f"{method!r}{hint}")
    if not isinstance(params, Mapping):
        raise ParameterError("params", f"must be a table of the method's parameters, got "
                             f"{params!r}")
    method_record(methods[method], params)


def _check_extract(arguments: Mapping) -> None:
    from featpipe.io.video import Sampling
    from featpipe.stages.extraction_plan import choose_features

    for table in ("sampling", "params", "encode_params"):
        if not isinstance(arguments.get(table) or {}, Mapping):
            raise ParameterError(table, f"must be a table, got {arguments[table]!r}")
    sampling = dict(arguments.get("sampling") or {})
    known = _sampling_keys()
    for key in sampling:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            raise ParameterError("sampling", f"has no key {key!r}" + (
                f" (did you mean {close[0]}?)" if close else f" (keys: {', '.join(known)})"))
    try:
        Sampling(**sampling).validate()
        chosen = choose_features(arguments.get("features"), arguments.get("params"))
        _record_of(arguments, "extract")["settings"].check(chosen.method)
    except ParameterError:
        raise
    except FeatpipeError as err:
        raise ParameterError("extract", f"parameters: {err}") from None
    if arguments.get("encode") is not None:
        _check_method(arguments["encode"], arguments.get("encode_params") or {})


#: Arguments whose value names a stage (a step of the file, or a stage folder).
REFERENCES = ("input", "inputs", "gmm", "pca")


def references(step: Step) -> list[tuple[str, str]]:
    """``(argument, stage name)`` for every stage a step names: :data:`REFERENCES` and the
    model parameters of an encode method (``params = { gmm = "g" }``)."""
    found = []
    for key in REFERENCES:
        value = step.arguments.get(key)
        for name in value if isinstance(value, list) else [value]:
            if isinstance(name, str):
                found.append((key, name))
    table = step.arguments.get(_table_key(step))
    for option in _model_options(step):
        if isinstance(table.get(option), str):
            found.append((option, table[option]))
    return found


def _table_key(step: Step) -> str:
    """The key of a step's table of encoder parameters."""
    return "params" if step.function == "encode" else "encode_params"


def _model_options(step: Step) -> tuple[str, ...]:
    """The model parameters (``gmm``, ``model``...) of the step's encoder, which its table of
    encoder parameters may give (none when it has no such table)."""
    method = step.arguments.get("method" if step.function == "encode" else "encode")
    if not method or not isinstance(step.arguments.get(_table_key(step)), Mapping):
        return ()
    from featpipe.encode.registry import load_methods

    chosen = load_methods().get(method)
    return chosen.model_options if chosen else ()


#: The prefix of a reference to a store name (``"@fc6"``): a stage made outside the file.
STORE_NAME = "@"


def check_references(steps: list[Step], path: Path) -> None:
    """Every stage a step names is an earlier step, by its key (or ``@NAME``, a store name,
    or a stage folder, ``kind-key``)."""
    order = {step.name: number for number, step in enumerate(steps)}
    for number, step in enumerate(steps):
        for argument, name in references(step):
            if order.get(name, number) < number or STAGE_FOLDER.match(name) or (
                    name.startswith(STORE_NAME) and NAME_PATTERN.match(name[1:])):
                continue
            named = [s.name for s in steps[:number] if s.arguments.get("name") == name]
            if name == step.name:
                problem = "names the step itself (a cycle)"
            elif name in order:
                problem = (f"names step {name!r}, which comes later in the file; steps run in "
                           "file order: move it before")
            elif named:
                problem = (f"names {name!r}, which is the name = of step {named[0]!r}: a step "
                           f"is referenced by its key, write {named[0]!r}")
            else:
                earlier = [s.name for s in steps[:number]]
                close = difflib.get_close_matches(name, earlier, n=1)
                problem = (f"names {name!r}, which is no earlier step of this file ("
                           + (f"did you mean {close[0]!r}? " if close else "")
                           + f"earlier steps: {', '.join(earlier) or 'none'}); a stage made "
                           f"outside this file is given as {STORE_NAME}NAME (its store name) "
                           "or by its folder (kind-key)")
            raise PipelineError(f"{path}: {step.describe()}: {argument} {problem}",
                                usage=True)


def renamed(step: Step, rename: Mapping[str, str]) -> Step:
    """``step`` with every stage it names (:func:`references`) replaced by ``rename``'s
    value for it, where it has one."""
    arguments = dict(step.arguments)
    for key in REFERENCES:
        value = arguments.get(key)
        if isinstance(value, list):
            arguments[key] = [rename.get(v, v) if isinstance(v, str) else v for v in value]
        elif isinstance(value, str):
            arguments[key] = rename.get(value, value)
    model_options = _model_options(step)
    if model_options:
        arguments[_table_key(step)] = {
            k: rename.get(v, v) if k in model_options and isinstance(v, str) else v
            for k, v in arguments[_table_key(step)].items()}
    return Step(step.name, step.function, arguments)


def resolve_references(pipeline: Pipeline, store: Store, reporter: Reporter,
                       plan: Plan | None = None) -> dict[str, str]:
    """What each reference of the file means in ``store``: a step's key -> the store name its
    step writes (where its ``name`` differs); ``@NAME`` -> the folder of the stage ``NAME``
    points to now (said, ``@NAME = kind-key``; a name the store lacks is a problem of the
    step in ``plan``, or without one a :class:`PipelineError`)."""
    rename = {}
    for step in pipeline.steps:
        name = step.arguments.get("name")
        if isinstance(name, str) and name != step.name:
            rename[step.name] = name
    for step in pipeline.steps:
        for argument, name in references(step):
            if not name.startswith(STORE_NAME) or name in rename:
                continue
            try:
                rename[name] = store.resolve(name[len(STORE_NAME):]).name
            except FeatpipeError as err:
                if plan is None:
                    raise PipelineError(f"{step.describe()}: {argument} {name}: {err}",
                                        usage=True) from None
                plan.problem(step.name, f"{argument} {name}: {err}")
                continue
            reporter.info(f"{name} = {rename[name]}")
    return rename


def check_names(steps: list[Step], path: Path) -> None:
    """No two steps give their stage the same store name (``name``, by default the step's):
    the name would flip between the two stages on every run."""
    seen: dict[str, Step] = {}
    for step in steps:
        if "name" not in _signature(step.function).parameters:
            continue
        name = step.arguments.get("name") or step.name
        if name in seen:
            raise PipelineError(f"{path}: {step.describe()}: name {name!r} is already the "
                                f"name of {seen[name].describe()}; give each step its own "
                                "name", usage=True)
        seen[name] = step


def _record_of(arguments: Mapping, function: str) -> dict:
    """``arguments`` with the fields of the function's flat record (:func:`_flat_record`)
    made into that record, under its parameter's name."""
    arguments = dict(arguments)
    record = _flat_record(function)
    if record is not None:
        parameter, cls = record
        arguments[parameter] = cls(**{f.name: arguments.pop(f.name) for f in fields(cls)
                                      if f.name in arguments})
    return arguments


def _pass_arguments(pipeline: Pipeline, host: Step, fusion: Fusion,
                    rename: Mapping[str, str], settings) -> dict:
    """``extract``'s settings (``then`` and ``keep``) for the pass of step ``host``: each
    fused step as a :class:`featpipe.chain.Then` (named by its store name when its stage is
    written)."""
    from featpipe.chain import Then

    by_name = {step.name: step for step in pipeline.steps}
    then = []
    for member in fusion.members[host.name]:
        step = by_name[member]
        arguments = renamed(step, rename).arguments
        source = step.arguments["input"]
        kept = fusion.kept[member]
        then.append(Then(member, arguments["method"], dict(arguments.get("params") or {}),
                         input=None if source == host.name else source,
                         name=(arguments.get("name") or member) if kept else None,
                         keep=kept))
    arguments = {"settings": dataclasses.replace(settings, then=tuple(then),
                                                 keep=fusion.kept[host.name])}
    if not fusion.kept[host.name]:
        arguments["name"] = None
    return arguments


def _converted(step: Step, dry_run: bool) -> dict:
    """The keyword arguments of the step's function call."""
    signature = _signature(step.function)
    arguments = _record_of(step.arguments, step.function)
    if "name" in signature.parameters:
        arguments.setdefault("name", step.name)
    arguments.pop("keep", None)  # a step that runs on its own writes its stage
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


def run_pipeline(pipeline: Pipeline, store: Store, *, dry_run: bool = False,
                 only: Callable[[Step], bool] | None = None, skip_blocked: bool = False,
                 reporter: Reporter | None = None) -> list:
    """Plan the steps (:func:`plan_pipeline`), then run them in order; returns each step's
    result (a dry run: none, after printing the plan).

    A plan with a problem runs nothing and raises a :class:`PipelineError` listing every
    problem (a dry run too, after printing the plan), unless ``skip_blocked``: then the steps
    no problem blocks run (:meth:`featpipe.plan.Plan.blocked_steps`) and the others are
    listed.  A step that fails raises a :class:`PipelineError` naming it; items already
    written stay, so running the pipeline again resumes.  A step whose items failed with
    ``on_error = "skip"`` stops the pipeline after it.
    """
    with shared_hashes():  # the plan hashes each input file once, the run reuses it
        return _checked_run(pipeline, store, dry_run, only, skip_blocked,
                            reporter or Reporter())


def _checked_run(pipeline: Pipeline, store: Store, dry_run: bool,
                 only: Callable[[Step], bool] | None, skip_blocked: bool,
                 reporter: Reporter) -> list:
    plan = plan_pipeline(pipeline, store, only=only, reporter=reporter if dry_run else None)
    if dry_run:
        for line in pipeline.grids.grid_lines() if pipeline.grids else []:
            reporter.info(line)
        print_plan(plan, reporter)
    blocked = plan.blocked_steps()
    if plan.problems and not (skip_blocked and not dry_run and
                              len(blocked) < len(plan.steps) and
                              all(p.step for p in plan.problems)):
        raise PipelineError(_refusal(pipeline, plan, blocked, dry_run))
    if dry_run:
        return []
    if blocked:
        reporter.warn(f"not run (--skip-blocked): {', '.join(blocked)}; each is blocked by a "
                      "problem of the plan:")
        for problem in plan.problems:
            reporter.warn(f"problem: {problem}")
        kept = [s for s in pipeline.steps if s.name not in blocked]
        pipeline = dataclasses.replace(pipeline, steps=kept)
        plan = plan_pipeline(pipeline, store, only=only)
        if plan.problems:  # the steps left need nothing of those taken out
            raise PipelineError(_refusal(pipeline, plan, plan.blocked_steps(), False))
    reporter.info(f"plan: {plan.summary()}")
    return _run_steps(pipeline, store, only, reporter)


def _refusal(pipeline: Pipeline, plan: Plan, blocked: Mapping[str, str], dry_run: bool) -> str:
    """The error of a plan with problems: each problem, and what can run anyway."""
    runnable = [s for s in plan.steps if s not in blocked]
    if dry_run:  # its problems are listed with the plan, above
        text = f"the plan has {len(plan.problems)} problem(s) (above): a run would stop " \
            "before computing anything"
    else:
        listing = "".join(f"\n  problem: {p}" for p in plan.problems)
        text = (f"the plan has {len(plan.problems)} problem(s); nothing was computed or "
                f"written:{listing}")
    if runnable and all(p.step for p in plan.problems):
        text += (f"\nthe steps no problem blocks ({', '.join(runnable)}) run with: featpipe run "
                 f"{pipeline.path} --skip-blocked")
    return text


def plan_pipeline(pipeline: Pipeline, store: Store, *,
                  only: Callable[[Step], bool] | None = None,
                  reporter: Reporter | None = None) -> Plan:
    """The plan of the steps (:mod:`featpipe.plan`), computing and writing nothing: each step
    planned as its command's dry run plans it, on a copy of ``store`` where the stages
    planned for the earlier steps stand under their names (:attr:`featpipe.store.Store.
    planned`).  With a ``reporter`` each step's dry run is said on it (at most
    :data:`DRY_RUN_ITEMS` items each) and the extractions are calibrated; without one the plan
    is the quick check a real run makes first (:func:`featpipe.stages.dryrun.quick_plan`).
    Every problem is collected, none raised: a step that fails to plan is a problem of the
    plan, and the steps that read it are blocked by it."""
    from featpipe.stages.dryrun import quick_plan

    quick = reporter is None
    reporter = reporter or Reporter()
    plan = Plan(steps=[step.name for step in pipeline.steps])
    for step in pipeline.steps:
        plan.reads[step.name] = {name for _, name in references(step)}
    store = Store(store.root)  # the caller's store keeps resolving names to what is there
    rename = resolve_references(pipeline, store, reporter, plan)
    fusion = plan_fusion(pipeline.steps)
    asked = _asked(pipeline, only, fusion)
    with quick_plan(quick):
        for number, written in enumerate(pipeline.steps, start=1):
            if asked is None or written.name in asked:
                _plan_step(pipeline, written, number, store, rename, fusion, plan, reporter)
    plan.check_writable(store)
    plan.check_disk(store)
    return plan


def _asked(pipeline: Pipeline, only: Callable[[Step], bool] | None,
           fusion: Fusion) -> set[str] | None:
    """The steps ``only`` asks for, with the pass of each (None: every step)."""
    if only is None:
        return None
    names = {step.name for step in pipeline.steps if only(step)}
    return names | {fusion.pass_of[name] for name in names if name in fusion.pass_of}


def _plan_step(pipeline: Pipeline, written: Step, number: int, store: Store,
               rename: Mapping[str, str], fusion: Fusion, plan: Plan,
               reporter: Reporter) -> None:
    """Plan one step into ``plan`` (its nodes, or its problem)."""
    step = renamed(written, rename)
    reporter.info(_step_line(step, number, len(pipeline.steps), fusion))
    if written.name in fusion.pass_of:
        return
    members = fusion.members.get(written.name, [])
    waits = sorted({name for _, name in references(written)} & set(plan.unplanned))
    if waits:
        plan.unplanned[step.name] = f"after {', '.join(waits)}"
        reporter.info(f"dry run: would run after {', '.join(waits)} (its input is not "
                      "computed yet)")
        return
    blocked = plan.blocked_steps()
    if any(name in blocked for name in plan.reads[written.name]):
        return  # blocked by an earlier step's problem: listed with it
    parameters = _signature(step.function).parameters
    if not {"options", "dry_run"} & set(parameters):  # classify
        _plan_classify(store, step, plan, reporter)
        return
    arguments = _converted(step, dry_run=True)
    if written.name in fusion.members:
        arguments.update(_pass_arguments(pipeline, written, fusion, rename,
                                         arguments["settings"]))
    try:
        result = getattr(stages, step.function)(store, reporter=_ShortListReporter(reporter),
                                                **arguments)
    except ParameterError as err:
        plan.problem(getattr(err, "step", step.name), _problem_text(err, rename))
        return
    except FeatpipeError as err:
        planned = [name for _, name in references(step)
                   if name in store.planned and not store.planned[name].exists]
        if not planned:
            plan.problem(step.name, str(err))
            return
        plan.unplanned[step.name] = f"it needs what {', '.join(planned)} compute: {err}"
        reporter.info(f"dry run: would run after {', '.join(planned)} (it needs what they "
                      f"compute: {err})")
        return
    for problem in getattr(result, "problems", []):
        plan.problem(step.name, problem)
    if "name" in parameters:  # later steps plan on this step's stage
        planned_stage = result if isinstance(result, Stage) else result.stage
        store.planned[arguments.get("name") or step.name] = planned_stage
        for output in getattr(result, "written", []):
            if output.name:
                store.planned[output.name] = output.stage
    if isinstance(result, Stage):  # a fit: its models (stand-ins of the real shapes)
        from featpipe.stages.base import node_of
        from featpipe.stages.dryrun import model_bytes

        plan.add(node_of(result, arguments.get("name"), size=model_bytes(result),
                         step=step.name, items=MODEL))
        return
    for node in result.nodes:
        node.step = node.step or step.name
        node.pass_step = step.name if members else None
        plan.add(node)


def _step_line(step: Step, number: int, count: int, fusion: Fusion) -> str:
    """``step 3/17: rp-hog (encode)``, with the steps of its pass or the pass it runs in."""
    line = f"step {number}/{count}: {step.name} ({step.function})"
    if step.name in fusion.pass_of:
        return (line + f": runs in the pass of step {fusion.pass_of[step.name]!r}"
                + ("" if fusion.kept[step.name] else " (its stage is not written)"))
    if step.name in fusion.members:
        return line + f", with {', '.join(fusion.members[step.name])} in one pass"
    return line


def _problem_text(err: ParameterError, rename: Mapping[str, str]) -> str:
    """A parameter problem as a step's line: the parameter and its cause (a fused step's
    error names the step already: its cause), each stage named as the file names it."""
    text = err.cause if hasattr(err, "step") else str(err)
    for written, meant in rename.items():
        text = text.replace(repr(meant), repr(written))
    return text


def _plan_classify(store: Store, step: Step, plan: Plan, reporter: Reporter) -> None:
    """A classify step's plan: its inputs planned or stored, of one vector per item
    (:mod:`featpipe.item_kinds`), and the size of its result."""
    from featpipe.item_kinds import CLASSIFY, check_input, item_kind

    inputs = step.arguments.get("inputs", [])
    for name in inputs:
        try:
            check_input("classify", CLASSIFY, {}, item_kind(store.resolve(name)), repr(name))
        except ParameterError as err:
            plan.problem(step.name, str(err))
            return
        except FeatpipeError as err:
            plan.problem(step.name, f"inputs: {err}")
            return
    size = _classify_size(store, step)
    reporter.info(f"dry run: would run classify on {', '.join(inputs)}"
                  + (f"; about {human_bytes(size)} at rest" if size else ""))
    plan.add(Node(step.name, "classify", "classify", step.arguments.get("name"), None, "-",
                  size, None, tuple(inputs)))


def _run_steps(pipeline: Pipeline, store: Store, only: Callable[[Step], bool] | None,
               reporter: Reporter) -> list:
    """Run the steps of a checked plan in order (a step of a pass with its pass)."""
    rename = resolve_references(pipeline, store, Reporter())
    fusion = plan_fusion(pipeline.steps)
    asked = _asked(pipeline, only, fusion)
    results = []
    for number, written in enumerate(pipeline.steps, start=1):
        if asked is not None and written.name not in asked:
            continue
        step = renamed(written, rename)
        reporter.info(_step_line(step, number, len(pipeline.steps), fusion))
        if written.name in fusion.pass_of:
            results.append(None)
            continue
        arguments = _converted(step, dry_run=False)
        if written.name in fusion.members:
            arguments.update(_pass_arguments(pipeline, written, fusion, rename,
                                             arguments["settings"]))
        if step.function == "classify":
            arguments.setdefault("command", f"featpipe run {pipeline.path} (step {step.name})")
        try:
            result = getattr(stages, step.function)(store, reporter=reporter, **arguments)
        except Interrupted:
            raise  # SIGINT, SIGTERM: its line, exit 128 + the signal (cli/run.py)
        except ParameterError as err:
            raise PipelineError(f"{step.describe()}: {err}", usage=True) from None
        except FeatpipeError as err:
            raise PipelineError(f"{step.describe()}: {err}") from None
        if isinstance(result, StageRun) and not result.ok:
            raise PipelineError(f"{step.describe()}: {len(result.summary.failed)} item(s) "
                                "failed; later steps not run (fix them and run the pipeline "
                                "again)")
        results.append(result)
    return results


def _classify_size(store: Store, step: Step) -> int | None:
    """About how many bytes a classify step's result takes (its JSON: per split and test
    item a prediction, per class its scores, the confusion matrix), from its inputs' items."""
    try:
        items = store.resolve(step.arguments["inputs"][0]).items
    except (FeatpipeError, KeyError, IndexError):
        return None
    classes = len(items.classes)
    splits = (items.n_splits or 1) if str(step.arguments.get("split", "1")) == "all" else 1
    test = len(items.split_ids(1, "test")) if items.ids else 0
    return 2048 + splits * (160 * test + 20 * classes * classes + 60 * classes)


