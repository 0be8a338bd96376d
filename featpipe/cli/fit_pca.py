"""``featpipe fit pca``: PCA of an input stage's descriptors, fitted on its train items.

``--fraction 0.5`` halves the dimension in place of ``--dim``; ``--groups hog,hof,mbh`` fits
one PCA per descriptor group of a dense-trajectory stage (:mod:`featpipe.extract.groups`),
which ``fit gmm --groups --pca NAME`` uses.  The model's options come from
:class:`featpipe.extract.pca.PCAProjection`; the work is
:func:`featpipe.stages.fitting.fit_pca`.
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
    """The generated options of ``featpipe fit pca`` (``options.json``)."""
    from featpipe.extract.pca import PCAProjection
    from featpipe.parameters import estimator_parameters

    return parameter_option_specs(estimator_parameters(PCAProjection),
                                  aliases={"n_components": "--dim"})


@click.command("pca")
@store_option
@click.option("--input", "-i", "input_name", required=True, help="Input stage name.")
@click.option("--name", "-n", default=None, help="Name to give the PCA stage.")
@attach_options(table_entry("fit pca"))
@click.option("--fraction", default=None, type=float,
              help="Keep this fraction of the dimension (0.5 halves it) instead of --dim.")
@click.option("--groups", default=None, metavar="G1,G2,...",
              help="One PCA per descriptor group of a dense-trajectory stage (e.g. "
              "hog,hof,mbh; mbh = mbhx and mbhy).")
@click.option("--sample", default=100_000, show_default=True, type=int,
              help="Descriptors sampled from the train items (0: all).")
@click.option("--random-state", "--seed", "random_state", default=0, show_default=True, type=int,
              help="Sampling seed.")
@click.option("--split", default=1, show_default=True, type=int,
              help="Manifest split whose train items are sampled.")
@click.option("--force", is_flag=True, help="Fit again even if the model exists.")
@fit_dry_run_option
def fit_pca(store_path, input_name, name, fraction, groups, sample, random_state, split, force,
            dry_run, **params):
    """Fit PCA on a seeded sample of the input's train descriptors (e.g. --dim 64 for SIFT)."""
    from featpipe.stages.fitting import fit_pca as fit_pca_stage

    source = click.get_current_context().get_parameter_source("n_components")
    if source is click.core.ParameterSource.DEFAULT:
        del params["n_components"]  # --fraction may stand in for it
    fit_pca_stage(open_store(store_path), input_name, name=name, groups=groups,
                  fraction=fraction, sample=sample,
                  random_state=random_state, split=split, force=force,
                  dry_run=dry_run, reporter=ClickReporter(), **params)
