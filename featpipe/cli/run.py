"""``featpipe run PIPELINE.toml``: run a declared sequence of stages (a thin layer over
:mod:`featpipe.stages`; the file format is in :mod:`featpipe.pipeline`, the plan a run checks
before it starts in :mod:`featpipe.plan`)."""

from __future__ import annotations

import os

import click

from featpipe.cli.common import ClickReporter, open_store
from featpipe.suggest import did_you_mean


@click.command("run")
@click.argument("pipeline_path", metavar="PIPELINE.toml", type=click.Path(dir_okay=False))
@click.option("--store", "-s", "store_path", default=None, type=click.Path(file_okay=False),
              help="Store folder [default: the file's [pipeline] store, else $FEATPIPE_STORE].")
@click.option("--dry-run", is_flag=True,
              help="Print the plan (every stage, its items, bytes at rest and CPU, and every "
              "problem); compute nothing, move no name; exit 1 on a problem.")
@click.option("--step", "steps", multiple=True, metavar="NAME",
              help="Run only these steps (repeatable; a step with a grid: all its points, "
              "or one by its name, e.g. hrp-window5-depth1); their inputs must exist.")
@click.option("--skip-blocked", is_flag=True,
              help="When the plan has problems, run the steps none of them blocks (a step "
              "with a problem and every step reading it are left out, and listed).")
def run(pipeline_path, store_path, dry_run, steps, skip_blocked):
    """Run the steps of PIPELINE.toml in order; a rerun computes only what is missing.

    \b
    The whole run is planned and checked first: a problem of any step (a missing
    weights file, an input of the wrong item kind, the disk) stops it before anything
    is computed or written, with every problem listed (exit 1).
    One [steps.NAME] table per step: stage = a featpipe.stages function, the other keys
    its arguments; the step name is the stage's name, later steps use it as input:
    [steps.avg]
    stage = "encode"
    input = "frames"
    method = "avg"
    Format: docs/walkthrough.md "Pipeline files"; an example: featpipe example pipeline.
    """
    from featpipe.interrupts import Interrupted
    from featpipe.pipeline import PipelineError, load_pipeline, run_pipeline

    try:
        pipeline = load_pipeline(pipeline_path)
        unknown = sorted(name for name in steps if not pipeline.step_names(name))
        if unknown:
            hint = did_you_mean(unknown[0], [step.name for step in pipeline.steps])
            raise click.BadParameter(f"no step {unknown[0]!r} in {pipeline_path}"
                                     + (f": {hint}" if hint else ""), param_hint="--step")
        steps = {point for name in steps for point in pipeline.step_names(name)}
        store = store_path or pipeline.store or os.environ.get("FEATPIPE_STORE")
        if not store:
            raise click.UsageError(f"no store: give --store, set $FEATPIPE_STORE or add "
                                   f"store = \"PATH\" under [pipeline] in {pipeline_path}")
        run_pipeline(pipeline, open_store(store), dry_run=dry_run,
                     only=(lambda step: step.name in steps) if steps else None,
                     skip_blocked=skip_blocked, reporter=ClickReporter())
    except PipelineError as err:
        click.echo(f"error: {err}", err=True)
        raise click.exceptions.Exit(2 if err.usage else 1) from None
    except Interrupted as err:
        click.echo(str(err), err=True)
        raise click.exceptions.Exit(err.exit_code) from None
