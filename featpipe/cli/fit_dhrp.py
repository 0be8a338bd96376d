"""``featpipe fit dhrp``: discriminative hierarchical rank pooling (seed paper section 4.4).

The work is :func:`featpipe.stages.fitting.fit_dhrp`; the options come from
:class:`featpipe.learn.dhrp.DiscriminativeRankPooling`.
``featpipe encode --method dhrp --model NAME`` applies the model.
"""

from __future__ import annotations

import click

from featpipe.cli.common import (
    ClickReporter,
    fit_dry_run_option,
    open_store,
    store_option,
)
from featpipe.cli.options import attach_options, parameter_option_specs, table_entry


def table_source() -> list[dict]:
    """The generated options of ``featpipe fit dhrp`` (``options.json``)."""
    from featpipe.learn.dhrp import DiscriminativeRankPooling
    from featpipe.parameters import estimator_parameters

    return parameter_option_specs(estimator_parameters(DiscriminativeRankPooling))


@click.command("dhrp")
@store_option
@click.option("--input", "-i", "input_name", required=True,
              help="Sequence stage: per-item (T, D) arrays (e.g. encode --method hrp "
                   "--emit-layer L, or a per-frame stage).")
@click.option("--name", "-n", required=True, help="Name to give the fitted model stage.")
@click.option("--split", default=1, show_default=True, type=int,
              help="Manifest split whose train items are used (its test items are scored).")
@attach_options(table_entry("fit dhrp"))
@click.option("--threads", default=None, type=int,
              help="torch CPU threads (default: torch's; 1 is often faster for these small "
                   "batched solves on a busy machine).")
@click.option("--force", is_flag=True, help="Refit even if the model exists.")
@fit_dry_run_option
def fit_dhrp(store_path, input_name, name, split, threads, force, dry_run, **params):
    """Learn ψ(W x) and a soft-max classifier through rank pooling (DHRP)."""
    from featpipe.stages.fitting import fit_dhrp as fit_dhrp_stage

    fit_dhrp_stage(open_store(store_path), input_name, name=name, split=split, threads=threads,
                   force=force, dry_run=dry_run, reporter=ClickReporter(), **params)
