"""``featpipe fit standardize``: per-channel mean and std of the train frames of a stage."""

from __future__ import annotations

import click

from featpipe.cli.common import (
    ClickReporter,
    fit_dry_run_option,
    open_store,
    store_option,
)


@click.command("standardize")
@store_option
@click.option("--input", "-i", "input_name", required=True, help="Input stage name.")
@click.option("--name", "-n", default=None, help="Name to give the fitted stage.")
@click.option("--split", default=1, show_default=True, type=int,
              help="Manifest split whose train items give the statistics.")
@fit_dry_run_option
def fit_standardize(store_path, input_name, name, split, dry_run):
    """Fit per-channel standardisation on the input's train frames (then `encode --method
    standardize --model NAME`)."""
    from featpipe.stages.fitting import fit_standardize as fit_standardize_stage

    fit_standardize_stage(open_store(store_path), input_name, name=name, split=split,
                          dry_run=dry_run, reporter=ClickReporter())
