"""``featpipe submit``: run an item-parallel stage command on a SLURM job array or on Dask."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click

from featpipe.cli.common import open_store, verbosity
from featpipe.cli.suggest import Choice
from featpipe.processes import child_environment, featpipe_command, import_path
from featpipe.slurm import (
    ArrayJob,
    default_template,
    option_value,
    sbatch,
    stage_argv,
    wait_for_jobs,
)


@click.command("submit")
@click.option("--backend", required=True, type=Choice(["slurm", "dask"]),
              help="slurm: a job array, one shard per task; dask: items go to --scheduler.")
@click.option("--tasks", "-N", type=click.IntRange(min=1), default=None,
              help="Array tasks (shards) for --backend slurm.")
@click.option("--partition", "-p", default=None, help="SLURM partition.")
@click.option("--time", "-t", "time_limit", default=None, help="Time limit per task (HH:MM:SS).")
@click.option("--mem", default=None, help="Memory per task (e.g. 8G).")
@click.option("--gpus", type=click.IntRange(min=0), default=None, help="GPUs per task.")
@click.option("--cpus-per-task", type=click.IntRange(min=1), default=None,
              help="CPUs per task (give the stage command a matching --jobs).")
@click.option("--array-throttle", type=click.IntRange(min=1), default=None,
              help="At most K tasks running at once (sbatch --array=0-N%K).")
@click.option("--sbatch-option", "extra", multiple=True, metavar="OPT",
              help="Extra sbatch option line, e.g. --sbatch-option=--qos=long (repeatable).")
@click.option("--job-name", default=None, help="Job name (default: featpipe-COMMAND-NAME).")
@click.option("--log-dir", type=click.Path(file_okay=False), default=None,
              help="Folder for task logs (default: STORE/logs, else ./featpipe-logs).")
@click.option("--template", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Your own sbatch template (start from --print-template; default: the "
                   "one shipped with featpipe).")
@click.option("--print-template", is_flag=True, is_eager=True, expose_value=False,
              callback=lambda ctx, _, value: _print_template(ctx) if value else None,
              help="Print the shipped template (to copy and edit) and exit.")
@click.option("--scheduler", default=None, envvar="DASK_SCHEDULER_ADDRESS",
              help="Dask scheduler address for --backend dask (or $DASK_SCHEDULER_ADDRESS).")
@click.option("--wait", is_flag=True,
              help="Wait for the array and its report job; exit 1 unless the stage is complete.")
@click.option("--dry-run", is_flag=True, help="Print the script (or command); submit nothing.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def submit(backend, tasks, partition, time_limit, mem, gpus, cpus_per_task, array_throttle,
           extra, job_name, log_dir, template, scheduler, wait, dry_run, command):
    """Run the stage COMMAND (after `--`) on a cluster.

    COMMAND is first run with --dry-run, here: its own checks (options, names, inputs) fail
    before any job file is written; what depends on the node (--device, --jobs against its
    cores) is checked by each task on its node.

    \b
    featpipe submit --backend slurm --tasks 8 --time 2:00:00 --wait -- \\
        featpipe encode --store S --input feats --method avg --name avg
    featpipe submit --backend dask --scheduler tcp://HOST:8786 -- featpipe encode ...
    """
    from featpipe.fileio import STORE_LOGS, check_outside_store
    from featpipe.progress import stage_progress
    from featpipe.stages.base import latest_stage

    argv = stage_argv(command)
    if backend == "slurm" and tasks is None:
        raise click.UsageError("--backend slurm needs --tasks N (the number of array tasks)")
    if backend == "dask" and not scheduler:
        raise click.UsageError("--backend dask needs --scheduler ADDRESS "
                               "(or $DASK_SCHEDULER_ADDRESS)")
    deferred = check_stage_command(argv)
    if backend == "dask":
        _submit_dask(argv, scheduler, dry_run)
        return
    store = option_value(argv, "--store", "-s") or os.environ.get("FEATPIPE_STORE")
    name = option_value(argv, "--name", "-n")
    if log_dir is None:
        log_dir = Path(store) / STORE_LOGS if store else Path("featpipe-logs")
    elif store:
        check_outside_store(log_dir, "log_dir", store)
    log_dir = Path(log_dir).resolve()
    subcommand = next((a for a in command[1:] if not a.startswith("-")), "stage")
    job = ArrayJob(
        command=argv, tasks=tasks, log_dir=log_dir,
        job_name=job_name or "-".join(["featpipe", subcommand] + ([name] if name else [])),
        partition=partition, time=time_limit, mem=mem, gpus=gpus, cpus_per_task=cpus_per_task,
        throttle=array_throttle, extra=list(extra))
    script = job.render(Path(template).read_text(encoding="utf-8") if template
                        else default_template())
    report = None
    if store and name:
        report = [*featpipe_command(), "status", "--store", str(Path(store).resolve()), name,
                  "--check"]
    if dry_run:
        click.echo(script, nl=False)
        if deferred:
            click.echo(f"# {deferred}")
        if report:
            click.echo(f"# then, after the array ends (afterany): {shlex.join(report)}")
        return
    log_dir.mkdir(parents=True, exist_ok=True)
    script_path = log_dir / f"{job.job_name}.sbatch"
    script_path.write_text(script, encoding="utf-8")
    job_id = sbatch([str(script_path)])
    click.echo(f"submitted array job {job_id} ({tasks} tasks); script {script_path}")
    sys.stdout.flush()
    if report is None:
        click.echo("note: no --store and --name in the stage command, so no report job",
                   err=True)
        if wait:
            wait_for_jobs([job_id])
        return
    report_args = [f"--dependency=afterany:{job_id}", f"--job-name={job.job_name}-report",
                   f"--output={log_dir}/%x-%j.out", f"--chdir={job.workdir}"]
    if partition:
        report_args.append(f"--partition={partition}")
    report_args.append(f"--wrap=PYTHONPATH={shlex.quote(import_path())} {shlex.join(report)}")
    report_id = sbatch(report_args)
    click.echo(f"report job {report_id} runs `featpipe status --check` after the array ends")
    sys.stdout.flush()
    if not wait:
        click.echo(f"follow the stage with: featpipe status --store {store} {name}")
        return
    wait_for_jobs([job_id, report_id])
    log = log_dir / f"{job.job_name}-report-{report_id}.out"
    if log.exists():
        click.echo(log.read_text(encoding="utf-8"), nl=False)
    progress = stage_progress(latest_stage(open_store(store), name))
    if not progress.complete:
        click.echo(f"error: stage {name} is not complete after job {job_id} "
                   f"({progress.done} of {progress.total} done, {len(progress.failed)} failed; "
                   f"task logs in {log_dir}); submit the same command again to finish it",
                   err=True)
        raise click.exceptions.Exit(1)


def _print_template(ctx: click.Context) -> None:
    click.echo(default_template(), nl=False)
    ctx.exit(0)


#: Options of a stage command whose check depends on the machine: made on each task's node.
NODE_OPTIONS = (("--device",), ("--jobs", "-j"))


def check_stage_command(argv: list[str]) -> str:
    """Run a featpipe stage command with ``--dry-run``: its own checks of options, names and
    inputs, computing and writing nothing.  When they fail, print its stderr and exit with its
    status (2: a usage error) before any job file is written.  Other programs are not run.

    What depends on the machine (a GPU for ``--device cuda``, the cores for ``--jobs``:
    :data:`NODE_OPTIONS`) is not checked here (``FEATPIPE_DEFER_NODE_CHECKS``) but by each
    task on its node; returns the line that says so (empty when the command gives none)."""
    from featpipe.settings import NODE_CHECKS_ENV

    prefix = featpipe_command()
    given = [f"{flags[0]} {value}" for flags in NODE_OPTIONS
             if (value := option_value(argv[len(prefix):], *flags)) is not None]
    deferred = f"checked on each task's node: {', '.join(given)}" if given else ""
    if argv[:len(prefix)] != prefix:
        return ""
    proc = subprocess.run([*argv, "--dry-run"], capture_output=True, text=True,
                          env=child_environment({**os.environ, NODE_CHECKS_ENV: "1"}))
    if proc.returncode == 0:
        lines = proc.stdout.strip().splitlines() or [""]
        summary = next((line for line in reversed(lines) if " to compute, " in line), lines[-1])
        if verbosity() >= 0:
            click.echo(f"checked: {shlex.join(['featpipe', *argv[len(prefix):]])} --dry-run: "
                       f"{summary}" + (f"; {deferred}" if deferred else ""), err=True)
        return deferred
    if re.search(r"No such option:? '?--dry-run", proc.stderr):
        raise click.UsageError(f"`featpipe {' '.join(argv[len(prefix):len(prefix) + 1])}` is "
                               "not an item-parallel stage command (it has no --dry-run, "
                               "--shard or --executor)")
    click.echo(proc.stderr, err=True, nl=False)
    click.echo(f"note: nothing submitted: the stage command failed its own checks "
               f"(--dry-run exited {proc.returncode})", err=True)
    raise click.exceptions.Exit(proc.returncode)


def _submit_dask(argv: list[str], scheduler: str, dry_run: bool) -> None:
    full = [*argv, "--executor", "dask", "--scheduler", scheduler]
    if dry_run:
        click.echo(shlex.join(full))
        return
    click.echo(f"running: {shlex.join(full)}")
    sys.stdout.flush()
    code = subprocess.call(full, env=child_environment())
    if code != 0:
        raise click.exceptions.Exit(code)
