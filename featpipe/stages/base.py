"""What every stage function shares: run options, the reporter, running items, naming.

A stage function (``extract``, ``encode``, ``fit_*``, ``classify``...) opens or creates its
stage in a :class:`~featpipe.store.Store`, computes what is missing and returns the
:class:`~featpipe.store.Stage` (item stages return a :class:`StageRun` with the counts).  It
tells what it does through a :class:`Reporter`: silent by default, so the functions are a
library; the command line passes one that prints.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from featpipe.errors import FeatpipeError
from featpipe.parallel import Compute, RunSummary, parse_shard, plan, run_items
from featpipe.store import Stage, Store

log = logging.getLogger("featpipe")


class Progress:
    """Progress of one run: ``advance(n)`` after ``n`` more units (items, frames, iterations)
    are finished. This one shows nothing."""

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def advance(self, n: int = 1) -> None:
        """``n`` more units finished (items done or failed, frames decoded...)."""

    def close(self) -> None:
        """The run ended."""


class Reporter:
    """Where a stage tells what it does. This base reporter is silent (library use)."""

    def info(self, text: str) -> None:
        """A result line (the stage and its name, a summary): stdout on the command line."""

    def warn(self, text: str) -> None:
        """Something the user should know but that does not stop the stage: stderr."""

    def error(self, text: str) -> None:
        """An item or step that failed (stderr, also with ``-q``)."""

    def progress(self, total: int | None, label: str, unit: str = "items") -> Progress:
        """A progress display for ``total`` units (``None``: not known in advance)."""
        return Progress()


@dataclass(frozen=True)
class RunOptions:
    """How an item stage runs: workers, executor, shard, failures, recompute, dry run."""

    jobs: int = 1
    executor: str = "local"
    scheduler: str | None = None
    shard: str | None = None
    on_error: str = "fail"
    force: bool = False
    dry_run: bool = False


@dataclass
class StageRun:
    """An item stage after a run: the stage, its counts and (for a dry run) the plan."""

    stage: Stage
    summary: RunSummary
    todo: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.summary.failed


def announce(stage: Stage, name: str | None, reporter: Reporter) -> None:
    label = f" as {name!r}" if name else ""
    reporter.info(f"stage {stage.name}{label}")


def run_stage(stage: Stage, ids: Sequence[str], compute: Compute, *, store: Store,
              name: str | None = None, options: RunOptions | None = None,
              reporter: Reporter | None = None, batch_size: int = 1) -> StageRun:
    """Compute the missing items of ``stage``, name it, report progress and a summary line.

    A dry run lists the work and moves no name.  With ``on_error='fail'`` the first failed
    item raises a :class:`FeatpipeError` naming it (items already written stay).
    """
    reporter = reporter or Reporter()
    options = options or RunOptions()
    shard = parse_shard(options.shard)
    announce(stage, name, reporter)
    if options.dry_run:
        todo, summary = plan(stage, ids, force=options.force, shard=shard)
        for item_id in todo:
            reporter.info(f"would compute {item_id}")
        reporter.info(f"dry run: {len(todo)} to compute, {summary.skipped} already complete")
        return StageRun(stage, summary, todo)
    if name:
        store.set_name(name, stage)
    todo, _ = plan(stage, ids, force=options.force, shard=shard)
    label = f"{stage.kind} {name}" if name else stage.kind
    with reporter.progress(len(todo), label) as progress:
        summary = run_items(
            stage, ids, compute, jobs=options.jobs, on_error=options.on_error,
            force=options.force, shard=shard, batch_size=batch_size,
            executor=options.executor, scheduler=options.scheduler, progress=progress.advance)
    reporter.info(f"summary: {summary.line()}")
    for item_id, error in list(summary.failed.items())[:20]:
        reporter.error(f"failed: {item_id}: {error}")
    return StageRun(stage, summary)


def train_item_ids(source: Stage, split: int = 1) -> list[str]:
    """The train ids of ``split`` in ``source``, every one computed, or a one-line error.

    A model fitted on part of the train set would be silently different from the one asked
    for, so missing train items are refused, not skipped.
    """
    train = source.items.split_ids(split, "train")
    if not train:
        raise FeatpipeError(f"input stage {source.name} has no train items in split {split}")
    done = source.done_ids()
    missing = [item_id for item_id in train if item_id not in done]
    if missing:
        raise FeatpipeError(f"{len(missing)} train items of {source.name} are not computed "
                            f"(first: {missing[0]!r}); finish the input stage first")
    return train
