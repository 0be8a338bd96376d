"""``featpipe fit gmsop``: train a gated mixture of second-order pooling (NeurIPS'18) on the
conv maps of the train items of one split; ``featpipe encode --method gmsop --model NAME``
then encodes every item with it.  The options come from
:class:`featpipe.learn.gmsop.GatedMixtureSOP`.
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
    """The generated options of ``featpipe fit gmsop`` (``options.json``)."""
    from featpipe.learn.gmsop import GatedMixtureSOP
    from featpipe.parameters import estimator_parameters

    return parameter_option_specs(estimator_parameters(GatedMixtureSOP),
                                  aliases={"n_components": "--components"})


@click.command("gmsop")
@store_option
@click.option("--input", "-i", "input_name", required=True,
              help="Stage of conv maps: (N, D) or (H, W, D) per image.")
@click.option("--name", "-n", default=None, help="Name to give the fitted model stage.")
@click.option("--split", default=1, show_default=True, type=int,
              help="Train on the train items of this split.")
@attach_options(table_entry("fit gmsop"))
@click.option("--force", is_flag=True, help="Refit even if this model is already fitted.")
@fit_dry_run_option
def fit_gmsop(store_path, input_name, name, split, force, dry_run, **params):
    """Fit GM-SOP (gated mixture of parametric second-order pooling) on conv maps."""
    from featpipe.stages.fitting import fit_gmsop as fit_gmsop_stage

    fit_gmsop_stage(open_store(store_path), input_name, name=name, split=split, force=force,
                    dry_run=dry_run, reporter=ClickReporter(), **params)
