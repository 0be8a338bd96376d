"""Options and reporting shared by the commands; the work itself is in :mod:`featpipe.stages`.

A command's ``--help`` imports this module, so it imports click and featpipe's light modules
only; the store, the executors and the progress display (numpy) are imported where a running
command uses them (``tests/cli/test_startup.py``).
"""

from __future__ import annotations

import logging
import shlex
import sys
from typing import TYPE_CHECKING

import click

from featpipe.cli import logfile
from featpipe.cli.suggest import Choice
from featpipe.errors import ParameterError
from featpipe.reporting import Progress, Reporter

if TYPE_CHECKING:
    from featpipe.stages.base import RunOptions, StageRun
    from featpipe.store import Store

store_option = click.option(
    "--store", "-s", "store_path", required=True, envvar="FEATPIPE_STORE",
    type=click.Path(file_okay=False), help="Store folder (or $FEATPIPE_STORE).")

#: ``--dry-run`` of the fit commands: the stage and its key, nothing fitted or named.
fit_dry_run_option = click.option("--dry-run", is_flag=True,
                                  help="Print the model stage (and its key); fit nothing.")

RUN_OPTION_NAMES = ("jobs", "executor", "scheduler", "shard", "on_error", "force", "dry_run")


def check_jobs(ctx, param, value):
    """``--jobs`` callback: -1 = every core, capped at the cores, 0 or < -1 exit 2 at once."""
    from featpipe.parallel import resolve_jobs

    return resolve_jobs(value, param.name)


JOBS_HELP = "Worker processes: N (capped at the available cores) or -1 (one per core)."


def item_parallel_options(func):
    """``--jobs --executor --shard --on-error --force --dry-run`` for item-parallel stages."""
    options = [
        click.option("--jobs", "-j", default=1, show_default=True, type=int,
                     callback=check_jobs, help=JOBS_HELP),
        click.option("--executor", default="local", show_default=True,
                     type=Choice(["local", "dask", "slurm"]),
                     help="Where items run (see docs/cluster.md)."),
        click.option("--scheduler", default=None,
                     help="Address of a dask.distributed scheduler (with --executor dask)."),
        click.option("--shard", default=None, metavar="I/N",
                     help="Compute only shard I of N (default: from SLURM_ARRAY_TASK_ID/COUNT)."),
        click.option("--on-error", default="fail", show_default=True,
                     type=Choice(["fail", "skip"]),
                     help="Stop at the first bad item, or record it as failed and go on."),
        click.option("--force", is_flag=True, help="Recompute items that are already done."),
        click.option("--dry-run", is_flag=True, help="List the work, compute nothing."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def run_options(kwargs: dict) -> RunOptions:
    """Pop the item-parallel options from a command's keyword arguments."""
    from featpipe.stages.base import RunOptions

    return RunOptions(**{k: kwargs.pop(k) for k in RUN_OPTION_NAMES})


def command_line() -> str:
    """The command line being run, as a shell would read it (for reports)."""
    return shlex.join(["featpipe", *sys.argv[1:]])


def open_store(store_path: str) -> Store:
    """The store at ``store_path``; a ``--log-file`` inside it is a usage error (the file is
    removed if this run made it): a stray file in the store breaks ``cache ls`` and ``gc``;
    so is a store folder inside another store (:meth:`~featpipe.store.Store.check_not_nested`)."""
    from featpipe.fileio import check_outside_store
    from featpipe.store import Store

    log = logfile.log_path()
    if log is not None:
        try:
            check_outside_store(log, "log_file", store_path)
        except ParameterError:
            logfile.discard()
            raise
    store = Store(store_path)
    store.check_not_nested()
    return store


def verbosity() -> int:
    """-1 with ``-q``, 0 by default, 1 with ``-v``, 2 with ``-vv`` (docs/command-line.md)."""
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx else None
    if not obj:
        return 0
    return -1 if obj.get("quiet") else min(int(obj.get("verbose") or 0), 2)


def warn(text: str) -> None:
    """A warning on stderr (not with ``-q``), above any progress line; in the log file."""
    from featpipe.cli.display import print_above

    logfile.record(text, logging.WARNING)
    if verbosity() >= 0:
        print_above(text)


class ClickReporter(Reporter):
    """Result lines on stdout; warnings on stderr unless ``-q``; errors on stderr always;
    progress as :mod:`featpipe.cli.display` describes (nothing with ``-q``); all of them in
    the ``--log-file`` (:mod:`featpipe.cli.logfile`)."""

    def info(self, text: str) -> None:
        click.echo(text)
        logfile.record(text)

    def warn(self, text: str) -> None:
        warn(text)

    def error(self, text: str) -> None:
        from featpipe.cli.display import print_above

        print_above(text)
        logfile.record(text, logging.ERROR)

    def progress(self, total: int | None, label: str, unit: str = "items") -> Progress:
        from featpipe.cli.display import board

        level = verbosity()
        if total == 0 or (level < 0 and not logfile.active()):
            return Progress()  # nothing to count (all complete), or -q without a log file
        return board(level).open(total, label, unit)


def finish(run: StageRun) -> None:
    """A dry run: print its plan (:func:`featpipe.plan.print_plan`) and exit with status 1
    when it found a problem.  Exit with status 1 when items failed (also with ``--on-error
    skip``)."""
    if run.nodes:
        from featpipe.plan import Plan, print_plan

        plan = Plan()
        for node in run.nodes:
            plan.add(node)
        for problem in run.problems:
            plan.problem("", problem)
        print_plan(plan, ClickReporter())
        if plan.problems:
            click.echo(f"error: the plan has {len(plan.problems)} problem(s) (above): a run "
                       "would stop before computing anything", err=True)
            raise click.exceptions.Exit(1)
    if not run.ok:
        raise click.exceptions.Exit(1)
