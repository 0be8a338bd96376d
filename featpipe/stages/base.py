"""What every stage function shares: run options, the reporter, running items, naming.

A stage function (``extract``, ``encode``, ``fit_*``, ``classify``...) opens or creates its
stage in a :class:`~featpipe.store.Store`, computes what is missing and returns the
:class:`~featpipe.store.Stage` (item stages return a :class:`StageRun` with the counts).  It
tells what it does through a :class:`Reporter`: silent by default, so the functions are a
library; the command line passes one that prints.

Rules every stage function follows:

- every parameter is checked before the stage exists (:func:`check_name`, the estimators'
  constraints, :class:`RunOptions`): a bad value raises
  :class:`~featpipe.errors.ParameterError`, and no stage folder or name is touched;
- a run marks itself running when it starts (:func:`mark_running`): the stage records the
  process (``running/<host>-<pid>``, ``cache gc`` keeps the stage while it lives) and a named
  run is recorded as the name's *running* stage (``STORE/names/.running/NAME``), which
  ``featpipe status NAME`` follows (:func:`latest_stage`) and ``cache gc`` keeps, also
  after the process was killed; with the work it planned per item
  (:func:`featpipe.progress.record_work`), which its progress line and ``featpipe status``
  time it by; :func:`unmark_running` undoes both when it ends;
- a name moves to a stage only when its run went through (:func:`settle_name`): every item
  done, or, with ``on_error='skip'``, every item done or failed (the failed ids are listed
  by ``featpipe status`` and left out of the stages computed from it, which record them:
  :func:`usable_items`); otherwise the run says which name it did not move and why, and a
  name that moves from one stage to another says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field

from featpipe.errors import FeatpipeError, ParameterError
from featpipe.fileio import atomic_write_bytes, make_dirs
from featpipe.interrupts import Interrupt, Interrupted
from featpipe.manifest import Manifest, needs_row_fix
from featpipe.parallel import ON_ERROR, Compute, RunSummary, parse_shard, plan, run_items
from featpipe.progress import WorkPlan, clear_work, record_work
from featpipe.reporting import Progress, Reporter  # noqa: F401 (Progress: re-exported)
from featpipe.store import NAME_PATTERN, Stage, Store, pointer_bytes
from featpipe.store.content import CACHE_NAME, ContentHashes

#: Sub-folder of ``STORE/names`` recording, per name, the stage a run is computing for it.
RUNNING = ".running"
#: the step label of a dry run's own node (a pipeline puts its step's name there)
THIS_STEP = ""
#: Items of an item stage's input whose rows are read to plan its work (:func:`input_rows`).
WORK_SAMPLE = 256

log = logging.getLogger("featpipe")


@dataclass(frozen=True)
class RunOptions:
    """How an item stage runs: workers, executor, shard, failures, recompute, dry run.

    Checked when made: ``shard`` (or SLURM's task variables when it is ``None``) must be
    ``I/N`` with 0 <= I < N, ``on_error`` ``fail`` or ``skip``.
    """

    jobs: int = 1
    executor: str = "local"
    scheduler: str | None = None
    shard: str | None = None
    on_error: str = "fail"
    force: bool = False
    dry_run: bool = False

    def __post_init__(self):
        try:
            parse_shard(self.shard)
        except FeatpipeError:
            given = repr(self.shard) if self.shard is not None else \
                "SLURM_ARRAY_TASK_ID={!r}, SLURM_ARRAY_TASK_COUNT={!r}".format(
                    *(os.environ.get(f"SLURM_ARRAY_TASK_{v}") for v in ("ID", "COUNT")))
            raise ParameterError("shard", f"must be I/N with 0 <= I < N (e.g. 0/4), got "
                                 f"{given}") from None
        if self.on_error not in ON_ERROR:
            raise ParameterError("on_error", f"must be one of {', '.join(ON_ERROR)}, got "
                                 f"{self.on_error!r}")


#: the content-hash caches shared by the stage functions of one run (:func:`shared_hashes`)
_HASHES: ContextVar[dict | None] = ContextVar("featpipe_shared_hashes", default=None)


@contextlib.contextmanager
def shared_hashes():
    """Inside the block, the stage functions share one content-hash cache per store
    (:func:`content_hashes`): a run's plan hashes each input file once, and the run reuses
    the hashes (the cache still checks each file's size, times and inode)."""
    token = _HASHES.set({})
    try:
        yield
    finally:
        _HASHES.reset(token)


def content_hashes(store: Store) -> ContentHashes:
    """The content-hash cache of ``store`` (:class:`featpipe.store.content.ContentHashes`, read
    from its cache file), the one of the current :func:`shared_hashes` block if any."""
    path = store.root / CACHE_NAME
    shared = _HASHES.get()
    if shared is None:
        return ContentHashes(path)
    key = os.path.abspath(path)
    if key not in shared:
        shared[key] = ContentHashes(path)
    return shared[key]


def check_name(name: str | None) -> None:
    """A stage name is letters, digits, ``.``, ``_`` and ``-`` (at most 128, no path)."""
    if name is not None and not NAME_PATTERN.match(name):
        raise ParameterError("name", f"must be letters, digits, '.', '_' or '-' (at most 128, "
                             f"starting with a letter or digit), got {name!r}")


def describe(stage: Stage) -> str:
    """``encode-AAA (hrp)``: the folder and what it holds (an encode stage's method)."""
    what = stage.params.get("method") if isinstance(stage.params, dict) else None
    return f"{stage.name} ({what or stage.kind})"


def name_stage(store: Store, name: str | None, stage: Stage, reporter: Reporter) -> None:
    """Point ``name`` at ``stage`` (complete); say so when the name leaves another stage."""
    if not name:
        return
    previous = store.names().get(name)
    if previous != stage.name:  # a rerun that changes nothing touches nothing
        store.set_name(name, stage)
    marker = store.names_dir / RUNNING / name
    if marker.exists():  # (a read-only store refuses even to unlink a missing file)
        marker.unlink()
    if previous and previous != stage.name:
        try:
            before = describe(store.stage_by_folder(previous))
        except FeatpipeError:
            before = previous
        reporter.warn(f"name {name} moved from {before} to {describe(stage)}")


@dataclass(frozen=True)
class Written:
    """A stage a run writes: the stage, its store name and (a dry run) its bytes at rest."""

    stage: Stage
    name: str | None = None
    bytes: int | None = None


@dataclass
class StageRun:
    """An item stage after a run: the stage, its counts and (for a dry run) the plan."""

    stage: Stage
    summary: RunSummary
    todo: list[str] = field(default_factory=list)
    #: the stages the run writes, when it writes others than ``stage`` (an extraction's
    #: pass with steps), with their names and, for a dry run, their estimated bytes
    written: list[Written] = field(default_factory=list)
    #: a dry run's CPU-time estimate (seconds), and what it found that would stop the run
    cpu_seconds: float | None = None
    problems: list[str] = field(default_factory=list)
    #: a dry run's plan of the stages it computes (:class:`featpipe.plan.Node`: the stage
    #: itself, and the steps of its pass), its own step labelled :data:`THIS_STEP`
    nodes: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.summary.failed


def node_of(stage: Stage, name: str | None, *, size: int | None = None, written: bool = True,
            step: str = THIS_STEP, pass_step: str | None = None, todo: int | None = None,
            items: int | str | None = None):
    """The plan's node of ``stage`` (:class:`featpipe.plan.Node`), its item kind derived."""
    from featpipe.item_kinds import item_kind
    from featpipe.plan import Node

    kind = item_kind(stage)
    return Node(step, stage.name, stage.kind, name, None if kind is None else kind.label,
                len(stage.items.ids) if items is None else items, size, None,
                tuple(stage.input_names), written, pass_step, todo)


def announce(stage: Stage, name: str | None, reporter: Reporter) -> None:
    label = f" as {name!r}" if name else ""
    reporter.info(f"stage {stage.name}{label}")


def mark_running(store: Store, name: str | None, stage: Stage,
                 work: WorkPlan | None = None, force: bool = False) -> None:
    """A run of ``stage`` starts: its process marker (:meth:`Stage.mark_running`, removed by
    :func:`unmark_running` when the run ends), the work it plans when given
    (:func:`featpipe.progress.record_work`; ``force``: it recomputes done items) and, for a
    named run, the name's running marker (removed when the name moves to the stage)."""
    stage.mark_running()
    if work is not None:
        record_work(stage, work, force)
    if name:
        make_dirs(store.names_dir / RUNNING)
        atomic_write_bytes(store.names_dir / RUNNING / name, pointer_bytes(name, stage.name))


def unmark_running(stage: Stage) -> None:
    """The run of ``stage`` in this process ended: its marker and its work record go."""
    clear_work(stage)
    stage.unmark_running()


def running_names(store: Store, problems: list[str] | None = None) -> dict[str, str]:
    """Names whose last run has not completed yet, and the stage folder each run computes
    (``cache gc`` keeps these stages: their items are computed work); a damaged marker is
    left out (and described in ``problems`` when a list is given)."""
    folder = store.names_dir / RUNNING
    if not folder.is_dir():
        return {}
    found = {}
    for path in sorted(folder.iterdir()):
        if NAME_PATTERN.match(path.name) and path.is_file():
            try:
                found[path.name] = store.read_pointer(path, path.name, "unfinished run of")
            except FeatpipeError as err:
                if problems is not None:
                    problems.append(str(err))
    return found


def latest_stage(store: Store, name: str) -> Stage:
    """The stage the last run for ``name`` computed (complete or not), else the stage ``name``
    points to: what ``featpipe status NAME`` reports on."""
    folder = running_names(store).get(name)
    if folder and NAME_PATTERN.match(folder) and \
            (store.stages_dir / folder / "stage.json").exists():
        return store.stage_by_folder(folder)
    return store.resolve(name)


def input_rows(source: Stage, ids: Sequence[str]) -> dict[str, int]:
    """Rows of items ``ids`` of ``source`` (their ``.npy`` headers, nothing loaded), the
    work of a stage computed from them (:func:`run_stage`'s ``work``): of every item up to
    :data:`WORK_SAMPLE` items, else of that many spread evenly (the others count as their
    mean: reading a batched item's header opens its batch file, about 1 ms)."""
    from featpipe.extract.estimate import sample_ids
    from featpipe.stages.dryrun import source_lengths

    return source_lengths(source, sample_ids(list(ids), WORK_SAMPLE))


def run_stage(stage: Stage, ids: Sequence[str], compute: Compute, *, store: Store,
              name: str | None = None, options: RunOptions | None = None,
              reporter: Reporter | None = None, batch_size: int = 1,
              work: Callable[[list[str]], Mapping[str, float | None]] | None = None
              ) -> StageRun:
    """Compute the missing items of ``stage``, name it, report progress and a summary line.

    ``work(ids)`` gives the work units of the items to compute (e.g. their input's rows,
    :func:`input_rows`; an item it leaves out, or every item without it, counts as the
    mean: :class:`~featpipe.progress.WorkPlan`), asked only when some are: the progress line
    and ``featpipe status`` time the run by it.  A dry run lists the work
    and moves no name.  With ``on_error='fail'`` the first failed item raises a
    :class:`FeatpipeError` naming it (items already written stay).
    """
    reporter = reporter or Reporter()
    options = options or RunOptions()
    check_name(name)
    shard = parse_shard(options.shard)
    announce(stage, name, reporter)
    if options.dry_run:
        todo, summary = plan(stage, ids, force=options.force, shard=shard)
        for item_id in todo:
            reporter.info(f"would compute {item_id}")
        reporter.info(f"dry run: {len(todo)} to compute, {summary.skipped} already complete")
        return StageRun(stage, summary, todo, nodes=[node_of(stage, name, todo=len(todo))])
    todo, _ = plan(stage, ids, force=options.force, shard=shard)
    lock = one_run_at_a_time(stage, ids, shard, options.force, reporter) if todo else \
        contextlib.nullcontext(lambda summary: None)  # nothing to compute: no lock taken
    with lock as reused:
        todo, _ = plan(stage, ids, force=options.force, shard=shard)
        planned = WorkPlan(todo, work(todo) if work is not None and todo else {})
        if todo:  # a rerun with nothing to compute marks nothing
            mark_running(store, name, stage, planned, options.force)
        label = f"{stage.kind} {name}" if name else stage.kind

        def ended(item_ids: list[str]) -> None:
            for item_id in item_ids:
                progress.advance_item(item_id)
                progress.ended(item_id)

        try:
            with reporter.progress(len(todo), label) as progress:
                progress.plan_work(planned)
                summary = run_items(
                    stage, ids, compute, jobs=options.jobs, on_error=options.on_error,
                    force=options.force, shard=shard, batch_size=batch_size,
                    executor=options.executor, scheduler=options.scheduler,
                    progress=ended)
        except Interrupt as signal_:  # SIGINT, SIGTERM: the items written stay
            done = len(stage.done_ids() & set(todo))
            raise Interrupted(signal_.signum, done, len(todo) - done) from None
        except BaseException:
            name_left(stage, name, ids, reporter)
            raise
        finally:
            unmark_running(stage)
    reused(summary)
    reporter.info(f"summary: {summary.line()}")
    for item_id, error in list(summary.failed.items())[:20]:
        reporter.error(f"failed: {item_id}: {error}")
    settle_name(store, name, stage, ids, options.on_error, reporter)
    return StageRun(stage, summary)


@contextlib.contextmanager
def one_run_at_a_time(stage: Stage, ids: Sequence[str], shard: tuple[int, int] | None,
                      force: bool, reporter: Reporter):
    """Run the block holding the stage's lock for ``shard`` (:meth:`Stage.exclusive`): an
    identical run already computing the stage is waited for (said on stderr), and the block
    then finds its items done.  Yields ``reused(summary)``, which says how many items the
    other run computed meanwhile (after a wait; ``force`` recomputes them)."""
    waited: list[int] = []

    def waiting() -> None:
        waited.append(len(stage.done_ids() & set(ids)))
        who = ", ".join(stage.running_processes()) or "another process"
        reporter.warn(f"stage {stage.name} is being computed by {who}; waiting for it, then "
                      "reusing its items")

    def reused(summary: RunSummary) -> None:
        if waited and not force:
            reporter.info(f"reused {max(summary.skipped - waited[0], 0)} item(s) the other "
                          "run computed meanwhile")

    label = "all" if shard is None else f"shard-{shard[0]}-of-{shard[1]}"
    with stage.exclusive(label, waiting):
        yield reused


def settle_name(store: Store, name: str | None, stage: Stage, ids: Sequence[str],
                on_error: str, reporter: Reporter) -> None:
    """After a run that ended: ``name`` moves to ``stage`` when every item of ``ids`` is done,
    or, with ``on_error='skip'``, when every one is done or failed (said on stderr, with the
    first failed id); else the name stays and the run says why."""
    if not name:
        return
    done = stage.done_ids()
    missing = [item_id for item_id in ids if item_id not in done]
    if not missing:
        name_stage(store, name, stage, reporter)
        return
    failed = stage.failed()
    if on_error == "skip" and all(item_id in failed for item_id in missing):
        name_stage(store, name, stage, reporter)
        reporter.warn(f"name {name} points to stage {stage.name} with {len(missing)} failed "
                      f"item(s) (first: {missing[0]!r}; `featpipe status {name}` lists them); "
                      "stages computed from it leave them out")
        return
    name_left(stage, name, ids, reporter, done)


def name_left(stage: Stage, name: str | None, ids: Sequence[str], reporter: Reporter,
              done_ids: set[str] | None = None) -> None:
    """Say that ``name`` did not move because ``stage`` is incomplete, and what finishes it:
    the same command again; not when an item's file is missing
    (:func:`featpipe.manifest.needs_row_fix`): its manifest row is then what to fix, and the
    fixed manifest is a new stage."""
    if name:
        done = len(set(ids) & (stage.done_ids() if done_ids is None else done_ids))
        failed = stage.failed()
        rows = [i for i in ids if i in failed and needs_row_fix(failed[i])]
        advice = "re-run the same command to finish it" if not rows else (
            f"the file of {len(rows)} item(s) is missing (first: {rows[0]!r}; `featpipe "
            f"status {name}` lists them): fix or remove their manifest rows, and the command "
            "makes a new stage")
        reporter.warn(f"name {name} not moved: stage {stage.name} is incomplete ({done} of "
                      f"{len(ids)} items done); {advice}")


def usable_items(source: Stage, reporter: Reporter) -> tuple[Manifest, list[str]]:
    """The items of ``source`` a stage computed from it covers, and the ids it leaves out:
    those whose latest state there is failed (a run with ``on_error='skip'``); the caller
    records them in its key (``input_failed``), so a source whose items are fixed later
    gives a new stage downstream."""
    items = source.items
    failed = source.failed()
    left_out = [item_id for item_id in items.ids if item_id in failed]
    if not left_out:
        return items, []
    reporter.warn(f"{len(left_out)} item(s) failed in {source.name} and are left out "
                  f"(first: {left_out[0]!r}: {failed[left_out[0]]})")
    return items.subset(set(items.ids) - set(left_out)), left_out


def train_item_ids(source: Stage, split: int = 1) -> list[str]:
    """The train ids of ``split`` in ``source``, every one computed, or a one-line error.

    A model fitted on part of the train set would be silently different from the one asked
    for, so train items not computed yet are refused, not skipped; those that failed there
    (``on_error='skip'``) are left out, and the fit stage's key records them
    (``input_failed``).
    """
    failed = source.failed()
    train = [i for i in source.items.split_ids(split, "train") if i not in failed]
    if not train:
        raise FeatpipeError(f"input stage {source.name} has no train items in split {split}"
                            + (" (its failed items are left out)" if failed else ""))
    if not source.exists:  # planned by a dry run: its items will be computed first
        return train
    done = source.done_ids()
    missing = [item_id for item_id in train if item_id not in done]
    if missing:
        raise FeatpipeError(f"{len(missing)} train items of {source.name} are not computed "
                            f"(first: {missing[0]!r}); finish the input stage first")
    return train
